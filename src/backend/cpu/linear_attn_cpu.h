// CPU kernels of linear attention (Gated DeltaNet) and the small element-wise
// ops around it, behind backend/ops.h (raw pointers; shapes checked by the caller).
//
// Exactness: every kernel computes a row (and, for the recurrences, a row's
// value head) on one thread in a fixed order, so results do not depend on the
// other rows of the batch or on the thread count.
#pragma once

#include <cstdint>
#include <span>

#include "backend/ops.h"

namespace augur::cpu {

// x: [M, N] row stride N; y: [M, n]
void slice_cols(const float* x, int64_t M, int64_t N, int64_t begin, int64_t n, float* y);

// proj: [n_tokens, P]; positions: [n_tokens]; inputs: [n_slots, n_pos, n_conv + 2 n_head]
// (ops::keep_recurrent_inputs)
void keep_recurrent_inputs(const float* proj, int64_t P, int64_t n_conv, int64_t n_z,
                           std::span<const ops::RecurrentRow> rows, const int32_t* positions, int64_t n_pos,
                           int64_t width, float* inputs);

// x: [n_tokens, C] at row stride ldx; out: [n_tokens, C]; w: [C, K]; conv_state: [n_slots, K-1, C]
void causal_conv1d(const float* x, int64_t ldx, const float* w, int64_t C, int64_t K,
                   std::span<const ops::RecurrentRow> rows, float* conv_state, bool silu, float* out);

// x, y: [M, D]
void l2norm(const float* x, float eps, int64_t M, int64_t D, float* y);

// a, b, g, beta: [n_tokens, n_head]; a_log, dt_bias: [n_head]
void delta_rule_gates(const float* a, const float* b, const float* a_log, const float* dt_bias,
                      int64_t n_tokens, int64_t n_head, float* g, float* beta);

// Shapes of one gated-delta-rule call.
struct DeltaRuleDims {
  int64_t n_head_k, n_head, head_dim_k, head_dim_v;
};

// ops::delta_rule_inputs. proj: [n_tokens, P]; conv_w: [C, K]; conv_state:
// [n_slots, K-1, C]; q, k: [n_tokens, n_head_k, head_dim_k]; v: [n_tokens,
// n_head, head_dim_v]; g, beta: [n_tokens, n_head]; only the rows' tokens are written.
void delta_rule_inputs(const float* proj, int64_t P, int64_t ba_col, const float* conv_w, int64_t K,
                       const DeltaRuleDims& dims, const float* a_log, const float* dt_bias, float qk_eps,
                       std::span<const ops::RecurrentRow> rows, float* conv_state, float* q, float* k, float* v,
                       float* g, float* beta);

// q, k: [n_tokens, n_head_k, head_dim_k]; v, out: [n_tokens, n_head, head_dim_v];
// g, beta: [n_tokens, n_head]; state: [n_slots, n_head, head_dim_k, head_dim_v]
void gated_delta_rule_recurrent(const float* q, const float* k, const float* v, const float* g,
                                const float* beta, float scale, const DeltaRuleDims& dims,
                                std::span<const ops::RecurrentRow> rows, float* state, float* out);
void gated_delta_rule_chunked(const float* q, const float* k, const float* v, const float* g,
                              const float* beta, float scale, int64_t chunk_size,
                              const DeltaRuleDims& dims, std::span<const ops::RecurrentRow> rows,
                              float* state, float* out);

// x, y: [M, D]; w: [D]; z: rows of z_width (a multiple of D) at stride ldz,
// x's row m gated by z[m / (z_width / D)] from column (m % (z_width / D)) D
void gated_rms_norm(const float* x, const float* z, int64_t z_width, int64_t ldz, const float* w, float eps,
                    int64_t M, int64_t D, float* y);

// x, y: [M, N]; gate: [M, N] when per_row is false, [M] when true
void sigmoid_mul(const float* x, const float* gate, bool per_row, int64_t M, int64_t N, float* y);

}  // namespace augur::cpu
