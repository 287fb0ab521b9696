#include "backend/ops.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/linear_attn_cpu.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/moe_cpu.h"
#include "backend/cpu/ops_cpu.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/memory.h"
#include "backend/device.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace augur::ops {

namespace {

// Argument checks: a failure here is a bug in the caller (model code), so the
// message names the op and the offending shapes.
template <typename... Parts>
void require(bool ok, const char* op, Parts&&... parts) {
  if (!ok) fail("[", op, "] ", std::forward<Parts>(parts)...);
}

void require_cpu_f32(const char* op, const Tensor& t, const char* name) {
  require(t.defined(), op, name, " is undefined");
  require(t.device() == Device::CPU, op, name, ": no implementation for this device in this build");
  require(t.dtype() == DType::F32, op, name, " must be F32, got ", dtype_name(t.dtype()));
  require(t.is_contiguous(), op, name, " must be contiguous");
}

int64_t rows_of(const Tensor& t) { return t.ndim() == 0 ? 1 : t.numel() / t.dim(-1); }

}  // namespace

namespace {

bool on_cuda(const Tensor& t) { return t.defined() && t.device() == Device::CUDA; }

// An f32 activation on `dev`, contiguous.
void require_f32(const char* op, const Tensor& t, const char* name, Device dev) {
  require(t.defined(), op, name, " is undefined");
  require(t.device() == dev, op, name, " is on another device");
  require(t.dtype() == DType::F32, op, name, " must be F32, got ", dtype_name(t.dtype()));
  require(t.is_contiguous(), op, name, " must be contiguous");
}

const cuda::half_bits* half_ptr(const Tensor& t) { return static_cast<const cuda::half_bits*>(t.raw()); }
cuda::half_bits* half_ptr_mut(const Tensor& t) { return static_cast<cuda::half_bits*>(t.raw()); }
bool is_half(DType t) { return t == DType::BF16 || t == DType::F16; }
// The kernels' name for a 16-bit float dtype.
cuda::Half half_of(const Tensor& t) { return t.dtype() == DType::F16 ? cuda::Half::F16 : cuda::Half::BF16; }

cuda::AttnMeta attn_meta(const char* op, const BatchView& b, int64_t n_tokens) {
  require(b.device != nullptr, op, "a CUDA batch needs its device layout (upload_batch)");
  const DeviceBatch& d = *b.device;
  require(d.positions.numel() == n_tokens, op, "device layout holds ", d.positions.numel(), " tokens, batch has ",
          n_tokens);
  cuda::AttnMeta m;
  m.positions = d.positions.data<int32_t>();
  m.slot_mapping = d.slot_mapping.data<int32_t>();
  m.token_row = d.token_row.data<int32_t>();
  m.block_tables = d.block_tables.data<int32_t>();
  m.max_blocks = d.max_blocks;
  m.n_tokens = int32_t(n_tokens);
  m.max_context = d.max_context;
  m.max_row_tokens = d.max_row_tokens;
  return m;
}

}  // namespace

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

bool decode_tail_fits(const Tensor& a, const Tensor& w_out, const Tensor& gate_up, const Tensor& down,
                      const Tensor& w_next) {
  if (a.device() != Device::CUDA || a.dtype() != DType::F32 || a.ndim() != 2 || !a.is_contiguous()) return false;
  for (const Tensor* w : {&w_out, &gate_up, &down, &w_next})
    if (w->defined() &&
        (w->device() != Device::CUDA || !is_half(w->dtype()) || w->ndim() != 2 || !w->is_contiguous()))
      return false;
  if (!w_out.defined() || !gate_up.defined() || !down.defined()) return false;
  const int64_t D = w_out.dim(0), F = down.dim(1);
  if (w_out.dim(1) != a.dim(1) || gate_up.dim(0) != 2 * F || gate_up.dim(1) != D || down.dim(0) != D) return false;
  if (w_next.defined() && w_next.dim(1) != D) return false;
  return cuda::decode_tail_enabled(w_next.defined()) &&
         cuda::decode_tail_fits(a.dim(0), a.dim(1), D, F, w_next.defined() ? w_next.dim(0) : 0);
}

