// The op matrix: one test body per op over backend x dtype, against a plain
// scalar reference written here (double accumulation) from the rule ops.h
// documents, on inputs rounded to the dtype first (the reference sees the
// values the op sees), at the odd sizes 1, 31, 33 and 4097 of the dimension
// that makes sense for the op. Outputs start as NaN, so an element left
// unwritten fails.
//
// CUDA cases skip without a GPU; a (backend, dtype) an op does not take (see
// the checks in ops.cpp) skips with the reason. Activations are f32 on every
// device; the dtype is that of the weights, table or KV cache. Ops whose only
// operands are activations (norms, rope, delta rule, routing, sampling) run
// over the backends alone.
//
// Tolerances, by what is left to round once the inputs are representable:
//   exact: embedding, pass-through rope dims, the residual sum of add_rms_norm,
//     routing ids, sampled ids (up to the draw's own float slack, kDrawSlack);
//   f32-class: linear (x rounded to the weights' type makes every product
//     exact, on the tensor-core path too), norms, rope, delta rule, routing
//     weights, MoE experts;
//   the KV dtype: CUDA attention rounds scaled Q and the probabilities P to
//     the cache's type for the tensor cores (attention_tol).
// Each test records its worst error as a property (--gtest_output=json).
//
// The matrix is split by op: this file has linear, the norms, rope, paged
// attention and embedding; ops_matrix_hybrid_test.cpp the gated delta rule and
// MoE; ops_matrix_sampling_test.cpp sampling. Their shared helpers are in
// ops_matrix_common.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "backend/device.h"
#include "backend/ops.h"
#include "core/dtype.h"
#include "ops_matrix_common.h"

