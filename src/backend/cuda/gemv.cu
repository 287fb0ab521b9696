// Skinny GEMM for decode and verify steps (M <= 8 rows of x; matmul_bf16
// sends M <= 8 here):
// y[m, n] = sum_k x[m, k] w[n, k]. Memory-bound: every weight is read once for
// all M rows.
//
// rows_kernel: a warp streams kRows = 4 weight rows; each load instruction
// reads 512 contiguous bytes of one row (lane l takes k = 8l..8l+7 of each
// 256-wide step), 8 loads of 16 bytes in flight per lane, so DRAM sees long
// runs of each row. Products on the FMA units in f32 (x exact), lanes reduced
// with shuffles at the end. It takes the matrices too short to give every SM
// a few rows; the stream kernel below (tensor cores, weights staged in
// shared memory so that its loads fit the mma's fragments) takes the rest.
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

// stream_kernel: the decode and verify GEMV (M <= 8 rows of x) on tensor
// cores, one block an SM, streaming its rows (every grid-th row) through a
// ring of shared-memory stages filled by bulk copies.
//
// Why this form. A verify step's rows must be computed exactly as a decode
// step's row (speculative greedy output equals plain greedy output only
// then), and a 1 + 4 verify should cost little more than a decode step: the
// weights are streamed once whatever M is. f32 FMAs on CUDA cores did five
// rows at 61-80% of copy (the products, not the bytes, were the limit); an
// mma's output column depends on its column of x alone, so a row of y here
// is the same bits whatever M is, and M = 8 costs about what M = 1 does.
// x (f32) is split into two 16-bit parts of the weights' type, hi =
// half(x) and lo = half(x - hi) (in f16 scaled by 2^10, each part with its
// own mma chain): the products of exact weights with both parts keep about
// 16 (bf16) or 22 (f16) bits of x, f32-like (x rounded to bf16 would err by
// ~1e-4 of sum |w x|). As everywhere on CUDA, f16 weights assume
// activations within f16's range (AUGUR_CUDA_HALF=bf16 otherwise).
//
// The producer thread keeps the ring in flight and starts before the PDL
// wait (weights depend on no earlier kernel), so a matrix starts streaming
// while the kernels before it finish. Stage i: R = 16 TILES rows (the
// block's units u0..u0+R-1 of group g = i / n_chunks) by kStreamK = 1024
// columns (chunk c = i % n_chunks; the last may be short), one bulk copy a
// row, each 128-byte aligned in shared memory (rows at an unpadded pitch).
// Equal rows a block: the blocks end together.
// The consumers: warp w takes the 64-column blocks 2w, 2w + 1 of every
// stage, for all its rows: per block and 16-row tile, 4 mma.m16n8k16 for
// each part of x (x's row m is the mma's column n = m; rows past M are
// zeros). No ldmatrix: lane (g, t) reads 16 bytes of row g with one shared
// load, elements 8t..8t+7 of the block's half h = g & 1 first and then the
// other half, so that a load's 8 rows fall in two bank halves (no
// conflicts); mma j takes elements 32 (j >> 1) + 8t + 4 (j & 1) + {0, 1} as
// its k = 2t, 2t + 1 and + {2, 3} as 2t + 8, 2t + 9, and x is read to match
// (one float4 a lane an mma).
// x's parts: where they fit beside three 16-row stages (4 M K bytes; a decode
// step's every matrix, a 1 + 4 verify's where K <= 4096), the consumers
// split all of x once, before the first stage, into shared memory in
// fragment order (XSPLIT), and a stage reads 8 bytes a lane an mma and
// part; else each lane reads the next stage's x (f32, from L1/L2) before it
// waits for this one and splits it when the stage starts. Both forms give
// every mma the same operands. Splitting each stage costs ~0.8 us a stage
// whatever its size (H100: 16-row stages 30% slower than 32-row ones at
// M = 1); split once, 16-row stages are as fast as 32-row ones on long
// matrices and faster on short ones (8B q/k/v 17.9 us against 20.5: less
// of the last stage is empty), so they are XSPLIT's default. Staging x per
// stage with bulk copies beside the weights instead (x's latency off the
// consumers' path) measured the same as reading it from L1/L2.
// Measured and dropped (H200, M = 1, 8B gate_up 24576 x 4096, a probe of
// this form at 48.1 us): ldmatrix from rows at a padded pitch of 1024 + 8
// halves (conflict-free, but a bulk copy whose shared destination is not
// 128-byte aligned streams slower: 54.1 us); ldmatrix on unpadded rows
// (8-way bank conflicts: 66.8 us); tensor-map copies with the 128-byte
// swizzle (the box reads 128 bytes a row at a time: 53.2 us, and 34.3
// against 24.2 on 8B down); x loaded at the stage that uses it (~3.7 us
// more).
// At a group's end each warp leaves its partial sums in shared memory and
// thread o = r + R m adds the 8 warps' in order: every output is the warps'
// mma chains (chunks, blocks, mmas and parts in order) summed in warp
// order, whatever M is; deterministic.
// Fused ends (StreamGemv, the decode step's block tail): NORM takes x as the
// residual stream and multiplies by rms_norm(x) * g before the split, every
// block reducing all of x first (the squares in a fixed order); epi
// StreamEpi::Accumulate adds into y (the residual; its old value is loaded
// before the group's barrier) and optionally stores the product in y2 as
// well. SwiGLU takes a fused gate/up matrix (gate rows f < F = N / 2, then up
// rows F + f) with output columns f as its units: the block reads all its
// gate rows, keeping their sums in shared memory (stash), then its up rows
// in the same order, and stores silu(gate) * up: y[m, f]. (Reading a unit's
// gate and up rows together, two regions of the matrix at once, streams
// slower.)
// x: [M, K] f32 (row stride ldx % 4 == 0, 16-byte aligned); w: [N, K] half
// (K % 8 == 0, 16-byte aligned); y: [M, N] f32 (row stride ldy; [M, N / 2]
// for SwiGLU); smem: slots x [R][kStreamK] half, then (XSPLIT) x's parts,
// then full[slots], empty[slots] mbarriers, then red[2][consumers][R][8], the norm's
// [consumers][8] and (SwiGLU) stash[units a block][8].
constexpr int kStreamConsumers = 8;
constexpr int kStreamThreads = (kStreamConsumers + 1) * 32;
constexpr int kStreamK = 1024;                                   // columns a stage
constexpr int kStreamBlocks = kStreamK / 64 / kStreamConsumers;  // 64-column blocks a warp takes of a stage
constexpr int kStreamParts = 2;                                  // 16-bit parts of x
constexpr int kStreamMaxSmem = 227 * 1024;                       // a block's dynamic shared memory on sm_90
// Rows an SM below which skinny_matmul takes rows_kernel (whatever M is, so
// that a verify step's rows take the kernel a decode step's row does).
constexpr int kStreamMinRows = 4;
constexpr int stream_rows(int tiles) { return 16 * tiles; }

