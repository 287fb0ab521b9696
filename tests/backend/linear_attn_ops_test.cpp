// Op tests of the linear-attention and MoE ops: each CPU kernel against a
// plain scalar (double) reference on odd sizes; the chunked gated delta rule
// against the recurrent one; splitting a row's tokens across calls (state
// carried in the slot) and batching rows change nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/ops.h"
#include "core/error.h"

namespace augur {
namespace {

Tensor random_tensor(std::initializer_list<int64_t> shape, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::empty(DType::F32, shape);
  std::uniform_real_distribution<float> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng);
  return t;
}

Tensor copy_of(const Tensor& t) {
  Tensor c = Tensor::empty(t.dtype(), t.shape().data(), t.ndim());
  std::memcpy(c.raw(), t.raw(), t.nbytes());
  return c;
}

float max_abs_diff(const float* a, const float* b, int64_t n) {
  float m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}
float max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  return max_abs_diff(a.data<float>(), b.data<float>(), a.numel());
}
bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Rows of the given lengths back to back, slot i for row i (or `slots`).
std::vector<ops::RecurrentRow> make_rows(const std::vector<int32_t>& lens, std::vector<int32_t> slots = {}) {
  std::vector<ops::RecurrentRow> rows;
  int32_t begin = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    rows.push_back({begin, lens[i], slots.empty() ? int32_t(i) : slots[i]});
    begin += lens[i];
  }
  return rows;
}

// ---- causal conv1d ------------------------------------------------------------

// out[t, c] = act(sum_j w[c, j] * in[t - (K-1) + j, c]) over tail ++ x, in double.
std::vector<double> conv_reference(const std::vector<double>& tail, const float* x, int64_t n, int64_t C,
                                   const float* w, int64_t K, bool silu) {
  std::vector<double> out(static_cast<size_t>(n * C));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t m = t - (K - 1) + j;
        acc += double(w[c * K + j]) * (m >= 0 ? double(x[m * C + c]) : tail[size_t((K - 1 + m) * C + c)]);
      }
      out[size_t(t * C + c)] = silu ? acc / (1.0 + std::exp(-acc)) : acc;
    }
  return out;
}

TEST(CausalConv1d, MatchesScalarReferenceAndCarriesItsTail) {
  std::mt19937 rng(1);
  for (int64_t K : {1, 2, 4}) {
    for (bool silu : {false, true}) {
      const int64_t C = 37;
      const std::vector<int32_t> lens = {1, 33, 2, 7};
      const int64_t T = 43;
      Tensor x = random_tensor({T, C}, rng);
      Tensor w = random_tensor({C, K}, rng);
      Tensor state = random_tensor({5, K - 1, C}, rng);  // a non-empty history in every slot
      const Tensor state0 = copy_of(state);
      Tensor out = Tensor::empty(DType::F32, {T, C});
      const auto rows = make_rows(lens, {3, 0, 4, 1});
      ops::causal_conv1d(x, w, rows, state, silu, out);
      for (const auto& r : rows) {
        std::vector<double> tail(static_cast<size_t>((K - 1) * C));
        for (size_t i = 0; i < tail.size(); ++i) tail[i] = state0.data<float>()[r.slot * (K - 1) * C + int64_t(i)];
        auto want = conv_reference(tail, x.data<float>() + r.token_begin * C, r.n_tokens, C, w.data<float>(), K, silu);
        for (int64_t i = 0; i < r.n_tokens * C; ++i)
          ASSERT_NEAR(out.data<float>()[r.token_begin * C + i], want[size_t(i)], 1e-5) << "K " << K << " row slot " << r.slot;
        // The slot now holds the last K-1 inputs of tail ++ x.
        for (int64_t p = 0; p < K - 1; ++p)
          for (int64_t c = 0; c < C; ++c) {
            const int64_t m = r.n_tokens - (K - 1) + p;
            const float expect = m >= 0 ? x.data<float>()[(r.token_begin + m) * C + c]
                                        : state0.data<float>()[(r.slot * (K - 1) + (K - 1 + m)) * C + c];
            ASSERT_EQ(state.data<float>()[(r.slot * (K - 1) + p) * C + c], expect);
          }
      }
      // Feeding row 1's 33 tokens as 1 + 2 + 30 through slot 0 gives the same bits.
      Tensor st2 = copy_of(state0);
      Tensor out2 = Tensor::empty(DType::F32, {T, C});
      int32_t at = rows[1].token_begin;
      for (int32_t piece : {1, 2, 30}) {
        Tensor xs = Tensor::empty(DType::F32, {piece, C});
        std::memcpy(xs.raw(), x.data<float>() + at * C, size_t(piece * C) * 4);
        Tensor os = Tensor::empty(DType::F32, {piece, C});
        const ops::RecurrentRow one[] = {{0, piece, 0}};
        ops::causal_conv1d(xs, w, one, st2, silu, os);
        std::memcpy(out2.data<float>() + at * C, os.raw(), os.nbytes());
        at += piece;
      }
      EXPECT_EQ(0, std::memcmp(out2.data<float>() + rows[1].token_begin * C,
                               out.data<float>() + rows[1].token_begin * C, size_t(33 * C) * 4));
      EXPECT_EQ(0, std::memcmp(st2.raw(), state.raw(), size_t((K - 1) * C) * 4));  // slot 0
    }
  }
}

