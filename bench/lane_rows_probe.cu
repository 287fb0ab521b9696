// Probe for a verify step's skinny GEMM on the FMA units with fewer
// instructions a weight than the stream GEMV (gemv.cu). The stream GEMV holds
// x in registers, so its 256 consumer threads split K and every output is
// summed over a warp's lanes at the end of each group of 4 rows: at M = 5 and
// K = 4096 a thread's share of a row is 16 columns, and the sums of its 20
// outputs cost about as much as a fifth of its products. Here lanes split the
// rows instead: lane (rho, gamma) of a warp owns rows rho + 8i (i < RL) of a
// set of 8 RL rows, for the whole of K, and 4 lanes (gamma) share a row; x
// sits in shared memory and is read by all of them (one wavefront for the 4
// distinct chunks). So a weight costs 5 FFMAs, one conversion, 1/RL of an
// x load a row of x and 1/8 of a weight load; the lanes' sums are done once a
// set (2 shuffles an output over the whole K). Every output is the same
// arithmetic whatever M is: the lane's fmaf chain over its columns in a fixed
// order, the butterfly over gamma, the 8 warps in order.
//
//   lane_rows_probe        (prints, per shape, the stream GEMV and this form
//                           at M = 1 and 5, us and % of copy, and whether a
//                           row of 5 equals the row alone)
//   lane_rows_probe --once (each form once a shape, for ncu)
//   lane_rows_probe --l2   (matrices that stay in L2: the rate the
//                           instructions allow, beyond DRAM's)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/detail.h"

namespace {

using namespace augur::cuda;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "lane_rows_probe: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

constexpr int kConsumers = 8, kThreads = (kConsumers + 1) * 32;

__device__ __forceinline__ void dot8(float& acc, const float (&x)[8], const float (&w)[8]) {
#pragma unroll
  for (int e = 0; e < 8; ++e) acc = fmaf(x[e], w[e], acc);
}

// x: [MR, K] f32 (K % 8 == 0); w: [N, K] half; y: [MR, N] f32.
// Block blk owns units blk + G u; set s is its units s * RS.. (RS = 8 RL
// rows, the last set shorter); a stage is a set's rows x C columns (one bulk
// copy a row, pitch C halves: every copy 128-byte aligned). Warp w takes
// columns [w C / 8, +C / 8) of every stage; lane gamma its chunks of 8 at
// gamma * 8 + 32 j, odd rho walking j in the other order so the 8 lanes of a
// shared-load phase (rho 2p, 2p + 1) read two different 64-byte halves.
template <int MR, int RL, int C, bool F16>
__global__ void __launch_bounds__(kThreads, 1)
    lane_rows(const float* __restrict__ x, int K, const uint16_t* __restrict__ w, int N, float* __restrict__ y,
              int slots) {
  constexpr int RS = 8 * RL, WC = C / kConsumers, J = WC / 32;
  static_assert(J >= 2 && J % 2 == 0, "lane_rows: C / 8 a multiple of 64");
  extern __shared__ __align__(128) unsigned char smem[];
  uint16_t* ring = reinterpret_cast<uint16_t*>(smem);
  float* xs = reinterpret_cast<float*>(ring + size_t(slots) * RS * C);  // [MR][K]
  float* red = xs + size_t(MR) * K;                                     // [2][8][RS * MR]
  uint64_t* full = reinterpret_cast<uint64_t*>(red + 2 * kConsumers * RS * MR);
  uint64_t* empty = full + slots;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int G = int(gridDim.x), blk = int(blockIdx.x);
  const int n_units = (N - blk + G - 1) / G;
  const int n_sets = (n_units + RS - 1) / RS;
  const int n_kc = (K + C - 1) / C;
  if (threadIdx.x == 0) {
    for (int i = 0; i < slots; ++i) mbar_init(&full[i], 1), mbar_init(&empty[i], kConsumers * 32);
    mbar_init_fence();
  }
  __syncthreads();

  if (warp == kConsumers) {  // the producer warp: lane r copies row r of a stage
    for (int i = 0; i < n_sets * n_kc; ++i) {
      const int slot = i % slots, s = i / n_kc, kc = i % n_kc;
      if (i >= slots) mbar_wait(&empty[slot], uint32_t(i / slots - 1) & 1u);
      const int rows = min(RS, n_units - s * RS), len = min(C, K - kc * C);
      if (lane == 0) mbar_arrive_expect_tx(&full[slot], uint32_t(rows * len) * 2u);
      __syncwarp();
      for (int r = lane; r < rows; r += 32)
        bulk_copy_g2s(ring + (size_t(slot) * RS + r) * C,
                      w + (int64_t(blk) + int64_t(G) * (s * RS + r)) * K + int64_t(kc) * C, uint32_t(len) * 2u,
                      &full[slot]);
    }
    return;
  }

  pdl_wait();
  pdl_launch_dependents();
  for (int i = threadIdx.x * 4; i < MR * K; i += kConsumers * 32 * 4)
    *reinterpret_cast<float4*>(xs + i) = __ldg(reinterpret_cast<const float4*>(x + i));
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumers * 32) : "memory");

  const int rho = lane >> 2, gam = lane & 3, flip = rho & 1;
  int slot = 0;
  uint32_t phase = 0;
  for (int s = 0; s < n_sets; ++s) {
    const int rows = min(RS, n_units - s * RS);
    float acc[RL][MR];
#pragma unroll
    for (int i = 0; i < RL; ++i)
#pragma unroll
      for (int m = 0; m < MR; ++m) acc[i][m] = 0.f;
    for (int kc = 0; kc < n_kc; ++kc) {
      const int len = min(C, K - kc * C);
      mbar_wait(&full[slot], phase);
      const uint16_t* st = ring + size_t(slot) * RS * C;
#pragma unroll
      for (int t = 0; t < J; ++t) {
        const int col = warp * WC + gam * 8 + 32 * (t ^ flip);
        if (col < len) {
          float wf[RL][8];
#pragma unroll
          for (int i = 0; i < RL; ++i)
            unpack8<F16>(*reinterpret_cast<const uint4*>(st + (rho + 8 * i) * C + col), wf[i]);
          const float* xc = xs + kc * C + col;
#pragma unroll
          for (int m = 0; m < MR; ++m) {
            const float4 a = *reinterpret_cast<const float4*>(xc + m * K);
            const float4 b = *reinterpret_cast<const float4*>(xc + m * K + 4);
            const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < RL; ++i) dot8(acc[i][m], xv, wf[i]);
          }
        }
      }
      mbar_arrive(&empty[slot]);
      if (++slot == slots) slot = 0, phase ^= 1u;
    }
    // The set's end: the 4 lanes of a row, then the warps in order.
    float* rg = red + (s & 1) * kConsumers * RS * MR;
