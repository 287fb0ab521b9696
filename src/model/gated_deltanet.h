// Gated DeltaNet token mixer (Qwen3.5 / Qwen3-Next linear-attention layers):
// projections, causal conv over the carried conv state, L2-normalised q and k,
// the gated delta rule over the carried matrix state, gated RMSNorm, out_proj.
#pragma once

#include <cstdint>
#include <span>

#include "backend/ops.h"
#include "core/tensor.h"
#include "model/layers.h"

namespace augur {

struct GatedDeltaNetShape {
  int64_t n_head_k = 0;     // query/key heads
  int64_t n_head = 0;       // value heads (a multiple of n_head_k)
  int64_t head_dim_k = 0;
  int64_t head_dim_v = 0;
  int64_t conv_kernel = 0;  // K
  float norm_eps = 1e-6f;   // gated RMSNorm
  int64_t key_dim() const { return n_head_k * head_dim_k; }
  int64_t value_dim() const { return n_head * head_dim_v; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
};

// Canonical (Qwen3.5) layout; checkpoints with fused projections (Qwen3-Next)
// are regrouped into it at load time.
struct GatedDeltaNetWeights {
  // in_proj_qkv, in_proj_z, in_proj_b, in_proj_a stacked (one matmul makes
  // all four): [conv_dim + value_dim + 2 n_head, d_model]; within the first
  // conv_dim rows q heads, k heads, v heads.
  Tensor in_all;
  Tensor conv;     // [conv_dim, K] f32 (depthwise kernel, no bias)
  Tensor a_log;    // [n_head] f32
  Tensor dt_bias;  // [n_head] f32
  Tensor norm;     // [head_dim_v] f32, the gain γ as stored (not 1 + γ)
  Tensor out;      // [d_model, n_head*head_dim_v]
};

// Rows of up to this many tokens (decode steps, speculative verify windows)
// take the recurrent form of the delta rule, so that their outputs and states
// are those of feeding the tokens one at a time; longer rows (prefill chunks)
// take the chunked form, which agrees within float rounding.
constexpr int32_t kRecurrentFormMaxTokens = 16;
// Chunk length of the chunked form (torch_chunk_gated_delta_rule's default).
constexpr int64_t kDeltaRuleChunk = 64;

// Qwen3_5GatedDeltaNet.forward for a flattened batch, up to out_proj: each
// row continues the conv and matrix state in its slot of `state` (the slots
// as `batch` holds them too, so that recorded decode steps follow the rows).
// Returns out_proj's input, the gated-normed core [n_tokens, n_head*head_dim_v],
// in scratch. x: [n_tokens, d_model] (already normed); `projected`:
// x · in_allᵀ already computed (block_tail's next projection), or undefined.
Tensor gated_deltanet_mix(const Tensor& x, const GatedDeltaNetWeights& w, const GatedDeltaNetShape& s,
                          std::span<const ops::RecurrentRow> rows, const ops::RecurrentLayer& state, Scratch& scratch,
                          const ops::BatchView& batch, const Tensor& projected = Tensor());

// Brings each row's recurrent state (restored to where its kept inputs
// begin) forward over tokens whose inputs a verify window left in the slot's
// history (ops::keep_recurrent_inputs): the conv and the delta rule as the
// window ran them, bit for bit, and nothing else of the layer. The batch's
// rows and positions are those of the tokens replayed.
void gated_deltanet_replay(const GatedDeltaNetWeights& w, const GatedDeltaNetShape& s,
                           std::span<const ops::RecurrentRow> rows, const ops::RecurrentLayer& state, Scratch& scratch,
                           const ops::BatchView& batch);

}  // namespace augur
