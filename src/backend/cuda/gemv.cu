// Skinny GEMM for decode and verify steps (M <= 8 rows of x; matmul_bf16
// sends M <= 8 here):
// y[m, n] = sum_k x[m, k] w[n, k]. Memory-bound: every weight is read once for
// all M rows.
//
// rows_kernel: a warp streams kRows = 4 weight rows; each load instruction
// reads 512 contiguous bytes of one row (lane l takes k = 8l..8l+7 of each
// 256-wide step), 8 loads of 16 bytes in flight per lane, so DRAM sees long
// runs of each row. Products on the FMA units in f32 (x exact), lanes reduced
// with shuffles at the end. (mma.m16n8k16's fragment layout would make each
// load touch 8 rows x 64 bytes, which streams far slower.) It takes the
// matrices too short to give every SM a stage's rows; the stream kernel below
// takes the rest.
//
// Split-K: short matrices (too few warps for 132 SMs) cut K into S ranges;
// each warp writes its partial tile to scratch and the last warp of a tile to
// arrive (a counter per tile) sums the S partials in order: one launch,
// deterministic, counters left at zero for the next launch or graph replay.
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/detail.h"

namespace augur::cuda {
namespace {

using detail::StreamEpi;
using detail::StreamGemv;

constexpr int kWarps = 4;             // warps per block: 4 row tiles sharing one K range (x hits L1)
constexpr int kChunk = 256;           // K granularity of a split (partial passes are predicated)

// Grid: S * ceil(n_tiles / kWarps) blocks of kWarps warps; block b takes K
// split b % S and row tiles (b / S) * kWarps + warp, so a block's warps read
// the same x (L1 hits). A tile is R consecutive rows; MR >= M rows of x.
// A pass reads U 256-wide k-steps of each of the R rows: U * R loads of 16
// bytes per lane in flight.
// x: [M, K] f32 (row stride ldx, 16-byte aligned rows); w: [N, K] bf16 or f16 (F16; K % 8 == 0);
// y: [M, N] f32 (row stride ldy); partials: [S, n_tiles, R * MR]; counters: [n_tiles]
template <int MR, int R, int U, bool F16>
__global__ void __launch_bounds__(kWarps * 32)
    rows_kernel(const float* __restrict__ x, int M, int K, int64_t ldx, const uint16_t* __restrict__ w, int N,
                float* __restrict__ y, int64_t ldy, int S, int kper, float* __restrict__ partials,
                int* __restrict__ counters) {
  constexpr int kPass = U * 256;  // k covered by one pass
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int split = int(blockIdx.x % unsigned(S));
  const int tile = int(blockIdx.x / unsigned(S)) * kWarps + warp;
  const int n_tiles = (N + R - 1) / R;
  if (tile >= n_tiles) {
    pdl_wait();
    return;
  }
  const int n0 = tile * R;
  const uint16_t* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wr[r] = w + int64_t(min(n0 + r, N - 1)) * K + lane * 8;
  const int k_begin = split * kper, k_end = min(K, k_begin + kper);
  // Weights depend on no earlier kernel: start pulling this warp's first
  // passes into L2 while the previous kernel finishes (see pdl_entry).
#pragma unroll
  for (int u = 0; u < 2 * U; ++u)
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (k_begin + u * 256 + lane * 8 < k_end)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(wr[r] + k_begin + u * 256));
  pdl_wait();
  pdl_launch_dependents();
  const float* xr = x + lane * 8;
  float acc[R][MR];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MR; ++m) acc[r][m] = 0.f;

  // Loads past k_end read nothing and give zeros; multiply skips them.
  auto load = [&](int k, uint4 (&wv)[U][R]) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r)
        wv[u][r] = k + u * 256 + lane * 8 < k_end ? ld_stream16(wr[r] + k + u * 256) : make_uint4(0, 0, 0, 0);
  };
  auto multiply = [&](int k, const uint4 (&wv)[U][R]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int kk = k + u * 256;
      if (kk + lane * 8 >= k_end) continue;
      float wf[R][8];
#pragma unroll
      for (int r = 0; r < R; ++r) unpack8<F16>(wv[u][r], wf[r]);
#pragma unroll
      for (int m = 0; m < MR; ++m) {
        if (m >= M) break;
        const float4 a = __ldg(reinterpret_cast<const float4*>(xr + m * ldx + kk));
        const float4 b = __ldg(reinterpret_cast<const float4*>(xr + m * ldx + kk + 4));
#pragma unroll
        for (int r = 0; r < R; ++r)
          acc[r][m] += a.x * wf[r][0] + a.y * wf[r][1] + a.z * wf[r][2] + a.w * wf[r][3] + b.x * wf[r][4] +
                       b.y * wf[r][5] + b.z * wf[r][6] + b.w * wf[r][7];
      }
    }
  };
  for (int k = k_begin; k < k_end; k += kPass) {
    uint4 wv[U][R];
    load(k, wv);
    multiply(k, wv);
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MR; ++m) acc[r][m] = warp_sum(acc[r][m]);

  // Lane r * MR + m owns output (r, m).
  const float mine = lane_element(acc, lane);
  const int r_l = lane / MR, m_l = lane % MR;
  const bool owner = lane < R * MR && m_l < M && n0 + r_l < N;
  if (S == 1) {
    if (owner) y[int64_t(m_l) * ldy + n0 + r_l] = mine;
    return;
  }
  constexpr int kTileElems = R * MR;
  if (lane < kTileElems) partials[(int64_t(split) * n_tiles + tile) * kTileElems + lane] = mine;
  __threadfence();
  __syncwarp();
  int arrived = 0;
  if (lane == 0) arrived = atomicAdd(&counters[tile], 1);
  arrived = __shfl_sync(0xffffffffu, arrived, 0);
  if (arrived != S - 1) return;
  __threadfence();
  if (owner) {
    float sum = 0.f;
    for (int s = 0; s < S; ++s) sum += __ldcg(partials + (int64_t(s) * n_tiles + tile) * kTileElems + lane);
    y[int64_t(m_l) * ldy + n0 + r_l] = sum;
  }
  if (lane == 0) counters[tile] = 0;
}

