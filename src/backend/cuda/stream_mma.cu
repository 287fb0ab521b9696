// Skinny tensor-core GEMM for batched decode (3..32 rows of x):
// y[m, n] = sum_k x[m, k] w[n, k], x rounded to the weights' type (as the
// cuBLASLt path rounds it), f32 accumulation.
//
// Why: at M = 32 cuBLASLt reads Qwen3-8B's weights at ~2.75 TB/s (tenth
// session), where the batch-1 stream GEMV (gemv.cu stream_kernel) reads them
// at the copy rate. This is that kernel's bulk-copy ring feeding mma.
//
// One block an SM. A producer thread streams stages into a ring of shared
// memory: stage = kRows (16) rows of w x kChunk (1024) columns, one 2 KB bulk
// copy a row, rows padded to kPitch halves so ldmatrix's eight row addresses
// fall in distinct banks. Block b takes the row groups b, b + grid, ... and
// walks them chunk-major: every group of chunk 0, then of chunk 1, and so on,
// so each consumer warp loads its slice of x once a chunk: warp q multiplies
// columns [q * 128, q * 128 + 128) of every stage, its A fragments (x, m16 x
// k16, MT tiles of 16 rows) in registers, the weights as mma's B operand
// (n8 x k16, [n][k] rows: ldmatrix without transpose). At a stage's end the
// warps' [MT * 16, 16] sums meet in shared memory and are added in warp
// order, then onto the group's running sum (chunk order; shared memory) or,
// at the last chunk, stored to y.
// Split K (S > 1): where a block would have few row groups, every block
// loading all of x a chunk costs more than its weights (eleventh session: o
// at M = 32 streamed at 1/4 of the copy rate). Block (s, t) then takes K
// slice s (n_chunks / S chunks) of the groups t, t + T, ..., stores its
// partial sums, and at its end counts each group in; the last of a group's S
// blocks adds the S partials in slice order into y (rows_kernel's split-K:
// one launch, deterministic, counters left at zero).
#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "backend/cuda/common.cuh"
#include "backend/cuda/detail.h"

namespace augur::cuda {
namespace {

constexpr int kRows = 16;                  // rows of w a stage (two n8 tiles)
constexpr int kWarps = 8;                  // consumer warps
constexpr int kWarpK = 128;                // columns a warp multiplies of each stage (8 k16 steps)
constexpr int kChunk = kWarps * kWarpK;    // 1024 columns a stage
constexpr int kPitch = kChunk + 8;         // halves a ring row: 2064 bytes, rows 4 banks apart
constexpr int kThreads = (kWarps + 1) * 32;
constexpr size_t kStageBytes = size_t(kRows) * kPitch * 2;
constexpr size_t kMaxSmem = 227 * 1024;

// Shared memory besides the ring: mbarriers, the warps' sums (two buffers)
// and the groups' running sums.
template <int MT>
constexpr size_t side_bytes(int slots, int groups) {
  constexpr size_t out = size_t(MT) * 16 * kRows;  // a group's outputs
  return size_t(2 * slots) * sizeof(uint64_t) + (2 * kWarps * out + size_t(groups) * out) * sizeof(float);
}

// x: [M, K] f32 (row stride ldx, even; M <= MT * 16); w: [N, K] half (K % kChunk
// == 0, N % kRows == 0, 16-byte aligned); y: [M, N] f32 (row stride ldy).
// Grid S x T (block b: slice b % S, t = b / S); part: [S, M, N] f32, counters:
// [N / kRows] (S > 1). smem: ring [slots][kRows][kPitch] half, full[slots],
// empty[slots], red[2][kWarps][MT * 16][kRows] f32, run[groups][MT * 16][kRows]
// f32 (only with more than one chunk a slice).
template <int MT, bool F16>
__global__ void __launch_bounds__(kThreads, 1)
    stream_mma_kernel(const float* __restrict__ x, int M, int K, int64_t ldx, const uint16_t* __restrict__ w, int N,
                      float* __restrict__ y, int64_t ldy, int slots, int lanes, bool rotate, int S,
                      float* __restrict__ part, int* __restrict__ counters) {
  constexpr int OUT = MT * 16 * kRows;
  extern __shared__ __align__(128) unsigned char smem[];
  uint16_t* ring = reinterpret_cast<uint16_t*>(smem);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + size_t(slots) * kStageBytes);
  uint64_t* empty = full + slots;
  float* red = reinterpret_cast<float*>(empty + slots);
  float* run = red + 2 * kWarps * OUT;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int T = int(gridDim.x) / S, sl = int(blockIdx.x) % S, t = int(blockIdx.x) / S;
  const int n_groups = (N / kRows - t + T - 1) / T;  // groups t, t + T, ... (T is at most N / kRows)
  const int n_chunks = K / kChunk / S, c0 = sl * n_chunks;  // this block's slice of K
  const int n_stages = n_groups * n_chunks;
  // rotate: block t walks its chunks from t % n_chunks on, so the blocks
  // read different columns of x at once (not all the same lines of L2).
  const int rot = rotate ? t % n_chunks : 0;
  if (threadIdx.x == 0) {
    for (int i = 0; i < slots; ++i) mbar_init(&full[i], 1), mbar_init(&empty[i], kWarps * 32);
    mbar_init_fence();
  }
  __syncthreads();