size_t stream_header_bytes(int tiles, int slots, int stash_units) {
  return size_t(2 * slots) * sizeof(uint64_t) +
         size_t(2 * kStreamConsumers * stream_rows(tiles) * 8 + kStreamConsumers * 8 + stash_units * 8) *
             sizeof(float);
}
constexpr size_t stream_stage_bytes(int tiles) { return size_t(stream_rows(tiles)) * kStreamK * sizeof(uint16_t); }

// x split once a block into shared memory: [ceil(K / 64) blocks][4 mma]
// [P parts][4 M lanes] words of b0, b1 (the 16-byte rows of a lane's
// mma fragments), 4 M K bytes rounded up.
constexpr size_t stream_xsplit_bytes(int64_t M, int64_t K) { return size_t((K + 63) / 64) * 4 * 2 * 4 * M * 8; }

template <bool F16, StreamEpi EPI, bool NORM, int TILES, bool XSPLIT>
__global__ void __launch_bounds__(kStreamThreads, 1)
    stream_kernel(const float* __restrict__ x, int M, int K, int64_t ldx, const uint16_t* __restrict__ w, int N,
                  float* __restrict__ y, int64_t ldy, int slots, const float* __restrict__ g_norm, float eps,
                  float* __restrict__ y2) {
  constexpr bool swiglu = EPI == StreamEpi::SwiGLU;
  constexpr int R = stream_rows(TILES), KC = kStreamK, NB = kStreamBlocks, P = kStreamParts;
  static_assert(P == 2, "stream_kernel: x is split into a high and a low part");
  // The low part is scaled up by 2^10 in f16 (and its chain scaled back at
  // the group's end) so that it stays a normal f16 down to |x| ~ 1e-4
  // (unscaled it is subnormal below |x| ~ 0.12 and keeps fewer bits), and
  // stays finite for every x whose high part is (|x| * 2^-11 * 2^10 <=
  // 65504). bf16 has f32's range: no scale.
  constexpr float kLoScale = F16 ? 1024.f : 1.f;
  extern __shared__ __align__(128) unsigned char smem[];
  uint16_t* ring = reinterpret_cast<uint16_t*>(smem);
  uint2* xsp = reinterpret_cast<uint2*>(smem + size_t(slots) * R * KC * sizeof(uint16_t));
  uint64_t* full = reinterpret_cast<uint64_t*>(reinterpret_cast<unsigned char*>(xsp) +
                                               (XSPLIT ? stream_xsplit_bytes(M, K) : 0));
  uint64_t* empty = full + slots;
  float* red = reinterpret_cast<float*>(empty + slots);  // [2][consumers][R][8]
  float* rn = red + 2 * kStreamConsumers * R * 8;        // [consumers][8]
  float* stash = rn + kStreamConsumers * 8;              // SwiGLU: [units a block][8]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // This block's units: u(i) = blk + G * i, i < n_units: rows, or for
  // SwiGLU output columns. Group g (R units' rows) of phase p = g / n_phase
  // (SwiGLU: 0 gate rows, 1 up rows) covers units q = g % n_phase.
  const int G = int(gridDim.x), blk = int(blockIdx.x);
  const int F = N / 2, units = swiglu ? F : N;
  const int n_units = (units - blk + G - 1) / G;
  auto unit_of = [&](int i) { return int64_t(blk) + int64_t(G) * i; };
  const int n_phase = (n_units + R - 1) / R;
  const int n_chunks = (K + KC - 1) / KC;
  const int n_groups = swiglu ? 2 * n_phase : n_phase;
  const int n_stages = n_groups * n_chunks;
  auto group_unit = [&](int g) { return (swiglu && g >= n_phase ? g - n_phase : g) * R; };  // its first unit
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
    for (int i = 0; i < n_stages; ++i) {
      const int slot = i % slots;
      if (i >= slots) mbar_wait(&empty[slot], uint32_t(i / slots - 1) & 1u);
      const int g = i / n_chunks, k0 = i % n_chunks * KC;
      const int rows = min(R, n_units - group_unit(g)), len = min(KC, K - k0);
      mbar_arrive_expect_tx(&full[slot], uint32_t(rows * len) * 2u);
      for (int r = 0; r < rows; ++r)
        bulk_copy_g2s(ring + (size_t(slot) * R + r) * KC, w + row_of(g, r) * K + k0, uint32_t(len) * 2u,
                      &full[slot]);
    }
    return;
  }

  // x's float4 items in fragment order: item L of a row is columns
  // item_k(L)..+3, the b0/b1 words of mma j = L % 16 / 4, lane column group
  // L % 4, of 64-column block L / 16. Consumer thread i takes items i,
  // i + 256, ... of every row, for the norm's squares and for XSPLIT.
  const int nkb = (K + 63) / 64, per_row = nkb * 16, n_i = (per_row + kStreamConsumers * 32 - 1) / (kStreamConsumers * 32);
  auto item_k = [](int L) {
    const int j = L % 16 / 4;
    return L / 16 * 64 + 32 * (j >> 1) + 8 * (L % 4) + 4 * (j & 1);
  };
  if constexpr (NORM) {  // the gain is a weight: into L1 before the wait
    for (int u = 0; u < n_i; ++u) {
      const int L = int(threadIdx.x) + u * kStreamConsumers * 32, k = item_k(L);
      if (L < per_row && k < K) asm volatile("prefetch.global.L1 [%0];" ::"l"(g_norm + k));
    }
  }
  pdl_wait();
  pdl_launch_dependents();
  const int gq = lane >> 2, t = lane & 3;
  const bool has_row = gq < M;  // this lane's row of x: the mma's column gq
  const float* xrow = x + int64_t(has_row ? gq : 0) * ldx;
  float inv = 1.f;  // NORM: 1 / rms of row gq of x
  auto inv_of = [&](int m) {
    float s = 0.f;
    for (int q = 0; q < kStreamConsumers; ++q) s += rn[q * 8 + m];
    return 1.0f / sqrtf(s / float(K) + eps);
  };
  // XSPLIT with at most kHold items a thread: all of them loaded at once and
  // held in registers through the norm (an x load behind the weights'
  // stream waits for L2 more than a stage takes, so one round trip, not
  // one for the squares and one for the split).
  constexpr int kHold = 20;
  const int held = M * n_i;
  const bool hold = XSPLIT && held <= kHold;
  float4 xh[kHold];
  if (hold) {
#pragma unroll
    for (int q = 0; q < kHold; ++q) {
      xh[q] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (q < held) {
        const int m = q / n_i, L = int(threadIdx.x) + (q - m * n_i) * kStreamConsumers * 32, k = item_k(L);
        if (L < per_row && k < K) xh[q] = __ldg(reinterpret_cast<const float4*>(x + m * ldx + k));
      }
    }
  }
  if constexpr (NORM) {
    // Each row's squares: thread i's items in order, then warp sums, then
    // the warps' in order (whether x is held or read again).
    float ss[8];
#pragma unroll
    for (int m = 0; m < 8; ++m) ss[m] = 0.f;
    auto add = [&](int m, float4 v) {
      // Explicit FMAs: the same rounding at each of this lambda's inlined
      // sites (the compiler may contract a * b + c differently at each).
      const float sq = fmaf(v.w, v.w, fmaf(v.z, v.z, fmaf(v.y, v.y, __fmul_rn(v.x, v.x))));
#pragma unroll
      for (int mm = 0; mm < 8; ++mm)
        if (mm == m) ss[mm] = __fadd_rn(ss[mm], sq);
    };
    if (hold) {
#pragma unroll
      for (int q = 0; q < kHold; ++q)
        if (q < held) add(q / n_i, xh[q]);
    } else {
      for (int m = 0; m < M; ++m)
#pragma unroll 4
        for (int u = 0; u < n_i; ++u) {
          const int L = int(threadIdx.x) + u * kStreamConsumers * 32, k = item_k(L);
          if (L < per_row && k < K) add(m, __ldg(reinterpret_cast<const float4*>(x + m * ldx + k)));
        }
    }
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      const float s = warp_sum(ss[m]);
      if (lane == 0) rn[warp * 8 + m] = s;
    }
    asm volatile("bar.sync 1, %0;" ::"n"(kStreamConsumers * 32) : "memory");
    if (has_row) inv = inv_of(gq);
  }
  // Each row's 1 / rms once (XSPLIT's split of every row), picked by row.
  float rinv[8];