void decode_tail(const Tensor& a, const Tensor& w_out, const Tensor& x, const Tensor& g, float eps,
                 const Tensor& gate_up, const Tensor& down, const Tensor& o, const Tensor& act, const Tensor& out,
                 const Tensor& w_next, const Tensor& g_next, const Tensor& y_next) {
  require(decode_tail_fits(a, w_out, gate_up, down, w_next), "decode_tail", "a ", a.shape_str(), ", w_out ",
          w_out.shape_str(), ", gate_up ", gate_up.shape_str(), ", down ", down.shape_str(), ", w_next ",
          w_next.defined() ? w_next.shape_str() : std::string("none"),
          ": not a shape the fused kernel takes (check decode_tail_fits)");
  const Device dev = a.device();
  const int64_t M = a.dim(0), D = w_out.dim(0), F = down.dim(1), N = w_next.defined() ? w_next.dim(0) : 0;
  using Named = std::pair<const Tensor*, const char*>;
  std::vector<Named> f32s = {{&x, "x"}, {&g, "g"}, {&o, "o"}, {&act, "act"}, {&out, "out"}};
  if (N > 0) f32s.insert(f32s.end(), {Named{&g_next, "g_next"}, Named{&y_next, "y_next"}});
  for (const auto& [t, name] : f32s) {
    require_f32("decode_tail", *t, name, dev);
    require(t->is_contiguous(), "decode_tail", name, " must be contiguous");
  }
  require(x.numel() == M * D && o.numel() == M * D && out.numel() == M * D && g.numel() == D && act.numel() == M * F,
          "decode_tail", "x ", x.shape_str(), ", g ", g.shape_str(), ", o ", o.shape_str(), ", act ", act.shape_str(),
          ", out ", out.shape_str(), " disagree with M = ", M, ", D = ", D, ", F = ", F);
  require(N == 0 || (g_next.numel() == D && y_next.numel() == M * N), "decode_tail", "g_next ",
          g_next.shape_str(), ", y_next ", y_next.shape_str(), " disagree with D = ", D, ", N = ", N);
  cuda::DecodeTail t;
  t.a = a.data<float>(), t.M = M, t.Ka = a.dim(1), t.D = D, t.F = F;
  t.w_out = half_ptr(w_out), t.w_out_t = half_of(w_out);
  t.x = x.data<float>(), t.g = g.data<float>(), t.eps = eps;
  t.gate_up = half_ptr(gate_up), t.gate_up_t = half_of(gate_up);
  t.down = half_ptr(down), t.down_t = half_of(down);
  t.o = o.data<float>(), t.act = act.data<float>(), t.out = out.data<float>();
  if (N > 0) {
    t.n_next = N, t.w_next = half_ptr(w_next), t.w_next_t = half_of(w_next);
    t.g_next = g_next.data<float>(), t.y_next = y_next.data<float>();
  }
  cuda::decode_tail(t, cuda::stream());
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

DeviceBatch upload_batch(Device d, std::span<const int32_t> tokens, std::span<const AttnRow> rows,
                         int64_t block_size, int64_t max_context) {
  DeviceBatch b;
  const int64_t n = int64_t(tokens.size());
  // Tables as wide as max_context needs, so a captured graph can be refilled
  // while its rows grow up to that bound.
  const int64_t max_blocks = std::max<int64_t>(1, (max_context + block_size - 1) / block_size);
  for (const auto& r : rows) b.max_row_tokens = std::max(b.max_row_tokens, r.n_tokens);
  b.max_blocks = int32_t(max_blocks);
  b.max_context = int32_t(max_context);
  // One device buffer holds the five arrays back to back, so that a step
  // refills them with one copy.
  const int64_t n_rows = int64_t(rows.size());
  Tensor all = empty_on(d, DType::I32, {4 * n + n_rows * max_blocks + 3 * n_rows});
  auto part = [&](int64_t at, std::initializer_list<int64_t> shape) {
    return Tensor::view_of(all.buffer(), size_t(at) * 4, DType::I32, shape.begin(), int(shape.size()));
  };
  b.tokens = part(0, {n});
  b.positions = part(n, {n});
  b.slot_mapping = part(2 * n, {n});
  b.token_row = part(3 * n, {n});
  b.block_tables = part(4 * n, {n_rows, max_blocks});
  b.recurrent_rows = part(4 * n + n_rows * max_blocks, {n_rows, 3});
  reupload_batch(b, tokens, rows, block_size);
  return b;
}

void reupload_batch(const DeviceBatch& into, std::span<const int32_t> tokens, std::span<const AttnRow> rows,
                    int64_t block_size) {
  const int64_t n = int64_t(tokens.size());
  require(into.tokens.numel() == n && into.block_tables.dim(0) == int64_t(rows.size()), "upload_batch",
          "layout of another size");
  std::vector<int32_t> host(size_t(4 * n + into.block_tables.numel() + into.recurrent_rows.numel()), -1);
  int32_t* positions = host.data() + n;
  int32_t* slots = positions + n;
  int32_t* token_row = slots + n;
  int32_t* tables = token_row + n;
  int32_t* recurrent = tables + into.block_tables.numel();
  std::copy(tokens.begin(), tokens.end(), host.begin());
  for (size_t r = 0; r < rows.size(); ++r) {
    const AttnRow& row = rows[r];
    recurrent[3 * r] = row.token_begin;
    recurrent[3 * r + 1] = row.n_tokens;
    recurrent[3 * r + 2] = row.state_slot;
    const size_t n_blocks = std::min(row.block_table.size(), size_t(into.max_blocks));
    std::copy_n(row.block_table.begin(), n_blocks, tables + r * size_t(into.max_blocks));
    for (int32_t i = 0; i < row.n_tokens; ++i) {
      const int64_t t = row.token_begin + i, p = row.pos0 + i;
      require(p < into.max_context, "upload_batch", "position ", p, " beyond the layout's context ",
              into.max_context);
      positions[t] = int32_t(p);
      slots[t] = int32_t(row.block_table[size_t(p / block_size)] * block_size + p % block_size);
      token_row[t] = int32_t(r);
    }
  }
  // The host buffer has upload_batch's layout: one copy into the device buffer.
  const int64_t total = int64_t(host.size());
  require(into.tokens.raw() == into.tokens.buffer()->data() && into.tokens.buffer() == into.block_tables.buffer(),
          "upload_batch", "layout not made by upload_batch");
  const int64_t shape[] = {total};
  Tensor src = Tensor::view_of(std::make_shared<BorrowedBuffer>(nullptr, host.data(), host.size() * 4), 0,
                               DType::I32, shape, 1);
  copy_tensor(src, Tensor::view_of(into.tokens.buffer(), 0, DType::I32, shape, 1));
}

void rope(const Tensor& x, const BatchView& b, const Tensor& inv_freq) {
  const Device dev = x.device();
  require_f32("rope", x, "x", dev);
  require_f32("rope", inv_freq, "inv_freq", dev);
  require(x.ndim() == 3, "rope", "x must be [n_tokens, n_head, head_dim], got ", x.shape_str());
  require(int64_t(b.positions.size()) == x.dim(0), "rope", b.positions.size(), " positions for ",
          x.dim(0), " tokens");
  const int64_t half = inv_freq.numel();
  require(half * 2 <= x.dim(2), "rope", "rotary dims ", half * 2, " exceed head_dim ", x.dim(2));
  if (dev == Device::CUDA) {
    cuda::rope(x.data<float>(), x.dim(0), x.dim(1), x.dim(2), attn_meta("rope", b, x.dim(0)).positions,
               inv_freq.data<float>(), half, cuda::stream());
    return;
  }
  cpu::rope(x.data<float>(), x.dim(0), x.dim(1), x.dim(2), b.positions,
            std::span<const float>(inv_freq.data<float>(), size_t(half)));
}

namespace {

void check_rows(const char* op, std::span<const AttnRow> rows, int64_t n_tokens, const KvLayer& cache,
                Device dev) {
  for (const Tensor* t : {&cache.k, &cache.v}) {
    require(t->defined() && t->device() == dev && t->is_contiguous(), op, "cache must be contiguous on the device");
    require(dev == Device::CUDA ? is_half(t->dtype()) : t->dtype() == DType::F32, op, "cache must be ",
            dev == Device::CUDA ? "BF16 or F16" : "F32", " here, got ", dtype_name(t->dtype()));
  }
  require(cache.k.dtype() == cache.v.dtype(), op, "K and V caches differ in dtype");
  require(cache.k.ndim() == 4 && cache.k.shape() == cache.v.shape(), op,
          "caches must be [n_blocks, block_size, n_head_kv, head_dim], got ", cache.k.shape_str());
  const int64_t block_size = cache.k.dim(1);
  int64_t next = 0;
  for (const auto& r : rows) {
    require(r.token_begin == next && r.n_tokens >= 0 && r.pos0 >= 0, op, "rows must tile the batch");
    next += r.n_tokens;
    int64_t need = (int64_t(r.pos0) + r.n_tokens + block_size - 1) / block_size;
    require(int64_t(r.block_table.size()) >= need, op, "row at position ", r.pos0, " + ",
            r.n_tokens, " needs ", need, " blocks, has ", r.block_table.size());
    for (int64_t b = 0; b < need; ++b)
      require(r.block_table[size_t(b)] >= 0 && r.block_table[size_t(b)] < cache.k.dim(0), op,
              "block id ", r.block_table[size_t(b)], " outside the cache");
  }
  require(next == n_tokens, op, "rows cover ", next, " tokens, batch has ", n_tokens);
}

}  // namespace

void store_kv(const Tensor& k, const Tensor& v, const BatchView& b, const KvLayer& cache) {
  const Device dev = k.device();
  require_f32("store_kv", k, "k", dev);
  require_f32("store_kv", v, "v", dev);
  check_rows("store_kv", b.rows, k.dim(0), cache, dev);
  const int64_t kv_dim = cache.k.dim(2) * cache.k.dim(3);
  require(k.numel() == k.dim(0) * kv_dim && v.numel() == k.numel(), "store_kv", "k ", k.shape_str(),
          " / v ", v.shape_str(), " do not match the cache ", cache.k.shape_str());
  if (dev == Device::CUDA) {
    cuda::store_kv(k.data<float>(), v.data<float>(), kv_dim, attn_meta("store_kv", b, k.dim(0)),
                   half_ptr_mut(cache.k), half_ptr_mut(cache.v), cuda::stream(), half_of(cache.k));
    return;
  }
  cpu::store_kv(k.data<float>(), v.data<float>(), kv_dim, b.rows, cache.k.dim(1),
                cache.k.data<float>(), cache.v.data<float>());
}

void qkv_rope_store(const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm, float eps, const BatchView& b,
                    const Tensor& inv_freq, const KvLayer& cache, const Tensor& q_out, const Tensor& gate_out) {
  const Device dev = qkv.device();
  require_f32("qkv_rope_store", qkv, "qkv", dev);
  require_f32("qkv_rope_store", q_out, "q_out", dev);
  require_f32("qkv_rope_store", inv_freq, "inv_freq", dev);
  require(q_out.ndim() == 3, "qkv_rope_store", "q_out must be [n_tokens, n_head, head_dim], got ", q_out.shape_str());
  const int64_t T = q_out.dim(0), n_head = q_out.dim(1), head_dim = q_out.dim(2);
  check_rows("qkv_rope_store", b.rows, T, cache, dev);
  const int64_t n_head_kv = cache.k.dim(2), half = inv_freq.numel();
  const bool gated = gate_out.defined();
  const int64_t q_stride = gated ? 2 * head_dim : head_dim;
  require(cache.k.dim(3) == head_dim, "qkv_rope_store", "q_out ", q_out.shape_str(), " does not fit cache ",
          cache.k.shape_str());
  require(qkv.numel() == T * (n_head * q_stride + 2 * n_head_kv * head_dim) && qkv.dim(0) == T, "qkv_rope_store",
          "qkv ", qkv.shape_str(), " should be [", T, ", ", n_head * q_stride + 2 * n_head_kv * head_dim, "]");
  if (gated) {
    require_f32("qkv_rope_store", gate_out, "gate_out", dev);
    require(gate_out.numel() == q_out.numel(), "qkv_rope_store", "gate_out ", gate_out.shape_str(),
            " should hold ", q_out.numel(), " values like q_out");
  }
  require(2 * half <= head_dim, "qkv_rope_store", "rotary dims ", 2 * half, " exceed head_dim ", head_dim);
  require(q_norm.defined() == k_norm.defined(), "qkv_rope_store", "q_norm and k_norm go together");
  if (q_norm.defined()) {
    require_f32("qkv_rope_store", q_norm, "q_norm", dev);
    require_f32("qkv_rope_store", k_norm, "k_norm", dev);
    require(q_norm.numel() == head_dim && k_norm.numel() == head_dim, "qkv_rope_store", "norm gains must be [",
            head_dim, "]");
  }
  if (dev == Device::CUDA) {
    cuda::qkv_rope_store(qkv.data<float>(), n_head, n_head_kv, head_dim,
                         q_norm.defined() ? q_norm.data<float>() : nullptr,
                         k_norm.defined() ? k_norm.data<float>() : nullptr, eps, inv_freq.data<float>(), half,
                         attn_meta("qkv_rope_store", b, T), q_out.data<float>(), half_ptr_mut(cache.k),
                         half_ptr_mut(cache.v), cuda::stream(), half_of(cache.k),
                         gated ? gate_out.data<float>() : nullptr);
    return;
  }
  // The CPU composes the unfused ops.
  const int64_t q_width = n_head * q_stride, kv_dim = n_head_kv * head_dim, width = q_width + 2 * kv_dim;
  Tensor k = Tensor::empty(DType::F32, {T, n_head_kv, head_dim});
  Tensor v = Tensor::empty(DType::F32, {T, n_head_kv, head_dim});
  const float* src = qkv.data<float>();
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < n_head; ++h) {
      const float* head = src + t * width + h * q_stride;
      std::copy_n(head, head_dim, q_out.data<float>() + (t * n_head + h) * head_dim);
      if (gated) std::copy_n(head + head_dim, head_dim, gate_out.data<float>() + (t * n_head + h) * head_dim);
    }
    std::copy_n(src + t * width + q_width, kv_dim, k.data<float>() + t * kv_dim);
    std::copy_n(src + t * width + q_width + kv_dim, kv_dim, v.data<float>() + t * kv_dim);
  }
  if (q_norm.defined()) {
    rms_norm(q_out, q_norm, eps, q_out);
    rms_norm(k, k_norm, eps, k);
  }
  rope(q_out, b, inv_freq);
  rope(k, b, inv_freq);
  store_kv(k, v, b, cache);
}

