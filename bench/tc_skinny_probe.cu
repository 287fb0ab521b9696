// Probe for the next form of the decode and verify GEMVs: a skinny GEMM
// (M <= 8 rows of x) on tensor cores whose every output row of y is computed
// by the same instructions in the same order whatever M is, so a row of a
// 1 + k verify step is bit-equal to the one-row decode step's, as it must be
// for speculative greedy output to equal plain greedy output. Not yet used by
// the engine: it has no fused ends and reads only bf16 weights; this program
// measures the form (bandwidth at M = 1, 2, 5, 8, the bits of a row against
// the row alone, the error against an f64 reference) on the Qwen3-8B and
// Qwen3.5-27B shapes.
//
//   tc_skinny_probe
//
// The form. x is split into P bf16 parts (hi = bf16(x), mid = bf16(x - hi),
// ...): the products of exact bf16 weights with P parts keep about 8P bits of
// x, so P = 2 errs by ~2e-7 of sum |w x| (f32-like), where x rounded to bf16
// errs by ~1e-4. The parts, as mma.m16n8k16's B operand: [P][K / 2][8 rows]
// bf16 pairs (a lane's fragment is one coalesced word), rows >= M zero. The
// weights stream through a shared-memory ring by bulk copies, one row per
// copy, R rows x KC columns a stage (rows dealt to the blocks one at a time,
// so blocks read equal bytes); 8 consumer warps each take KC / 8 columns of
// every stage (ldmatrix A fragments, P mma a 16-row tile) and load the next
// stage's x fragments before they wait for this one; at the end of a group
// of R rows warp partials are summed in warp order. Every output is
// sum over warps (in order) of the warp's mma chain over its columns (in
// order): nothing depends on M.
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

#include "backend/cuda/common.cuh"  // mbarriers, bulk copies, ldmatrix, mma

namespace {

using augur::cuda::bulk_copy_g2s;
using augur::cuda::ldmatrix_x4;
using augur::cuda::mbar_arrive;
using augur::cuda::mbar_arrive_expect_tx;
using augur::cuda::mbar_init;
using augur::cuda::mbar_init_fence;
using augur::cuda::mbar_wait;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "tc_skinny_probe: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

constexpr int kConsumers = 8, kThreads = (kConsumers + 1) * 32;
constexpr int kMaxRows = 8;  // rows of x (the mma's n)

// x: [M, K] f32 -> parts: [P][K / 2][kMaxRows] bf16 pairs, rows >= M zero.
template <int P>
__global__ void split_x(const float* x, int M, int K, __nv_bfloat16* parts) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= kMaxRows * K) return;
  const int m = i / K, k = i % K;
  float v = m < M ? x[size_t(m) * K + k] : 0.f;
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    parts[((size_t(p) * (K / 2) + k / 2) * kMaxRows + m) * 2 + (k & 1)] = h;
    v -= __bfloat162float(h);
  }
}