#pragma unroll
  for (int m = 0; m < 8; ++m) rinv[m] = NORM && XSPLIT && m < M ? inv_of(m) : 1.f;
  auto rinv_of = [&](int m) {
    float r = 1.f;
#pragma unroll
    for (int mm = 0; mm < 8; ++mm)
      if (mm == m) r = rinv[mm];
    return r;
  };
  // This lane's x for mma j of block bb of chunk c (zeros past K and for
  // rows past M), and with NORM the gain there.
  auto column = [&](int c, int bb, int j) {
    return c * KC + (warp * NB + bb) * 64 + 32 * (j >> 1) + 8 * t + 4 * (j & 1);
  };
  auto load_x = [&](int c, float4 (&xv)[NB][4], float4 (&gv)[NB][4]) {
#pragma unroll
    for (int bb = 0; bb < NB; ++bb)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int k = column(c, bb, j);
        const bool ok = has_row && k < K;
        xv[bb][j] = ok ? __ldg(reinterpret_cast<const float4*>(xrow + k)) : make_float4(0.f, 0.f, 0.f, 0.f);
        if constexpr (NORM)
          gv[bb][j] = ok ? __ldg(reinterpret_cast<const float4*>(g_norm + k)) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
  };
  // The mma's b0 (k = 2t, 2t + 1) and b1 (2t + 8, 2t + 9) of each part,
  // from 4 columns of x (xv) with their gain (gv) and row's 1 / rms (rinv).
  auto split4 = [&](float4 xv, float4 gv, float rinv, uint32_t (&b)[P][2]) {
    float v[4] = {xv.x, xv.y, xv.z, xv.w};
    if constexpr (NORM) {
      const float gg[4] = {gv.x, gv.y, gv.z, gv.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) v[e] = __fmul_rn(gg[e], __fmul_rn(v[e], rinv));  // never contracted into v - hi
    }
#pragma unroll
    for (int p = 0; p < P; ++p) {
      uint16_t h[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        h[e] = f32_to_half<F16>(p == 0 ? v[e] : v[e] * kLoScale);
        if (p == 0) v[e] -= half_to_f32<F16>(h[e]);
      }
      b[p][0] = uint32_t(h[0]) | (uint32_t(h[1]) << 16);
      b[p][1] = uint32_t(h[2]) | (uint32_t(h[3]) << 16);
    }
  };
  auto split = [&](const float4 (&xv)[NB][4], const float4 (&gv)[NB][4], uint32_t (&b)[NB][4][P][2]) {
#pragma unroll
    for (int bb = 0; bb < NB; ++bb)
#pragma unroll
      for (int j = 0; j < 4; ++j) split4(xv[bb][j], gv[bb][j], inv, b[bb][j]);
  };
  const int lanes_x = 4 * M;  // XSPLIT: lanes holding rows
  auto store_split = [&](int m, int L, float4 xv, float rinv) {
    const int k = item_k(L);
    float4 gv = make_float4(0.f, 0.f, 0.f, 0.f);
    if constexpr (NORM)
      if (k < K) gv = __ldg(reinterpret_cast<const float4*>(g_norm + k));
    uint32_t b[P][2];
    split4(xv, gv, rinv, b);
    const int kb = L / 16, j = L % 16 / 4, tt = L % 4;
#pragma unroll
    for (int p = 0; p < P; ++p) xsp[((kb * 4 + j) * P + p) * lanes_x + m * 4 + tt] = make_uint2(b[p][0], b[p][1]);
  };
  if (hold) {
#pragma unroll
    for (int q = 0; q < kHold; ++q)
      if (q < held) {
        const int m = q / n_i, L = int(threadIdx.x) + (q - m * n_i) * kStreamConsumers * 32;
        if (L < per_row) store_split(m, L, xh[q], rinv_of(m));
      }
    asm volatile("bar.sync 1, %0;" ::"n"(kStreamConsumers * 32) : "memory");
  } else if constexpr (XSPLIT) {  // more items than kHold: kBatch loads at a time
    constexpr int kBatch = 8;
    for (int q0 = 0; q0 < held; q0 += kBatch) {
      float4 xv[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int q = q0 + u, m = q / n_i, L = int(threadIdx.x) + (q - m * n_i) * kStreamConsumers * 32;
        const int k = item_k(L);
        xv[u] = q < held && L < per_row && k < K ? __ldg(reinterpret_cast<const float4*>(x + m * ldx + k))
                                                 : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int q = q0 + u, m = q / n_i, L = int(threadIdx.x) + (q - m * n_i) * kStreamConsumers * 32;
        if (q < held && L < per_row) store_split(m, L, xv[u], rinv_of(m));
      }
    }
    asm volatile("bar.sync 1, %0;" ::"n"(kStreamConsumers * 32) : "memory");
  }
  const bool odd = (gq & 1) != 0;
  float acc[TILES][P][4];  // a chain for each part of x
