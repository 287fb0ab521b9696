// The dense ops: embedding, linear, norms, activations, and the fused forms
// a decoder block's projections take (rms_norm_linear, swiglu_linear,
// block_tail).
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "backend/cpu/linear_attn_cpu.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/ops_cpu.h"
#include "backend/device.h"
#include "backend/ops_internal.h"
#include "core/quant.h"
#include "core/thread_pool.h"

namespace augur::ops {

using namespace detail;

void embedding(const Tensor& table, std::span<const int32_t> ids, const Tensor& out, const DeviceBatch* device) {
  require(table.ndim() == 2, "embedding", "table must be 2-D, got ", table.shape_str());
  require(out.numel() == int64_t(ids.size()) * table.dim(1), "embedding", "out ", out.shape_str(),
          " does not hold ", ids.size(), " rows of ", table.dim(1));
  for (int32_t id : ids)
    require(id >= 0 && id < table.dim(0), "embedding", "token id ", id, " outside [0, ", table.dim(0), ")");
  if (on_cuda(out)) {
    require_f32("embedding", out, "out", Device::CUDA);
    require(table.device() == Device::CUDA && is_half(table.dtype()), "embedding",
            "a CUDA table must be BF16 or F16 on the device");
    require(device != nullptr && device->tokens.numel() == int64_t(ids.size()), "embedding",
            "a CUDA batch needs its device layout");
    const Tensor& dev_ids = device->fed_tokens.defined() ? device->fed_tokens : device->tokens;
    require(on_cuda(dev_ids) && dev_ids.numel() == int64_t(ids.size()), "embedding", "fed ids ",
            dev_ids.shape_str(), " for ", ids.size(), " tokens");
    cuda::embedding(half_ptr(table), table.dim(1), dev_ids.data<int32_t>(), int64_t(ids.size()),
                    out.data<float>(), cuda::stream(), half_of(table));
    return;
  }
  require_cpu_f32("embedding", out, "out");
  if (table.is_quantized()) {  // each row dequantized as it is looked up
    require(table.is_contiguous(), "embedding", "a quantized table must be contiguous");
    for (size_t t = 0; t < ids.size(); ++t)
      dequantize_rows(table.quant(), static_cast<const char*>(table.raw()) + size_t(ids[t]) * table.row_bytes(), 1,
                      table.dim(1), DType::F32, out.data<float>() + int64_t(t) * table.dim(1));
    return;
  }
  require(table.dtype() == DType::F32 || table.dtype() == DType::BF16 || table.dtype() == DType::F16,
          "embedding", "table dtype ", dtype_name(table.dtype()), " unsupported");
  cpu::embedding(table.raw(), table.dtype(), table.dim(1), ids, out.data<float>());
}

void linear(const Tensor& x, const Tensor& w, const Tensor& y) {
  const Device dev = x.device();
  require_f32("linear", x, "x", dev);
  require_f32("linear", y, "y", dev);
  require(w.ndim() == 2 && w.is_contiguous() && w.device() == dev, "linear",
          "w must be a contiguous 2-D tensor on x's device, got ", w.shape_str());
  const int64_t K = w.dim(1), N = w.dim(0);
  require(x.dim(-1) == K, "linear", "x ", x.shape_str(), " does not match w ", w.shape_str());
  const int64_t M = rows_of(x);
  require(y.dim(-1) == N && rows_of(y) == M, "linear", "y ", y.shape_str(), " should be [", M, ", ", N, "]");
  if (dev == Device::CUDA) {
    require(is_half(w.dtype()), "linear", "CUDA weights must be BF16 or F16, got ", dtype_name(w.dtype()));
    cuda::matmul_half(x.data<float>(), M, K, K, half_ptr(w), half_of(w), N, y.data<float>(), N, cuda::stream());
    return;
  }
  if (w.is_quantized()) {
    cpu::matmul_quantized(x.data<float>(), M, K, K, w.raw(), w.quant(), N, y.data<float>(), N, ThreadPool::global());
    return;
  }
  require(w.dtype() == DType::BF16 || w.dtype() == DType::F32, "linear", "w dtype ",
          dtype_name(w.dtype()), " unsupported");
  cpu::matmul(x.data<float>(), M, K, K, w.raw(), w.dtype(), N, y.data<float>(), N, ThreadPool::global());
}

void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) {
  const Device dev = x.device();
  require_f32("rms_norm", x, "x", dev);
  require_f32("rms_norm", y, "y", dev);
  require_f32("rms_norm", w, "w", dev);
  const int64_t D = x.dim(-1);
  require(w.numel() == D && y.numel() == x.numel(), "rms_norm", "x ", x.shape_str(), ", w ",
          w.shape_str(), ", y ", y.shape_str(), " disagree");
  if (dev == Device::CUDA)
    cuda::rms_norm(x.data<float>(), w.data<float>(), eps, rows_of(x), D, y.data<float>(), cuda::stream());
  else
    cpu::rms_norm(x.data<float>(), w.data<float>(), eps, rows_of(x), D, y.data<float>());
}