// stream_kernel: one block an SM streams its rows (every grid-th row)
// through a ring of shared-memory stages filled by bulk copies.
// Why: rows_kernel keeps ~4 KB in flight a warp, ~32 KB an SM on the short
// matrices, and each launch ramps up from empty. Here one producer thread
// keeps the ring in flight (160 KB an SM) and starts before the PDL wait
// (weights depend on no earlier kernel), so a matrix starts streaming while
// the kernels before it finish. Equal bytes a block: the blocks end
// together, no tail of half-empty SMs. Interleaved rows keep the SMs' reads
// at any moment within a few MB (as rows_kernel's).
// Stage i: step j = i / H, half h = i % H: the block's rows h * R.. of group
// g = j / n_chunks (GR = H * R rows: 4, or at MR = 5 8 with x in
// registers and 16 in the wide form), columns [c * kStreamK, +kStreamK) of
// chunk c = j % n_chunks (the last chunk may be short); one bulk copy a row,
// so every copy starts on a 4 KB boundary of its row (equal chunks of a
// runtime width streamed slower).
// Consumers (kStreamConsumers warps) take 8 columns a thread of every stage,
// for all its rows. Where x fits (M <= 2; M <= 5 when K <= 4096, the verify
// steps of 1 + 4 tokens) they hold their columns of x in registers for the
// whole kernel (an x load from L2 behind the stream costs more than a
// stage); else (verify steps of longer K or more rows) each stage reads its
// columns of x again from shared memory and a stage holds 8 rows, not 4, so
// that each x load serves twice the weights. At a group's end each warp sums
// its GR x MR outputs over its lanes (warp_sums: warp_sum's order, half the
// values handed on at each step) and one thread an output adds the warps' in
// fixed order (deterministic). Every output is the same
// arithmetic in the same order whatever M is (one fmaf chain a thread over
// its 8 columns of each chunk in order, the warp's butterfly, warps in
// order): a row of a verify
// step's product is bit-equal to the one-row decode step's. Each
// consumer thread releases a slot itself: racecheck sees no order between a
// warp's reads and the next bulk copy when only lane 0 arrives after a
// __syncwarp.
// Fused ends (StreamGemv, the decode step's block tail): NORM takes x as the
// residual stream and multiplies by rms_norm(x) * g, each block reducing all
// of x (it holds all of it); epi StreamEpi::Accumulate adds into y (the
// residual; its old values are loaded at the group's start, off the critical
// path) and optionally stores the product in y2 as well. SwiGLU takes a
// fused gate/up matrix (gate rows f < F = N / 2, then up rows F + f) with
// output columns f as its units: the block reads all its gate rows, keeping
// their sums in smem (stash), then its up rows in the same order, and stores
// silu(gate) * up: y[m, f]. That is the plain GEMV's read order (reading a
// unit's gate and up rows together, two regions of the matrix at once,
// streams slower).
// x: [M, K] f32 (row stride ldx, K <= MAXC * kStreamK); w: [N, K] half (K % 8
// == 0, 16-byte aligned); y: [M, N] f32 (row stride ldy; [M, N / 2] for
// SwiGLU); smem: slots x [R][kStreamK] half (R = stream_rows(x in registers)), then
// full[slots], empty[slots] mbarriers, then red[2][consumers][GR * MR], then
// (NORM) the norm's [consumers][MR] and (SwiGLU) stash[units a block][MR].
constexpr int kStreamRows = 4;      // rows a stage, x in registers
constexpr int kStreamRowsWide = 8;  // rows a stage, x in smem (each x load serves more weights; 4 measured slower)
constexpr int stream_rows(bool x_in_registers) { return x_in_registers ? kStreamRows : kStreamRowsWide; }
// Rows a group (the outputs a thread accumulates at once). At MR = 5 (a
// verify step of 1 + 4 tokens) a group takes two stages' rows:
// - the wide form 16 (80 accumulators), so that each chunk of x staged from
//   L2 serves 16 rows, not 8: with 8, the down projection (K = 12288)
//   restaged 40 KB of x for every 32 KB stage of weights and streamed at
//   82% of the one-row speed;
// - the register form 8 (40 accumulators beside x's 80 registers), so that
//   a group's end (the warps' sums, a barrier, the fused end; latency the
//   two consumer warps a scheduler cannot hide) comes every four stages at
//   K = 4096, not every two: with the weights' copies left out (the
//   consumers' own speed, which the H200's copy speed exposes), Qwen3-8B's
//   gate/up took 51.9 us, not 58.4, and q/k/v 14.7, not 16.1 (H100).
// (At MR = 4, batch-4 decode measured 1% slower with 16.)
constexpr int stream_group_rows(bool x_in_registers, int MR) {
  if (MR != 5) return stream_rows(x_in_registers);
  return x_in_registers ? 2 * kStreamRows : 2 * kStreamRowsWide;
}
// Whether a thread's columns of x (MR rows of `chunks` stages) stay in
// registers: 8 floats a row a chunk, at most 16 row-chunks.
constexpr bool stream_x_in_registers(int MR, int64_t chunks) { return MR <= 2 || (MR <= 5 && chunks <= 2); }
constexpr int kStreamConsumers = 8;
constexpr int kStreamThreads = (kStreamConsumers + 1) * 32;
constexpr int kStreamK = kStreamConsumers * 32 * 8;  // 2048 columns: 8 a consumer thread
constexpr int kStreamMaxChunks = 9;                  // K <= 18432
constexpr int kStreamMaxSmem = 227 * 1024;           // a block's dynamic shared memory on sm_90
constexpr size_t kStreamXResident = 112 * 1024;      // M > 2: x staged whole up to this size

template <int MR>
constexpr size_t stream_header_bytes(int group_rows, int slots, int stash_units = 0) {
  return size_t(2 * slots) * sizeof(uint64_t) + size_t(2 * kStreamConsumers * group_rows * MR) * sizeof(float) +
         size_t(kStreamConsumers * MR + stash_units * MR) * sizeof(float);
}
constexpr size_t stream_stage_bytes(int rows) { return size_t(rows) * kStreamK * sizeof(uint16_t); }

