// Added tokens (tokenizer.json "added_tokens"): matched in the text before
// the model sees it, leftmost first and longest first, as HF tokenizers'
// AddedVocabulary does.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/function_ref.h"
#include "tokenizer/normalizer.h"

namespace augur::tok {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
  // What decode shows and what the normalized pass matches: the content run
  // through the normalizer when `normalized`, else the content.
  std::string surface;
};

class AddedVocab {
 public:
  // Reads the "added_tokens" array; `normalizer` may be null.
  void load(const nlohmann::json& tokens, const Normalizer* normalizer, const std::string& where);

  // Splits `text` on the tokens of one pass (normalized = false: tokens
  // matched against the raw input; true: against normalized text), calling
  // on_text(start, end) for each non-empty stretch between tokens and
  // on_token(id) for each token, in order (HF AddedVocabulary::find_matches).
  void split(std::string_view text, bool normalized, FunctionRef<void(size_t, size_t)> on_text,
             FunctionRef<void(int32_t)> on_token) const;

  const AddedToken* by_id(int32_t id) const {
    auto it = by_id_.find(id);
    return it == by_id_.end() ? nullptr : &tokens_[it->second];
  }
  int32_t find(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  // A byte trie of token texts.
  struct Trie {
    struct Node {
      std::vector<std::pair<unsigned char, uint32_t>> kids;
      int32_t token = -1;  // index into tokens_
    };
    std::vector<Node> nodes{Node{}};
    bool first_byte[256] = {};
    void insert(std::string_view s, int32_t token);
    // Length and token of the longest entry that prefixes `s`; {0, -1} if none.
    std::pair<size_t, int32_t> longest(std::string_view s) const;
    bool empty() const { return nodes.size() == 1; }
  };

  std::vector<AddedToken> tokens_;
  std::unordered_map<int32_t, size_t> by_id_;
  std::unordered_map<std::string, int32_t> by_content_;
  Trie raw_, normalized_;
};

}  // namespace augur::tok