#pragma unroll
    for (int i = 0; i < RL; ++i)
#pragma unroll
      for (int m = 0; m < MR; ++m) {
        float v = acc[i][m];
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        if (gam == 0) rg[warp * RS * MR + (rho + 8 * i) * MR + m] = v;
      }
    asm volatile("bar.sync 1, %0;" ::"n"(kConsumers * 32) : "memory");
    for (int o = threadIdx.x; o < rows * MR; o += kConsumers * 32) {
      float sum = 0.f;
#pragma unroll
      for (int q = 0; q < kConsumers; ++q) sum += rg[q * RS * MR + o];
      const int r = o / MR, m = o % MR;
      y[int64_t(m) * N + blk + int64_t(G) * (s * RS + r)] = sum;
    }
  }
}

template <int MR, int RL, int C>
void launch_rl(const float* x, int K, const uint16_t* w, int N, float* y, int grid, cudaStream_t s) {
  constexpr int RS = 8 * RL;
  const size_t fixed = size_t(MR) * K * 4 + size_t(2 * kConsumers * RS * MR) * 4 + 64 * 16;
  const size_t stage = size_t(RS) * C * 2;
  const int slots = int(std::min<size_t>((227 * 1024 - fixed) / stage, (160 * 1024) / stage));
  if (slots < 2) {
    std::fprintf(stderr, "lane_rows_probe: K %d does not fit\n", K);
    std::exit(1);
  }
  const size_t smem = size_t(slots) * stage + fixed;
  auto kernel = lane_rows<MR, RL, C, true>;
  static bool granted = false;
  if (!granted) {
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024), "smem attribute");
    granted = true;
  }
  launch("lane_rows", kernel, dim3(unsigned(grid)), dim3(kThreads), smem, s, x, K, w, N, y, slots);
}

