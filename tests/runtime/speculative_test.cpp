// Speculative decoding: drafts verified by one target forward leave greedy
// output exactly what plain greedy decoding gives, on every family, alone and
// batched; a rejected draft's state is rolled back bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>

#include "core/error.h"
#include "runtime/engine.h"

namespace augur {
namespace {

const std::string kData = AUGUR_TEST_DATA;
const std::string kTiny = kData + "/../../models/augur-tiny";

std::string dir_of(const std::string& name) { return name == "augur-tiny" ? kTiny : kData + "/" + name; }

// A prompt that repeats itself, so that prompt lookup has something to find.
std::vector<int32_t> looping_prompt(int64_t n_vocab, uint32_t seed, int n = 24) {
  std::mt19937 rng(seed);
  std::vector<int32_t> motif(5);
  for (auto& t : motif) t = int32_t(rng() % uint32_t(n_vocab));
  std::vector<int32_t> ids;
  while (int(ids.size()) < n) {
    ids.insert(ids.end(), motif.begin(), motif.end());
    ids.push_back(int32_t(rng() % uint32_t(n_vocab)));
  }
  ids.resize(size_t(n));
  return ids;
}

struct Outcome {
  std::vector<int32_t> ids;
  DraftStats drafts;
};

// Each prompt's greedy continuation, the requests decoding together.
std::vector<Outcome> generate(Engine& e, const std::vector<std::vector<int32_t>>& prompts, int64_t n,
                              const std::string& draft, int32_t k = 4, const std::vector<int32_t>& replay = {}) {
  RequestParams p;
  p.ignore_eos = true;
  p.max_tokens = n;
  p.speculation.draft = draft;
  p.speculation.k = k;
  p.speculation.replay = replay;
  std::vector<RequestId> ids;
  for (const auto& prompt : prompts) ids.push_back(e.submit(Prompt::of_ids(prompt), p));
  std::map<RequestId, Outcome> got;
  while (!e.idle())
    for (Event& ev : e.step()) {
      auto& o = got[ev.id];
      o.ids.insert(o.ids.end(), ev.ids.begin(), ev.ids.end());
      if (ev.done) o.drafts = ev.drafts;
    }
  std::vector<Outcome> out;
  for (RequestId id : ids) out.push_back(got[id]);
  return out;
}

std::unique_ptr<Engine> engine_for(const std::string& name, int64_t max_sequences = 1) {
  EngineOptions eo;
  eo.max_cached_tokens = 8192;
  eo.max_sequences = max_sequences;
  return std::make_unique<Engine>(load_model(dir_of(name)), std::nullopt, eo);
}

class Speculative : public ::testing::TestWithParam<std::string> {};

void print_stats(const std::string& what, const DraftStats& d) {
  std::printf("[spec] %s: %lld of %lld drafts accepted in %lld rounds (%lld whole)\n", what.c_str(),
              (long long)d.accepted, (long long)d.drafted, (long long)d.rounds, (long long)d.full_rounds);
}

// Over 256 generated tokens, n-gram speculation gives plain greedy's output
// token for token. (The random-weight hybrids rarely repeat themselves, so
// their drafts are mostly rejected: the replay test below makes both kinds
// of round happen on every family.)
TEST_P(Speculative, NgramGreedyEqualsPlainGreedy) {
  auto e = engine_for(GetParam());
  const auto prompt = looping_prompt(e->info().n_vocab, 11);
  const Outcome plain = generate(*e, {prompt}, 256, "")[0];
  for (int32_t k : {1, 4}) {
    const Outcome spec = generate(*e, {prompt}, 256, "ngram", k)[0];
    ASSERT_EQ(plain.ids.size(), 256u);
    EXPECT_EQ(spec.ids, plain.ids) << "k = " << k;
    print_stats(GetParam() + " ngram k=" + std::to_string(k), spec.drafts);
    EXPECT_GT(spec.drafts.rounds - spec.drafts.full_rounds, 0) << "no round rejected a draft";
  }
  EXPECT_EQ(plain.drafts.rounds, 0);
}

// Drafts replaying plain greedy's own continuation with every 9th token
// altered: rounds that accept every draft and rounds that reject some both
// happen, and the output is still plain greedy's, over 256 tokens.
TEST_P(Speculative, ReplayedDraftsWithErrorsEqualPlainGreedy) {
  auto e = engine_for(GetParam());
  const int64_t V = e->info().n_vocab;
  const auto prompt = looping_prompt(V, 23);
  const Outcome plain = generate(*e, {prompt}, 256, "")[0];
  std::vector<int32_t> record = prompt;
  for (size_t i = 0; i < plain.ids.size(); ++i)
    record.push_back(i % 9 == 4 ? int32_t((plain.ids[i] + 1) % V) : plain.ids[i]);
  for (int32_t k : {1, 3, 7}) {
    const Outcome spec = generate(*e, {prompt}, 256, "replay", k, record)[0];
    EXPECT_EQ(spec.ids, plain.ids) << "k = " << k;
    const DraftStats& d = spec.drafts;
    print_stats(GetParam() + " replay k=" + std::to_string(k), d);
    EXPECT_GT(d.full_rounds, 0) << "no round accepted every draft, k = " << k;
    EXPECT_GT(d.rounds - d.full_rounds, 0) << "no round rejected a draft, k = " << k;
  }
}

// Eight rows with different prompts, drafts and accept lengths decode
// together exactly as each alone.
TEST_P(Speculative, BatchEqualsEachAlone) {
  auto e = engine_for(GetParam(), 8);
  std::vector<std::vector<int32_t>> prompts;
  for (uint32_t i = 0; i < 8; ++i) prompts.push_back(looping_prompt(e->info().n_vocab, 100 + i, 12 + 3 * int(i)));
  const auto together = generate(*e, prompts, 48, "ngram");  // rows propose different drafts
  int64_t rounds = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto alone = generate(*e, {prompts[i]}, 48, "ngram")[0];
    EXPECT_EQ(together[i].ids, alone.ids) << "row " << i;
    EXPECT_EQ(together[i].ids, generate(*e, {prompts[i]}, 48, "")[0].ids) << "row " << i;
    rounds += together[i].drafts.rounds;
  }
  EXPECT_GT(rounds, 0);
}

INSTANTIATE_TEST_SUITE_P(Families, Speculative,
                         ::testing::Values("llama", "qwen3", "qwen3_5", "qwen3_5_moe", "qwen3_next", "augur-tiny"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

// The rollback itself, per hybrid fixture: after a verify of k drafts of
// which j are kept (every j in 0..k), the recurrent state and the next
// logits equal, bit for bit, those of a sequence fed only the kept tokens.
class Rollback : public ::testing::TestWithParam<std::string> {};

TEST_P(Rollback, KeptDraftsLeaveTheStateOfFeedingOnlyThem) {
  auto model = load_model(kData + "/" + GetParam());
  RunnerOptions ro;
  ro.max_sequences = 2;
  Runner runner(*model, ro);
  const int64_t V = model->info().n_vocab;
  const auto prompt = looping_prompt(V, 5, 9);
  const std::vector<int32_t> feed = {7, 3, 9, 1, 4};  // the pending token, then k = 4 drafts
  auto logits_after = [&](Sequence& s) {
    const int32_t next = 2;
    Sequence* seqs[] = {&s};
    const std::span<const int32_t> tokens[] = {{&next, 1}};
    const int32_t wants[] = {1};
    return runner.step(seqs, tokens, wants);
  };
  for (int64_t j = 0; j + 1 <= int64_t(feed.size()); ++j) {
    auto spec = runner.new_sequence();
    runner.feed(*spec, prompt, false);
    spec->capture();
    {
      Sequence* seqs[] = {spec.get()};
      const std::span<const int32_t> tokens[] = {feed};
      const int32_t wants[] = {int32_t(feed.size())};
      runner.step(seqs, tokens, wants);
      const int64_t keep[] = {int64_t(prompt.size()) + 1 + j};
      runner.rollback(seqs, keep);
    }
    auto plain = runner.new_sequence();
    runner.feed(*plain, prompt, false);
    for (int64_t t = 0; t <= j; ++t) runner.feed(*plain, std::span<const int32_t>(&feed[size_t(t)], 1), false);
    ASSERT_EQ(spec->tokens(), plain->tokens()) << "j = " << j;
    const Tensor a = runner.kv().save_slot(spec->state_slot()), b = runner.kv().save_slot(plain->state_slot());
    ASSERT_EQ(a.nbytes(), b.nbytes());
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << "recurrent state, j = " << j;
    const Tensor la = logits_after(*spec), lb = logits_after(*plain);
    EXPECT_EQ(std::memcmp(la.raw(), lb.raw(), la.nbytes()), 0) << "next logits (K/V and state), j = " << j;
  }
}

INSTANTIATE_TEST_SUITE_P(Hybrids, Rollback, ::testing::Values("qwen3_5", "qwen3_5_moe", "qwen3_next"));

TEST(SpeculativeRequests, BadParametersAreClearErrors) {
  auto e = engine_for("qwen3");
  const std::vector<int32_t> prompt = {1, 2, 3};
  auto submit = [&](auto edit) {
    RequestParams p;
    p.speculation.draft = "ngram";
    edit(p);
    return [&e, &prompt, p] { e->submit(Prompt::of_ids(prompt), p); };
  };
  auto expect_error = [](const std::function<void()>& f, const std::string& what) {
    try {
      f();
      ADD_FAILURE() << "expected an error naming " << what;
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find(what), std::string::npos) << err.what();
    }
  };
  expect_error(submit([](RequestParams& p) { p.speculation.draft = "nope"; }), "nope");
  expect_error(submit([](RequestParams& p) { p.speculation.k = 0; }), "draft tokens");
  expect_error(submit([](RequestParams& p) { p.speculation.ngram.min_n = 0; }), "n-gram");
  expect_error(submit([](RequestParams& p) { p.sampling.temperature = 0.7f; }), "greedy");
  expect_error(submit([](RequestParams& p) { p.logprobs = 0; }), "logprobs");
}

// Prompt lookup proposes what followed the first earlier occurrence of the
// longest suffix it finds.
TEST(NgramDraft, LongestSuffixFirstOccurrence) {
  NgramDraft d({3, 1});
  const std::vector<int32_t> h = {5, 6, 7, 8, 1, 6, 7, 9, 2, 6, 7};
  // suffix [6, 7] (no earlier [9, 6, 7]... [2,6,7]): first occurrence at 1, followed by 8, 1, 6
  EXPECT_EQ(d.propose(h, 3), (std::vector<int32_t>{8, 1, 6}));
  EXPECT_EQ(d.propose(h, 1), (std::vector<int32_t>{8}));
  const std::vector<int32_t> none = {1, 2, 3, 4};
  EXPECT_TRUE(d.propose(none, 4).empty());
  NgramDraft tri({3, 3});
  EXPECT_TRUE(tri.propose(h, 4).empty());  // no earlier [2, 6, 7]
}

}  // namespace
}  // namespace augur