#pragma unroll
  for (int i2 = 0; i2 < TILES; ++i2)
#pragma unroll
    for (int p = 0; p < P; ++p) acc[i2][p][0] = acc[i2][p][1] = acc[i2][p][2] = acc[i2][p][3] = 0.f;
  float4 xv[NB][4], gv[NB][4];
  if (!XSPLIT) load_x(0, xv, gv);
  int slot = 0;
  uint32_t phase = 0;
  for (int i = 0; i < n_stages; ++i) {
    const int c = i % n_chunks, gi = i / n_chunks;
    const int u0 = group_unit(gi), rows = min(R, n_units - u0);
    uint32_t b[NB][4][P][2];
    if constexpr (XSPLIT) {  // x's fragments first: they do not wait for the ring
#pragma unroll
      for (int bb = 0; bb < NB; ++bb) {
        const int kb = c * (KC / 64) + warp * NB + bb;
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int p = 0; p < P; ++p) {
            const uint2 v = has_row && kb < nkb ? xsp[((kb * 4 + j) * P + p) * lanes_x + lane] : make_uint2(0u, 0u);
            b[bb][j][p][0] = v.x, b[bb][j][p][1] = v.y;
          }
      }
      mbar_wait(&full[slot], phase);
    } else {
      split(xv, gv, b);
      if (i + 1 < n_stages) load_x((i + 1) % n_chunks, xv, gv);
      mbar_wait(&full[slot], phase);
    }
    const uint16_t* st = ring + size_t(slot) * R * KC;
