// Perplexity windows against an independent computation: every window fed
// one token at a time (the decode path), NLL from the log-softmax of each
// step's logits. Covers the window arithmetic (shared ids between windows, the
// short last window, max_windows) and that windows start fresh.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.h"
#include "runtime/perplexity.h"

namespace augur {
namespace {

const std::string kData = AUGUR_TEST_DATA;

double nll_of(const Tensor& logits, int32_t target) {
  const int64_t V = logits.dim(1);
  const float* row = logits.data<float>();
  double mx = row[0];
  for (int64_t v = 1; v < V; ++v) mx = std::max(mx, double(row[v]));
  double z = 0;
  for (int64_t v = 0; v < V; ++v) z += std::exp(double(row[v]) - mx);
  return std::log(z) + mx - double(row[target]);
}

class PerplexityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PerplexityTest, WindowsMatchTokenByTokenDecode) {
  EngineOptions eo;
  eo.max_cached_tokens = 64;
  eo.max_sequences = 2;
  Engine engine(load_model(kData + "/" + GetParam()), std::nullopt, eo);
  Model* model = &engine.model();
  const int32_t V = int32_t(model->info().n_vocab);
  std::mt19937 rng(7);
  std::vector<int32_t> ids(38);
  for (auto& t : ids) t = int32_t(rng() % uint32_t(V));
  const int64_t W = 10;  // windows: [0,11) [10,21) [20,31) [30,38): 10+10+10+7 predicted

  RunnerOptions ro;
  ro.max_cached_tokens = 64;
  ro.max_sequences = 2;
  PerplexityOptions po;
  po.window = W;
  po.keep_token_nll = true;
  int64_t seen = 0;
  po.on_window = [&](int64_t done, int64_t total) {
    EXPECT_EQ(done, ++seen);
    EXPECT_EQ(total, 4);
  };
  const PerplexityResult r = perplexity(engine, ids, po);
  ASSERT_EQ(r.windows, 4);
  ASSERT_EQ(r.tokens, 37);
  ASSERT_EQ(r.token_nll.size(), 37u);

  std::vector<double> want;
  Runner ref(*model, ro);
  for (int64_t begin = 0; begin + 1 < int64_t(ids.size()); begin += W) {
    auto seq = ref.new_sequence();
    const int64_t end = std::min<int64_t>(int64_t(ids.size()), begin + W + 1);
    for (int64_t t = begin; t + 1 < end; ++t) {
      const int32_t tok[] = {ids[size_t(t)]};
      want.push_back(nll_of(ref.feed(*seq, tok), ids[size_t(t + 1)]));
    }
  }
  ASSERT_EQ(want.size(), 37u);
  double sum = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(r.token_nll[i], want[i], 2e-3) << "token " << i;
    sum += want[i];
  }
  EXPECT_NEAR(r.mean_nll, sum / 37.0, 1e-4);
  EXPECT_NEAR(r.ppl, std::exp(sum / 37.0), 1e-3 * r.ppl);

  po.max_windows = 2;
  po.on_window = nullptr;
  const PerplexityResult two = perplexity(engine, ids, po);
  EXPECT_EQ(two.windows, 2);
  EXPECT_EQ(two.tokens, 20);
  for (size_t i = 0; i < 20; ++i) EXPECT_EQ(two.token_nll[i], r.token_nll[i]);
}

INSTANTIATE_TEST_SUITE_P(Families, PerplexityTest, ::testing::Values("qwen3", "qwen3_5"));

TEST(PerplexityErrors, RejectsShortTextAndForeignIds) {
  Engine engine(load_model(kData + "/qwen3"), std::nullopt, {});
  Model* model = &engine.model();
  const std::vector<int32_t> one = {5};
  EXPECT_THROW(perplexity(engine, one, {}), Error);
  const std::vector<int32_t> bad = {5, int32_t(model->info().n_vocab)};
  EXPECT_THROW(perplexity(engine, bad, {}), Error);
  PerplexityOptions po;
  po.window = 0;
  const std::vector<int32_t> ok = {5, 6, 7};
  EXPECT_THROW(perplexity(engine, ok, po), Error);
}

}  // namespace
}  // namespace augur