// RL from the rows a block gets: as many sets of at most 32 rows as needed,
// each as full as the rows allow.
template <int MR, int C>
void launch_lane_rows(const float* x, int K, const uint16_t* w, int N, float* y, int sm_count, cudaStream_t s) {
  const int grid = std::min(sm_count, N);
  const int units = (N + grid - 1) / grid, sets = (units + 31) / 32, per = (units + sets - 1) / sets;
  const int rl = (per + 7) / 8;
  if (rl <= 1) return launch_rl<MR, 1, C>(x, K, w, N, y, grid, s);
  if (rl == 2) return launch_rl<MR, 2, C>(x, K, w, N, y, grid, s);
  if (rl == 3) return launch_rl<MR, 3, C>(x, K, w, N, y, grid, s);
  launch_rl<MR, 4, C>(x, K, w, N, y, grid, s);
}

uint16_t to_f16(float f) { return __half_raw(__float2half_rn(f)).x; }
float from_f16(uint16_t u) {
  __half_raw r;
  r.x = u;
  return __half2float(__half(r));
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
  return 2.0 * double(n) * 5 / (ms * 1e-3) / 1e9;
}

// Times fn(weights of copy c) over all copies, replayed as one graph.
template <typename Fn>
double time_us(cudaStream_t s, int copies, Fn fn) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "capture");
  for (int c = 0; c < copies; ++c) fn(c);
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
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return ms * 1e3 / (kReps * copies);
}

// l2: the same weights every launch (they stay in L2): what the kernel's
// instructions allow where memory does not limit it.
void measure(const char* name, int N, int K, int sm_count, double copy_gbs, bool once, bool l2) {
  const size_t bytes = size_t(N) * K * 2;
  const int copies = l2 ? 20 : int(std::clamp<size_t>((size_t(1) << 30) / bytes, 2, 64));  // defeat L2
  std::vector<uint16_t> hw(size_t(N) * K);
  std::mt19937 rng(1);
  std::normal_distribution<float> dist_w(0.f, 0.02f), dist_x(0.f, 1.f);
  for (auto& v : hw) v = to_f16(dist_w(rng));
  std::vector<float> hx(size_t(5) * K);
  for (auto& v : hx) v = dist_x(rng);
  uint16_t* w;
  float *x, *y;
  check(cudaMalloc(&w, bytes * copies), "malloc");
  for (int c = 0; c < copies; ++c)
    check(cudaMemcpy(reinterpret_cast<char*>(w) + c * bytes, hw.data(), bytes, cudaMemcpyHostToDevice), "upload");
  check(cudaMalloc(&x, hx.size() * 4), "malloc");
  check(cudaMalloc(&y, size_t(5) * N * 4), "malloc");
  check(cudaMemcpy(x, hx.data(), hx.size() * 4, cudaMemcpyHostToDevice), "upload");
  cudaStream_t s;
  check(cudaStreamCreate(&s), "stream");
  if (once) {  // each form once, for a profiler
    for (int M : {1, 5}) {
      detail::StreamGemv q;
      q.x = x, q.M = M, q.K = K, q.ldx = K, q.w = reinterpret_cast<const half_bits*>(w), q.wt = Half::F16;
      q.N = N, q.y = y, q.ldy = N;
      detail::stream_gemv(q, s);
    }
    launch_lane_rows<1, 512>(x, K, w, N, y, sm_count, s);
    launch_lane_rows<5, 512>(x, K, w, N, y, sm_count, s);
    check(cudaStreamSynchronize(s), "once");
    return;
  }

  // Rows 0 and 3 of the 5-row product against each row alone, bit for bit;
  // the error against f64 over sum |w x|.
  std::vector<float> y5(size_t(5) * N), y1(N);
  launch_lane_rows<5, 512>(x, K, w, N, y, sm_count, s);
  check(cudaMemcpyAsync(y5.data(), y, y5.size() * 4, cudaMemcpyDeviceToHost, s), "download");
  check(cudaStreamSynchronize(s), "5 rows");
  bool equal = true;
  for (int m : {0, 3}) {
    launch_lane_rows<1, 512>(x + size_t(m) * K, K, w, N, y, sm_count, s);
    check(cudaMemcpyAsync(y1.data(), y, size_t(N) * 4, cudaMemcpyDeviceToHost, s), "download");
    check(cudaStreamSynchronize(s), "one row");
    equal = equal && std::memcmp(y1.data(), y5.data() + size_t(m) * N, size_t(N) * 4) == 0;
  }
  double err = 0;
  for (int n = 0; n < N; n += std::max(1, N / 97))
    for (int m = 0; m < 5; m += 2) {
      double ref = 0, mag = 0;
      for (int k = 0; k < K; ++k) {
        const double p = double(from_f16(hw[size_t(n) * K + k])) * hx[size_t(m) * K + k];
        ref += p, mag += std::fabs(p);
      }
      err = std::max(err, std::fabs(y5[size_t(m) * N + n] - ref) / mag);
    }
  std::printf("%-26s rows equal alone %s, error %.1e; us (%% of copy):\n", name, equal ? "yes" : "NO", err);
  auto report = [&](const char* form, double us) {
    std::printf("    %-22s %7.1f (%5.1f%%)\n", form, us, 100.0 * double(bytes) / (us * 1e-6) / 1e9 / copy_gbs);
  };
  auto wc = [&](int c) {
    return reinterpret_cast<const uint16_t*>(reinterpret_cast<const char*>(w) + (l2 ? 0 : c) * bytes);
  };
  for (int M : {1, 5}) {
    auto stream = [&](int c) {
      detail::StreamGemv q;
      q.x = x, q.M = M, q.K = K, q.ldx = K, q.w = reinterpret_cast<const half_bits*>(wc(c)), q.wt = Half::F16;
      q.N = N, q.y = y, q.ldy = N;
      detail::stream_gemv(q, s);
    };
    stream(0);  // the engine's context and the kernel's attribute, outside the capture
    check(cudaStreamSynchronize(s), "stream GEMV");
    report(M == 1 ? "stream GEMV, M=1" : "stream GEMV, M=5", time_us(s, copies, stream));
  }
  report("lane rows C=512, M=1", time_us(s, copies, [&](int c) { launch_lane_rows<1, 512>(x, K, wc(c), N, y, sm_count, s); }));
  report("lane rows C=512, M=5", time_us(s, copies, [&](int c) { launch_lane_rows<5, 512>(x, K, wc(c), N, y, sm_count, s); }));
  report("lane rows C=1024, M=1", time_us(s, copies, [&](int c) { launch_lane_rows<1, 1024>(x, K, wc(c), N, y, sm_count, s); }));
  if (size_t(5) * K * 4 <= 80 * 1024)  // else no room for two 64 KB stages beside x
    report("lane rows C=1024, M=5", time_us(s, copies, [&](int c) { launch_lane_rows<5, 1024>(x, K, wc(c), N, y, sm_count, s); }));
  cudaFree(w);
  cudaFree(x);
  cudaFree(y);
  cudaStreamDestroy(s);
}

