// Sparse mixture-of-experts MLP with an optional shared expert
// (Qwen2MoeSparseMoeBlock / Qwen3NextSparseMoeBlock).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/layers.h"

namespace augur {

struct MoeWeights {
  Tensor router;             // [n_expert, d_model]
  // The experts stacked: one op (ops::moe_experts) runs every routed expert.
  Tensor gate_up;            // [n_expert, 2 d_ff_expert, d_model]: per expert gate rows, then up rows
  Tensor down;               // [n_expert, d_model, d_ff_expert]
  int64_t n_expert_used = 0; // top k
  bool norm_topk = true;     // renormalise the kept routing weights
  MlpWeights shared;         // shared expert (shared.gate_up undefined: none)
  Tensor shared_gate;        // [1, d_model]: sigmoid gate of the shared expert
};

// `parts` (matrices of one width, in order: expert 0's, then expert 1's, ...)
// stacked into one [n_expert, rows per expert, cols] tensor: a view when they
// already lie so in one buffer (a fused checkpoint tensor), else a copy, in
// their dtype (bf16 when their 16-bit types differ).
Tensor stack_experts(const std::vector<Tensor>& parts, int64_t n_expert);

// Route each token to its top-k experts, sum their SwiGLU outputs weighted by
// the routing weights (in ascending expert order), add the gated shared expert.
// x, out: [n_tokens, d_model]
void sparse_moe_block(const Tensor& x, const MoeWeights& w, const Tensor& out, Scratch& scratch);

}  // namespace augur
