#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/error.h"
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

}  // namespace
}  // namespace augur