// The stream GEMV at widths K that are and are not multiples of its 2048-column
// chunk, from DRAM and from L2 (equal bytes, ~21 MB), and on real shapes from
// DRAM; AUGUR_STREAM_XP: bit 0 the producer warp's lanes issue a stage's
// copies (else its first thread), bit 1 a stage spans two chunks.
__global__ void fill_random(uint16_t* w, size_t n, float* x, size_t nx) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ uint32_t(i >> 32) * 40503u;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    const float v = (float(h & 0xffffu) / 65536.f - 0.5f) * 0.1f;
    w[i] = __half_as_ushort(__float2half_rn(v));
    if (i < nx) x[i] = (float((h >> 16) & 0xffffu) / 65536.f - 0.5f) * 4.f;
  }
}

void scan_one(int N, int K, bool l2, double copy_gbs) {
  const size_t bytes = size_t(N) * K * 2;
  const int copies = l2 ? 20 : int(std::clamp<size_t>((size_t(1) << 30) / bytes, 2, 64));
  uint16_t* w;
  float *x, *y;
  check(cudaMalloc(&w, bytes * copies), "malloc");
  check(cudaMemset(w, 0, bytes * copies), "memset");
  check(cudaMalloc(&x, size_t(5) * K * 4), "malloc");
  check(cudaMemset(x, 0, size_t(5) * K * 4), "memset");
  check(cudaMalloc(&y, size_t(5) * N * 4), "malloc");
  cudaStream_t s;
  check(cudaStreamCreate(&s), "stream");
  fill_random<<<1024, 256, 0, s>>>(w, size_t(N) * K, x, size_t(5) * K);
  auto wc = [&](int c) {
    return reinterpret_cast<const uint16_t*>(reinterpret_cast<const char*>(w) + (l2 ? 0 : c) * bytes);
  };
  // Every variant computes the same bits (only the copies differ).
  std::vector<float> ref(size_t(5) * N), got(size_t(5) * N);
  bool same = true;
  for (int M : {1, 5}) {
    for (const char* xp : {"0", "1", "5", "2", "7"}) {
      setenv("AUGUR_STREAM_XP", xp, 1);
      auto stream = [&](int c) {
        detail::StreamGemv q;
        q.x = x, q.M = M, q.K = K, q.ldx = K, q.w = reinterpret_cast<const half_bits*>(wc(c)), q.wt = Half::F16;
        q.N = N, q.y = y, q.ldy = N;
        detail::stream_gemv(q, s);
      };
      stream(0);
      check(cudaMemcpyAsync(got.data(), y, size_t(M) * N * 4, cudaMemcpyDeviceToHost, s), "download");
      check(cudaStreamSynchronize(s), "stream GEMV");
      if (xp[0] == '0') ref = got;
      same = same && std::memcmp(ref.data(), got.data(), size_t(M) * N * 4) == 0;
      const double us = time_us(s, copies, stream);
      std::printf(" M%d/%s %5.1f %5.1f%%", M, xp, us, 100.0 * double(bytes) / (us * 1e-6) / 1e9 / copy_gbs);
    }
  }
  setenv("AUGUR_STREAM_XP", "0", 1);
  std::printf(" %s\n", same ? "bits equal" : "BITS DIFFER");
  cudaFree(w);
  cudaFree(x);
  cudaFree(y);
  cudaStreamDestroy(s);
}

