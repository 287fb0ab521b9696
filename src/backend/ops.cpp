#include "backend/ops.h"

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops_cpu.h"
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

void embedding(const Tensor& table, std::span<const int32_t> ids, const Tensor& out) {
  require_cpu_f32("embedding", out, "out");
  require(table.ndim() == 2, "embedding", "table must be 2-D, got ", table.shape_str());
  require(table.dtype() == DType::F32 || table.dtype() == DType::BF16 || table.dtype() == DType::F16,
          "embedding", "table dtype ", dtype_name(table.dtype()), " unsupported");
  require(out.numel() == int64_t(ids.size()) * table.dim(1), "embedding", "out ", out.shape_str(),
          " does not hold ", ids.size(), " rows of ", table.dim(1));
  for (int32_t id : ids)
    require(id >= 0 && id < table.dim(0), "embedding", "token id ", id, " outside [0, ", table.dim(0), ")");
  cpu::embedding(table.raw(), table.dtype(), table.dim(1), ids, out.data<float>());
}

void linear(const Tensor& x, const Tensor& w, const Tensor& y) {
  require_cpu_f32("linear", x, "x");
  require_cpu_f32("linear", y, "y");
  require(w.ndim() == 2 && w.is_contiguous(), "linear", "w must be a contiguous 2-D tensor, got ",
          w.shape_str());
  require(w.dtype() == DType::BF16 || w.dtype() == DType::F32, "linear", "w dtype ",
          dtype_name(w.dtype()), " unsupported");
  const int64_t K = w.dim(1), N = w.dim(0);
  require(x.dim(-1) == K, "linear", "x ", x.shape_str(), " does not match w ", w.shape_str());
  const int64_t M = rows_of(x);
  require(y.dim(-1) == N && rows_of(y) == M, "linear", "y ", y.shape_str(), " should be [", M, ", ", N, "]");
  cpu::matmul(x.data<float>(), M, K, K, w.raw(), w.dtype(), N, y.data<float>(), N, ThreadPool::global());
}

void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y) {
  require_cpu_f32("rms_norm", x, "x");
  require_cpu_f32("rms_norm", y, "y");
  require_cpu_f32("rms_norm", w, "w");
  const int64_t D = x.dim(-1);
  require(w.numel() == D && y.numel() == x.numel(), "rms_norm", "x ", x.shape_str(), ", w ",
          w.shape_str(), ", y ", y.shape_str(), " disagree");
  cpu::rms_norm(x.data<float>(), w.data<float>(), eps, rows_of(x), D, y.data<float>());
}

void add_inplace(const Tensor& a, const Tensor& b) {
  require_cpu_f32("add", a, "a");
  require_cpu_f32("add", b, "b");
  require(a.numel() == b.numel(), "add", a.shape_str(), " vs ", b.shape_str());
  cpu::add_inplace(a.data<float>(), b.data<float>(), a.numel());
}

void swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  require_cpu_f32("swiglu", gate, "gate");
  require_cpu_f32("swiglu", up, "up");
  require_cpu_f32("swiglu", out, "out");
  require(gate.numel() == up.numel() && gate.numel() == out.numel(), "swiglu", gate.shape_str(),
          " vs ", up.shape_str(), " vs ", out.shape_str());
  cpu::swiglu(gate.data<float>(), up.data<float>(), out.data<float>(), gate.numel());
}

void rope(const Tensor& x, std::span<const int32_t> positions, std::span<const float> inv_freq) {
  require_cpu_f32("rope", x, "x");
  require(x.ndim() == 3, "rope", "x must be [n_tokens, n_head, head_dim], got ", x.shape_str());
  require(int64_t(positions.size()) == x.dim(0), "rope", positions.size(), " positions for ",
          x.dim(0), " tokens");
  require(int64_t(inv_freq.size()) * 2 <= x.dim(2), "rope", "rotary dims ", inv_freq.size() * 2,
          " exceed head_dim ", x.dim(2));
  cpu::rope(x.data<float>(), x.dim(0), x.dim(1), x.dim(2), positions, inv_freq);
}

namespace {

void check_rows(const char* op, std::span<const AttnRow> rows, int64_t n_tokens, const KvLayer& cache) {
  require_cpu_f32(op, cache.k, "k_cache");
  require_cpu_f32(op, cache.v, "v_cache");
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

void store_kv(const Tensor& k, const Tensor& v, std::span<const AttnRow> rows, const KvLayer& cache) {
  require_cpu_f32("store_kv", k, "k");
  require_cpu_f32("store_kv", v, "v");
  check_rows("store_kv", rows, k.dim(0), cache);
  const int64_t kv_dim = cache.k.dim(2) * cache.k.dim(3);
  require(k.numel() == k.dim(0) * kv_dim && v.numel() == k.numel(), "store_kv", "k ", k.shape_str(),
          " / v ", v.shape_str(), " do not match the cache ", cache.k.shape_str());
  cpu::store_kv(k.data<float>(), v.data<float>(), kv_dim, rows, cache.k.dim(1),
                cache.k.data<float>(), cache.v.data<float>());
}

void paged_attention(const Tensor& q, const KvLayer& cache, std::span<const AttnRow> rows,
                     float scale, int32_t window, const Tensor& out) {
  require_cpu_f32("paged_attention", q, "q");
  require_cpu_f32("paged_attention", out, "out");
  require(q.ndim() == 3, "paged_attention", "q must be [n_tokens, n_head, head_dim], got ", q.shape_str());
  check_rows("paged_attention", rows, q.dim(0), cache);
  const int64_t n_head = q.dim(1), head_dim = q.dim(2), n_head_kv = cache.k.dim(2);
  require(cache.k.dim(3) == head_dim && n_head % n_head_kv == 0, "paged_attention", "q ",
          q.shape_str(), " does not fit cache ", cache.k.shape_str());
  require(out.numel() == q.numel(), "paged_attention", "out ", out.shape_str(), " vs q ", q.shape_str());
  cpu::paged_attention(q.data<float>(), cache.k.data<float>(), cache.v.data<float>(), cache.k.dim(1),
                       n_head, n_head_kv, head_dim, rows, scale, window, out.data<float>());
}

}  // namespace augur::ops
