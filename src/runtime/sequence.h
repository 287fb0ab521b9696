// Sequence state as a value: the KV blocks a sequence owns plus its tokens.
//
// Blocks are refcounted, so a captured snapshot shares them with the live
// sequence; the first write into a shared, partly filled block copies it
// (copy-on-write). Rolling back rejected drafts is truncation.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/model.h"

namespace augur {

// Hands out KV block ids and counts their references.
class BlockPool {
 public:
  explicit BlockPool(int64_t n_blocks);
  // Throws augur::Error when no block is free (the cache is full).
  int32_t allocate();
  void retain(int32_t id);
  void release(int32_t id);
  int32_t refcount(int32_t id) const { return refs_[size_t(id)]; }
  int64_t n_free() const { return int64_t(free_.size()); }
  int64_t n_blocks() const { return int64_t(refs_.size()); }

 private:
  std::vector<int32_t> refs_;
  std::vector<int32_t> free_;
};

class SequenceSnapshot;

class Sequence {
 public:
  Sequence(BlockPool& pool, KvCache& kv);
  ~Sequence();
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  int64_t length() const { return int64_t(tokens_.size()); }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  std::span<const int32_t> block_table() const { return blocks_; }

  // Makes room to write `n` more tokens: allocates blocks, and copies a shared
  // block that the write would touch. Call before the forward that writes them.
  void reserve(int64_t n);
  // Records tokens whose K/V the forward has written.
  void append(std::span<const int32_t> tokens);
  // Drops everything from position `length` on (rollback of rejected drafts).
  void truncate(int64_t length);

  SequenceSnapshot capture() const;
  void restore(const SequenceSnapshot& snap);

 private:
  void release_all();
  BlockPool* pool_;
  KvCache* kv_;
  std::vector<int32_t> blocks_;  // block_table: block i holds positions [i*bs, (i+1)*bs)
  std::vector<int32_t> tokens_;
};

// A captured sequence state: holds references on its blocks until destroyed.
class SequenceSnapshot {
 public:
  SequenceSnapshot() = default;
  ~SequenceSnapshot();
  SequenceSnapshot(const SequenceSnapshot& other);
  SequenceSnapshot& operator=(const SequenceSnapshot& other);
  SequenceSnapshot(SequenceSnapshot&& other) noexcept;
  SequenceSnapshot& operator=(SequenceSnapshot&& other) noexcept;
  int64_t length() const { return int64_t(tokens_.size()); }

 private:
  friend class Sequence;
  void drop();
  BlockPool* pool_ = nullptr;
  std::vector<int32_t> blocks_;
  std::vector<int32_t> tokens_;
};

}  // namespace augur
