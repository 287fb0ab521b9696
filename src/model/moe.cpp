#include "model/moe.h"

#include <cstring>

#include "backend/device.h"
#include "backend/ops.h"
#include "core/error.h"
#include "core/quant.h"

namespace augur {

namespace {
bool is_half(DType d) { return d == DType::BF16 || d == DType::F16; }
}  // namespace

namespace {

// Experts quantized unlike one another, or some not at all: stacked as the
// floats the CPU multiplies them as.
Tensor stack_experts_as_floats(const std::vector<Tensor>& parts, int64_t n_expert) {
  std::vector<Tensor> floats;
  for (const Tensor& p : parts)
    floats.push_back(p.is_quantized() ? dequantize(p, dequantized_cpu_type(p.quant())) : p);
  return stack_experts(floats, n_expert);
}

}  // namespace

Tensor stack_experts(const std::vector<Tensor>& parts, int64_t n_expert) {
  AUGUR_ASSERT(!parts.empty() && n_expert > 0, "stack_experts of nothing");
  const Tensor& first = parts.front();
  DType dt = first.dtype();
  int64_t rows = 0;
  for (const Tensor& p : parts) {
    if (p.ndim() != 2 || p.dim(1) != first.dim(1))
      fail("[moe] expert matrix ", p.shape_str(), " does not stack onto ", first.shape_str());
    rows += p.dim(0);
    if (p.is_quantized() || dt == DType::QAFFINE) {
      if (!p.is_quantized() || p.quant() != first.quant()) return stack_experts_as_floats(parts, n_expert);
      continue;
    }
    if (p.dtype() == dt) continue;
    if (!is_half(p.dtype()) || !is_half(dt))
      fail("[moe] experts of mixed dtypes (", dtype_name(p.dtype()), ", ", dtype_name(dt), ") cannot be stacked");
    dt = DType::BF16;  // mixed 16-bit types: the one that holds them all
  }
  AUGUR_ASSERT(rows % n_expert == 0, "stack_experts: rows split evenly over the experts");
  const int64_t shape[] = {n_expert, rows / n_expert, first.dim(1)};
  // A view when the parts lie back to back in one buffer in that dtype.
  const char* base = static_cast<const char*>(first.buffer()->data());
  const char* at = static_cast<const char*>(first.raw());
  bool adjacent = true;
  for (const Tensor& p : parts) {
    adjacent = adjacent && p.buffer() == first.buffer() && p.dtype() == dt && p.is_contiguous() && p.raw() == at;
    at += p.nbytes();
  }
  const size_t offset = size_t(static_cast<const char*>(first.raw()) - base);
  if (adjacent)
    return dt == DType::QAFFINE ? Tensor::quantized_view(first.buffer(), offset, first.quant(), shape, 3)
                                : Tensor::view_of(first.buffer(), offset, dt, shape, 3);
  std::vector<Tensor> same;
  for (const Tensor& p : parts) same.push_back(p.dtype() == dt ? p : convert_half(p, dt));
  return stack_rows(same).reshape({shape[0], shape[1], shape[2]});
}

// Reference: Qwen3NextSparseMoeBlock.forward. The experts' outputs are added
// into zeros in ascending expert order (Qwen3NextExperts' index_add_), then the
// gated shared expert is added.
void sparse_moe_block(const Tensor& x, const MoeWeights& w, const Tensor& out, Scratch& scratch) {
  const int64_t T = x.dim(0), d = x.dim(1), E = w.router.dim(0), k = w.n_expert_used;
  Tensor logits = scratch.get("moe.logits", {T, E});
  ops::linear(x, w.router, logits);
  Tensor weights = scratch.get("moe.weights", {T, k});
  // Routing and every expert on x's device: the ids never leave it.
  const int64_t shape[] = {T, k};
  Tensor ids = Tensor::view_of(scratch.get("moe.ids", {T * k}).buffer(), 0, DType::I32, shape, 2);
  ops::moe_route(logits, k, w.norm_topk, weights, ids);
  Tensor workspace = scratch.get("moe.workspace", {ops::moe_experts_workspace(x, w.gate_up, ids)});
  ops::moe_experts(x, w.gate_up, w.down, weights, ids, out, workspace);
  if (w.shared.gate_up.defined()) {
    Tensor sh = scratch.get("moe.shared", {T, d});
    Tensor gate = scratch.get("moe.shared_gate", {T, 1});
    swiglu_mlp(x, w.shared, sh, scratch);
    ops::linear(x, w.shared_gate, gate);
    ops::sigmoid_mul(sh, gate, sh);
    ops::add_inplace(out, sh);
  }
}

}  // namespace augur
