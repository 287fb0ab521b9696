// Probe for the next form of the decode and verify GEMVs: a skinny GEMM
// (M <= 8 rows of x) on tensor cores whose every output row of y is computed
// by the same instructions in the same order whatever M is, so a row of a
// 1 + k verify step is bit-equal to the one-row decode step's, as it must be
// for speculative greedy output to equal plain greedy output. Not yet used by
// the engine: it reads x already split and bf16 weights, and has no fused
// ends; this program measures the form (bandwidth at M = 1, 2, 5, 8, the bits
// of a row against the row alone, the error against an f64 reference) on the
// Qwen3-8B and Qwen3.5-27B shapes.
//
//   tc_skinny_probe
//
// The form. x is split into P bf16 parts (hi = bf16(x), lo = bf16(x - hi),
// ...): the products of exact bf16 weights with P parts keep about 8P bits of
// x, so P = 2 errs by ~2e-7 of sum |w x| (f32-like), where x rounded to bf16
// errs by ~1e-4. The weights stream through a shared-memory ring by bulk
// copies, one row per copy, 32 rows x 1024 columns a stage (rows dealt to
// the blocks one at a time, so blocks read equal bytes); 8 consumer warps
// each take two 64-column blocks of every stage, and load the next stage's x
// fragments before they wait for this one. At the end of a group of 32 rows
// warp partials are summed in warp order. Every output is sum over warps (in
// order) of the warp's mma chain over its columns (in order): nothing
// depends on M.
//
// Measured and dropped on the way (H200, M = 1, 8B gate_up): ldmatrix from
// rows at a padded pitch of 1024 + 8 halves (conflict-free, but a bulk copy
// whose shared destination is not 128-byte aligned streams ~6% slower:
// 54.1 us, 87.5% of copy, against 48.1 here); the same rows unpadded (ldmatrix
// 8-way bank conflicts: 66.8 us); tensor-map copies with the 128-byte swizzle
// (conflict-free and aligned, but the box reads 128 bytes a row at a time:
// 53.2 us, and 34.3 against 24.2 on 8B down); x loaded at the stage it is
// used instead of a stage ahead (~3.7 us more).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/common.cuh"  // mbarriers, bulk copies, mma

namespace {

using augur::cuda::bulk_copy_g2s;
using augur::cuda::mbar_arrive;
using augur::cuda::mbar_arrive_expect_tx;
using augur::cuda::mbar_init;
using augur::cuda::mbar_init_fence;
using augur::cuda::mbar_wait;
using augur::cuda::pdl_launch_dependents;
using augur::cuda::pdl_wait;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "tc_skinny_probe: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

constexpr int kConsumers = 8, kThreads = (kConsumers + 1) * 32;
constexpr int kMaxRows = 8;  // rows of x (the mma's n)

// Rows at a pitch of KC (every bulk copy 128-byte aligned, as fast as the FMA
// kernel's) and no ldmatrix: lane (g, t) reads 16 bytes of row g with one
// shared load, elements [32h + 8t, +8) of a 64-column block, h = g & 1 first
// and then the other half, so that each load's 8 rows fall in two bank halves
// (4 wavefronts for 512 bytes: no conflict); two selects a word put the halves
// back in order. The mma's k within a block is permuted to fit: mma j of the
// block takes elements 32 (j >> 1) + 8t + 4 (j & 1) + {0, 1} as k = 2t, 2t + 1
// and + {2, 3} as 2t + 8, 2t + 9; x's parts are laid out to match, each lane's
// b0, b1 one 8-byte word: [P][K / 64][4 mma][32 lanes] uint2.
template <int P>
__global__ void split_x(const float* x, int M, int K, __nv_bfloat16* parts) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= kMaxRows * K) return;
  const int m = i / K, k = i % K;
  const int kb = k / 64, within = k % 64, t = (within % 32) / 8, e8 = within % 8;
  const int j = (within / 32) * 2 + e8 / 4, lane = m * 4 + t;
  float v = m < M ? x[size_t(m) * K + k] : 0.f;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    parts[((((size_t(p) * (K / 64) + kb) * 4 + j) * 32 + lane) * 4) + (e8 % 4)] = h;
    v -= __bfloat162float(h);
  }
}