bool qkv_rope_attention(const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm, float eps, const BatchView& b,
                        const Tensor& inv_freq, const KvLayer& cache, float scale, int32_t window, const Tensor& out,
                        const Tensor& workspace) {
  if (!on_cuda(qkv) || b.device == nullptr || out.ndim() != 3 || !cuda::decode_attention_rope_enabled(out.dim(0)))
    return false;
  const int64_t T = out.dim(0), n_head = out.dim(1), head_dim = out.dim(2), n_head_kv = cache.k.dim(2);
  const cuda::AttnMeta meta = attn_meta("qkv_rope_attention", b, T);
  if (!cuda::decode_attention_rope_fits(n_head, n_head_kv, head_dim, meta, false)) return false;
  const Device dev = qkv.device();
  require_f32("qkv_rope_attention", qkv, "qkv", dev);
  require_f32("qkv_rope_attention", out, "out", dev);
  require_f32("qkv_rope_attention", inv_freq, "inv_freq", dev);
  check_rows("qkv_rope_attention", b.rows, T, cache, dev);
  const int64_t half = inv_freq.numel();
  require(cache.k.dim(3) == head_dim && n_head % n_head_kv == 0, "qkv_rope_attention", "out ", out.shape_str(),
          " does not fit cache ", cache.k.shape_str());
  require(qkv.numel() == T * (n_head + 2 * n_head_kv) * head_dim && qkv.dim(0) == T, "qkv_rope_attention", "qkv ",
          qkv.shape_str(), " should be [", T, ", ", (n_head + 2 * n_head_kv) * head_dim, "]");
  require(2 * half <= head_dim, "qkv_rope_attention", "rotary dims ", 2 * half, " exceed head_dim ", head_dim);
  require(q_norm.defined() == k_norm.defined(), "qkv_rope_attention", "q_norm and k_norm go together");
  if (q_norm.defined()) {
    require_f32("qkv_rope_attention", q_norm, "q_norm", dev);
    require_f32("qkv_rope_attention", k_norm, "k_norm", dev);
    require(q_norm.numel() == head_dim && k_norm.numel() == head_dim, "qkv_rope_attention",
            "norm gains must be [", head_dim, "]");
  }
  const int64_t need = attention_workspace(out, b);
  require(workspace.defined() ? workspace.numel() >= need && workspace.device() == dev : need == 0,
          "qkv_rope_attention", "workspace of ", workspace.defined() ? workspace.numel() : 0, " floats, needs ", need);
  cuda::decode_attention_rope(qkv.data<float>(), q_norm.defined() ? q_norm.data<float>() : nullptr,
                              k_norm.defined() ? k_norm.data<float>() : nullptr, eps, inv_freq.data<float>(), half,
                              half_ptr_mut(cache.k), half_ptr_mut(cache.v), cache.k.dim(1), n_head, n_head_kv,
                              head_dim, meta, scale, window, out.data<float>(), need ? workspace.raw() : nullptr,
                              cuda::stream(), half_of(cache.k));
  return true;
}