// ---- small element-wise ops ------------------------------------------------------

TEST(L2Norm, MatchesScalarReference) {
  std::mt19937 rng(2);
  for (int64_t D : {1, 7, 128}) {
    Tensor x = random_tensor({31, D}, rng);
    Tensor y = Tensor::empty(DType::F32, {31, D});
    ops::l2norm(x, 1e-6f, y);
    for (int64_t m = 0; m < 31; ++m) {
      double ss = 0;
      for (int64_t i = 0; i < D; ++i) ss += double(x.data<float>()[m * D + i]) * x.data<float>()[m * D + i];
      for (int64_t i = 0; i < D; ++i)
        ASSERT_NEAR(y.data<float>()[m * D + i], x.data<float>()[m * D + i] / std::sqrt(ss + 1e-6), 1e-6);
    }
    ops::l2norm(x, 1e-6f, x);  // in place
    EXPECT_TRUE(bit_equal(x, y));
  }
}

TEST(DeltaRuleGates, MatchReferenceIncludingSoftplusThreshold) {
  std::mt19937 rng(3);
  const int64_t T = 9, H = 5;
  Tensor a = random_tensor({T, H}, rng, -30.0f, 30.0f);  // both sides of softplus' threshold 20
  Tensor b = random_tensor({T, H}, rng, -8.0f, 8.0f);
  Tensor a_log = random_tensor({H}, rng, -4.6f, 2.8f);
  Tensor dt_bias = random_tensor({H}, rng, -1.0f, 1.0f);
  Tensor g = Tensor::empty(DType::F32, {T, H}), beta = Tensor::empty(DType::F32, {T, H});
  ops::delta_rule_gates(a, b, a_log, dt_bias, g, beta);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const double x = double(a.data<float>()[t * H + h]) + dt_bias.data<float>()[h];
      const double sp = x > 20 ? x : std::log1p(std::exp(x));
      const double want_g = -std::exp(double(a_log.data<float>()[h])) * sp;
      EXPECT_NEAR(g.data<float>()[t * H + h], want_g, 1e-5 * std::max(1.0, std::fabs(want_g)));
      EXPECT_NEAR(beta.data<float>()[t * H + h], 1.0 / (1.0 + std::exp(-double(b.data<float>()[t * H + h]))), 1e-6);
    }
}

TEST(GatedRmsNorm, MatchesScalarReference) {
  std::mt19937 rng(4);
  const int64_t M = 33, D = 17;
  Tensor x = random_tensor({M, D}, rng), z = random_tensor({M, D}, rng, -4, 4), w = random_tensor({D}, rng);
  Tensor y = Tensor::empty(DType::F32, {M, D});
  ops::gated_rms_norm(x, z, w, 1e-6f, y);
  for (int64_t m = 0; m < M; ++m) {
    double ss = 0;
    for (int64_t i = 0; i < D; ++i) ss += double(x.data<float>()[m * D + i]) * x.data<float>()[m * D + i];
    const double inv = 1.0 / std::sqrt(ss / double(D) + 1e-6);
    for (int64_t i = 0; i < D; ++i) {
      const double zz = z.data<float>()[m * D + i];
      const double want = w.data<float>()[i] * x.data<float>()[m * D + i] * inv * zz / (1 + std::exp(-zz));
      ASSERT_NEAR(y.data<float>()[m * D + i], want, 1e-5);
    }
  }
}

