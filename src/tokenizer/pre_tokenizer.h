// Pre-tokenizers: split normalized text into the words the model encodes
// one by one (HF tokenizers' pre_tokenizers module).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "tokenizer/function_ref.h"

namespace augur::tok {

struct Piece {
  std::string_view text;  // never empty
  bool first;  // starts at offset 0 of the original input (Metaspace "first")
};

// Receives each piece; the text it views lives only for the call.
using PieceSink = FunctionRef<void(Piece)>;

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Splits (and may rewrite) `piece`, passing each non-empty result to `sink`
  // in order.
  virtual void pre_tokenize(Piece piece, PieceSink sink) const = 0;
};

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j,
                                                 const std::string& where);

}  // namespace augur::tok
