// The prefix cache through the engine: a request sharing a prefix with an
// earlier one feeds only what follows it, on every family (hybrids resume
// from a recurrent-state copy), and decodes exactly what a cold engine does;
// blocks and states are evicted under pressure and none leaks.
#include <gtest/gtest.h>

#include <random>

#include "runtime/engine.h"
#include "families.h"

namespace augur {
namespace {

const std::string kData = AUGUR_TEST_DATA;

std::string dir_of(const std::string& name) {
  return name == "augur-tiny" ? kData + "/../../models/augur-tiny" : kData + "/" + name;
}

std::vector<int32_t> random_ids(int n, int64_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = int32_t(rng() % uint32_t(n_vocab));
  return ids;
}

std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct Outcome {
  std::vector<int32_t> ids;
  Event done;
};

Outcome run(Engine& e, const std::vector<int32_t>& prompt, int64_t max_tokens) {
  RequestParams p;
  p.ignore_eos = true;
  p.max_tokens = max_tokens;
  Outcome o;
  o.done = e.run(e.submit(Prompt::of_ids(prompt), p),
                 [&](const Event& ev) { o.ids.insert(o.ids.end(), ev.ids.begin(), ev.ids.end()); });
  return o;
}

// What an engine without a cache generates.
std::vector<int32_t> cold(const std::string& family, const std::vector<int32_t>& prompt, int64_t max_tokens) {
  Engine e(load_model(dir_of(family)), std::nullopt, EngineOptions{});
  return run(e, prompt, max_tokens).ids;
}

std::unique_ptr<Engine> cached_engine(const std::string& family, EngineOptions eo = {}) {
  eo.prefix_cache = true;
  return std::make_unique<Engine>(load_model(dir_of(family)), std::nullopt, eo);
}

bool recurrent(const Engine& e) { return e.info().recurrent.n_layer > 0; }

class PrefixCacheFamilies : public ::testing::TestWithParam<std::string> {};

// A chat's next turn: the first prompt, the reply, new tokens. The engine
// holds all the first request fed (its prompt and its reply but the last
// token, which was sampled, not fed) and feeds only the rest; prompts
// longer than a step's budget are fed in block-aligned chunks.
TEST_P(PrefixCacheFamilies, SecondTurnFeedsOnlyItsNewTokens) {
  for (int64_t step_tokens : {int64_t(512), int64_t(24)}) {
    SCOPED_TRACE("step_tokens " + std::to_string(step_tokens));
    EngineOptions eo;
    eo.step_tokens = step_tokens;
    auto e = cached_engine(GetParam(), eo);
    const int64_t V = e->info().n_vocab;
    const auto first = random_ids(37, V, 1);
    const Outcome a = run(*e, first, 10);
    EXPECT_EQ(a.done.usage.cached_tokens, 0);
    const auto second = cat(cat(first, a.ids), random_ids(5, V, 2));
    const Outcome b = run(*e, second, 12);
    EXPECT_EQ(b.done.usage.cached_tokens, int64_t(first.size() + a.ids.size()) - 1);
    EXPECT_EQ(b.done.timings.prefill_tokens, int64_t(second.size()) - b.done.usage.cached_tokens);
    EXPECT_EQ(b.ids, cold(GetParam(), second, 12));
    const PrefixCache::Stats s = e->prefix_cache()->stats();
    EXPECT_EQ(s.hits, 1);
    EXPECT_EQ(s.lookups, 2);
    EXPECT_EQ(s.states > 0, recurrent(*e));
  }
}

// Requests sharing a system prompt. Without recurrent state the second
// resumes at once, into the partly matching block. With it, the second
// request finds no state there but ends a chunk where its prompt leaves the
// cached blocks, so the third resumes at that block boundary. Requests
// submitted together decode as a cold engine does.
TEST_P(PrefixCacheFamilies, RequestsSharingASystemPromptResumeFromIt) {
  auto e = cached_engine(GetParam());
  const int64_t V = e->info().n_vocab;
  const auto system = random_ids(40, V, 3);
  auto user = [&](uint32_t seed) {
    auto u = random_ids(6, V, seed);
    if (u[0] == system[0]) u[0] = (u[0] + 1) % int32_t(V);
    return cat(system, u);
  };
  const auto pa = user(4), pb = user(5), pc = user(6);
  EXPECT_EQ(run(*e, pa, 8).done.usage.cached_tokens, 0);
  const Outcome b = run(*e, pb, 8);
  const Outcome c = run(*e, pc, 8);
  if (recurrent(*e)) {
    EXPECT_EQ(b.done.usage.cached_tokens, 0);
    EXPECT_EQ(c.done.usage.cached_tokens, 32);  // 40 tokens: two whole blocks of 16
  } else {
    EXPECT_EQ(b.done.usage.cached_tokens, 40);
    EXPECT_EQ(c.done.usage.cached_tokens, 40);
  }
  EXPECT_EQ(b.ids, cold(GetParam(), pb, 8));
  EXPECT_EQ(c.ids, cold(GetParam(), pc, 8));

  // Four at once, two of them an earlier prompt again.
  const std::vector<std::vector<int32_t>> prompts = {user(7), pa, user(8), pc};
  RequestParams p;
  p.ignore_eos = true;
  p.max_tokens = 8;
  std::vector<RequestId> ids;
  for (const auto& q : prompts) ids.push_back(e->submit(Prompt::of_ids(q), p));
  std::map<RequestId, std::vector<int32_t>> got;
  std::map<RequestId, Event> done;
  while (!e->idle())
    for (Event& ev : e->step()) {
      got[ev.id].insert(got[ev.id].end(), ev.ids.begin(), ev.ids.end());
      if (ev.done) done[ev.id] = ev;
    }
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(got[ids[i]], cold(GetParam(), prompts[i], 8)) << "request " << i;
    EXPECT_GE(done[ids[i]].usage.cached_tokens, 32) << "request " << i;
  }
}

// A cache of 10 blocks and 6 state copies under 24 requests, two at a time
// (each leaves two states, and five distinct prompts repeat):
// each runs (the cache gives blocks back as requests need them), each
// decodes as a cold engine, and afterwards every block is free or the
// cache's alone.
TEST_P(PrefixCacheFamilies, EvictsUnderPressureAndLeaksNothing) {
  EngineOptions eo;
  eo.max_cached_tokens = 160;
  eo.prefix_states = 6;
  auto e = cached_engine(GetParam(), eo);
  const int64_t V = e->info().n_vocab;
  const auto common = random_ids(20, V, 9);
  RequestParams p;
  p.ignore_eos = true;
  p.max_tokens = 8;
  for (int round = 0; round < 12; ++round) {
    // Half the prompts extend a common prefix, half are new; some repeat.
    std::vector<std::vector<int32_t>> prompts = {cat(common, random_ids(10, V, 100 + round % 5)),
                                                 random_ids(30, V, 200 + round)};
    std::vector<RequestId> ids;
    for (const auto& q : prompts) ids.push_back(e->submit(Prompt::of_ids(q), p));
    std::map<RequestId, std::vector<int32_t>> got;
    while (!e->idle())
      for (Event& ev : e->step()) got[ev.id].insert(got[ev.id].end(), ev.ids.begin(), ev.ids.end());
    if (round % 4 != 0) continue;
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(got[ids[i]], cold(GetParam(), prompts[i], 8)) << "round " << round << " request " << i;
  }
  const PrefixCache::Stats s = e->prefix_cache()->stats();
  EXPECT_GT(s.hits, 0);
  EXPECT_LE(s.states, 6);
  EXPECT_LE(s.blocks, 10);
  EXPECT_EQ(s.blocks_only, s.blocks);
  EXPECT_EQ(e->runner().pool().n_free() + s.blocks_only, e->runner().pool().n_blocks());
}

// Four requests of 80 tokens each in a 12-block cache (192 tokens): the
// newest are preempted when the running ones need blocks, and resume later
// (from the prefix cache, or recomputed without it); each generates what it
// generates alone, and nothing leaks.
TEST_P(PrefixCacheFamilies, PreemptionWhenBlocksRunOutKeepsGreedyOutput) {
  for (bool with_cache : {true, false}) {
    SCOPED_TRACE(with_cache ? "with the prefix cache" : "without it");
    EngineOptions eo;
    eo.max_cached_tokens = 192;
    eo.prefix_cache = with_cache;
    Engine e(load_model(dir_of(GetParam())), std::nullopt, eo);
    const int64_t V = e.info().n_vocab;
    RequestParams p;
    p.ignore_eos = true;
    p.max_tokens = 60;
    std::vector<std::vector<int32_t>> prompts;
    std::vector<RequestId> ids;
    for (uint32_t i = 0; i < 4; ++i) {
      prompts.push_back(random_ids(20, V, 300 + i));
      ids.push_back(e.submit(Prompt::of_ids(prompts.back()), p));
    }
    std::map<RequestId, std::vector<int32_t>> got;
    std::map<RequestId, Event> done;
    while (!e.idle())
      for (Event& ev : e.step()) {
        got[ev.id].insert(got[ev.id].end(), ev.ids.begin(), ev.ids.end());
        if (ev.done) done[ev.id] = ev;
      }
    EXPECT_GT(e.preemptions(), 0);
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(got[ids[i]], cold(GetParam(), prompts[i], 60)) << "request " << i;
      EXPECT_EQ(done[ids[i]].finish, FinishReason::Length);
      EXPECT_EQ(done[ids[i]].usage.prompt_tokens, 20);
      EXPECT_EQ(done[ids[i]].usage.completion_tokens, 60);
    }
    const int64_t cached = with_cache ? e.prefix_cache()->reclaimable() : 0;
    EXPECT_EQ(e.runner().pool().n_free() + cached, e.runner().pool().n_blocks());
  }
}

