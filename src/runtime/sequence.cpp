#include "runtime/sequence.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace augur {

BlockPool::BlockPool(int64_t n_blocks) : refs_(size_t(n_blocks), 0) {
  for (int64_t i = n_blocks - 1; i >= 0; --i) free_.push_back(int32_t(i));
}

int32_t BlockPool::allocate() {
  while (free_.empty() && reclaim_ && reclaim_()) {
  }
  if (free_.empty()) fail("[kv_cache] out of KV blocks (", refs_.size(), " in all); raise the context size");
  int32_t id = free_.back();
  free_.pop_back();
  refs_[size_t(id)] = 1;
  return id;
}

void BlockPool::retain(int32_t id) {
  AUGUR_ASSERT(refs_[size_t(id)] > 0, "retain of a free block");
  ++refs_[size_t(id)];
}

void BlockPool::release(int32_t id) {
  AUGUR_ASSERT(refs_[size_t(id)] > 0, "release of a free block");
  if (--refs_[size_t(id)] == 0) free_.push_back(id);
}

SlotPool::SlotPool(int64_t n_slots) : used_(size_t(n_slots), false) {
  for (int64_t i = n_slots - 1; i >= 0; --i) free_.push_back(int32_t(i));
}

int32_t SlotPool::allocate() {
  if (free_.empty())
    fail("[sequence] out of recurrent-state slots (", used_.size(),
         " in all): every slot holds a live sequence; raise the maximum number of sequences");
  int32_t slot = free_.back();
  free_.pop_back();
  used_[size_t(slot)] = true;
  return slot;
}

void SlotPool::release(int32_t slot) {
  AUGUR_ASSERT(slot >= 0 && size_t(slot) < used_.size() && used_[size_t(slot)], "release of a free slot");
  used_[size_t(slot)] = false;
  free_.push_back(slot);
}

Sequence::Sequence(BlockPool& pool, KvCache& kv, SlotPool* slots) : pool_(&pool), kv_(&kv) {
  if (!kv.has_recurrent()) return;
  if (!slots) fail("[sequence] the model keeps recurrent state: a sequence needs a slot pool");
  slots_ = slots;
  slot_ = slots->allocate();
  kv.zero_slot(slot_);
}

Sequence::~Sequence() {
  release_all();
  if (slots_) slots_->release(slot_);
}

void Sequence::release_all() {
  for (int32_t b : blocks_) pool_->release(b);
  blocks_.clear();
}

void Sequence::reserve(int64_t n) {
  const int64_t bs = kv_->block_size();
  const int64_t len = length();
  // The block holding position `len` may be shared with a snapshot: copy it
  // before writing into it. Blocks wholly before `len` are never written.
  const int64_t first = len / bs;
  if (n > 0 && len % bs != 0 && first < int64_t(blocks_.size())) {
    int32_t& b = blocks_[size_t(first)];
    if (pool_->refcount(b) > 1) {
      int32_t copy = pool_->allocate();
      kv_->copy_block(b, copy);
      pool_->release(b);
      b = copy;
    }
  }
  const int64_t need = (len + n + bs - 1) / bs;
  while (int64_t(blocks_.size()) < need) blocks_.push_back(pool_->allocate());
}

int64_t Sequence::blocks_needed(int64_t n) const {
  if (n <= 0) return 0;
  const int64_t bs = kv_->block_size(), len = length(), first = len / bs;
  const int64_t grow = std::max<int64_t>(0, (len + n + bs - 1) / bs - int64_t(blocks_.size()));
  const bool copy = len % bs != 0 && first < int64_t(blocks_.size()) && pool_->refcount(blocks_[size_t(first)]) > 1;
  return grow + (copy ? 1 : 0);
}

void Sequence::append(std::span<const int32_t> tokens) {
  AUGUR_ASSERT(int64_t(blocks_.size()) * kv_->block_size() >= length() + int64_t(tokens.size()),
               "append without reserve");
  if (slot_ >= 0) {
    // As keep_recurrent_inputs: rows of 2..n_pos tokens leave their inputs.
    const int64_t n = int64_t(tokens.size()), n_pos = KvCache::kInputHistory;
    const bool kept = mark_length_ >= 0 && kept_inputs_ == length() - mark_length_ && n >= 2 && n <= n_pos &&
                      kept_inputs_ + n <= n_pos;
    kept_inputs_ = kept ? kept_inputs_ + n : -1;
  }
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
}

bool Sequence::can_rewind(int64_t length) const {
  return slot_ >= 0 && mark_state_.defined() && mark_length_ >= 0 && mark_length_ <= length &&
         length <= this->length() && kept_inputs_ == this->length() - mark_length_;
}

