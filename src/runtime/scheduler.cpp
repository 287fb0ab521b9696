#include "runtime/scheduler.h"

#include <algorithm>

namespace augur {

Scheduler::Scheduler(Engine& engine, const SchedulerOptions& opts) : engine_(engine), opts_(opts) {
  if (opts_.max_batch <= 0) fail("[scheduler] max_batch must be positive, got ", opts_.max_batch);
  if (opts_.max_queue < 0) fail("[scheduler] max_queue must be >= 0, got ", opts_.max_queue);
  Runner& r = engine_.runner();
  block_size_ = r.options().block_size;
  total_blocks_ = r.pool().n_blocks();
  capacity_tokens_ = total_blocks_ * block_size_;
  if (engine_.info().max_position > 0) capacity_tokens_ = std::min(capacity_tokens_, engine_.info().max_position);
  stats_.kv_blocks_total = total_blocks_;
  stats_.block_size = block_size_;
  stats_.kv_block_bytes = r.kv().spec().bytes_per_token(engine_.info().placement.device()) * block_size_;
  stats_.state_slots_total = r.slots().n_slots();
  stats_.state_slot_bytes = r.kv().has_recurrent() ? r.kv().recurrent_spec().bytes_per_slot() : 0;
  if (opts_.warmup) {
    // The first forwards of a shape build its kernels' plans and CUDA
    // graphs: pay for them now, not in the first client's latency.
    try {
      RequestParams p;
      p.max_tokens = 4;
      p.ignore_eos = true;
      p.sampling.temperature = 0;
      engine_.run(engine_.submit(Prompt::of_ids({0, 0, 0, 0}), p));
    } catch (const std::exception&) {
      // Warm-up is an optimisation: the first request reports any real problem.
    }
  }
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

Scheduler::Ticket Scheduler::submit(Prompt prompt, RequestParams params, RequestSink sink) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stats_.failed) fail("[scheduler] the engine failed: ", stats_.failure);
  // Requests not yet running may fill the batch's free rows and max_queue
  // more: counting them all against max_queue refused every request at
  // --max-queue 0, and one of n choices past it on an idle server.
  const int64_t free_rows = std::max<int64_t>(0, opts_.max_batch - stats_.running);
  if (int64_t(queue_.size()) + stats_.queued >= opts_.max_queue + free_rows)
    throw QueueFull("[scheduler] the queue is full (" + std::to_string(opts_.max_queue) + " requests waiting)");
  const Ticket t = next_ticket_++;
  queue_.push_back(Waiting{t, std::move(prompt), std::move(params), std::move(sink), {}});
  wake_.notify_one();
  return t;
}

void Scheduler::cancel(Ticket t) {
  std::lock_guard<std::mutex> lock(mu_);
  cancels_.push_back(t);
  wake_.notify_one();
}

Scheduler::Stats Scheduler::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = stats_;
  s.queued += int64_t(queue_.size());
  return s;
}

// The KV blocks a request may fill: its prompt, max_tokens, the drafts of a
// verify past them, and one block more for a copy-on-write of a shared one.
int64_t Scheduler::blocks_for(int64_t n_prompt, const RequestParams& p) const {
  const int64_t tokens = n_prompt + p.max_tokens + draft_tokens(p) + 1;
  return (tokens + block_size_ - 1) / block_size_ + 1;
}

int64_t Scheduler::draft_tokens(const RequestParams& p) { return p.speculation.draft.empty() ? 0 : p.speculation.k; }

// The most tokens a request of n_prompt may generate: within the context,
// and within blocks_for's count of the whole cache.
int64_t Scheduler::tokens_left(int64_t n_prompt, const RequestParams& p) const {
  return std::min(capacity_tokens_ - n_prompt, (total_blocks_ - 1) * block_size_ - n_prompt - draft_tokens(p) - 1);
}

// The blocks reserved when a request is admitted: its prompt's (and one for
// a copy-on-write); what it generates is not reserved, since the engine
// preempts the newest requests when blocks run out (Engine::preemptions).
// Draft sources that keep a sequence of their own (an MTP head, a draft
// model) fill a cache of their own, which preemption does not cover: such
// requests reserve all they may fill.
int64_t Scheduler::blocks_reserved(int64_t n_prompt, const RequestParams& p) const {
  const std::string& d = p.speculation.draft;
  if (!d.empty() && d != "ngram") return blocks_for(n_prompt, p);
  return (n_prompt + 1 + block_size_ - 1) / block_size_ + 1;
}

