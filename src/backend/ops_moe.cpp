// The mixture-of-experts ops: top-k routing, the routed experts' SwiGLU
// MLPs, and the CPU's row gather and scatter-add.
#include <algorithm>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cpu/moe_cpu.h"
#include "backend/cpu/ops_cpu.h"
#include "backend/ops_internal.h"
#include "core/thread_pool.h"

namespace augur::ops {

using namespace detail;

void moe_route(const Tensor& logits, int64_t top_k, bool normalize, const Tensor& weights, const Tensor& ids) {
  const Device dev = logits.device();
  require_on("moe_route", logits, "logits", dev);
  require_on("moe_route", weights, "weights", dev);
  require(ids.defined() && ids.device() == dev && ids.dtype() == DType::I32 && ids.is_contiguous(),
          "moe_route", "ids must be a contiguous I32 tensor on the logits' device");
  const int64_t E = logits.dim(-1), T = rows_of(logits);
  require(top_k >= 1 && top_k <= E, "moe_route", "top_k ", top_k, " outside [1, ", E, "]");
  require(weights.numel() == T * top_k && ids.numel() == T * top_k, "moe_route", "weights ",
          weights.shape_str(), " / ids ", ids.shape_str(), " should be [", T, ", ", top_k, "]");
  if (dev == Device::CUDA) {
    cuda::moe_route(logits.data<float>(), T, E, top_k, normalize, weights.data<float>(), ids.data<int32_t>(),
                    cuda::stream());
    return;
  }
  cpu::moe_route(logits.data<float>(), T, E, top_k, normalize, weights.data<float>(), ids.data<int32_t>());
}

namespace {

struct MoeDims {
  int64_t T, d, E, I, k;
};

MoeDims check_moe_experts(const Tensor& x, const Tensor& gate_up, const Tensor& down, const Tensor& weights,
                          const Tensor& ids, const Tensor& out) {
  const char* op = "moe_experts";
  const Device dev = x.device();
  require_on(op, x, "x", dev);
  require_on(op, weights, "weights", dev);
  require_on(op, out, "out", dev);
  require(ids.defined() && ids.device() == dev && ids.dtype() == DType::I32 && ids.is_contiguous(), op,
          "ids must be a contiguous I32 tensor on x's device");
  require(gate_up.defined() && down.defined() && gate_up.device() == dev && down.device() == dev &&
              gate_up.is_contiguous() && down.is_contiguous() && gate_up.ndim() == 3 && down.ndim() == 3,
          op, "gate_up and down must be contiguous 3-D tensors on x's device");
  require(gate_up.dtype() == down.dtype() || gate_up.is_quantized() || down.is_quantized(), op,
          "gate_up and down differ in dtype");  // (on the host one may be quantized and the other not)
  require(x.ndim() == 2 && ids.ndim() == 2, op, "x must be [n_tokens, d_model], ids [n_tokens, top_k]; got ",
          x.shape_str(), ", ", ids.shape_str());
  MoeDims m{x.dim(0), x.dim(1), gate_up.dim(0), down.dim(2), ids.dim(1)};
  require(gate_up.dim(1) == 2 * m.I && gate_up.dim(2) == m.d && down.dim(0) == m.E && down.dim(1) == m.d, op,
          "gate_up ", gate_up.shape_str(), " / down ", down.shape_str(), " do not fit x ", x.shape_str());
  require(ids.dim(0) == m.T && weights.numel() == m.T * m.k && out.shape() == x.shape() && out.ndim() == 2, op,
          "ids ", ids.shape_str(), ", weights ", weights.shape_str(), ", out ", out.shape_str(), " do not fit x ",
          x.shape_str());
  require(out.raw() != x.raw(), op, "out must not alias x");
  return m;
}

}  // namespace

int64_t moe_experts_workspace(const Tensor& x, const Tensor& gate_up, const Tensor& ids) {
  if (x.device() != Device::CUDA) return 0;
  const size_t bytes = cuda::moe_workspace_bytes(x.dim(0), ids.dim(-1), gate_up.dim(0), x.dim(-1),
                                                 gate_up.dim(1) / 2);
  return int64_t((bytes + 3) / 4);
}

namespace {

// y [M, N] = x [M, K] · wᵀ for one expert's matrix w [1, N, K] on the host.
void matmul_rows(const float* x, int64_t M, const Tensor& w, float* y) {
  const int64_t N = w.dim(1), K = w.dim(2);
  if (w.is_quantized())
    cpu::matmul_quantized(x, M, K, K, w.raw(), w.quant(), N, y, N, ThreadPool::global());
  else
    cpu::matmul(x, M, K, K, w.raw(), w.dtype(), N, y, N, ThreadPool::global());
}

}  // namespace

void moe_experts(const Tensor& x, const Tensor& gate_up, const Tensor& down, const Tensor& weights,
                 const Tensor& ids, const Tensor& out, const Tensor& workspace) {
  const MoeDims m = check_moe_experts(x, gate_up, down, weights, ids, out);
  if (x.device() == Device::CUDA) {
    require(is_half(gate_up.dtype()), "moe_experts", "CUDA expert weights must be BF16 or F16, got ",
            dtype_name(gate_up.dtype()));
    const int64_t need = moe_experts_workspace(x, gate_up, ids);
    require(workspace.defined() && workspace.device() == Device::CUDA && workspace.numel() >= need, "moe_experts",
            "workspace of ", workspace.defined() ? workspace.numel() : 0, " floats, needs ", need);
    cuda::moe_experts(x.data<float>(), m.T, m.d, half_ptr(gate_up), half_ptr(down), half_of(gate_up), m.E, m.I,
                      ids.data<int32_t>(), weights.data<float>(), m.k, out.data<float>(), workspace.raw(),
                      cuda::stream());
    return;
  }
  for (const Tensor* t : {&gate_up, &down})
    require(t->dtype() == DType::BF16 || t->dtype() == DType::F32 || t->is_quantized(), "moe_experts",
            "weights dtype ", dtype_name(t->dtype()), " unsupported");
  // The reference composition (sparse_moe_block's loop): per expert in
  // ascending id, its tokens in batch order, SwiGLU, scaled and added into zeros.
  const int32_t* id = ids.data<int32_t>();
  const float* wt = weights.data<float>();
  for (int64_t i = 0; i < m.T * m.k; ++i)
    require(id[i] >= 0 && id[i] < m.E, "moe_experts", "expert id ", id[i], " outside [0, ", m.E, ")");
  std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(m.E));
  std::vector<std::vector<float>> scales(static_cast<size_t>(m.E));
  for (int64_t t = 0; t < m.T; ++t)
    for (int64_t i = 0; i < m.k; ++i) {
      tokens[size_t(id[t * m.k + i])].push_back(int32_t(t));
      scales[size_t(id[t * m.k + i])].push_back(wt[t * m.k + i]);
    }
  std::fill_n(out.data<float>(), out.numel(), 0.0f);
  std::vector<float> xe, gu, act, ye;
  for (int64_t e = 0; e < m.E; ++e) {
    const auto& tok = tokens[size_t(e)];
    if (tok.empty()) continue;
    const int64_t n = int64_t(tok.size());
    xe.resize(size_t(n * m.d));
    gu.resize(size_t(n * 2 * m.I));
    act.resize(size_t(n * m.I));
    ye.resize(size_t(n * m.d));
    cpu::gather_rows(x.data<float>(), m.d, tok, xe.data());
    const Tensor wgu = gate_up.slice_rows(e, e + 1), wd = down.slice_rows(e, e + 1);
    matmul_rows(xe.data(), n, wgu, gu.data());
    cpu::swiglu_packed(gu.data(), n, m.I, act.data());
    matmul_rows(act.data(), n, wd, ye.data());
    cpu::scatter_add_rows(ye.data(), m.d, tok, scales[size_t(e)], out.data<float>());
  }
}

