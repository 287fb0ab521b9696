// Property tests of the runtime over the real fixture models:
// a batch of rows equals each row alone; incremental decode equals full
// recompute; KV block size, prefill chunking and snapshots change nothing.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "core/error.h"
#include "runtime/runner.h"

namespace augur {
namespace {

const std::string kData = AUGUR_TEST_DATA;

std::vector<int32_t> random_ids(int n, int32_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = int32_t(rng() % uint32_t(n_vocab));
  return ids;
}

std::vector<float> row_of(const Tensor& t, int64_t r) {
  const int64_t V = t.dim(1);
  return std::vector<float>(t.data<float>() + r * V, t.data<float>() + (r + 1) * V);
}

// Logits at every position, fed in one run.
Tensor all_logits(Model& model, const std::vector<int32_t>& ids, RunnerOptions ro = {}) {
  Runner runner(model, ro);
  auto seq = runner.new_sequence();
  return runner.feed(*seq, ids, true);
}

class Properties : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { model_ = load_model(kData + "/" + GetParam()); }
  std::unique_ptr<Model> model_;
};

TEST_P(Properties, BatchOfRowsEqualsEachRowAlone) {
  const int32_t V = int32_t(model_->info().n_vocab);
  // Rows of different kinds in one forward: two prefills, a decode after a
  // prefix, and a multi-token window after a prefix.
  std::vector<std::vector<int32_t>> prefix = {{}, {}, random_ids(9, V, 1), random_ids(21, V, 2)};
  std::vector<std::vector<int32_t>> feed = {random_ids(7, V, 3), random_ids(33, V, 4), random_ids(1, V, 5),
                                            random_ids(4, V, 6)};
  std::vector<int32_t> n_logits = {7, 1, 1, 4};

  RunnerOptions ro;
  ro.max_cached_tokens = 1024;
  Runner batched(*model_, ro);
  std::vector<std::unique_ptr<Sequence>> seqs;
  std::vector<Sequence*> ptrs;
  for (auto& p : prefix) {
    seqs.push_back(batched.new_sequence());
    if (!p.empty()) batched.feed(*seqs.back(), p);
    ptrs.push_back(seqs.back().get());
  }
  std::vector<std::span<const int32_t>> spans(feed.begin(), feed.end());
  Tensor together = batched.step(ptrs, spans, n_logits);

  int64_t out_row = 0;
  for (size_t r = 0; r < feed.size(); ++r) {
    Runner alone(*model_, ro);
    auto seq = alone.new_sequence();
    if (!prefix[r].empty()) alone.feed(*seq, prefix[r]);
    Sequence* one[] = {seq.get()};
    std::span<const int32_t> f[] = {feed[r]};
    int32_t want[] = {n_logits[r]};
    Tensor single = alone.step(one, f, want);
    for (int32_t i = 0; i < n_logits[r]; ++i, ++out_row)
      EXPECT_EQ(row_of(together, out_row), row_of(single, i)) << "row " << r << " logit " << i;
  }
}

TEST_P(Properties, IncrementalDecodeEqualsFullRecompute) {
  const int32_t V = int32_t(model_->info().n_vocab);
  auto ids = random_ids(40, V, 11);
  Tensor full = all_logits(*model_, ids);
  RunnerOptions ro;
  ro.block_size = 8;
  Runner runner(*model_, ro);
  auto seq = runner.new_sequence();
  runner.feed(*seq, std::span<const int32_t>(ids.data(), 10));
  for (size_t i = 10; i < ids.size(); ++i) {
    Tensor step = runner.feed(*seq, std::span<const int32_t>(&ids[i], 1));
    EXPECT_EQ(row_of(step, 0), row_of(full, int64_t(i))) << "position " << i;
  }
}

TEST_P(Properties, BlockSizeAndChunkingDoNotChangeLogits) {
  const int32_t V = int32_t(model_->info().n_vocab);
  auto ids = random_ids(70, V, 21);
  Tensor ref = all_logits(*model_, ids);
  for (int64_t bs : {1, 3, 16, 128}) {
    for (int64_t chunk : {1, 7, 512}) {
      RunnerOptions ro;
      ro.block_size = bs;
      ro.prefill_chunk = chunk;
      Tensor got = all_logits(*model_, ids, ro);
      ASSERT_EQ(0, std::memcmp(got.raw(), ref.raw(), ref.nbytes())) << "block " << bs << " chunk " << chunk;
    }
  }
}

TEST_P(Properties, SnapshotRestoreAndForkAreExact) {
  const int32_t V = int32_t(model_->info().n_vocab);
  auto prompt = random_ids(13, V, 31);  // ends mid-block: forks must copy-on-write
  auto cont_a = random_ids(6, V, 32), cont_b = random_ids(6, V, 33);
  RunnerOptions ro;
  ro.block_size = 4;
  Runner runner(*model_, ro);
  auto seq = runner.new_sequence();
  runner.feed(*seq, prompt);
  SequenceSnapshot snap = seq->capture();

  Tensor a1 = runner.feed(*seq, cont_a, true);
  auto fork = runner.new_sequence();
  fork->restore(snap);
  Tensor b1 = runner.feed(*fork, cont_b, true);  // must not disturb seq's blocks
  seq->restore(snap);
  Tensor a2 = runner.feed(*seq, cont_a, true);
  EXPECT_EQ(0, std::memcmp(a1.raw(), a2.raw(), a1.nbytes()));

  std::vector<int32_t> full_b = prompt;
  full_b.insert(full_b.end(), cont_b.begin(), cont_b.end());
  Tensor ref_b = all_logits(*model_, full_b);
  for (int64_t i = 0; i < int64_t(cont_b.size()); ++i)
    EXPECT_EQ(row_of(b1, i), row_of(ref_b, int64_t(prompt.size()) + i));

  // Rolling back by truncation equals never having fed the tokens.
  seq->truncate(int64_t(prompt.size()) + 2);
  Tensor after = runner.feed(*seq, std::span<const int32_t>(cont_b.data(), 3), true);
  std::vector<int32_t> mixed = prompt;
  mixed.insert(mixed.end(), cont_a.begin(), cont_a.begin() + 2);
  mixed.insert(mixed.end(), cont_b.begin(), cont_b.begin() + 3);
  Tensor ref_mixed = all_logits(*model_, mixed);
  for (int64_t i = 0; i < 3; ++i)
    EXPECT_EQ(row_of(after, i), row_of(ref_mixed, int64_t(mixed.size()) - 3 + i));
}

TEST_P(Properties, BlocksAreReturnedToThePool) {
  RunnerOptions ro;
  ro.block_size = 4;
  ro.max_cached_tokens = 64;
  Runner runner(*model_, ro);
  const int64_t free0 = runner.pool().n_free();
  {
    auto seq = runner.new_sequence();
    runner.feed(*seq, random_ids(30, int32_t(model_->info().n_vocab), 41));
    SequenceSnapshot snap = seq->capture();
    EXPECT_LT(runner.pool().n_free(), free0);
  }
  EXPECT_EQ(runner.pool().n_free(), free0);
}

TEST_P(Properties, FullCacheIsAnError) {
  RunnerOptions ro;
  ro.block_size = 4;
  ro.max_cached_tokens = 16;
  Runner runner(*model_, ro);
  auto seq = runner.new_sequence();
  auto ids = random_ids(17, int32_t(model_->info().n_vocab), 51);
  EXPECT_THROW(runner.feed(*seq, ids), Error);
}

TEST_P(Properties, BadTokenIdsAreErrors) {
  Runner runner(*model_, {});
  auto seq = runner.new_sequence();
  std::vector<int32_t> bad = {1, int32_t(model_->info().n_vocab)};
  try {
    runner.feed(*seq, bad);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside the vocabulary"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Families, Properties, ::testing::Values("llama", "qwen3"));

}  // namespace
}  // namespace augur