int64_t attention_workspace(const Tensor& q, const BatchView& b) {
  if (!on_cuda(q) || b.device == nullptr) return 0;
  const size_t bytes = cuda::attention_workspace_bytes(q.dim(0), q.dim(1), q.dim(2), b.device->max_context);
  return int64_t((bytes + 3) / 4);
}

void paged_attention(const Tensor& q, const KvLayer& cache, const BatchView& b, float scale, int32_t window,
                     const Tensor& out, const Tensor& workspace) {
  const Device dev = q.device();
  require_f32("paged_attention", q, "q", dev);
  require_f32("paged_attention", out, "out", dev);
  require(q.ndim() == 3, "paged_attention", "q must be [n_tokens, n_head, head_dim], got ", q.shape_str());
  check_rows("paged_attention", b.rows, q.dim(0), cache, dev);
  const int64_t n_head = q.dim(1), head_dim = q.dim(2), n_head_kv = cache.k.dim(2);
  require(cache.k.dim(3) == head_dim && n_head % n_head_kv == 0, "paged_attention", "q ",
          q.shape_str(), " does not fit cache ", cache.k.shape_str());
  require(out.numel() == q.numel(), "paged_attention", "out ", out.shape_str(), " vs q ", q.shape_str());
  if (dev == Device::CUDA) {
    const int64_t need = attention_workspace(q, b);
    require(workspace.defined() ? workspace.numel() >= need && workspace.device() == dev : need == 0,
            "paged_attention", "workspace of ", workspace.defined() ? workspace.numel() : 0,
            " floats, needs ", need);
    cuda::paged_attention(q.data<float>(), half_ptr(cache.k), half_ptr(cache.v), cache.k.dim(1), n_head,
                          n_head_kv, head_dim, attn_meta("paged_attention", b, q.dim(0)), scale, window,
                          out.data<float>(), need ? workspace.raw() : nullptr, cuda::stream(), half_of(cache.k));
    return;
  }
  cpu::paged_attention(q.data<float>(), cache.k.data<float>(), cache.v.data<float>(), cache.k.dim(1),
                       n_head, n_head_kv, head_dim, b.rows, scale, window, out.data<float>());
}

// ---- Sampling -----------------------------------------------------------------

