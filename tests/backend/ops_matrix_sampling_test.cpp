// The op matrix (see ops_matrix_test.cpp) for sampling: ops::sample over the
// backends against the rule ops.h documents, written here in double (softmax
// at the row's temperature, cut to top_k, top_p and min_p, the draw walking the
// kept tokens in id order), at the vocabulary sizes 1, 31, 33 and 4097.
// Greedy ids are exact; sampled ids hold up to the draw's own float slack
// (kDrawSlack).
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

// ---- sampling -----------------------------------------------------------------

// Logits on a grid of 1/8 in [-6, 6]: many exact ties at V = 4097.
std::vector<float> grid_logits(int64_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> grid(-48, 48);
  std::vector<float> l(static_cast<size_t>(n));
  for (auto& x : l) x = float(grid(rng)) / 8.0f;
  return l;
}

int32_t argmax_first(const float* l, int64_t V) {
  int32_t best = 0;
  for (int64_t j = 1; j < V; ++j)
    if (l[j] > l[best]) best = int32_t(j);
  return best;
}

using SampleMatrix = OnDevice;

// Temperature 0 is argmax, the first id on ties: planted ties, all equal,
// the maximum at the last id; an all-greedy call (CUDA's argmax kernel).
TEST_P(SampleMatrix, GreedyIsArgmaxFirstOnTies) {
  std::mt19937 rng(91);
  for (int64_t V : kSizes) {
    SCOPED_TRACE(testing::Message() << "n_vocab=" << V);
    const int64_t n_rows = 4;
    std::vector<float> logits = grid_logits(n_rows * V, rng);
    float* r1 = logits.data() + V;
    r1[V / 3] = r1[V - 1] = 7.0f;  // a tie (one id when V = 1)
    std::fill_n(logits.data() + 2 * V, V, -1.5f);
    logits[size_t(4 * V - 1)] = 6.5f;
    std::vector<ops::SampleRow> rows(static_cast<size_t>(n_rows));  // temperature 0
    std::vector<int32_t> ids(static_cast<size_t>(n_rows), -1);
    ops::sample(on(dev(), host_tensor(DType::F32, {n_rows, V}, logits)), rows, ids);
    for (int64_t r = 0; r < n_rows; ++r)
      EXPECT_EQ(ids[size_t(r)], argmax_first(logits.data() + r * V, V)) << "row " << r;
    EXPECT_EQ(ids[1], int32_t(V / 3));
    EXPECT_EQ(ids[2], 0);
    EXPECT_EQ(ids[3], int32_t(V - 1));
  }
}

// A temperature so small that 1 / t or the top logit over t overflows a
// float (1e-40 is subnormal; 40 / 1e-37 is past FLT_MAX) samples the argmax,
// as the limit of softmax(l / t) does, instead of weights of inf - inf.
TEST_P(SampleMatrix, TinyTemperaturesAreGreedy) {
  std::mt19937 rng(17);
  for (int64_t V : kSizes) {
    SCOPED_TRACE(testing::Message() << "n_vocab=" << V);
    const std::vector<float> temps = {1e-40f, 1e-37f, 1e-20f};
    const int64_t n_rows = int64_t(temps.size());
    std::vector<float> logits = grid_logits(n_rows * V, rng);
    std::vector<ops::SampleRow> rows;
    for (int64_t r = 0; r < n_rows; ++r) {
      logits[size_t(r * V + (V - 1 - r % V))] = 40.0f;  // one maximum a row
      rows.push_back({temps[size_t(r)], 0, 1.0f, 0.0f, 0.5f});
    }
    std::vector<int32_t> ids(static_cast<size_t>(n_rows), -1);
    ops::sample(on(dev(), host_tensor(DType::F32, {n_rows, V}, logits)), rows, ids);
    for (int64_t r = 0; r < n_rows; ++r)
      EXPECT_EQ(ids[size_t(r)], int32_t(V - 1 - r % V)) << "temperature " << temps[size_t(r)];
  }
}

// The rule of ops::sample in double: softmax(logits / temperature) kept, in
// rank order (logit desc, id asc), to the top_k best, then to the shortest
// prefix whose mass reaches top_p of theirs, then to the tokens with at least
// min_p times the top probability; the draw walks the kept tokens in id order.
struct SampleRef {
  std::vector<double> weight;  // [V] unnormalised mass of kept tokens (0: cut)
  double total = 0;
  bool ambiguous = false;      // a cut within kCutSlack of its threshold
};
constexpr double kCutSlack = 1e-5;   // relative, of the mass a cut compares
constexpr double kDrawSlack = 1e-4;  // of the kept mass: float sums over up to 4097 weights