// y[m, n] = sum_k x[m, k] w[n, k]. xp: split_x's parts; w: [N, K] bf16 (K % KC == 0);
// y: [M, N] f32. smem: slots x [R][KC + 8] bf16 (8 halves of padding: ldmatrix
// reads without bank conflicts), full[slots], empty[slots], red[kConsumers][R][kMaxRows] f32.
template <int R, int P, int KC>
__global__ void __launch_bounds__(kThreads, 1)
    tc_skinny(const __nv_bfloat16* __restrict__ xp, int M, int K, const __nv_bfloat16* __restrict__ w, int N,
              float* __restrict__ y, int slots) {
  static_assert(R % 16 == 0 && KC % (16 * kConsumers) == 0, "tiles of 16 rows, k-steps of 16 a warp");
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kPitch = KC + 8, kTiles = R / 16, kSteps = KC / 16 / kConsumers;
  __nv_bfloat16* ring = reinterpret_cast<__nv_bfloat16*>(smem);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + size_t(slots) * R * kPitch * 2);
  uint64_t* empty = full + slots;
  float* red = reinterpret_cast<float*>(empty + slots);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int G = int(gridDim.x), blk = int(blockIdx.x);
  const int n_units = (N - blk + G - 1) / G;  // this block's rows: blk + G * u
  const int n_groups = (n_units + R - 1) / R, n_chunks = K / KC, n_stages = n_groups * n_chunks;
  if (threadIdx.x == 0) {
    for (int i = 0; i < slots; ++i) mbar_init(&full[i], 1), mbar_init(&empty[i], kConsumers * 32);
    mbar_init_fence();
  }
  __syncthreads();
  if (warp == kConsumers) {  // the producer
    if (lane != 0) return;
    for (int i = 0; i < n_stages; ++i) {
      const int slot = i % slots;
      if (i >= slots) mbar_wait(&empty[slot], uint32_t(i / slots - 1) & 1u);
      const int u0 = (i / n_chunks) * R, k0 = (i % n_chunks) * KC, rows = min(R, n_units - u0);
      mbar_arrive_expect_tx(&full[slot], uint32_t(rows * KC) * 2u);
      for (int r = 0; r < rows; ++r)
        bulk_copy_g2s(ring + (size_t(slot) * R + r) * kPitch, w + (size_t(blk) + size_t(G) * (u0 + r)) * K + k0,
                      uint32_t(KC) * 2u, &full[slot]);
    }
    return;
  }
  // B fragment of lane (g, t): row g of x, k pairs 2t and 2t + 8 of a k-step.
  const int g = lane >> 2, t = lane & 3;
  const uint32_t* xw = reinterpret_cast<const uint32_t*>(xp);
  auto load_x = [&](int c, uint32_t (&b)[kSteps][P][2]) {
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const int k = c * KC + (warp * kSteps + s) * 16 + 2 * t;
#pragma unroll
      for (int p = 0; p < P; ++p) {
        const size_t at = (size_t(p) * (K / 2) + k / 2) * kMaxRows + g;
        b[s][p][0] = g < M ? __ldg(xw + at) : 0u;
        b[s][p][1] = g < M ? __ldg(xw + at + 4 * kMaxRows) : 0u;
      }
    }
  };
  uint32_t b[kSteps][P][2], b_next[kSteps][P][2];
  load_x(0, b);
  int slot = 0;
  uint32_t phase = 0;
  for (int gi = 0; gi < n_groups; ++gi) {
    const int u0 = gi * R, rows = min(R, n_units - u0);
    float acc[kTiles][4] = {};
    for (int c = 0; c < n_chunks; ++c) {
      load_x(c + 1 < n_chunks ? c + 1 : 0, b_next);  // in flight while this stage computes
      mbar_wait(&full[slot], phase);
      const __nv_bfloat16* st = ring + size_t(slot) * R * kPitch;
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        const int kk = (warp * kSteps + s) * 16;
#pragma unroll
        for (int i = 0; i < kTiles; ++i) {
          uint32_t a[4];
          ldmatrix_x4(a, st + size_t(i * 16 + (lane & 15)) * kPitch + kk + (lane >> 4) * 8);
#pragma unroll
          for (int p = 0; p < P; ++p) augur::cuda::mma_bf16_16816(acc[i], a, b[s][p][0], b[s][p][1]);
        }
      }
      mbar_arrive(&empty[slot]);
      if (++slot == slots) slot = 0, phase ^= 1u;
#pragma unroll
      for (int s = 0; s < kSteps; ++s)
#pragma unroll
        for (int p = 0; p < P; ++p) b[s][p][0] = b_next[s][p][0], b[s][p][1] = b_next[s][p][1];
    }
    // acc[i]: rows i*16 + g and i*16 + g + 8 of the group, x rows 2t and 2t + 1.
    float* mine = red + size_t(warp) * R * kMaxRows;
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      mine[(i * 16 + g) * kMaxRows + 2 * t] = acc[i][0];
      mine[(i * 16 + g) * kMaxRows + 2 * t + 1] = acc[i][1];
      mine[(i * 16 + g + 8) * kMaxRows + 2 * t] = acc[i][2];
      mine[(i * 16 + g + 8) * kMaxRows + 2 * t + 1] = acc[i][3];
    }
    asm volatile("bar.sync 1, %0;" ::"n"(kConsumers * 32) : "memory");
    for (int o = int(threadIdx.x); o < R * kMaxRows; o += kConsumers * 32) {
      const int r = o / kMaxRows, m = o % kMaxRows;
      if (m >= M || r >= rows) continue;
      float sum = 0.f;
      for (int q = 0; q < kConsumers; ++q) sum += red[size_t(q) * R * kMaxRows + o];
      y[size_t(m) * N + blk + size_t(G) * (u0 + r)] = sum;
    }
    asm volatile("bar.sync 1, %0;" ::"n"(kConsumers * 32) : "memory");
  }
}

template <int R, int P, int KC>
void launch(const __nv_bfloat16* xp, int M, int K, const __nv_bfloat16* w, int N, float* y, int sm_count,
            cudaStream_t s) {
  const size_t stage = size_t(R) * (KC + 8) * 2;
  const int slots = int(std::min<size_t>(200 * 1024 / stage, 16));
  const size_t smem = slots * stage + 2 * slots * sizeof(uint64_t) + size_t(kConsumers) * R * kMaxRows * 4;
  static bool granted = false;
  if (!granted) {
    check(cudaFuncSetAttribute(tc_skinny<R, P, KC>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
          "smem attribute");
    granted = true;
  }
  tc_skinny<R, P, KC><<<std::min(sm_count, N), kThreads, smem, s>>>(xp, M, K, w, N, y, slots);
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

template <int R, int P, int KC>
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
  launch<R, P, KC>(xp, kMaxRows, K, w, N, y, sm_count, s);
  check(cudaMemcpyAsync(y8.data(), y, y8.size() * 4, cudaMemcpyDeviceToHost, s), "download");
  check(cudaStreamSynchronize(s), "8 rows");
  bool equal = true;
  for (int m = 0; m < kMaxRows; m += 3) {
    split_x<P><<<split_blocks, 256, 0, s>>>(x + size_t(m) * K, 1, K, xp);
    launch<R, P, KC>(xp, 1, K, w, N, y, sm_count, s);
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
  std::printf("%-24s R %d, P %d, KC %d: rows equal alone %s, error %.1e (x as bf16: %.1e); us (%% of copy):", name, R,
              P, KC, equal ? "yes" : "NO", err, err_bf16);
  for (int M : {1, 2, 5, 8}) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    check(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "capture");
    for (int c = 0; c < copies; ++c)
      launch<R, P, KC>(xp, M, K, reinterpret_cast<const __nv_bfloat16*>(reinterpret_cast<const char*>(w) + c * bytes),
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
  for (const Shape& sh : shapes) {
    measure<32, 2, 1024>(sh.name, sh.N, sh.K, prop.multiProcessorCount, copy_gbs);
    measure<32, 3, 1024>(sh.name, sh.N, sh.K, prop.multiProcessorCount, copy_gbs);
  }
  return 0;
}
