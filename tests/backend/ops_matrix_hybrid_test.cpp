// The op matrix (see ops_matrix_test.cpp) for the hybrid and MoE models' ops:
// the gated delta rule (recurrent and chunked forms) over the backends, MoE
// routing over the backends and the MoE experts over backend x dtype (of the
// expert weights), against a plain scalar reference in double on inputs
// rounded to the dtype first, at the odd sizes 1, 31, 33 and 4097. Outputs
// start as NaN, so an element left unwritten fails.
//
// Tolerances: exact: routing ids; f32-class: the delta rule, routing weights,
// MoE experts. The delta rule and MoE experts tests record their worst error
// as a property (--gtest_output=json).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend/device.h"
#include "backend/ops.h"
#include "core/dtype.h"
#include "ops_matrix_common.h"

namespace augur {
namespace {

// ---- gated delta rule ---------------------------------------------------------

struct DeltaCase {
  int64_t T, Hk, H, dk, dv;
  std::vector<float> q, k, v, g, beta;  // q, k L2-normalised
};

// Rows of n, 1 and 5 tokens; a few tokens with almost no decay, some with a very strong one.
DeltaCase delta_case(int64_t n, std::mt19937& rng) {
  DeltaCase c{n + 6, 2, 6, 40, 24, {}, {}, {}, {}, {}};
  c.q = uniform(c.T * c.Hk * c.dk, rng, -1, 1);
  c.k = uniform(c.T * c.Hk * c.dk, rng, -1, 1);
  for (std::vector<float>* x : {&c.q, &c.k})
    for (int64_t r = 0; r < c.T * c.Hk; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < c.dk; ++i) ss += double((*x)[size_t(r * c.dk + i)]) * (*x)[size_t(r * c.dk + i)];
      for (int64_t i = 0; i < c.dk; ++i) (*x)[size_t(r * c.dk + i)] = float((*x)[size_t(r * c.dk + i)] / std::sqrt(ss));
    }
  c.v = uniform(c.T * c.H * c.dv, rng, -1, 1);
  c.g = uniform(c.T * c.H, rng, -3, 0);
  c.beta = uniform(c.T * c.H, rng, 0, 1);
  for (size_t i = 0; i < c.g.size(); i += 7) c.g[i] = -1e-4f;
  for (size_t i = 3; i < c.g.size(); i += 11) c.g[i] = -40.0f;
  return c;
}

// The recurrence in double, per value head (torch_recurrent_gated_delta_rule):
// S <- exp(g) S; S <- S + k (beta (v - Sᵀ k))ᵀ; o = Sᵀ (scale q).
void delta_reference(const DeltaCase& c, float scale, std::span<const ops::RecurrentRow> rows,
                     std::vector<double>& state, std::vector<double>& out) {
  const int64_t dk = c.dk, dv = c.dv, H = c.H, group = c.H / c.Hk;
  out.assign(size_t(c.T * H * dv), 0.0);
  for (const auto& r : rows)
    for (int64_t h = 0; h < H; ++h) {
      double* S = state.data() + (r.slot * H + h) * dk * dv;
      for (int64_t i = 0; i < r.n_tokens; ++i) {
        const int64_t t = r.token_begin + i, hk = h / group;
        const float* q = c.q.data() + (t * c.Hk + hk) * dk;
        const float* k = c.k.data() + (t * c.Hk + hk) * dk;
        const float* v = c.v.data() + (t * H + h) * dv;
        const double decay = std::exp(double(c.g[size_t(t * H + h)])), beta = c.beta[size_t(t * H + h)];
        for (int64_t x = 0; x < dk * dv; ++x) S[x] *= decay;
        for (int64_t j = 0; j < dv; ++j) {
          double mem = 0;
          for (int64_t a = 0; a < dk; ++a) mem += S[a * dv + j] * k[a];
          const double delta = (v[j] - mem) * beta;
          for (int64_t a = 0; a < dk; ++a) S[a * dv + j] += k[a] * delta;
        }
        for (int64_t j = 0; j < dv; ++j) {
          double o = 0;
          for (int64_t a = 0; a < dk; ++a) o += S[a * dv + j] * (double(q[a]) * scale);
          out[size_t((t * H + h) * dv + j)] = o;
        }
      }
    }
}

using DeltaRuleMatrix = OnDevice;

// Both forms over rows of n (the size), 1 and 5 tokens continuing random
// states in slots 2, 0 and 3; slot 1 is left as it was. chunk_size 0: the
// recurrent form.
void run_delta_rule(Device dev, int64_t chunk_size, double tol) {
  std::mt19937 rng(61 + uint32_t(chunk_size));
  double worst = 0;
  for (int64_t n : kSizes) {
    SCOPED_TRACE(testing::Message() << "row of " << n << " tokens, chunk_size " << chunk_size);
    const DeltaCase c = delta_case(n, rng);
    const Batch b = make_batch(dev, {{int32_t(n), 0, {}, 2}, {1, 0, {}, 0}, {5, 0, {}, 3}}, 16);
    const auto rows = b.recurrent();
    const int64_t n_slots = 4;
    const std::vector<float> state0 = uniform(n_slots * c.H * c.dk * c.dv, rng, -0.5f, 0.5f);
    const float scale = 1.0f / std::sqrt(float(c.dk));
    std::vector<double> ref_state(state0.begin(), state0.end()), ref_out;
    delta_reference(c, scale, rows, ref_state, ref_out);

    const Tensor state = on(dev, host_tensor(DType::F32, {n_slots, c.H, c.dk, c.dv}, state0));
    const Tensor out = poisoned(dev, {c.T, c.H, c.dv});
    const Tensor q = on(dev, host_tensor(DType::F32, {c.T, c.Hk, c.dk}, c.q));
    const Tensor k = on(dev, host_tensor(DType::F32, {c.T, c.Hk, c.dk}, c.k));
    const Tensor v = on(dev, host_tensor(DType::F32, {c.T, c.H, c.dv}, c.v));
    const Tensor g = on(dev, host_tensor(DType::F32, {c.T, c.H}, c.g));
    const Tensor beta = on(dev, host_tensor(DType::F32, {c.T, c.H}, c.beta));
    if (chunk_size == 0)
      ops::gated_delta_rule_recurrent(q, k, v, g, beta, scale, rows, state, out, b.device_ptr());
    else
      ops::gated_delta_rule_chunked(q, k, v, g, beta, scale, chunk_size, rows, state, out, b.device_ptr());
    const std::vector<float> got = values(out), got_state = values(state);
    for (size_t i = 0; i < ref_out.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - ref_out[i]));
    for (size_t i = 0; i < ref_out.size(); ++i)
      ASSERT_NEAR(got[i], ref_out[i], tol) << "out element " << i << " (token " << i / size_t(c.H * c.dv) << ")";
    const size_t slot = size_t(c.H * c.dk * c.dv);
    for (size_t i = 0; i < ref_state.size(); ++i) {
      if (i / slot == 1)
        ASSERT_EQ(got_state[i], state0[i]) << "slot 1 (no row) changed at " << i;
      else
        ASSERT_NEAR(got_state[i], ref_state[i], tol) << "state of slot " << i / slot << " at " << i % slot;
      worst = std::max(worst, std::fabs(double(got_state[i]) - ref_state[i]));
    }
  }
  record_worst("worst_error_chunk_" + std::to_string(chunk_size), worst);
}