namespace {

// Whether the operands of a norm and the linear after it can go through
// cuda::norm_matmul_tc / add_norm_matmul_tc (the norm writing the matmul's
// 16-bit input): all on CUDA, f32 activations contiguous, w a contiguous
// 16-bit [N, K] matrix, shapes agreeing. Those return false where the rows
// do not go to cuBLASLt; the caller then runs the ops one by one.
bool tc_norm_operands(const Tensor& x, const Tensor& g, const Tensor& w, const Tensor& y) {
  for (const Tensor* t : {&x, &g, &y})
    if (!on_cuda(*t) || t->dtype() != DType::F32 || !t->is_contiguous()) return false;
  return on_cuda(w) && is_half(w.dtype()) && w.ndim() == 2 && w.is_contiguous() && w.dim(1) == x.dim(-1) &&
         g.numel() == x.dim(-1) && y.dim(-1) == w.dim(0) && rows_of(y) == rows_of(x);
}

// x += o; y = (rms_norm(x) * g) · wᵀ: add_rms_norm into h, then linear, or on
// CUDA's tensor-core path the same bits without h.
void add_rms_norm_linear(const Tensor& x, const Tensor& o, const Tensor& g, float eps, const Tensor& h,
                         const Tensor& w, const Tensor& y) {
  if (tc_norm_operands(x, g, w, y) && on_cuda(o) && o.dtype() == DType::F32 && o.is_contiguous() &&
      o.numel() == x.numel() && o.raw() != x.raw() &&
      cuda::add_norm_matmul_tc(x.data<float>(), o.data<float>(), g.data<float>(), eps, rows_of(x), x.dim(-1),
                               half_ptr(w), half_of(w), w.dim(0), y.data<float>(), cuda::stream()))
    return;
  add_rms_norm(x, o, g, eps, h);
  linear(h, w, y);
}

}  // namespace

void rms_norm_linear(const Tensor& x, const Tensor& g, float eps, const Tensor& w, const Tensor& h, const Tensor& y) {
  const Device dev = x.device();
  auto aligned = [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.raw()) % 16 == 0; };
  if (dev == Device::CUDA && x.is_contiguous() && y.is_contiguous() && w.ndim() == 2 && w.is_contiguous() &&
      w.device() == dev && is_half(w.dtype()) && x.dim(-1) == w.dim(1) && aligned(x) && aligned(w) &&
      g.defined() && aligned(g) && cuda::norm_matmul_fits(rows_of(x), w.dim(1), w.dim(0))) {
    require_f32("rms_norm_linear", x, "x", dev);
    require_f32("rms_norm_linear", g, "g", dev);
    require_f32("rms_norm_linear", y, "y", dev);
    const int64_t M = rows_of(x), K = w.dim(1), N = w.dim(0);
    require(g.numel() == K && y.dim(-1) == N && rows_of(y) == M, "rms_norm_linear", "x ", x.shape_str(), ", g ",
            g.shape_str(), ", w ", w.shape_str(), ", y ", y.shape_str(), " disagree");
    cuda::norm_matmul(x.data<float>(), M, K, g.data<float>(), eps, half_ptr(w), half_of(w), N, y.data<float>(),
                      cuda::stream());
    return;
  }
  if (tc_norm_operands(x, g, w, y) &&
      cuda::norm_matmul_tc(x.data<float>(), rows_of(x), w.dim(1), g.data<float>(), eps, half_ptr(w), half_of(w),
                           w.dim(0), y.data<float>(), cuda::stream()))
    return;
  rms_norm(x, g, eps, h);
  linear(h, w, y);
}