// Requests resuming partway into a cached block, prefilled in chunks a
// small step budget cuts to block boundaries (hybrids), so the budget one
// row leaves goes to the next: before a step, room is made for the chunks
// the step will feed, whatever the cache's size (a miscount failed the
// engine when the cache was tight), and each request generates what it
// generates alone.
TEST_P(PrefixCacheFamilies, ChunksCutShortAreCountedWhenMakingRoom) {
  const std::string family = GetParam();
  const int64_t V = load_model(dir_of(family))->info().n_vocab;
  // The first request holds 44 tokens (its prompt and the 7 replies it
  // fed): the others resume there, 12 tokens into a block they share. With
  // 26 tokens a step, the first's chunk (44..70) is cut at 64 and the next
  // takes the 6 left (44..50): a copy of the shared block and a new one,
  // which counting 26 tokens for the first alone left out.
  const auto first = random_ids(37, V, 71);
  auto reply = cold(family, first, 8);
  reply.resize(7);
  std::vector<std::vector<int32_t>> prompts;
  for (uint32_t i = 0; i < 3; ++i) prompts.push_back(cat(cat(first, reply), random_ids(30, V, 80 + i)));
  std::vector<std::vector<int32_t>> alone;
  for (const auto& p : prompts) alone.push_back(cold(family, p, 12));
  for (int64_t tokens = 96; tokens <= 224; tokens += 16) {
    SCOPED_TRACE("cache of " + std::to_string(tokens) + " tokens");
    EngineOptions eo;
    eo.max_cached_tokens = tokens;
    eo.step_tokens = 26;
    auto e = cached_engine(family, eo);
    run(*e, first, 8);
    RequestParams p;
    p.ignore_eos = true;
    p.max_tokens = 12;
    std::vector<RequestId> ids;
    for (const auto& prompt : prompts) ids.push_back(e->submit(Prompt::of_ids(prompt), p));
    std::map<RequestId, std::vector<int32_t>> got;
    while (!e->idle())
      for (Event& ev : e->step()) got[ev.id].insert(got[ev.id].end(), ev.ids.begin(), ev.ids.end());
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[ids[i]], alone[i]) << "request " << i;
  }
}