// z read in place as a column slice of a wider tensor (a projection's gate
// columns, one row a token of n heads) gives the bits of a contiguous z.
TEST(GatedRmsNorm, ReadsZAsAColumnSliceInPlace) {
  std::mt19937 rng(14);
  const int64_t T = 5, H = 3, D = 8, P = 41, z0 = 7;
  Tensor x = random_tensor({T * H, D}, rng), proj = random_tensor({T, P}, rng, -4, 4), w = random_tensor({D}, rng);
  Tensor z = Tensor::empty(DType::F32, {T * H, D});
  ops::slice_cols(proj, z0, z.reshape({T, H * D}));
  Tensor want = Tensor::empty(DType::F32, {T * H, D}), got = Tensor::empty(DType::F32, {T * H, D});
  ops::gated_rms_norm(x, z, w, 1e-6f, want);
  ops::gated_rms_norm(x, proj.slice_cols(z0, z0 + H * D), w, 1e-6f, got);
  EXPECT_TRUE(bit_equal(got, want));
  EXPECT_THROW(ops::gated_rms_norm(x, proj.slice_cols(z0, z0 + H * D - 1), w, 1e-6f, got), Error);
}

// delta_rule_inputs is the ops it replaces, bit for bit: slices of the
// projection, the conv (tails carried), slices of its output, l2norm, gates.
// Only its rows' tokens are written; a row left out keeps what it had.
TEST(DeltaRuleInputs, EqualsTheOpsItFuses) {
  std::mt19937 rng(15);
  const int64_t Hk = 2, H = 4, dk = 16, dv = 8, K = 4, C = 2 * Hk * dk + H * dv, V = H * dv, P = C + V + 2 * H;
  const auto all = make_rows({3, 70, 5, 1}, {2, 0, 3, 1});
  const std::vector<ops::RecurrentRow> rows = {all[0], all[1], all[3]};  // row 2 is someone else's
  const int64_t T = 79;
  Tensor proj = random_tensor({T, P}, rng, -2, 2), w = random_tensor({C, K}, rng);
  Tensor a_log = random_tensor({H}, rng), dt_bias = random_tensor({H}, rng);
  Tensor state0 = random_tensor({4, K - 1, C}, rng);

  Tensor st_want = copy_of(state0), mixed = Tensor::empty(DType::F32, {T, C}), conv = Tensor::empty(DType::F32, {T, C});
  ops::slice_cols(proj, 0, mixed);
  ops::causal_conv1d(mixed, w, rows, st_want, true, conv);
  Tensor q_want = Tensor::empty(DType::F32, {T, Hk, dk}), k_want = Tensor::empty(DType::F32, {T, Hk, dk});
  Tensor v_want = Tensor::empty(DType::F32, {T, H, dv});
  ops::slice_cols(conv, 0, q_want.reshape({T, Hk * dk}));
  ops::slice_cols(conv, Hk * dk, k_want.reshape({T, Hk * dk}));
  ops::slice_cols(conv, 2 * Hk * dk, v_want.reshape({T, V}));
  ops::l2norm(q_want.reshape({T * Hk, dk}), 1e-6f, q_want.reshape({T * Hk, dk}));
  ops::l2norm(k_want.reshape({T * Hk, dk}), 1e-6f, k_want.reshape({T * Hk, dk}));
  Tensor b = Tensor::empty(DType::F32, {T, H}), a = Tensor::empty(DType::F32, {T, H});
  ops::slice_cols(proj, C + V, b);
  ops::slice_cols(proj, C + V + H, a);
  Tensor g_want = Tensor::empty(DType::F32, {T, H}), beta_want = Tensor::empty(DType::F32, {T, H});
  ops::delta_rule_gates(a, b, a_log, dt_bias, g_want, beta_want);

  auto filled = [](std::initializer_list<int64_t> shape) {
    Tensor t = Tensor::empty(DType::F32, shape);
    std::fill_n(t.data<float>(), t.numel(), 7.0f);
    return t;
  };
  Tensor st = copy_of(state0), q = filled({T, Hk, dk}), k = filled({T, Hk, dk}), v = filled({T, H, dv});
  Tensor g = filled({T, H}), beta = filled({T, H});
  ops::delta_rule_inputs(proj, C + V, w, a_log, dt_bias, 1e-6f, rows, st, q, k, v, g, beta);
  EXPECT_TRUE(bit_equal(st, st_want)) << "conv tails";
  const std::vector<std::pair<const Tensor*, const Tensor*>> outs = {
      {&q, &q_want}, {&k, &k_want}, {&v, &v_want}, {&g, &g_want}, {&beta, &beta_want}};
  for (const auto& [got, want] : outs) {
    const int64_t width = got->numel() / T;
    for (int64_t t = 0; t < T; ++t) {
      const bool mine = t < 73 || t == 78;  // rows 0, 1 and 3
      for (int64_t i = 0; i < width; ++i) {
        const float x = got->data<float>()[t * width + i];
        if (mine)
          ASSERT_EQ(x, want->data<float>()[t * width + i]) << "token " << t << " element " << i;
        else
          ASSERT_EQ(x, 7.0f) << "token " << t << " of a row left out was written";
      }
    }
  }
  EXPECT_THROW(ops::delta_rule_inputs(proj, C + V + 1, w, a_log, dt_bias, 1e-6f, rows, st, q, k, v, g, beta), Error)
      << "b and a past the projection's end";
}

