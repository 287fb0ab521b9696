// Speculative decoding: drafts verified by one target forward leave greedy
// output exactly what plain greedy decoding gives, on every family, alone and
// batched; a rejected draft's state is rolled back bit for bit; sampled
// output follows plain sampling's distribution.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <set>

#include "backend/ops.h"

#include "core/error.h"
#include "runtime/engine.h"
#include "families.h"

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
  // Windows of up to 1 + 7 tokens roll back from their kept inputs.
  EXPECT_EQ(e->runner().refed_tokens(), 0) << "a rollback fed tokens through the model again";
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

INSTANTIATE_TEST_SUITE_P(Families, Speculative, test::every_family(), test::family_test_name);

// The rollback itself, per hybrid fixture: after a verify of k drafts of
// which j are kept (every j in 0..k), the recurrent state and the next
// logits equal, bit for bit, those of a sequence fed only the kept tokens.
// A window of up to KvCache::kInputHistory tokens rolls back by replaying
// the recurrence from its kept inputs (nothing fed again); a longer one by
// feeding the kept tokens again.
class Rollback : public ::testing::TestWithParam<std::string> {};

TEST_P(Rollback, KeptDraftsLeaveTheStateOfFeedingOnlyThem) {
  auto model = load_model(dir_of(GetParam()));
  RunnerOptions ro;
  ro.max_sequences = 2;
  Runner runner(*model, ro);
  const int64_t V = model->info().n_vocab;
  const auto prompt = looping_prompt(V, 5, 9);
  auto logits_after = [&](Sequence& s) {
    const int32_t next = 2;
    Sequence* seqs[] = {&s};
    const std::span<const int32_t> tokens[] = {{&next, 1}};
    const int32_t wants[] = {1};
    return runner.step(seqs, tokens, wants);
  };
  // The pending token, then k = 4 drafts; then k = 10, past the history.
  const std::vector<std::vector<int32_t>> windows = {{7, 3, 9, 1, 4}, {7, 3, 9, 1, 4, 8, 8, 2, 6, 5, 1}};
  ASSERT_GT(int64_t(windows[1].size()), KvCache::kInputHistory);
  for (const auto& feed : windows) {
    const bool replayed = int64_t(feed.size()) <= KvCache::kInputHistory;
    for (int64_t j = 0; j + 1 <= int64_t(feed.size()); ++j) {
      auto spec = runner.new_sequence();
      runner.feed(*spec, prompt, false);
      spec->capture();
      const int64_t refed = runner.refed_tokens();
      {
        Sequence* seqs[] = {spec.get()};
        const std::span<const int32_t> tokens[] = {feed};
        const int32_t wants[] = {int32_t(feed.size())};
        runner.step(seqs, tokens, wants);
        const int64_t keep[] = {int64_t(prompt.size()) + 1 + j};
        runner.rollback(seqs, keep);
      }
      const bool all = j + 1 == int64_t(feed.size());
      EXPECT_EQ(runner.refed_tokens() - refed, replayed || all ? 0 : j + 1)
          << "tokens fed again, window of " << feed.size() << ", j = " << j;
      auto plain = runner.new_sequence();
      runner.feed(*plain, prompt, false);
      for (int64_t t = 0; t <= j; ++t) runner.feed(*plain, std::span<const int32_t>(&feed[size_t(t)], 1), false);
      ASSERT_EQ(spec->tokens(), plain->tokens()) << "j = " << j;
      const Tensor a = runner.kv().save_slot(spec->state_slot()), b = runner.kv().save_slot(plain->state_slot());
      ASSERT_EQ(a.nbytes(), b.nbytes());
      EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0)
          << "recurrent state, window of " << feed.size() << ", j = " << j;
      const Tensor la = logits_after(*spec), lb = logits_after(*plain);
      EXPECT_EQ(std::memcmp(la.raw(), lb.raw(), la.nbytes()), 0)
          << "next logits (K/V and state), window of " << feed.size() << ", j = " << j;
    }
  }
}