template <int P>
__global__ void __launch_bounds__(kThreads, 1)
    tc_skinny(const __nv_bfloat16* __restrict__ xp, int M, int K, const __nv_bfloat16* __restrict__ w, int N,
                  float* __restrict__ y, int slots) {
  constexpr int R = 32, KC = 1024, kTiles = R / 16, kBlocks = KC / 64 / kConsumers;  // 64-column blocks a warp
  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16* ring = reinterpret_cast<__nv_bfloat16*>(smem);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + size_t(slots) * R * KC * 2);
  uint64_t* empty = full + slots;
  float* red = reinterpret_cast<float*>(empty + slots);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int G = int(gridDim.x), blk = int(blockIdx.x);
  const int n_units = (N - blk + G - 1) / G;
  const int n_groups = (n_units + R - 1) / R, n_chunks = K / KC, n_stages = n_groups * n_chunks;
  if (threadIdx.x == 0) {
    for (int i = 0; i < slots; ++i) mbar_init(&full[i], 1), mbar_init(&empty[i], kConsumers * 32);
    mbar_init_fence();
  }
  __syncthreads();
  if (warp == kConsumers) {
    if (lane != 0) return;
    for (int i = 0; i < n_stages; ++i) {
      const int slot = i % slots;
      if (i >= slots) mbar_wait(&empty[slot], uint32_t(i / slots - 1) & 1u);
      const int u0 = (i / n_chunks) * R, k0 = (i % n_chunks) * KC, rows = min(R, n_units - u0);
      mbar_arrive_expect_tx(&full[slot], uint32_t(rows * KC) * 2u);
      for (int r = 0; r < rows; ++r)
        bulk_copy_g2s(ring + (size_t(slot) * R + r) * KC, w + (size_t(blk) + size_t(G) * (u0 + r)) * K + k0,
                      uint32_t(KC) * 2u, &full[slot]);
    }
    return;
  }
  pdl_wait();
  pdl_launch_dependents();
  const int g = lane >> 2, t = lane & 3;
  const bool odd = (g & 1) != 0;
  const uint2* xw = reinterpret_cast<const uint2*>(xp);
  // x of stage chunk c: this warp's blocks, 4 mma each, P parts.
  auto load_x = [&](int c, uint2 (&b)[kBlocks][4][P]) {
#pragma unroll
    for (int bb = 0; bb < kBlocks; ++bb) {
      const int kb = c * (KC / 64) + warp * kBlocks + bb;
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int p = 0; p < P; ++p)
          b[bb][j][p] = g < M ? __ldg(xw + ((size_t(p) * (K / 64) + kb) * 4 + j) * 32 + lane) : make_uint2(0u, 0u);
    }
  };
  float acc[kTiles][4] = {};
  int slot = 0;
  uint32_t phase = 0;
  auto stage = [&](int i, const uint2 (&cur)[kBlocks][4][P], uint2 (&next)[kBlocks][4][P]) {
    const int c = i % n_chunks;
    if (i + 1 < n_stages) load_x((i + 1) % n_chunks, next);
    mbar_wait(&full[slot], phase);
    {
      const __nv_bfloat16* st = ring + size_t(slot) * R * KC;
#pragma unroll
      for (int bb = 0; bb < kBlocks; ++bb) {
        const int col = (warp * kBlocks + bb) * 64 + 8 * t;
#pragma unroll
        for (int i2 = 0; i2 < kTiles; ++i2) {
          uint32_t q[2][2][4];  // [row g, g + 8][half][word]
#pragma unroll
          for (int rr = 0; rr < 2; ++rr) {
            const __nv_bfloat16* row = st + size_t(i2 * 16 + g + 8 * rr) * KC + col;
            const uint4 first = *reinterpret_cast<const uint4*>(row + (odd ? 32 : 0));
            const uint4 second = *reinterpret_cast<const uint4*>(row + (odd ? 0 : 32));
            const uint32_t f[4] = {first.x, first.y, first.z, first.w}, sc[4] = {second.x, second.y, second.z, second.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) q[rr][0][e] = odd ? sc[e] : f[e], q[rr][1][e] = odd ? f[e] : sc[e];
          }
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const uint32_t a[4] = {q[0][j >> 1][2 * (j & 1)], q[1][j >> 1][2 * (j & 1)], q[0][j >> 1][2 * (j & 1) + 1],
                                   q[1][j >> 1][2 * (j & 1) + 1]};
#pragma unroll
            for (int p = 0; p < P; ++p) augur::cuda::mma_bf16_16816(acc[i2], a, cur[bb][j][p].x, cur[bb][j][p].y);
          }
        }
      }
    }
    mbar_arrive(&empty[slot]);
    if (++slot == slots) slot = 0, phase ^= 1u;
    if (c != n_chunks - 1) return;
    const int gi = i / n_chunks, u0 = gi * R, rows = min(R, n_units - u0);
    float* half = red + size_t(gi & 1) * kConsumers * R * kMaxRows;
    float* mine = half + size_t(warp) * R * kMaxRows;