TEST_P(DeltaRuleMatrix, RecurrentMatchesScalarRecurrence) { run_delta_rule(dev(), 0, 2e-5); }

TEST_P(DeltaRuleMatrix, ChunkedMatchesScalarRecurrence) {
  for (int64_t chunk : {64, 16}) run_delta_rule(dev(), chunk, 5e-5);
}

INSTANTIATE_ON_DEVICES(DeltaRuleMatrix);

// ---- mixture of experts -------------------------------------------------------

using MoeRouteMatrix = OnDevice;

// Softmax over the experts, the top_k in descending order, ties to the lower
// id, renormalised when asked. Logits on a grid of 1/64: exact ties, and
// distinct values far enough apart that the order is never a rounding matter.
TEST_P(MoeRouteMatrix, MatchesScalarReference) {
  std::mt19937 rng(71);
  struct Case {
    int64_t T, E, k;
  };
  std::vector<Case> cases;
  for (int64_t s : kSizes) cases.push_back({s, 33, 8}), cases.push_back({3, s, std::min<int64_t>(s, 8)});
  for (const Case c : cases)
    for (bool normalize : {true, false}) {
      SCOPED_TRACE(testing::Message() << "T=" << c.T << " E=" << c.E << " top_k=" << c.k << " normalize=" << normalize);
      std::uniform_int_distribution<int> grid(-256, 256);
      std::vector<float> logits(static_cast<size_t>(c.T * c.E));
      for (auto& l : logits) l = float(grid(rng)) / 64.0f;
      if (c.E >= 4)
        for (int64_t t = 0; t < c.T; t += 2) logits[size_t(t * c.E + c.E - 1)] = logits[size_t(t * c.E + 1)] = 5.0f;
      const Tensor w = poisoned(dev(), {c.T, c.k});
      const Tensor ids = on(dev(), Tensor::empty(DType::I32, {c.T, c.k}));
      ops::moe_route(on(dev(), host_tensor(DType::F32, {c.T, c.E}, logits)), c.k, normalize, w, ids);
      const std::vector<float> got_w = values(w);
      const std::vector<int32_t> got_ids = values<int32_t>(ids);
      for (int64_t t = 0; t < c.T; ++t) {
        const float* l = logits.data() + t * c.E;
        std::vector<int32_t> order(static_cast<size_t>(c.E));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
        const double mx = l[order[0]];
        double z = 0, kept = 0;
        for (int64_t e = 0; e < c.E; ++e) z += std::exp(l[e] - mx);
        for (int64_t i = 0; i < c.k; ++i) kept += std::exp(l[order[size_t(i)]] - mx) / z;
        for (int64_t i = 0; i < c.k; ++i) {
          ASSERT_EQ(got_ids[size_t(t * c.k + i)], order[size_t(i)]) << "token " << t << " choice " << i;
          const double p = std::exp(l[order[size_t(i)]] - mx) / z, want = normalize ? p / kept : p;
          ASSERT_NEAR(got_w[size_t(t * c.k + i)], want, 1e-5 * want + 1e-9) << "token " << t << " choice " << i;
        }
      }
    }
}