// A thread's 8 columns of one row of x against one weight row, added into
// its running sum: every path of the stream kernel sums through here, so all
// round the same way (explicit fmaf, one chain: 8 instructions a row, where
// a separate sum of 8 and an add took 9 and a verify step's 5 rows are bound
// by the instructions issued on the H200).
__device__ __forceinline__ void dot8_into(float& acc, const float (&x)[8], const float (&w)[8]) {
#pragma unroll
  for (int e = 0; e < 8; ++e) acc = fmaf(x[e], w[e], acc);
}

// Sums each of N values over the warp (N a power of two, at most 32) in
// warp_sum's order, so each sum is bit-equal to warp_sum's: at the step of
// offset o a lane keeps half its values and takes its partner's partial
// sums of them (the partner keeps the other half), so the first log2(N)
// steps shuffle N - 1 values in all instead of 5 N; the rest is warp_sum's
// tail on the one value left. Lane l ends with value l / (32 / N).
// (A step a template level, so that every index is a constant and v stays
// in registers: as a loop, ptxas kept v in local memory.)
template <int H, int O, int N>
__device__ __forceinline__ void warp_sums_step(float (&v)[N], int lane) {
  if constexpr (H >= 1) {
    const bool upper = (lane & O) != 0;
#pragma unroll
    for (int i = 0; i < H; ++i) {
      const float send = upper ? v[i] : v[i + H];
      const float keep = upper ? v[i + H] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
    }
    warp_sums_step<H / 2, O / 2>(v, lane);
  }
}
template <int N>
__device__ __forceinline__ float warp_sums(float (&v)[N], int lane) {
  static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0, "warp_sums: N a power of two up to 32");
  warp_sums_step<N / 2, 16>(v, lane);
  float sum = v[0];
#pragma unroll
  for (int o = 16 / N; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  return sum;
}

constexpr int pow2_at_most(int v) { return v >= 32 ? 32 : v >= 16 ? 16 : v >= 8 ? 8 : v >= 4 ? 4 : v >= 2 ? 2 : 1; }

// A group's end: each of a warp's V = R * MR sums (o = r * MR + m) over its
// lanes, by warp_sums in power-of-two parts from the largest down (20 = 16 +
// 4: 22 shuffles, where one part padded to 32 took 31), into rg[warp * V + o].
template <int O0, int V, int R, int MR>
__device__ __forceinline__ void group_warp_sums(const float (&acc)[R][MR], float* rg, int warp, int lane) {
  if constexpr (O0 < V) {
    constexpr int P = pow2_at_most(V - O0), per = 32 / P;
    float v[P];
#pragma unroll
    for (int i = 0; i < P; ++i) v[i] = acc[(O0 + i) / MR][(O0 + i) % MR];
    const float sum = warp_sums<P>(v, lane);
    if (lane % per == 0) rg[warp * V + O0 + lane / per] = sum;
    group_warp_sums<O0 + P, V, R, MR>(acc, rg, warp, lane);
  }
}