#pragma unroll
    for (int bb = 0; bb < NB; ++bb) {
      const int col = (warp * NB + bb) * 64 + 8 * t;
      const bool lo_ok = c * KC + col < K, hi_ok = c * KC + col + 32 < K;  // K % 8 == 0: 8 columns in or out
#pragma unroll
      for (int i2 = 0; i2 < TILES; ++i2) {
        if (i2 * 16 >= rows) continue;
        uint32_t q[2][2][4];  // [row g, g + 8][half][word]
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const uint16_t* row = st + size_t(i2 * 16 + gq + 8 * rr) * KC + col;
          const uint4 first = *reinterpret_cast<const uint4*>(row + (odd ? 32 : 0));
          const uint4 second = *reinterpret_cast<const uint4*>(row + (odd ? 0 : 32));
          const uint32_t f[4] = {first.x, first.y, first.z, first.w}, s[4] = {second.x, second.y, second.z, second.w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            q[rr][0][e] = lo_ok ? (odd ? s[e] : f[e]) : 0u;
            q[rr][1][e] = hi_ok ? (odd ? f[e] : s[e]) : 0u;
          }
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t a[4] = {q[0][j >> 1][2 * (j & 1)], q[1][j >> 1][2 * (j & 1)], q[0][j >> 1][2 * (j & 1) + 1],
                                 q[1][j >> 1][2 * (j & 1) + 1]};
#pragma unroll
          for (int p = 0; p < P; ++p) mma_16816<F16>(acc[i2][p], a, b[bb][j][p][0], b[bb][j][p][1]);
        }
      }
    }
    mbar_arrive(&empty[slot]);
    if (++slot == slots) slot = 0, phase ^= 1u;
    if (c != n_chunks - 1) continue;
    // The group's end. red alternates between two halves, so a half is
    // rewritten only after the next barrier, which every thread reaches
    // after reading it.
    float* half = red + size_t(gi & 1) * kStreamConsumers * R * 8;
    float* mine = half + size_t(warp) * R * 8;