void add_inplace(const Tensor& a, const Tensor& b) {
  const Device dev = a.device();
  require_f32("add", a, "a", dev);
  require_f32("add", b, "b", dev);
  require(a.numel() == b.numel(), "add", a.shape_str(), " vs ", b.shape_str());
  if (dev == Device::CUDA)
    cuda::add_inplace(a.data<float>(), b.data<float>(), a.numel(), cuda::stream());
  else
    cpu::add_inplace(a.data<float>(), b.data<float>(), a.numel());
}

void add_rms_norm(const Tensor& x, const Tensor& o, const Tensor& w, float eps, const Tensor& h) {
  const Device dev = x.device();
  require_f32("add_rms_norm", x, "x", dev);
  require_f32("add_rms_norm", o, "o", dev);
  require_f32("add_rms_norm", w, "w", dev);
  require_f32("add_rms_norm", h, "h", dev);
  const int64_t D = x.dim(-1);
  require(o.numel() == x.numel() && h.numel() == x.numel() && w.numel() == D, "add_rms_norm", "x ",
          x.shape_str(), ", o ", o.shape_str(), ", w ", w.shape_str(), ", h ", h.shape_str(), " disagree");
  require(h.raw() != x.raw() && h.raw() != o.raw(), "add_rms_norm", "h must not alias x or o");
  if (dev == Device::CUDA)
    cuda::add_rms_norm(x.data<float>(), o.data<float>(), w.data<float>(), eps, rows_of(x), D, h.data<float>(),
                       cuda::stream());
  else
    cpu::add_rms_norm(x.data<float>(), o.data<float>(), w.data<float>(), eps, rows_of(x), D, h.data<float>());
}

void swiglu_linear(const Tensor& gate_up, const Tensor& w, const Tensor& act, const Tensor& y) {
  const Device dev = gate_up.device();
  require_f32("swiglu_linear", gate_up, "gate_up", dev);
  require_f32("swiglu_linear", act, "act", dev);
  require_f32("swiglu_linear", y, "y", dev);
  const int64_t D = act.dim(-1), M = rows_of(act), N = w.dim(0);
  require(gate_up.dim(-1) == 2 * D && rows_of(gate_up) == M && w.ndim() == 2 && w.dim(1) == D &&
              w.is_contiguous() && w.device() == dev && y.dim(-1) == N && rows_of(y) == M,
          "swiglu_linear", "gate_up ", gate_up.shape_str(), ", w ", w.shape_str(), ", act ", act.shape_str(), ", y ",
          y.shape_str(), " disagree");
  if (dev == Device::CUDA) {
    require(is_half(w.dtype()), "swiglu_linear", "CUDA weights must be BF16 or F16, got ", dtype_name(w.dtype()));
    cuda::swiglu_matmul(gate_up.data<float>(), M, D, half_ptr(w), half_of(w), N, act.data<float>(), y.data<float>(),
                        cuda::stream());
    return;
  }
  swiglu_packed(gate_up, act);
  linear(act, w, y);
}

namespace {

bool aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.raw()) % 16 == 0; }

// Where block_tail's stream GEMVs take the operands: all on CUDA, f32
// activations and 16-bit weights, contiguous and 16-byte aligned, shapes the
// kernels take.
bool block_tail_fused(const Tensor& a, const Tensor& w_out, const Tensor& x, const Tensor& g, const Tensor& gate_up,
                      const Tensor& down, const Tensor& act, const Tensor& out, int64_t n_next) {
  for (const Tensor* t : {&a, &x, &g, &act, &out})
    if (!on_cuda(*t) || t->dtype() != DType::F32 || !t->is_contiguous() || !aligned16(*t)) return false;
  for (const Tensor* w : {&w_out, &gate_up, &down})
    if (!on_cuda(*w) || !is_half(w->dtype()) || !w->is_contiguous() || !aligned16(*w)) return false;
  return cuda::block_tail_fits(rows_of(a), a.dim(-1), w_out.dim(0), down.dim(1), n_next);
}