SampleRef sample_reference(const float* l, int64_t V, const ops::SampleRow& p) {
  SampleRef s;
  const double mx = l[argmax_first(l, V)];
  std::vector<double> w(static_cast<size_t>(V));
  for (int64_t j = 0; j < V; ++j) w[size_t(j)] = std::exp((double(l[j]) - mx) / p.temperature);  // top: 1
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  int64_t n_keep = p.top_k > 0 && p.top_k < V ? p.top_k : V;
  if (p.top_p < 1.0f) {
    double z = 0, run = 0;
    for (int64_t i = 0; i < n_keep; ++i) z += w[size_t(order[size_t(i)])];
    const double target = double(p.top_p) * z;
    for (int64_t i = 0; i < n_keep; ++i) {
      const double before = run;
      run += w[size_t(order[size_t(i)])];
      if (run >= target) {
        s.ambiguous |= run - target < kCutSlack * z || target - before < kCutSlack * z;
        n_keep = i + 1;
        break;
      }
    }
  }
  s.weight.assign(size_t(V), 0.0);
  for (int64_t i = 0; i < n_keep; ++i) {
    const int32_t j = order[size_t(i)];
    if (p.min_p > 0 && std::fabs(w[size_t(j)] - p.min_p) < kCutSlack * p.min_p) s.ambiguous = true;
    if (w[size_t(j)] >= p.min_p) s.weight[size_t(j)] = w[size_t(j)];
  }
  for (double x : s.weight) s.total += x;
  return s;
}

// Sampled rows (with greedy rows among them) over configurations of each
// filter alone and together, at uniforms 0, near 1 and random: the id drawn
// must be kept and its span of the kept mass, in id order, must hold
// uniform * total (within kDrawSlack).
TEST_P(SampleMatrix, TopKTopPMinPFollowTheDocumentedRule) {
  std::mt19937 rng(92);
  struct Config {
    float temperature;
    int32_t top_k;
    float top_p, min_p;
  };
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  int checked = 0;
  for (int64_t V : kSizes) {
    SCOPED_TRACE(testing::Message() << "n_vocab=" << V);
    const Config configs[] = {{1.0f, 0, 1.0f, 0.0f},    {0.7f, 5, 1.0f, 0.0f},     {1.0f, 1, 1.0f, 0.0f},
                              {1.3f, 0, 0.9f, 0.0f},    {1.0f, 0, 0.5f, 0.0f},     {0.5f, 0, 1.0f, 0.1f},
                              {1.0f, 40, 0.8f, 0.05f},  {2.0f, int32_t(V), 0.3f, 0.0f}, {1.0f, 0, 0.01f, 0.0f},
                              {0.0f, 3, 0.5f, 0.2f}};
    std::vector<ops::SampleRow> rows;
    for (const Config& c : configs)
      for (float u : {0.0f, 0.99999f, u01(rng), u01(rng)})
        rows.push_back({c.temperature, c.top_k, c.top_p, c.min_p, std::min(u, 0.99999f)});
    const int64_t n_rows = int64_t(rows.size());
    const std::vector<float> logits = grid_logits(n_rows * V, rng);
    // Cuts right at their threshold are a rounding matter: nudge top_p / min_p off them.
    std::vector<SampleRef> refs(static_cast<size_t>(n_rows));
    for (int64_t r = 0; r < n_rows; ++r) {
      ops::SampleRow& p = rows[size_t(r)];
      if (p.temperature == 0) continue;
      for (int tries = 0; tries < 50; ++tries) {
        refs[size_t(r)] = sample_reference(logits.data() + r * V, V, p);
        if (!refs[size_t(r)].ambiguous) break;
        if (p.top_p < 1.0f) p.top_p = std::min(0.999f, p.top_p * 1.01f);
        if (p.min_p > 0) p.min_p *= 1.01f;
      }
      ASSERT_FALSE(refs[size_t(r)].ambiguous) << "row " << r;
    }
    std::vector<int32_t> ids(static_cast<size_t>(n_rows), -1);
    ops::sample(on(dev(), host_tensor(DType::F32, {n_rows, V}, logits)), rows, ids);
    for (int64_t r = 0; r < n_rows; ++r) {
      const ops::SampleRow& p = rows[size_t(r)];
      const float* l = logits.data() + r * V;
      const int32_t id = ids[size_t(r)];
      SCOPED_TRACE(testing::Message() << "row " << r << ": temperature " << p.temperature << " top_k " << p.top_k
                                      << " top_p " << p.top_p << " min_p " << p.min_p << " uniform " << p.uniform);
      ASSERT_TRUE(id >= 0 && id < V) << id;
      if (p.temperature == 0) {
        EXPECT_EQ(id, argmax_first(l, V));
        continue;
      }
      const SampleRef& s = refs[size_t(r)];
      ASSERT_GT(s.weight[size_t(id)], 0.0) << "id " << id << " (logit " << l[id] << ") was cut";
      double lo = 0;
      for (int32_t j = 0; j < id; ++j) lo += s.weight[size_t(j)];
      const double hi = lo + s.weight[size_t(id)], at = double(p.uniform) * s.total;
      EXPECT_TRUE(at >= lo - kDrawSlack * s.total && at < hi + kDrawSlack * s.total)
          << "id " << id << " spans [" << lo / s.total << ", " << hi / s.total << ") of the kept mass, uniform "
          << p.uniform;
      if (p.top_k == 1) {
        EXPECT_EQ(id, argmax_first(l, V)) << "top_k 1 is the argmax";
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 100);
}

INSTANTIATE_ON_DEVICES(SampleMatrix);

}  // namespace
}  // namespace augur
