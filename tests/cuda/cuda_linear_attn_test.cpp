// CUDA ops of the hybrid families (Gated DeltaNet and sparse MoE) against their
// CPU ops, through the backend/ops.h entry points, on random inputs of odd
// sizes: rows of mixed lengths in one batch (1, 2, 31, 33, 100 tokens),
// distinct slots, state carried across two calls. Outputs are poisoned (NaN)
// before each run, so an element left unwritten fails.
//
// Tolerances: every kernel here computes in f32 (weights widened exactly from
// bf16), so the CPU and CUDA results differ by summation order only:
// |err| <= 1e-4 of the output scale (1e-3 for the delta-rule states, which
// accumulate over 100 tokens); the chunked and recurrent forms of the delta
// rule agree within 2e-3.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/device.h"
#include "backend/ops.h"
#include "core/dtype.h"
#include "core/error.h"

namespace augur {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

class CudaHybridOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device_available(Device::CUDA)) GTEST_SKIP() << "no CUDA device";
  }
  // A host f32 tensor ~ U(lo, hi).
  Tensor rand(std::initializer_list<int64_t> shape, float lo = -1.0f, float hi = 1.0f) {
    Tensor t = Tensor::empty(DType::F32, shape);
    std::uniform_real_distribution<float> u(lo, hi);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng_);
    return t;
  }
  std::mt19937 rng_{1234};
};

Tensor gpu(const Tensor& t) { return to_device(t, Device::CUDA); }
Tensor host(const Tensor& t) { return to_device(t, Device::CPU); }

// A device tensor of `shape` full of NaN (written by the op under test).
Tensor poisoned(std::initializer_list<int64_t> shape) {
  Tensor h = Tensor::empty(DType::F32, shape);
  std::fill_n(h.data<float>(), h.numel(), kNaN);
  return gpu(h);
}

float abs_max(const Tensor& t) {
  float m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(t.data<float>()[i]));
  return m;
}

// max |a - b| over max(|b|, 1e-3): a NaN anywhere fails.
float rel_err(const Tensor& a_any, const Tensor& b_any) {
  const Tensor a = host(a_any), b = host(b_any);
  EXPECT_EQ(a.numel(), b.numel());
  float m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float d = std::fabs(a.data<float>()[i] - b.data<float>()[i]);
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m / std::max(abs_max(b), 1e-3f);
}

using Rows = std::vector<ops::RecurrentRow>;
int32_t total_tokens(const Rows& rows) {
  int32_t n = 0;
  for (const auto& r : rows) n = std::max(n, r.token_begin + r.n_tokens);
  return n;
}

TEST_F(CudaHybridOps, SliceCols) {
  const std::vector<std::array<int64_t, 4>> cases = {{33, 100, 17, 31}, {1, 7, 0, 7}, {100, 129, 128, 1}};
  for (const auto& [M, N, begin, n] : cases) {
    Tensor x = rand({M, N});
    Tensor want = Tensor::empty(DType::F32, {M, n});
    ops::slice_cols(x, begin, want);
    Tensor got = poisoned({M, n});
    ops::slice_cols(gpu(x), begin, got);
    EXPECT_EQ(rel_err(got, want), 0.0f) << M << "x" << N;
  }
}

TEST_F(CudaHybridOps, L2NormAndGatedRmsNorm) {
  for (int64_t D : {16, 128, 37}) {
    const int64_t M = 100;
    Tensor x = rand({M, D}), z = rand({M, D}), w = rand({D}, 0.5f, 1.5f);
    Tensor want = Tensor::empty(DType::F32, {M, D});
    ops::l2norm(x, 1e-6f, want);
    Tensor gx = gpu(x);
    ops::l2norm(gx, 1e-6f, gx);  // in place, as the model calls it
    EXPECT_LT(rel_err(gx, want), 1e-5f) << "l2norm D " << D;

    Tensor want_g = Tensor::empty(DType::F32, {M, D});
    ops::gated_rms_norm(x, z, w, 1e-6f, want_g);
    Tensor gx2 = gpu(x);
    ops::gated_rms_norm(gx2, gpu(z), gpu(w), 1e-6f, gx2);
    EXPECT_LT(rel_err(gx2, want_g), 1e-5f) << "gated_rms_norm D " << D;
  }
}

