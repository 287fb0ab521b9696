// The prefix cache: KV blocks of earlier requests, found again by content,
// so that a request sharing a prefix with one before it (a chat's next turn,
// a common system prompt) feeds only what follows.
//
// Full blocks are keyed by a hash chain: block d's key hashes block d-1's key
// with block d's tokens, so one key names one prefix of d + 1 blocks (the
// tokens are compared as well: a hash collision is a miss, never a wrong
// hit). The cache holds one reference on each block it keeps; sequences
// that resume from it share the block (refcounted, copy-on-write on the
// first write into a partly filled one, as for any snapshot).
//
// Models with recurrent state (Gated DeltaNet layers) can resume only where
// a copy of their state was kept: at a block boundary where a prompt chunk
// ended (the engine ends chunks on boundaries, and ends one where a prompt
// leaves the blocks the cache already holds, so that the prefix requests are
// seen to share, a system prompt, gets a state), or at a sequence's end (a
// prompt's last token, a request's last one) as a "tail": the tokens past
// the last full block, their partly filled block, and the state after them.
// Models without recurrent state resume at any position, a partly matching
// block included.
//
// Eviction is least recently used, leaves first (an entry whose prefix
// extends no other): blocks when the pool runs dry (the pool's reclaimer),
// recurrent-state copies beyond max_states.
#pragma once

#include <cstdint>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/kv_cache.h"
#include "runtime/sequence.h"

namespace augur {

class PrefixCache {
 public:
  // max_states: recurrent-state copies kept at most (models with recurrent
  // state; each is KvCache::recurrent_spec().bytes_per_slot()).
  PrefixCache(BlockPool& pool, KvCache& kv, int64_t max_states);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // The longest prefix of `tokens`, at most `limit` long, that a sequence can
  // resume from: its blocks and tokens, and the recurrent state after it. A
  // miss is an empty snapshot. `shared`, when given, is set to the length of
  // the prefix the cache holds whole blocks of (with recurrent state it may
  // pass the point a state allows resuming from: a state kept there by the
  // request serves the next one).
  SequenceSnapshot lookup(std::span<const int32_t> tokens, int64_t limit, int64_t* shared = nullptr);
  // Keeps the full blocks of `seq`; with keep_end, its end as well (the
  // recurrent state after its last token, or without recurrent state its
  // partly filled last block).
  void insert(const Sequence& seq, bool keep_end);
  // Drops the least recently used leaf; false when there is none. Frees a
  // block only where no sequence shares it.
  bool evict_one();

  // Blocks the cache alone holds: given back when the pool needs them.
  int64_t reclaimable() const;

  struct Stats {
    int64_t blocks = 0;       // blocks the cache holds
    int64_t blocks_only = 0;  // of those, held by no sequence (reclaimable)
    int64_t states = 0;       // recurrent-state copies
    int64_t state_bytes = 0;
    int64_t lookups = 0, hits = 0, hit_tokens = 0;
  };
  Stats stats() const;

 private:
  using Id = uint64_t;  // an entry's id; 0 is the root (the empty prefix)
  struct Entry {
    Id parent = 0;
    uint64_t key = 0;             // chain hash (full blocks; tails: 0)
    std::vector<int32_t> tokens;  // block_size of them, or fewer (a tail)
    int32_t block = -1;
    Tensor state;                 // recurrent state after its last token, or none
    uint64_t used = 0;            // last use (LRU)
    std::vector<Id> children;     // full blocks that extend it
    std::vector<Id> tails;        // tails that extend it
    bool leaf() const { return children.empty() && tails.empty(); }
  };
  Id add(Id parent, uint64_t key, std::span<const int32_t> tokens, int32_t block);
  void touch(Id id);
  void set_state(Id id, Tensor state);
  void drop_state(Id id);
  void remove(Id id);

  BlockPool* pool_;
  KvCache* kv_;
  int64_t block_size_;
  int64_t max_states_;
  bool recurrent_;
  Id next_id_ = 1;
  uint64_t clock_ = 0;
  std::unordered_map<Id, Entry> entries_;  // and entries_[0], the root
  std::unordered_map<uint64_t, Id> by_key_;
  std::set<std::pair<uint64_t, Id>> leaves_;  // (used, id) of entries no other extends
  std::set<std::pair<uint64_t, Id>> states_;  // (used, id) of entries holding a state
  int64_t lookups_ = 0, hits_ = 0, hit_tokens_ = 0;
};

}  // namespace augur