  if (warp == kWarps) {  // the producer: weights only, so no PDL wait
    // `lanes` lanes issue the stage's row copies (a copy may complete before
    // lane 0's expect_tx: the transaction count may go negative in a phase).
    if (lane >= lanes) return;
    for (int i = 0; i < n_stages; ++i) {
      const int slot = i % slots;
      if (i >= slots) mbar_wait(&empty[slot], uint32_t(i / slots - 1) & 1u);
      const int ci = i / n_groups, j = i - ci * n_groups, c = c0 + (ci + rot) % n_chunks;
      const int64_t row0 = int64_t(t + j * T) * kRows;
      if (lane == 0) mbar_arrive_expect_tx(&full[slot], uint32_t(kRows * kChunk * 2));
      for (int r = lane; r < kRows; r += lanes)
        bulk_copy_g2s(ring + (size_t(slot) * kRows + r) * kPitch, w + (row0 + r) * K + int64_t(c) * kChunk,
                      uint32_t(kChunk * 2), &full[slot]);
    }
    return;
  }

  pdl_wait();
  pdl_launch_dependents();
  const int g = lane >> 2, t4 = lane & 3;  // the fragments' row group and column pair
  // ldmatrix.x4 rows: lanes 0-7 / 8-15 / 16-23 / 24-31 address n 0-7 k 0-7,
  // n 0-7 k 8-15, n 8-15 k 0-7, n 8-15 k 8-15 of a k16 step: b[0], b[1] are
  // the first n8 tile's B fragment, b[2], b[3] the second's.
  const int b_off = ((lane >> 4) * 8 + (lane & 7)) * kPitch + warp * kWarpK + ((lane >> 3) & 1) * 8;
  uint32_t a[kWarpK / 16][MT][4];
  int slot = 0;
  uint32_t phase = 0;
  for (int i = 0; i < n_stages; ++i) {
    const int ci = i / n_groups, j = i - ci * n_groups, c = c0 + (ci + rot) % n_chunks;  // ci-th chunk walked
    if (j == 0) {  // a new chunk: this warp's columns of x, every load of a half in flight before any is used
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        constexpr int KH = kWarpK / 32;  // k16 steps a half
        float2 v[KH][MT][4];
#pragma unroll
        for (int kq = 0; kq < KH; ++kq)
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int m = mt * 16 + g + (e & 1) * 8;
              const int k = c * kChunk + warp * kWarpK + (h * KH + kq) * 16 + 2 * t4 + (e >> 1) * 8;
              v[kq][mt][e] = m < M ? __ldg(reinterpret_cast<const float2*>(x + int64_t(m) * ldx + k))
                                   : make_float2(0.f, 0.f);
            }
#pragma unroll
        for (int kq = 0; kq < KH; ++kq)
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              a[h * KH + kq][mt][e] = uint32_t(f32_to_half<F16>(v[kq][mt][e].x)) |
                                      (uint32_t(f32_to_half<F16>(v[kq][mt][e].y)) << 16);
      }
    }
    float acc[MT][2][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[mt][e / 4][e % 4] = 0.f;
    mbar_wait(&full[slot], phase);
    const uint16_t* st = ring + size_t(slot) * kRows * kPitch + b_off;
#pragma unroll
    for (int kk = 0; kk < kWarpK / 16; ++kk) {
      uint32_t b[4];
      ldmatrix_x4(b, st + kk * 16);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16816<F16>(acc[mt][0], a[kk][mt], b[0], b[1]);
        mma_16816<F16>(acc[mt][1], a[kk][mt], b[2], b[3]);
      }
    }
    mbar_arrive(&empty[slot]);  // each thread releases its own reads
    if (++slot == slots) slot = 0, phase ^= 1u;

