// Property tests of the runtime over the real fixture models:
// a batch of rows equals each row alone; incremental decode equals full
// recompute; KV block size, prefill chunking and snapshots change nothing.
//
// Exactness: attention-only families are bit-exact under every change here.
// Hybrid families (Gated DeltaNet) are bit-exact under batching, block size and
// capture/restore, but a row's length picks the form of the delta rule
// (recurrent for short rows, chunked for long ones: gated_deltanet.h), so
// splitting a prompt differently changes logits within float rounding only:
// those comparisons use kFormTolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>

#include "core/error.h"
#include "runtime/runner.h"

namespace augur {
namespace {

const std::string kData = AUGUR_TEST_DATA;

// Largest logit difference allowed where the delta-rule form changes: the
// golden tolerance. The tiny hybrid fixtures amplify float rounding (their
// transformers float32 reference is itself ~2e-4 from a float64 forward); the
// forms differ by ~2e-4 with the f32 matmul paths.
constexpr float kFormTolerance = 1e-3f;

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

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

class Properties : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { model_ = load_model(kData + "/" + GetParam()); }
  bool hybrid() const { return model_->info().recurrent.n_layer > 0; }
  // Logit rows that must agree: bit for bit, or for a hybrid family within
  // kFormTolerance when the delta-rule form may differ between them.
  void expect_same(const std::vector<float>& got, const std::vector<float>& want, bool form_may_differ,
                   const std::string& what) const {
    if (form_may_differ && hybrid())
      EXPECT_LT(max_abs_diff(got, want), kFormTolerance) << what;
    else
      EXPECT_EQ(got, want) << what;
  }
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

// A step queued with its ids still where a sample left them (generate()'s
// decode on an accelerator) equals the step given the same ids, batched, and
// leaves the sequences one token short until the ids are appended.
TEST_P(Properties, StepAheadEqualsStep) {
  const int32_t V = int32_t(model_->info().n_vocab);
  RunnerOptions ro;
  ro.max_cached_tokens = 512;
  Runner a(*model_, ro), b(*model_, ro);
  std::vector<std::unique_ptr<Sequence>> sa, sb;
  std::vector<Sequence*> pa, pb;
  for (int r = 0; r < 3; ++r) {
    const auto prompt = random_ids(5 + 4 * r, V, 40 + uint32_t(r));
    sa.push_back(a.new_sequence());
    sb.push_back(b.new_sequence());
    a.feed(*sa.back(), prompt);
    b.feed(*sb.back(), prompt);
    pa.push_back(sa.back().get());
    pb.push_back(sb.back().get());
  }
  std::vector<int32_t> ids = random_ids(3, V, 50);
  const std::vector<int32_t> wants(3, 1);
  for (int s = 0; s < 3; ++s) {
    std::vector<std::span<const int32_t>> feed;
    for (auto& t : ids) feed.emplace_back(&t, 1);
    Tensor want = a.step(pa, feed, wants);
    Tensor got = b.step_ahead(pb, ops::SampledIds::on_host(ids).device());
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(sb[size_t(r)]->length() + 1, sa[size_t(r)]->length()) << "row " << r;
      EXPECT_EQ(row_of(got, r), row_of(want, r)) << "step " << s << " row " << r;
      sb[size_t(r)]->append({&ids[size_t(r)], 1});
    }
    ops::sample(want, std::vector<ops::SampleRow>(3), ids);
  }
  EXPECT_EQ(sa[0]->tokens(), sb[0]->tokens());
  EXPECT_THROW(b.step_ahead(pb, ops::SampledIds::on_host({ids.data(), 2}).device()), Error);
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
    expect_same(row_of(step, 0), row_of(full, int64_t(i)), true, "position " + std::to_string(i));
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
      if (chunk == 512 || !hybrid()) {
        ASSERT_EQ(0, std::memcmp(got.raw(), ref.raw(), ref.nbytes())) << "block " << bs << " chunk " << chunk;
      } else {
        for (int64_t i = 0; i < got.dim(0); ++i)
          expect_same(row_of(got, i), row_of(ref, i), true,
                      "block " + std::to_string(bs) + " chunk " + std::to_string(chunk) + " position " + std::to_string(i));
      }
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
    expect_same(row_of(b1, i), row_of(ref_b, int64_t(prompt.size()) + i), true, "fork logit " + std::to_string(i));

