// The end of a decoder block at decode (M <= 2 tokens) in one persistent
// kernel, so that the weight stream never stops between its matrices:
//
//   x += a · w_outᵀ;  h = rms_norm(x) * g;  out = down · (silu(gate · h) * (up · h))
//   optionally:  x += out;  y_next = w_next · (rms_norm(x) * g_next)
//
// Separate kernels drain DRAM at every boundary (each boundary of the batch-1
// step cost ~2.5 µs of bandwidth on the H200, docs/cuda_kernels.md). Here a
// grid of one block per SM walks three or four stages (w_out, gate/up, down,
// w_next) with a grid-wide barrier between them; each warp streams its weight
// rows through a private cp.async ring that runs kDepth - 1 passes ahead of
// its arithmetic, across stage boundaries: weights depend on nothing, so a
// warp loads the next stage's first rows before the barrier that gates their
// multiplication, and the first stage's before the previous kernel
// (attention) has finished.
//
// A tile that is one warp's repeats the unfused path's arithmetic exactly
// (rows_kernel's: lane l takes k = 8l..8l+7 of every 256-wide pass, the same
// f32 expression, the same shuffle reduction); the norm repeats
// add_rms_norm_kernel's partial sums and reduction tree; SwiGLU is silu_mul.
//
// Opt-in (AUGUR_CUDA_DECODE_TAIL=1): faster than the unfused kernels alone,
// slower inside the decode step (docs/benchmarks.md, fifth session). The
// default is the stream chain (decode_tail_chain below): the same arithmetic
// as four stream GEMVs with the norm, SwiGLU and residual adds fused into
// their ends, so no small kernel stops the weight stream.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/detail.h"