TEST_F(CudaHybridOps, DeltaRuleGatesAndSigmoidMul) {
  const int64_t T = 33, H = 4;
  Tensor a = rand({T, H}, -30.0f, 30.0f), b = rand({T, H}, -5.0f, 5.0f);  // softplus' threshold crossed
  Tensor a_log = rand({H}), dt_bias = rand({H});
  Tensor g = Tensor::empty(DType::F32, {T, H}), beta = Tensor::empty(DType::F32, {T, H});
  ops::delta_rule_gates(a, b, a_log, dt_bias, g, beta);
  Tensor gg = poisoned({T, H}), gb = poisoned({T, H});
  ops::delta_rule_gates(gpu(a), gpu(b), gpu(a_log), gpu(dt_bias), gg, gb);
  EXPECT_LT(rel_err(gg, g), 1e-5f);
  EXPECT_LT(rel_err(gb, beta), 1e-5f);

  const int64_t M = 31, N = 65;
  Tensor x = rand({M, N}), gate = rand({M, N}, -4.0f, 4.0f), row_gate = rand({M, 1}, -4.0f, 4.0f);
  for (const Tensor* gt : {&gate, &row_gate}) {
    Tensor want = Tensor::empty(DType::F32, {M, N});
    ops::sigmoid_mul(x, *gt, want);
    Tensor got = gpu(x);
    ops::sigmoid_mul(got, gpu(*gt), got);
    EXPECT_LT(rel_err(got, want), 1e-6f) << (gt == &row_gate ? "per row" : "per element");
  }
}

// Two calls, the second continuing the slots the first left.
TEST_F(CudaHybridOps, CausalConv1dCarriesItsTail) {
  for (int64_t K : {4, 2}) {
    const int64_t C = 37, n_slots = 5;
    Tensor w = rand({C, K});
    Tensor state = rand({n_slots, K - 1, C});
    Tensor gstate = gpu(state);
    const std::vector<Rows> calls = {
        {{0, 1, 3}, {1, 31, 0}, {32, 2, 4}, {34, 100, 1}},  // mixed lengths, slots out of order
        {{0, 1, 0}, {1, 33, 1}, {34, 1, 3}, {35, 2, 4}},
    };
    for (size_t c = 0; c < calls.size(); ++c) {
      for (bool silu : {true, false}) {
        if (!silu && c == 0) continue;  // the first call advances the tails once
        const Rows& rows = calls[c];
        const int64_t T = total_tokens(rows);
        Tensor x = rand({T, C});
        Tensor want = Tensor::empty(DType::F32, {T, C});
        ops::causal_conv1d(x, w, rows, state, silu, want);
        Tensor got = poisoned({T, C});
        ops::causal_conv1d(gpu(x), gpu(w), rows, gstate, silu, got);
        EXPECT_LT(rel_err(got, want), 1e-5f) << "K " << K << " call " << c << " silu " << silu;
        EXPECT_EQ(rel_err(gstate, state), 0.0f) << "tails, K " << K << " call " << c;
      }
    }
  }
}