// Two rows rolled back in one call, each from its own window (one replayed,
// one fed again), then a second round from the rolled-back state: each row
// equals its sequence alone.
TEST_P(Rollback, RowsRollBackTogetherAndRoundsChain) {
  auto model = load_model(dir_of(GetParam()));
  RunnerOptions ro;
  ro.max_sequences = 4;
  Runner runner(*model, ro);
  const int64_t V = model->info().n_vocab;
  const auto p0 = looping_prompt(V, 5, 9), p1 = looping_prompt(V, 7, 11);
  const std::vector<int32_t> w0 = {7, 3, 9, 1, 4, 8}, w1 = {2, 5, 5, 1, 3, 9, 9, 8, 4, 6};
  auto a = runner.new_sequence(), b = runner.new_sequence();
  runner.feed(*a, p0, false);
  runner.feed(*b, p1, false);
  std::vector<int32_t> kept0(w0.begin(), w0.begin() + 3), kept1(w1.begin(), w1.begin() + 2);
  for (int round = 0; round < 2; ++round) {
    a->capture();
    b->capture();
    Sequence* seqs[] = {a.get(), b.get()};
    const std::span<const int32_t> tokens[] = {w0, w1};
    const int32_t wants[] = {1, 1};
    runner.step(seqs, tokens, wants);
    const int64_t keep[] = {a->length() - int64_t(w0.size()) + 3, b->length() - int64_t(w1.size()) + 2};
    runner.rollback(seqs, keep);
  }
  for (auto [seq, prompt, kept] : {std::tuple{a.get(), p0, kept0}, std::tuple{b.get(), p1, kept1}}) {
    auto alone = runner.new_sequence();
    runner.feed(*alone, prompt, false);
    for (int round = 0; round < 2; ++round)
      for (int32_t t : kept) runner.feed(*alone, std::span<const int32_t>(&t, 1), false);
    ASSERT_EQ(seq->tokens(), alone->tokens());
    const Tensor x = runner.kv().save_slot(seq->state_slot()), y = runner.kv().save_slot(alone->state_slot());
    EXPECT_EQ(std::memcmp(x.raw(), y.raw(), x.nbytes()), 0) << "recurrent state";
  }
}

INSTANTIATE_TEST_SUITE_P(Hybrids, Rollback, ::testing::Values("qwen3_5", "qwen3_5_moe", "qwen3_next", "augur-tiny"));

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
  expect_error(submit([](RequestParams& p) { p.speculation.draft = "replay"; }), "record");
}

// Before a step, rows get blocks for the drafts they may take, not for k:
// two rows of 8 tokens with 6 to make take one block each (at most 1 + 4
// tokens fed a step), so in a cache of two blocks neither is preempted for
// the 1 + 16 a k of 16 would cover, and their output is plain greedy's.
TEST(SpeculativeRequests, RowsReserveBlocksForTheDraftsTheyMayTake) {
  EngineOptions eo;
  eo.max_cached_tokens = 32;  // two blocks of 16
  eo.max_sequences = 2;
  Engine e(load_model(dir_of("qwen3")), std::nullopt, eo);
  const std::vector<std::vector<int32_t>> prompts = {looping_prompt(e.info().n_vocab, 41, 8),
                                                     looping_prompt(e.info().n_vocab, 42, 8)};
  const auto plain = generate(e, prompts, 6, "");
  RequestParams p;
  p.ignore_eos = true;
  p.max_tokens = 6;
  p.speculation.draft = "replay";
  p.speculation.k = 16;
  p.speculation.adaptive = false;
  std::map<RequestId, std::vector<int32_t>> got;
  std::vector<RequestId> ids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    p.speculation.replay = prompts[i];
    p.speculation.replay.insert(p.speculation.replay.end(), plain[i].ids.begin(), plain[i].ids.end());
    ids.push_back(e.submit(Prompt::of_ids(prompts[i]), p));
  }
  int64_t rounds = 0;
  while (!e.idle())
    for (Event& ev : e.step()) {
      got[ev.id].insert(got[ev.id].end(), ev.ids.begin(), ev.ids.end());
      rounds += ev.drafts.rounds;
    }
  EXPECT_EQ(e.preemptions(), 0);
  EXPECT_GT(rounds, 0);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[ids[i]], plain[i].ids) << "row " << i;
}

