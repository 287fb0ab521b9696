// The engine behind a thread, for many clients at once (the server): requests
// queue, are admitted into the running batch as room frees up, and their
// events go to each request's sink. Every step is one Engine::step() over all
// admitted requests, so requests join and leave the batch at every step
// (continuous batching) and long prompts are fed in chunks beside the
// decoding rows (EngineOptions::step_tokens).
//
// Admission: at most max_batch requests run at once, and a request runs only
// when the KV blocks of its prompt are free beside the prompts of the running
// ones; as they generate, the engine preempts the newest when blocks run out
// and feeds them again later (from the prefix cache where it still holds
// them). A request that cannot fit even alone is refused at once; a full
// queue refuses with QueueFull.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "runtime/engine.h"

namespace augur {

struct SchedulerOptions {
  int64_t max_batch = 16;   // requests running at once
  int64_t max_queue = 256;  // requests waiting beyond those; more are refused
  bool warmup = true;       // one short request through the engine before the thread starts
};

// The queue is full: the request was not taken.
struct QueueFull : Error {
  using Error::Error;
};

// A request's handle, unique over the scheduler's life.
using Ticket = uint64_t;

// One request's outcome, delivered on the scheduler's thread: its events in
// order (the last has done), or one error (a bad request, found when the
// engine takes it; nothing else follows).
struct RequestSink {
  std::function<void(Ticket, const Event&)> event;
  std::function<void(Ticket, const std::string& error)> error;
};

class Scheduler {
 public:
  using Ticket = augur::Ticket;
  // The engine is the scheduler's until it is destroyed; the warm-up runs and
  // the thread starts here.
  Scheduler(Engine& engine, const SchedulerOptions& opts);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request; throws QueueFull, or augur::Error when it could never
  // fit the cache. Thread-safe.
  Ticket submit(Prompt prompt, RequestParams params, RequestSink sink);
  // Ends a request: a queued one is dropped (its sink hears nothing more), a
  // running one finishes with FinishReason::Cancelled and frees its memory.
  // Thread-safe; unknown or finished tickets are ignored.
  void cancel(Ticket t);

  struct Stats {
    int64_t queued = 0, running = 0;
    int64_t kv_blocks_used = 0, kv_blocks_total = 0, block_size = 0, kv_block_bytes = 0;
    int64_t state_slots_used = 0, state_slots_total = 0, state_slot_bytes = 0;
    // The prefix cache (EngineOptions::prefix_cache): blocks it holds (those
    // no sequence shares are not counted in kv_blocks_used: they are given
    // back when a request needs them), recurrent-state copies.
    int64_t prefix_blocks = 0, prefix_states = 0, prefix_state_bytes = 0;
    int64_t steps = 0;
    int64_t preemptions = 0;  // Engine::preemptions
    bool failed = false;  // the engine threw: nothing more is served
    std::string failure;
  };
  Stats stats() const;
  // KV tokens a request may reserve at most (the whole cache).
  int64_t capacity_tokens() const { return capacity_tokens_; }

 private:
  struct Waiting {
    Ticket ticket;
    Prompt prompt;
    RequestParams params;
    RequestSink sink;
    std::vector<int32_t> ids;  // encoded on admission
  };
  struct Running {
    Ticket ticket;
    RequestSink sink;
    int64_t blocks = 0;  // reserved
  };
  void loop();
  int64_t blocks_for(int64_t n_prompt, const RequestParams& p) const;
  int64_t blocks_reserved(int64_t n_prompt, const RequestParams& p) const;
  int64_t tokens_left(int64_t n_prompt, const RequestParams& p) const;
  static int64_t draft_tokens(const RequestParams& p);  // a verify's drafts past max_tokens

  Engine& engine_;
  SchedulerOptions opts_;
  int64_t block_size_ = 0, total_blocks_ = 0, capacity_tokens_ = 0;
  int64_t reserved_blocks_ = 0;  // the loop's only

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Waiting> queue_;          // mu_
  std::vector<Ticket> cancels_;        // mu_
  bool stop_ = false;                  // mu_
  Ticket next_ticket_ = 1;             // mu_
  Stats stats_;                        // mu_ (published by the loop)
  std::map<RequestId, Running> running_;  // the loop's only
  std::thread thread_;
};

}  // namespace augur
