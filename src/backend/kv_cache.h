// Paged K/V storage and recurrent-state slots: the memory a model's
// sequences live in, on one device. The runtime hands out its blocks and
// slots; the model's forward reads and writes them through ops.
#pragma once

#include <cstdint>

#include "backend/device.h"
#include "backend/ops.h"
#include "core/tensor.h"

namespace augur {

// What the KV cache of a model looks like.
struct KvSpec {
  int64_t n_layer = 0;  // layers that keep K/V
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  int64_t bytes_per_token(Device d = Device::CPU) const {
    return n_layer * n_head_kv * head_dim * 2 * int64_t(dtype_size(kv_dtype(d)));
  }
  // K/V are f32 on the CPU (exact against the reference), f16 on CUDA (8x
  // less rounding than bf16; K and V stay far inside its range, and stores
  // saturate rather than overflow; see device_half).
  static DType kv_dtype(Device d) { return device_half(d); }
};

// What the recurrent state of a model looks like (linear-attention layers:
// Gated DeltaNet). Each live sequence owns one slot holding, per such layer, the
// conv tail and the delta-rule matrix state, in f32.
struct RecurrentSpec {
  int64_t n_layer = 0;     // layers that keep recurrent state
  int64_t conv_dim = 0;    // channels of the causal conv (q, k and v)
  int64_t conv_tail = 0;   // conv inputs kept per channel (kernel size - 1)
  int64_t n_head = 0;      // value heads: one state matrix each
  int64_t head_dim_k = 0;
  int64_t head_dim_v = 0;
  int64_t floats_per_layer() const { return conv_tail * conv_dim + n_head * head_dim_k * head_dim_v; }
  // The state a slot holds (what KvCache::save_slot copies).
  int64_t bytes_per_slot() const { return n_layer * floats_per_layer() * 4; }
  // A layer's inputs a token, as a slot's input history keeps them: the
  // conv input, then b and a (the gates' inputs).
  int64_t inputs_per_token() const { return conv_dim + 2 * n_head; }
  // The input history of a slot (KvCache::kInputHistory positions).
  int64_t history_bytes_per_slot() const;
};

// Paged K/V storage for all layers: fixed-size blocks of token slots, handed
// out to sequences by the runtime's block allocator; plus, for models with
// recurrent layers, n_slots recurrent-state slots (one per live sequence),
// handed out by the runtime's slot pool.
class KvCache {
 public:
  // Positions of recurrent-layer inputs a slot keeps (ops::RecurrentLayer::
  // inputs): enough for a verify of 1 + 7 drafts, so that a rollback replays
  // only the recurrence over the kept tokens (Model::replay_recurrent).
  static constexpr int64_t kInputHistory = 8;
  KvCache(const KvSpec& spec, int64_t n_blocks, int64_t block_size, Device device = Device::CPU);
  KvCache(const KvSpec& spec, int64_t n_blocks, int64_t block_size, const RecurrentSpec& recurrent,
          int64_t n_slots, Device device = Device::CPU);
  const ops::KvLayer& layer(int64_t i) const { return layers_[size_t(i)]; }
  int64_t n_blocks() const { return n_blocks_; }
  int64_t block_size() const { return block_size_; }
  // Unique over the process: tells caches apart even when one reuses the
  // memory of another (captured decode graphs are keyed by it).
  uint64_t id() const { return id_; }
  const KvSpec& spec() const { return spec_; }
  // Copies the contents of block `src` into block `dst` in every layer
  // (copy-on-write of a shared, partly filled block).
  void copy_block(int32_t src, int32_t dst);

  // Recurrent state of the i-th recurrent layer (not the model's layer index).
  const ops::RecurrentLayer& recurrent_layer(int64_t i) const { return recurrent_[size_t(i)]; }
  const RecurrentSpec& recurrent_spec() const { return rspec_; }
  bool has_recurrent() const { return rspec_.n_layer > 0; }
  int64_t n_slots() const { return n_slots_; }
  // The empty state (a sequence at position 0).
  void zero_slot(int32_t slot);
  // A copy of one slot's state, every recurrent layer: [floats per slot] f32,
  // on the cache's device. load_slot writes such a copy back, bit for bit.
  Tensor save_slot(int32_t slot) const;
  void load_slot(int32_t slot, const Tensor& saved);

 private:
  uint64_t id_;
  KvSpec spec_;
  int64_t n_blocks_;
  int64_t block_size_;
  std::vector<ops::KvLayer> layers_;
  RecurrentSpec rspec_;
  int64_t n_slots_ = 0;
  std::vector<ops::RecurrentLayer> recurrent_;
  Tensor zeros_;  // accelerators: one slot's worth of zeros (zero_slot copies it)
};

}  // namespace augur
