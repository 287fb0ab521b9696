#include "core/thread_pool.h"

#include <immintrin.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <system_error>

#include "core/error.h"

namespace augur {

namespace {

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  unsigned n = std::thread::hardware_concurrency();
  return n ? int(n) : 1;
}

// About 100 µs of spinning before a thread sleeps on a futex.
constexpr int kSpinIterations = 1 << 12;

std::mutex g_pool_mutex;
std::unique_ptr<ThreadPool> g_pool;

}  // namespace

int ThreadPool::max_threads() { return std::max(64, 4 * available_cores()); }

ThreadPool::ThreadPool(int n_threads) {
  const int cores = available_cores();
  if (n_threads > max_threads())
    fail("[threads] ", n_threads, " threads for ", cores, " cores; at most ", max_threads());
  n_threads_ = n_threads > 0 ? n_threads : cores;
  try {
    for (int t = 1; t < n_threads_; ++t) workers_.emplace_back([this, t] { worker(t); });
  } catch (const std::system_error& e) {
    // The threads that started are stopped and joined before the error
    // leaves (a joinable std::thread destroyed would terminate).
    stop_.store(true);
    generation_.fetch_add(1);
    generation_.notify_all();
    for (auto& w : workers_) w.join();
    fail("[threads] could not start ", n_threads_, " threads: ", e.what());
  }
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::worker(int tid) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t g = generation_.load(std::memory_order_acquire);
    for (int i = 0; g == seen && i < kSpinIterations; ++i) {
      _mm_pause();
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      continue;
    }
    seen = g;
    if (stop_.load()) return;
    (*job_)(tid, n_threads_);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  job_ = &fn;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  fn(0, n_threads_);
  // Spin briefly (the workers usually finish together), then sleep: when the
  // machine is oversubscribed a spinning caller would starve the workers.
  for (int i = 0; i < kSpinIterations && pending_.load(std::memory_order_acquire) != 0; ++i) _mm_pause();
  for (int p; (p = pending_.load(std::memory_order_acquire)) != 0;) pending_.wait(p, std::memory_order_acquire);
  job_ = nullptr;
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  int64_t chunks = std::min<int64_t>(n_threads_, (n + grain - 1) / grain);
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  run([&](int tid, int) {
    if (tid >= chunks) return;
    int64_t begin = n * tid / chunks;
    int64_t end = n * (tid + 1) / chunks;
    if (begin < end) fn(begin, end);
  });
}

ThreadPool& ThreadPool::global() {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  if (!g_pool) {
    int n = 0;
    if (const char* env = std::getenv("AUGUR_THREADS")) n = std::atoi(env);
    if (n > max_threads()) n = 0;  // as for any value that is not a thread count: the default
    g_pool = std::make_unique<ThreadPool>(n);
  }
  return *g_pool;
}

void ThreadPool::set_global_threads(int n_threads) {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  g_pool = std::make_unique<ThreadPool>(n_threads);
}

}  // namespace augur