static_assert(sizeof(SampleRow) == sizeof(cuda::SampleRow) && offsetof(SampleRow, uniform) == offsetof(cuda::SampleRow, uniform),
              "ops::SampleRow and cuda::SampleRow share one layout");
static_assert(sizeof(PenaltyEntry) == sizeof(cuda::PenaltyEntry) &&
                  offsetof(PenaltyEntry, subtract) == offsetof(cuda::PenaltyEntry, subtract),
              "ops::PenaltyEntry and cuda::PenaltyEntry share one layout");

namespace {

// Small host arrays for a kernel: a device copy (on the backend stream).
std::shared_ptr<Buffer> upload_bytes(const void* src, size_t bytes) {
  auto buf = cuda::allocate(bytes);
  cuda::copy_to_device(buf->data(), src, bytes);
  return buf;
}

void check_logits(const char* op, const Tensor& logits) {
  require(logits.defined() && logits.dtype() == DType::F32 && logits.is_contiguous() && logits.ndim() == 2, op,
          "logits must be a contiguous [n_rows, n_vocab] F32 tensor, got ",
          logits.defined() ? logits.shape_str() : std::string("undefined"));
}

}  // namespace

void apply_penalties(const Tensor& logits, std::span<const PenaltyEntry> entries) {
  check_logits("apply_penalties", logits);
  const int64_t n_rows = logits.dim(0), V = logits.dim(1);
  for (const auto& e : entries)
    require(e.row >= 0 && e.row < n_rows && e.token >= 0 && e.token < V, "apply_penalties", "entry (row ", e.row,
            ", token ", e.token, ") outside ", logits.shape_str());
  if (entries.empty()) return;
  if (on_cuda(logits)) {
    auto dev = upload_bytes(entries.data(), entries.size_bytes());
    cuda::apply_penalties(logits.data<float>(), V, static_cast<const cuda::PenaltyEntry*>(dev->data()),
                          int64_t(entries.size()), cuda::stream());
    return;
  }
  require(logits.device() == Device::CPU, "apply_penalties", "no implementation for this device in this build");
  cpu::apply_penalties(logits.data<float>(), V, entries);
}

namespace {

void check_sample_rows(const Tensor& logits, std::span<const SampleRow> rows) {
  check_logits("sample", logits);
  require(int64_t(rows.size()) == logits.dim(0), "sample", rows.size(), " parameter rows for ", logits.dim(0),
          " rows of logits");
  for (const auto& r : rows)
    require(r.temperature >= 0 && std::isfinite(r.temperature) && r.top_k >= 0 && r.top_p > 0 && r.top_p <= 1 &&
                r.min_p >= 0 && r.min_p <= 1 && r.uniform >= 0 && r.uniform < 1,
            "sample", "parameters out of range: temperature ", r.temperature, ", top_k ", r.top_k, ", top_p ",
            r.top_p, ", min_p ", r.min_p, ", uniform ", r.uniform);
}

}  // namespace

SampledIds SampledIds::on_host(std::span<const int32_t> ids) {
  SampledIds s;
  s.host_.assign(ids.begin(), ids.end());
  s.device_ = Tensor::empty(DType::I32, {int64_t(ids.size())});
  std::copy(ids.begin(), ids.end(), s.device_.data<int32_t>());
  return s;
}

std::span<const int32_t> SampledIds::host() {
  if (landing_) {
    const auto* p = static_cast<const int32_t*>(landing_->wait());
    host_.assign(p, p + device_.numel());
    landing_.reset();
  }
  return host_;
}

SampledIds sample_async(const Tensor& logits, std::span<const SampleRow> rows, const Tensor& into) {
  check_sample_rows(logits, rows);
  const int64_t n_rows = logits.dim(0), V = logits.dim(1);
  if (!on_cuda(logits)) {
    require(logits.device() == Device::CPU, "sample", "no implementation for this device in this build");
    std::vector<int32_t> ids(size_t(n_rows), 0);
    if (n_rows > 0) cpu::sample(logits.data<float>(), V, rows, ids.data());
    SampledIds s = SampledIds::on_host(ids);
    if (into.defined()) {
      require(into.device() == Device::CPU && into.dtype() == DType::I32 && into.numel() == n_rows, "sample",
              "ids buffer ", into.shape_str(), " for ", n_rows, " rows on the host");
      copy_tensor(s.device_, into);
      s.device_ = into;
    }
    return s;
  }
  SampledIds s;
  const int64_t shape[] = {n_rows};
  if (into.defined()) {
    require(on_cuda(into) && into.dtype() == DType::I32 && into.is_contiguous() && into.numel() == n_rows, "sample",
            "ids buffer ", into.shape_str(), " for ", n_rows, " rows on the logits' device");
    s.device_ = into;
  } else {
    s.device_ = Tensor::view_of(cuda::allocate(size_t(std::max<int64_t>(n_rows, 1)) * 4), 0, DType::I32, shape, 1);
  }
  if (n_rows == 0) return s;
  int32_t* ids = s.device_.data<int32_t>();
  s.landing_ = std::make_shared<cuda::HostLanding>(size_t(n_rows) * 4);
  auto* host = static_cast<int32_t*>(s.landing_->data());
  // Greedy rows only: the argmax, split over the GPU's SMs, and no
  // parameters to upload (sample_kernel reads a row in one block).
  const bool greedy = std::all_of(rows.begin(), rows.end(), [](const SampleRow& r) { return r.temperature == 0; });
  if (greedy) {
    cuda::argmax(logits.data<float>(), n_rows, V, ids, host, cuda::stream());
  } else {
    auto dev_rows = upload_bytes(rows.data(), rows.size_bytes());
    cuda::sample(logits.data<float>(), n_rows, V, static_cast<const cuda::SampleRow*>(dev_rows->data()), ids, host,
                 cuda::stream());
  }
  s.landing_->mark();
  return s;
}

void sample(const Tensor& logits, std::span<const SampleRow> rows, std::span<int32_t> ids) {
  require(int64_t(ids.size()) == (logits.defined() && logits.ndim() == 2 ? logits.dim(0) : -1), "sample",
          ids.size(), " ids for logits ", logits.defined() ? logits.shape_str() : std::string("undefined"));
  SampledIds s = sample_async(logits, rows);
  const auto host = s.host();
  std::copy(host.begin(), host.end(), ids.begin());
}