// A sequence that resumed partway into a cached block and is given back
// before it writes (preempted, cancelled) adds no second entry on that
// block: every block the cache alone holds counts as reclaimable, and
// evicting everything frees the pool.
TEST(PrefixCache, AResumedSequenceGivenBackUnwrittenHoldsItsBlockOnce) {
  const KvSpec spec{1, 1, 4};
  KvCache kv(spec, 8, 16);
  BlockPool pool(8);
  PrefixCache cache(pool, kv, 0);
  const auto a_tokens = random_ids(55, 1000, 11);  // 3 whole blocks and 7 tokens
  {
    Sequence a(pool, kv);
    a.reserve(55);
    a.append(a_tokens);
    cache.insert(a, /*keep_end=*/true);
  }
  ASSERT_EQ(cache.stats().blocks, 4);
  ASSERT_EQ(cache.reclaimable(), 4);
  // 40 tokens of a's, then others: two whole blocks and 8 tokens into a's third.
  auto b_tokens = std::vector<int32_t>(a_tokens.begin(), a_tokens.begin() + 40);
  b_tokens = cat(b_tokens, random_ids(6, 1000, 12));
  if (b_tokens[40] == a_tokens[40]) b_tokens[40] = (b_tokens[40] + 1) % 1000;
  {
    Sequence b(pool, kv);
    const SequenceSnapshot hit = cache.lookup(b_tokens, 45);
    ASSERT_EQ(hit.length(), 40);
    b.restore(hit);
    cache.insert(b, /*keep_end=*/true);
  }
  const PrefixCache::Stats s = cache.stats();
  EXPECT_EQ(s.blocks, 4);
  EXPECT_EQ(s.blocks_only, 4);
  EXPECT_EQ(pool.n_free() + cache.reclaimable(), pool.n_blocks());
  EXPECT_EQ(cache.lookup(b_tokens, 45).length(), 40);
  while (cache.evict_one()) {
  }
  EXPECT_EQ(pool.n_free(), pool.n_blocks());
}

INSTANTIATE_TEST_SUITE_P(Families, PrefixCacheFamilies, test::every_family(), test::family_test_name);

}  // namespace
}  // namespace augur