// The fused ends are template parameters and plain arguments, not a struct
// of runtime choices: that form made the plain GEMV measurably slower.
// release_at_once is always true; it stays a run-time argument because with
// the choice compiled in (or the branch removed) ptxas schedules the consumer
// loop so that the K <= 4096 instantiations stream 10-18% slower. Either
// branch is correct.
template <int MR, int MAXC, bool F16, StreamEpi EPI, bool NORM>
__global__ void __launch_bounds__(kStreamThreads, 1)
    stream_kernel(const float* __restrict__ x, int M, int K, int64_t ldx, const uint16_t* __restrict__ w, int N,
                  float* __restrict__ y, int64_t ldy, int slots, bool release_at_once,
                  const float* __restrict__ g_norm, float eps, float* __restrict__ y2, int xbufs) {
  constexpr bool swiglu = EPI == StreamEpi::SwiGLU;
  extern __shared__ __align__(128) unsigned char smem[];
  // MAXC: the most chunks of K; 1 means x is read from shared memory each
  // stage (run_stream's choice, stream_x_in_registers), more that it is held
  // in registers.
  constexpr bool kXReg = MAXC > 1;
  // R rows a stage, GR = H * R rows a group.
  constexpr int R = stream_rows(kXReg), GR = stream_group_rows(kXReg, MR), H = GR / R, KC = kStreamK;
  uint16_t* ring = reinterpret_cast<uint16_t*>(smem);
  // M > 2: x (and the norm's gain) staged by each consumer thread for its
  // own columns, xbufs chunks: [xbufs][M][KC] f32, then (NORM) [xbufs][KC].
  float* xs = reinterpret_cast<float*>(smem + size_t(slots) * R * KC * sizeof(uint16_t));
  float* gs = xs + size_t(xbufs) * M * KC;
  uint64_t* full = reinterpret_cast<uint64_t*>(gs + (NORM ? size_t(xbufs) * KC : 0));
  uint64_t* empty = full + slots;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // This block's units: u(i) = blk + G * i, i < n_units: rows, or for
  // SwiGLU output columns. Group g (R units' rows) of phase p = g / n_phase
  // (SwiGLU: 0 gate rows, 1 up rows) covers units q = g % n_phase.
  const int G = int(gridDim.x), blk = int(blockIdx.x);
  const int F = N / 2, units = swiglu ? F : N;
  const int n_units = (units - blk + G - 1) / G;
  auto unit_of = [&](int i) { return int64_t(blk) + int64_t(G) * i; };
  const int n_phase = (n_units + GR - 1) / GR;
  const int n_chunks = (K + KC - 1) / KC;
  const int n_groups = swiglu ? 2 * n_phase : n_phase;
  const int n_steps = n_groups * n_chunks;  // (group, chunk) steps, H stages each
  auto group_unit = [&](int g) { return (swiglu && g >= n_phase ? g - n_phase : g) * GR; };  // its first unit
  auto row_of = [&](int g, int r) {
    const int64_t row = unit_of(group_unit(g) + r);
    return swiglu && g >= n_phase ? F + row : row;
  };
  if (threadIdx.x == 0) {
    for (int i = 0; i < slots; ++i) mbar_init(&full[i], 1), mbar_init(&empty[i], kStreamConsumers * 32);
    mbar_init_fence();
  }
  __syncthreads();

  if (warp == kStreamConsumers) {  // the producer: weights only, so no PDL wait
    if (lane != 0) return;
    // Stage i: step j = i / H, its rows h * R.. of the group (none past a
    // short group's end: the stage then only completes its phase).
    for (int i = 0; i < n_steps * H; ++i) {
      const int slot = i % slots;
      if (i >= slots) mbar_wait(&empty[slot], uint32_t(i / slots - 1) & 1u);
      const int j = i / H, h = i % H, g = j / n_chunks, k0 = j % n_chunks * KC;
      const int rows = max(0, min(R, n_units - group_unit(g) - h * R)), len = min(KC, K - k0);
      mbar_arrive_expect_tx(&full[slot], uint32_t(rows * len) * 2u);
      for (int r = 0; r < rows; ++r)
        bulk_copy_g2s(ring + (size_t(slot) * R + r) * KC, w + row_of(g, h * R + r) * K + k0, uint32_t(len) * 2u,
                      &full[slot]);
    }
    return;
  }

  pdl_wait();
  pdl_launch_dependents();
  const int kt = threadIdx.x * 8;  // this thread's columns of a chunk
  float* red = reinterpret_cast<float*>(empty + slots);
  // This thread's 8 columns of chunk c of row m of x (zeros past K).
  auto load_x = [&](int c, int m, float (&v)[8]) {
    const int k = c * KC + kt;
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
    if (m < M && k < K) {
      a = __ldg(reinterpret_cast<const float4*>(x + m * ldx + k));
      b = __ldg(reinterpret_cast<const float4*>(x + m * ldx + k + 4));
    }
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  };
  float xr[kXReg ? MAXC : 1][MR][8];
  if constexpr (kXReg) {
#pragma unroll
    for (int c = 0; c < MAXC; ++c)
#pragma unroll
      for (int m = 0; m < MR; ++m) load_x(c, m, xr[c][m]);
  }
  // The wide form's staging: step j's chunk j % n_chunks of x into buffer
  // b, by cp.async (a load's latency would stall every stage). Resident
  // (xbufs == n_chunks): every chunk once, at the start; else two buffers,
  // the next step's chunk copied while this one's is used.
  const bool resident = xbufs >= n_chunks;
  auto stage_x = [&](int j) {
    const int c = j % n_chunks, b = resident ? c : (j & 1), k = c * KC + kt;
    const bool ok = k < K;
    for (int m = 0; m < M; ++m) {
      float* d = xs + (size_t(b) * M + m) * KC + kt;
      const float* src = x + m * ldx + (ok ? k : 0);
      cp_async16(d, src, ok);
      cp_async16(d + 4, src + 4, ok);
    }
    if constexpr (NORM) {
      const float* src = g_norm + (ok ? k : 0);
      cp_async16(gs + size_t(b) * KC + kt, src, ok);
      cp_async16(gs + size_t(b) * KC + kt + 4, src + 4, ok);
    }
    cp_async_commit();
  };
  if constexpr (!kXReg) {
    if (resident)
      for (int c = 0; c < n_chunks; ++c) stage_x(c);
    else
      stage_x(0);
  }
  float inv[MR];  // NORM: 1 / rms of each row of x
  if constexpr (NORM && !kXReg) {
    // As below, the squares summed in the same order (chunks, then columns;
    // the register form's zeros past K add nothing). A chunk's loads for
    // every row are issued together.
    float* rn = red + 2 * kStreamConsumers * GR * MR;
    float ss[MR];
#pragma unroll
    for (int m = 0; m < MR; ++m) ss[m] = 0.f;
    if (resident) cp_async_wait<0>();  // then x is read from shared memory
    for (int c = 0; c < n_chunks; ++c) {
      float v[MR][8];
#pragma unroll
      for (int m = 0; m < MR; ++m) {
        const int k = c * KC + kt;
        if (resident && m < M && k < K) {
          const float* p = xs + (size_t(c) * M + m) * KC + kt;
          const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
          v[m][0] = a.x, v[m][1] = a.y, v[m][2] = a.z, v[m][3] = a.w;
          v[m][4] = b.x, v[m][5] = b.y, v[m][6] = b.z, v[m][7] = b.w;
        } else {
          load_x(c, m, v[m]);
        }
      }
#pragma unroll
      for (int m = 0; m < MR; ++m)
#pragma unroll
        for (int e = 0; e < 8; ++e) ss[m] += v[m][e] * v[m][e];
    }
#pragma unroll
    for (int m = 0; m < MR; ++m) {
      const float t = warp_sum(ss[m]);
      if (lane == 0) rn[warp * MR + m] = t;
    }
    asm volatile("bar.sync 1, %0;" ::"n"(kStreamConsumers * 32) : "memory");
#pragma unroll
    for (int m = 0; m < MR; ++m) {
      float ss = 0.f;
      for (int q = 0; q < kStreamConsumers; ++q) ss += rn[q * MR + m];
      inv[m] = 1.0f / sqrtf(ss / float(K) + eps);
    }
  }
  if constexpr (NORM && kXReg) {
    // x * rsqrt(mean(x^2) + eps) * g, the sum of squares over all of x: warp
    // sums, then the warps' in order.
    float* rn = red + 2 * kStreamConsumers * GR * MR;
#pragma unroll
    for (int m = 0; m < MR; ++m) {
      float ss = 0.f;
#pragma unroll
      for (int c = 0; c < MAXC; ++c)
#pragma unroll
        for (int e = 0; e < 8; ++e) ss += xr[c][m][e] * xr[c][m][e];
      ss = warp_sum(ss);
      if (lane == 0) rn[warp * MR + m] = ss;
    }
    asm volatile("bar.sync 1, %0;" ::"n"(kStreamConsumers * 32) : "memory");
#pragma unroll
    for (int m = 0; m < MR; ++m) {
      float ss = 0.f;
      for (int q = 0; q < kStreamConsumers; ++q) ss += rn[q * MR + m];
      inv[m] = 1.0f / sqrtf(ss / float(K) + eps);
    }
#pragma unroll
    for (int c = 0; c < MAXC; ++c) {
      const int k = c * KC + kt;
      if (k >= K) continue;
      const float4 g0 = __ldg(reinterpret_cast<const float4*>(g_norm + k));
      const float4 g1 = __ldg(reinterpret_cast<const float4*>(g_norm + k + 4));
      const float gv[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
#pragma unroll
      for (int m = 0; m < MR; ++m)
#pragma unroll
        for (int e = 0; e < 8; ++e) xr[c][m][e] = gv[e] * (xr[c][m][e] * inv[m]);
    }
  }
  float* stash = red + 2 * kStreamConsumers * GR * MR + kStreamConsumers * MR;  // SwiGLU: [n_units][MR]
  int slot = 0;
  uint32_t phase = 0;
  for (int g = 0; g < n_groups; ++g) {
    const int u0 = group_unit(g), rows = min(GR, n_units - u0);
    // Output o = r * MR + m of the group (GR * MR <= 80) is added up by
    // consumer thread (warp o % 8, lane o / 8): spread over the warps, so that
    // no warp lags the others by the group's sums (a slot is freed by its
    // slowest warp, and a verify step's 5 rows leave little time to spare).
    const int o_mine = lane * kStreamConsumers + warp, r_mine = o_mine / MR, m_mine = o_mine % MR;
    const bool out_mine = o_mine < GR * MR && r_mine < rows && m_mine < M;
    // Accumulate: y's value before this kernel, loaded early, off the
    // critical path: into a register, or in the wide form with two stages a
    // group (H > 1, where that register made ptxas spill in the loop) by cp.async into
    // old_s[o_mine], in the commit group of the group's first step's x.
    constexpr bool kOldInSmem = EPI == StreamEpi::Accumulate && H > 1 && !kXReg;
    float* old_s = stash;  // kOldInSmem: [GR * MR]
    float old = 0.f;
    if constexpr (EPI == StreamEpi::Accumulate && !kOldInSmem)
      if (out_mine) old = y[int64_t(m_mine) * ldy + unit_of(u0 + r_mine)];
    float acc[GR][MR];
#pragma unroll
    for (int r = 0; r < GR; ++r)
#pragma unroll
      for (int m = 0; m < MR; ++m) acc[r][m] = 0.f;
    // Each thread releases its own reads, at once (run_stream always says
    // so) or after its warp's; see release_at_once above.
    auto release = [&] {
      if (release_at_once) {
        mbar_arrive(&empty[slot]);
      } else {
        __syncwarp();
        mbar_arrive(&empty[slot]);
      }
      if (++slot == slots) slot = 0, phase ^= 1u;
    };
    if constexpr (kXReg) {
#pragma unroll
      for (int c = 0; c < MAXC; ++c) {
        if (c >= n_chunks) break;
#pragma unroll
        for (int h = 0; h < H; ++h) {
          mbar_wait(&full[slot], phase);
          if (c * KC + kt < K && h * R < rows) {
            const uint16_t* st = ring + size_t(slot) * R * KC + kt;
            float wf[R][8];
#pragma unroll
            for (int r = 0; r < R; ++r) unpack8<F16>(*reinterpret_cast<const uint4*>(st + r * KC), wf[r]);
#pragma unroll
            for (int m = 0; m < MR; ++m) {
              // run_stream gives MR = 5 only M = 5 (and MR <= 2 only M = MR),
              // so a verify step's rows of products run without a branch
              // between them (rows past M would only add zeros' products,
              // never stored).
              if (MR != 5 && MR > 2 && m >= M) break;
#pragma unroll
              for (int r = 0; r < R; ++r) dot8_into(acc[h * R + r][m], xr[c][m], wf[r]);
            }
          }
          release();
        }
      }
    } else {
      for (int c = 0; c < n_chunks; ++c) {
        const int j = g * n_chunks + c, k = c * KC + kt, b = resident ? c : (j & 1);
        if constexpr (kOldInSmem) {
          if (c == 0) {
            if (out_mine) cp_async4(old_s + o_mine, y + int64_t(m_mine) * ldy + unit_of(u0 + r_mine));
            if (resident) cp_async_commit();
          }
        }
        if (!resident) {
          if (j + 1 < n_steps)
            stage_x(j + 1);
          else
            cp_async_commit();  // an empty group keeps the count
          cp_async_wait<1>();
        } else if (j == 0) {
          cp_async_wait<0>();
        }
        auto from_smem = [](const float* p, float (&v)[8]) {
          const float4 a = *reinterpret_cast<const float4*>(p), bb = *reinterpret_cast<const float4*>(p + 4);
          v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = bb.x, v[5] = bb.y, v[6] = bb.z, v[7] = bb.w;
        };
        float gv[8];
        if constexpr (NORM)
          if (k < K) from_smem(gs + size_t(b) * KC + kt, gv);
        // The step's H stages, rows h * R.. of the group.
#pragma unroll
        for (int h = 0; h < H; ++h) {
          mbar_wait(&full[slot], phase);
          if (k < K && h * R < rows) {
            const uint16_t* st = ring + size_t(slot) * R * KC + kt;
            // Q rows of weights held at once: half the stage's where the
            // norm's gain and scales (13 registers) beside 80 accumulators
            // would make ptxas spill; x is then read twice a stage.
            constexpr int Q = H > 1 && (NORM || EPI == StreamEpi::Accumulate) ? R / 2 : R;
#pragma unroll
            for (int q0 = 0; q0 < R; q0 += Q) {
              float wf[Q][8];
#pragma unroll
              for (int r = 0; r < Q; ++r) unpack8<F16>(*reinterpret_cast<const uint4*>(st + (q0 + r) * KC), wf[r]);
#pragma unroll
              for (int m = 0; m < MR; ++m) {
                if (m >= M) break;
                float xv[8];
                from_smem(xs + (size_t(b) * M + m) * KC + kt, xv);
                if constexpr (NORM)
#pragma unroll
                  for (int e = 0; e < 8; ++e) xv[e] = gv[e] * (xv[e] * inv[m]);
#pragma unroll
                for (int r = 0; r < Q; ++r) dot8_into(acc[h * R + q0 + r][m], xv, wf[r]);
              }
            }
          }
          release();
        }
      }
    }
    // The group's end: warp sums, then each output's thread adds the warps'
    // in order. red alternates between two halves, so a half is rewritten
    // only after the next barrier, which every thread reaches after reading
    // it.
    float* rg = red + (g & 1) * kStreamConsumers * GR * MR;
    group_warp_sums<0, GR * MR, GR, MR>(acc, rg, warp, lane);
    asm volatile("bar.sync 1, %0;" ::"n"(kStreamConsumers * 32) : "memory");
    if (out_mine) {
      float sum = 0.f;
      for (int q = 0; q < kStreamConsumers; ++q) sum += rg[q * GR * MR + o_mine];
      const int64_t at = int64_t(m_mine) * ldy + unit_of(u0 + r_mine);
      if constexpr (swiglu) {  // the same thread (r, m) stashes the gate and later reads it
        float& gate = stash[(u0 + r_mine) * MR + m_mine];
        if (g < n_phase)
          gate = sum;
        else
          y[at] = silu_mul(gate, sum);
      } else if constexpr (EPI == StreamEpi::Accumulate) {
        if constexpr (kOldInSmem) {
          // Its commit group is complete: resident, the only one since; else
          // an older one than the last step's (n_chunks > 2 without resident x).
          if (resident)
            cp_async_wait<0>();
          else
            cp_async_wait<1>();
          old = old_s[o_mine];
        }
        y[at] = old + sum;
        if (y2 != nullptr) y2[at] = sum;
      } else {
        y[at] = sum;
      }
    }
  }
}

// Any shape: one warp per (column n, group of 16 rows of x). Odd K, unaligned
// x or w, and shapes cuBLASLt refuses.
template <bool F16>
__global__ void generic_matmul_kernel(const float* __restrict__ x, int64_t M, int64_t K, int64_t ldx,
                                      const uint16_t* __restrict__ w, int64_t N, float* __restrict__ y,
                                      int64_t ldy) {
  const int lane = threadIdx.x & 31;
  const int64_t n = int64_t(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  const int64_t m0 = int64_t(blockIdx.y) * 16;
  if (n >= N) return;
  const uint16_t* wr = w + n * K;
  float acc[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) acc[i] = 0.f;
  for (int64_t k = lane; k < K; k += 32) {
    const float wv = half_to_f32<F16>(wr[k]);
#pragma unroll
    for (int i = 0; i < 16; ++i)
      if (m0 + i < M) acc[i] += x[(m0 + i) * ldx + k] * wv;
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const float v = warp_sum(acc[i]);
    if (lane == 0 && m0 + i < M) y[(m0 + i) * ldy + n] = v;
  }
}

struct SkinnyPlan {
  int S = 1;
  int kper = 0;
};

// Warp tiles an SM below which plan_skinny splits K.
constexpr int kSplitBelow = 4;

// The stream kernel for M <= 8 (MR = 1, 2, 4, 5 or 8) and K <= kStreamMaxChunks
// stages' columns: as many stages as the ring holds.
struct StreamLaunch {
  const StreamGemv& q;
  int slots, grid;
  int stash_units;  // SwiGLU: the most units (output columns) a block takes
  int xbufs;        // M > 2: chunks of x staged in shared memory (0: x in registers)
};

// M > 2: the bytes of x (and the norm's gain) staged in shared memory.
size_t stream_x_bytes(const StreamGemv& q, int xbufs) {
  return size_t(xbufs) * size_t(q.M + (q.norm ? 1 : 0)) * kStreamK * sizeof(float);
}

template <int MR, int MAXC, bool F16, StreamEpi EPI, bool NORM>
void launch_stream(const StreamLaunch& l, Stream s) {
  constexpr int rows = stream_rows(MAXC > 1);
  const size_t smem = size_t(l.slots) * stream_stage_bytes(rows) + stream_x_bytes(l.q, l.xbufs) +
                     stream_header_bytes<MR>(stream_group_rows(MAXC > 1, MR), l.slots, l.stash_units);
  auto kernel = stream_kernel<MR, MAXC, F16, EPI, NORM>;
  static size_t granted = 0;  // per instantiation: the dynamic smem the attribute allows
  if (smem > granted) {
    AUGUR_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    granted = smem;
  }
  const StreamGemv& q = l.q;
  launch(q.name, kernel, dim3(unsigned(l.grid)), dim3(kStreamThreads), smem, s, q.x, int(q.M), int(q.K),
         q.ldx, reinterpret_cast<const uint16_t*>(q.w), int(q.N), q.y, q.ldy, l.slots, true, q.g, q.eps, q.y2,
         l.xbufs);
}

template <int MR, bool F16, StreamEpi EPI, bool NORM>
void launch_stream(const StreamLaunch& l, Stream s) {
  const int64_t chunks = ceil_div(l.q.K, int64_t(kStreamK));
  if constexpr (MR > 2) {  // x in registers up to two chunks (stream_x_in_registers), else in smem for every K
    if constexpr (stream_x_in_registers(MR, 2)) {
      if (l.xbufs == 0) return launch_stream<MR, 2, F16, EPI, NORM>(l, s);
    }
    launch_stream<MR, 1, F16, EPI, NORM>(l, s);
  } else if (chunks <= 2)
    launch_stream<MR, 2, F16, EPI, NORM>(l, s);
  else if (chunks <= 3)
    launch_stream<MR, 3, F16, EPI, NORM>(l, s);
  else if (chunks <= 6)
    launch_stream<MR, 6, F16, EPI, NORM>(l, s);
  else
    launch_stream<MR, kStreamMaxChunks, F16, EPI, NORM>(l, s);
}

// The combinations the engine uses: plain, Accumulate (o, down), norm +
// SwiGLU (gate/up), norm + Store (the next projection).
template <int MR, bool F16>
void launch_stream(const StreamLaunch& l, Stream s) {
  const StreamGemv& q = l.q;
  if (q.epi == StreamEpi::SwiGLU && q.norm)
    launch_stream<MR, F16, StreamEpi::SwiGLU, true>(l, s);
  else if (q.epi == StreamEpi::Store && q.norm)
    launch_stream<MR, F16, StreamEpi::Store, true>(l, s);
  else if (q.epi == StreamEpi::Accumulate && !q.norm)
    launch_stream<MR, F16, StreamEpi::Accumulate, false>(l, s);
  else if (q.epi == StreamEpi::Store && !q.norm)
    launch_stream<MR, F16, StreamEpi::Store, false>(l, s);
  else
    fail("[cuda] stream GEMV: this combination of norm and output is not built");
}

template <int MR>
void run_stream(const StreamGemv& q, Stream s, int sm_count) {
  const int64_t chunks = ceil_div(q.K, int64_t(kStreamK));
  const bool x_reg = stream_x_in_registers(MR, chunks);
  const int rows = stream_rows(x_reg);
  const size_t stage = stream_stage_bytes(rows);
  const bool swiglu = q.epi == StreamEpi::SwiGLU;
  const int64_t units = swiglu ? q.N / 2 : q.N;
  const int grid = int(std::min<int64_t>(sm_count, units));
  // SwiGLU: the gate sums of a block's units; Accumulate with two stages a
  // group: the old values of y (old_s).
  const int group_rows = stream_group_rows(x_reg, MR);
  const int stash = swiglu                                                  ? int(ceil_div(units, int64_t(grid)))
                    : q.epi == StreamEpi::Accumulate && group_rows > rows ? group_rows
                                                                            : 0;
  // x not in registers: resident in shared memory where it fits in
  // kStreamXResident, else two chunks of it in turn.
  int xbufs = 0;
  if (!x_reg) xbufs = stream_x_bytes(q, int(chunks)) <= kStreamXResident ? int(chunks) : 2;
  // The ring gives way to a large stash (few SMs, wide SwiGLU) and to x.
  const size_t header = stream_header_bytes<MR>(group_rows, 16, stash) + stream_x_bytes(q, xbufs);
  const int ring_kb = std::clamp(q.ring_kb, 32, 224);
  const int slots = std::min(std::max(2, int(size_t(ring_kb) * 1024 / stage)),
                             int((size_t(kStreamMaxSmem) - std::min(header, size_t(kStreamMaxSmem))) / stage));
  if (slots < 2)
    fail("[cuda] stream GEMV: M ", q.M, ", K ", q.K, ", N ", q.N, " on ", grid, " SMs needs too much shared memory");
  const StreamLaunch l{q, slots, grid, stash, xbufs};
  q.wt == Half::F16 ? launch_stream<MR, true>(l, s) : launch_stream<MR, false>(l, s);
}

// Checks and launches one stream GEMV (StreamGemv in detail.h).
void run_stream(const StreamGemv& q, Stream s, int sm_count) {
  const bool swiglu = q.epi == StreamEpi::SwiGLU;
  if (!detail::stream_gemv_fits(q.M, q.K, q.N, swiglu) || q.ldx % 4 != 0 || !aligned16(q.x) || !aligned16(q.w) ||
      (q.norm && (q.g == nullptr || !aligned16(q.g))))
    fail("[cuda] stream GEMV: M ", q.M, ", K ", q.K, ", N ", q.N, ", ldx ", q.ldx,
         " (M <= 8, K % 8 == 0 up to 18432, 16-byte aligned x, w and gain; SwiGLU: N % 2 == 0)");
  if (q.M == 1)
    run_stream<1>(q, s, sm_count);
  else if (q.M == 2)
    run_stream<2>(q, s, sm_count);
  else if (q.M <= 4)
    run_stream<4>(q, s, sm_count);
  else if (q.M == 5)
    run_stream<5>(q, s, sm_count);
  else
    run_stream<8>(q, s, sm_count);
}

// rows: weight rows per warp tile; tile_floats: partial floats per tile.
SkinnyPlan plan_skinny(int64_t K, int64_t N, int64_t rows, int64_t tile_floats, int sm_count, int splits) {
  const int64_t n_tiles = ceil_div(N, rows);
  const int64_t per_chunk = ceil_div(K, kChunk);  // chunks of K
  int64_t want = splits;
  if (want <= 0) {
    // No split once every SM has kSplitBelow warps' tiles: splitting pays
    // only for matrices too short to spread over the SMs (then ~16 warps
    // an SM; cuda_bench --skinny-sweep).
    want = n_tiles >= int64_t(sm_count) * kSplitBelow ? 1 : ceil_div(int64_t(sm_count) * 16, n_tiles);
  }
  want = std::clamp<int64_t>(want, 1, per_chunk);
  int64_t kper = ceil_div(per_chunk, want) * kChunk;
  int64_t S = ceil_div(K, kper);
  // Scratch bounds: partials for S x n_tiles tiles, one counter per tile.
  const int64_t max_tiles = int64_t(Context::kSplitKPartialBytes / (tile_floats * sizeof(float)));
  while (S > 1 && (S * n_tiles > max_tiles || n_tiles > Context::kSplitKCounters)) {
    kper *= 2;
    S = ceil_div(K, kper);
  }
  if (S <= 1) return {1, int(K)};
  return {int(S), int(kper)};
}

constexpr int kRows = 4;  // weight rows per warp (the best of 1, 2 and 4 on the H200)
constexpr int kSteps = 2;  // 256-wide k-steps a pass: 8 loads of 16 bytes in flight a lane

}  // namespace

namespace detail {

int skinny_splits(int64_t M, int64_t K, int64_t N) {
  if (M > kSkinnyMaxM || K % 8 != 0) return 0;
  return plan_skinny(K, N, kRows, kRows * 8, context().sm_count, 0).S;
}

bool stream_gemv_fits(int64_t M, int64_t K, int64_t N, bool swiglu) {
  return M >= 1 && M <= kSkinnyMaxM && K > 0 && K % 8 == 0 && K <= int64_t(kStreamMaxChunks) * kStreamK && N > 0 &&
         N < (int64_t(1) << 30) && (!swiglu || (N % 2 == 0 && N / 2 <= 65536));
}

void stream_gemv(const StreamGemv& q, Stream s) {
  if (q.M <= 0 || q.N <= 0) return;
  run_stream(q, s, context().sm_count);
}

void skinny_matmul(const float* x, int64_t M, int64_t K, int64_t ldx, const half_bits* w, int64_t N,
                   float* y, int64_t ldy, Stream s, int splits, Half wt) {
  Context& c = context();
  const bool fast = M >= 1 && M <= kSkinnyMaxM && K % 8 == 0 && ldx % 4 == 0 && aligned16(x) &&
                    aligned16(w) && K < (int64_t(1) << 31) && N < (int64_t(1) << 31);
  if (!fast) {
    generic_matmul(x, M, K, ldx, w, N, y, ldy, s, wt);
    return;
  }
  // The stream kernel where each SM gets a stage's rows (it is faster than
  // rows_kernel inside the decode step), whatever M is, so that the rows of
  // a verify step take the kernel a decode step does; a chosen split (tests,
  // sweeps) asks for rows_kernel.
  if (splits == 0 && stream_gemv_fits(M, K, N) && N >= int64_t(c.sm_count) * kStreamRows) {
    StreamGemv q;
    q.x = x, q.M = M, q.K = K, q.ldx = ldx, q.w = w, q.wt = wt, q.N = N, q.y = y, q.ldy = ldy;
    run_stream(q, s, c.sm_count);
    return;
  }
  const SkinnyPlan p = plan_skinny(K, N, kRows, kRows * 8, c.sm_count, splits);
  const unsigned blocks = unsigned(p.S * ceil_div(ceil_div(N, kRows), kWarps));
  float* partials = static_cast<float*>(c.splitk_partials.get());
  int* counters = static_cast<int*>(c.splitk_counters.get());
  const bool f16 = wt == Half::F16;
  auto kernel = M <= 1   ? (f16 ? rows_kernel<1, kRows, kSteps, true> : rows_kernel<1, kRows, kSteps, false>)
                : M <= 2 ? (f16 ? rows_kernel<2, kRows, kSteps, true> : rows_kernel<2, kRows, kSteps, false>)
                : M <= 4 ? (f16 ? rows_kernel<4, kRows, kSteps, true> : rows_kernel<4, kRows, kSteps, false>)
                         : (f16 ? rows_kernel<8, kRows, kSteps, true> : rows_kernel<8, kRows, kSteps, false>);
  launch("rows_kernel", kernel, dim3(blocks), dim3(kWarps * 32), 0, s, x, int(M), int(K), ldx, w, int(N), y, ldy, p.S,
         p.kper, partials, counters);
}

void generic_matmul(const float* x, int64_t M, int64_t K, int64_t ldx, const half_bits* w, int64_t N,
                    float* y, int64_t ldy, Stream s, Half wt) {
  constexpr int kWarpsPerBlock = 8;
  const dim3 grid(unsigned(ceil_div(N, kWarpsPerBlock)), unsigned(ceil_div(M, 16)));
  if (grid.y > 65535) fail("[cuda] matmul: M = ", M, " too large for the generic kernel");
  if (wt == Half::F16)
    generic_matmul_kernel<true><<<grid, kWarpsPerBlock * 32, 0, s>>>(x, M, K, ldx, w, N, y, ldy);
  else
    generic_matmul_kernel<false><<<grid, kWarpsPerBlock * 32, 0, s>>>(x, M, K, ldx, w, N, y, ldy);
  AUGUR_LAUNCHED("generic_matmul_kernel");
}

}  // namespace detail

bool norm_matmul_fits(int64_t M, int64_t K, int64_t N) {
  return M <= stream_rows() && detail::stream_gemv_fits(M, K, N);
}

void norm_matmul(const float* x, int64_t M, int64_t K, const float* g, float eps, const half_bits* w, Half wt,
                 int64_t N, float* y, Stream s) {
  if (!norm_matmul_fits(M, K, N)) fail("[cuda] norm_matmul: M ", M, ", K ", K, ", N ", N, " do not fit");
  detail::StreamGemv q;
  q.x = x, q.M = M, q.K = K, q.ldx = K, q.w = w, q.wt = wt, q.N = N, q.y = y, q.ldy = N;
  q.norm = true, q.g = g, q.eps = eps;
  detail::stream_gemv(q, s);
}

bool block_tail_fits(int64_t M, int64_t Ka, int64_t D, int64_t F, int64_t n_next) {
  return M <= stream_rows() && detail::stream_gemv_fits(M, Ka, D) && detail::stream_gemv_fits(M, D, 2 * F, true) &&
         detail::stream_gemv_fits(M, F, D) && (n_next == 0 || detail::stream_gemv_fits(M, D, n_next));
}

// Four stream GEMVs, each end fused:
//   x += a · w_outᵀ                          (Accumulate)
//   act = swiglu(gate_up · rms_norm(x) * g)   (norm in, SwiGLU out)
//   out = act · downᵀ; with next also x += out (Accumulate, y2 = out)
//   y_next = w_next · rms_norm(x) * g_next    (norm in)
// The last GEMV's ring is 144 KB, not 160: with the next block's q/k/v
// projection it leaves room an SM for the fused RoPE decode attention's
// blocks (80 KB at head_dim 128) to become resident beside it and load
// their first keys while the weights stream (attention_decode.cu). The
// first GEMV's (w_out) is 128 KB, so that its blocks fit beside the
// attention's in turn and stream w_out while the attention runs: at
// context 8192 the dense 3B shape decoded 2% faster (H100), elsewhere the
// same.
void block_tail(const BlockTail& t, Stream s) {
  if (!block_tail_fits(t.M, t.Ka, t.D, t.F, t.n_next))
    fail("[cuda] block_tail: M ", t.M, ", K ", t.Ka, ", D ", t.D, ", F ", t.F, ", next ", t.n_next,
         " do not fit the stream GEMV");
  using detail::StreamEpi;
  const bool next = t.n_next > 0;
  detail::StreamGemv o;
  o.x = t.a, o.M = t.M, o.K = t.Ka, o.ldx = t.Ka, o.w = t.w_out, o.wt = t.w_out_t, o.N = t.D;
  o.y = t.x, o.ldy = t.D, o.epi = StreamEpi::Accumulate, o.name = "stream_o";
  o.ring_kb = 128;  // beside the decode attention's blocks (see below)
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
  nx.ring_kb = 144;
  detail::stream_gemv(nx, s);
}

}  // namespace augur::cuda