#pragma unroll
    for (int i2 = 0; i2 < TILES; ++i2) {
      if (i2 * 16 < rows) {
        const int r = i2 * 16 + gq;
        float v[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = acc[i2][0][e] + acc[i2][1][e] * (1.0f / kLoScale);
        mine[r * 8 + 2 * t] = v[0];
        mine[r * 8 + 2 * t + 1] = v[1];
        mine[(r + 8) * 8 + 2 * t] = v[2];
        mine[(r + 8) * 8 + 2 * t + 1] = v[3];
      }
#pragma unroll
      for (int p = 0; p < P; ++p) acc[i2][p][0] = acc[i2][p][1] = acc[i2][p][2] = acc[i2][p][3] = 0.f;
    }
    const int o = int(threadIdx.x), r = o % R, m = o / R;  // R * 8 <= 256 outputs a group
    const bool out = m < M && r < rows;
    const int64_t at = int64_t(m) * ldy + unit_of(u0 + r);
    float old = 0.f;  // Accumulate: y's value before this kernel, loaded before the barrier
    if constexpr (EPI == StreamEpi::Accumulate)
      if (out) old = y[at];
    asm volatile("bar.sync 1, %0;" ::"n"(kStreamConsumers * 32) : "memory");
    if (!out) continue;
    float sum = 0.f;
    for (int q = 0; q < kStreamConsumers; ++q) sum += half[size_t(q) * R * 8 + r * 8 + m];
    if constexpr (swiglu) {  // the same thread (r, m) stashes the gate and later reads it
      float& gate = stash[(u0 + r) * 8 + m];
      if (gi < n_phase)
        gate = sum;
      else
        y[at] = silu_mul(gate, sum);
    } else if constexpr (EPI == StreamEpi::Accumulate) {
      y[at] = old + sum;
      if (y2 != nullptr) y2[at] = sum;
    } else {
      y[at] = sum;
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

// The stream kernel for M <= 8, any K % 8 == 0.
struct StreamLaunch {
  const StreamGemv& q;
  int tiles, slots, grid;
  int stash_units;  // SwiGLU: the most units (output columns) a block takes
  bool xsplit;
};

template <bool F16, StreamEpi EPI, bool NORM, int TILES, bool XSPLIT>
void launch_stream(const StreamLaunch& l, Stream s) {
  const size_t smem = size_t(l.slots) * stream_stage_bytes(TILES) + (XSPLIT ? stream_xsplit_bytes(l.q.M, l.q.K) : 0) +
                      stream_header_bytes(TILES, l.slots, l.stash_units);
  auto kernel = stream_kernel<F16, EPI, NORM, TILES, XSPLIT>;
  static size_t granted = 0;  // per instantiation: the dynamic smem the attribute allows
  if (smem > granted) {
    AUGUR_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    granted = smem;
  }
  const StreamGemv& q = l.q;
  launch(q.name, kernel, dim3(unsigned(l.grid)), dim3(kStreamThreads), smem, s, q.x, int(q.M), int(q.K), q.ldx,
         reinterpret_cast<const uint16_t*>(q.w), int(q.N), q.y, q.ldy, l.slots, q.g, q.eps, q.y2);
}

template <bool F16, StreamEpi EPI, bool NORM>
void launch_stream(const StreamLaunch& l, Stream s) {
  if (l.xsplit) {
    if (l.tiles == 1)
      launch_stream<F16, EPI, NORM, 1, true>(l, s);
    else
      launch_stream<F16, EPI, NORM, 2, true>(l, s);
  } else if (l.tiles == 1)
    launch_stream<F16, EPI, NORM, 1, false>(l, s);
  else
    launch_stream<F16, EPI, NORM, 2, false>(l, s);
}

// The combinations the engine uses: plain, Accumulate (o, down), norm +
// SwiGLU (gate/up), norm + Store (the next projection).
template <bool F16>
void launch_stream(const StreamLaunch& l, Stream s) {
  const StreamGemv& q = l.q;
  if (q.epi == StreamEpi::SwiGLU && q.norm)
    launch_stream<F16, StreamEpi::SwiGLU, true>(l, s);
  else if (q.epi == StreamEpi::Store && q.norm)
    launch_stream<F16, StreamEpi::Store, true>(l, s);
  else if (q.epi == StreamEpi::Accumulate && !q.norm)
    launch_stream<F16, StreamEpi::Accumulate, false>(l, s);
  else if (q.epi == StreamEpi::Store && !q.norm)
    launch_stream<F16, StreamEpi::Store, false>(l, s);
  else
    fail("[cuda] stream GEMV: this combination of norm and output is not built");
}

// Checks and launches one stream GEMV (StreamGemv in detail.h).
void run_stream(const StreamGemv& q, Stream s, int sm_count) {
  const bool swiglu = q.epi == StreamEpi::SwiGLU;
  if (!detail::stream_gemv_fits(q.M, q.K, q.N, swiglu) || q.ldx % 4 != 0 || !aligned16(q.x) || !aligned16(q.w) ||
      (q.norm && (q.g == nullptr || !aligned16(q.g))))
    fail("[cuda] stream GEMV: M ", q.M, ", K ", q.K, ", N ", q.N, ", ldx ", q.ldx,
         " (M <= 8, K % 8 == 0, 16-byte aligned x, w and gain; SwiGLU: N % 2 == 0)");
  const int64_t units = swiglu ? q.N / 2 : q.N;
  const int grid = int(std::min<int64_t>(sm_count, units));
  const int stash = swiglu ? int(ceil_div(units, int64_t(grid))) : 0;
  // Slots of the ring: what ring_kb asks for, at least two, as far as the
  // header leaves room; where two 64 KB stages do not fit (a large SwiGLU
  // stash on few SMs), 32 KB ones.
  const int ring_kb = std::clamp(q.ring_kb, 32, 224);
  auto slots_for = [&](int tiles, size_t x_bytes) {
    const size_t stage = stream_stage_bytes(tiles), header = stream_header_bytes(tiles, 16, stash) + x_bytes;
    return std::min(std::max(2, int(size_t(ring_kb) * 1024 / stage)),
                    int((size_t(kStreamMaxSmem) - std::min(header, size_t(kStreamMaxSmem))) / stage));
  };
  // x split once a block where it fits beside three 16-row stages, in 16-row stages
  // (with the split out of the stage loop a stage's fixed cost is small, and
  // short matrices waste less of their last stage); else split each stage,
  // in 32-row stages (fewer splits).
  int tiles = q.tiles == 1 ? 1 : q.tiles == 2 ? 2 : 0;
  int slots = !q.split_each_stage ? slots_for(tiles == 0 ? 1 : tiles, stream_xsplit_bytes(q.M, q.K)) : 0;
  const bool use_xsplit = slots >= 3;  // two 32 KB stages under-feed an SM
  if (use_xsplit) {
    if (tiles == 0) tiles = 1;
  } else {
    if (tiles == 0) tiles = 2;
    slots = slots_for(tiles, 0);
    if (slots < 2 && tiles == 2) tiles = 1, slots = slots_for(1, 0);
  }
  if (slots < 2)
    fail("[cuda] stream GEMV: M ", q.M, ", K ", q.K, ", N ", q.N, " on ", grid, " SMs needs too much shared memory");
  const StreamLaunch l{q, tiles, slots, grid, stash, use_xsplit};
  q.wt == Half::F16 ? launch_stream<true>(l, s) : launch_stream<false>(l, s);
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
  return M >= 1 && M <= kSkinnyMaxM && K > 0 && K % 8 == 0 && K <= (int64_t(1) << 24) && N > 0 &&
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
  if (splits == 0 && stream_gemv_fits(M, K, N) && N >= int64_t(c.sm_count) * kStreamMinRows) {
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

bool norm_matmul_fits(int64_t M, int64_t K, int64_t N) { return detail::stream_gemv_fits(M, K, N); }

void norm_matmul(const float* x, int64_t M, int64_t K, const float* g, float eps, const half_bits* w, Half wt,
                 int64_t N, float* y, Stream s) {
  if (!norm_matmul_fits(M, K, N)) fail("[cuda] norm_matmul: M ", M, ", K ", K, ", N ", N, " do not fit");
  detail::StreamGemv q;
  q.x = x, q.M = M, q.K = K, q.ldx = K, q.w = w, q.wt = wt, q.N = N, q.y = y, q.ldy = N;
  q.norm = true, q.g = g, q.eps = eps;
  detail::stream_gemv(q, s);
}

bool block_tail_fits(int64_t M, int64_t Ka, int64_t D, int64_t F, int64_t n_next) {
  return detail::stream_gemv_fits(M, Ka, D) && detail::stream_gemv_fits(M, D, 2 * F, true) &&
         detail::stream_gemv_fits(M, F, D) && (n_next == 0 || detail::stream_gemv_fits(M, D, n_next));
}

// Four stream GEMVs, each end fused:
//   x += a · w_outᵀ                          (Accumulate)
//   act = swiglu(gate_up · rms_norm(x) * g)   (norm in, SwiGLU out)
//   out = act · downᵀ; with next also x += out (Accumulate, y2 = out)
//   y_next = w_next · rms_norm(x) * g_next    (norm in)
// The last GEMV's ring is 96 KB (three 16-row stages), not 192: at decode
// (M = 1; x's parts 16 KB at K = 4096) the next block's q/k/v projection
// with the block's sums leaves room an SM for the fused RoPE decode attention's
// blocks (80 KB at head_dim 128) to become resident beside it and load
// their first keys while the weights stream (attention_decode.cu).
void block_tail(const BlockTail& t, Stream s) {
  if (!block_tail_fits(t.M, t.Ka, t.D, t.F, t.n_next))
    fail("[cuda] block_tail: M ", t.M, ", K ", t.Ka, ", D ", t.D, ", F ", t.F, ", next ", t.n_next,
         " do not fit the stream GEMV");
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
  nx.ring_kb = 96;
  detail::stream_gemv(nx, s);
}

}  // namespace augur::cuda
