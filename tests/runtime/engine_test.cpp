// The engine's request path: requests in flight together decode exactly as
// each alone; sessions feed only what they do not hold; stop strings,
// cancellation and logprobs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "core/error.h"
#include "runtime/engine.h"

namespace augur {
namespace {

const std::string kData = AUGUR_TEST_DATA;

std::vector<int32_t> random_ids(int n, int64_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = int32_t(rng() % uint32_t(n_vocab));
  return ids;
}

std::unique_ptr<Engine> engine_for(const std::string& family, EngineOptions eo = {}) {
  return std::make_unique<Engine>(load_model(kData + "/" + family), std::nullopt, eo);
}

// Every event of every request, gathered by request until all are done.
std::map<RequestId, std::vector<int32_t>> drain(Engine& e, std::map<RequestId, Event>* finals = nullptr) {
  std::map<RequestId, std::vector<int32_t>> ids;
  while (!e.idle())
    for (Event& ev : e.step()) {
      ids[ev.id].insert(ids[ev.id].end(), ev.ids.begin(), ev.ids.end());
      if (ev.done && finals) (*finals)[ev.id] = ev;
    }
  return ids;
}

class EngineFamilies : public ::testing::TestWithParam<std::string> {};

// Requests of different prompt lengths and limits, submitted together (and
// one joining later), give what each gives alone; prompts longer than a
// step's token budget are fed over several steps.
TEST_P(EngineFamilies, RequestsTogetherEqualEachAlone) {
  EngineOptions eo;
  eo.step_tokens = 24;
  auto e = engine_for(GetParam(), eo);
  const int64_t V = e->info().n_vocab;
  std::vector<std::vector<int32_t>> prompts = {random_ids(5, V, 1), random_ids(40, V, 2), random_ids(1, V, 3),
                                               random_ids(17, V, 4)};
  std::vector<int64_t> limits = {12, 7, 20, 9};
  std::vector<RequestId> ids;
  RequestParams p;
  p.ignore_eos = true;
  for (size_t i = 0; i < 3; ++i) {
    p.max_tokens = limits[i];
    ids.push_back(e->submit(Prompt::of_ids(prompts[i]), p));
  }
  std::map<RequestId, std::vector<int32_t>> early;
  for (int s = 0; s < 2; ++s)
    for (const Event& ev : e->step()) early[ev.id].insert(early[ev.id].end(), ev.ids.begin(), ev.ids.end());
  p.max_tokens = limits[3];
  ids.push_back(e->submit(Prompt::of_ids(prompts[3]), p));
  std::map<RequestId, Event> finals;
  auto together = drain(*e, &finals);
  for (auto& [id, v] : early) together[id].insert(together[id].begin(), v.begin(), v.end());
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto alone = engine_for(GetParam());
    p.max_tokens = limits[i];
    const RequestId id = alone->submit(Prompt::of_ids(prompts[i]), p);
    auto one = drain(*alone);
    EXPECT_EQ(together[ids[i]], one[id]) << "request " << i;
    EXPECT_EQ(int64_t(together[ids[i]].size()), limits[i]);
    EXPECT_EQ(finals[ids[i]].finish, FinishReason::Length);
    EXPECT_EQ(finals[ids[i]].usage.prompt_tokens, int64_t(prompts[i].size()));
  }
}

// A session's second request feeds only its new tokens and generates what a
// fresh engine generates for the whole prompt.
TEST_P(EngineFamilies, SessionReusesItsPrefix) {
  auto e = engine_for(GetParam());
  const int64_t V = e->info().n_vocab;
  const auto first = random_ids(20, V, 7);
  RequestParams p;
  p.ignore_eos = true;
  p.max_tokens = 6;
  p.session = e->open_session();
  std::vector<int32_t> reply;
  e->run(e->submit(Prompt::of_ids(first), p),
         [&](const Event& ev) { reply.insert(reply.end(), ev.ids.begin(), ev.ids.end()); });
  // The next turn: the first prompt, the reply, new tokens.
  std::vector<int32_t> second = first;
  second.insert(second.end(), reply.begin(), reply.end());
  const auto more = random_ids(5, V, 8);
  second.insert(second.end(), more.begin(), more.end());
  std::vector<int32_t> got;
  const Event done = e->run(e->submit(Prompt::of_ids(second), p),
                            [&](const Event& ev) { got.insert(got.end(), ev.ids.begin(), ev.ids.end()); });
  EXPECT_GE(done.usage.cached_tokens, int64_t(first.size()));
  EXPECT_EQ(done.timings.prefill_tokens, int64_t(second.size()) - done.usage.cached_tokens);

  auto fresh = engine_for(GetParam());
  p.session = -1;
  std::vector<int32_t> want;
  fresh->run(fresh->submit(Prompt::of_ids(second), p),
             [&](const Event& ev) { want.insert(want.end(), ev.ids.begin(), ev.ids.end()); });
  EXPECT_EQ(got, want);
}

TEST_P(EngineFamilies, CancelEndsARequestAndFreesItsBlocks) {
  EngineOptions eo;
  eo.max_cached_tokens = 256;
  auto e = engine_for(GetParam(), eo);
  const int64_t free_before = e->runner().pool().n_free();
  RequestParams p;
  p.ignore_eos = true;
  p.max_tokens = 100;
  const RequestId id = e->submit(Prompt::of_ids(random_ids(30, e->info().n_vocab, 9)), p);
  e->step();
  e->step();
  e->cancel(id);
  std::map<RequestId, Event> finals;
  drain(*e, &finals);
  ASSERT_TRUE(finals.count(id));
  EXPECT_EQ(finals[id].finish, FinishReason::Cancelled);
  EXPECT_LT(finals[id].usage.completion_tokens, 100);
  EXPECT_EQ(e->runner().pool().n_free(), free_before);
}

// Two requests fill a cache of 4 blocks of 16 as they decode; the newer is
// cancelled after each number of steps in turn. At the step where the older
// then needs a block the cancelled one's blocks must already be free: it is
// finished, so no longer preempted to make room. The older ends whole.
TEST_P(EngineFamilies, CancelInAFullCacheLeavesItsBlocksToTheRest) {
  for (int s = 1; s <= 36; ++s) {
    SCOPED_TRACE(testing::Message() << "cancelled after " << s << " steps");
    EngineOptions eo;
    eo.max_cached_tokens = 64;
    eo.max_sequences = 2;
    auto e = engine_for(GetParam(), eo);
    const int64_t free_before = e->runner().pool().n_free();
    RequestParams p;
    p.ignore_eos = true;
    p.max_tokens = 39;  // 8 + 39 tokens: 3 blocks, and one for a copy-on-write
    const RequestId a = e->submit(Prompt::of_ids(random_ids(8, e->info().n_vocab, 1)), p);
    const RequestId c = e->submit(Prompt::of_ids(random_ids(8, e->info().n_vocab, 2)), p);
    std::map<RequestId, Event> finals;
    std::map<RequestId, std::vector<int32_t>> ids;
    for (int i = 0; i < s && !e->idle(); ++i)
      for (Event& ev : e->step()) {
        ids[ev.id].insert(ids[ev.id].end(), ev.ids.begin(), ev.ids.end());
        if (ev.done) finals[ev.id] = ev;
      }
    e->cancel(c);
    std::map<RequestId, std::vector<int32_t>> rest;
    ASSERT_NO_THROW(rest = drain(*e, &finals));
    for (auto& [id, got] : rest) ids[id].insert(ids[id].end(), got.begin(), got.end());
    ASSERT_TRUE(finals.count(a) && finals.count(c));
    EXPECT_EQ(finals[a].finish, FinishReason::Length);
    EXPECT_EQ(ids[a].size(), 39u);
    EXPECT_EQ(finals[c].finish, FinishReason::Cancelled);
    EXPECT_EQ(e->runner().pool().n_free(), free_before);
  }
}

// logprobs: the chosen token's is log_softmax of its logit; greedy picks the top one.
TEST_P(EngineFamilies, LogprobsOfGreedyTokens) {
  auto e = engine_for(GetParam());
  RequestParams p;
  p.ignore_eos = true;
  p.max_tokens = 4;
  p.logprobs = 3;
  std::vector<TokenLogprob> lps;
  e->run(e->submit(Prompt::of_ids(random_ids(6, e->info().n_vocab, 11)), p),
         [&](const Event& ev) { lps.insert(lps.end(), ev.logprobs.begin(), ev.logprobs.end()); });
  ASSERT_EQ(lps.size(), 4u);
  for (const auto& lp : lps) {
    ASSERT_EQ(lp.top.size(), 3u);
    EXPECT_EQ(lp.top[0].first, lp.id);
    EXPECT_FLOAT_EQ(lp.top[0].second, lp.logprob);
    EXPECT_LE(lp.logprob, 0.0f);
    EXPECT_GE(lp.top[0].second, lp.top[1].second);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, EngineFamilies, ::testing::Values("llama", "qwen3", "qwen3_5"));

// Text through the engine: a stop string ends generation with the text
// before it, and the text deltas join to the whole reply.
TEST(Engine, StopStringsAndTextDeltas) {
  const std::string dir = kData + "/../../models/augur-tiny";
  Engine e(load_model(dir), TextModel::load(dir), {});
  RequestParams p;
  p.max_tokens = 40;
  p.ignore_eos = true;
  std::string whole;
  e.run(e.submit(Prompt::of_text("It was a cold morning, and"), p), [&](const Event& ev) { whole += ev.text; });
  ASSERT_GT(whole.size(), 10u);
  const std::string stop = whole.substr(whole.size() / 2, 3);
  p.stop = {stop};
  std::string cut;
  const Event done =
      e.run(e.submit(Prompt::of_text("It was a cold morning, and"), p), [&](const Event& ev) { cut += ev.text; });
  EXPECT_EQ(done.finish, FinishReason::Stop);
  EXPECT_EQ(cut, whole.substr(0, whole.find(stop)));
}

// A stop string completed by a byte-fallback token ("\n" is <0x0A> in
// SentencePiece vocabularies) stops on that token, though the decoder holds
// an open run of byte tokens back: finish "stop", not one token more, and
// not "length" where that token is also the last max_tokens allows.
TEST(Engine, AStopStringEndingInAByteTokenStopsOnIt) {
  const std::string dir = kData + "/llama";
  const auto prompt = random_ids(6, 512, 21);
  RequestParams p;
  p.ignore_eos = true;
  p.max_tokens = 12;
  std::vector<int32_t> ids;
  {
    Engine plain(load_model(dir), std::nullopt, {});
    plain.run(plain.submit(Prompt::of_ids(prompt), p), [&](const Event& ev) { ids.insert(ids.end(), ev.ids.begin(), ev.ids.end()); });
  }
  // The first token after the first that none before it repeats becomes "\n".
  size_t at = 1;
  while (at < ids.size() && std::find(ids.begin(), ids.begin() + long(at), ids[at]) != ids.begin() + long(at)) ++at;
  ASSERT_LT(at, ids.size());
  auto name = [](int32_t i) {
    char b[16];
    std::snprintf(b, sizeof b, "t%d ", int(i));
    return std::string(b);
  };
  nlohmann::json vocab = nlohmann::json::object();
  for (int32_t i = 0; i < 512; ++i) vocab[i == ids[at] ? std::string("<0x0A>") : name(i)] = i;
  const nlohmann::json tj = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()},
                                        {"byte_fallback", true}}},
                             {"decoder", {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}}}};
  std::string before;
  for (size_t i = 0; i < at; ++i) before += name(ids[i]);
  for (int64_t max_tokens : {int64_t(at) + 1, int64_t(12)}) {
    SCOPED_TRACE("max_tokens " + std::to_string(max_tokens));
    Engine e(load_model(dir), TextModel{Tokenizer::from_json(tj), nullptr}, {});
    p.max_tokens = max_tokens;
    p.stop = {"\n"};
    std::string text;
    const Event done = e.run(e.submit(Prompt::of_ids(prompt), p), [&](const Event& ev) { text += ev.text; });
    EXPECT_EQ(done.finish, FinishReason::Stop);
    EXPECT_EQ(done.usage.completion_tokens, int64_t(at) + 1);
    EXPECT_EQ(text, before);
  }
}

TEST(Engine, BadRequestsAreErrors) {
  auto e = engine_for("qwen3");
  RequestParams p;
  EXPECT_THROW(e->submit(Prompt::of_ids({}), p), Error);
  EXPECT_THROW(e->submit(Prompt::of_ids({int32_t(e->info().n_vocab)}), p), Error);
  EXPECT_THROW(e->submit(Prompt::of_text("no tokenizer"), p), Error);
  p.max_tokens = -1;
  EXPECT_THROW(e->submit(Prompt::of_ids({1}), p), Error);
  p.max_tokens = 1;
  p.stop = {"x"};
  EXPECT_THROW(e->submit(Prompt::of_ids({1}), p), Error);
  EXPECT_TRUE(e->idle());
}

}  // namespace
}  // namespace augur