TEST(SigmoidMul, ElementwiseAndPerRow) {
  std::mt19937 rng(5);
  Tensor x = random_tensor({7, 33}, rng), g = random_tensor({7, 33}, rng, -6, 6), r = random_tensor({7, 1}, rng, -6, 6);
  Tensor y = Tensor::empty(DType::F32, {7, 33});
  ops::sigmoid_mul(x, g, y);
  for (int64_t i = 0; i < x.numel(); ++i)
    ASSERT_NEAR(y.data<float>()[i], x.data<float>()[i] / (1 + std::exp(-double(g.data<float>()[i]))), 1e-6);
  ops::sigmoid_mul(x, r, y);
  for (int64_t i = 0; i < x.numel(); ++i)
    ASSERT_NEAR(y.data<float>()[i], x.data<float>()[i] / (1 + std::exp(-double(r.data<float>()[i / 33]))), 1e-6);
  EXPECT_THROW(ops::sigmoid_mul(x, random_tensor({7, 2}, rng), y), Error);
}

TEST(SliceCols, CopiesABlockOfColumns) {
  std::mt19937 rng(6);
  Tensor x = random_tensor({5, 31}, rng), y = Tensor::empty(DType::F32, {5, 9});
  ops::slice_cols(x, 20, y);
  for (int64_t m = 0; m < 5; ++m)
    for (int64_t i = 0; i < 9; ++i) ASSERT_EQ(y.data<float>()[m * 9 + i], x.data<float>()[m * 31 + 20 + i]);
  try {
    ops::slice_cols(x, 23, y);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("[slice_cols]", 0), 0u) << e.what();
  }
}

// ---- gated delta rule --------------------------------------------------------------

struct DeltaInputs {
  int64_t T, Hk, H, dk, dv;
  Tensor q, k, v, g, beta;
};

DeltaInputs delta_inputs(int64_t T, int64_t Hk, int64_t H, int64_t dk, int64_t dv, std::mt19937& rng) {
  DeltaInputs in{T, Hk, H, dk, dv, random_tensor({T, Hk, dk}, rng), random_tensor({T, Hk, dk}, rng),
                 random_tensor({T, H, dv}, rng), random_tensor({T, H}, rng, -3.0f, 0.0f),
                 random_tensor({T, H}, rng, 0.0f, 1.0f)};
  ops::l2norm(in.q.reshape({T * Hk, dk}), 1e-6f, in.q.reshape({T * Hk, dk}));
  ops::l2norm(in.k.reshape({T * Hk, dk}), 1e-6f, in.k.reshape({T * Hk, dk}));
  // A few tokens with almost no decay and some with a very strong one.
  for (int64_t i = 0; i < T * H; i += 7) in.g.data<float>()[i] = -1e-4f;
  for (int64_t i = 3; i < T * H; i += 11) in.g.data<float>()[i] = -40.0f;
  return in;
}