    // The warps' sums in order. red alternates between two buffers: a thread
    // rewrites one only after the next barrier, which every thread reaches
    // after reading it.
    float* rb = red + (i & 1) * kWarps * OUT;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        float* p = rb + warp * OUT + (mt * 16 + g) * kRows + nt * 8 + 2 * t4;
        *reinterpret_cast<float2*>(p) = make_float2(acc[mt][nt][0], acc[mt][nt][1]);
        *reinterpret_cast<float2*>(p + 8 * kRows) = make_float2(acc[mt][nt][2], acc[mt][nt][3]);
      }
    asm volatile("bar.sync 1, %0;" ::"n"(kWarps * 32) : "memory");
    const int64_t row0 = int64_t(t + j * T) * kRows;
    for (int o = threadIdx.x; o < OUT; o += kWarps * 32) {  // a thread owns the same outputs every stage
      float s = 0.f;
#pragma unroll
      for (int q = 0; q < kWarps; ++q) s += rb[q * OUT + o];
      float& r = run[j * OUT + o];
      const float v = ci == 0 ? s : r + s;
      const int m = o / kRows;
      if (ci + 1 < n_chunks)
        r = v;
      else if (m < M && S == 1)
        y[int64_t(m) * ldy + row0 + o % kRows] = v;
      else if (m < M)
        part[(int64_t(sl) * M + m) * N + row0 + o % kRows] = v;
    }
  }
  if (S == 1) return;

  // Count this block's groups in, a thread a group (the block's partials
  // written: barrier, then the fence before each atomic publishes them, the
  // one after it orders the other blocks' partials before the merge's loads).
  // The flags reuse red, whose last reads precede the first barrier here.
  int* last = reinterpret_cast<int*>(red);
  for (int q0 = 0; q0 < n_groups; q0 += kWarps * 32) {
    asm volatile("bar.sync 1, %0;" ::"n"(kWarps * 32) : "memory");
    const int q = q0 + int(threadIdx.x);
    int mine = 0;
    if (q < n_groups) {
      int* counter = counters + t + q * T;
      __threadfence();
      mine = atomicAdd(counter, 1) == S - 1;
      __threadfence();
      if (mine) *counter = 0;  // all S have counted: the next launch starts from zero
    }
    last[threadIdx.x] = mine;
    asm volatile("bar.sync 1, %0;" ::"n"(kWarps * 32) : "memory");
    for (int qq = 0; qq < min(kWarps * 32, n_groups - q0); ++qq) {
      if (!last[qq]) continue;
      const int64_t row0 = int64_t(t + (q0 + qq) * T) * kRows;
      for (int o = threadIdx.x; o < M * kRows; o += kWarps * 32) {
        const int m = o / kRows;
        const int64_t at = int64_t(m) * N + row0 + o % kRows;
        float v = 0.f;
        for (int s = 0; s < S; ++s) v += __ldcg(part + int64_t(s) * M * N + at);
        y[int64_t(m) * ldy + row0 + o % kRows] = v;
      }
    }
  }
}

// The split and the shared memory of one launch. S: the smallest divisor of
// the chunk count that gives every block kMinGroups row groups, within the
// partials' scratch and the counters (detail::stream_mma_split() forces one).
constexpr int kMinGroups = 8;
struct MmaPlan {
  int S = 0, T = 0, slots = 0;
  size_t smem = 0;
};

template <int MT>
MmaPlan plan_mma(int64_t M, int64_t K, int64_t N, int sm) {
  const int64_t groups = N / kRows, n_chunks = K / kChunk;
  auto allowed = [&](int64_t d) {
    return n_chunks % d == 0 && d <= sm &&
           (d == 1 || (d * M * N * int64_t(sizeof(float)) <= int64_t(Context::kMmaPartialBytes) &&
                       groups <= Context::kSplitKCounters));
  };
  MmaPlan p;
  const int forced = detail::stream_mma_split();
  if (forced > 0) {
    if (!allowed(forced)) return {};
    p.S = forced;
  } else {
    p.S = 1;
    for (int64_t d = 2; d <= n_chunks && groups * p.S < int64_t(kMinGroups) * sm; ++d)
      if (n_chunks % d == 0) {
        if (!allowed(d)) break;
        p.S = int(d);
      }
  }
  p.T = int(std::min<int64_t>(groups, sm / p.S));
  const int per_block = int(ceil_div(groups, p.T));
  const int run_groups = n_chunks / p.S > 1 ? per_block : 0;  // one chunk a slice: no running sums
  const size_t side = side_bytes<MT>(8, run_groups);  // mbarriers for up to 8 slots
  p.slots = side >= kMaxSmem ? 0 : int(std::min<size_t>(8, (kMaxSmem - side) / kStageBytes));
  p.smem = size_t(p.slots) * kStageBytes + side_bytes<MT>(p.slots, run_groups);
  return p;
}

