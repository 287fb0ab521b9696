// Skinny GEMM on tensor cores for small decode batches (3 <= M <= 32 rows of
// x): y[m, n] = sum_k x[m, k] w[n, k], x already rounded to the weights'
// 16-bit type (as the cuBLASLt path rounds it), f32 accumulation.
//
// The weights are the A operand of mma.m16n8k16 and the tokens the B operand,
// as the query rows and keys of the prefill attention: a warp owns 16 weight
// rows, the block's 4 warps share one K range and one staged copy of x. A
// stage is 256 k: each warp copies its 16 rows x 512 bytes with cp.async, one
// row's 512 contiguous bytes per instruction (DRAM wants long runs of a row;
// an mma layout read straight from global memory touches 8 rows x 64 bytes a
// load and streamed at ~55%, see gemv.cu), 3 stages in flight. The first two
// stages of weights are requested before the PDL wait (they depend on no
// earlier kernel). Split-K as rows_kernel: the last warp of a tile to arrive
// sums the partials in split order (deterministic, counters left at zero).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "backend/cuda/common.cuh"
#include "backend/cuda/detail.h"

namespace augur::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kKc = 256;                 // k a stage
constexpr int kStages = 3;
constexpr int kStride = kKc + 8;         // halves a smem row (16-byte pad against bank conflicts)
constexpr int kChunks = kKc / 8;         // 16-byte chunks a row and stage (32: one per lane)
static_assert(kChunks == 32, "one 16-byte chunk a lane and row");

// NT: n8 tiles of tokens (2: M <= 16, 4: M <= 32).
template <int NT>
struct TcCfg {
  static constexpr int kTokens = 8 * NT;
  static constexpr int kWTile = 16 * kStride;                         // halves: one warp's stage of weights
  static constexpr int kXTile = kTokens * kStride;                    // halves: the block's stage of x
  static constexpr int kStageHalves = kWarps * kWTile + kXTile;
  static constexpr size_t kSmem = size_t(kStages) * kStageHalves * 2;
  static constexpr int kTileFloats = 16 * kTokens;                    // partial floats a tile
};