// The recurrence in double, for rows over the given initial states.
void delta_reference(const DeltaInputs& in, float scale, std::span<const ops::RecurrentRow> rows,
                     std::vector<double>& state, std::vector<double>& out) {
  const int64_t dk = in.dk, dv = in.dv, H = in.H, group = in.H / in.Hk;
  out.assign(size_t(in.T * H * dv), 0.0);
  for (const auto& r : rows)
    for (int64_t h = 0; h < H; ++h) {
      double* S = state.data() + (r.slot * H + h) * dk * dv;
      for (int64_t i = 0; i < r.n_tokens; ++i) {
        const int64_t t = r.token_begin + i, hk = h / group;
        const float* q = in.q.data<float>() + (t * in.Hk + hk) * dk;
        const float* k = in.k.data<float>() + (t * in.Hk + hk) * dk;
        const float* v = in.v.data<float>() + (t * H + h) * dv;
        const double decay = std::exp(double(in.g.data<float>()[t * H + h])), b = in.beta.data<float>()[t * H + h];
        for (int64_t x = 0; x < dk * dv; ++x) S[x] *= decay;
        for (int64_t j = 0; j < dv; ++j) {
          double mem = 0;
          for (int64_t a = 0; a < dk; ++a) mem += S[a * dv + j] * k[a];
          const double delta = (v[j] - mem) * b;
          for (int64_t a = 0; a < dk; ++a) S[a * dv + j] += k[a] * delta;
        }
        for (int64_t j = 0; j < dv; ++j) {
          double o = 0;
          for (int64_t a = 0; a < dk; ++a) o += S[a * dv + j] * double(q[a]) * scale;
          out[size_t((t * H + h) * dv + j)] = o;
        }
      }
    }
}

double max_abs_diff(const Tensor& a, const std::vector<double>& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(double(a.data<float>()[i]) - b[size_t(i)]));
  return m;
}

class DeltaRule : public ::testing::TestWithParam<std::vector<int32_t>> {};

