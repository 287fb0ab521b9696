// The scheduler: requests from many threads join the running batch as room
// frees up, and each gets exactly what it gets alone; admission holds
// requests back when the cache is full and refuses what never fits;
// cancellation frees memory; a full queue refuses.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "core/error.h"
#include "runtime/scheduler.h"

namespace augur {
namespace {

const std::string kData = AUGUR_TEST_DATA;

std::vector<int32_t> random_ids(int n, int64_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = int32_t(rng() % uint32_t(n_vocab));
  return ids;
}

// One request's events, gathered for the test's thread.
struct Collected {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> ids;
  Event final;
  std::string error;
  bool done = false;
  RequestSink sink() {
    RequestSink s;
    s.event = [this](Ticket, const Event& e) {
      std::lock_guard<std::mutex> lock(mu);
      ids.insert(ids.end(), e.ids.begin(), e.ids.end());
      if (e.done) final = e, done = true, cv.notify_all();
    };
    s.error = [this](Ticket, const std::string& m) {
      std::lock_guard<std::mutex> lock(mu);
      error = m, done = true, cv.notify_all();
    };
    return s;
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(120), [&] { return done; })) << "request never finished";
  }
};

class SchedulerFamilies : public ::testing::TestWithParam<std::string> {};

// 12 requests of different lengths from 4 threads through 4 batch rows equal
// each request alone (continuous batching: rows join and leave every step).
TEST_P(SchedulerFamilies, ConcurrentRequestsEqualEachAlone) {
  EngineOptions eo;
  eo.max_cached_tokens = 2048;
  eo.max_sequences = 5;
  Engine engine(load_model(kData + "/" + GetParam()), std::nullopt, eo);
  const int64_t n_vocab = engine.info().n_vocab;
  constexpr int kRequests = 12;
  std::vector<std::vector<int32_t>> prompts, alone;
  std::vector<RequestParams> params;
  for (int i = 0; i < kRequests; ++i) {
    prompts.push_back(random_ids(3 + 7 * i % 40, n_vocab, uint32_t(100 + i)));
    RequestParams p;
    p.max_tokens = 4 + (i * 5) % 17;
    p.ignore_eos = true;
    if (i % 3 == 2) p.sampling.temperature = 0.8f, p.sampling.seed = uint64_t(i);
    params.push_back(p);
    std::vector<int32_t> ids;
    engine.run(engine.submit(Prompt::of_ids(prompts[i]), p), [&](const Event& e) {
      ids.insert(ids.end(), e.ids.begin(), e.ids.end());
    });
    alone.push_back(ids);
  }
  SchedulerOptions so;
  so.max_batch = 4;
  so.warmup = false;
  Scheduler sched(engine, so);
  std::vector<Collected> got(kRequests);
  std::vector<std::thread> clients;
  for (int t = 0; t < 4; ++t)
    clients.emplace_back([&, t] {
      for (int i = t; i < kRequests; i += 4) sched.submit(Prompt::of_ids(prompts[i]), params[i], got[i].sink());
    });
  for (auto& c : clients) c.join();
  for (int i = 0; i < kRequests; ++i) {
    got[i].wait();
    EXPECT_EQ(got[i].error, "") << i;
    EXPECT_EQ(got[i].ids, alone[i]) << "request " << i;
  }
  const Scheduler::Stats s = sched.stats();
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.queued, 0);
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_GT(s.steps, 0);
}

INSTANTIATE_TEST_SUITE_P(Families, SchedulerFamilies, ::testing::Values("qwen3", "qwen3_5"));

// A cache of 8 blocks of 16 holds the prompt of one request of 60 + 40
// tokens beside another's at most: the second waits for the first, one that
// never fits is refused, and one whose max_tokens is a default is cut.
TEST(Scheduler, AdmitsWithinTheCacheAndRefusesWhatNeverFits) {
  EngineOptions eo;
  eo.max_cached_tokens = 128;
  eo.max_sequences = 4;
  Engine engine(load_model(kData + "/qwen3"), std::nullopt, eo);
  const int64_t n_vocab = engine.info().n_vocab;
  SchedulerOptions so;
  so.max_batch = 4;
  so.warmup = false;
  Scheduler sched(engine, so);
  RequestParams p;
  p.max_tokens = 40;
  p.ignore_eos = true;
  Collected a, b, never;
  sched.submit(Prompt::of_ids(random_ids(60, n_vocab, 1)), p, a.sink());
  sched.submit(Prompt::of_ids(random_ids(60, n_vocab, 2)), p, b.sink());
  RequestParams big = p;
  big.max_tokens = 100;
  sched.submit(Prompt::of_ids(random_ids(60, n_vocab, 3)), big, never.sink());
  a.wait();
  b.wait();
  never.wait();
  EXPECT_EQ(a.error, "");
  EXPECT_EQ(b.error, "");
  EXPECT_EQ(a.ids.size(), 40u);
  EXPECT_EQ(b.ids.size(), 40u);
  EXPECT_NE(never.error.find("maximum context length"), std::string::npos) << never.error;
  // The same request with a max_tokens the client did not set
  // (fit_max_tokens) is cut to what the cache leaves beside its prompt:
  // 7 * 16 - 60 - 1 = 51 tokens (blocks_for keeps a block for a
  // copy-on-write and a token for the next input).
  RequestParams fit = big;
  fit.fit_max_tokens = true;
  Collected cut;
  sched.submit(Prompt::of_ids(random_ids(60, n_vocab, 4)), fit, cut.sink());
  cut.wait();
  EXPECT_EQ(cut.error, "");
  EXPECT_EQ(cut.ids.size(), 51u);
  EXPECT_FALSE(sched.stats().failed);
  EXPECT_EQ(sched.stats().kv_blocks_used, 0);
}

