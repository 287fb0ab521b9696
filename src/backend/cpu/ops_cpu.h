// CPU kernels behind backend/ops.h (raw pointers, shapes checked by the caller).
#pragma once

#include <cstdint>
#include <span>

#include "backend/ops.h"
#include "core/dtype.h"

namespace augur::cpu {

void embedding(const void* table, DType dtype, int64_t d_model, std::span<const int32_t> ids,
               float* out);
// x, y: [M, D]; w: [D]
void rms_norm(const float* x, const float* w, float eps, int64_t M, int64_t D, float* y);
void add_inplace(float* a, const float* b, int64_t n);
void swiglu(const float* gate, const float* up, float* out, int64_t n);
// x += o; h = rms_norm(x) * w.  x, o, h: [M, D]
void add_rms_norm(float* x, const float* o, const float* w, float eps, int64_t M, int64_t D, float* h);
// gate_up: [M, 2D]; out: [M, D]
void swiglu_packed(const float* gate_up, int64_t M, int64_t D, float* out);
// logits: [n_rows, n_vocab]; out: [n_rows] (ops::sample's semantics)
void sample(const float* logits, int64_t n_vocab, std::span<const ops::SampleRow> rows, int32_t* out);
// The two halves of sample() for one row: the kept tokens' weights (w: [V],
// zero elsewhere; greedy: 1 at the argmax), and the walk in id order.
void sample_weights(const float* row, int64_t V, const ops::SampleRow& p, float* w);
int32_t sample_walk(const float* w, int64_t V, float uniform);
void apply_penalties(float* logits, int64_t n_vocab, std::span<const ops::PenaltyEntry> entries);
// x: [n_tokens, n_head, head_dim]
void rope(float* x, int64_t n_tokens, int64_t n_head, int64_t head_dim,
          std::span<const int32_t> positions, std::span<const float> inv_freq);
// k, v: [n_tokens, n_head_kv, head_dim]; caches: [n_blocks, block_size, n_head_kv, head_dim]
void store_kv(const float* k, const float* v, int64_t kv_dim, std::span<const ops::AttnRow> rows,
              int64_t block_size, float* k_cache, float* v_cache);
// q, out: [n_tokens, n_head, head_dim]
void paged_attention(const float* q, const float* k_cache, const float* v_cache,
                     int64_t block_size, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                     std::span<const ops::AttnRow> rows, float scale, int32_t window, float* out);

}  // namespace augur::cpu