ReplayRow Sequence::rewind(int64_t length) {
  AUGUR_ASSERT(can_rewind(length), "rewind without the inputs to replay");
  kv_->load_slot(slot_, mark_state_);
  tokens_.resize(size_t(length));
  const int64_t keep = (length + kv_->block_size() - 1) / kv_->block_size();
  while (int64_t(blocks_.size()) > keep) {
    pool_->release(blocks_.back());
    blocks_.pop_back();
  }
  kept_inputs_ = length - mark_length_;
  return ReplayRow{slot_, int32_t(mark_length_), int32_t(length - mark_length_)};
}

void Sequence::truncate(int64_t length) {
  AUGUR_ASSERT(length >= 0 && length <= this->length(), "truncate beyond the end");
  if (slot_ >= 0 && length != this->length()) {
    if (length != mark_length_ || !mark_state_.defined())
      fail("[sequence] cannot truncate from ", this->length(), " to ", length,
           " tokens: the model keeps recurrent state, known only after the last token and at the last "
           "capture (", mark_length_ < 0 ? std::string("none") : std::to_string(mark_length_),
           " tokens); rolling back needs a snapshot captured at that length");
    kv_->load_slot(slot_, mark_state_);
    kept_inputs_ = 0;
  }
  tokens_.resize(size_t(length));
  const int64_t keep = (length + kv_->block_size() - 1) / kv_->block_size();
  while (int64_t(blocks_.size()) > keep) {
    pool_->release(blocks_.back());
    blocks_.pop_back();
  }
}

SequenceSnapshot Sequence::capture() const {
  SequenceSnapshot s;
  s.pool_ = pool_;
  const int64_t used = (length() + kv_->block_size() - 1) / kv_->block_size();
  s.blocks_.assign(blocks_.begin(), blocks_.begin() + used);
  for (int32_t b : s.blocks_) pool_->retain(b);
  s.tokens_ = tokens_;
  if (slot_ >= 0) {
    s.recurrent_ = kv_->save_slot(slot_);
    mark_state_ = s.recurrent_;
    mark_length_ = length();
    kept_inputs_ = 0;
  }
  return s;
}

void Sequence::restore(const SequenceSnapshot& snap) {
  AUGUR_ASSERT(snap.pool_ == pool_, "snapshot of another block pool");
  AUGUR_ASSERT((slot_ >= 0) == snap.recurrent_.defined(), "snapshot of a sequence with other state");
  for (int32_t b : snap.blocks_) pool_->retain(b);
  release_all();
  blocks_ = snap.blocks_;
  tokens_ = snap.tokens_;
  if (slot_ >= 0) {
    kv_->load_slot(slot_, snap.recurrent_);
    mark_state_ = snap.recurrent_;
    mark_length_ = length();
    kept_inputs_ = 0;
  }
}

void SequenceSnapshot::drop() {
  if (pool_)
    for (int32_t b : blocks_) pool_->release(b);
  blocks_.clear();
  tokens_.clear();
  recurrent_ = Tensor();
}

SequenceSnapshot::SequenceSnapshot(BlockPool& pool, std::vector<int32_t> blocks, std::vector<int32_t> tokens,
                                   Tensor recurrent)
    : pool_(&pool), blocks_(std::move(blocks)), tokens_(std::move(tokens)), recurrent_(std::move(recurrent)) {
  for (int32_t b : blocks_) pool_->retain(b);
}

SequenceSnapshot::~SequenceSnapshot() { drop(); }

SequenceSnapshot::SequenceSnapshot(const SequenceSnapshot& o)
    : pool_(o.pool_), blocks_(o.blocks_), tokens_(o.tokens_), recurrent_(o.recurrent_) {
  if (pool_)
    for (int32_t b : blocks_) pool_->retain(b);
}

SequenceSnapshot& SequenceSnapshot::operator=(const SequenceSnapshot& o) {
  if (this != &o) {
    SequenceSnapshot copy(o);
    *this = std::move(copy);
  }
  return *this;
}

SequenceSnapshot::SequenceSnapshot(SequenceSnapshot&& o) noexcept
    : pool_(o.pool_), blocks_(std::move(o.blocks_)), tokens_(std::move(o.tokens_)),
      recurrent_(std::move(o.recurrent_)) {
  o.pool_ = nullptr;
}

SequenceSnapshot& SequenceSnapshot::operator=(SequenceSnapshot&& o) noexcept {
  if (this != &o) {
    drop();
    pool_ = o.pool_;
    blocks_ = std::move(o.blocks_);
    tokens_ = std::move(o.tokens_);
    recurrent_ = std::move(o.recurrent_);
    o.pool_ = nullptr;
  }
  return *this;
}

}  // namespace augur