  // Rolling back by truncation equals never having fed the tokens (recurrent
  // state cannot be truncated: RecurrentRollback covers the hybrids).
  if (hybrid()) return;
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

// Chunked prefill: a prompt fed in pieces split at arbitrary points (across the
// 64-token chunks of the delta rule, and rows short enough for its recurrent
// form) equals the prompt fed at once, and so do the decode steps after it.
TEST_P(Properties, PrefillSplitAnywhereEqualsOneShot) {
  const int32_t V = int32_t(model_->info().n_vocab);
  auto ids = random_ids(200, V, 61);
  auto next = random_ids(3, V, 62);
  RunnerOptions ro;
  ro.max_cached_tokens = 512;
  ro.prefill_chunk = 1024;
  auto run = [&](const std::vector<int64_t>& cuts) {
    Runner runner(*model_, ro);
    auto seq = runner.new_sequence();
    std::vector<std::vector<float>> out;
    int64_t at = 0;
    for (int64_t cut : cuts) {
      Tensor l = runner.feed(*seq, std::span<const int32_t>(ids.data() + at, size_t(cut - at)));
      at = cut;
      if (at == int64_t(ids.size())) out.push_back(row_of(l, 0));
    }
    for (int32_t t : next) out.push_back(row_of(runner.feed(*seq, std::span<const int32_t>(&t, 1)), 0));
    return out;
  };
  const auto one_shot = run({200});
  for (const auto& cuts : std::vector<std::vector<int64_t>>{
           {1, 200}, {63, 64, 65, 200}, {17, 100, 101, 199, 200}, {5, 10, 150, 166, 200}}) {
    const auto split = run(cuts);
    std::ostringstream name;
    name << "cuts";
    for (int64_t c : cuts) name << ' ' << c;
    for (size_t i = 0; i < split.size(); ++i)
      expect_same(split[i], one_shot[i], true, name.str() + ", output " + std::to_string(i));
  }
}

// A verify window (a short row after a prefix) gives the logits and the state
// of feeding its tokens one at a time, bit for bit: speculative rounds can
// accept a prefix of the window exactly.
TEST_P(Properties, ShortWindowEqualsTokenByToken) {
  const int32_t V = int32_t(model_->info().n_vocab);
  auto prompt = random_ids(37, V, 91), window = random_ids(8, V, 92), after = random_ids(2, V, 93);
  Runner runner(*model_, {});
  auto a = runner.new_sequence();
  runner.feed(*a, prompt);
  Tensor together = runner.feed(*a, window, true);
  Tensor a_after = runner.feed(*a, after, true);
  auto b = runner.new_sequence();
  runner.feed(*b, prompt);
  for (size_t i = 0; i < window.size(); ++i) {
    Tensor one = runner.feed(*b, std::span<const int32_t>(&window[i], 1));
    EXPECT_EQ(row_of(one, 0), row_of(together, int64_t(i))) << "window token " << i;
  }
  Tensor b_after = runner.feed(*b, after, true);
  EXPECT_EQ(0, std::memcmp(a_after.raw(), b_after.raw(), a_after.nbytes()));
}

// Capture, go elsewhere, restore, continue: bit-identical to never stopping.
TEST_P(Properties, CaptureRestoreContinueEqualsNeverStopping) {
  const int32_t V = int32_t(model_->info().n_vocab);
  auto prompt = random_ids(45, V, 71), cont = random_ids(9, V, 72), other = random_ids(20, V, 73);
  RunnerOptions ro;
  ro.block_size = 4;
  Runner runner(*model_, ro);

  auto straight = runner.new_sequence();
  runner.feed(*straight, prompt);
  Tensor want = runner.feed(*straight, cont, true);
  std::vector<Tensor> want_steps;
  for (int32_t t : other) want_steps.push_back(runner.feed(*straight, std::span<const int32_t>(&t, 1)));

  auto seq = runner.new_sequence();
  runner.feed(*seq, prompt);
  SequenceSnapshot snap = seq->capture();
  runner.feed(*seq, other, true);  // wander off
  seq->restore(snap);
  Tensor got = runner.feed(*seq, cont, true);
  EXPECT_EQ(0, std::memcmp(got.raw(), want.raw(), want.nbytes()));
  for (size_t i = 0; i < other.size(); ++i) {
    Tensor step = runner.feed(*seq, std::span<const int32_t>(&other[i], 1));
    ASSERT_EQ(0, std::memcmp(step.raw(), want_steps[i].raw(), step.nbytes())) << "step " << i;
  }

  // A copy of the snapshot restored into another sequence continues the same.
  SequenceSnapshot copy = snap;
  snap = SequenceSnapshot();
  auto fork = runner.new_sequence();
  fork->restore(copy);
  Tensor forked = runner.feed(*fork, cont, true);
  EXPECT_EQ(0, std::memcmp(forked.raw(), want.raw(), want.nbytes()));
}

// Hybrid rollback: truncation goes back exactly to the last captured point and
// nowhere else.
TEST_P(Properties, RecurrentRollback) {
  if (!hybrid()) GTEST_SKIP() << "no recurrent state";
  const int32_t V = int32_t(model_->info().n_vocab);
  auto prompt = random_ids(30, V, 81), drafts = random_ids(5, V, 82), accepted = random_ids(4, V, 83);
  Runner runner(*model_, {});
  auto seq = runner.new_sequence();
  runner.feed(*seq, prompt);
  SequenceSnapshot snap = seq->capture();
  runner.feed(*seq, drafts, true);
  try {
    seq->truncate(int64_t(prompt.size()) + 2);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("snapshot"), std::string::npos) << e.what();
  }
  seq->truncate(int64_t(prompt.size()));  // the captured point: exact
  EXPECT_EQ(seq->length(), int64_t(prompt.size()));
  Tensor got = runner.feed(*seq, accepted, true);

