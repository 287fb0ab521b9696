#include "model/moe.h"

#include <cstring>

#include "backend/ops.h"

namespace augur {

// Reference: Qwen3NextSparseMoeBlock.forward. The experts' outputs are added
// into zeros in ascending expert order (Qwen3NextExperts' index_add_), then the
// gated shared expert is added.
void sparse_moe_block(const Tensor& x, const MoeWeights& w, const Tensor& out, Scratch& scratch) {
  const int64_t T = x.dim(0), d = x.dim(1), E = w.router.dim(0), k = w.n_expert_used;
  Tensor logits = scratch.get("moe.logits", {T, E});
  ops::linear(x, w.router, logits);
  Tensor weights = scratch.get("moe.weights", {T, k});
  Tensor ids = Tensor::empty(DType::I32, {T, k});
  ops::moe_route(logits, k, w.norm_topk, weights, ids);

  // Tokens (and their weights) per expert, tokens in batch order.
  std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(E));
  std::vector<std::vector<float>> scales(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < k; ++i) {
      const int32_t e = ids.data<int32_t>()[t * k + i];
      tokens[size_t(e)].push_back(int32_t(t));
      scales[size_t(e)].push_back(weights.data<float>()[t * k + i]);
    }

  std::memset(out.raw(), 0, out.nbytes());
  for (int64_t e = 0; e < E; ++e) {
    const auto& tok = tokens[size_t(e)];
    if (tok.empty()) continue;
    const int64_t n = int64_t(tok.size());
    Tensor xe = scratch.get("moe.x", {n, d});
    Tensor ye = scratch.get("moe.y", {n, d});
    ops::gather_rows(x, tok, xe);
    swiglu_mlp(xe, w.experts[size_t(e)], ye, scratch);
    ops::scatter_add_rows(ye, tok, scales[size_t(e)], out);
  }

  if (w.shared.gate.defined()) {
    Tensor sh = scratch.get("moe.shared", {T, d});
    Tensor gate = scratch.get("moe.shared_gate", {T, 1});
    swiglu_mlp(x, w.shared, sh, scratch);
    ops::linear(x, w.shared_gate, gate);
    ops::sigmoid_mul(sh, gate, sh);
    ops::add_inplace(out, sh);
  }
}

}  // namespace augur
