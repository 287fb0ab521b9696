// Tokenizer's insides, shared with the streaming decoder.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/decoder.h"
#include "tokenizer/model.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace augur {

struct Tokenizer::Impl {
  std::string path;
  std::string where;  // "[tokenizer] path", the head of error messages
  nlohmann::json config;
  std::unique_ptr<tok::Normalizer> normalizer;
  std::unique_ptr<tok::PreTokenizer> pre_tokenizer;
  std::unique_ptr<tok::Model> model;
  std::unique_ptr<tok::PostProcessor> post_processor;
  std::unique_ptr<tok::Decoder> decoder;
  tok::AddedVocab added;
  size_t vocab_size = 0;

  // Normalized text between raw-matched added tokens: normalized-matched
  // added tokens, then pre-tokenizer and model. `at_origin`: the text starts
  // at offset 0 of the input.
  void encode_text(std::string_view text, bool at_origin, std::vector<int32_t>& ids) const;
  // The string decode starts from for `id`; false when it is skipped.
  bool token_text(int32_t id, bool skip_special, std::string_view& text) const;
  // Runs the decoder over token strings (consumed) and joins the result;
  // not lossy: bytes that do not form UTF-8 stay as they are.
  std::string decode_tokens(std::vector<std::string>& tokens, bool lossy = true) const;
};

}  // namespace augur