  auto ref = runner.new_sequence();
  runner.feed(*ref, prompt);
  Tensor want = runner.feed(*ref, accepted, true);
  EXPECT_EQ(0, std::memcmp(got.raw(), want.raw(), want.nbytes()));
}

TEST_P(Properties, StateSlotsAreLimitedAndReturned) {
  if (!hybrid()) GTEST_SKIP() << "no recurrent state";
  RunnerOptions ro;
  ro.max_sequences = 2;
  Runner runner(*model_, ro);
  {
    auto a = runner.new_sequence();
    auto b = runner.new_sequence();
    EXPECT_NE(a->state_slot(), b->state_slot());
    EXPECT_EQ(runner.slots().n_free(), 0);
    EXPECT_THROW(runner.new_sequence(), Error);
  }
  EXPECT_EQ(runner.slots().n_free(), 2);
  // A forward without a slot is an error naming the need.
  KvCache kv(model_->info().kv, 4, 16);
  std::vector<int32_t> ids = {1, 2}, table = {0};
  ForwardRow row{ids, 0, table, 1};
  Tensor logits = Tensor::empty(DType::F32, {1, model_->info().n_vocab});
  try {
    Executor executor(Device::CPU);
    model_->forward(executor, {&row, 1}, kv, logits);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("recurrent state"), std::string::npos) << e.what();
  }
}

// Runner::warm_up (what an engine on an accelerator runs at load, with
// verify windows of up to 5 tokens after it where it speculates) gives back
// every block and slot it took, and what is fed after it is what a runner
// that never warmed up computes, bit for bit. The cache is small, so the
// warm-up's lengths are bounded by it (16, 32, 49 tokens, then windows of
// 5, 4, 3, 2 and 1 filling the 64).
TEST_P(Properties, WarmUpLeavesNothingBehind) {
  const int32_t V = int32_t(model_->info().n_vocab);
  auto ids = random_ids(30, V, 41);
  RunnerOptions ro;
  ro.max_cached_tokens = 64;
  ro.block_size = 8;
  ro.max_sequences = 1;
  Tensor ref = all_logits(*model_, ids, ro);
  Runner runner(*model_, ro);
  runner.warm_up(512, 5);
  EXPECT_EQ(runner.pool().n_free(), runner.pool().n_blocks());
  EXPECT_EQ(runner.slots().n_free(), runner.slots().n_slots());
  auto seq = runner.new_sequence();
  Tensor got = runner.feed(*seq, ids, true);
  ASSERT_EQ(0, std::memcmp(got.raw(), ref.raw(), ref.nbytes()));
}

INSTANTIATE_TEST_SUITE_P(Families, Properties,
                         ::testing::Values("llama", "qwen3", "qwen3_5", "qwen3_5_moe", "qwen3_next"));

}  // namespace
}  // namespace augur