// ---- Linear attention ------------------------------------------------------------

static_assert(sizeof(RecurrentRow) == sizeof(cuda::RecurrentRow) &&
                  offsetof(RecurrentRow, slot) == offsetof(cuda::RecurrentRow, slot),
              "ops::RecurrentRow and cuda::RecurrentRow share one layout");

namespace {

// Checks an f32 activation on the op's device: the CPU, or CUDA in a CUDA build.
void require_on(const char* op, const Tensor& t, const char* name, Device dev) {
  if (dev == Device::CPU)
    require_cpu_f32(op, t, name);
  else
    require_f32(op, t, name, dev);
}

void require_all_on(const char* op, Device dev, std::initializer_list<std::pair<const Tensor*, const char*>> ts) {
  for (const auto& [t, name] : ts) require_on(op, *t, name, dev);
}

// The rows of a recurrent op as a device array (the rows live on the host).
// Arrays of recent calls are kept by content: a forward passes the same rows
// to every layer, and decode steps pass the same rows step after step, so
// they cross to the device once. (A kept array is never written.)
std::shared_ptr<Buffer> upload_rows(std::span<const RecurrentRow> rows) {
  struct Kept {
    std::vector<RecurrentRow> rows;
    std::shared_ptr<Buffer> buf;
  };
  static std::mutex mu;
  static auto* kept = new std::vector<Kept>();  // most recent first; lives until exit, as the allocator
  constexpr size_t kKeep = 8;
  std::lock_guard<std::mutex> lock(mu);
  for (size_t i = 0; i < kept->size(); ++i) {
    Kept& k = (*kept)[i];
    if (k.rows.size() == rows.size() && std::memcmp(k.rows.data(), rows.data(), rows.size_bytes()) == 0) {
      std::rotate(kept->begin(), kept->begin() + std::ptrdiff_t(i), kept->begin() + std::ptrdiff_t(i) + 1);
      return kept->front().buf;
    }
  }
  Kept k{std::vector<RecurrentRow>(rows.begin(), rows.end()),
         upload_bytes(rows.data(), std::max<size_t>(rows.size_bytes(), 1))};
  kept->insert(kept->begin(), std::move(k));
  if (kept->size() > kKeep) kept->pop_back();
  return kept->front().buf;
}

// The rows on the device: the batch's own array when `rows` are all of its
// rows (the same rows, since ops get the batch's rows or a subset of them in
// order), else a kept copy. `keep` holds the copy alive for the call.
const cuda::RecurrentRow* device_rows(std::span<const RecurrentRow> rows, const DeviceBatch* device,
                                      std::shared_ptr<Buffer>& keep) {
  if (device != nullptr && device->recurrent_rows.defined() && device->recurrent_rows.dim(0) == int64_t(rows.size()))
    return static_cast<const cuda::RecurrentRow*>(device->recurrent_rows.raw());
  keep = upload_rows(rows);
  return static_cast<const cuda::RecurrentRow*>(keep->data());
}

int64_t max_row_tokens(std::span<const RecurrentRow> rows) {
  int64_t m = 0;
  for (const auto& r : rows) m = std::max<int64_t>(m, r.n_tokens);
  return m;
}

}  // namespace

void slice_cols(const Tensor& x, int64_t begin, const Tensor& y) {
  const Device dev = x.device();
  require_on("slice_cols", x, "x", dev);
  require_on("slice_cols", y, "y", dev);
  const int64_t N = x.dim(-1), n = y.dim(-1), M = rows_of(x);
  require(begin >= 0 && begin + n <= N && rows_of(y) == M, "slice_cols", "columns [", begin, ", ",
          begin + n, ") of x ", x.shape_str(), " do not fit y ", y.shape_str());
  if (dev == Device::CUDA)
    cuda::slice_cols(x.data<float>(), M, N, begin, n, y.data<float>(), cuda::stream());
  else
    cpu::slice_cols(x.data<float>(), M, N, begin, n, y.data<float>());
}

namespace {

// Rows tile [0, n_tokens) in order and use distinct slots in [0, n_slots).
void check_recurrent_rows(const char* op, std::span<const RecurrentRow> rows, int64_t n_tokens,
                          int64_t n_slots) {
  std::vector<bool> used(static_cast<size_t>(std::max<int64_t>(n_slots, 0)), false);
  int64_t next = -1;
  for (const auto& r : rows) {
    require(r.n_tokens >= 0 && r.token_begin >= 0 && int64_t(r.token_begin) + r.n_tokens <= n_tokens, op,
            "row tokens [", r.token_begin, ", ", int64_t(r.token_begin) + r.n_tokens, ") outside the batch of ",
            n_tokens);
    require(r.token_begin >= next, op, "rows must be in token order and must not overlap");
    next = int64_t(r.token_begin) + r.n_tokens;
    require(r.slot >= 0 && r.slot < n_slots, op, "state slot ", r.slot, " outside [0, ", n_slots, ")");
    require(!used[size_t(r.slot)], op, "state slot ", r.slot, " used by two rows of one batch");
    used[size_t(r.slot)] = true;
  }
}

}  // namespace