// Grid: S * ceil(n_tiles / kWarps) blocks; block b takes K split b % S and
// tiles (b / S) * kWarps + warp of 16 weight rows. xh: [M, K] (row stride
// ldx halves, rows 16-byte aligned); w: [N, K] (K % 8 == 0); y: [M, N] (row
// stride ldy); partials: [S, n_tiles, 32 lanes, 4 * NT]; counters: [n_tiles].
template <int NT, bool F16>
__global__ void __launch_bounds__(kWarps * 32)
    tc_rows_kernel(const uint16_t* __restrict__ xh, int M, int K, int64_t ldx, const uint16_t* __restrict__ w, int N,
                   float* __restrict__ y, int64_t ldy, int S, int kper, float* __restrict__ partials,
                   int* __restrict__ counters) {
  using C = TcCfg<NT>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* smem = reinterpret_cast<uint16_t*>(smem_raw);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const int split = int(blockIdx.x % unsigned(S));
  const int tile = int(blockIdx.x / unsigned(S)) * kWarps + warp;
  const int n_tiles = (N + 15) / 16;
  const bool has_tile = tile < n_tiles;  // a warp without one still stages x
  const int n0 = tile * 16;
  const int k_begin = split * kper, k_end = min(K, k_begin + kper);
  const int n_st = (k_end - k_begin + kKc - 1) / kKc;

  auto w_tile = [&](int st) { return smem + (st % kStages) * C::kStageHalves + warp * C::kWTile; };
  auto x_tile = [&](int st) { return smem + (st % kStages) * C::kStageHalves + kWarps * C::kWTile; };
  // This warp's 16 rows of stage st: instruction r copies row r's 512 bytes.
  auto issue_w = [&](int st) {
    uint16_t* dst = w_tile(st);
    const int k = k_begin + st * kKc + lane * 8;
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const bool valid = has_tile && n0 + r < N && k < k_end;
      const uint16_t* src = valid ? w + int64_t(n0 + r) * K + k : w;
      cp_async16(dst + r * kStride + lane * 8, src, valid);
    }
  };
  // The block's tokens x stage st (rows M.. zero).
  auto issue_x = [&](int st) {
    uint16_t* dst = x_tile(st);
    for (int i = tid; i < C::kTokens * kChunks; i += kWarps * 32) {
      const int m = i / kChunks, c = i % kChunks;
      const int k = k_begin + st * kKc + c * 8;
      const bool valid = m < M && k < k_end;
      cp_async16(dst + m * kStride + c * 8, valid ? xh + int64_t(m) * ldx + k : xh, valid);
    }
  };

  // Group 0: weights of stages 0 and 1 (before the wait) and x of stage 0;
  // group st (st >= 1): x of stage st and weights of stage st + 1. Waiting
  // for group st therefore completes everything stage st reads.
  issue_w(0);
  if (n_st > 1) issue_w(1);
  pdl_wait();
  pdl_launch_dependents();
  issue_x(0);
  cp_async_commit();
  if (n_st > 1) issue_x(1);
  cp_async_commit();

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

  for (int st = 0; st < n_st; ++st) {
    if (st + 2 < n_st) {
      issue_w(st + 2);
      issue_x(st + 2);
    }
    cp_async_commit();
    cp_async_wait<2>();
    __syncthreads();
    const uint16_t* ws = w_tile(st);
    const uint16_t* xs = x_tile(st);
#pragma unroll 4
    for (int kk = 0; kk < kKc / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4(a, ws + (lane & 15) * kStride + kk * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, xs + (np * 16 + (lane >> 4) * 8 + (lane & 7)) * kStride + kk * 16 + ((lane >> 3) & 1) * 8);
        mma_16816<F16>(acc[2 * np], a, b[0], b[1]);
        mma_16816<F16>(acc[2 * np + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();  // stage st's buffers are refilled at iteration st + 1
  }
  cp_async_wait<0>();
  if (!has_tile) return;

  // acc[j][e]: weight row g + 8 (e >> 1), token 8 j + 2 tq + (e & 1).
  auto store = [&](int j, int e, float v) {
    const int r = g + 8 * (e >> 1), m = 8 * j + 2 * tq + (e & 1);
    if (m < M && n0 + r < N) y[int64_t(m) * ldy + n0 + r] = v;
  };
  if (S == 1) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) store(j, e, acc[j][e]);
    return;
  }
  float* mine = partials + ((int64_t(split) * n_tiles + tile) * 32 + lane) * (4 * NT);
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) mine[j * 4 + e] = acc[j][e];
  __threadfence();
  __syncwarp();
  int arrived = 0;
  if (lane == 0) arrived = atomicAdd(&counters[tile], 1);
  arrived = __shfl_sync(0xffffffffu, arrived, 0);
  if (arrived != S - 1) return;
  __threadfence();
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float sum = 0.f;
      for (int s = 0; s < S; ++s)
        sum += __ldcg(partials + ((int64_t(s) * n_tiles + tile) * 32 + lane) * (4 * NT) + j * 4 + e);
      store(j, e, sum);
    }
  if (lane == 0) counters[tile] = 0;
}

// Blocks of 4 tiles; K is split (in whole stages) until there are about
// kBlocksPerSm blocks an SM (one block fits an SM at NT = 4: 152 KB of smem),
// within the Context's partial and counter scratch.
constexpr int kBlocksPerSm = 2;

struct TcPlan {
  int S = 1;
  int kper = 0;
};