// delta_rule_inputs against the CPU's, and against the CUDA ops it fuses
// bit for bit (so a prefill's inputs are what they were); rows shorter and
// longer than a conv segment (the tail then written by its own launch), a
// row left out untouched, heads of 128 and of 16 / 24, conv kernels of 4
// taps, 2 and 11 (older taps than the kernel keeps in registers).
TEST_F(CudaHybridOps, DeltaRuleInputsEqualTheOpsTheyFuse) {
  struct Shape {
    int64_t Hk, H, dk, dv, K;
  };
  for (const Shape sh : {Shape{2, 4, 128, 128, 4}, Shape{3, 6, 16, 24, 4}, Shape{2, 4, 128, 128, 11},
                         Shape{3, 6, 16, 24, 2}}) {
    const int64_t Hk = sh.Hk, H = sh.H, dk = sh.dk, dv = sh.dv, K = sh.K, C = 2 * Hk * dk + H * dv, V = H * dv;
    const int64_t P = C + V + 2 * H;
    const Rows all = {{0, 3, 2}, {3, 130, 0}, {133, 5, 3}, {138, 1, 1}};
    for (const Rows& rows : {Rows{all[0], all[1], all[3]}, Rows{all[0], all[2], all[3]}}) {
      const int64_t T = 139;
      Tensor proj = rand({T, P}, -2, 2), w = rand({C, K}), a_log = rand({H}), dt_bias = rand({H});
      Tensor state = rand({4, K - 1, C});
      Tensor gproj = gpu(proj), gw = gpu(w), gal = gpu(a_log), gdt = gpu(dt_bias);
      // The CPU op, then the CUDA ops it replaces.
      Tensor st_cpu = host(gpu(state)), q_cpu = Tensor::empty(DType::F32, {T, Hk, dk});
      Tensor k_cpu = Tensor::empty(DType::F32, {T, Hk, dk}), v_cpu = Tensor::empty(DType::F32, {T, H, dv});
      Tensor g_cpu = Tensor::empty(DType::F32, {T, H}), b_cpu = Tensor::empty(DType::F32, {T, H});
      ops::delta_rule_inputs(proj, C + V, w, a_log, dt_bias, 1e-6f, rows, st_cpu, q_cpu, k_cpu, v_cpu, g_cpu, b_cpu);
      Tensor st_ops = gpu(state), mixed = poisoned({T, C}), conv = poisoned({T, C});
      Tensor q_ops = poisoned({T, Hk, dk}), k_ops = poisoned({T, Hk, dk}), v_ops = poisoned({T, H, dv});
      Tensor ga = poisoned({T, H}), gb = poisoned({T, H}), g_ops = poisoned({T, H}), b_ops = poisoned({T, H});
      ops::slice_cols(gproj, 0, mixed);
      ops::causal_conv1d(mixed, gw, rows, st_ops, true, conv);
      ops::slice_cols(conv, 0, q_ops.reshape({T, Hk * dk}));
      ops::slice_cols(conv, Hk * dk, k_ops.reshape({T, Hk * dk}));
      ops::slice_cols(conv, 2 * Hk * dk, v_ops.reshape({T, V}));
      ops::l2norm(q_ops.reshape({T * Hk, dk}), 1e-6f, q_ops.reshape({T * Hk, dk}));
      ops::l2norm(k_ops.reshape({T * Hk, dk}), 1e-6f, k_ops.reshape({T * Hk, dk}));
      ops::slice_cols(gproj, C + V, gb);
      ops::slice_cols(gproj, C + V + H, ga);
      ops::delta_rule_gates(ga, gb, gal, gdt, g_ops, b_ops);
      // The fused op.
      Tensor st = gpu(state), q = poisoned({T, Hk, dk}), k = poisoned({T, Hk, dk}), v = poisoned({T, H, dv});
      Tensor g = poisoned({T, H}), beta = poisoned({T, H});
      ops::delta_rule_inputs(gproj, C + V, gw, gal, gdt, 1e-6f, rows, st, q, k, v, g, beta);
      const std::string what = "dk " + std::to_string(dk) + ", K " + std::to_string(K) + ", rows " +
                               std::to_string(rows.size()) + " ending " + std::to_string(rows[1].n_tokens);
      EXPECT_EQ(rel_err(st, st_ops), 0.0f) << "conv tails, " << what;
      EXPECT_EQ(rel_err(st, st_cpu), 0.0f) << "conv tails against the CPU, " << what;
      // Compare the rows' tokens only (the others stay poisoned in both).
      const std::vector<std::tuple<Tensor*, Tensor*, Tensor*, const char*>> outs = {
          {&q, &q_ops, &q_cpu, "q"}, {&k, &k_ops, &k_cpu, "k"}, {&v, &v_ops, &v_cpu, "v"},
          {&g, &g_ops, &g_cpu, "g"}, {&beta, &b_ops, &b_cpu, "beta"}};
      for (const auto& [got_d, ops_d, cpu_h, name] : outs) {
        const Tensor got = host(*got_d), want = host(*ops_d);
        const int64_t width = got.numel() / T;
        float err = 0.0f;
        for (const auto& r : rows)
          for (int64_t t = r.token_begin; t < r.token_begin + r.n_tokens; ++t)
            for (int64_t i = 0; i < width; ++i) {
              const float x = got.data<float>()[t * width + i];
              ASSERT_EQ(std::memcmp(&x, want.data<float>() + t * width + i, 4), 0)
                  << name << " token " << t << " element " << i << ", " << what;
              err = std::max(err, std::fabs(x - cpu_h->data<float>()[t * width + i]));
            }
        EXPECT_LT(err, 1e-5f) << name << " against the CPU, " << what;
        if (rows[1].token_begin != 133) {  // row 2 is left out: its tokens stay poisoned
          for (int64_t t = 133; t < 138; ++t) ASSERT_TRUE(std::isnan(got.data<float>()[t * width])) << name << " token " << t;
        }
      }
    }
  }
}

