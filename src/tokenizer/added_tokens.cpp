#include "tokenizer/added_tokens.h"

#include "core/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/unicode.h"

namespace augur::tok {

void AddedVocab::Trie::insert(std::string_view s, int32_t token) {
  uint32_t node = 0;
  for (unsigned char b : s) {
    uint32_t child = 0;
    for (const auto& [byte, idx] : nodes[node].kids) {
      if (byte == b) child = idx;
    }
    if (child == 0) {
      child = uint32_t(nodes.size());
      nodes[node].kids.emplace_back(b, child);
      nodes.emplace_back();
    }
    node = child;
  }
  // The last token with the same text wins, as HF's trie build does.
  nodes[node].token = token;
  first_byte[static_cast<unsigned char>(s[0])] = true;
}

std::pair<size_t, int32_t> AddedVocab::Trie::longest(std::string_view s) const {
  std::pair<size_t, int32_t> best{0, -1};
  uint32_t node = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char b = s[i];
    uint32_t child = 0;
    for (const auto& [byte, idx] : nodes[node].kids) {
      if (byte == b) {
        child = idx;
        break;
      }
    }
    if (child == 0) break;
    node = child;
    if (nodes[node].token >= 0) best = {i + 1, nodes[node].token};
  }
  return best;
}

void AddedVocab::load(const nlohmann::json& tokens, const Normalizer* normalizer,
                      const std::string& where) {
  if (tokens.is_null()) return;
  if (!tokens.is_array()) fail(where, ": added_tokens is not an array");
  for (const auto& j : tokens) {
    AddedToken t;
    t.id = required(j, "id", where, "added token").get<int32_t>();
    t.content = required(j, "content", where, "added token").get<std::string>();
    t.single_word = value_or(j, "single_word", false);
    t.lstrip = value_or(j, "lstrip", false);
    t.rstrip = value_or(j, "rstrip", false);
    t.normalized = value_or(j, "normalized", true);
    t.special = value_or(j, "special", false);
    if (t.content.empty()) continue;  // HF ignores empty tokens
    if (find_invalid_utf8(t.content) != std::string::npos) {
      fail(where, ": added token ", t.id, " is not valid UTF-8");
    }
    t.surface = t.content;
    if (t.normalized && normalizer) normalizer->normalize(t.surface);
    auto it = by_id_.find(t.id);
    if (it != by_id_.end()) {
      tokens_[it->second] = std::move(t);
    } else {
      by_id_[t.id] = tokens_.size();
      tokens_.push_back(std::move(t));
    }
  }
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& t = tokens_[i];
    by_content_[t.content] = t.id;
    if (t.surface.empty()) continue;
    (t.normalized ? normalized_ : raw_).insert(t.normalized ? t.surface : t.content, int32_t(i));
  }
}

int32_t AddedVocab::find(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  return it == by_content_.end() ? -1 : it->second;
}

namespace {

// The last character before `end` / the first at `start`.
char32_t cp_before(std::string_view s, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  return next_cp(s, start);
}

}  // namespace

void AddedVocab::split(std::string_view text, bool normalized,
                       FunctionRef<void(size_t, size_t)> on_text,
                       FunctionRef<void(int32_t)> on_token) const {
  const Trie& trie = normalized ? normalized_ : raw_;
  if (trie.empty()) {
    if (!text.empty()) on_text(0, text.size());
    return;
  }
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    if (!trie.first_byte[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    const auto [len, index] = trie.longest(text.substr(pos));
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& t = tokens_[size_t(index)];
    size_t start = pos, stop = pos + len;
    pos = stop;  // the search resumes after the match as found
    if (t.single_word) {
      size_t k = stop;
      const bool start_space = start == 0 || !is_word_char(cp_before(text, start));
      const bool stop_space = stop == text.size() || !is_word_char(next_cp(text, k));
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) {
      size_t s = start;
      while (s > 0) {
        size_t b = s - 1;
        while (b > 0 && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) --b;
        size_t k = b;
        if (!is_white_space(next_cp(text, k))) break;
        s = b;
      }
      start = std::max(s, start_offset);
    }
    if (t.rstrip) {
      while (stop < text.size()) {
        size_t k = stop;
        if (!is_white_space(next_cp(text, k))) break;
        stop = k;
      }
    }
    if (start_offset < start) on_text(start_offset, start);
    on_token(t.id);
    start_offset = stop;
  }
  if (start_offset < text.size()) on_text(start_offset, text.size());
}

}  // namespace augur::tok