bool next_fused(const Tensor& w_next, const Tensor& g_next, const Tensor& y_next) {
  for (const Tensor* t : {&g_next, &y_next})
    if (!on_cuda(*t) || t->dtype() != DType::F32 || !t->is_contiguous() || !aligned16(*t)) return false;
  return on_cuda(w_next) && is_half(w_next.dtype()) && w_next.is_contiguous() && aligned16(w_next);
}

}  // namespace

int64_t decode_stream_rows(int64_t d_model) { return d_model <= 4096 ? 5 : 3; }

ProductKernels::ProductKernels(Device device, int64_t max_row_tokens, int64_t d_model) {
  if (device == Device::CUDA && max_row_tokens == 1) was_ = cuda::set_stream_rows(decode_stream_rows(d_model));
}

ProductKernels::~ProductKernels() {
  if (was_ > 0) cuda::set_stream_rows(was_);
}

void block_tail(const Tensor& a, const Tensor& w_out, const Tensor& x, const Tensor& g, float eps,
                const Tensor& gate_up, const Tensor& down, const Tensor& h, const Tensor& gu, const Tensor& act,
                const Tensor& out, const Tensor& w_next, const Tensor& g_next, const Tensor& y_next) {
  const char* op = "block_tail";
  const Device dev = a.device();
  using Named = std::pair<const Tensor*, const char*>;
  for (const auto& [t, name] : {Named{&a, "a"}, Named{&x, "x"}, Named{&g, "g"}, Named{&h, "h"}, Named{&gu, "gu"},
                                Named{&act, "act"}, Named{&out, "out"}})
    require_f32(op, *t, name, dev);
  for (const auto& [w, name] : {Named{&w_out, "w_out"}, Named{&gate_up, "gate_up"}, Named{&down, "down"}})
    require(w->defined() && w->ndim() == 2 && w->device() == dev, op, name, " must be a 2-D tensor on a's device");
  const int64_t M = rows_of(a), D = w_out.dim(0), F = down.dim(1);
  require(w_out.dim(1) == a.dim(-1) && gate_up.dim(0) == 2 * F && gate_up.dim(1) == D && down.dim(0) == D, op, "a ",
          a.shape_str(), ", w_out ", w_out.shape_str(), ", gate_up ", gate_up.shape_str(), ", down ",
          down.shape_str(), " disagree");
  require(x.numel() == M * D && h.numel() == M * D && out.numel() == M * D && g.numel() == D &&
              gu.numel() == M * 2 * F && act.numel() == M * F,
          op, "x ", x.shape_str(), ", g ", g.shape_str(), ", h ", h.shape_str(), ", gu ", gu.shape_str(), ", act ",
          act.shape_str(), ", out ", out.shape_str(), " disagree with M = ", M, ", D = ", D, ", F = ", F);
  const bool next = w_next.defined();
  const int64_t N = next ? w_next.dim(0) : 0;
  if (next) {
    require_f32(op, g_next, "g_next", dev);
    require_f32(op, y_next, "y_next", dev);
    require(w_next.ndim() == 2 && w_next.dim(1) == D && w_next.device() == dev && g_next.numel() == D &&
                y_next.numel() == M * N,
            op, "w_next ", w_next.shape_str(), ", g_next ", g_next.shape_str(), ", y_next ", y_next.shape_str(),
            " disagree with M = ", M, ", D = ", D);
  }
  const bool fused = block_tail_fused(a, w_out, x, g, gate_up, down, act, out, 0);
  const bool fused_next = fused && next && next_fused(w_next, g_next, y_next) &&
                          block_tail_fused(a, w_out, x, g, gate_up, down, act, out, N);
  if (fused) {
    cuda::BlockTail t;
    t.a = a.data<float>(), t.M = M, t.Ka = a.dim(-1), t.D = D, t.F = F;
    t.w_out = half_ptr(w_out), t.w_out_t = half_of(w_out);
    t.x = x.data<float>(), t.g = g.data<float>(), t.eps = eps;
    t.gate_up = half_ptr(gate_up), t.gate_up_t = half_of(gate_up);
    t.down = half_ptr(down), t.down_t = half_of(down);
    t.act = act.data<float>(), t.out = out.data<float>();
    if (fused_next) {
      t.n_next = N, t.w_next = half_ptr(w_next), t.w_next_t = half_of(w_next);
      t.g_next = g_next.data<float>(), t.y_next = y_next.data<float>();
    }
    cuda::block_tail(t, cuda::stream());
  } else {
    linear(a, w_out, out);
    add_rms_norm_linear(x, out, g, eps, h, gate_up, gu);  // x += out; gu = norm(x) · gate_upᵀ
    swiglu_linear(gu, down, act, out);
  }
  if (next && !fused_next) add_rms_norm_linear(x, out, g_next, eps, h, w_next, y_next);
}

