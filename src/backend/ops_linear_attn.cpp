// The linear-attention ops (Gated DeltaNet): column slices, the causal
// conv1d, L2 norm, the delta rule's gates and its recurrent and chunked
// forms, and the gated RMSNorm.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <vector>

#include "backend/cpu/linear_attn_cpu.h"
#include "backend/ops_internal.h"

namespace augur::ops {

using namespace detail;

static_assert(sizeof(RecurrentRow) == sizeof(cuda::RecurrentRow) &&
                  offsetof(RecurrentRow, slot) == offsetof(cuda::RecurrentRow, slot),
              "ops::RecurrentRow and cuda::RecurrentRow share one layout");

namespace {

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

namespace {

// The rows of an input-history op over T tokens, checked against the
// history's n_slots; on CUDA the batch's device layout holding these rows
// (its positions, token rows and rows are what the kernels read), else null.
const DeviceBatch* history_layout(const char* op, Device dev, std::span<const RecurrentRow> rows,
                                  const BatchView& batch, int64_t T, int64_t n_slots) {
  require(int64_t(batch.positions.size()) == T, op, batch.positions.size(), " positions for ", T, " tokens");
  check_recurrent_rows(op, rows, T, n_slots);
  if (dev != Device::CUDA) return nullptr;
  const DeviceBatch* d = batch.device;
  require(d != nullptr && d->recurrent_rows.defined() && d->recurrent_rows.dim(0) == int64_t(rows.size()) &&
              d->token_row.numel() == T,
          op, "a CUDA batch needs its device layout, with these rows");
  return d;
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
  cpu::causal_conv1d(x.data<float>(), C, w.data<float>(), C, K, rows, conv_state.data<float>(), silu,
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
                                   int64_t(rows.size()), q.shape()[0], state.data<float>(), out.data<float>(),
                                   cuda::stream());
    return;
  }
  cpu::gated_delta_rule_chunked(q.data<float>(), k.data<float>(), v.data<float>(), g.data<float>(),
                                beta.data<float>(), scale, chunk_size, d, rows, state.data<float>(),
                                out.data<float>());
}

void delta_rule_inputs(const Tensor& proj, int64_t ba_col, const Tensor& conv_w, const Tensor& a_log,
                       const Tensor& dt_bias, float qk_eps, std::span<const RecurrentRow> rows,
                       const Tensor& conv_state, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                       const Tensor& beta, const DeviceBatch* device) {
  const char* op = "delta_rule_inputs";
  const Device dev = proj.device();
  require_all_on(op, dev, {{&proj, "proj"}, {&conv_w, "conv_w"}, {&a_log, "a_log"}, {&dt_bias, "dt_bias"},
                           {&conv_state, "conv_state"}, {&q, "q"}, {&k, "k"}, {&v, "v"}, {&g, "g"}, {&beta, "beta"}});
  require(proj.ndim() == 2 && conv_w.ndim() == 2 && conv_state.ndim() == 3 && q.ndim() == 3 && v.ndim() == 3, op,
          "proj must be [n_tokens, P], conv_w [C, K], conv_state [n_slots, K-1, C], q, k [n_tokens, n_head_k, "
          "head_dim_k], v [n_tokens, n_head, head_dim_v]; got ",
          proj.shape_str(), ", ", conv_w.shape_str(), ", ", conv_state.shape_str(), ", ", q.shape_str(), ", ",
          v.shape_str());
  const int64_t T = proj.dim(0), P = proj.dim(1), C = conv_w.dim(0), K = conv_w.dim(1);
  const cpu::DeltaRuleDims d{q.dim(1), v.dim(1), q.dim(2), v.dim(2)};
  const int64_t H = d.n_head;
  require(k.shape() == q.shape() && q.dim(0) == T && v.dim(0) == T && C == 2 * d.n_head_k * d.head_dim_k +
              H * d.head_dim_v && K >= 1 && conv_state.dim(1) == K - 1 && conv_state.dim(2) == C,
          op, "q ", q.shape_str(), ", k ", k.shape_str(), ", v ", v.shape_str(), ", conv_w ", conv_w.shape_str(),
          ", conv_state ", conv_state.shape_str(), " disagree (C = 2 n_head_k head_dim_k + n_head head_dim_v)");
  require(ba_col >= C && ba_col + 2 * H <= P && a_log.numel() == H && dt_bias.numel() == H &&
              g.numel() == T * H && beta.numel() == T * H,
          op, "proj ", proj.shape_str(), " must hold b and a (", 2 * H, " columns) from column ", ba_col,
          " past the conv's ", C, "; a_log ", a_log.shape_str(), ", dt_bias ", dt_bias.shape_str(), ", g ",
          g.shape_str(), ", beta ", beta.shape_str(), " must fit ", H, " heads");
  check_recurrent_rows(op, rows, T, conv_state.dim(0));
  if (dev == Device::CUDA) {
    if (rows.empty()) return;
    require(d.head_dim_k <= 256 && d.head_dim_v <= 1024, op, "head dims ", d.head_dim_k, " / ", d.head_dim_v,
            " beyond the kernel's 256 / 1024");
    std::shared_ptr<Buffer> keep;
    cuda::delta_rule_inputs(proj.data<float>(), P, ba_col, conv_w.data<float>(), K, cuda_dims(d),
                            a_log.data<float>(), dt_bias.data<float>(), qk_eps, device_rows(rows, device, keep),
                            int64_t(rows.size()), max_row_tokens(rows), conv_state.data<float>(), q.data<float>(),
                            k.data<float>(), v.data<float>(), g.data<float>(), beta.data<float>(), cuda::stream());
    return;
  }
  cpu::delta_rule_inputs(proj.data<float>(), P, ba_col, conv_w.data<float>(), K, d, a_log.data<float>(),
                         dt_bias.data<float>(), qk_eps, rows, conv_state.data<float>(), q.data<float>(),
                         k.data<float>(), v.data<float>(), g.data<float>(), beta.data<float>());
}

void keep_recurrent_inputs(const Tensor& proj, int64_t n_conv, int64_t n_z, std::span<const RecurrentRow> rows,
                           const BatchView& batch, const Tensor& inputs) {
  const char* op = "keep_recurrent_inputs";
  const Device dev = proj.device();
  require_all_on(op, dev, {{&proj, "proj"}, {&inputs, "inputs"}});
  require(proj.ndim() == 2 && inputs.ndim() == 3, op, "proj must be [n_tokens, P], inputs [n_slots, n_pos, W]; got ",
          proj.shape_str(), ", ", inputs.shape_str());
  const int64_t T = proj.dim(0), P = proj.dim(1), W = inputs.dim(2), n_pos = inputs.dim(1);
  require(n_conv >= 0 && n_z >= 0 && W >= n_conv && n_conv + n_z + (W - n_conv) == P && n_pos >= 1, op, "proj ",
          proj.shape_str(), " does not hold ", n_conv, " conv inputs, ", n_z, " z and the ", W - n_conv,
          " gate inputs of ", inputs.shape_str());
  if (const DeviceBatch* d = history_layout(op, dev, rows, batch, T, inputs.dim(0))) {
    cuda::keep_recurrent_inputs(proj.data<float>(), T, P, n_conv, n_z, d->positions.data<int32_t>(),
                                d->token_row.data<int32_t>(), static_cast<const cuda::RecurrentRow*>(d->recurrent_rows.raw()),
                                n_pos, W, inputs.data<float>(), cuda::stream());
    return;
  }
  cpu::keep_recurrent_inputs(proj.data<float>(), P, n_conv, n_z, rows, batch.positions.data(), n_pos, W,
                             inputs.data<float>());
}

void load_recurrent_inputs(const Tensor& inputs, std::span<const RecurrentRow> rows, const BatchView& batch,
                           const Tensor& out) {
  const char* op = "load_recurrent_inputs";
  const Device dev = inputs.device();
  require_all_on(op, dev, {{&inputs, "inputs"}, {&out, "out"}});
  require(inputs.ndim() == 3 && out.ndim() == 2 && out.dim(1) == inputs.dim(2), op, "inputs must be [n_slots, n_pos, W], out [n_tokens, W]; got ",
          inputs.shape_str(), ", ", out.shape_str());
  const int64_t T = out.dim(0), W = out.dim(1), n_pos = inputs.dim(1);
  if (const DeviceBatch* d = history_layout(op, dev, rows, batch, T, inputs.dim(0))) {
    cuda::load_recurrent_inputs(inputs.data<float>(), T, d->positions.data<int32_t>(), d->token_row.data<int32_t>(),
                                static_cast<const cuda::RecurrentRow*>(d->recurrent_rows.raw()), n_pos, W,
                                out.data<float>(), cuda::stream());
    return;
  }
  for (const auto& row : rows)
    for (int64_t i = 0; i < row.n_tokens; ++i) {
      const int64_t t = int64_t(row.token_begin) + i;
      const int64_t at = int64_t(row.slot) * n_pos + batch.positions[size_t(t)] % n_pos;
      std::memcpy(out.data<float>() + t * W, inputs.data<float>() + at * W, size_t(W) * 4);
    }
}

void gated_rms_norm(const Tensor& x, const Tensor& z, const Tensor& w, float eps, const Tensor& y) {
  const char* op = "gated_rms_norm";
  const Device dev = x.device();
  require_all_on(op, dev, {{&x, "x"}, {&w, "w"}, {&y, "y"}});
  // z: contiguous, or a 2-D view whose rows are strided (Tensor::slice_cols)
  const bool z_view = z.defined() && !z.is_contiguous();
  if (z_view)
    require(z.ndim() == 2 && z.stride(1) == 1 && z.device() == dev && z.dtype() == DType::F32, op,
            "z must be an f32 tensor, or rows of one (a 2-D column slice) on the op's device");
  else
    require_on(op, z, "z", dev);
  const int64_t D = x.dim(-1), W = z.dim(-1), ldz = z_view ? z.stride(0) : W;
  require(w.numel() == D && z.numel() == x.numel() && y.numel() == x.numel() && W % D == 0 && y.dim(-1) == D, op,
          "x ", x.shape_str(), ", z ", z.shape_str(), ", w ", w.shape_str(), ", y ", y.shape_str(), " disagree");
  if (dev == Device::CUDA)
    cuda::gated_rms_norm(x.data<float>(), z.data<float>(), W, ldz, w.data<float>(), eps, rows_of(x), D,
                         y.data<float>(), cuda::stream());
  else
    cpu::gated_rms_norm(x.data<float>(), z.data<float>(), W, ldz, w.data<float>(), eps, rows_of(x), D,
                        y.data<float>());
}

}  // namespace augur::ops
