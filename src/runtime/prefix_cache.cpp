#include "runtime/prefix_cache.h"

#include <algorithm>

#include "core/error.h"

namespace augur {

namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The key of a block after the prefix keyed `parent` (0: none).
uint64_t chain_key(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = splitmix(parent ^ 0x6a09e667f3bcc909ull);
  for (int32_t t : tokens) h = splitmix(h ^ uint32_t(t));
  return h;
}

bool same(std::span<const int32_t> a, std::span<const int32_t> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  size_t j = 0;
  while (j < a.size() && j < b.size() && a[j] == b[j]) ++j;
  return j;
}

}  // namespace

PrefixCache::PrefixCache(BlockPool& pool, KvCache& kv, int64_t max_states)
    : pool_(&pool), kv_(&kv), block_size_(kv.block_size()), max_states_(max_states), recurrent_(kv.has_recurrent()) {
  if (max_states < 0) fail("[prefix_cache] max_states must be >= 0, got ", max_states);
  entries_[0] = Entry{};
  pool_->set_reclaimer([this] { return evict_one(); });
}

PrefixCache::~PrefixCache() {
  pool_->set_reclaimer({});
  for (auto& [id, e] : entries_)
    if (id != 0) pool_->release(e.block);
}

void PrefixCache::touch(Id id) {
  Entry& e = entries_.at(id);
  const bool leaf = leaves_.erase({e.used, id}) > 0;
  const bool state = states_.erase({e.used, id}) > 0;
  e.used = ++clock_;
  if (leaf) leaves_.insert({e.used, id});
  if (state) states_.insert({e.used, id});
}

PrefixCache::Id PrefixCache::add(Id parent, uint64_t key, std::span<const int32_t> tokens, int32_t block) {
  const Id id = next_id_++;
  Entry& p = entries_.at(parent);
  if (parent != 0 && p.leaf()) leaves_.erase({p.used, parent});
  const bool full = int64_t(tokens.size()) == block_size_;
  (full ? p.children : p.tails).push_back(id);
  Entry& e = entries_[id];
  e.parent = parent;
  e.key = key;
  e.tokens.assign(tokens.begin(), tokens.end());
  e.block = block;
  e.used = ++clock_;
  pool_->retain(block);
  if (full) by_key_[key] = id;
  leaves_.insert({e.used, id});
  return id;
}

void PrefixCache::set_state(Id id, Tensor state) {
  Entry& e = entries_.at(id);
  if (e.state.defined()) return;
  e.state = std::move(state);
  states_.insert({e.used, id});
  while (int64_t(states_.size()) > max_states_) drop_state(states_.begin()->second);
}

void PrefixCache::drop_state(Id id) {
  Entry& e = entries_.at(id);
  states_.erase({e.used, id});
  e.state = Tensor();
  // With recurrent state, a leaf without one resumes nothing.
  if (recurrent_ && e.leaf()) remove(id);
}

void PrefixCache::remove(Id id) {
  AUGUR_ASSERT(id != 0, "the prefix cache's root is not removed");
  Entry& e = entries_.at(id);
  AUGUR_ASSERT(e.leaf(), "only a leaf of the prefix cache is removed");
  leaves_.erase({e.used, id});
  if (e.state.defined()) states_.erase({e.used, id});
  if (auto k = by_key_.find(e.key); k != by_key_.end() && k->second == id) by_key_.erase(k);
  pool_->release(e.block);
  const Id parent = e.parent;
  entries_.erase(id);
  Entry& p = entries_.at(parent);
  std::erase(p.children, id);
  std::erase(p.tails, id);
  if (parent == 0 || !p.leaf()) return;
  if (recurrent_ && !p.state.defined())
    remove(parent);
  else
    leaves_.insert({p.used, parent});
}

bool PrefixCache::evict_one() {
  if (leaves_.empty()) return false;
  // The least recently used leaf that only the cache holds: its block comes
  // free. One a running sequence shares frees nothing now (and is the prefix
  // that sequence's successors will want), so such leaves go last.
  for (const auto& [used, id] : leaves_)
    if (pool_->refcount(entries_.at(id).block) == 1) {
      remove(id);
      return true;
    }
  remove(leaves_.begin()->second);
  return true;
}