template <int MT, bool F16>
void launch_mma(const float* x, int64_t M, int64_t K, int64_t ldx, const half_bits* w, int64_t N, float* y,
                int64_t ldy, Stream s) {
  Context& ctx = context();
  const MmaPlan p = plan_mma<MT>(M, K, N, ctx.sm_count);
  auto kernel = stream_mma_kernel<MT, F16>;
  static std::once_flag once;  // one a template instance
  std::call_once(once, [&] {
    AUGUR_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMaxSmem)));
  });
  launch("stream_mma_kernel", kernel, dim3(unsigned(p.S * p.T)), dim3(kThreads), p.smem, s, x, int(M), int(K), ldx,
         w, int(N), y, ldy, p.slots, std::clamp(detail::stream_mma_lanes(), 1, kRows),
         detail::stream_mma_rotate() != 0, p.S, static_cast<float*>(ctx.mma_partials.get()),
         static_cast<int*>(ctx.splitk_counters.get()));
}

}  // namespace

namespace detail {

int& stream_mma_lanes() {
  static int v = [] {
    const char* e = std::getenv("AUGUR_CUDA_MMA_LANES");
    return e == nullptr ? 1 : std::atoi(e);
  }();
  return v;
}

int& stream_mma_rotate() {
  static int v = [] {
    const char* e = std::getenv("AUGUR_CUDA_MMA_ROTATE");
    return e == nullptr ? 0 : std::atoi(e);
  }();
  return v;
}

int& stream_mma_split() {
  static int v = [] {
    const char* e = std::getenv("AUGUR_CUDA_MMA_SPLIT");
    return e == nullptr ? 0 : std::atoi(e);
  }();
  return v;
}

int stream_mma_splits(int64_t M, int64_t K, int64_t N) {
  if (!stream_mma_fits(M, K, N)) return 0;
  const int sm = context().sm_count;
  return M <= 16 ? plan_mma<1>(M, K, N, sm).S : plan_mma<2>(M, K, N, sm).S;
}

bool stream_mma_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("AUGUR_CUDA_STREAM_MMA");
    return e != nullptr && std::atoi(e) != 0;
  }();
  return on;
}

bool stream_mma_fits(int64_t M, int64_t K, int64_t N) {
  if (M < 1 || M > kStreamMmaMaxM || K <= 0 || K % kChunk != 0 || K >= (int64_t(1) << 31) || N <= 0 ||
      N % kRows != 0 || N >= (int64_t(1) << 31))
    return false;
  const int sm = context().sm_count;
  return (M <= 16 ? plan_mma<1>(M, K, N, sm) : plan_mma<2>(M, K, N, sm)).slots >= 2;
}

void stream_mma(const float* x, int64_t M, int64_t K, int64_t ldx, const half_bits* w, Half wt, int64_t N, float* y,
                int64_t ldy, Stream s) {
  if (!stream_mma_fits(M, K, N) || ldx % 2 != 0 || ldx < K || ldy < N || (reinterpret_cast<uintptr_t>(x) & 7) != 0 ||
      !aligned16(w))
    fail("[cuda] stream_mma: M ", M, ", K ", K, ", N ", N, ", ldx ", ldx, " do not fit");
  const bool f16 = wt == Half::F16;
  if (M <= 16)
    f16 ? launch_mma<1, true>(x, M, K, ldx, w, N, y, ldy, s) : launch_mma<1, false>(x, M, K, ldx, w, N, y, ldy, s);
  else
    f16 ? launch_mma<2, true>(x, M, K, ldx, w, N, y, ldy, s) : launch_mma<2, false>(x, M, K, ldx, w, N, y, ldy, s);
}

}  // namespace detail
}  // namespace augur::cuda