INSTANTIATE_ON_DEVICES(MoeRouteMatrix);

using MoeExpertsMatrix = OnDeviceDtype;

// max |out - ref| <= tol * max |ref|: x and the weights exact, f32 products
// and sums on both backends (measured: 2e-7 CPU, 5e-7 CUDA).
double moe_tol(DType) { return 1e-5; }

// Per token, the SwiGLU MLPs of its experts scaled by their weights and
// summed; stacked weights [n_expert, 2 d_ff, d_model] (gate rows, then up
// rows) and [n_expert, d_model, d_ff]; expert n_expert - 1 gets no token.
TEST_P(MoeExpertsMatrix, MatchesScalarReference) {
  SKIP_IF_UNSUPPORTED("moe_experts (expert weights)", dev(), dtype(), {DType::F32, DType::BF16},
                      {DType::BF16, DType::F16});
  std::mt19937 rng(81);
  const int64_t E = 8, k = 2, d = 33, I = 31;
  const std::vector<float> gate_up = uniform(E * 2 * I * d, rng, -0.3f, 0.3f, dtype());
  const std::vector<float> down = uniform(E * d * I, rng, -0.3f, 0.3f, dtype());
  const Tensor gu_d = on(dev(), host_tensor(dtype(), {E, 2 * I, d}, gate_up));
  const Tensor down_d = on(dev(), host_tensor(dtype(), {E, d, I}, down));
  double worst = 0;  // max |out - ref| / max |ref|
  for (int64_t T : kSizes) {
    SCOPED_TRACE(testing::Message() << "T=" << T);
    const std::vector<float> x = uniform(T * d, rng, -1, 1, dtype());
    const std::vector<float> w = uniform(T * k, rng, 0.05f, 1.0f);
    std::vector<int32_t> ids(static_cast<size_t>(T * k));
    std::uniform_int_distribution<int32_t> pick(0, int32_t(E - 2));
    for (int64_t t = 0; t < T; ++t) {
      ids[size_t(t * k)] = pick(rng);
      do ids[size_t(t * k + 1)] = pick(rng);
      while (ids[size_t(t * k + 1)] == ids[size_t(t * k)]);
    }
    const Tensor xd = on(dev(), host_tensor(DType::F32, {T, d}, x)), ids_d = on(dev(), host_i32({T, k}, ids));
    const int64_t ws = ops::moe_experts_workspace(xd, gu_d, ids_d);
    const Tensor workspace = ws > 0 ? empty_on(dev(), DType::F32, {ws}) : Tensor();
    const Tensor out = poisoned(dev(), {T, d});
    ops::moe_experts(xd, gu_d, down_d, on(dev(), host_tensor(DType::F32, {T, k}, w)), ids_d, out, workspace);
    const std::vector<float> got = values(out);
    std::vector<double> ref(static_cast<size_t>(T * d), 0.0), act(static_cast<size_t>(I));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < k; ++i) {
        const int64_t e = ids[size_t(t * k + i)];
        for (int64_t j = 0; j < I; ++j) {
          double gt = 0, up = 0;
          for (int64_t c = 0; c < d; ++c) {
            gt += double(gate_up[size_t((e * 2 * I + j) * d + c)]) * x[size_t(t * d + c)];
            up += double(gate_up[size_t((e * 2 * I + I + j) * d + c)]) * x[size_t(t * d + c)];
          }
          act[size_t(j)] = gt / (1.0 + std::exp(-gt)) * up;
        }
        for (int64_t c = 0; c < d; ++c) {
          double y = 0;
          for (int64_t j = 0; j < I; ++j) y += double(down[size_t((e * d + c) * I + j)]) * act[size_t(j)];
          ref[size_t(t * d + c)] += w[size_t(t * k + i)] * y;
        }
      }
    double scale = 0;
    for (double r : ref) scale = std::max(scale, std::fabs(r));
    for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - ref[i]) / scale);
    for (size_t i = 0; i < ref.size(); ++i)
      ASSERT_LE(std::fabs(double(got[i]) - ref[i]), moe_tol(dtype()) * scale)
          << "token " << i / size_t(d) << " dim " << i % size_t(d) << ": " << got[i] << " vs " << ref[i];
  }
  record_worst("worst_error", worst);
}

INSTANTIATE_ON_DEVICES_AND_DTYPES(MoeExpertsMatrix);

}  // namespace
}  // namespace augur