// keep_recurrent_inputs and load_recurrent_inputs from the batch's device
// layout equal the CPU's bit for bit.
TEST_F(CudaHybridOps, KeepAndLoadRecurrentInputs) {
  const int64_t n_conv = 37, n_z = 33, H = 3, P = n_conv + n_z + 2 * H, W = n_conv + 2 * H, n_pos = 8, n_slots = 6;
  const std::vector<int32_t> lens = {1, 5, 8, 9, 2, 33}, slots = {4, 0, 2, 1, 3, 5}, pos0 = {9, 6, 0, 2, 13, 40};
  std::vector<ops::RecurrentRow> rows;
  std::vector<ops::AttnRow> attn;
  std::vector<int32_t> positions, tokens;
  const std::vector<int32_t> table = {0, 1, 2, 3, 4, 5, 6, 7};
  for (size_t r = 0; r < lens.size(); ++r) {
    const int32_t begin = int32_t(positions.size());
    rows.push_back({begin, lens[r], slots[r]});
    // The last row has no blocks, as a rollback's replay (no K/V touched).
    attn.push_back({begin, lens[r], pos0[r], r + 1 < lens.size() ? std::span<const int32_t>(table) : std::span<const int32_t>(), slots[r]});
    for (int32_t t = 0; t < lens[r]; ++t) positions.push_back(pos0[r] + t), tokens.push_back(1);
  }
  const int64_t T = int64_t(positions.size());
  const ops::DeviceBatch dev = ops::upload_batch(Device::CUDA, tokens, attn, 16, 128);
  Tensor proj = rand({T, P});
  Tensor want = rand({n_slots, n_pos, W});
  Tensor got = gpu(want);
  ops::keep_recurrent_inputs(proj, n_conv, n_z, rows, ops::BatchView{attn, positions}, want);
  ops::keep_recurrent_inputs(gpu(proj), n_conv, n_z, rows, ops::BatchView{attn, positions, &dev}, got);
  EXPECT_EQ(rel_err(got, want), 0.0f);
  Tensor back_want = Tensor::empty(DType::F32, {T, W});
  ops::load_recurrent_inputs(want, rows, ops::BatchView{attn, positions}, back_want);
  Tensor back_got = poisoned({T, W});
  ops::load_recurrent_inputs(got, rows, ops::BatchView{attn, positions, &dev}, back_got);
  EXPECT_EQ(rel_err(back_got, back_want), 0.0f);
  EXPECT_THROW(ops::keep_recurrent_inputs(gpu(proj), n_conv, n_z, rows, ops::BatchView{attn, positions}, got), Error)
      << "a CUDA batch without its layout";
}

struct DeltaCase {
  int64_t n_head_k, n_head, dk, dv;
};