// With penalties (each verify position counts the drafts before it as
// generated), logprobs and a session's second turn, speculative greedy
// decoding still gives plain greedy's ids and log-probabilities.
TEST_P(Speculative, PenaltiesLogprobsAndSessionsAsPlain) {
  auto e = engine_for(GetParam());
  const int64_t V = e->info().n_vocab;
  const auto prompt = looping_prompt(V, 31);
  std::vector<int32_t> record = prompt;
  {
    const auto plain = generate(*e, {prompt}, 80, "")[0].ids;
    record.insert(record.end(), plain.begin(), plain.end());
  }
  auto turns = [&](const std::string& draft) {
    const int64_t session = e->open_session();
    std::vector<Event> finals;
    std::vector<int32_t> ids, p = prompt;
    int64_t rounds = 0;
    for (int turn = 0; turn < 2; ++turn) {
      RequestParams q;
      q.ignore_eos = true;
      q.max_tokens = 40;
      q.sampling.repetition_penalty = 1.3f;
      q.sampling.frequency_penalty = 0.2f;
      q.logprobs = 2;
      q.session = session;
      q.speculation.draft = draft;
      q.speculation.replay = record;
      Event fin = e->run(e->submit(Prompt::of_ids(p), q), [&](const Event& ev) {
        ids.insert(ids.end(), ev.ids.begin(), ev.ids.end());
        for (const auto& lp : ev.logprobs) finals.push_back(Event{}), finals.back().logprobs = {lp};
      });
      p.insert(p.end(), ids.end() - 40, ids.end());
      p.push_back(3);
      if (turn == 1) {
        EXPECT_GT(fin.usage.cached_tokens, 0);
      }
      rounds += fin.drafts.rounds;
    }
    e->close_session(session);
    if (draft == "replay") {
      EXPECT_GT(rounds, 0);  // (prompt lookup may find nothing to propose)
    }
    if (draft.empty()) {
      EXPECT_EQ(rounds, 0);
    }
    return std::make_pair(ids, finals);
  };
  const auto [plain_ids, plain_lp] = turns("");
  for (const char* draft : {"ngram", "replay"}) {
    const auto [ids, lp] = turns(draft);
    EXPECT_EQ(ids, plain_ids) << draft;
    ASSERT_EQ(lp.size(), plain_lp.size()) << draft;
    for (size_t i = 0; i < lp.size(); ++i) {
      ASSERT_EQ(lp[i].logprobs[0].id, plain_lp[i].logprobs[0].id) << draft << " token " << i;
      EXPECT_EQ(lp[i].logprobs[0].logprob, plain_lp[i].logprobs[0].logprob) << draft << " token " << i;
      ASSERT_EQ(lp[i].logprobs[0].top.size(), 2u);
    }
  }
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

namespace augur {
namespace {

// Pearson's statistic of counts against expected probabilities.
double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& p, int64_t n) {
  double x = 0;
  for (size_t i = 0; i < counts.size(); ++i)
    if (p[i] > 0) x += std::pow(double(counts[i]) - double(n) * p[i], 2) / (double(n) * p[i]);
  return x;
}

// verify_draft's output is distributed as the target's p, whatever the draft;
// a verifier that redraws from p itself after a rejection (not from p
// without the draft) fails the same test.
TEST(VerifyDraft, OutputFollowsTheTargetDistribution) {
  const std::vector<float> w = {0.0f, 4.0f, 1.0f, 0.0f, 2.5f, 0.5f};  // kept weights, not normalised
  double total = 0;
  for (float x : w) total += x;
  std::vector<double> p;
  for (float x : w) p.push_back(double(x) / total);
  std::mt19937_64 rng(1);
  auto u = [&] { return std::min(float(double(rng() >> 11) * 0x1.0p-53), 0x1.fffffep-1f); };
  const int64_t n = 200000;
  // df 3 (four tokens with mass): 16.3 is the 0.001 tail.
  for (int32_t draft : {1, 2, 4, 0}) {
    std::vector<int64_t> good(w.size()), broken(w.size());
    for (int64_t i = 0; i < n; ++i) {
      std::vector<float> a = w;
      bool kept = false;
      ++good[size_t(verify_draft(a, draft, u(), u(), &kept))];
      // Broken: a rejection redraws from p, the draft included.
      const float ua = u(), ud = u();
      const bool keep = ua * float(total) < w[size_t(draft)];
      ++broken[size_t(keep ? draft : ops::sample_pick(w, ud))];
    }
    EXPECT_LT(chi_square(good, p, n), 16.3) << "draft " << draft;
    if (w[size_t(draft)] > 0) {
      EXPECT_GT(chi_square(broken, p, n), 100.0) << "draft " << draft;
    }
  }
}

// Through the engine: sampled requests with drafts (replaying the greedy
// continuation, so that some are kept and some rejected) draw their three
// tokens from the same joint distribution as plain sampling (top-k 2: at
// most 8 cells; a two-sample chi-square against its 0.001 tail).
TEST(SpeculativeSampling, DrawsLikePlainSampling) {
  EngineOptions eo;
  eo.max_sequences = 64;
  eo.max_cached_tokens = 64 * 32;
  Engine e(load_model(kData + "/qwen3"), std::nullopt, eo);
  const int64_t V = e.info().n_vocab;
  const std::vector<int32_t> prompt = {11, 42, 7, 300, 11, 42, 7};
  RequestParams p;
  p.ignore_eos = true;
  p.max_tokens = 3;
  const std::vector<int32_t> greedy = generate(e, {prompt}, 3, "")[0].ids;
  std::vector<int32_t> record = prompt;
  record.insert(record.end(), greedy.begin(), greedy.end());
  p.sampling.temperature = 1.0f;
  p.sampling.top_k = 2;
  std::map<std::vector<int32_t>, int64_t> plain, spec;
  DraftStats stats;
  const int n_batches = 60, per_batch = 50;
  for (int spec_run = 0; spec_run < 2; ++spec_run)
    for (int b = 0; b < n_batches; ++b) {
      std::vector<RequestId> ids;
      for (int i = 0; i < per_batch; ++i) {
        RequestParams q = p;
        q.sampling.seed = uint64_t(1000 * b + i + 1);
        if (spec_run) {
          q.speculation.draft = "replay";
          q.speculation.k = 2;
          q.speculation.replay = record;
        }
        ids.push_back(e.submit(Prompt::of_ids(prompt), q));
      }
      std::map<RequestId, std::vector<int32_t>> got;
      while (!e.idle())
        for (Event& ev : e.step()) {
          got[ev.id].insert(got[ev.id].end(), ev.ids.begin(), ev.ids.end());
          if (ev.done) {
            stats.rounds += ev.drafts.rounds;
            stats.full_rounds += ev.drafts.full_rounds;
          }
        }
      for (RequestId id : ids) {
        ASSERT_EQ(got[id].size(), 3u);
        ++(spec_run ? spec : plain)[got[id]];
      }
    }
  std::set<std::vector<int32_t>> cells;
  for (const auto& [c, k] : plain) cells.insert(c);
  for (const auto& [c, k] : spec) cells.insert(c);
  double x = 0;
  for (const auto& c : cells) {
    const double a = double(plain[c]), b = double(spec[c]);
    if (a + b > 0) x += (a - b) * (a - b) / (a + b);
  }
  std::printf("[spec] sampled: %zu cells, chi-square %.1f; %lld verify rounds, %lld kept every draft\n", cells.size(),
              x, (long long)stats.rounds, (long long)stats.full_rounds);
  ASSERT_GE(cells.size(), 2u);
  ASSERT_LE(cells.size(), 8u);
  const double tail[] = {10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32};  // df 1..7, p = 0.001
  EXPECT_LT(x, tail[cells.size() - 2]);
  EXPECT_GT(stats.full_rounds, 0);
  EXPECT_GT(stats.rounds - stats.full_rounds, 0);
  (void)V;
}

}  // namespace
}  // namespace augur
