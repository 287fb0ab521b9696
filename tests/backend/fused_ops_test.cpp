// The fused ops are total: qkv_rope_attention and block_tail give what the
// ops they stand for give, on every backend, whether the backend fuses them
// (CUDA: one token without a gate; at most 2 rows) or composes them.
// Compared against those ops run one after another on copies of the same
// inputs: bit for bit where the backend runs the same kernels (the CPU, and
// CUDA where it composes, and the fused RoPE attention, which reproduces the
// separate kernels' arithmetic); to float noise where block_tail's stream
// GEMVs sum in another order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/device.h"
#include "backend/ops.h"
#include "core/dtype.h"

namespace augur {
namespace {

Tensor host_f32(std::initializer_list<int64_t> shape, const std::vector<float>& v) {
  Tensor t = Tensor::empty(DType::F32, shape);
  EXPECT_EQ(t.numel(), int64_t(v.size()));
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

// `v` stored as `t` (F32 | BF16 | F16).
Tensor host_as(DType t, std::initializer_list<int64_t> shape, const std::vector<float>& v) {
  if (t == DType::F32) return host_f32(shape, v);
  Tensor out = Tensor::empty(t, shape);
  for (int64_t i = 0; i < out.numel(); ++i)
    out.data<uint16_t>()[i] = t == DType::BF16 ? f32_to_bf16(v[size_t(i)]) : f32_to_f16(v[size_t(i)]);
  return out;
}

std::vector<float> uniform(int64_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

// A fresh copy of `t` on `d` (never `t` itself: the ops write in place).
Tensor copy_on(Device d, const Tensor& t) {
  Tensor c = empty_on(d, t.dtype(), t.shape().data(), t.ndim());
  copy_tensor(t, c);
  return c;
}

Tensor nan_on(Device d, std::initializer_list<int64_t> shape) {
  Tensor h = Tensor::empty(DType::F32, shape);
  std::fill_n(h.data<float>(), h.numel(), std::numeric_limits<float>::quiet_NaN());
  return copy_on(d, h);
}

std::vector<uint8_t> bytes(const Tensor& t) {
  const Tensor h = to_device(t, Device::CPU);
  const auto* p = static_cast<const uint8_t*>(h.raw());
  return std::vector<uint8_t>(p, p + h.nbytes());
}

std::vector<float> floats(const Tensor& t) {
  const Tensor h = to_device(t, Device::CPU);
  return std::vector<float>(h.data<float>(), h.data<float>() + h.numel());
}

class Fused : public ::testing::TestWithParam<Device> {
 protected:
  Device dev() const { return GetParam(); }
  void SetUp() override {
    if (!device_available(dev())) GTEST_SKIP() << "no " << device_name(dev()) << " device";
  }
};

std::string device_param_name(const ::testing::TestParamInfo<Device>& info) {
  return std::string(device_name(info.param));
}

// ---- qkv_rope_attention -----------------------------------------------------------

struct Layout {
  std::vector<std::vector<int32_t>> tables;
  std::vector<ops::AttnRow> rows;
  std::vector<int32_t> tokens, positions;
  ops::DeviceBatch device;
  bool has_device = false;
  ops::BatchView view() const { return {rows, positions, has_device ? &device : nullptr}; }
};

// Rows of (n_tokens, pos0) on disjoint runs of blocks, in the order given by `blocks`.
Layout make_layout(Device d, const std::vector<std::pair<int32_t, int32_t>>& specs, int64_t block_size,
                   const std::vector<int32_t>& blocks) {
  Layout b;
  size_t next = 0;
  int64_t max_context = 1;
  int32_t begin = 0;
  for (const auto& [n, pos0] : specs) {
    const int64_t end = int64_t(pos0) + n;
    max_context = std::max(max_context, end);
    std::vector<int32_t> t;
    for (int64_t i = 0; i < (end + block_size - 1) / block_size; ++i) t.push_back(blocks[next++]);
    b.tables.push_back(std::move(t));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    b.rows.push_back({begin, specs[i].first, specs[i].second, b.tables[i]});
    for (int32_t j = 0; j < specs[i].first; ++j) b.positions.push_back(specs[i].second + j);
    begin += specs[i].first;
  }
  b.tokens.assign(size_t(begin), 0);
  if (d != Device::CPU) {
    b.device = ops::upload_batch(d, b.tokens, b.rows, block_size, max_context);
    b.has_device = true;
  }
  return b;
}

using QkvRopeAttention = Fused;

// One token (CUDA fuses it unless gated), a decode batch of three rows, and
// a mixed batch; with and without per-head norms and an output gate, a window.
TEST_P(QkvRopeAttention, EqualsTheOpsItStandsFor) {
  std::mt19937 rng(71);
  const int64_t n_head = 8, n_head_kv = 2, head_dim = 64, half = 16, block_size = 16, n_blocks = 40;
  const DType kv = device_half(dev());
  const float eps = 1e-6f, scale = 1.0f / std::sqrt(float(head_dim));
  std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  const std::vector<std::vector<std::pair<int32_t, int32_t>>> batches = {
      {{1, 100}}, {{1, 100}, {1, 0}, {1, 37}}, {{5, 60}, {1, 20}, {3, 0}}};
  std::vector<float> freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) freq[size_t(i)] = float(std::pow(1e4, -double(i) / double(half)));
  const Tensor inv_freq = copy_on(dev(), host_f32({half}, freq));
  const Tensor q_norm = copy_on(dev(), host_f32({head_dim}, uniform(head_dim, rng, 0.5f, 1.5f)));
  const Tensor k_norm = copy_on(dev(), host_f32({head_dim}, uniform(head_dim, rng, 0.5f, 1.5f)));
  const std::vector<float> k0 = uniform(n_blocks * block_size * n_head_kv * head_dim, rng, -1, 1);
  const std::vector<float> v0 = uniform(n_blocks * block_size * n_head_kv * head_dim, rng, -1, 1);
  const Tensor k_host = host_as(kv, {n_blocks, block_size, n_head_kv, head_dim}, k0);
  const Tensor v_host = host_as(kv, {n_blocks, block_size, n_head_kv, head_dim}, v0);
  for (const auto& specs : batches)
    for (const bool gated : {false, true})
      for (const bool norms : {false, true})
        for (const int32_t window : {0, 50}) {
          SCOPED_TRACE(testing::Message() << specs.size() << " rows, gated " << gated << ", norms " << norms
                                          << ", window " << window);
          const Layout b = make_layout(dev(), specs, block_size, perm);
          const int64_t T = int64_t(b.positions.size());
          const int64_t width = ((gated ? 2 : 1) * n_head + 2 * n_head_kv) * head_dim;
          const Tensor qkv = copy_on(dev(), host_f32({T, width}, uniform(T * width, rng, -2, 2)));
          const Tensor qn = norms ? q_norm : Tensor(), kn = norms ? k_norm : Tensor();
          const Tensor q = nan_on(dev(), {T, n_head, head_dim});
          const Tensor gate = gated ? nan_on(dev(), {T, n_head * head_dim}) : Tensor();
          const int64_t ws = std::max<int64_t>(ops::attention_workspace(q, b.view()), 1);
          // The op.
          const ops::KvLayer cache{copy_on(dev(), k_host), copy_on(dev(), v_host)};
          const Tensor out = nan_on(dev(), {T, n_head, head_dim});
          ops::qkv_rope_attention(qkv, qn, kn, eps, b.view(), inv_freq, cache, scale, window, q, gate, out,
                                  empty_on(dev(), DType::F32, {ws}));
          // The ops it stands for.
          const ops::KvLayer want_cache{copy_on(dev(), k_host), copy_on(dev(), v_host)};
          const Tensor want_q = nan_on(dev(), {T, n_head, head_dim});
          const Tensor want_gate = gated ? nan_on(dev(), {T, n_head * head_dim}) : Tensor();
          const Tensor want = nan_on(dev(), {T, n_head, head_dim});
          ops::qkv_rope_store(qkv, qn, kn, eps, b.view(), inv_freq, want_cache, want_q, want_gate);
          ops::paged_attention(want_q, want_cache, b.view(), scale, window, want, empty_on(dev(), DType::F32, {ws}));
          if (gated) {
            const Tensor flat = want.reshape({T, n_head * head_dim});
            ops::sigmoid_mul(flat, want_gate, flat);
          }
          const std::vector<float> got = floats(out);
          for (float v : got) ASSERT_TRUE(std::isfinite(v));
          EXPECT_EQ(bytes(out), bytes(want)) << "out";
          EXPECT_EQ(bytes(cache.k), bytes(want_cache.k)) << "k cache";
          EXPECT_EQ(bytes(cache.v), bytes(want_cache.v)) << "v cache";
        }
}

INSTANTIATE_TEST_SUITE_P(Ops, QkvRopeAttention, ::testing::Values(Device::CPU, Device::CUDA), device_param_name);

// ---- block_tail ---------------------------------------------------------------------

using BlockTail = Fused;

// M = 1, 2 (CUDA fuses them) and 3, with and without the next projection; K
// of each matrix a multiple of 8 but not of 256.
TEST_P(BlockTail, EqualsTheOpsItStandsFor) {
  std::mt19937 rng(72);
  const int64_t Ka = 72, D = 64, F = 96, N = 40;
  const float eps = 1e-6f;
  auto weights = [&](int64_t rows, int64_t cols) {
    return copy_on(dev(), host_as(DType::BF16, {rows, cols}, uniform(rows * cols, rng, -0.2f, 0.2f)));
  };
  const Tensor w_out = weights(D, Ka), gate_up = weights(2 * F, D), down = weights(D, F), w_next = weights(N, D);
  const Tensor g = copy_on(dev(), host_f32({D}, uniform(D, rng, 0.5f, 1.5f)));
  const Tensor g_next = copy_on(dev(), host_f32({D}, uniform(D, rng, 0.5f, 1.5f)));
  for (const int64_t M : {1, 2, 3})
    for (const bool next : {false, true}) {
      SCOPED_TRACE(testing::Message() << "M " << M << ", next " << next);
      const Tensor a = copy_on(dev(), host_f32({M, Ka}, uniform(M * Ka, rng, -1, 1)));
      const Tensor x0 = host_f32({M, D}, uniform(M * D, rng, -1, 1));
      // The op.
      const Tensor x = copy_on(dev(), x0), out = nan_on(dev(), {M, D}), y = nan_on(dev(), {M, N});
      ops::block_tail(a, w_out, x, g, eps, gate_up, down, nan_on(dev(), {M, D}), nan_on(dev(), {M, 2 * F}),
                      nan_on(dev(), {M, F}), out, next ? w_next : Tensor(), next ? g_next : Tensor(),
                      next ? y : Tensor());
      // The ops it stands for.
      const Tensor want_x = copy_on(dev(), x0), want_out = nan_on(dev(), {M, D}), want_y = nan_on(dev(), {M, N});
      const Tensor h = nan_on(dev(), {M, D}), gu = nan_on(dev(), {M, 2 * F}), act = nan_on(dev(), {M, F});
      ops::linear(a, w_out, want_out);
      ops::add_rms_norm(want_x, want_out, g, eps, h);
      ops::linear(h, gate_up, gu);
      ops::swiglu_linear(gu, down, act, want_out);
      if (next) {
        ops::add_rms_norm(want_x, want_out, g_next, eps, h);
        ops::linear(h, w_next, want_y);
      }
      const bool fused = dev() == Device::CUDA && M <= 8;
      auto check = [&](const Tensor& got_t, const Tensor& want_t, const char* what) {
        const std::vector<float> got = floats(got_t), want = floats(want_t);
        float scale = 0;
        for (float v : want) scale = std::max(scale, std::fabs(v));
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_TRUE(std::isfinite(got[i])) << what << "[" << i << "]";
          if (fused)
            ASSERT_NEAR(got[i], want[i], 1e-5f * scale) << what << "[" << i << "]";
          else
            ASSERT_EQ(got[i], want[i]) << what << "[" << i << "]";
        }
      };
      check(x, want_x, "x");
      check(out, want_out, "out");
      if (next) check(y, want_y, "y_next");
    }
}

INSTANTIATE_TEST_SUITE_P(Ops, BlockTail, ::testing::Values(Device::CPU, Device::CUDA), device_param_name);

}  // namespace
}  // namespace augur