class CudaDeltaRule : public CudaHybridOps, public ::testing::WithParamInterface<DeltaCase> {
 protected:
  // q, k L2-normalised per head (as the model feeds them), decays in (0, 1).
  void make_inputs(int64_t T) {
    const DeltaCase c = GetParam();
    q_ = rand({T, c.n_head_k, c.dk});
    k_ = rand({T, c.n_head_k, c.dk});
    ops::l2norm(q_.reshape({T * c.n_head_k, c.dk}), 1e-6f, q_.reshape({T * c.n_head_k, c.dk}));
    ops::l2norm(k_.reshape({T * c.n_head_k, c.dk}), 1e-6f, k_.reshape({T * c.n_head_k, c.dk}));
    v_ = rand({T, c.n_head, c.dv});
    g_ = rand({T, c.n_head}, -0.5f, -0.01f);
    beta_ = rand({T, c.n_head}, 0.05f, 0.95f);
  }
  Tensor q_, k_, v_, g_, beta_;
};

// The recurrent form on CUDA against the CPU's, states carried over two calls.
TEST_P(CudaDeltaRule, RecurrentMatchesCpu) {
  const DeltaCase c = GetParam();
  const int64_t n_slots = 4;
  const float scale = 1.0f / std::sqrt(float(c.dk));
  Tensor state = rand({n_slots, c.n_head, c.dk, c.dv}, -0.1f, 0.1f);
  Tensor gstate = gpu(state);
  for (const Rows& rows : {Rows{{0, 1, 2}, {1, 3, 0}, {4, 16, 3}}, Rows{{0, 16, 2}, {16, 1, 0}, {17, 2, 1}}}) {
    const int64_t T = total_tokens(rows);
    make_inputs(T);
    Tensor want = Tensor::empty(DType::F32, {T, c.n_head, c.dv});
    ops::gated_delta_rule_recurrent(q_, k_, v_, g_, beta_, scale, rows, state, want);
    Tensor got = poisoned({T, c.n_head, c.dv});
    ops::gated_delta_rule_recurrent(gpu(q_), gpu(k_), gpu(v_), gpu(g_), gpu(beta_), scale, rows, gstate, got);
    EXPECT_LT(rel_err(got, want), 1e-4f);
    EXPECT_LT(rel_err(gstate, state), 1e-4f);
  }
}

// The fused decode step (q/k L2 norm, gates from the raw projections, the
// recurrent form in one kernel) against the CPU's three ops in turn.
TEST_P(CudaDeltaRule, FusedStepMatchesCpu) {
  const DeltaCase c = GetParam();
  const int64_t n_slots = 4;
  const float scale = 1.0f / std::sqrt(float(c.dk));
  Tensor state = rand({n_slots, c.n_head, c.dk, c.dv}, -0.1f, 0.1f);
  Tensor gstate = gpu(state);
  Tensor a_log = rand({c.n_head}, -1.0f, 1.0f), dt_bias = rand({c.n_head}, -0.5f, 0.5f);
  for (const Rows& rows : {Rows{{0, 1, 2}}, Rows{{0, 1, 0}, {1, 1, 3}, {2, 1, 1}}, Rows{{0, 5, 2}, {5, 16, 1}}}) {
    const int64_t T = total_tokens(rows);
    Tensor q = rand({T, c.n_head_k, c.dk}), k = rand({T, c.n_head_k, c.dk}), v = rand({T, c.n_head, c.dv});
    Tensor a = rand({T, c.n_head}, -3.0f, 3.0f), b = rand({T, c.n_head}, -3.0f, 3.0f);
    Tensor want = Tensor::empty(DType::F32, {T, c.n_head, c.dv});
    ops::gated_delta_rule_step(q, k, v, a, b, a_log, dt_bias, 1e-6f, scale, rows, state, want);
    Tensor got = poisoned({T, c.n_head, c.dv});
    ops::gated_delta_rule_step(gpu(q), gpu(k), gpu(v), gpu(a), gpu(b), gpu(a_log), gpu(dt_bias), 1e-6f, scale, rows,
                               gstate, got);
    EXPECT_LT(rel_err(got, want), 1e-4f) << rows.size() << " rows";
    EXPECT_LT(rel_err(gstate, state), 1e-4f) << rows.size() << " rows";
  }
}

