#include "model/moe.h"

#include <cstring>

#include "backend/device.h"
#include "backend/ops.h"
#include "core/error.h"

namespace augur {

namespace {

// `parts` back to back as one tensor of `shape` and dtype `dt`: a view when
// they already lie so in one buffer (a fused checkpoint tensor), else a copy.
Tensor concat(const std::vector<Tensor>& parts, DType dt, std::initializer_list<int64_t> shape) {
  const Tensor& first = parts.front();
  const char* base = static_cast<const char*>(first.buffer()->data());
  const char* at = static_cast<const char*>(first.raw());
  bool adjacent = true;
  for (const Tensor& p : parts) {
    adjacent = adjacent && p.buffer() == first.buffer() && p.dtype() == dt && p.is_contiguous() && p.raw() == at;
    at += p.nbytes();
  }
  if (adjacent)
    return Tensor::view_of(first.buffer(), size_t(static_cast<const char*>(first.raw()) - base), dt, shape.begin(),
                           int(shape.size()));
  Tensor out = empty_on(first.device(), dt, shape);
  size_t offset = 0;
  for (const Tensor& p : parts) {
    const Tensor src = p.dtype() == dt ? p : convert_half(p, dt);
    copy_tensor(src, Tensor::view_of(out.buffer(), offset, dt, src.shape().data(), src.ndim()));
    offset += src.nbytes();
  }
  return out;
}

}  // namespace

void stack_experts(MoeWeights& w) {
  if (w.experts.empty()) return;
  const MlpWeights& e0 = w.experts.front();
  AUGUR_ASSERT(e0.gate.defined() && e0.up.defined() && e0.down.defined(), "stack_experts: separate gate/up/down");
  const int64_t E = int64_t(w.experts.size()), I = e0.gate.dim(0), d = e0.gate.dim(1);
  DType dt = e0.gate.dtype();
  std::vector<Tensor> gate_up, down;
  for (const auto& e : w.experts) {
    for (const Tensor* t : {&e.gate, &e.up, &e.down})
      if (t->dtype() != dt) dt = DType::BF16;  // mixed 16-bit types: the one that holds them all
    gate_up.push_back(e.gate);
    gate_up.push_back(e.up);
    down.push_back(e.down);
  }
  if (dt != e0.gate.dtype() || dt == DType::F32)
    for (const auto& e : w.experts)
      for (const Tensor* t : {&e.gate, &e.up, &e.down})
        if (t->dtype() != DType::BF16 && t->dtype() != DType::F16)
          fail("[moe] experts of mixed dtypes (", dtype_name(t->dtype()), ") cannot be stacked");
  w.stacked_gate_up = concat(gate_up, dt, {E, 2 * I, d});
  w.stacked_down = concat(down, dt, {E, d, I});
  w.experts.clear();
}

namespace {

// The host loop over experts (CPU): tokens grouped by expert on the host.
void routed_experts(const Tensor& x, const MoeWeights& w, const Tensor& logits, const Tensor& weights,
                    const Tensor& out, Scratch& scratch) {
  const int64_t T = x.dim(0), d = x.dim(1), E = w.router.dim(0), k = w.n_expert_used;
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
}

}  // namespace

// Reference: Qwen3NextSparseMoeBlock.forward. The experts' outputs are added
// into zeros in ascending expert order (Qwen3NextExperts' index_add_), then the
// gated shared expert is added.
void sparse_moe_block(const Tensor& x, const MoeWeights& w, const Tensor& out, Scratch& scratch) {
  const int64_t T = x.dim(0), d = x.dim(1), E = w.router.dim(0), k = w.n_expert_used;
  Tensor logits = scratch.get("moe.logits", {T, E});
  ops::linear(x, w.router, logits);
  Tensor weights = scratch.get("moe.weights", {T, k});
  if (w.stacked_gate_up.defined()) {
    // Stacked experts: routing and every expert on x's device, ids never leave it.
    const int64_t shape[] = {T, k};
    Tensor ids = Tensor::view_of(scratch.get("moe.ids", {T * k}).buffer(), 0, DType::I32, shape, 2);
    ops::moe_route(logits, k, w.norm_topk, weights, ids);
    Tensor workspace = scratch.get("moe.workspace", {ops::moe_experts_workspace(x, w.stacked_gate_up, ids)});
    ops::moe_experts(x, w.stacked_gate_up, w.stacked_down, weights, ids, out, workspace);
  } else {
    routed_experts(x, w, logits, weights, out, scratch);
  }
  if (w.shared.gate.defined() || w.shared.gate_up.defined()) {
    Tensor sh = scratch.get("moe.shared", {T, d});
    Tensor gate = scratch.get("moe.shared_gate", {T, 1});
    swiglu_mlp(x, w.shared, sh, scratch);
    ops::linear(x, w.shared_gate, gate);
    ops::sigmoid_mul(sh, gate, sh);
    ops::add_inplace(out, sh);
  }
}

}  // namespace augur
