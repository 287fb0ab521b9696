// The op set that model code calls. Ops take tensor views and check their
// arguments (the op name leads every message); the device of the tensors picks
// the implementation. Every op has a CPU implementation, the reference for
// other backends. Activations are f32; weights may be bf16 or f32.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"

namespace augur::ops {

// out[t, :] = table[ids[t], :]
// table: [n_vocab, d_model] bf16|f32; out: [n_tokens, d_model] f32
void embedding(const Tensor& table, std::span<const int32_t> ids, const Tensor& out);

// y = x · wᵀ (PyTorch Linear).  x: [M, K] f32; w: [N, K] bf16|f32; y: [M, N] f32
void linear(const Tensor& x, const Tensor& w, const Tensor& y);

// Per row: y = x / sqrt(mean(x²) + eps) * w.  x, y: [M, D] f32 (may alias); w: [D] f32
void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y);

// a += b.  a, b: same shape, f32
void add_inplace(const Tensor& a, const Tensor& b);

// out = silu(gate) * up.  gate, up, out: [M, D] f32 (out may alias gate)
void swiglu(const Tensor& gate, const Tensor& up, const Tensor& out);

// Rotary embedding, rotate-half (GPT-NeoX) layout, on the first 2*len(inv_freq)
// dims of each head; the rest pass through.
// x: [n_tokens, n_head, head_dim] f32, in place; positions: [n_tokens];
// inv_freq: [rot_dim / 2] f32
void rope(const Tensor& x, std::span<const int32_t> positions, std::span<const float> inv_freq);

// Paged KV cache of one layer: fixed-size blocks of token slots.
struct KvLayer {
  Tensor k;  // [n_blocks, block_size, n_head_kv, head_dim] f32
  Tensor v;  // [n_blocks, block_size, n_head_kv, head_dim] f32
};

// One row of a flattened batch, as the attention ops see it: tokens
// [token_begin, token_begin + n_tokens) of the batch sit at positions
// pos0, pos0 + 1, ...; the row's KV lives in the blocks of block_table.
struct AttnRow {
  int32_t token_begin;
  int32_t n_tokens;
  int32_t pos0;
  std::span<const int32_t> block_table;
};

// Writes k, v of every token into its row's slots (position p of a row lives
// in block block_table[p / block_size], slot p % block_size).
// k, v: [n_tokens, n_head_kv, head_dim] f32
void store_kv(const Tensor& k, const Tensor& v, std::span<const AttnRow> rows, const KvLayer& cache);

// Causal attention over the paged cache, GQA (n_head a multiple of n_head_kv):
// token t of a row at position p attends to positions [max(0, p - window + 1), p]
// of its row (window 0 = unlimited).
// q: [n_tokens, n_head, head_dim] f32; out: [n_tokens, n_head, head_dim] f32
void paged_attention(const Tensor& q, const KvLayer& cache, std::span<const AttnRow> rows,
                     float scale, int32_t window, const Tensor& out);

}  // namespace augur::ops