void kscan(double copy_gbs) {
  for (int K : {2048, 2560, 3072, 3584, 4096, 5120}) {
    const int N = int((size_t(21) << 20) / (size_t(K) * 2) / 528 * 528);
    scan_one(N, K, true, copy_gbs);
  }
  const int shapes[][2] = {{5120, 3072}, {3072, 3072}, {16384, 3072}, {3072, 8192}, {6144, 4096}, {24576, 4096},
                           {4096, 12288}, {151936, 4096}};
  for (const auto& sh : shapes) scan_one(sh[0], sh[1], false, copy_gbs);
}

}  // namespace

int main(int argc, char** argv) {
  const bool once = argc > 1 && std::strcmp(argv[1], "--once") == 0;
  const bool l2 = argc > 1 && std::strcmp(argv[1], "--l2") == 0;
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::fprintf(stderr, "lane_rows_probe: no CUDA device\n");
    return 1;
  }
  const double copy_gbs = copy_bandwidth();
  std::printf("%s, %d SMs, copy %.0f GB/s (read + write)\n", prop.name, prop.multiProcessorCount, copy_gbs);
  struct Shape {
    const char* name;
    int N, K;
  };
  const Shape shapes[] = {{"8b qkv 6144x4096", 6144, 4096},       {"8b o 4096x4096", 4096, 4096},
                          {"8b gate_up 24576x4096", 24576, 4096}, {"8b lm_head 151936x4096", 151936, 4096},
                          {"4b qkv 6144x2560", 6144, 2560},       {"4b gate_up 19456x2560", 19456, 2560},
                          {"27b gate_up 34816x5120", 34816, 5120}};
  if (argc > 1 && std::strcmp(argv[1], "--kscan") == 0) {
    kscan(copy_gbs);
    return 0;
  }
  if (l2) {
    std::printf("weights resident in L2 (%% of copy: the rate against DRAM copy speed)\n");
    const Shape small[] = {{"o 4096x4096", 4096, 4096}, {"2048x4096", 2048, 4096}, {"4b o 2560x4096", 2560, 4096},
                           {"6144x2560", 6144, 2560}};
    for (const Shape& sh : small) measure(sh.name, sh.N, sh.K, prop.multiProcessorCount, copy_gbs, false, true);
    return 0;
  }
  for (const Shape& sh : shapes) measure(sh.name, sh.N, sh.K, prop.multiProcessorCount, copy_gbs, once, false);
  return 0;
}
