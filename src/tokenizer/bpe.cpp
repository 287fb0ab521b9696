// Byte-pair encoding, as HF tokenizers' models::bpe (merge_word and
// Word::merge_all): a word starts as its characters (or byte-fallback tokens,
// or unk), then the adjacent pair of lowest merge rank is merged, leftmost
// first, until no pair has a merge.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/json_util.h"
#include "tokenizer/model.h"
#include "tokenizer/string_map.h"
#include "tokenizer/unicode.h"

namespace augur::tok {

namespace {

// Words seen before are not merged again. The cache is per thread (as HF's
// is), so encode needs no lock; it belongs to one model at a time.
struct WordCache {
  static constexpr size_t kMaxEntries = 1 << 17;
  static constexpr size_t kMaxWordBytes = 256;  // HF's MAX_LENGTH

  uint64_t owner = 0;
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>> map;  // word -> pool range
  std::vector<int32_t> pool;

  void reset(uint64_t new_owner) {
    owner = new_owner;
    map.clear();
    pool.clear();
  }
};

WordCache& word_cache() {
  thread_local WordCache cache;
  return cache;
}

std::atomic<uint64_t> next_model_uid{1};

class Bpe final : public Model {
 public:
  Bpe(const nlohmann::json& j, const std::string& where) : uid_(next_model_uid++) {
    const auto& vocab = required(j, "vocab", where, "BPE model");
    if (!vocab.is_object()) fail(where, ": BPE vocab is not an object");
    int32_t max_id = -1;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const int64_t id = it.value().get<int64_t>();
      if (id < 0 || id > INT32_MAX) fail(where, ": BPE vocab id ", id, " out of range");
      vocab_.insert(it.key(), int32_t(id));
      max_id = std::max(max_id, int32_t(id));
    }
    id_to_entry_.assign(size_t(max_id + 1), -1);
    vocab_.for_each([&](std::string_view token, int32_t id) {
      id_to_entry_[size_t(id)] = int32_t(tokens_.size());
      token_offsets_.push_back(uint32_t(token_bytes_.size()));
      token_bytes_.append(token);
      tokens_.push_back(id);
    });
    token_offsets_.push_back(uint32_t(token_bytes_.size()));

    prefix_ = value_or<std::string>(j, "continuing_subword_prefix", "");
    suffix_ = value_or<std::string>(j, "end_of_word_suffix", "");
    byte_fallback_ = value_or(j, "byte_fallback", false);
    fuse_unk_ = value_or(j, "fuse_unk", false);
    ignore_merges_ = value_or(j, "ignore_merges", false);
    if (value_or(j, "dropout", 0.0) != 0.0) {
      fail(where, ": BPE dropout is not supported (encoding would not be deterministic)");
    }
    const std::string unk = value_or<std::string>(j, "unk_token", "");
    if (!unk.empty()) {
      unk_id_ = vocab_.find(unk);
      if (unk_id_ < 0) fail(where, ": BPE unk_token '", unk, "' is not in the vocab");
    }
    has_unk_ = !unk.empty();

    // Single characters, looked up without hashing.
    char_ids_.assign(0x10000, -1);
    if (prefix_.empty() && suffix_.empty()) {
      vocab_.for_each([&](std::string_view token, int32_t id) {
        if (token.empty() || find_invalid_utf8(token) != std::string_view::npos) return;
        size_t i = 0;
        const char32_t c = next_cp(token, i);
        if (i == token.size() && c < 0x10000) char_ids_[c] = id;
      });
    }
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      byte_ids_[b] = vocab_.find(name);
    }

