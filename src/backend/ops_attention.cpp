// The attention ops: the batch layout on the device, RoPE, the paged KV
// cache's writes, and paged attention (with the fused form that takes the
// q/k/v projection).
#include <algorithm>
#include <initializer_list>
#include <string>
#include <vector>

#include "backend/cpu/ops_cpu.h"
#include "backend/device.h"
#include "backend/ops_internal.h"

namespace augur::ops {

using namespace detail;

namespace {

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
  m.n_rows = d.n_rows;
  return m;
}


}  // namespace

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
  b.n_rows = int32_t(rows.size());
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
      // A row without blocks (a rollback's replay) touches no K/V.
      const size_t b = size_t(p / block_size);
      slots[t] = b < row.block_table.size() ? int32_t(row.block_table[b] * block_size + p % block_size) : -1;
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

void qkv_rope_attention(const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm, float eps, const BatchView& b,
                        const Tensor& inv_freq, const KvLayer& cache, float scale, int32_t window, const Tensor& q,
                        const Tensor& gate, const Tensor& out, const Tensor& workspace) {
  const char* op = "qkv_rope_attention";
  require(q.defined() && out.defined() && q.ndim() == 3 && out.shape() == q.shape(), op, "q ",
          q.defined() ? q.shape_str() : std::string("undefined"), " and out ",
          out.defined() ? out.shape_str() : std::string("undefined"), " must be [n_tokens, n_head, head_dim]");
  const int64_t T = out.dim(0), n_head = out.dim(1), head_dim = out.dim(2);
  // The fused CUDA kernel: no output gate, one new token (kRopeFusedTokens),
  // the tensor-core decode kernel's shapes.
  if (!gate.defined() && on_cuda(qkv) && b.device != nullptr && T <= cuda::kRopeFusedTokens &&
      cache.k.defined() && cache.k.ndim() == 4) {
    const int64_t n_head_kv = cache.k.dim(2);
    const cuda::AttnMeta meta = attn_meta(op, b, T);
    if (cuda::decode_attention_rope_fits(n_head, n_head_kv, head_dim, meta, false)) {
      const Device dev = qkv.device();
      require_f32(op, qkv, "qkv", dev);
      require_f32(op, out, "out", dev);
      require_f32(op, inv_freq, "inv_freq", dev);
      check_rows(op, b.rows, T, cache, dev);
      const int64_t half = inv_freq.numel();
      require(cache.k.dim(3) == head_dim && n_head % n_head_kv == 0, op, "out ", out.shape_str(),
              " does not fit cache ", cache.k.shape_str());
      require(qkv.numel() == T * (n_head + 2 * n_head_kv) * head_dim && qkv.dim(0) == T, op, "qkv ",
              qkv.shape_str(), " should be [", T, ", ", (n_head + 2 * n_head_kv) * head_dim, "]");
      require(2 * half <= head_dim, op, "rotary dims ", 2 * half, " exceed head_dim ", head_dim);
      require(q_norm.defined() == k_norm.defined(), op, "q_norm and k_norm go together");
      if (q_norm.defined()) {
        require_f32(op, q_norm, "q_norm", dev);
        require_f32(op, k_norm, "k_norm", dev);
        require(q_norm.numel() == head_dim && k_norm.numel() == head_dim, op, "norm gains must be [", head_dim, "]");
      }
      const int64_t need = attention_workspace(out, b);
      require(workspace.defined() ? workspace.numel() >= need && workspace.device() == dev : need == 0, op,
              "workspace of ", workspace.defined() ? workspace.numel() : 0, " floats, needs ", need);
      cuda::decode_attention_rope(qkv.data<float>(), q_norm.defined() ? q_norm.data<float>() : nullptr,
                                  k_norm.defined() ? k_norm.data<float>() : nullptr, eps, inv_freq.data<float>(),
                                  half, half_ptr_mut(cache.k), half_ptr_mut(cache.v), cache.k.dim(1), n_head,
                                  n_head_kv, head_dim, meta, scale, window, out.data<float>(),
                                  need ? workspace.raw() : nullptr, cuda::stream(), half_of(cache.k));
      return;
    }
  }
  qkv_rope_store(qkv, q_norm, k_norm, eps, b, inv_freq, cache, q, gate);
  paged_attention(q, cache, b, scale, window, out, workspace);
  if (gate.defined()) {
    const Tensor flat = out.reshape({T, n_head * head_dim});
    sigmoid_mul(flat, gate, flat);
  }
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

}  // namespace augur::ops