void causal_conv1d(const Tensor& x, const Tensor& w, std::span<const RecurrentRow> rows,
                   const Tensor& conv_state, bool silu, const Tensor& out, const DeviceBatch* device) {
  const Device dev = x.device();
  require_all_on("causal_conv1d", dev, {{&x, "x"}, {&w, "w"}, {&conv_state, "conv_state"}, {&out, "out"}});
  require(x.ndim() == 2 && w.ndim() == 2 && conv_state.ndim() == 3, "causal_conv1d",
          "x must be [n_tokens, C], w [C, K], conv_state [n_slots, K-1, C]; got ", x.shape_str(), ", ",
          w.shape_str(), ", ", conv_state.shape_str());
  const int64_t C = x.dim(1), K = w.dim(1);
  require(w.dim(0) == C && K >= 1 && conv_state.dim(1) == K - 1 && conv_state.dim(2) == C, "causal_conv1d",
          "x ", x.shape_str(), ", w ", w.shape_str(), ", conv_state ", conv_state.shape_str(), " disagree");
  require(out.shape() == x.shape() && out.ndim() == 2, "causal_conv1d", "out ", out.shape_str(), " vs x ",
          x.shape_str());
  require(out.raw() != x.raw(), "causal_conv1d", "out must not alias x");
  check_recurrent_rows("causal_conv1d", rows, x.dim(0), conv_state.dim(0));
  if (dev == Device::CUDA) {
    if (rows.empty()) return;
    std::shared_ptr<Buffer> keep;
    cuda::causal_conv1d(x.data<float>(), w.data<float>(), C, K, device_rows(rows, device, keep), int64_t(rows.size()),
                        max_row_tokens(rows), conv_state.data<float>(), silu, out.data<float>(), cuda::stream());
    return;
  }
  cpu::causal_conv1d(x.data<float>(), w.data<float>(), C, K, rows, conv_state.data<float>(), silu,
                     out.data<float>());
}

void l2norm(const Tensor& x, float eps, const Tensor& y) {
  const Device dev = x.device();
  require_on("l2norm", x, "x", dev);
  require_on("l2norm", y, "y", dev);
  require(x.numel() == y.numel() && x.dim(-1) == y.dim(-1), "l2norm", "x ", x.shape_str(), " vs y ",
          y.shape_str());
  if (dev == Device::CUDA)
    cuda::l2norm(x.data<float>(), eps, rows_of(x), x.dim(-1), y.data<float>(), cuda::stream());
  else
    cpu::l2norm(x.data<float>(), eps, rows_of(x), x.dim(-1), y.data<float>());
}

void delta_rule_gates(const Tensor& a, const Tensor& b, const Tensor& a_log, const Tensor& dt_bias,
                      const Tensor& g, const Tensor& beta) {
  const char* op = "delta_rule_gates";
  const Device dev = a.device();
  require_all_on(op, dev, {{&a, "a"}, {&b, "b"}, {&a_log, "a_log"}, {&dt_bias, "dt_bias"}, {&g, "g"},
                           {&beta, "beta"}});
  const int64_t H = a.dim(-1), T = rows_of(a);
  require(a_log.numel() == H && dt_bias.numel() == H && b.numel() == a.numel() && g.numel() == a.numel() &&
              beta.numel() == a.numel(),
          op, "a ", a.shape_str(), ", b ", b.shape_str(), ", a_log ", a_log.shape_str(), ", dt_bias ",
          dt_bias.shape_str(), ", g ", g.shape_str(), ", beta ", beta.shape_str(), " disagree");
  if (dev == Device::CUDA) {
    cuda::delta_rule_gates(a.data<float>(), b.data<float>(), a_log.data<float>(), dt_bias.data<float>(), T, H,
                           g.data<float>(), beta.data<float>(), cuda::stream());
    return;
  }
  cpu::delta_rule_gates(a.data<float>(), b.data<float>(), a_log.data<float>(), dt_bias.data<float>(), T, H,
                        g.data<float>(), beta.data<float>());
}

namespace {

cpu::DeltaRuleDims check_delta_rule(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& g, const Tensor& beta, std::span<const RecurrentRow> rows,
                                    const Tensor& state, const Tensor& out) {
  require_all_on(op, q.device(), {{&q, "q"}, {&k, "k"}, {&v, "v"}, {&g, "g"}, {&beta, "beta"}, {&state, "state"},
                                  {&out, "out"}});
  require(q.ndim() == 3 && v.ndim() == 3 && state.ndim() == 4, op,
          "q, k must be [n_tokens, n_head_k, head_dim_k], v [n_tokens, n_head, head_dim_v], state "
          "[n_slots, n_head, head_dim_k, head_dim_v]; got ",
          q.shape_str(), ", ", v.shape_str(), ", ", state.shape_str());
  cpu::DeltaRuleDims d{q.dim(1), v.dim(1), q.dim(2), v.dim(2)};
  const int64_t T = q.dim(0);
  require(k.shape() == q.shape() && v.dim(0) == T && d.n_head_k > 0 && d.n_head % d.n_head_k == 0, op,
          "q ", q.shape_str(), ", k ", k.shape_str(), ", v ", v.shape_str(),
          " disagree (n_head must be a multiple of n_head_k)");
  require(g.numel() == T * d.n_head && beta.numel() == T * d.n_head, op, "g ", g.shape_str(), " / beta ",
          beta.shape_str(), " should hold [", T, ", ", d.n_head, "]");
  require(state.dim(1) == d.n_head && state.dim(2) == d.head_dim_k && state.dim(3) == d.head_dim_v, op,
          "state ", state.shape_str(), " does not fit q ", q.shape_str(), " / v ", v.shape_str());
  require(out.shape() == v.shape() && out.ndim() == 3, op, "out ", out.shape_str(), " vs v ", v.shape_str());
  check_recurrent_rows(op, rows, T, state.dim(0));
  return d;
}

cuda::DeltaRuleDims cuda_dims(const cpu::DeltaRuleDims& d) {
  return {d.n_head_k, d.n_head, d.head_dim_k, d.head_dim_v};
}

}  // namespace

void gated_delta_rule_recurrent(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                const Tensor& beta, float scale, std::span<const RecurrentRow> rows,
                                const Tensor& state, const Tensor& out, const DeviceBatch* device) {
  const auto d = check_delta_rule("gated_delta_rule_recurrent", q, k, v, g, beta, rows, state, out);
  if (q.device() == Device::CUDA) {
    if (rows.empty()) return;
    std::shared_ptr<Buffer> keep;
    cuda::gated_delta_rule_recurrent(q.data<float>(), k.data<float>(), v.data<float>(), g.data<float>(),
                                     beta.data<float>(), scale, cuda_dims(d), device_rows(rows, device, keep),
                                     int64_t(rows.size()), state.data<float>(), out.data<float>(), cuda::stream());
    return;
  }
  cpu::gated_delta_rule_recurrent(q.data<float>(), k.data<float>(), v.data<float>(), g.data<float>(),
                                  beta.data<float>(), scale, d, rows, state.data<float>(), out.data<float>());
}