#pragma unroll
    for (int i2 = 0; i2 < kTiles; ++i2) {
      mine[(i2 * 16 + g) * kMaxRows + 2 * t] = acc[i2][0];
      mine[(i2 * 16 + g) * kMaxRows + 2 * t + 1] = acc[i2][1];
      mine[(i2 * 16 + g + 8) * kMaxRows + 2 * t] = acc[i2][2];
      mine[(i2 * 16 + g + 8) * kMaxRows + 2 * t + 1] = acc[i2][3];
      acc[i2][0] = acc[i2][1] = acc[i2][2] = acc[i2][3] = 0.f;
    }
    asm volatile("bar.sync 1, %0;" ::"n"(kConsumers * 32) : "memory");
    for (int o = int(threadIdx.x); o < R * M; o += kConsumers * 32) {
      const int r = o % R, m = o / R;
      if (r >= rows) continue;
      float sum = 0.f;
      for (int q2 = 0; q2 < kConsumers; ++q2) sum += half[size_t(q2) * R * kMaxRows + r * kMaxRows + m];
      y[size_t(m) * N + blk + size_t(G) * (u0 + r)] = sum;
    }
  };
  uint2 xa[kBlocks][4][P], xb[kBlocks][4][P];
  load_x(0, xa);
  for (int i = 0; i < n_stages; i += 2) {
    stage(i, xa, xb);
    if (i + 1 < n_stages) stage(i + 1, xb, xa);
  }
}