void gather_rows(const Tensor& x, std::span<const int32_t> idx, const Tensor& out) {
  require_cpu_f32("gather_rows", x, "x");
  require_cpu_f32("gather_rows", out, "out");
  const int64_t N = x.dim(-1), M = rows_of(x);
  require(out.dim(-1) == N && rows_of(out) == int64_t(idx.size()), "gather_rows", "out ", out.shape_str(),
          " should be [", idx.size(), ", ", N, "]");
  for (int32_t i : idx) require(i >= 0 && i < M, "gather_rows", "row ", i, " outside [0, ", M, ")");
  cpu::gather_rows(x.data<float>(), N, idx, out.data<float>());
}

void scatter_add_rows(const Tensor& x, std::span<const int32_t> idx, std::span<const float> scale,
                      const Tensor& out) {
  require_cpu_f32("scatter_add_rows", x, "x");
  require_cpu_f32("scatter_add_rows", out, "out");
  const int64_t N = out.dim(-1), M = rows_of(out);
  require(x.dim(-1) == N && rows_of(x) == int64_t(idx.size()) && scale.size() == idx.size(),
          "scatter_add_rows", "x ", x.shape_str(), " with ", idx.size(), " indices and ", scale.size(),
          " scales does not fit out ", out.shape_str());
  for (int32_t i : idx) require(i >= 0 && i < M, "scatter_add_rows", "row ", i, " outside [0, ", M, ")");
  cpu::scatter_add_rows(x.data<float>(), N, idx, scale, out.data<float>());
}

}  // namespace augur::ops
