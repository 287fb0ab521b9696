// Per-block timestamps, for measurement builds only (-DAUGUR_STAMPS; never
// by default): a kernel's thread 0 takes a ticket at its block's start and
// writes %globaltimer at chosen events into the ticket's record; at exit the
// newest launches are printed, per event the minimum, median and maximum over
// their blocks, in µs from the earliest block start printed (so one kernel's
// launches line up with each other; `base` gives the absolute ns to line up
// two kernels' dumps).
//   BUILD=build/cuda-stamps DEST=.dev/s TARGETS=augur CUDA_FLAGS=-DAUGUR_STAMPS
//   bash scripts/build_cuda_bundle.sh        (then BIN=.dev/s on the device)
// A launch's blocks take consecutive tickets (a kernel's blocks all start
// before the next PDL-chained kernel's: each triggers its dependents only
// after its own start), so walking back from the newest ticket in steps of
// each record's grid size finds the launches.
#pragma once

#ifdef AUGUR_STAMPS
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

namespace augur::cuda::stamps {

constexpr int kEvents = 6;
constexpr unsigned kCap = 16384;  // records kept: the newest launches' blocks

struct Record {
  unsigned long long t[kEvents];
  unsigned grid, block;
};
struct Log {
  Record r[kCap];
  unsigned tickets;
};

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// Thread 0 of a block: its ticket, with its record cleared and the start stamped.
__device__ __forceinline__ unsigned take(Log& log) {
  const unsigned t = atomicAdd(&log.tickets, 1u);
  Record& r = log.r[t % kCap];
  for (int e = 1; e < kEvents; ++e) r.t[e] = 0;
  r.grid = gridDim.x * gridDim.y * gridDim.z;
  r.block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  r.t[0] = now_ns();
  return t;
}

__device__ __forceinline__ void stamp(Log& log, unsigned ticket, int e) { log.r[ticket % kCap].t[e] = now_ns(); }

// The newest `launches` launches in `log` (a host copy), oldest first.
inline void dump(const char* what, const Log& log, const char* const (&names)[kEvents], int launches) {
  struct Launch {
    unsigned first, n;
  };
  std::vector<Launch> found;
  long long end = (long long)log.tickets - 1;
  while (end >= 0 && (int)found.size() < launches && log.tickets - unsigned(end) <= kCap) {
    const unsigned g = log.r[unsigned(end) % kCap].grid;
    if (g == 0 || end + 1 < (long long)g || log.tickets - unsigned(end + 1 - g) > kCap) break;
    found.push_back({unsigned(end + 1 - g), g});
    end -= g;
  }
  std::reverse(found.begin(), found.end());
  unsigned long long base = ~0ull;
  for (const Launch& l : found)
    for (unsigned i = 0; i < l.n; ++i) base = std::min(base, log.r[(l.first + i) % kCap].t[0]);
  std::fprintf(stderr, "%s stamps: %zu launches, base %llu ns (us from base: min/med/max over blocks)\n", what,
               found.size(), base);
  for (const Launch& l : found) {
    std::fprintf(stderr, "%s launch at ticket %u, %u blocks\n", what, l.first, l.n);
    for (int e = 0; e < kEvents; ++e) {
      if (names[e] == nullptr) continue;
      std::vector<double> v;
      for (unsigned i = 0; i < l.n; ++i) {
        const unsigned long long t = log.r[(l.first + i) % kCap].t[e];
        if (t != 0) v.push_back((double(t) - double(base)) / 1e3);
      }
      if (v.empty()) continue;
      std::sort(v.begin(), v.end());
      std::fprintf(stderr, "  %-8s %8.2f %8.2f %8.2f  (10%% %8.2f, 90%% %8.2f)\n", names[e], v.front(), v[v.size() / 2],
                   v.back(), v[v.size() / 10], v[v.size() * 9 / 10]);
    }
  }
}

// Copies a kernel file's log (its own __device__ Log) and dumps it.
inline void dump_symbol(const char* what, const Log& symbol, const char* const (&names)[kEvents], int launches) {
  static Log h;
  if (cudaMemcpyFromSymbol(&h, symbol, sizeof h) != cudaSuccess) {
    std::fprintf(stderr, "%s stamps: copy failed\n", what);
    return;
  }
  dump(what, h, names, launches);
}

}  // namespace augur::cuda::stamps

// In a kernel: `AUGUR_STAMP_BEGIN(log)` first (thread 0 takes the ticket),
// then `AUGUR_STAMP(log, e)` where thread 0 passes event e.
#define AUGUR_STAMP_BEGIN(log) \
  const unsigned stamp_ticket = threadIdx.x == 0 ? ::augur::cuda::stamps::take(log) : 0u
#define AUGUR_STAMP(log, e)                                                    \
  do {                                                                         \
    if (threadIdx.x == 0) ::augur::cuda::stamps::stamp(log, stamp_ticket, e); \
  } while (0)
#else
#define AUGUR_STAMP_BEGIN(log) \
  do {                         \
  } while (0)
#define AUGUR_STAMP(log, e) \
  do {                      \
  } while (0)
#endif