namespace augur::cuda {
namespace {

constexpr int kWarps = 8;  // a block (one per SM) = 8 warps
constexpr int kThreads = kWarps * 32;
constexpr int kR = 4;                       // weight rows of a warp tile
constexpr int kPass = 256;                  // k of one pass (32 lanes x 8)
constexpr int kSlotBytes = kR * kPass * 2;  // one pass of a tile: 4 rows x 512 bytes
constexpr int kStages = 4;                  // w_out, gate/up, down, the next block's projection
// Ring slots a warp (DEPTH - 1 passes in flight): 6, 8 or 10, 96-160 KB a block.
constexpr int kDefaultDepth = 6;
constexpr int ring_bytes(int depth) { return kWarps * depth * kSlotBytes; }

struct TailArgs {
  const float* a;              // [M, Ka] input of the output projection
  float* x;                    // [M, D] residual stream, updated in place
  const float* g;              // [D] the MLP's norm gain
  const float* g_next;         // [D] the next block's norm gain (stage 3)
  const uint16_t* w[kStages];  // w_out [D, Ka], gate_up [2F, D] (gate rows, then up), down [D, F], w_next [N3, D]
  int K[kStages];              // Ka, D, F, D
  int tiles[kStages];          // D/4, F/2, D/4, N3/4 (0: no stage 3)
  unsigned split;              // bit s: stage s's work is shared out in passes, not whole tiles
  unsigned f16;                // bit s: stage s's weights are IEEE half
  float* o;                    // [M, D] scratch: a · w_outᵀ
  float* act;                  // [M, F] scratch: the SwiGLU output
  float* out;                  // [M, D] the MLP's output
  float* y_next;               // [M, N3] the next block's projection
  float* partials;             // [2 * n_warps, kR * 2] partial sums of tiles split between warps
  int* counters;               // [max tiles] arrivals at split tiles, zero between launches
  unsigned* bar;               // [4] grid barriers and "past the last barrier", zero between launches
  int M, D, F, N3;
  int k_max;  // row stride of the staged input in smem
  float eps;
  int norm_threads;  // add_rms_norm_kernel's block size (its reduction order)
  // AUGUR_CUDA_TAIL_TRACE: kTraceStamps %globaltimer stamps a block a launch,
  // launch i in slot i % kTraceLaunches (see trace_report).
  unsigned long long* trace;
  unsigned* trace_launch;
};

constexpr int kTraceStamps = 10;  // entry, PDL wait done, 3 x (barrier arrive, leave), end
constexpr int kTraceLaunches = 2048;
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Stage s is tiles x passes units (a unit: one 256-wide pass of a 4-row
// tile). Warp w takes tiles w, w + warps, ... whole (the grid sweeps each
// matrix front to back together); where that leaves warps idle for long
// (27B's 1,280 tiles of w_out on 1,056 warps: a fifth of them take two), the
// stage is split: of n = min(warps, U), warp w takes units
// [U w / n, U (w + 1) / n), and a tile cut between warps is summed from their
// partials by the last to finish it (a fence and an atomic each, so only
// where it pays). Divisions here run once a stage or a cut tile.
__device__ __forceinline__ int stage_passes(const TailArgs& p, int s) { return (p.K[s] + kPass - 1) / kPass; }
__device__ __forceinline__ int64_t stage_units(const TailArgs& p, int s) {
  return int64_t(p.tiles[s]) * stage_passes(p, s);
}
// A split stage's range start for warp w.
__device__ __forceinline__ int64_t range_begin(const TailArgs& p, int s, int w, int n_warps) {
  const int64_t U = stage_units(p, s), n = min(int64_t(n_warps), U);
  return w >= n ? U : U * w / n;
}
// The warp whose range holds unit u: the last whose range begins at or before u.
__device__ __forceinline__ int warp_of(const TailArgs& p, int s, int64_t u, int n_warps) {
  const int64_t U = stage_units(p, s), n = min(int64_t(n_warps), U);
  return int(((u + 1) * n + U - 1) / U - 1);
}
// Row r of tile t of stage s. A gate/up tile is gate rows 2t, 2t+1 and the up
// rows with the same indices, so its epilogue has both halves of SwiGLU.
__device__ __forceinline__ const uint16_t* tile_row(const TailArgs& p, int s, int t, int r) {
  if (s == 1) return p.w[1] + int64_t(r < 2 ? 2 * t + r : p.F + 2 * t + r - 2) * p.D;
  return p.w[s] + int64_t(kR * t + r) * p.K[s];
}

// A warp's way through stage s: `left` more units, the next being pass
// `pass` of tile t; after a tile's P passes, tile t + step.
struct Walk {
  int s, t, pass, P, step;
  int64_t left;
};
__device__ __forceinline__ Walk walk_of(const TailArgs& p, int s, int gw, int n_warps) {
  Walk c{s, gw, 0, stage_passes(p, s), n_warps, 0};
  if (p.split >> s & 1u) {
    const int64_t u = range_begin(p, s, gw, n_warps);
    c.left = range_begin(p, s, gw + 1, n_warps) - u;
    c.t = int(u / c.P), c.pass = int(u % c.P), c.step = 1;
  } else if (gw < p.tiles[s]) {
    c.left = int64_t(c.P) * ((p.tiles[s] - gw + n_warps - 1) / n_warps);
  }
  return c;
}
__device__ __forceinline__ void step(Walk& c) {
  if (++c.pass == c.P) c.pass = 0, c.t += c.step;
  --c.left;
}
// The load side's walk runs ahead across stages.
using Cursor = Walk;
__device__ __forceinline__ void settle(const TailArgs& p, Cursor& c, int gw, int n_warps) {
  while (c.s < kStages && c.left <= 0) {
    if (++c.s == kStages) break;
    c = walk_of(p, c.s, gw, n_warps);
  }
}
// One pass of the cursor's unit into a ring slot; each lane loads, and later
// reads, only its own 16 bytes of each row, so the ring needs no warp sync.
// Lanes past K (the last pass of a K that is no multiple of 256) load nothing.
__device__ __forceinline__ void issue(const TailArgs& p, Cursor& c, int gw, int n_warps, char* slot, int lane) {
  if (c.s < kStages) {
    const int k = c.pass * kPass + lane * 8;
    if (k < p.K[c.s])
#pragma unroll
      for (int r = 0; r < kR; ++r) cp_async16(slot + r * (kPass * 2) + lane * 16, tile_row(p, c.s, c.t, r) + k, true);
    step(c);
    settle(p, c, gw, n_warps);
  }
  cp_async_commit();  // an empty group past the end keeps the wait count uniform
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// All blocks of the grid (all resident: one per SM) reach this point; writes
// before it are visible after it (the cooperative-groups grid sync pattern).
// stamps (tracing only): this block's arrival and departure times.
__device__ __forceinline__ void grid_barrier(unsigned* counter, unsigned long long* stamps = nullptr) {
  __syncthreads();
  if (threadIdx.x == 0) {
    if (stamps != nullptr) stamps[0] = global_ns();
    __threadfence();
    atomicAdd(counter, 1u);
    while (ld_acquire(counter) < gridDim.x) {
    }
    __threadfence();
    if (stamps != nullptr) stamps[1] = global_ns();
  }
  __syncthreads();
}

// h[m] = gain * (v * inv), v = xa[m] + xb[m], for every row, into xs (row
// stride k_max). The sum of squares is add_rms_norm_kernel's (vector path,
// norm_threads threads): this block's thread i plays its threads i, i + 256, ...
// L2 reads: xa and xb may have been written by other blocks of this kernel.
__device__ void norm_rows(const TailArgs& p, const float* xa, const float* xb, const float* gain, float* xs,
                          float* red) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int virt = p.norm_threads / kThreads;  // 1, 2 or 4
  for (int m = 0; m < p.M; ++m) {
    const float* ar = xa + int64_t(m) * p.D;
    const float* br = xb + int64_t(m) * p.D;
    for (int q = 0; q < virt; ++q) {
      float ss = 0.f;
      for (int i = (tid + q * kThreads) * 4; i < p.D; i += p.norm_threads * 4) {
        float4 v = __ldcg(reinterpret_cast<const float4*>(ar + i));
        const float4 b = __ldcg(reinterpret_cast<const float4*>(br + i));
        v.x += b.x, v.y += b.y, v.z += b.z, v.w += b.w;
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
      }
      ss = warp_sum(ss);
      if (lane == 0) red[warp + q * kWarps] = ss;
    }
    __syncthreads();
    float total = lane < p.norm_threads / 32 ? red[lane] : 0.f;
    total = warp_sum(total);
    const float inv = 1.0f / sqrtf(total / float(p.D) + p.eps);
    float* hr = xs + int64_t(m) * p.k_max;
    for (int i = tid * 4; i < p.D; i += kThreads * 4) {
      float4 v = __ldcg(reinterpret_cast<const float4*>(ar + i));
      const float4 b = __ldcg(reinterpret_cast<const float4*>(br + i));
      v.x += b.x, v.y += b.y, v.z += b.z, v.w += b.w;
      const float4 gg = *reinterpret_cast<const float4*>(gain + i);
      *reinterpret_cast<float4*>(hr + i) =
          make_float4(gg.x * (v.x * inv), gg.y * (v.y * inv), gg.z * (v.z * inv), gg.w * (v.w * inv));
    }
    __syncthreads();  // red is reused by the next row
  }
}

// x += b (block 0 only: the residual as add_rms_norm_kernel stores it).
__device__ void residual_add(const TailArgs& p, const float* b) {
  for (int m = 0; m < p.M; ++m)
    for (int i = threadIdx.x * 4; i < p.D; i += kThreads * 4) {
      float4 v = __ldcg(reinterpret_cast<const float4*>(p.x + int64_t(m) * p.D + i));
      const float4 c = __ldcg(reinterpret_cast<const float4*>(b + int64_t(m) * p.D + i));
      v.x += c.x, v.y += c.y, v.z += c.z, v.w += c.w;
      *reinterpret_cast<float4*>(p.x + int64_t(m) * p.D + i) = v;
    }
}

// src [M, K] (row stride K) into xs (row stride k_max), through L2.
__device__ void stage_input(const TailArgs& p, const float* src, int K, float* xs) {
  for (int m = 0; m < p.M; ++m)
    for (int i = threadIdx.x * 4; i < K; i += kThreads * 4)
      *reinterpret_cast<float4*>(xs + int64_t(m) * p.k_max + i) =
          __ldcg(reinterpret_cast<const float4*>(src + int64_t(m) * K + i));
}

// A finished tile's outputs (lane 0 writes).
template <int MR>
__device__ __forceinline__ void finish_tile(const TailArgs& p, int s, int t, const float (&acc)[kR][MR], int lane) {
  if (lane != 0) return;
  for (int m = 0; m < p.M && m < MR; ++m) {
    if (s == 1) {
      p.act[int64_t(m) * p.F + 2 * t] = silu_mul(acc[0][m], acc[2][m]);
      p.act[int64_t(m) * p.F + 2 * t + 1] = silu_mul(acc[1][m], acc[3][m]);
    } else {
      float* y = s == 0 ? p.o + int64_t(m) * p.D : s == 2 ? p.out + int64_t(m) * p.D : p.y_next + int64_t(m) * p.N3;
#pragma unroll
      for (int r = 0; r < kR; ++r) y[kR * t + r] = acc[r][m];
    }
  }
}

// A warp's part of tile t (acc, already warp-summed) into its partial slot
// (0: the first tile of its range, 1: the last); the last part to arrive sums
// the parts in warp order, writes the tile and leaves its counter at zero.
template <int MR>
__device__ void finish_part(const TailArgs& p, int s, int t, float (&acc)[kR][MR], int gw, int n_warps, int lane) {
  constexpr int kE = kR * MR;
  const int P = stage_passes(p, s);
  auto slot_of = [&](int w) { return 2 * w + (int64_t(t) == range_begin(p, s, w, n_warps) / P ? 0 : 1); };
  const float mine = lane_element(acc, lane);
  if (lane < kE) {
    p.partials[slot_of(gw) * kE + lane] = mine;
    __threadfence();
  }
  __syncwarp();
  const int w0 = warp_of(p, s, int64_t(t) * P, n_warps), w1 = warp_of(p, s, int64_t(t) * P + P - 1, n_warps);
  int arrived = 0;
  if (lane == 0) arrived = atomicAdd(&p.counters[t], 1);
  arrived = __shfl_sync(0xffffffffu, arrived, 0);
  if (arrived != w1 - w0) return;
  __threadfence();
  float sum = 0.f;
  if (lane < kE)
    for (int w = w0; w <= w1; ++w) sum += __ldcg(p.partials + slot_of(w) * kE + lane);
#pragma unroll
  for (int r = 0; r < kR; ++r)
#pragma unroll
    for (int m = 0; m < MR; ++m) acc[r][m] = __shfl_sync(0xffffffffu, sum, r * MR + m);
  finish_tile<MR>(p, s, t, acc, lane);
  if (lane == 0) p.counters[t] = 0;
}

// This warp's units of stage s, multiplied from the ring as their passes land
// (rows_kernel's arithmetic), with loads kept kDepth - 1 passes ahead.
template <int MR, int kDepth, bool F16>
__device__ void run_stage(const TailArgs& p, int s, const float* xs, char* ring, int& slot, Cursor& ahead, int gw,
                          int n_warps, int lane) {
  const int K = p.K[s];
  float acc[kR][MR];
#pragma unroll
  for (int r = 0; r < kR; ++r)
#pragma unroll
    for (int m = 0; m < MR; ++m) acc[r][m] = 0.f;
  Walk c = walk_of(p, s, gw, n_warps);
  bool from_start = c.pass == 0;  // this warp has tile t's first pass
  while (c.left > 0) {
    const int t = c.t, pass = c.pass, P = c.P;
    if (pass == 0) from_start = true;
    issue(p, ahead, gw, n_warps, ring + ((slot + kDepth - 1) % kDepth) * kSlotBytes, lane);
    cp_async_wait<kDepth - 1>();  // this pass's group has landed
    const int cur_slot = slot;
    slot = slot + 1 == kDepth ? 0 : slot + 1;
    const int kk = pass * kPass + lane * 8;
    if (kk < K) {  // past K: nothing loaded, nothing to add (as rows_kernel)
      const char* cur = ring + cur_slot * kSlotBytes + lane * 16;
      float wf[kR][8];
#pragma unroll
      for (int r = 0; r < kR; ++r) unpack8<F16>(*reinterpret_cast<const uint4*>(cur + r * (kPass * 2)), wf[r]);
#pragma unroll
      for (int m = 0; m < MR; ++m) {
        if (m >= p.M) break;
        const float4 a = *reinterpret_cast<const float4*>(xs + m * p.k_max + kk);
        const float4 b = *reinterpret_cast<const float4*>(xs + m * p.k_max + kk + 4);
#pragma unroll
        for (int r = 0; r < kR; ++r)
          acc[r][m] += a.x * wf[r][0] + a.y * wf[r][1] + a.z * wf[r][2] + a.w * wf[r][3] + b.x * wf[r][4] +
                       b.y * wf[r][5] + b.z * wf[r][6] + b.w * wf[r][7];
      }
    }
    if (pass == P - 1 || c.left == 1) {  // the end of this warp's part of tile t
#pragma unroll
      for (int r = 0; r < kR; ++r)
#pragma unroll
        for (int m = 0; m < MR; ++m) acc[r][m] = warp_sum(acc[r][m]);
      if (pass == P - 1 && from_start)
        finish_tile<MR>(p, s, t, acc, lane);  // the whole tile was this warp's
      else
        finish_part<MR>(p, s, t, acc, gw, n_warps, lane);
#pragma unroll
      for (int r = 0; r < kR; ++r)
#pragma unroll
        for (int m = 0; m < MR; ++m) acc[r][m] = 0.f;
    }
    step(c);
  }
}

template <int MR, int kDepth>
__device__ void run_stage_any(const TailArgs& p, int s, const float* xs, char* ring, int& slot, Cursor& ahead, int gw,
                              int n_warps, int lane) {
  if (p.f16 >> s & 1u)
    run_stage<MR, kDepth, true>(p, s, xs, ring, slot, ahead, gw, n_warps, lane);
  else
    run_stage<MR, kDepth, false>(p, s, xs, ring, slot, ahead, gw, n_warps, lane);
}

template <int MR, int kDepth, bool TRACE>
__global__ void __launch_bounds__(kThreads, 1) decode_tail_kernel(TailArgs p) {
  extern __shared__ __align__(16) char smem[];
  __shared__ float red[32];
  unsigned long long* stamp = nullptr;  // this block's stamps of this launch (thread 0)
  if constexpr (TRACE) {
    if (threadIdx.x == 0) {
      const unsigned launch = *reinterpret_cast<volatile unsigned*>(p.trace_launch);
      stamp = p.trace + (size_t(launch % kTraceLaunches) * gridDim.x + blockIdx.x) * kTraceStamps;
      for (int k = 1; k < kTraceStamps; ++k) stamp[k] = 0;  // (a slot's earlier launch may have had stage 3)
      stamp[0] = global_ns();
    }
  }
  float* xs = reinterpret_cast<float*>(smem + ring_bytes(kDepth));  // [M, k_max] the stage's input
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n_warps = int(gridDim.x) * kWarps;
  const int gw = int(blockIdx.x) * kWarps + warp;
  char* ring = smem + warp * (kDepth * kSlotBytes);
  const bool next = p.tiles[3] > 0;

  // The first kDepth - 1 passes: weights only, so before the PDL wait.
  Cursor ahead = walk_of(p, 0, gw, n_warps);
  settle(p, ahead, gw, n_warps);
  for (int i = 0; i < kDepth - 1; ++i) issue(p, ahead, gw, n_warps, ring + i * kSlotBytes, lane);
  int slot = 0;

  pdl_wait();
  pdl_launch_dependents();
  if (TRACE && stamp != nullptr) stamp[1] = global_ns();
  stage_input(p, p.a, p.K[0], xs);
  __syncthreads();
  run_stage_any<MR, kDepth>(p, 0, xs, ring, slot, ahead, gw, n_warps, lane);

  grid_barrier(&p.bar[0], TRACE && stamp != nullptr ? stamp + 2 : nullptr);  // o complete
  norm_rows(p, p.x, p.o, p.g, xs, red);
  run_stage_any<MR, kDepth>(p, 1, xs, ring, slot, ahead, gw, n_warps, lane);

  grid_barrier(&p.bar[1], TRACE && stamp != nullptr ? stamp + 4 : nullptr);  // act complete; every block has read x
  if (blockIdx.x == 0) residual_add(p, p.o);                                 // x' = x + o
  if (!next && threadIdx.x == 0) atomicAdd(&p.bar[3], 1u);                   // past the last barrier
  stage_input(p, p.act, p.F, xs);
  __syncthreads();
  run_stage_any<MR, kDepth>(p, 2, xs, ring, slot, ahead, gw, n_warps, lane);

  if (next) {
    grid_barrier(&p.bar[2], TRACE && stamp != nullptr ? stamp + 6 : nullptr);  // out complete; x' written
    norm_rows(p, p.x, p.out, p.g_next, xs, red);
    if (threadIdx.x == 0) atomicAdd(&p.bar[3], 1u);  // past the last barrier, done reading x'
    run_stage_any<MR, kDepth>(p, 3, xs, ring, slot, ahead, gw, n_warps, lane);
  }
  cp_async_wait<0>();
  if constexpr (TRACE) {
    __syncthreads();
    if (stamp != nullptr) stamp[8] = global_ns();
  }
  if (blockIdx.x == 0) {
    // Once every block is past the last barrier (and, with stage 3, done
    // reading x'), no block reads x or the counters again this launch.
    if (threadIdx.x == 0)
      while (ld_acquire(&p.bar[3]) < gridDim.x) {
      }
    __syncthreads();
    if (next) residual_add(p, p.out);  // x'' = x' + out
    if (threadIdx.x == 0) p.bar[0] = 0, p.bar[1] = 0, p.bar[2] = 0, p.bar[3] = 0;
    if (TRACE && threadIdx.x == 0) atomicAdd(p.trace_launch, 1u);  // every block read it at entry
  }
}

size_t smem_bytes(int depth, int64_t M, int64_t k_max) {
  return size_t(ring_bytes(depth)) + size_t(M * k_max) * sizeof(float);
}

int max_smem() {
  static const int v = [] {
    int b = 0;
    AUGUR_CUDA(cudaDeviceGetAttribute(&b, cudaDevAttrMaxSharedMemoryPerBlockOptin, context().device));
    return b - 1024;  // the static red[] and the runtime's reserve
  }();
  return v;
}

using TailKernel = void (*)(TailArgs);
template <int MR, bool TRACE>
TailKernel tail_kernel(int depth) {
  switch (depth) {
    case 8:
      return decode_tail_kernel<MR, 8, TRACE>;
    case 10:
      return decode_tail_kernel<MR, 10, TRACE>;
    default:
      return decode_tail_kernel<MR, 6, TRACE>;
  }
}

// AUGUR_CUDA_TAIL_TRACE=1: every launch stamps %globaltimer at each block's
// entry, PDL release, barrier arrivals and departures and end; at exit the
// means over the last launches (all shapes together) go to stderr. For
// finding where the kernel loses time inside the decode step.
struct Trace {
  DeviceBuffer stamps, launches;
  int blocks = 0;
};
void trace_report();
Trace* trace_buffers() {
  static Trace* t = [] {
    const char* e = std::getenv("AUGUR_CUDA_TAIL_TRACE");
    if (e == nullptr || std::atoi(e) == 0) return static_cast<Trace*>(nullptr);
    auto* r = new Trace;  // lives to the end of the process, for trace_report
    r->blocks = context().sm_count;
    r->stamps = DeviceBuffer(size_t(kTraceLaunches) * r->blocks * kTraceStamps * sizeof(unsigned long long));
    r->launches = DeviceBuffer(sizeof(unsigned));
    AUGUR_CUDA(cudaMemset(r->stamps.get(), 0, r->stamps.bytes()));
    AUGUR_CUDA(cudaMemset(r->launches.get(), 0, sizeof(unsigned)));
    std::atexit(trace_report);
    return r;
  }();
  return t;
}

void trace_report() {
  Trace* t = trace_buffers();
  if (t == nullptr || cudaDeviceSynchronize() != cudaSuccess) return;
  unsigned launches = 0;
  std::vector<unsigned long long> st(t->stamps.bytes() / sizeof(unsigned long long));
  if (cudaMemcpy(&launches, t->launches.get(), sizeof launches, cudaMemcpyDeviceToHost) != cudaSuccess ||
      cudaMemcpy(st.data(), t->stamps.get(), t->stamps.bytes(), cudaMemcpyDeviceToHost) != cudaSuccess)
    return;
  const int n = int(std::min<unsigned>(launches, kTraceLaunches)), B = t->blocks;
  // Per launch, relative to the PDL release of the first block (us): the
  // first entry, the last release, each barrier's first and last arrival and
  // last departure, the last end. Means over the launches.
  double sum[12] = {};
  int counted = 0, with_third = 0;
  for (int l = 0; l < n; ++l) {
    const unsigned long long* s = st.data() + size_t(l) * B * kTraceStamps;
    auto lo = [&](int k) {
      unsigned long long v = ~0ull;
      for (int b = 0; b < B; ++b) v = std::min(v, s[b * kTraceStamps + k]);
      return v;
    };
    auto hi = [&](int k) {
      unsigned long long v = 0;
      for (int b = 0; b < B; ++b) v = std::max(v, s[b * kTraceStamps + k]);
      return v;
    };
    const unsigned long long t0 = lo(1);
    if (t0 == 0) continue;  // a block's stamps missing (not traced)
    auto us = [&](unsigned long long v) { return v == 0 ? 0.0 : (double(v) - double(t0)) / 1e3; };
    const double row[12] = {us(lo(0)), us(hi(1)), us(lo(2)), us(hi(2)), us(hi(3)), us(lo(4)),
                            us(hi(4)), us(hi(5)), us(lo(6)), us(hi(6)), us(hi(7)), us(hi(8))};
    for (int k = 0; k < 12; ++k) sum[k] += row[k];
    with_third += hi(6) != 0;
    ++counted;
  }
  if (counted == 0) return;
  for (double& v : sum) v /= counted;
  std::fprintf(stderr,
               "[cuda] decode_tail trace, mean of %d launches (%d with the next projection), us from the first PDL "
               "release: first entry %.1f, last release %.1f | barrier 0 arrivals %.1f-%.1f, out %.1f | barrier 1 "
               "arrivals %.1f-%.1f, out %.1f | barrier 2 arrivals %.1f-%.1f, out %.1f | last end %.1f\n",
               counted, with_third, sum[0], sum[1], sum[2], sum[3], sum[4], sum[5], sum[6], sum[7], sum[8], sum[9],
               sum[10], sum[11]);
}

// The ring depth: detail::decode_tail_depth() (benchmark sweeps), else
// AUGUR_CUDA_TAIL_DEPTH, else the default; 6 whenever the deeper one does not fit.
int tail_depth(int64_t M, int64_t k_max) {
  static const int env = [] {
    const char* e = std::getenv("AUGUR_CUDA_TAIL_DEPTH");
    return e == nullptr ? 0 : std::atoi(e);
  }();
  int d = detail::decode_tail_depth() > 0 ? detail::decode_tail_depth() : env > 0 ? env : kDefaultDepth;
  d = d >= 10 ? 10 : d >= 8 ? 8 : 6;
  while (d > 6 && smem_bytes(d, M, k_max) > size_t(max_smem())) d -= 2;
  return d;
}

}  // namespace

namespace detail {
int& decode_tail_depth() {
  static int d = 0;
  return d;
}
int& decode_tail_variant() {
  static int v = -1;
  return v;
}
}  // namespace detail

namespace {

// The persistent kernel: alone it beats the unfused kernels (Qwen3-8B M = 1:
// 89.5 vs 93.2 us a layer), but inside the decode step it measured slower
// (4.81 vs 4.67 ms; docs/cuda_kernels.md). AUGUR_CUDA_TAIL_NEXT=0 leaves its
// next projection out.
// Which tail: detail::decode_tail_variant() if set (tests), else
// AUGUR_CUDA_DECODE_TAIL: 0 none (the unfused ops), 1 the persistent kernel,
// 2 (default) the stream chain, where the stream GEMV is on.
int tail_variant() {
  if (detail::decode_tail_variant() >= 0) return detail::decode_tail_variant();
  static const int v = [] {
    const char* e = std::getenv("AUGUR_CUDA_DECODE_TAIL");
    return e != nullptr ? std::atoi(e) : 2;
  }();
  return v == 2 && !detail::stream_gemv_enabled() ? 0 : v;
}

bool chain_fits(int64_t M, int64_t Ka, int64_t D, int64_t F, int64_t N_next) {
  return detail::stream_gemv_fits(M, Ka, D) && detail::stream_gemv_fits(M, D, 2 * F, true) &&
         detail::stream_gemv_fits(M, F, D) && (N_next == 0 || detail::stream_gemv_fits(M, D, N_next));
}

// The tail as four stream GEMVs, each end fused:
//   x += a · w_outᵀ                          (Accumulate)
//   act = swiglu(gate_up · rms_norm(x) * g)   (norm in, SwiGLU out)
//   out = act · downᵀ, with next also x += out (Accumulate, y2 = out)
//   y_next = w_next · rms_norm(x) * g_next    (norm in)
void decode_tail_chain(const DecodeTail& t, Stream s) {
  using detail::StreamEpi;
  const bool next = t.n_next > 0;
  detail::StreamGemv o;
  o.x = t.a, o.M = t.M, o.K = t.Ka, o.ldx = t.Ka, o.w = t.w_out, o.wt = t.w_out_t, o.N = t.D;
  o.y = t.x, o.ldy = t.D, o.epi = StreamEpi::Accumulate, o.name = "stream_o";
  detail::stream_gemv(o, s);
  detail::StreamGemv gu;
  gu.x = t.x, gu.M = t.M, gu.K = t.D, gu.ldx = t.D, gu.w = t.gate_up, gu.wt = t.gate_up_t, gu.N = 2 * t.F;
  gu.y = t.act, gu.ldy = t.F, gu.epi = StreamEpi::SwiGLU, gu.norm = true, gu.g = t.g, gu.eps = t.eps;
  gu.name = "stream_gate_up";
  detail::stream_gemv(gu, s);
  detail::StreamGemv dn;
  dn.x = t.act, dn.M = t.M, dn.K = t.F, dn.ldx = t.F, dn.w = t.down, dn.wt = t.down_t, dn.N = t.D, dn.ldy = t.D;
  dn.name = "stream_down";
  if (next)
    dn.y = t.x, dn.epi = StreamEpi::Accumulate, dn.y2 = t.out;
  else
    dn.y = t.out;
  detail::stream_gemv(dn, s);
  if (!next) return;
  detail::StreamGemv nx;
  nx.x = t.x, nx.M = t.M, nx.K = t.D, nx.ldx = t.D, nx.w = t.w_next, nx.wt = t.w_next_t, nx.N = t.n_next;
  nx.y = t.y_next, nx.ldy = t.n_next, nx.norm = true, nx.g = t.g_next, nx.eps = t.eps, nx.name = "stream_next";
  detail::stream_gemv(nx, s);
}

}  // namespace

bool decode_tail_enabled(bool with_next) {
  static const bool next = [] {
    const char* e = std::getenv("AUGUR_CUDA_TAIL_NEXT");
    return e == nullptr || std::atoi(e) != 0;
  }();
  const int v = tail_variant();
  return v == 2 || (v == 1 && (!with_next || next));
}

bool decode_tail_fits(int64_t M, int64_t Ka, int64_t D, int64_t F, int64_t N_next) {
  if (tail_variant() == 2) return chain_fits(M, Ka, D, F, N_next);
  // Rows of 16-byte runs; whole 4-row tiles (gate/up: pairs of rows).
  if (M < 1 || M > 2 || Ka <= 0 || D <= 0 || F <= 0 || N_next < 0) return false;
  if (Ka % 8 != 0 || D % 8 != 0 || F % 8 != 0 || N_next % kR != 0) return false;
  const int64_t tiles = std::max({D / kR, F / 2, N_next / kR});
  if (tiles > Context::kTailCounters || std::max({Ka, D, F}) > (int64_t(1) << 24)) return false;
  return smem_bytes(kDefaultDepth, M, std::max({Ka, D, F})) <= size_t(max_smem());
}

void decode_tail(const DecodeTail& t, Stream s) {
  const bool next = t.n_next > 0;
  if (tail_variant() == 2) {
    if (!chain_fits(t.M, t.Ka, t.D, t.F, t.n_next))
      fail("[cuda] decode_tail: M ", t.M, ", K ", t.Ka, ", D ", t.D, ", F ", t.F, ", next ", t.n_next,
           " do not fit the stream chain");
    decode_tail_chain(t, s);
    return;
  }
  if (!decode_tail_fits(t.M, t.Ka, t.D, t.F, t.n_next))
    fail("[cuda] decode_tail: M ", t.M, ", K ", t.Ka, ", D ", t.D, ", F ", t.F, ", next ", t.n_next, " do not fit");
  const void* ptrs[] = {t.a, t.w_out, t.x, t.g, t.gate_up, t.down, t.o, t.act, t.out};
  for (const void* ptr : ptrs)
    if (ptr == nullptr || !aligned16(ptr)) fail("[cuda] decode_tail: every operand must be given, 16-byte aligned");
  if (next && (t.w_next == nullptr || t.g_next == nullptr || t.y_next == nullptr || !aligned16(t.w_next) ||
               !aligned16(t.g_next) || !aligned16(t.y_next)))
    fail("[cuda] decode_tail: the next projection needs w_next, g_next and y_next, 16-byte aligned");
  Context& c = context();
  TailArgs p;
  p.a = t.a, p.x = t.x, p.g = t.g, p.g_next = t.g_next;
  p.w[0] = t.w_out, p.w[1] = t.gate_up, p.w[2] = t.down, p.w[3] = t.w_next;
  p.K[0] = int(t.Ka), p.K[1] = int(t.D), p.K[2] = int(t.F), p.K[3] = int(t.D);
  p.tiles[0] = int(t.D / kR), p.tiles[1] = int(t.F / 2), p.tiles[2] = int(t.D / kR), p.tiles[3] = int(t.n_next / kR);
  // Split a stage where whole tiles would leave the busiest warps more than
  // AUGUR_CUDA_TAIL_SPLIT percent (default 10) over the mean.
  static const int64_t over = [] {
    const char* e = std::getenv("AUGUR_CUDA_TAIL_SPLIT");
    return e == nullptr ? 10 : std::atoll(e);
  }();
  const int n_warps = c.sm_count * kWarps;
  p.split = 0;
  for (int st = 0; st < kStages; ++st) {
    const int64_t T = p.tiles[st];
    if (T > 0 && ceil_div(T, int64_t(n_warps)) * n_warps * 100 > T * (100 + over)) p.split |= 1u << st;
  }
  p.f16 = (t.w_out_t == Half::F16 ? 1u : 0u) | (t.gate_up_t == Half::F16 ? 2u : 0u) |
          (t.down_t == Half::F16 ? 4u : 0u) | (next && t.w_next_t == Half::F16 ? 8u : 0u);
  p.o = t.o, p.act = t.act, p.out = t.out, p.y_next = t.y_next;
  p.partials = static_cast<float*>(c.tail_partials.get());
  p.counters = static_cast<int*>(c.tail_counters.get());
  p.bar = static_cast<unsigned*>(c.tail_barrier.get());
  p.M = int(t.M), p.D = int(t.D), p.F = int(t.F), p.N3 = int(t.n_next);
  p.k_max = int(std::max({t.Ka, t.D, t.F}));
  p.eps = t.eps;
  p.norm_threads = detail::add_rms_norm_threads(t.D);
  if (c.tail_partials.bytes() < size_t(2) * c.sm_count * kWarps * kR * 2 * sizeof(float))
    fail("[cuda] decode_tail: partial-sum scratch too small for ", c.sm_count, " SMs");
  const int depth = tail_depth(t.M, p.k_max);
  const size_t smem = smem_bytes(depth, t.M, p.k_max);
  Trace* trace = trace_buffers();
  p.trace = trace != nullptr ? static_cast<unsigned long long*>(trace->stamps.get()) : nullptr;
  p.trace_launch = trace != nullptr ? static_cast<unsigned*>(trace->launches.get()) : nullptr;
  auto kernel = trace != nullptr ? (t.M == 1 ? tail_kernel<1, true>(depth) : tail_kernel<2, true>(depth))
                                 : (t.M == 1 ? tail_kernel<1, false>(depth) : tail_kernel<2, false>(depth));
  static std::mutex mu;
  static std::set<TailKernel> configured;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (configured.insert(kernel).second)
      AUGUR_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem()));
  }
  // One block per SM, all resident: the grid barriers need every block running.
  launch("decode_tail_kernel", kernel, dim3(unsigned(c.sm_count)), dim3(kThreads), smem, s, p);
}

}  // namespace augur::cuda
