// Flat hash tables for the tokenizer's hot lookups: token text -> id over a
// single byte arena, and BPE merge pair -> (rank, result).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace augur::tok {

inline uint64_t hash_bytes(std::string_view s) {
  // A multiply-xorshift over 8-byte words; quality enough for token text.
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  uint64_t h = s.size() * kMul;
  const char* p = s.data();
  size_t n = s.size();
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * kMul;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ w) * kMul;
    h ^= h >> 29;
  }
  h *= kMul;
  return h ^ (h >> 32);
}

// Maps distinct strings to int32 ids. Strings live in one arena, so views
// into it stay valid when the map is moved.
class StringIdMap {
 public:
  // Inserts or overwrites.
  void insert(std::string_view key, int32_t id) {
    if ((entries_.size() + 1) * 2 > table_.size()) grow();
    size_t slot = find_slot(key);
    if (table_[slot] != 0) {
      entries_[table_[slot] - 1].id = id;
      return;
    }
    entries_.push_back({uint32_t(arena_.size()), uint32_t(key.size()), id});
    arena_.append(key);
    table_[slot] = uint32_t(entries_.size());
  }

  // The id of `key`, or -1.
  int32_t find(std::string_view key) const {
    if (table_.empty()) return -1;
    const uint32_t e = table_[find_slot(key)];
    return e == 0 ? -1 : entries_[e - 1].id;
  }

  size_t size() const { return entries_.size(); }

  template <typename Fn>
  void for_each(Fn&& fn) const {
    for (const Entry& e : entries_) fn(std::string_view(arena_).substr(e.offset, e.length), e.id);
  }

 private:
  struct Entry {
    uint32_t offset, length;
    int32_t id;
  };

  size_t find_slot(std::string_view key) const {
    const size_t mask = table_.size() - 1;
    size_t slot = hash_bytes(key) & mask;
    while (true) {
      const uint32_t e = table_[slot];
      if (e == 0) return slot;
      const Entry& en = entries_[e - 1];
      if (en.length == key.size() && std::memcmp(arena_.data() + en.offset, key.data(), key.size()) == 0) {
        return slot;
      }
      slot = (slot + 1) & mask;
    }
  }

  void grow() {
    const size_t cap = table_.empty() ? 64 : table_.size() * 2;
    table_.assign(cap, 0);
    for (size_t i = 0; i < entries_.size(); ++i) {
      const Entry& en = entries_[i];
      const size_t slot = find_slot(std::string_view(arena_).substr(en.offset, en.length));
      table_[slot] = uint32_t(i + 1);
    }
  }

  std::string arena_;
  std::vector<Entry> entries_;
  std::vector<uint32_t> table_;  // entry index + 1; 0 is empty
};

// (left id, right id) -> (rank, merged id).
class MergeMap {
 public:
  struct Value {
    uint32_t rank;
    int32_t id;
  };

  void reserve(size_t n) {
    size_t cap = 64;
    while (cap < n * 2) cap *= 2;
    rehash(cap);
  }

  // Inserts or overwrites: HF builds its merge map by collecting into a hash
  // map, so a repeated pair keeps the rank of its last line.
  void insert(int32_t a, int32_t b, Value v) {
    if ((size_ + 1) * 2 > slots_.size()) rehash(slots_.empty() ? 64 : slots_.size() * 2);
    const uint64_t key = pack(a, b);
    size_t slot = probe(key);
    if (slots_[slot].key == kEmpty) {
      ++size_;
      slots_[slot].key = key;
    }
    slots_[slot].value = v;
  }

  const Value* find(int32_t a, int32_t b) const {
    if (slots_.empty()) return nullptr;
    const Slot& s = slots_[probe(pack(a, b))];
    return s.key == kEmpty ? nullptr : &s.value;
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  struct Slot {
    uint64_t key = kEmpty;
    Value value{};
  };

  static uint64_t pack(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

  size_t probe(uint64_t key) const {
    const size_t mask = slots_.size() - 1;
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    size_t slot = (h ^ (h >> 31)) & mask;
    while (slots_[slot].key != kEmpty && slots_[slot].key != key) slot = (slot + 1) & mask;
    return slot;
  }

  void rehash(size_t cap) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(cap, Slot{});
    for (const Slot& s : old) {
      if (s.key != kEmpty) slots_[probe(s.key)] = s;
    }
  }

  std::vector<Slot> slots_;
  size_t size_ = 0;
};

}  // namespace augur::tok