void swiglu_packed(const Tensor& gate_up, const Tensor& out) {
  const Device dev = gate_up.device();
  require_f32("swiglu_packed", gate_up, "gate_up", dev);
  require_f32("swiglu_packed", out, "out", dev);
  const int64_t D = out.dim(-1), M = rows_of(out);
  require(gate_up.dim(-1) == 2 * D && rows_of(gate_up) == M, "swiglu_packed", "gate_up ", gate_up.shape_str(),
          " should be [", M, ", ", 2 * D, "] for out ", out.shape_str());
  if (dev == Device::CUDA)
    cuda::swiglu_packed(gate_up.data<float>(), M, D, out.data<float>(), cuda::stream());
  else
    cpu::swiglu_packed(gate_up.data<float>(), M, D, out.data<float>());
}

void add_bias(const Tensor& y, const Tensor& bias) {
  if (!bias.defined()) return;
  const Device dev = y.device();
  require_f32("add_bias", y, "y", dev);
  require_f32("add_bias", bias, "bias", dev);
  const int64_t N = y.dim(-1), M = y.numel() / N;
  require(bias.numel() == N, "add_bias", "bias of ", bias.numel(), " values for rows of ", N);
  require(dev == Device::CPU, "add_bias", "biases are not supported on ", device_name(dev), " yet");
  float* p = y.data<float>();
  const float* b = bias.data<float>();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) p[m * N + n] += b[n];
}

void swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  const Device dev = gate.device();
  require_f32("swiglu", gate, "gate", dev);
  require_f32("swiglu", up, "up", dev);
  require_f32("swiglu", out, "out", dev);
  require(gate.numel() == up.numel() && gate.numel() == out.numel(), "swiglu", gate.shape_str(),
          " vs ", up.shape_str(), " vs ", out.shape_str());
  if (dev == Device::CUDA)
    cuda::swiglu(gate.data<float>(), up.data<float>(), out.data<float>(), gate.numel(), cuda::stream());
  else
    cpu::swiglu(gate.data<float>(), up.data<float>(), out.data<float>(), gate.numel());
}
void sigmoid_mul(const Tensor& x, const Tensor& gate, const Tensor& y) {
  const Device dev = x.device();
  require_all_on("sigmoid_mul", dev, {{&x, "x"}, {&gate, "gate"}, {&y, "y"}});
  const int64_t N = x.dim(-1), M = rows_of(x);
  const bool per_row = gate.numel() == M && gate.dim(-1) == 1 && N != 1;
  require(y.numel() == x.numel() && (gate.numel() == x.numel() || per_row), "sigmoid_mul", "x ",
          x.shape_str(), ", gate ", gate.shape_str(), ", y ", y.shape_str(), " disagree");
  if (dev == Device::CUDA)
    cuda::sigmoid_mul(x.data<float>(), gate.data<float>(), per_row, M, N, y.data<float>(), cuda::stream());
  else
    cpu::sigmoid_mul(x.data<float>(), gate.data<float>(), per_row, M, N, y.data<float>());
}

}  // namespace augur::ops