TEST_P(DeltaRule, RecurrentAndChunkedMatchTheScalarRecurrence) {
  const std::vector<int32_t> lens = GetParam();
  int64_t T = 0;
  for (int32_t n : lens) T += n;
  std::mt19937 rng(7 + uint32_t(T));
  const int64_t Hk = 2, H = 6, dk = 7, dv = 9;  // odd sizes; each key head serves 3 value heads
  DeltaInputs in = delta_inputs(T, Hk, H, dk, dv, rng);
  const auto rows = make_rows(lens);
  const int64_t n_slots = int64_t(lens.size()) + 1;
  Tensor state0 = random_tensor({n_slots, H, dk, dv}, rng, -0.5f, 0.5f);  // rows continue a history
  const float scale = 1.0f / std::sqrt(float(dk));

  std::vector<double> ref_state(state0.data<float>(), state0.data<float>() + state0.numel()), ref_out;
  delta_reference(in, scale, rows, ref_state, ref_out);

  Tensor st_r = copy_of(state0), out_r = Tensor::empty(DType::F32, {T, H, dv});
  ops::gated_delta_rule_recurrent(in.q, in.k, in.v, in.g, in.beta, scale, rows, st_r, out_r);
  EXPECT_LT(max_abs_diff(out_r, ref_out), 2e-5);
  EXPECT_LT(max_abs_diff(st_r, ref_state), 2e-5);

  for (int64_t chunk : {64, 5, 1}) {
    Tensor st_c = copy_of(state0), out_c = Tensor::empty(DType::F32, {T, H, dv});
    ops::gated_delta_rule_chunked(in.q, in.k, in.v, in.g, in.beta, scale, chunk, rows, st_c, out_c);
    EXPECT_LT(max_abs_diff(out_c, ref_out), 1e-4) << "chunk " << chunk;
    EXPECT_LT(max_abs_diff(st_c, ref_state), 1e-4) << "chunk " << chunk;
    EXPECT_LT(max_abs_diff(out_c, out_r), 1e-4) << "chunked vs recurrent, chunk " << chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(RowLengths, DeltaRule,
                         ::testing::Values(std::vector<int32_t>{1}, std::vector<int32_t>{31},
                                           std::vector<int32_t>{33}, std::vector<int32_t>{64},
                                           std::vector<int32_t>{65}, std::vector<int32_t>{130},
                                           std::vector<int32_t>{1, 64, 3, 129, 2}));

TEST(DeltaRuleExact, SplittingARowAndBatchingRowsChangeNoBits) {
  std::mt19937 rng(8);
  const int64_t Hk = 1, H = 4, dk = 16, dv = 8, T = 150;
  DeltaInputs in = delta_inputs(T, Hk, H, dk, dv, rng);
  const float scale = 0.25f;
  Tensor state0 = random_tensor({3, H, dk, dv}, rng, -0.5f, 0.5f);
  using Fn = void (*)(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, float,
                      std::span<const ops::RecurrentRow>, const Tensor&, const Tensor&);
  auto chunked64 = [](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& b, float s,
                      std::span<const ops::RecurrentRow> rows, const Tensor& st, const Tensor& out) {
    ops::gated_delta_rule_chunked(q, k, v, g, b, s, 64, rows, st, out);
  };
  auto recurrent = [](const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& b, float s,
                      std::span<const ops::RecurrentRow> rows, const Tensor& st, const Tensor& out) {
    ops::gated_delta_rule_recurrent(q, k, v, g, b, s, rows, st, out);
  };
  for (Fn fn : {Fn(+recurrent), Fn(+chunked64)}) {
    // Three rows in one call...
    const auto rows = make_rows({50, 1, 99}, {2, 0, 1});
    Tensor st = copy_of(state0), out = Tensor::empty(DType::F32, {T, H, dv});
    fn(in.q, in.k, in.v, in.g, in.beta, scale, rows, st, out);
    // ... equal each row alone, in a call of its own.
    for (const auto& r : rows) {
      Tensor st1 = copy_of(state0), out1 = Tensor::empty(DType::F32, {T, H, dv});
      fn(in.q, in.k, in.v, in.g, in.beta, scale, std::span<const ops::RecurrentRow>(&r, 1), st1, out1);
      const size_t off = size_t(r.token_begin * H * dv), n = size_t(r.n_tokens * H * dv);
      EXPECT_EQ(0, std::memcmp(out.data<float>() + off, out1.data<float>() + off, n * 4));
      const size_t soff = size_t(r.slot * H * dk * dv), sn = size_t(H * dk * dv);
      EXPECT_EQ(0, std::memcmp(st.data<float>() + soff, st1.data<float>() + soff, sn * 4));
    }
  }
  // The recurrent form fed one token at a time equals it fed the whole row.
  const ops::RecurrentRow whole[] = {{0, 20, 0}};
  Tensor st = copy_of(state0), out = Tensor::empty(DType::F32, {T, H, dv});
  ops::gated_delta_rule_recurrent(in.q, in.k, in.v, in.g, in.beta, scale, whole, st, out);
  Tensor st1 = copy_of(state0), out1 = Tensor::empty(DType::F32, {T, H, dv});
  for (int32_t t = 0; t < 20; ++t) {
    const ops::RecurrentRow one[] = {{t, 1, 0}};
    ops::gated_delta_rule_recurrent(in.q, in.k, in.v, in.g, in.beta, scale, one, st1, out1);
  }
  EXPECT_EQ(0, std::memcmp(out.raw(), out1.raw(), size_t(20 * H * dv) * 4));
  EXPECT_TRUE(bit_equal(st, st1));
}

TEST(DeltaRuleChecks, BadArgumentsAreErrorsNamingTheOp) {
  std::mt19937 rng(9);
  DeltaInputs in = delta_inputs(4, 2, 4, 8, 8, rng);
  Tensor st = Tensor::empty(DType::F32, {2, 4, 8, 8}), out = Tensor::empty(DType::F32, {4, 4, 8});
  auto expect_error = [](auto&& fn, const char* op) {
    try {
      fn();
      FAIL() << "expected an error from " << op;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(std::string("[") + op + "]", 0), 0u) << e.what();
    }
  };
  const std::vector<ops::RecurrentRow> shared_slot = {{0, 2, 1}, {2, 2, 1}};
  expect_error([&] { ops::gated_delta_rule_recurrent(in.q, in.k, in.v, in.g, in.beta, 1, shared_slot, st, out); },
               "gated_delta_rule_recurrent");
  const std::vector<ops::RecurrentRow> bad_slot = {{0, 4, 2}};
  expect_error([&] { ops::gated_delta_rule_chunked(in.q, in.k, in.v, in.g, in.beta, 1, 64, bad_slot, st, out); },
               "gated_delta_rule_chunked");
  Tensor wrong_state = Tensor::empty(DType::F32, {2, 4, 8, 7});
  const std::vector<ops::RecurrentRow> ok = {{0, 4, 0}};
  expect_error([&] { ops::gated_delta_rule_recurrent(in.q, in.k, in.v, in.g, in.beta, 1, ok, wrong_state, out); },
               "gated_delta_rule_recurrent");
  Tensor x = Tensor::empty(DType::F32, {4, 6}), w = Tensor::empty(DType::F32, {6, 4});
  Tensor cs = Tensor::empty(DType::F32, {1, 3, 6});
  expect_error([&] { ops::causal_conv1d(x, w, ok, cs, true, x); }, "causal_conv1d");  // out aliases x
}

// ---- mixture of experts ---------------------------------------------------------------

TEST(MoeRoute, SoftmaxTopKAndRenormalisation) {
  const int64_t T = 3, E = 6, k = 2;
  Tensor logits = Tensor::empty(DType::F32, {T, E});
  const float vals[T][E] = {{0.1f, 2.0f, -1.0f, 1.5f, 0.0f, 0.3f},
                            {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f},  // ties go to the lower id
                            {-3.0f, 0.0f, 4.0f, 0.0f, 4.5f, 1.0f}};
  std::memcpy(logits.raw(), vals, sizeof vals);
  for (bool normalize : {false, true}) {
    Tensor w = Tensor::empty(DType::F32, {T, k});
    Tensor ids = Tensor::empty(DType::I32, {T, k});
    ops::moe_route(logits, k, normalize, w, ids);
    const int32_t want_ids[T][k] = {{1, 3}, {0, 1}, {4, 2}};
    for (int64_t t = 0; t < T; ++t) {
      double sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += std::exp(double(vals[t][e]));
      double kept = 0;
      for (int64_t i = 0; i < k; ++i) kept += std::exp(double(vals[t][want_ids[t][i]])) / sum;
      for (int64_t i = 0; i < k; ++i) {
        EXPECT_EQ(ids.data<int32_t>()[t * k + i], want_ids[t][i]) << "token " << t;
        const double p = std::exp(double(vals[t][want_ids[t][i]])) / sum;
        EXPECT_NEAR(w.data<float>()[t * k + i], normalize ? p / kept : p, 1e-6);
      }
    }
  }
}

TEST(GatherScatter, RowsMoveAndAddInOrder) {
  std::mt19937 rng(10);
  Tensor x = random_tensor({5, 3}, rng);
  const std::vector<int32_t> idx = {4, 0, 4};
  Tensor g = Tensor::empty(DType::F32, {3, 3});
  ops::gather_rows(x, idx, g);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(g.data<float>()[i * 3 + j], x.data<float>()[idx[size_t(i)] * 3 + j]);
  Tensor out = Tensor::empty(DType::F32, {5, 3});
  const std::vector<float> scale = {0.5f, 2.0f, -1.0f};
  ops::scatter_add_rows(g, idx, scale, out);
  for (int64_t j = 0; j < 3; ++j) {
    EXPECT_EQ(out.data<float>()[0 * 3 + j], 2.0f * x.data<float>()[0 * 3 + j]);
    EXPECT_EQ(out.data<float>()[4 * 3 + j], 0.0f + x.data<float>()[12 + j] * 0.5f + x.data<float>()[12 + j] * -1.0f);
    EXPECT_EQ(out.data<float>()[2 * 3 + j], 0.0f);
  }
  EXPECT_THROW(ops::gather_rows(x, std::vector<int32_t>{5, 0, 0}, g), Error);
}

// The fused decode step is the three ops in turn (q and k untouched), and it
// checks its gate inputs.
TEST(GatedDeltaRuleStep, EqualsNormGatesThenRecurrent) {
  std::mt19937 rng(77);
  const int64_t Hk = 2, H = 4, dk = 16, dv = 8;
  const auto rows = make_rows({1, 3}, {1, 0});
  const int64_t T = 4;
  Tensor q = random_tensor({T, Hk, dk}, rng), k = random_tensor({T, Hk, dk}, rng), v = random_tensor({T, H, dv}, rng);
  Tensor a = random_tensor({T, H}, rng, -3.0f, 3.0f), b = random_tensor({T, H}, rng, -3.0f, 3.0f);
  Tensor a_log = random_tensor({H}, rng), dt_bias = random_tensor({H}, rng);
  Tensor state0 = random_tensor({2, H, dk, dv}, rng, -0.1f, 0.1f);
  auto copy_of = [](const Tensor& t) {
    Tensor c = Tensor::empty(t.dtype(), t.shape().data(), t.ndim());
    std::memcpy(c.raw(), t.raw(), t.nbytes());
    return c;
  };
  Tensor q0 = copy_of(q), k0 = copy_of(k);
  Tensor st1 = copy_of(state0), out1 = Tensor::empty(DType::F32, {T, H, dv});
  ops::gated_delta_rule_step(q, k, v, a, b, a_log, dt_bias, 1e-6f, 0.25f, rows, st1, out1);
  Tensor qn = copy_of(q), kn = copy_of(k), g = Tensor::empty(DType::F32, {T, H}), beta = Tensor::empty(DType::F32, {T, H});
  ops::l2norm(qn.reshape({T * Hk, dk}), 1e-6f, qn.reshape({T * Hk, dk}));
  ops::l2norm(kn.reshape({T * Hk, dk}), 1e-6f, kn.reshape({T * Hk, dk}));
  ops::delta_rule_gates(a, b, a_log, dt_bias, g, beta);
  Tensor st2 = copy_of(state0), out2 = Tensor::empty(DType::F32, {T, H, dv});
  ops::gated_delta_rule_recurrent(qn, kn, v, g, beta, 0.25f, rows, st2, out2);
  EXPECT_EQ(std::memcmp(out1.raw(), out2.raw(), out1.nbytes()), 0);
  EXPECT_EQ(std::memcmp(st1.raw(), st2.raw(), st1.nbytes()), 0);
  EXPECT_EQ(std::memcmp(q.raw(), q0.raw(), q.nbytes()), 0) << "q left as it was";
  EXPECT_EQ(std::memcmp(k.raw(), k0.raw(), k.nbytes()), 0) << "k left as it was";
  Tensor short_log = random_tensor({H - 1}, rng);
  EXPECT_THROW(ops::gated_delta_rule_step(q, k, v, a, b, short_log, dt_bias, 1e-6f, 0.25f, rows, st1, out1), Error);
}

// Verify windows (rows of 2..n_pos tokens) leave each token's conv input and
// gate inputs at [slot, position % n_pos]; decode rows and longer rows leave
// nothing; load_recurrent_inputs reads them back.
TEST(KeepRecurrentInputs, VerifyWindowsLeaveTheirInputsBySlotAndPosition) {
  std::mt19937 rng(7);
  const int64_t n_conv = 5, n_z = 3, H = 2, P = n_conv + n_z + 2 * H, W = n_conv + 2 * H, n_pos = 4, n_slots = 5;
  const auto rows = make_rows({1, 3, 4, 5, 2}, {4, 0, 2, 1, 3});
  const std::vector<int32_t> pos0 = {9, 6, 0, 2, 3};  // the rows' first positions
  std::vector<int32_t> positions;
  for (size_t r = 0; r < rows.size(); ++r)
    for (int32_t t = 0; t < rows[r].n_tokens; ++t) positions.push_back(pos0[r] + t);
  const int64_t T = int64_t(positions.size());
  Tensor proj = random_tensor({T, P}, rng);
  Tensor inputs = Tensor::empty(DType::F32, {n_slots, n_pos, W});
  std::fill_n(inputs.data<float>(), inputs.numel(), -7.0f);
  const std::vector<ops::AttnRow> attn;  // the CPU reads the host positions only
  ops::keep_recurrent_inputs(proj, n_conv, n_z, rows, ops::BatchView{attn, positions}, inputs);
  std::vector<bool> written(size_t(n_slots * n_pos), false);
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto& row = rows[r];
    if (row.n_tokens < 2 || row.n_tokens > n_pos) continue;
    for (int32_t t = 0; t < row.n_tokens; ++t) {
      const int64_t i = row.token_begin + t, at = row.slot * n_pos + positions[size_t(i)] % n_pos;
      written[size_t(at)] = true;
      const float* got = inputs.data<float>() + at * W;
      const float* src = proj.data<float>() + i * P;
      for (int64_t c = 0; c < W; ++c) EXPECT_EQ(got[c], src[c < n_conv ? c : c + n_z]) << "row " << r << " t " << t;
    }
  }
  for (int64_t at = 0; at < n_slots * n_pos; ++at)
    if (!written[size_t(at)]) {
      EXPECT_EQ(inputs.data<float>()[at * W], -7.0f) << "entry " << at << " written";
    }

  // Read back (every row, whatever its length): the kept rows' tokens give
  // their inputs again.
  Tensor back = Tensor::empty(DType::F32, {T, W});
  ops::load_recurrent_inputs(inputs, rows, ops::BatchView{attn, positions}, back);
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto& row = rows[r];
    for (int32_t t = 0; t < row.n_tokens; ++t) {
      const int64_t i = row.token_begin + t, at = row.slot * n_pos + positions[size_t(i)] % n_pos;
      EXPECT_EQ(std::memcmp(back.data<float>() + i * W, inputs.data<float>() + at * W, size_t(W) * 4), 0);
    }
  }
  Tensor narrow = Tensor::empty(DType::F32, {n_slots, n_pos, W + 1});
  EXPECT_THROW(ops::keep_recurrent_inputs(proj, n_conv, n_z, rows, ops::BatchView{attn, positions}, narrow), Error);
}

}  // namespace
}  // namespace augur