    const auto& merges = required(j, "merges", where, "BPE model");
    merges_.reserve(merges.size());
    std::string merged;
    uint32_t rank = 0;
    for (const auto& m : merges) {
      std::string a, b;
      if (m.is_string()) {
        const std::string line = m.get<std::string>();
        if (line.starts_with("#version")) continue;
        const size_t sp = line.find(' ');
        if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos) {
          fail(where, ": BPE merge ", rank + 1, " '", line, "' is not two tokens");
        }
        a = line.substr(0, sp);
        b = line.substr(sp + 1);
      } else if (m.is_array() && m.size() == 2) {
        a = m[0].get<std::string>();
        b = m[1].get<std::string>();
      } else {
        fail(where, ": BPE merge ", rank + 1, " is neither \"a b\" nor [a, b]");
      }
      const int32_t ia = vocab_.find(a), ib = vocab_.find(b);
      if (ia < 0) fail(where, ": BPE merge ", rank + 1, ": token '", a, "' is not in the vocab");
      if (ib < 0) fail(where, ": BPE merge ", rank + 1, ": token '", b, "' is not in the vocab");
      const size_t cut = b.starts_with(prefix_) ? prefix_.size() : 0;
      merged.assign(a);
      merged.append(b, cut, std::string::npos);
      const int32_t im = vocab_.find(merged);
      if (im < 0) {
        fail(where, ": BPE merge ", rank + 1, ": result '", merged, "' is not in the vocab");
      }
      merges_.insert(ia, ib, {rank, im});
      ++rank;
    }
  }

  void tokenize(std::string_view word, std::vector<int32_t>& out) const override {
    if (ignore_merges_) {
      const int32_t id = vocab_.find(word);
      if (id >= 0) {
        out.push_back(id);
        return;
      }
    }
    const bool cacheable = word.size() < WordCache::kMaxWordBytes;
    WordCache& cache = word_cache();
    if (cacheable) {
      if (cache.owner != uid_) cache.reset(uid_);
      // Keys are std::string: build one only on a miss by probing with a
      // reusable buffer.
      thread_local std::string key;
      key.assign(word);
      auto it = cache.map.find(key);
      if (it != cache.map.end()) {
        const auto [off, n] = it->second;
        out.insert(out.end(), cache.pool.begin() + off, cache.pool.begin() + off + n);
        return;
      }
    }
    const size_t before = out.size();
    merge_word(word, out);
    if (cacheable) {
      if (cache.map.size() >= WordCache::kMaxEntries) cache.reset(uid_);
      const uint32_t off = uint32_t(cache.pool.size());
      cache.pool.insert(cache.pool.end(), out.begin() + before, out.end());
      cache.map.emplace(std::string(word), std::make_pair(off, uint32_t(out.size() - before)));
    }
  }

  int32_t token_to_id(std::string_view token) const override { return vocab_.find(token); }

  bool id_to_token(int32_t id, std::string_view& token) const override {
    if (id < 0 || size_t(id) >= id_to_entry_.size() || id_to_entry_[size_t(id)] < 0) return false;
    const size_t e = size_t(id_to_entry_[size_t(id)]);
    token = std::string_view(token_bytes_).substr(token_offsets_[e],
                                                  token_offsets_[e + 1] - token_offsets_[e]);
    return true;
  }

  size_t id_limit() const override { return id_to_entry_.size(); }

 private:
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // -1 at the ends
    bool live;
  };
  struct Candidate {
    uint32_t rank;
    int32_t pos;  // left symbol
    int32_t id;   // merged id
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };

  int32_t lookup_char(std::string_view s, char32_t c) const {
    if (c < 0x10000 && prefix_.empty() && suffix_.empty()) return char_ids_[c];
    return vocab_.find(s);
  }

  // HF BPE::merge_word followed by Word::merge_all.
  void merge_word(std::string_view w, std::vector<int32_t>& out) const {
    thread_local std::vector<Symbol> symbols;
    thread_local std::vector<Candidate> heap;
    symbols.clear();
    heap.clear();
    auto add = [&](int32_t id) {
      const int32_t n = int32_t(symbols.size());
      symbols.push_back({id, n - 1, -1, true});
      if (n > 0) symbols[size_t(n - 1)].next = n;
    };

    int32_t pending_unk = -1;  // an unk waiting to be emitted (fuse_unk joins runs)
    std::string affixed;
    size_t i = 0;
    while (i < w.size()) {
      const size_t start = i;
      const char32_t c = next_cp(w, i);
      std::string_view s = w.substr(start, i - start);
      int32_t id;
      if (prefix_.empty() && suffix_.empty()) {
        id = lookup_char(s, c);
      } else {
        affixed.clear();
        if (start != 0) affixed += prefix_;
        affixed += s;
        if (i == w.size()) affixed += suffix_;
        id = vocab_.find(affixed);
        s = affixed;
      }
      if (id >= 0) {
        if (pending_unk >= 0) {
          add(pending_unk);
          pending_unk = -1;
        }
        add(id);
        continue;
      }
      if (byte_fallback_) {
        bool all = true;
        for (unsigned char b : s) all = all && byte_ids_[b] >= 0;
        if (all) {
          // HF does not flush a pending unk here; it is emitted later.
          for (unsigned char b : s) add(byte_ids_[b]);
          continue;
        }
      }
      if (has_unk_) {
        if (pending_unk >= 0 && !fuse_unk_) add(pending_unk);
        pending_unk = unk_id_;
      }
      // With no unk token HF drops the character.
    }
    if (pending_unk >= 0) add(pending_unk);

    for (size_t k = 0; k + 1 < symbols.size(); ++k) {
      if (const auto* m = merges_.find(symbols[k].id, symbols[k + 1].id)) {
        heap.push_back({m->rank, int32_t(k), m->id});
      }
    }
    std::make_heap(heap.begin(), heap.end(), std::greater<>());
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>());
      const Candidate top = heap.back();
      heap.pop_back();
      Symbol& left = symbols[size_t(top.pos)];
      if (!left.live || left.next < 0) continue;
      Symbol& right = symbols[size_t(left.next)];
      // Stale entry: the pair at pos no longer merges into this id.
      const auto* m = merges_.find(left.id, right.id);
      if (!m || m->id != top.id) continue;
      left.id = top.id;
      right.live = false;
      left.next = right.next;
      if (right.next >= 0) symbols[size_t(right.next)].prev = top.pos;
      if (left.prev >= 0) {
        if (const auto* p = merges_.find(symbols[size_t(left.prev)].id, left.id)) {
          heap.push_back({p->rank, left.prev, p->id});
          std::push_heap(heap.begin(), heap.end(), std::greater<>());
        }
      }
      if (left.next >= 0) {
        if (const auto* p = merges_.find(left.id, symbols[size_t(left.next)].id)) {
          heap.push_back({p->rank, top.pos, p->id});
          std::push_heap(heap.begin(), heap.end(), std::greater<>());
        }
      }
    }
    for (const Symbol& s : symbols) {
      if (s.live) out.push_back(s.id);
    }
  }

  uint64_t uid_;
  StringIdMap vocab_;
  std::vector<int32_t> id_to_entry_;  // [id] -> index into tokens_, -1 for a hole
  std::vector<int32_t> tokens_;
  std::vector<uint32_t> token_offsets_;
  std::string token_bytes_;
  MergeMap merges_;
  std::vector<int32_t> char_ids_;  // [code point < 0x10000] -> id of that one-character token
  int32_t byte_ids_[256];          // [byte] -> id of "<0xXX>", -1 if absent
  std::string prefix_, suffix_;
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false, has_unk_ = false;
  int32_t unk_id_ = -1;
};

}  // namespace

std::unique_ptr<Model> make_model(const nlohmann::json& j, const std::string& where) {
  const std::string type = type_of(j, where, "model");
  if (type == "BPE") return std::make_unique<Bpe>(j, where);
  fail(where, ": unsupported model type '", type, "'");
}

}  // namespace augur::tok