SequenceSnapshot PrefixCache::lookup(std::span<const int32_t> tokens, int64_t limit, int64_t* shared) {
  ++lookups_;
  limit = std::min<int64_t>(limit, int64_t(tokens.size()));
  // The best resume point: `len` tokens from the first `depth` entries of
  // the path, then `extra` (a tail, or a partly matching block) when not 0.
  int64_t best = 0;
  size_t best_depth = 0;
  Id extra = 0;
  const Tensor* state = nullptr;
  std::vector<Id> path;
  Id at = 0;
  uint64_t key = 0;
  int64_t pos = 0;
  for (;;) {
    const Entry& cur = entries_.at(at);
    if (recurrent_) {
      // Where a state was kept: this block's end, or a tail after it.
      if (at != 0 && cur.state.defined() && pos <= limit && pos > best) {
        best = pos, best_depth = path.size(), extra = 0, state = &cur.state;
      }
      for (Id t : cur.tails) {
        const Entry& te = entries_.at(t);
        const int64_t end = pos + int64_t(te.tokens.size());
        if (!te.state.defined() || end > limit || end <= best) continue;
        if (same(te.tokens, tokens.subspan(size_t(pos), te.tokens.size())))
          best = end, best_depth = path.size(), extra = t, state = &te.state;
      }
    }
    if (pos + block_size_ > int64_t(tokens.size())) break;
    const std::span<const int32_t> block = tokens.subspan(size_t(pos), size_t(block_size_));
    const uint64_t k = chain_key(key, block);
    auto it = by_key_.find(k);
    if (it == by_key_.end()) break;
    const Entry& next = entries_.at(it->second);
    if (next.parent != at || !same(next.tokens, block)) break;  // a collision
    path.push_back(it->second);
    at = it->second, key = k, pos += block_size_;
  }
  if (shared) *shared = pos;
  if (!recurrent_) {
    // Any position resumes: the whole path (up to limit), or further into
    // whichever block extending it shares the most tokens with what follows.
    best = std::min(pos, limit);
    best_depth = size_t((best + block_size_ - 1) / block_size_);
    if (pos < limit) {
      const Entry& cur = entries_.at(at);
      const std::span<const int32_t> rest = tokens.subspan(size_t(pos));
      for (const auto* list : {&cur.children, &cur.tails})
        for (Id c : *list) {
          const int64_t end = std::min(pos + int64_t(common_prefix(entries_.at(c).tokens, rest)), limit);
          if (end > best) best = end, best_depth = path.size(), extra = c;
        }
    }
  }
  if (best == 0) return {};
  ++hits_;
  hit_tokens_ += best;
  std::vector<int32_t> blocks;
  for (size_t d = 0; d < best_depth; ++d) {
    touch(path[d]);
    blocks.push_back(entries_.at(path[d]).block);
  }
  if (extra != 0) {
    touch(extra);
    blocks.push_back(entries_.at(extra).block);
  }
  return SequenceSnapshot(*pool_, std::move(blocks), std::vector<int32_t>(tokens.begin(), tokens.begin() + best),
                          state ? *state : Tensor());
}

void PrefixCache::insert(const Sequence& seq, bool keep_end) {
  // With recurrent state, blocks help only up to a state kept after them.
  if (recurrent_ && !keep_end) return;
  const std::vector<int32_t>& tokens = seq.tokens();
  const std::span<const int32_t> blocks = seq.block_table();
  const int64_t n_full = int64_t(tokens.size()) / block_size_;
  Id at = 0;
  uint64_t key = 0;
  for (int64_t d = 0; d < n_full; ++d) {
    const std::span<const int32_t> block(tokens.data() + d * block_size_, size_t(block_size_));
    const uint64_t k = chain_key(key, block);
    auto it = by_key_.find(k);
    if (it == by_key_.end()) {
      at = add(at, k, block, blocks[size_t(d)]);
    } else {
      const Entry& e = entries_.at(it->second);
      if (e.parent != at || !same(e.tokens, block)) return;  // a collision: the prefix stays uncached
      at = it->second;
      touch(at);
    }
    key = k;
  }
  if (!keep_end) return;
  const std::span<const int32_t> rest(tokens.data() + n_full * block_size_, tokens.size() - size_t(n_full * block_size_));
  if (rest.empty()) {
    if (recurrent_ && at != 0) set_state(at, kv_->save_slot(seq.state_slot()));
    return;
  }
  // A tail. Without recurrent state a longer one serves every request a
  // shorter one it extends would.
  for (Id t : std::vector<Id>(entries_.at(at).tails)) {
    const Entry& te = entries_.at(t);
    if (same(te.tokens, rest)) {
      touch(t);
      if (recurrent_) set_state(t, kv_->save_slot(seq.state_slot()));
      return;
    }
    if (!recurrent_ && te.tokens.size() < rest.size() && same(te.tokens, rest.first(te.tokens.size()))) remove(t);
  }
  // A sequence that resumed partway into a block the cache keeps (a child or
  // a tail whose tokens extend `rest`) and wrote nothing since still holds
  // that block: its entry already serves every lookup this tail would, and a
  // second entry would hold the block twice, so that neither counted as
  // reclaimable while no sequence used it.
  const Entry& parent = entries_.at(at);
  for (const auto* list : {&parent.children, &parent.tails})
    for (Id c : *list)
      if (entries_.at(c).block == blocks[size_t(n_full)]) {
        touch(c);
        return;
      }
  const Id t = add(at, 0, rest, blocks[size_t(n_full)]);
  if (recurrent_) set_state(t, kv_->save_slot(seq.state_slot()));
}

int64_t PrefixCache::reclaimable() const {
  int64_t n = 0;
  for (const auto& [id, e] : entries_)
    if (id != 0 && pool_->refcount(e.block) == 1) ++n;
  return n;
}

PrefixCache::Stats PrefixCache::stats() const {
  Stats s;
  s.blocks = int64_t(entries_.size()) - 1;
  s.blocks_only = reclaimable();
  s.states = int64_t(states_.size());
  s.state_bytes = s.states * (recurrent_ ? kv_->recurrent_spec().bytes_per_slot() : 0);
  s.lookups = lookups_;
  s.hits = hits_;
  s.hit_tokens = hit_tokens_;
  return s;
}

}  // namespace augur