TcPlan plan_tc(int64_t K, int64_t N, int64_t tile_floats, int sm_count, int splits) {
  const int64_t n_tiles = ceil_div(N, 16);
  const int64_t blocks = ceil_div(n_tiles, kWarps);
  const int64_t stages = ceil_div(K, kKc);
  int64_t want = splits > 0 ? splits : ceil_div(int64_t(sm_count) * kBlocksPerSm, blocks);
  want = std::clamp<int64_t>(want, 1, stages);
  int64_t kper = ceil_div(stages, want) * kKc;
  int64_t S = ceil_div(K, kper);
  const int64_t max_tiles = int64_t(Context::kSplitKPartialBytes / (tile_floats * sizeof(float)));
  while (S > 1 && (S * n_tiles > max_tiles || n_tiles > Context::kSplitKCounters)) {
    kper *= 2;
    S = ceil_div(K, kper);
  }
  if (S <= 1) return {1, int(K)};
  return {int(S), int(kper)};
}

template <int NT, bool F16>
void launch_tc(const uint16_t* xh, int64_t M, int64_t K, int64_t ldx, const uint16_t* w, int64_t N, float* y,
               int64_t ldy, Stream s, int splits) {
  using C = TcCfg<NT>;
  Context& c = context();
  const TcPlan p = plan_tc(K, N, C::kTileFloats, c.sm_count, splits);
  const int64_t blocks = p.S * ceil_div(ceil_div(N, 16), kWarps);
  if (blocks > int64_t(0x7fffffff)) fail("[cuda] tc skinny matmul: N = ", N, " too large");
  static std::once_flag once;
  std::call_once(once, [] {
    AUGUR_CUDA(cudaFuncSetAttribute(tc_rows_kernel<NT, F16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(C::kSmem)));
  });
  launch("tc_rows_kernel", tc_rows_kernel<NT, F16>, dim3(unsigned(blocks)), dim3(kWarps * 32), C::kSmem, s, xh,
         int(M), int(K), ldx, w, int(N), y, ldy, p.S, p.kper, static_cast<float*>(c.splitk_partials.get()),
         static_cast<int*>(c.splitk_counters.get()));
}

}  // namespace

namespace detail {

bool tc_skinny_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("AUGUR_CUDA_TC_SKINNY");
    return e != nullptr && std::strcmp(e, "1") == 0;
  }();
  return on;
}

bool tc_skinny_fits(int64_t M, int64_t K, int64_t ldx, const void* xh, const void* w, int64_t N) {
  return M >= 1 && M <= kTcSkinnyMaxM && K % 8 == 0 && ldx % 8 == 0 && aligned16(xh) && aligned16(w) &&
         K < (int64_t(1) << 31) && N < (int64_t(1) << 31);
}

int tc_skinny_splits(int64_t M, int64_t K, int64_t N) {
  const int64_t tile_floats = 16 * (M <= 16 ? 16 : 32);
  return plan_tc(K, N, tile_floats, context().sm_count, 0).S;
}

void tc_skinny_matmul(const half_bits* xh, int64_t M, int64_t K, int64_t ldx, const half_bits* w, int64_t N,
                      float* y, int64_t ldy, Stream s, Half wt, int splits) {
  if (M <= 0 || N <= 0) return;
  if (!tc_skinny_fits(M, K, ldx, xh, w, N))
    fail("[cuda] tc skinny matmul: M=", M, " K=", K, " ldx=", ldx, " needs M <= ", kTcSkinnyMaxM,
         ", K and ldx multiples of 8, 16-byte aligned x and w");
  const bool f16 = wt == Half::F16;
  if (M <= 16)
    f16 ? launch_tc<2, true>(xh, M, K, ldx, w, N, y, ldy, s, splits)
        : launch_tc<2, false>(xh, M, K, ldx, w, N, y, ldy, s, splits);
  else
    f16 ? launch_tc<4, true>(xh, M, K, ldx, w, N, y, ldy, s, splits)
        : launch_tc<4, false>(xh, M, K, ldx, w, N, y, ldy, s, splits);
}

}  // namespace detail

}  // namespace augur::cuda
