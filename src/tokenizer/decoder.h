// Decoders: turn the token strings of ids back into text (HF decoders).
// Each stage maps a list of strings to a list of strings; the result is their
// concatenation.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace augur::tok {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
  // decode_chain keeping bytes that do not form UTF-8 as they are (a token
  // holding part of a character), where decode_chain makes them U+FFFD.
  virtual void decode_bytes(std::vector<std::string>& tokens) const { decode_chain(tokens); }
  // Whether a "<0xXX>" token's text depends on the tokens after it (a
  // ByteFallback stage): the streaming decoder holds such runs back.
  virtual bool joins_byte_tokens() const { return false; }
};

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const std::string& where);

// The byte a "<0xXX>" token stands for, or -1 (HF ByteFallback's test).
int byte_fallback_value(std::string_view token);

}  // namespace augur::tok