void gated_delta_rule_step(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& a, const Tensor& b,
                           const Tensor& a_log, const Tensor& dt_bias, float qk_eps, float scale,
                           std::span<const RecurrentRow> rows, const Tensor& state, const Tensor& out,
                           const DeviceBatch* device) {
  const char* op = "gated_delta_rule_step";
  require_all_on(op, q.device(), {{&a, "a"}, {&b, "b"}, {&a_log, "a_log"}, {&dt_bias, "dt_bias"}});
  const int64_t H = v.dim(1);
  require(a.numel() == q.dim(0) * H && b.numel() == a.numel() && a_log.numel() == H && dt_bias.numel() == H, op,
          "a ", a.shape_str(), ", b ", b.shape_str(), ", a_log ", a_log.shape_str(), ", dt_bias ",
          dt_bias.shape_str(), " do not fit v ", v.shape_str());
  // Validates q, k, v, state, out and rows as the recurrent op does (a and b
  // stand in for g and beta, whose shapes they share).
  const auto d = check_delta_rule(op, q, k, v, a, b, rows, state, out);
  if (q.device() == Device::CUDA) {
    if (rows.empty()) return;
    std::shared_ptr<Buffer> keep;
    cuda::DeltaRuleFusion f;
    f.a = a.data<float>();
    f.b = b.data<float>();
    f.a_log = a_log.data<float>();
    f.dt_bias = dt_bias.data<float>();
    f.l2norm = true;
    f.eps = qk_eps;
    cuda::gated_delta_rule_recurrent(q.data<float>(), k.data<float>(), v.data<float>(), nullptr, nullptr, scale,
                                     cuda_dims(d), device_rows(rows, device, keep), int64_t(rows.size()),
                                     state.data<float>(), out.data<float>(), cuda::stream(), &f);
    return;
  }
  // The CPU composes the three ops.
  Tensor qn = Tensor::empty(DType::F32, q.shape().data(), q.ndim());
  Tensor kn = Tensor::empty(DType::F32, k.shape().data(), k.ndim());
  Tensor g = Tensor::empty(DType::F32, a.shape().data(), a.ndim());
  Tensor beta = Tensor::empty(DType::F32, a.shape().data(), a.ndim());
  l2norm(q, qk_eps, qn);
  l2norm(k, qk_eps, kn);
  delta_rule_gates(a, b, a_log, dt_bias, g, beta);
  gated_delta_rule_recurrent(qn, kn, v, g, beta, scale, rows, state, out);
}

void gated_delta_rule_chunked(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                              const Tensor& beta, float scale, int64_t chunk_size,
                              std::span<const RecurrentRow> rows, const Tensor& state, const Tensor& out,
                              const DeviceBatch* device) {
  const auto d = check_delta_rule("gated_delta_rule_chunked", q, k, v, g, beta, rows, state, out);
  require(chunk_size >= 1 && chunk_size <= 1024, "gated_delta_rule_chunked", "chunk_size ", chunk_size,
          " outside [1, 1024]");
  if (q.device() == Device::CUDA) {
    if (rows.empty()) return;
    std::shared_ptr<Buffer> keep;
    cuda::gated_delta_rule_chunked(q.data<float>(), k.data<float>(), v.data<float>(), g.data<float>(),
                                   beta.data<float>(), scale, chunk_size, cuda_dims(d), device_rows(rows, device, keep),
                                   int64_t(rows.size()), state.data<float>(), out.data<float>(), cuda::stream());
    return;
  }
  cpu::gated_delta_rule_chunked(q.data<float>(), k.data<float>(), v.data<float>(), g.data<float>(),
                                beta.data<float>(), scale, chunk_size, d, rows, state.data<float>(),
                                out.data<float>());
}

void gated_rms_norm(const Tensor& x, const Tensor& z, const Tensor& w, float eps, const Tensor& y) {
  const Device dev = x.device();
  require_all_on("gated_rms_norm", dev, {{&x, "x"}, {&z, "z"}, {&w, "w"}, {&y, "y"}});
  const int64_t D = x.dim(-1);
  require(w.numel() == D && z.numel() == x.numel() && y.numel() == x.numel() && z.dim(-1) == D &&
              y.dim(-1) == D,
          "gated_rms_norm", "x ", x.shape_str(), ", z ", z.shape_str(), ", w ", w.shape_str(), ", y ",
          y.shape_str(), " disagree");
  if (dev == Device::CUDA)
    cuda::gated_rms_norm(x.data<float>(), z.data<float>(), w.data<float>(), eps, rows_of(x), D, y.data<float>(),
                         cuda::stream());
  else
    cpu::gated_rms_norm(x.data<float>(), z.data<float>(), w.data<float>(), eps, rows_of(x), D, y.data<float>());
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

// ---- Mixture of experts ---------------------------------------------------------

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
  require(gate_up.dtype() == down.dtype(), op, "gate_up and down differ in dtype");
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
  require(gate_up.dtype() == DType::BF16 || gate_up.dtype() == DType::F32, "moe_experts", "weights dtype ",
          dtype_name(gate_up.dtype()), " unsupported");
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
  const size_t esize = dtype_size(gate_up.dtype());
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
    const char* wgu = static_cast<const char*>(gate_up.raw()) + size_t(e * 2 * m.I * m.d) * esize;
    const char* wd = static_cast<const char*>(down.raw()) + size_t(e * m.d * m.I) * esize;
    cpu::matmul(xe.data(), n, m.d, m.d, wgu, gate_up.dtype(), 2 * m.I, gu.data(), 2 * m.I, ThreadPool::global());
    cpu::swiglu_packed(gu.data(), n, m.I, act.data());
    cpu::matmul(act.data(), n, m.I, m.I, wd, down.dtype(), m.d, ye.data(), m.d, ThreadPool::global());
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