template <int P>
void launch(const __nv_bfloat16* xp, int M, int K, const __nv_bfloat16* w, int N, float* y, int sm_count,
            cudaStream_t s) {
  constexpr int R = 32, KC = 1024, slots = 3;
  const size_t smem = size_t(slots) * R * KC * 2 + 2 * slots * sizeof(uint64_t) + size_t(2 * kConsumers) * R * kMaxRows * 4;
  static bool granted = false;
  if (!granted) {
    check(cudaFuncSetAttribute(tc_skinny<P>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
          "smem attribute");
    granted = true;
  }
  augur::cuda::launch("tc_skinny", tc_skinny<P>, dim3(unsigned(std::min(sm_count, N))), dim3(kThreads), smem, s, xp,
                      M, K, w, N, y, slots);
}

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return uint16_t(u >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <int P>
void measure(const char* name, int N, int K, int sm_count, double copy_gbs) {
  const size_t bytes = size_t(N) * K * 2;
  const int copies = int(std::clamp<size_t>((size_t(1) << 30) / bytes, 2, 64));  // defeat the 60 MB L2
  std::vector<uint16_t> hw(size_t(N) * K);
  std::mt19937 rng(1);
  std::normal_distribution<float> dist_w(0.f, 0.02f), dist_x(0.f, 1.f);
  for (auto& v : hw) v = to_bf16(dist_w(rng));
  std::vector<float> hx(size_t(kMaxRows) * K);
  for (auto& v : hx) v = dist_x(rng);
  __nv_bfloat16 *w, *xp;
  float *x, *y;
  check(cudaMalloc(&w, bytes * copies), "malloc");
  for (int c = 0; c < copies; ++c)
    check(cudaMemcpy(reinterpret_cast<char*>(w) + c * bytes, hw.data(), bytes, cudaMemcpyHostToDevice), "upload");
  check(cudaMalloc(&x, hx.size() * 4), "malloc");
  check(cudaMalloc(&y, size_t(kMaxRows) * N * 4), "malloc");
  check(cudaMalloc(&xp, size_t(P) * kMaxRows * K * 2), "malloc");
  check(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice), "upload");
  cudaStream_t s;
  check(cudaStreamCreate(&s), "stream");
  const unsigned split_blocks = unsigned((kMaxRows * K + 255) / 256);

  // Rows 0, 3 and 6 of an 8-row product against each row alone, bit for bit.
  std::vector<float> y8(size_t(kMaxRows) * N), y1(N);
  split_x<P><<<split_blocks, 256, 0, s>>>(x, kMaxRows, K, xp);
  launch<P>(xp, kMaxRows, K, w, N, y, sm_count, s);
  check(cudaMemcpyAsync(y8.data(), y, y8.size() * 4, cudaMemcpyDeviceToHost, s), "download");
  check(cudaStreamSynchronize(s), "8 rows");
  bool equal = true;
  for (int m = 0; m < kMaxRows; m += 3) {
    split_x<P><<<split_blocks, 256, 0, s>>>(x + size_t(m) * K, 1, K, xp);
    launch<P>(xp, 1, K, w, N, y, sm_count, s);
    check(cudaMemcpyAsync(y1.data(), y, size_t(N) * 4, cudaMemcpyDeviceToHost, s), "download");
    check(cudaStreamSynchronize(s), "one row");
    equal = equal && std::memcmp(y1.data(), y8.data() + size_t(m) * N, size_t(N) * 4) == 0;
  }
  // Error against f64, over sum |w x|; beside it, what x rounded to bf16 would give.
  double err = 0, err_bf16 = 0;
  for (int n = 0; n < N; n += std::max(1, N / 97))
    for (int m = 0; m < kMaxRows; m += 7) {
      double ref = 0, ref_bf16 = 0, mag = 0;
      for (int k = 0; k < K; ++k) {
        const double wv = from_bf16(hw[size_t(n) * K + k]), xv = hx[size_t(m) * K + k];
        ref += wv * xv;
        ref_bf16 += wv * from_bf16(to_bf16(float(xv)));
        mag += std::fabs(wv * xv);
      }
      err = std::max(err, std::fabs(y8[size_t(m) * N + n] - ref) / mag);
      err_bf16 = std::max(err_bf16, std::fabs(ref_bf16 - ref) / mag);
    }
  std::printf("%-24s P %d: rows equal alone %s, error %.1e (x as bf16: %.1e); us (%% of copy):", name, P,
              equal ? "yes" : "NO", err, err_bf16);
  for (int M : {1, 2, 5, 8}) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    check(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "capture");
    for (int c = 0; c < copies; ++c)
      launch<P>(xp, M, K, reinterpret_cast<const __nv_bfloat16*>(reinterpret_cast<const char*>(w) + c * bytes),
                       N, y, sm_count, s);
    check(cudaStreamEndCapture(s, &graph), "capture");
    check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    cudaEvent_t e0, e1;
    check(cudaEventCreate(&e0), "event");
    check(cudaEventCreate(&e1), "event");
    for (int i = 0; i < 3; ++i) check(cudaGraphLaunch(exec, s), "warm-up");
    constexpr int kReps = 10;
    check(cudaEventRecord(e0, s), "event");
    for (int i = 0; i < kReps; ++i) check(cudaGraphLaunch(exec, s), "replay");
    check(cudaEventRecord(e1, s), "event");
    check(cudaEventSynchronize(e1), "replay");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
    const double us = ms * 1e3 / (kReps * copies), gbs = double(bytes) / (us * 1e-6) / 1e9;
    std::printf("  M=%d %.1f (%.1f%%)", M, us, 100.0 * gbs / copy_gbs);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  std::printf("\n");
  cudaFree(w);
  cudaFree(x);
  cudaFree(y);
  cudaFree(xp);
  cudaStreamDestroy(s);
}

double copy_bandwidth() {
  const size_t n = size_t(2) << 30;
  void *a, *b;
  check(cudaMalloc(&a, n), "malloc");
  check(cudaMalloc(&b, n), "malloc");
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  check(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice), "copy");
  check(cudaEventRecord(e0), "event");
  for (int i = 0; i < 5; ++i) check(cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice), "copy");
  check(cudaEventRecord(e1), "event");
  check(cudaEventSynchronize(e1), "copy");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
  cudaFree(a);
  cudaFree(b);
  return 2.0 * double(n) * 5 / (ms * 1e-3) / 1e9;  // read + write
}

}  // namespace
int main() {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::fprintf(stderr, "tc_skinny_probe: no CUDA device\n");
    return 1;
  }
  const double copy_gbs = copy_bandwidth();
  std::printf("%s, %d SMs, copy %.0f GB/s (read + write)\n", prop.name, prop.multiProcessorCount, copy_gbs);
  struct Shape {
    const char* name;
    int N, K;
  };
  const Shape shapes[] = {{"8b qkv 6144x4096", 6144, 4096},           {"8b gate_up 24576x4096", 24576, 4096},
                          {"8b down 4096x12288", 4096, 12288},        {"8b lm_head 151936x4096", 151936, 4096},
                          {"27b in_all 16480x5120", 16480, 5120},     {"27b gate_up 34816x5120", 34816, 5120},
                          {"27b down 5120x17408", 5120, 17408}};
  for (const Shape& sh : shapes) measure<2>(sh.name, sh.N, sh.K, prop.multiProcessorCount, copy_gbs);
  return 0;
}
