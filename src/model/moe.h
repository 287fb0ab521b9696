// Sparse mixture-of-experts MLP with an optional shared expert
// (Qwen2MoeSparseMoeBlock / Qwen3NextSparseMoeBlock).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/layers.h"

namespace augur {

struct MoeWeights {
  Tensor router;                    // [n_expert, d_model]
  std::vector<MlpWeights> experts;  // gate, up [d_ff_expert, d_model]; down [d_model, d_ff_expert]
  int64_t n_expert_used = 0;        // top k
  bool norm_topk = true;            // renormalise the kept routing weights
  MlpWeights shared;                // shared expert (shared.gate undefined: none)
  Tensor shared_gate;               // [1, d_model]: sigmoid gate of the shared expert
  // The experts stacked (accelerators): when defined they replace `experts`,
  // and one op (ops::moe_experts) runs every routed expert on the device.
  Tensor stacked_gate_up;           // [n_expert, 2 d_ff_expert, d_model]: per expert gate rows, then up rows
  Tensor stacked_down;              // [n_expert, d_model, d_ff_expert]
};

// Stacks the experts of `w` into stacked_gate_up / stacked_down (one dtype:
// bf16 when the experts' 16-bit types differ) and drops the per-expert
// tensors: the layout accelerators run.
void stack_experts(MoeWeights& w);

// Route each token to its top-k experts, sum their SwiGLU outputs weighted by
// the routing weights (in ascending expert order), add the gated shared expert.
// x, out: [n_tokens, d_model]
void sparse_moe_block(const Tensor& x, const MoeWeights& w, const Tensor& out, Scratch& scratch);

}  // namespace augur
