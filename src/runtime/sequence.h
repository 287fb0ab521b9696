// Sequence state as a value: the KV blocks a sequence owns plus its tokens,
// and for models with recurrent layers (linear attention) a state slot.
//
// Blocks are refcounted, so a captured snapshot shares them with the live
// sequence; the first write into a shared, partly filled block copies it
// (copy-on-write). Rolling back rejected drafts is truncation.
//
// Recurrent state cannot be truncated: it is known only after the last token.
// A snapshot therefore holds a copy of the slot, and restoring it (or
// truncating back to the length of the sequence's last capture or restore,
// whose copy the sequence keeps) makes the state bit-identical to what it was.
// Verify windows also leave their inputs in the slot's history, so that a
// rollback to any length since the capture (rewind) replays only the
// recurrence over the kept tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "model/model.h"

namespace augur {

// Hands out KV block ids and counts their references.
class BlockPool {
 public:
  explicit BlockPool(int64_t n_blocks);
  // Throws augur::Error when no block is free (the cache is full) and the
  // reclaimer (when set) frees none.
  int32_t allocate();
  // Asked for a block when none is free (the prefix cache drops entries it
  // alone holds): returns false when it has nothing left to give back.
  void set_reclaimer(std::function<bool()> reclaim) { reclaim_ = std::move(reclaim); }
  void retain(int32_t id);
  void release(int32_t id);
  int32_t refcount(int32_t id) const { return refs_[size_t(id)]; }
  int64_t n_free() const { return int64_t(free_.size()); }
  int64_t n_blocks() const { return int64_t(refs_.size()); }

 private:
  std::vector<int32_t> refs_;
  std::vector<int32_t> free_;
  std::function<bool()> reclaim_;
};

// Hands out recurrent-state slots of a KvCache, one per live sequence.
class SlotPool {
 public:
  explicit SlotPool(int64_t n_slots);
  // Throws augur::Error when every slot is taken.
  int32_t allocate();
  void release(int32_t slot);
  int64_t n_free() const { return int64_t(free_.size()); }
  int64_t n_slots() const { return int64_t(used_.size()); }

 private:
  std::vector<bool> used_;
  std::vector<int32_t> free_;
};

class SequenceSnapshot;

class Sequence {
 public:
  // `slots` is needed (and a slot taken, holding the empty state) when the
  // cache keeps recurrent state.
  Sequence(BlockPool& pool, KvCache& kv, SlotPool* slots = nullptr);
  ~Sequence();
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;

  int64_t length() const { return int64_t(tokens_.size()); }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  std::span<const int32_t> block_table() const { return blocks_; }
  // Recurrent-state slot (ForwardRow::state_slot), -1 without recurrent state.
  int32_t state_slot() const { return slot_; }

  // Makes room to write `n` more tokens: allocates blocks, and copies a shared
  // block that the write would touch. Call before the forward that writes them.
  void reserve(int64_t n);
  // The blocks reserve(n) would take from the pool (a copy-on-write
  // included).
  int64_t blocks_needed(int64_t n) const;
  // Records tokens whose K/V the forward has written.
  void append(std::span<const int32_t> tokens);
  // Drops everything from position `length` on (rollback of rejected drafts).
  // With recurrent state, `length` must be the current length or that of the
  // last capture()/restore(); anything else is an error (restore a snapshot).
  void truncate(int64_t length);
  // The length of the last capture()/restore() (-1: none): with recurrent
  // state, the one length below the current one that truncate() reaches.
  int64_t marked_length() const { return mark_length_; }

  // Whether rewind(length) applies: the last capture lies at or below
  // `length` and every token since was fed in verify windows whose inputs
  // the slot's history still holds (ops::keep_recurrent_inputs).
  bool can_rewind(int64_t length) const;
  // Drops everything from `length` on and puts the recurrent state back to
  // the last capture; Model::replay_recurrent over the returned row then
  // brings the state to `length` (the K/V of the kept tokens stay).
  ReplayRow rewind(int64_t length);

  SequenceSnapshot capture() const;
  void restore(const SequenceSnapshot& snap);

 private:
  void release_all();
  BlockPool* pool_;
  KvCache* kv_;
  SlotPool* slots_ = nullptr;
  std::vector<int32_t> blocks_;  // block_table: block i holds positions [i*bs, (i+1)*bs)
  std::vector<int32_t> tokens_;
  int32_t slot_ = -1;            // recurrent-state slot, -1 without recurrent state
  // The slot's copy at the last capture/restore (shared with that snapshot)
  // and the length it belongs to: the one length truncate() can go back to.
  mutable Tensor mark_state_;
  mutable int64_t mark_length_ = -1;
  // Tokens after the mark whose recurrent inputs the slot's history holds
  // (all of them, or -1: not all).
  mutable int64_t kept_inputs_ = -1;
};

// A captured sequence state: holds references on its blocks until destroyed.
class SequenceSnapshot {
 public:
  SequenceSnapshot() = default;
  // A state assembled from parts (the prefix cache's): the first
  // tokens.size() positions live in `blocks` (one a block_size tokens, the
  // last maybe partly), and `recurrent` (a KvCache::save_slot copy, or none
  // for a model without recurrent state) is the state after them. Takes a
  // reference on each block.
  SequenceSnapshot(BlockPool& pool, std::vector<int32_t> blocks, std::vector<int32_t> tokens, Tensor recurrent);
  ~SequenceSnapshot();
  SequenceSnapshot(const SequenceSnapshot& other);
  SequenceSnapshot& operator=(const SequenceSnapshot& other);
  SequenceSnapshot(SequenceSnapshot&& other) noexcept;
  SequenceSnapshot& operator=(SequenceSnapshot&& other) noexcept;
  int64_t length() const { return int64_t(tokens_.size()); }
  const std::vector<int32_t>& tokens() const { return tokens_; }

 private:
  friend class Sequence;
  void drop();
  BlockPool* pool_ = nullptr;
  std::vector<int32_t> blocks_;
  std::vector<int32_t> tokens_;
  Tensor recurrent_;  // KvCache::save_slot copy; shared, never written, between copies
};

}  // namespace augur
