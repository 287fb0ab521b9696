// A fixed pool of worker threads for data-parallel loops.
//
// Decode runs a few hundred parallel regions per token, so dispatch must cost
// microseconds: workers spin briefly on a generation counter before sleeping
// on it (std::atomic wait/notify, a futex on Linux).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace augur {

class ThreadPool {
 public:
  // n_threads counts the calling thread; 0 means one per available core.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(tid, n_threads) once on every thread (the caller is tid 0) and
  // returns when all are done. Not re-entrant.
  void run(const std::function<void(int tid, int n_threads)>& fn);

  // Splits [0, n) into contiguous chunks of at least `grain` items and calls
  // fn(begin, end) for each, spread over the threads.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  // The process-wide pool (sized by AUGUR_THREADS or the core count).
  static ThreadPool& global();
  static void set_global_threads(int n_threads);
  // The most threads a pool takes: 4 a core, at least 64 (more only
  // contend, and far more cannot start).
  static int max_threads();

 private:
  void worker(int tid);

  int n_threads_;
  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace augur