// Four requests of 20 + 60 tokens in a cache of 12 blocks: their prompts fit
// together, so all are admitted; as they grow the engine preempts the newest
// and feeds them again later. Each generates what it generates alone.
TEST_P(SchedulerFamilies, PreemptsWhenTheCacheRunsDry) {
  EngineOptions eo;
  eo.max_cached_tokens = 192;
  eo.prefix_cache = true;
  Engine engine(load_model(kData + "/" + GetParam()), std::nullopt, eo);
  const int64_t n_vocab = engine.info().n_vocab;
  SchedulerOptions so;
  so.max_batch = 4;
  so.warmup = false;
  RequestParams p;
  p.max_tokens = 60;
  p.ignore_eos = true;
  p.sampling.temperature = 0;
  std::vector<std::vector<int32_t>> prompts;
  for (uint32_t i = 0; i < 4; ++i) prompts.push_back(random_ids(20, n_vocab, 40 + i));
  {
    Scheduler sched(engine, so);
    std::vector<Collected> got(4);
    for (size_t i = 0; i < 4; ++i) sched.submit(Prompt::of_ids(prompts[i]), p, got[i].sink());
    for (auto& g : got) g.wait();
    EXPECT_GT(sched.stats().preemptions, 0);
    EXPECT_FALSE(sched.stats().failed);
    EXPECT_EQ(sched.stats().kv_blocks_used, 0);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(got[i].error, "");
      Engine alone(load_model(kData + "/" + GetParam()), std::nullopt, EngineOptions{});
      std::vector<int32_t> want;
      alone.run(alone.submit(Prompt::of_ids(prompts[i]), p),
                [&](const Event& e) { want.insert(want.end(), e.ids.begin(), e.ids.end()); });
      EXPECT_EQ(got[i].ids, want) << "request " << i;
    }
  }
}

// The qwen3 fixture with a cache of 1024 tokens, behind a scheduler of
// max_batch rows and max_queue waiting requests (no warm-up), and requests of
// max_tokens that ignore EOS.
struct QueueCase {
  Engine engine;
  Scheduler sched;
  RequestParams p;
  static EngineOptions engine_options() {
    EngineOptions eo;
    eo.max_cached_tokens = 1024;
    return eo;
  }
  static SchedulerOptions options(int64_t max_batch, int64_t max_queue) {
    SchedulerOptions so;
    so.max_batch = max_batch;
    so.max_queue = max_queue;
    so.warmup = false;
    return so;
  }
  QueueCase(int64_t max_batch, int64_t max_queue, int64_t max_tokens)
      : engine(load_model(kData + "/qwen3"), std::nullopt, engine_options()),
        sched(engine, options(max_batch, max_queue)) {
    p.max_tokens = max_tokens;
    p.ignore_eos = true;
  }
};

// With no queue the batch's rows still take requests: two on an idle
// scheduler of two rows run (before, --max-queue 0 refused every request),
// and a third is refused while they do.
TEST(Scheduler, ANoQueueSchedulerFillsItsBatch) {
  QueueCase q(/*max_batch=*/2, /*max_queue=*/0, /*max_tokens=*/20);
  Collected a, b, refused;
  q.sched.submit(Prompt::of_ids({1, 2, 3}), q.p, a.sink());
  q.sched.submit(Prompt::of_ids({4, 5}), q.p, b.sink());
  EXPECT_THROW(q.sched.submit(Prompt::of_ids({6}), q.p, refused.sink()), QueueFull);
  a.wait();
  b.wait();
  EXPECT_EQ(a.error, "");
  EXPECT_EQ(b.error, "");
  EXPECT_EQ(a.ids.size(), 20u);
  EXPECT_EQ(b.ids.size(), 20u);
  EXPECT_EQ(q.sched.stats().kv_blocks_used, 0);
}

TEST(Scheduler, CancelFreesMemoryAndAFullQueueRefuses) {
  QueueCase q(/*max_batch=*/1, /*max_queue=*/2, /*max_tokens=*/900);
  Scheduler& sched = q.sched;
  const RequestParams& p = q.p;
  Collected running, queued1, queued2;
  const Ticket t = sched.submit(Prompt::of_ids({1, 2, 3}), p, running.sink());
  // Wait until it runs, then fill the queue.
  for (int i = 0; i < 2000 && sched.stats().running == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(sched.stats().running, 1);
  const Ticket q1 = sched.submit(Prompt::of_ids({4, 5}), p, queued1.sink());
  sched.submit(Prompt::of_ids({6, 7}), p, queued2.sink());
  Collected refused;
  EXPECT_THROW(sched.submit(Prompt::of_ids({8}), p, refused.sink()), QueueFull);
  sched.cancel(q1);  // dropped from the queue: its sink hears nothing
  sched.cancel(t);
  running.wait();
  EXPECT_EQ(running.final.finish, FinishReason::Cancelled);
  EXPECT_LT(running.ids.size(), 900u);
  queued2.wait();  // runs to the end once the first is gone
  EXPECT_EQ(queued2.ids.size(), 900u);
  {
    std::lock_guard<std::mutex> lock(queued1.mu);
    EXPECT_FALSE(queued1.done);
  }
  const Scheduler::Stats s = sched.stats();
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.queued, 0);
  EXPECT_EQ(s.kv_blocks_used, 0);
}

}  // namespace
}  // namespace augur
