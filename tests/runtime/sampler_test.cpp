#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "backend/ops.h"
#include "core/error.h"
#include "core/tensor.h"
#include "runtime/sampler.h"

namespace augur {
namespace {

std::vector<float> logits_for(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(float(std::log(p)));
  return l;
}

std::vector<int32_t> draw(SamplingParams p, const std::vector<float>& logits, int n) {
  Sampler s(p);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    auto l = logits;
    out.push_back(s.sample(l, {}, {}));
  }
  return out;
}

TEST(Sampler, GreedyIsArgmaxFirstOnTies) {
  std::vector<float> l = {0.1f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(draw({}, l, 1)[0], 1);
  EXPECT_EQ(argmax(l), 1);
}

TEST(Sampler, SameSeedSameOutputDifferentSeedDifferent) {
  auto l = logits_for({0.2, 0.2, 0.2, 0.2, 0.2});
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  auto a = draw(p, l, 200), b = draw(p, l, 200);
  EXPECT_EQ(a, b);
  p.seed = 43;
  EXPECT_NE(a, draw(p, l, 200));
}

TEST(Sampler, TemperatureOneFollowsTheDistribution) {
  const std::vector<double> probs = {0.5, 0.3, 0.15, 0.05};
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 7;
  const int n = 40000;
  std::map<int32_t, int> counts;
  for (int32_t t : draw(p, logits_for(probs), n)) ++counts[t];
  for (size_t i = 0; i < probs.size(); ++i) {
    const double freq = double(counts[int32_t(i)]) / n;
    const double sigma = std::sqrt(probs[i] * (1 - probs[i]) / n);
    EXPECT_NEAR(freq, probs[i], 5 * sigma) << "token " << i;
  }
}

TEST(Sampler, TopKTopPMinPRestrictTheSupport) {
  auto l = logits_for({0.4, 0.3, 0.2, 0.1});
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 3;
  p.top_k = 2;
  for (int32_t t : draw(p, l, 500)) EXPECT_LT(t, 2);
  p.top_k = 0;
  p.top_p = 0.65f;  // 0.4 + 0.3 reaches it: tokens 0, 1
  for (int32_t t : draw(p, l, 500)) EXPECT_LT(t, 2);
  p.top_p = 1.0f;
  p.min_p = 0.6f;  // keep p >= 0.24: tokens 0, 1
  for (int32_t t : draw(p, l, 500)) EXPECT_LT(t, 2);
  p.min_p = 1.0f;
  for (int32_t t : draw(p, l, 100)) EXPECT_EQ(t, 0);
}

TEST(Sampler, RepetitionPenaltyLikeTransformers) {
  std::vector<float> l = {2.0f, -2.0f, 1.0f};
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  Sampler s(p);
  std::vector<int32_t> prompt = {0, 1, 0};
  s.sample(l, prompt, {});
  EXPECT_FLOAT_EQ(l[0], 1.0f);   // positive: divided, once however often it occurs
  EXPECT_FLOAT_EQ(l[1], -4.0f);  // negative: multiplied
  EXPECT_FLOAT_EQ(l[2], 1.0f);   // absent: unchanged
}

TEST(Sampler, PresenceAndFrequencyPenaltiesCountGeneratedTokens) {
  std::vector<float> l = {1.0f, 1.0f, 1.0f};
  SamplingParams p;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  Sampler s(p);
  std::vector<int32_t> prompt = {2};
  std::vector<int32_t> gen = {0, 0, 1};
  int32_t t = s.sample(l, prompt, gen);
  EXPECT_FLOAT_EQ(l[0], 1.0f - 0.5f - 0.5f);
  EXPECT_FLOAT_EQ(l[1], 1.0f - 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(l[2], 1.0f);  // only in the prompt
  EXPECT_EQ(t, 2);
}

TEST(Sampler, BadParametersAreErrors) {
  SamplingParams p;
  p.top_p = 0.0f;
  EXPECT_THROW(Sampler{p}, Error);
  p = {};
  p.temperature = -1.0f;
  EXPECT_THROW(Sampler{p}, Error);
  p = {};
  p.min_p = 1.5f;
  EXPECT_THROW(Sampler{p}, Error);
  p = {};
  p.top_k = -2;
  EXPECT_THROW(Sampler{p}, Error);
}

TEST(Sampler, TopKListsLargestFirst) {
  std::vector<float> l = {0.5f, 3.0f, 3.0f, -1.0f, 2.0f};
  auto top = top_k(l, 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].second, 1);
  EXPECT_EQ(top[1].second, 2);
  EXPECT_EQ(top[2].second, 4);
}

// The device path (Sampler::device_row + ops::apply_penalties + ops::sample,
// here on the CPU implementation of those ops) applies the same penalties:
// greedy picks agree with Sampler::sample.
TEST(Sampler, DeviceRowPenaltiesMatchSampler) {
  SamplingParams p;
  p.repetition_penalty = 1.7f;
  p.presence_penalty = 0.4f;
  p.frequency_penalty = 0.3f;
  const std::vector<int32_t> prompt = {3, 5, 5, 9}, generated = {9, 9, 1, 3, 11};
  for (uint32_t seed = 0; seed < 20; ++seed) {
    std::vector<float> l(16);
    for (size_t i = 0; i < l.size(); ++i) l[i] = float((i * 7 + seed * 13) % 11) * 0.37f - 1.5f;
    auto host = l;
    const int32_t want = Sampler(p).sample(host, prompt, generated);
    Tensor t = Tensor::empty(DType::F32, {1, int64_t(l.size())});
    std::copy(l.begin(), l.end(), t.data<float>());
    std::vector<ops::PenaltyEntry> pen;
    const ops::SampleRow row = Sampler(p).device_row(0, int32_t(l.size()), prompt, generated, pen);
    ops::apply_penalties(t, pen);
    for (size_t i = 0; i < l.size(); ++i) EXPECT_EQ(t.data<float>()[i], host[i]) << "logit " << i;
    int32_t got = -1;
    ops::sample(t, std::span(&row, 1), std::span(&got, 1));
    EXPECT_EQ(got, want) << "seed " << seed;
  }
}

// ops::sample draws only kept tokens, with softmax frequencies; one uniform
// per sampled row, from the Sampler's stream.
TEST(Sampler, OpsSampleKeepsFiltersAndFollowsSoftmax) {
  const std::vector<float> l = logits_for({0.05, 0.3, 0.1, 0.25, 0.2, 0.1});
  const int n = 4000;
  Tensor t = Tensor::empty(DType::F32, {n, int64_t(l.size())});
  for (int r = 0; r < n; ++r) std::copy(l.begin(), l.end(), t.data<float>() + r * int64_t(l.size()));
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 3;  // tokens 1, 3, 4
  p.seed = 5;
  Sampler s(p);
  std::vector<ops::SampleRow> rows;
  std::vector<ops::PenaltyEntry> pen;
  for (int r = 0; r < n; ++r) rows.push_back(s.device_row(r, int32_t(l.size()), {}, {}, pen));
  EXPECT_TRUE(pen.empty());
  std::vector<int32_t> ids(static_cast<size_t>(n));
  ops::sample(t, rows, ids);
  std::map<int32_t, int> hist;
  for (int32_t id : ids) ++hist[id];
  EXPECT_EQ(hist.size(), 3u);
  EXPECT_NEAR(hist[1] / double(n), 0.3 / 0.75, 0.03);
  EXPECT_NEAR(hist[3] / double(n), 0.25 / 0.75, 0.03);
  EXPECT_NEAR(hist[4] / double(n), 0.2 / 0.75, 0.03);
}

}  // namespace
}  // namespace augur