// The chunked form on CUDA against the CPU's (chunks of 64 and 16), and
// against the recurrent form on CUDA; states carried over three calls.
TEST_P(CudaDeltaRule, ChunkedMatchesCpuAndRecurrent) {
  const DeltaCase c = GetParam();
  const int64_t n_slots = 5;
  const float scale = 1.0f / std::sqrt(float(c.dk));
  for (int64_t chunk : {64, 16}) {
    Tensor state = rand({n_slots, c.n_head, c.dk, c.dv}, -0.1f, 0.1f);
    Tensor gstate = gpu(state), rstate = gpu(state);
    // The third call has 37 chunks of 16: the kernels walk them in two
    // segments, the second starting in the middle of a row (its 14th chunk).
    const std::vector<Rows> calls = {Rows{{0, 31, 1}, {31, 33, 4}, {64, 100, 0}, {164, 1, 2}},
                                     Rows{{0, 100, 1}, {100, 17, 0}, {117, 64, 4}},
                                     Rows{{0, 300, 3}, {300, 250, 1}, {550, 17, 0}}};
    for (size_t call = 0; call < calls.size(); ++call) {
      const Rows& rows = calls[call];
      const int64_t T = total_tokens(rows);
      make_inputs(T);
      Tensor want = Tensor::empty(DType::F32, {T, c.n_head, c.dv});
      ops::gated_delta_rule_chunked(q_, k_, v_, g_, beta_, scale, chunk, rows, state, want);
      Tensor gq = gpu(q_), gk = gpu(k_), gv = gpu(v_), gg = gpu(g_), gb = gpu(beta_);
      Tensor got = poisoned({T, c.n_head, c.dv});
      ops::gated_delta_rule_chunked(gq, gk, gv, gg, gb, scale, chunk, rows, gstate, got);
      EXPECT_LT(rel_err(got, want), 1e-3f) << "chunk " << chunk << " call " << call;
      EXPECT_LT(rel_err(gstate, state), 1e-3f) << "chunk " << chunk << " call " << call;
      Tensor rec = poisoned({T, c.n_head, c.dv});
      ops::gated_delta_rule_recurrent(gq, gk, gv, gg, gb, scale, rows, rstate, rec);
      EXPECT_LT(rel_err(got, rec), 2e-3f) << "chunked vs recurrent, chunk " << chunk << " call " << call;
      EXPECT_LT(rel_err(gstate, rstate), 2e-3f) << "chunked vs recurrent state, chunk " << chunk;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaDeltaRule,
                         ::testing::Values(DeltaCase{2, 4, 16, 16}, DeltaCase{2, 4, 128, 128},
                                           DeltaCase{1, 3, 40, 24}, DeltaCase{2, 2, 256, 64}));

TEST_F(CudaHybridOps, RejectsOversizedChunks) {
  Tensor q = gpu(rand({4, 1, 16})), v = gpu(rand({4, 1, 16})), g = gpu(rand({4, 1})), st = gpu(rand({1, 1, 16, 16}));
  Tensor out = poisoned({4, 1, 16});
  const Rows rows = {{0, 4, 0}};
  EXPECT_THROW(ops::gated_delta_rule_chunked(q, q, v, g, g, 1.0f, 128, rows, st, out), Error);
}

TEST_F(CudaHybridOps, MoeRouteMatchesCpu) {
  const std::vector<std::array<int64_t, 3>> cases = {{33, 10, 2}, {1, 64, 8}, {100, 256, 8}};
  for (const auto& [T, E, k] : cases) {
    for (bool normalize : {true, false}) {
      Tensor logits = rand({T, E}, -3.0f, 3.0f);
      Tensor w = Tensor::empty(DType::F32, {T, k}), ids = Tensor::empty(DType::I32, {T, k});
      ops::moe_route(logits, k, normalize, w, ids);
      Tensor gw = poisoned({T, k}), gids = gpu(Tensor::empty(DType::I32, {T, k}));
      ops::moe_route(gpu(logits), k, normalize, gw, gids);
      Tensor hids = host(gids);
      EXPECT_TRUE(std::equal(ids.data<int32_t>(), ids.data<int32_t>() + ids.numel(), hids.data<int32_t>()))
          << "T " << T << " E " << E;
      EXPECT_LT(rel_err(gw, w), 1e-5f) << "T " << T << " E " << E;
    }
  }
}

// Ties go to the lower expert id, as torch.topk and the CPU op.
TEST_F(CudaHybridOps, MoeRouteTiesGoToLowerIds) {
  Tensor logits = Tensor::empty(DType::F32, {1, 40});
  std::fill_n(logits.data<float>(), 40, 1.0f);
  Tensor gw = poisoned({1, 4}), gids = gpu(Tensor::empty(DType::I32, {1, 4}));
  ops::moe_route(gpu(logits), 4, true, gw, gids);
  Tensor ids = host(gids), w = host(gw);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(ids.data<int32_t>()[i], i);
    EXPECT_FLOAT_EQ(w.data<float>()[i], 0.25f);
  }
}

// The stacked-expert op on CUDA against its CPU reference (per expert
// gather, SwiGLU, scaled scatter-add), bf16 weights.
TEST_F(CudaHybridOps, MoeExpertsMatchCpu) {
  const int64_t E = 8, k = 2, d = 48, I = 40;
  auto bf16 = [&](std::initializer_list<int64_t> shape, float a) {
    Tensor f = rand(shape, -a, a);
    Tensor b = Tensor::empty(DType::BF16, shape);
    for (int64_t i = 0; i < f.numel(); ++i) b.data<uint16_t>()[i] = f32_to_bf16(f.data<float>()[i]);
    return b;
  };
  Tensor gate_up = bf16({E, 2 * I, d}, std::sqrt(3.0f / d)), down = bf16({E, d, I}, std::sqrt(3.0f / I));
  Tensor ggu = gpu(gate_up), gdown = gpu(down);
  for (int64_t T : {1, 31, 100}) {
    Tensor x = rand({T, d});
    Tensor logits = rand({T, E}, -2.0f, 2.0f);
    Tensor w = Tensor::empty(DType::F32, {T, k}), ids = Tensor::empty(DType::I32, {T, k});
    ops::moe_route(logits, k, true, w, ids);
    Tensor want = Tensor::empty(DType::F32, {T, d});
    ops::moe_experts(x, gate_up, down, w, ids, want, Tensor());
    Tensor gx = gpu(x), gids = gpu(ids);
    Tensor ws = gpu(Tensor::empty(DType::F32, {ops::moe_experts_workspace(gx, ggu, gids)}));
    Tensor got = poisoned({T, d});
    ops::moe_experts(gx, ggu, gdown, gpu(w), gids, got, ws);
    EXPECT_LT(rel_err(got, want), 1e-4f) << "T " << T;
  }
}

// Decode-sized routing over many experts: each token's pairs land in
// distinct tiles, most experts idle.
TEST_F(CudaHybridOps, MoeExpertsManyExpertsFewTokens) {
  const int64_t E = 64, k = 8, d = 33, I = 70;
  Tensor gate_up = Tensor::empty(DType::BF16, {E, 2 * I, d}), down = Tensor::empty(DType::BF16, {E, d, I});
  std::uniform_real_distribution<float> u(-0.2f, 0.2f);
  for (Tensor* t : {&gate_up, &down})
    for (int64_t i = 0; i < t->numel(); ++i) t->data<uint16_t>()[i] = f32_to_bf16(u(rng_));
  for (int64_t T : {1, 2, 5}) {
    Tensor x = rand({T, d}), logits = rand({T, E}, -2.0f, 2.0f);
    Tensor w = Tensor::empty(DType::F32, {T, k}), ids = Tensor::empty(DType::I32, {T, k});
    ops::moe_route(logits, k, false, w, ids);
    Tensor want = Tensor::empty(DType::F32, {T, d});
    ops::moe_experts(x, gate_up, down, w, ids, want, Tensor());
    Tensor gx = gpu(x), gids = gpu(ids), ggu = gpu(gate_up);
    Tensor ws = gpu(Tensor::empty(DType::F32, {ops::moe_experts_workspace(gx, ggu, gids)}));
    Tensor got = poisoned({T, d});
    ops::moe_experts(gx, ggu, gpu(down), gpu(w), gids, got, ws);
    EXPECT_LT(rel_err(got, want), 1e-4f) << "T " << T;
  }
}

}  // namespace
}  // namespace augur