void Scheduler::loop() {
  std::deque<Waiting> pending;  // taken from queue_, waiting for room
  for (;;) {
    std::vector<Ticket> cancels;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] {
        return stop_ || !queue_.empty() || !cancels_.empty() || !running_.empty() || !pending.empty();
      });
      if (stop_) break;
      while (!queue_.empty()) {
        pending.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      cancels.swap(cancels_);
      stats_.queued = int64_t(pending.size());
    }
    for (Ticket t : cancels) {
      auto w = std::find_if(pending.begin(), pending.end(), [&](const Waiting& x) { return x.ticket == t; });
      if (w != pending.end()) {
        pending.erase(w);
        continue;
      }
      for (auto& [id, r] : running_)
        if (r.ticket == t) engine_.cancel(id);
    }
    // Admission, in order of arrival.
    while (!pending.empty() && int64_t(running_.size()) < opts_.max_batch) {
      Waiting& w = pending.front();
      try {
        if (w.ids.empty()) w.ids = engine_.encode(w.prompt);
        if (w.ids.empty()) fail("the prompt is empty");
        const int64_t n = int64_t(w.ids.size());
        // The wording carries OpenAI's "maximum context length", which
        // clients look for (the server adds its code).
        if (w.params.fit_max_tokens)
          w.params.max_tokens = std::clamp<int64_t>(tokens_left(n, w.params), 0, w.params.max_tokens);
        if (n + w.params.max_tokens > capacity_tokens_)
          fail("this model's maximum context length is ", capacity_tokens_, " tokens; the prompt (", n,
               " tokens) and max_tokens (", w.params.max_tokens, ") exceed it");
        if (w.params.fit_max_tokens && w.params.max_tokens < 1)
          fail("the prompt (", n, " tokens) leaves no room to generate within this server's maximum context length of ",
               capacity_tokens_, " tokens (the KV blocks a request holds beside its tokens included)");
        const int64_t need = blocks_for(n, w.params);
        if (need > total_blocks_)
          fail("the prompt (", n, " tokens) and max_tokens (", w.params.max_tokens, ") need ", need,
               " KV blocks, more than the cache's ", total_blocks_, ": beyond this server's maximum context length");
        const int64_t reserve = blocks_reserved(n, w.params);
        if (reserved_blocks_ + reserve > total_blocks_) break;  // waits for room
        const RequestId id = engine_.submit(Prompt::of_ids(w.ids), w.params);
        running_[id] = Running{w.ticket, std::move(w.sink), reserve};
        reserved_blocks_ += reserve;
      } catch (const Error& e) {  // a bad request
        w.sink.error(w.ticket, e.what());
      } catch (const std::exception& e) {  // anything else fails the request alone
        w.sink.error(w.ticket, std::string("internal error: ") + e.what());
      }
      pending.pop_front();
    }
    std::vector<Event> events;
    if (!engine_.idle()) {
      try {
        events = engine_.step();
      } catch (const std::exception& e) {
        // The engine's state is unknown after a failed step: every request
        // ends with the error and nothing more is served.
        for (auto& [id, r] : running_) r.sink.error(r.ticket, std::string("the engine failed: ") + e.what());
        for (Waiting& w : pending) w.sink.error(w.ticket, std::string("the engine failed: ") + e.what());
        running_.clear();
        pending.clear();
        std::lock_guard<std::mutex> lock(mu_);
        stats_.failed = true;
        stats_.failure = e.what();
        for (Waiting& w : queue_) w.sink.error(w.ticket, std::string("the engine failed: ") + e.what());
        queue_.clear();
        stats_.queued = stats_.running = 0;
        break;
      }
    }
    // Finished requests leave the books and the stats first, so that a sink
    // hearing its last event already sees its memory freed.
    struct Delivery {
      RequestSink sink;
      Ticket ticket;
      const Event* event;
    };
    std::vector<Delivery> deliveries;
    for (const Event& e : events) {
      auto it = running_.find(e.id);
      if (it == running_.end()) continue;
      if (e.done) {
        reserved_blocks_ -= it->second.blocks;
        deliveries.push_back({std::move(it->second.sink), it->second.ticket, &e});
        running_.erase(it);
      } else {
        deliveries.push_back({it->second.sink, it->second.ticket, &e});
      }
    }
    {
      // The cache's figures are counted before the lock (a walk over its entries).
      const PrefixCache* pc = engine_.prefix_cache();
      const PrefixCache::Stats ps = pc ? pc->stats() : PrefixCache::Stats{};
      std::lock_guard<std::mutex> lock(mu_);
      Runner& r = engine_.runner();
      stats_.queued = int64_t(pending.size());
      stats_.running = int64_t(running_.size());
      stats_.kv_blocks_used = total_blocks_ - r.pool().n_free();
      if (pc) {
        stats_.kv_blocks_used -= ps.blocks_only;
        stats_.prefix_blocks = ps.blocks;
        stats_.prefix_states = ps.states;
        stats_.prefix_state_bytes = ps.state_bytes;
      }
      stats_.state_slots_used = r.slots().n_slots() - r.slots().n_free();
      stats_.steps += events.empty() ? 0 : 1;
      stats_.preemptions = engine_.preemptions();
    }
    for (const Delivery& d : deliveries) d.sink.event(d.ticket, *d.event);
  }
}

}  // namespace augur