namespace augur {
namespace {

// ---- linear -------------------------------------------------------------------

// |y - ref| <= tol * sum_k |x w|. x is rounded to the weights' dtype, so every
// product is exact on every path; what is left is f32 accumulation.
double linear_tol(DType) { return 1e-5; }

using LinearMatrix = OnDeviceDtype;

// y = x · wᵀ for M, K, N over the sizes (the largest products left out).
TEST_P(LinearMatrix, MatchesScalarReference) {
  SKIP_IF_UNSUPPORTED("linear", dev(), dtype(), {DType::F32, DType::BF16}, {DType::BF16, DType::F16});
  std::mt19937 rng(11);
  constexpr int64_t kMaxMacs = 4600000;
  const double tol = linear_tol(dtype());
  int checked = 0;
  double worst = 0;  // |y - ref| / sum |x w|
  for (int64_t K : kSizes)
    for (int64_t N : kSizes) {
      if (N * K > kMaxMacs) continue;
      const std::vector<float> w = uniform(N * K, rng, -1, 1, dtype());
      const Tensor wd = on(dev(), host_tensor(dtype(), {N, K}, w));
      for (int64_t M : kSizes) {
        if (M * N * K > kMaxMacs) continue;
        SCOPED_TRACE(testing::Message() << "M=" << M << " K=" << K << " N=" << N);
        const std::vector<float> x = uniform(M * K, rng, -1, 1, dtype());
        const Tensor y = poisoned(dev(), {M, N});
        ops::linear(on(dev(), host_tensor(DType::F32, {M, K}, x)), wd, y);
        const std::vector<float> got = values(y);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n) {
            double ref = 0, mag = 0;
            for (int64_t k = 0; k < K; ++k) {
              const double p = double(x[size_t(m * K + k)]) * w[size_t(n * K + k)];
              ref += p;
              mag += std::fabs(p);
            }
            const float g = got[size_t(m * N + n)];
            worst = std::max(worst, std::fabs(double(g) - ref) / (mag + 1e-30));
            ASSERT_LE(std::fabs(double(g) - ref), tol * mag + 1e-30) << "y[" << m << ", " << n << "] " << g << " vs " << ref;
          }
        ++checked;
      }
    }
  EXPECT_GT(checked, 40);
  record_worst("worst_error", worst);
}

INSTANTIATE_ON_DEVICES_AND_DTYPES(LinearMatrix);

// ---- norms --------------------------------------------------------------------

// Rows of scale 1, 50 and 1e-3 (where eps counts).
std::vector<float> norm_input(int64_t M, int64_t D, std::mt19937& rng) {
  std::vector<float> x = uniform(M * D, rng, -1, 1);
  const float scale[] = {1.0f, 50.0f, 1e-3f};
  for (int64_t m = 0; m < M; ++m)
    for (int64_t i = 0; i < D; ++i) x[size_t(m * D + i)] *= scale[m % 3];
  return x;
}

// y = x / sqrt(mean(x²) + eps) * w, in double (LlamaRMSNorm).
void expect_rms_norm(const std::vector<float>& got, const std::vector<float>& x, const std::vector<float>& w,
                     int64_t M, int64_t D, float eps) {
  for (int64_t m = 0; m < M; ++m) {
    double ss = 0;
    for (int64_t i = 0; i < D; ++i) ss += double(x[size_t(m * D + i)]) * x[size_t(m * D + i)];
    const double inv = 1.0 / std::sqrt(ss / double(D) + eps);
    for (int64_t i = 0; i < D; ++i) {
      const double ref = double(x[size_t(m * D + i)]) * inv * w[size_t(i)];
      const float g = got[size_t(m * D + i)];
      ASSERT_LE(std::fabs(double(g) - ref), 1e-5 * (std::fabs(ref) + 1e-6)) << "[" << m << ", " << i << "] " << g
                                                                            << " vs " << ref;
    }
  }
}

using NormMatrix = OnDevice;

TEST_P(NormMatrix, RmsNormMatchesScalarReference) {
  std::mt19937 rng(21);
  const int64_t M = 3;
  const float eps = 1e-6f;
  for (int64_t D : kSizes) {
    SCOPED_TRACE(testing::Message() << "D=" << D);
    const std::vector<float> x = norm_input(M, D, rng), w = uniform(D, rng, -2, 2);
    const Tensor wd = on(dev(), host_tensor(DType::F32, {D}, w));
    const Tensor y = poisoned(dev(), {M, D});
    ops::rms_norm(on(dev(), host_tensor(DType::F32, {M, D}, x)), wd, eps, y);
    expect_rms_norm(values(y), x, w, M, D, eps);
    const Tensor xy = on(dev(), host_tensor(DType::F32, {M, D}, x));  // in place (y aliases x)
    ops::rms_norm(xy, wd, eps, xy);
    expect_rms_norm(values(xy), x, w, M, D, eps);
  }
}

// x += o (f32 sums, exact), then h = rms_norm(x) * w.
TEST_P(NormMatrix, AddRmsNormMatchesScalarReference) {
  std::mt19937 rng(22);
  const int64_t M = 3;
  const float eps = 1e-6f;
  for (int64_t D : kSizes) {
    SCOPED_TRACE(testing::Message() << "D=" << D);
    const std::vector<float> x = norm_input(M, D, rng), o = norm_input(M, D, rng), w = uniform(D, rng, -2, 2);
    std::vector<float> sum(x.size());
    for (size_t i = 0; i < x.size(); ++i) sum[i] = x[i] + o[i];
    const Tensor xd = on(dev(), host_tensor(DType::F32, {M, D}, x)), h = poisoned(dev(), {M, D});
    ops::add_rms_norm(xd, on(dev(), host_tensor(DType::F32, {M, D}, o)), on(dev(), host_tensor(DType::F32, {D}, w)),
                      eps, h);
    const std::vector<float> got_x = values(xd);
    for (size_t i = 0; i < sum.size(); ++i) ASSERT_EQ(got_x[i], sum[i]) << "x[" << i << "] after x += o";
    expect_rms_norm(values(h), sum, w, M, D, eps);
  }
}

INSTANTIATE_ON_DEVICES(NormMatrix);

// ---- rope ---------------------------------------------------------------------

using RopeMatrix = OnDevice;

// Rotate-half on the first 2 * len(inv_freq) dims of each head, angles
// pos * inv_freq in f32 (transformers' RotaryEmbedding), the rest passed
// through; full and partial rotary; tokens of two rows, one far along.
TEST_P(RopeMatrix, MatchesScalarReference) {
  std::mt19937 rng(31);
  struct Case {
    int64_t head_dim, half;
  };
  const int64_t n_head = 3;
  for (const Case c : {Case{64, 32}, Case{64, 8}, Case{20, 5}}) {
    std::vector<float> inv(static_cast<size_t>(c.half));
    for (int64_t i = 0; i < c.half; ++i) inv[size_t(i)] = float(std::pow(10000.0, -double(2 * i) / double(2 * c.half)));
    const Tensor inv_d = on(dev(), host_tensor(DType::F32, {c.half}, inv));
    for (int64_t T : kSizes) {
      SCOPED_TRACE(testing::Message() << "head_dim=" << c.head_dim << " rot_dim=" << 2 * c.half << " T=" << T);
      std::vector<RowSpec> specs = {{int32_t((T + 1) / 2), 7, {}}};
      if (T / 2 > 0) specs.push_back({int32_t(T / 2), int32_t(3000 + T), {}});
      const Batch b = make_batch(dev(), specs, 16);
      const std::vector<float> x = uniform(T * n_head * c.head_dim, rng, -1, 1);
      const Tensor xd = on(dev(), host_tensor(DType::F32, {T, n_head, c.head_dim}, x));
      ops::rope(xd, b.view(), inv_d);
      const std::vector<float> got = values(xd);
      for (int64_t t = 0; t < T; ++t) {
        const float pos = float(b.positions[size_t(t)]);
        for (int64_t h = 0; h < n_head; ++h) {
          const int64_t base = (t * n_head + h) * c.head_dim;
          for (int64_t i = 0; i < c.half; ++i) {
            const double angle = double(pos * inv[size_t(i)]);
            const double x1 = x[size_t(base + i)], x2 = x[size_t(base + c.half + i)];
            const double r1 = x1 * std::cos(angle) - x2 * std::sin(angle);
            const double r2 = x2 * std::cos(angle) + x1 * std::sin(angle);
            ASSERT_NEAR(got[size_t(base + i)], r1, 1e-5) << "token " << t << " head " << h << " dim " << i;
            ASSERT_NEAR(got[size_t(base + c.half + i)], r2, 1e-5) << "token " << t << " head " << h << " dim "
                                                                   << c.half + i;
          }
          for (int64_t i = 2 * c.half; i < c.head_dim; ++i)
            ASSERT_EQ(got[size_t(base + i)], x[size_t(base + i)]) << "pass-through dim " << i;
        }
      }
    }
  }
}

INSTANTIATE_ON_DEVICES(RopeMatrix);

// ---- paged attention ----------------------------------------------------------

// max |out - ref| (outputs are convex sums of V in [-1, 1]): f32 on the CPU;
// the CUDA kernels (prefill, and decode on tensor cores) round scaled Q and P
// to the cache's type. Measured on an H200: 2.0e-3 (BF16), 2.6e-4 (F16);
// decode with AUGUR_CUDA_DECODE_TC=0 (f32 kernel): 9e-8.
double attention_tol(DType kv) {
  switch (kv) {
    case DType::BF16: return 1e-2;
    case DType::F16: return 2e-3;
    default: return 1e-5;
  }
}

using AttentionMatrix = OnDeviceDtype;

// GQA over a paged cache whose every slot holds random K/V (so reading a
// key outside a token's window or row shows), rows of different lengths on
// shuffled blocks: a decode batch (a token a row) and a mixed one (a chunk
// continuing a history, a decode row, a short first chunk), context up to L,
// windows unlimited, 17 and 1.
TEST_P(AttentionMatrix, PagedMatchesScalarReference) {
  SKIP_IF_UNSUPPORTED("paged_attention (KV cache)", dev(), dtype(), {DType::F32}, {DType::BF16, DType::F16});
  std::mt19937 rng(41);
  const int64_t n_head = 8, n_head_kv = 2, head_dim = 64, block_size = 16, group = n_head / n_head_kv;
  const int64_t kv_dim = n_head_kv * head_dim;
  const float scale = 1.0f / std::sqrt(float(head_dim));
  const double tol = attention_tol(dtype());
  double worst[2] = {0, 0};  // max |out - ref|: mixed, decode batches
  for (int64_t L : kSizes)
    for (bool decode : {true, false}) {
      const int32_t l = int32_t(L), mid = int32_t((L - 1) / 2), chunk = int32_t(std::min<int64_t>(L, 33));
      std::vector<RowSpec> specs;
      if (decode)
        specs = {{1, l - 1, {}}, {1, mid, {}}, {1, 0, {}}};
      else
        specs = {{chunk, l - chunk, {}}, {1, mid, {}}, {std::min(l, 3), 0, {}}};
      int64_t need = 0;
      for (const auto& s : specs) need += (int64_t(s.pos0) + s.n_tokens + block_size - 1) / block_size;
      const int64_t n_blocks = need + 3;
      std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      size_t next = 0;
      for (auto& s : specs)
        for (int64_t i = 0; i < (int64_t(s.pos0) + s.n_tokens + block_size - 1) / block_size; ++i)
          s.blocks.push_back(perm[next++]);
      const Batch b = make_batch(dev(), specs, block_size);
      const int64_t T = int64_t(b.positions.size());

      const std::vector<float> kc = uniform(n_blocks * block_size * kv_dim, rng, -1, 1, dtype());
      const std::vector<float> vc = uniform(n_blocks * block_size * kv_dim, rng, -1, 1, dtype());
      const ops::KvLayer cache{on(dev(), host_tensor(dtype(), {n_blocks, block_size, n_head_kv, head_dim}, kc)),
                               on(dev(), host_tensor(dtype(), {n_blocks, block_size, n_head_kv, head_dim}, vc))};
      const std::vector<float> q = uniform(T * n_head * head_dim, rng, -2, 2, dtype());
      const Tensor qd = on(dev(), host_tensor(DType::F32, {T, n_head, head_dim}, q));
      const int64_t ws = ops::attention_workspace(qd, b.view());
      const Tensor workspace = empty_on(dev(), DType::F32, {std::max<int64_t>(ws, 1)});
      for (int32_t window : {0, 17, 1}) {
        SCOPED_TRACE(testing::Message() << "L=" << L << (decode ? " decode" : " mixed") << " window=" << window);
        const Tensor out = poisoned(dev(), {T, n_head, head_dim});
        ops::paged_attention(qd, cache, b.view(), scale, window, out, workspace);
        const std::vector<float> got = values(out);
        // eager_attention_forward, token by token.
        std::vector<double> score, acc(static_cast<size_t>(head_dim));
        for (const auto& row : b.rows)
          for (int32_t i = 0; i < row.n_tokens; ++i) {
            const int64_t t = row.token_begin + i, p = row.pos0 + i;
            const int64_t lo = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
            for (int64_t h = 0; h < n_head; ++h) {
              const float* qv = q.data() + (t * n_head + h) * head_dim;
              const int64_t kvh = h / group;
              auto at = [&](int64_t j) {
                return (int64_t(row.block_table[size_t(j / block_size)]) * block_size + j % block_size) * kv_dim +
                       kvh * head_dim;
              };
              score.assign(size_t(p - lo + 1), 0.0);
              double mx = -INFINITY;
              for (int64_t j = lo; j <= p; ++j) {
                double s = 0;
                for (int64_t d = 0; d < head_dim; ++d) s += double(qv[d]) * kc[size_t(at(j) + d)];
                score[size_t(j - lo)] = s * scale;
                mx = std::max(mx, s * scale);
              }
              double sum = 0;
              for (double& s : score) sum += (s = std::exp(s - mx));
              std::fill(acc.begin(), acc.end(), 0.0);
              for (int64_t j = lo; j <= p; ++j)
                for (int64_t d = 0; d < head_dim; ++d) acc[size_t(d)] += score[size_t(j - lo)] / sum * vc[size_t(at(j) + d)];
              for (int64_t d = 0; d < head_dim; ++d) {
                const float g = got[size_t((t * n_head + h) * head_dim + d)];
                worst[decode] = std::max(worst[decode], std::fabs(double(g) - acc[size_t(d)]));
                ASSERT_LE(std::fabs(double(g) - acc[size_t(d)]), tol)
                    << "token " << t << " (position " << p << ") head " << h << " dim " << d << ": " << g << " vs "
                    << acc[size_t(d)];
              }
            }
          }
      }
    }
  record_worst("worst_error_mixed", worst[0]);
  record_worst("worst_error_decode", worst[1]);
}

INSTANTIATE_ON_DEVICES_AND_DTYPES(AttentionMatrix);

// ---- embedding ----------------------------------------------------------------

using EmbeddingMatrix = OnDeviceDtype;

// out[t, :] = table[ids[t], :], exactly (widening to f32 is exact); the
// first and last ids and repeats among them.
TEST_P(EmbeddingMatrix, GathersRowsExactly) {
  SKIP_IF_UNSUPPORTED("embedding (table)", dev(), dtype(), {DType::F32, DType::BF16, DType::F16},
                      {DType::BF16, DType::F16});
  std::mt19937 rng(51);
  struct Case {
    int64_t n_vocab, d_model;
  };
  for (const Case c : {Case{4097, 33}, Case{33, 4097}, Case{1, 31}}) {
    const std::vector<float> table = uniform(c.n_vocab * c.d_model, rng, -4, 4, dtype());
    const Tensor td = on(dev(), host_tensor(dtype(), {c.n_vocab, c.d_model}, table));
    for (int64_t T : kSizes) {
      SCOPED_TRACE(testing::Message() << "n_vocab=" << c.n_vocab << " d_model=" << c.d_model << " T=" << T);
      std::uniform_int_distribution<int32_t> pick(0, int32_t(c.n_vocab - 1));
      std::vector<int32_t> ids(static_cast<size_t>(T));
      for (auto& id : ids) id = pick(rng);
      ids[0] = int32_t(c.n_vocab - 1);
      if (T > 2) ids[1] = ids[0], ids[size_t(T - 1)] = 0;
      const Batch b = make_batch(dev(), {{int32_t(T), 0, {}}}, 16, ids);
      const Tensor out = poisoned(dev(), {T, c.d_model});
      ops::embedding(td, ids, out, b.device_ptr());
      const std::vector<float> got = values(out);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < c.d_model; ++i)
          ASSERT_EQ(got[size_t(t * c.d_model + i)], table[size_t(ids[size_t(t)] * c.d_model + i)])
              << "token " << t << " (id " << ids[size_t(t)] << ") dim " << i;
    }
  }
}

INSTANTIATE_ON_DEVICES_AND_DTYPES(EmbeddingMatrix);

}  // namespace
}  // namespace augur
