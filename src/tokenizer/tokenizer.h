// A Hugging Face tokenizer.json, encoding and decoding token for token as
// HF tokenizers does: added tokens are matched first, then each stretch
// between them is normalized, pre-tokenized and encoded by the model
// (byte-level or sentencepiece-style BPE); the post-processor adds
// BOS/EOS when asked.
//
// A component the loader does not implement is an augur::Error naming the
// component and the file. Truncation and padding settings are ignored: the
// engine decides lengths itself.
//
// A Tokenizer is immutable and cheap to copy (shared state); encode and
// decode may run on several threads at once (the BPE word cache is per
// thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace augur {

class Tokenizer {
 public:
  // `dir_or_file` is a directory holding tokenizer.json, or the path of a
  // tokenizer.json; tokenizer_config.json beside it is read when present.
  static Tokenizer load(const std::string& dir_or_file);
  // From parsed JSON; `name` stands for the file in error messages.
  static Tokenizer from_json(const nlohmann::json& tokenizer_json,
                             nlohmann::json config = nlohmann::json::object(),
                             const std::string& name = "tokenizer.json");

  // HF Tokenizer::encode(text, add_special_tokens).ids. Text that is not
  // valid UTF-8 is an Error giving the offset of the first bad byte.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // HF Tokenizer::decode: ids the vocab lacks are skipped; bytes that do not
  // form UTF-8 come out as U+FFFD.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // Added tokens first, then the model vocab; -1 when absent.
  int32_t token_to_id(std::string_view token) const;
  // The token's text ("Ġthe", "<|im_end|>"); empty when the id is unknown.
  std::string id_to_token(int32_t id) const;
  // The bytes the token adds to a decoded text when it is not the first:
  // part of a UTF-8 character where the token holds one (a byte-fallback
  // or byte-level token), where decode() gives U+FFFD. Empty when the id is
  // unknown.
  std::string token_bytes(int32_t id) const;
  // One past the largest id (model vocab and added tokens).
  size_t vocab_size() const;
  // An added token marked special (skipped by skip_special_tokens).
  bool is_special(int32_t id) const;
  // tokenizer_config.json, or an empty object: chat_template, bos/eos...
  const nlohmann::json& config() const;
  // The tokenizer.json this came from, for messages.
  const std::string& path() const;

  struct Impl;

 private:
  friend class StreamDecoder;
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace augur
