// CUDA kernel benchmark: the ceilings (device-to-device copy bandwidth) and
// the kernels of backend/cuda on Qwen3-8B shapes, timed with CUDA events over
// CUDA-graph replays (as decode runs), median of several replays.
//
//   cuda_bench [--quick | --skinny-sweep | --stream-epi [M] | --attention | --tail | --rope | --delta-rule]
//
// --stream-epi M times the stream GEMV's fused ends at M rows of x (default 1;
// 5 is a 1 + 4 verify step's). --delta-rule times the chunked gated delta
// rule of one Gated DeltaNet layer (a prefill's) on Qwen3.5 shapes.
// Weights are rotated over enough copies to defeat the 60 MB L2, as a forward
// pass reads each weight once; attention rotates over 36 layers' caches.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/detail.h"

namespace {

using augur::cuda::bf16_bits;
using augur::cuda::Stream;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "cuda_bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

template <typename T>
struct Buf {
  T* p = nullptr;
  size_t n = 0;
  explicit Buf(size_t count) : n(count) { check(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc"); }
  ~Buf() { cudaFree(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
};

__device__ uint32_t mix(uint64_t i, uint32_t seed) {
  uint64_t z = i * 0x9E3779B97F4A7C15ull + seed;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return uint32_t(z >> 32);
}
// Uniform in [-1, 1): never zeros (zeros run faster on tensor cores than real data).
__global__ void fill_bf16(uint16_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float f = float(mix(i, seed)) * (2.0f / 4294967296.0f) - 1.0f;
    p[i] = uint16_t(__float_as_uint(f) >> 16);
  }
}
__global__ void fill_f32(float* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = float(mix(i, seed)) * (2.0f / 4294967296.0f) - 1.0f;
}
// Fills on the legacy stream, then waits: the ops' stream is non-blocking.
void rand_bf16(uint16_t* p, size_t n, uint32_t seed) {
  fill_bf16<<<2048, 256>>>(p, n, seed);
  check(cudaGetLastError(), "fill_bf16");
  check(cudaDeviceSynchronize(), "fill_bf16");
}
void rand_f32(float* p, size_t n, uint32_t seed) {
  fill_f32<<<2048, 256>>>(p, n, seed);
  check(cudaGetLastError(), "fill_f32");
  check(cudaDeviceSynchronize(), "fill_f32");
}

// Median time (ms) of one replay of a graph capturing body(s).
double time_graph(const std::function<void(Stream)>& body, int reps = 7) {
  Stream s = augur::cuda::stream();
  body(s);  // warm-up outside capture (kernel attributes, cuBLASLt heuristics, scratch)
  check(cudaStreamSynchronize(s), "warm-up");
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "begin capture");
  body(s);
  check(cudaStreamEndCapture(s, &graph), "end capture");
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  check(cudaGraphLaunch(exec, s), "replay");
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    check(cudaEventRecord(a, s), "record");
    check(cudaGraphLaunch(exec, s), "replay");
    check(cudaEventRecord(b, s), "record");
    check(cudaEventSynchronize(b), "sync");
    float t = 0;
    check(cudaEventElapsedTime(&t, a, b), "elapsed");
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

__global__ void copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

// Device-to-device copy of 2 GiB, bytes read + written per second (GB/s):
// cudaMemcpyAsync outside a graph (a graph's memcpy node may take the copy
// engines, which are slower), and a plain 16-byte copy kernel. The larger is the ceiling.
double copy_bandwidth() {
  const size_t bytes = size_t(2) << 30;
  Buf<char> src(bytes), dst(bytes);
  check(cudaMemset(src.p, 1, bytes), "memset");
  check(cudaDeviceSynchronize(), "memset");
  Stream s = augur::cuda::stream();
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  std::vector<double> ms;
  for (int r = 0; r < 8; ++r) {
    check(cudaEventRecord(a, s), "record");
    check(cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice, s), "copy");
    check(cudaEventRecord(b, s), "record");
    check(cudaEventSynchronize(b), "sync");
    float t = 0;
    check(cudaEventElapsedTime(&t, a, b), "elapsed");
    if (r > 0) ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  const double memcpy_gbs = 2.0 * double(bytes) / (ms[ms.size() / 2] * 1e-3) / 1e9;
  const double kernel_ms = time_graph([&](Stream st) {
    copy_kernel<<<132 * 16, 256, 0, st>>>(reinterpret_cast<const uint4*>(src.p), reinterpret_cast<uint4*>(dst.p),
                                          bytes / 16);
  });
  const double kernel_gbs = 2.0 * double(bytes) / (kernel_ms * 1e-3) / 1e9;
  std::printf("copy bandwidth (2 GiB D2D, read+write): cudaMemcpyAsync %.0f GB/s, copy kernel %.0f GB/s\n", memcpy_gbs,
              kernel_gbs);
  return std::max(memcpy_gbs, kernel_gbs);
}

struct Shape {
  const char* name;
  int64_t N, K;
};
const Shape kShapes[] = {{"q/o 4096x4096", 4096, 4096},
                         {"k/v 1024x4096", 1024, 4096},
                         {"gate/up 12288x4096", 12288, 4096},
                         {"down 4096x12288", 4096, 12288},
                         {"lm_head 151936x4096", 151936, 4096},
                         {"qkv fused 6144x4096", 6144, 4096},
                         {"gate_up fused 24576x4096", 24576, 4096}};

enum class Path { Dispatch, Skinny, Lt };

// ms per launch over rotated copies of the weights. Dispatch: matmul_bf16 (f32
// x); Skinny: the skinny kernel with `splits`; Lt: cuBLASLt on bf16 x.
double skinny_ms(const Shape& sh, int64_t M, Path path, int splits, uint16_t* w, int copies, const float* x,
                 const uint16_t* xb, float* y) {
  const size_t wn = size_t(sh.N * sh.K);
  const double ms = time_graph([&](Stream s) {
    for (int c = 0; c < copies; ++c) {
      const uint16_t* wc = w + size_t(c) * wn;
      if (path == Path::Lt)
        augur::cuda::detail::lt_matmul(xb, M, sh.K, wc, sh.N, y, sh.N, s);
      else if (path == Path::Skinny)
        augur::cuda::detail::skinny_matmul(x, M, sh.K, sh.K, wc, sh.N, y, sh.N, s, splits);
      else
        augur::cuda::matmul_bf16(x, M, sh.K, sh.K, wc, sh.N, y, sh.N, s);
    }
  });
  return ms / copies;
}

// Batched-decode matmuls (M = 8..256 rows, what a server's decode steps
// run): cuBLASLt on x already in the weights' type, and matmul_bf16 (the
// engine's dispatch: the stream kernel up to 8 rows, else x converted, then
// cuBLASLt), us and % of the copy ceiling for the weights' bytes; then the
// heuristic's first eight algorithms, to see whether its first is the best.
void lt_sweep(double bw) {
  const size_t rot_bytes = size_t(1) << 30;
  Buf<float> x(size_t(256) * 12288), y(size_t(256) * 151936);
  Buf<uint16_t> xb(size_t(256) * 12288);
  rand_f32(x.p, x.n, 1);
  rand_bf16(xb.p, xb.n, 2);
  std::printf("== batched decode matmuls: us (%% of copy), cuBLASLt on bf16 x | matmul_bf16 ==\n");
  for (const Shape& sh : kShapes) {
    const size_t bytes = size_t(sh.N * sh.K) * 2;
    const int copies = int(std::clamp<size_t>(rot_bytes / bytes, 2, 64));
    Buf<uint16_t> w(size_t(copies) * size_t(sh.N * sh.K));
    rand_bf16(w.p, w.n, 3);
    std::printf("%-26s", sh.name);
    for (int64_t M : {8, 16, 32, 64, 128, 256}) {
      const double lt = skinny_ms(sh, M, Path::Lt, 0, w.p, copies, x.p, xb.p, y.p);
      const double d = skinny_ms(sh, M, Path::Dispatch, 0, w.p, copies, x.p, xb.p, y.p);
      std::printf(" | M%ld %.1f (%.0f%%) %.1f", long(M), lt * 1e3, 100.0 * double(bytes) / (lt * 1e-3) / 1e9 / bw,
                  d * 1e3);
    }
    std::printf("\n  heuristic results 0..7 at M = 32 / 64 / 128, us:");
    for (int64_t M : {32, 64, 128}) {
      std::printf("\n   M%ld", long(M));
      for (int algo = 0; algo < 8; ++algo) {
        bool ok = true;
        const double ms = time_graph([&](Stream s) {
                            for (int c = 0; c < copies; ++c)
                              ok = augur::cuda::detail::lt_matmul(xb.p, M, sh.K, w.p + size_t(c) * size_t(sh.N * sh.K),
                                                                  sh.N, y.p, sh.N, s, algo) && ok;
                          }) /
                          copies;
        if (!ok) break;
        std::printf(" %.1f", ms * 1e3);
      }
    }
    std::printf("\n");
  }
}

// Decode matmul shapes of both benchmark models at M = 1: rows_kernel at
// its automatic split and a range of forced ones, and the stream GEMV (which
// matmul_bf16 takes where every SM gets a stage's rows). Prints us and GB/s
// of weights.
void skinny_sweep(double bw) {
  const Shape shapes[] = {{"8b qkv 6144x4096", 6144, 4096},         {"8b o 4096x4096", 4096, 4096},
                          {"8b gate_up 24576x4096", 24576, 4096},    {"8b down 4096x12288", 4096, 12288},
                          {"27b in_all 16480x5120", 16480, 5120},    {"27b attn qkv 14336x5120", 14336, 5120},
                          {"27b out/o 5120x6144", 5120, 6144},       {"27b gate_up 34816x5120", 34816, 5120},
                          {"27b down 5120x17408", 5120, 17408},      {"27b lm_head 248320x5120", 248320, 5120}};
  Buf<float> x(size_t(2) * 17408), y(size_t(2) * 248320);
  rand_f32(x.p, x.n, 1);
  std::printf("== skinny sweep, M = 1: us (GB/s): rows_kernel by split, and the stream GEMV ==\n");
  for (const Shape& sh : shapes) {
    const size_t bytes = size_t(sh.N * sh.K) * 2;
    const int copies = int(std::clamp<size_t>((size_t(1) << 30) / bytes, 2, 64));
    Buf<uint16_t> w(size_t(copies) * size_t(sh.N * sh.K));
    rand_bf16(w.p, w.n, 3);
    const int auto_s = augur::cuda::detail::skinny_splits(1, sh.K, sh.N);
    std::printf("%-26s auto split %d\n  rows_kernel:", sh.name, auto_s);
    for (int sp : {auto_s, 1, 2, 3, 4, 6, 8}) {
      const double ms = skinny_ms(sh, 1, Path::Skinny, sp, w.p, copies, x.p, nullptr, y.p);
      std::printf("  S%d%s %.1f (%.0f)", sp, sp == auto_s ? " (auto)" : "", ms * 1e3, double(bytes) / (ms * 1e-3) / 1e9);
    }
    const double ms = time_graph([&](Stream s) {
                        for (int c = 0; c < copies; ++c) {
                          augur::cuda::detail::StreamGemv q;
                          q.x = x.p, q.M = 1, q.K = sh.K, q.ldx = sh.K, q.w = w.p + size_t(c) * size_t(sh.N * sh.K);
                          q.N = sh.N, q.y = y.p, q.ldy = sh.N;
                          augur::cuda::detail::stream_gemv(q, s);
                        }
                      }) /
                      copies;
    std::printf("\n  stream: %.1f (%.0f)\n", ms * 1e3, double(bytes) / (ms * 1e-3) / 1e9);
  }
  std::printf("(copy ceiling %.0f GB/s)\n\n", bw);
}

// The stream GEMV's fused ends (detail::StreamGemv) against the plain one on
// the decode tail's shapes, M = 1: us (GB/s of weights). "swiglu F+64" moves
// the up rows 64 rows further from the gate rows (an address-aliasing check).
void stream_epi_sweep(double bw, int64_t M) {
  using augur::cuda::detail::StreamEpi;
  using augur::cuda::detail::StreamGemv;
  struct EpiShape {
    const char* name;
    int64_t N, K;
    bool gate_up;
  };
  const EpiShape shapes[] = {{"8b qkv 6144x4096", 6144, 4096, false},      {"8b o 4096x4096", 4096, 4096, false},
                             {"8b gate_up 24576x4096", 24576, 4096, true}, {"8b down 4096x12288", 4096, 12288, false},
                             {"27b in_all 16480x5120", 16480, 5120, false}, {"27b gate_up 34816x5120", 34816, 5120, true},
                             {"27b down 5120x17408", 5120, 17408, false}};
  std::printf("== stream GEMV ends, M = %ld: us (GB/s) ==\n", long(M));
  Buf<float> x(size_t(M) * 17408), g(size_t(17408)), y(size_t(M) * 40000), y2(size_t(M) * 40000);
  rand_f32(x.p, x.n, 1);
  rand_f32(g.p, g.n, 2);
  for (const EpiShape& sh : shapes) {
    const int64_t pad = sh.gate_up ? 128 : 0;  // room for the F+64 layout
    const size_t wn = size_t((sh.N + pad) * sh.K), bytes = size_t(sh.N * sh.K) * 2;
    const int copies = int(std::clamp<size_t>((size_t(1) << 30) / bytes, 2, 64));
    Buf<uint16_t> w(size_t(copies) * wn);
    rand_bf16(w.p, w.n, 3);
    auto time = [&](StreamEpi epi, bool norm, int64_t N) {
      return time_graph([&](Stream s) {
               for (int c = 0; c < copies; ++c) {
                 StreamGemv q;
                 q.x = x.p, q.M = M, q.K = sh.K, q.ldx = sh.K, q.w = w.p + size_t(c) * wn, q.N = N;
                 q.y = y.p, q.ldy = epi == StreamEpi::SwiGLU ? N / 2 : N, q.epi = epi, q.norm = norm, q.g = g.p;
                 q.eps = 1e-6f;
                 if (epi == StreamEpi::Accumulate) q.y2 = y2.p;
                 augur::cuda::detail::stream_gemv(q, s);
               }
             }) /
             copies;
    };
    auto show = [&](const char* what, double ms) {
      std::printf("  %s %.1f (%.0f)", what, ms * 1e3, double(bytes) / (ms * 1e-3) / 1e9);
    };
    std::printf("%-24s", sh.name);
    show("plain", time(StreamEpi::Store, false, sh.N));
    show("norm", time(StreamEpi::Store, true, sh.N));
    if (sh.gate_up) {
      show("norm+swiglu", time(StreamEpi::SwiGLU, true, sh.N));
      show("swiglu F+64", time(StreamEpi::SwiGLU, true, sh.N + 128));
      show("plain again", time(StreamEpi::Store, false, sh.N));
    } else {
      show("accumulate", time(StreamEpi::Accumulate, false, sh.N));
    }
    std::printf("\n");
  }
  std::printf("(copy ceiling %.0f GB/s)\n\n", bw);
}

// The end of a decoder block at decode (w_out, add + norm, gate/up, SwiGLU,
// down) as the unfused kernels and as block_tail (stream GEMVs with fused
// ends), over rotated copies of a layer's weights: us a layer and GB/s of weights.
void tail_sweep(double bw) {
  struct TailShape {
    const char* name;
    int64_t Ka, D, F;
  };
  const TailShape shapes[] = {{"qwen3-8b", 4096, 4096, 12288}, {"qwen3.5-27b attn", 6144, 5120, 17408}};
  using augur::cuda::Half;
  std::printf("== decode tail (w_out, add+norm, gate/up, swiglu, down): us a layer (GB/s of weights) ==\n");
  for (const TailShape& sh : shapes) {
    const size_t n_wo = size_t(sh.D * sh.Ka), n_gu = size_t(2 * sh.F * sh.D), n_dn = size_t(sh.D * sh.F);
    const size_t per = n_wo + n_gu + n_dn, bytes = per * 2;
    const int copies = int(std::clamp<size_t>((size_t(3) << 30) / bytes, 2, 64));
    Buf<uint16_t> w(size_t(copies) * per);
    rand_bf16(w.p, w.n, 5);
    Buf<float> a(size_t(8) * sh.Ka), x(size_t(8) * sh.D), g(size_t(sh.D)), o(size_t(8) * sh.D), h(size_t(8) * sh.D);
    Buf<float> gu(size_t(8) * 2 * sh.F), act(size_t(8) * sh.F), out(size_t(8) * sh.D);
    rand_f32(a.p, a.n, 6);
    rand_f32(x.p, x.n, 7);
    rand_f32(g.p, g.n, 8);
    for (int64_t M : {1, 2, 3, 5, 8}) {
      if (!augur::cuda::block_tail_fits(M, sh.Ka, sh.D, sh.F)) continue;
      auto layer = [&](int c, Stream s, bool fused) {
        const uint16_t* wo = w.p + size_t(c) * per;
        const uint16_t* wgu = wo + n_wo;
        const uint16_t* wdn = wgu + n_gu;
        if (fused) {
          augur::cuda::BlockTail t;
          t.a = a.p, t.M = M, t.Ka = sh.Ka, t.D = sh.D, t.F = sh.F, t.w_out = wo, t.x = x.p, t.g = g.p;
          t.eps = 1e-6f, t.gate_up = wgu, t.down = wdn, t.act = act.p, t.out = out.p;
          augur::cuda::block_tail(t, s);
          return;
        }
        augur::cuda::matmul_half(a.p, M, sh.Ka, sh.Ka, wo, Half::BF16, sh.D, o.p, sh.D, s);
        augur::cuda::add_rms_norm(x.p, o.p, g.p, 1e-6f, M, sh.D, h.p, s);
        augur::cuda::matmul_half(h.p, M, sh.D, sh.D, wgu, Half::BF16, 2 * sh.F, gu.p, 2 * sh.F, s);
        augur::cuda::swiglu_matmul(gu.p, M, sh.F, wdn, Half::BF16, sh.D, act.p, out.p, s);
      };
      auto time = [&](bool fused) {
        return time_graph([&](Stream s) {
                 for (int c = 0; c < copies; ++c) layer(c, s, fused);
               }) /
               copies;
      };
      auto show = [&](const char* what, double ms) {
        std::printf("  %s %.1f (%.0f, %.1f%%)", what, ms * 1e3, double(bytes) / (ms * 1e-3) / 1e9,
                    100.0 * double(bytes) / (ms * 1e-3) / 1e9 / bw);
      };
      std::printf("%-18s M=%ld %.0f MB:", sh.name, long(M), double(bytes) / 1e6);
      show("unfused", time(false));
      show("block_tail", time(true));
      std::printf("\n");
    }
  }
  std::printf("(copy ceiling %.0f GB/s)\n\n", bw);
}

// The fused RoPE decode attention (decode_attention_rope: qkv_rope_store's
// work inside the tensor-core decode kernel) against qkv_rope_store +
// paged_attention, batch 1, Qwen3-8B heads, over 36 layers' caches: us a layer.
void rope_attention_sweep() {
  using augur::cuda::Half;
  const int64_t n_head = 32, n_kv = 8, D = 128, bs = 16, layers = 36, half = 64;
  const int64_t width = (n_head + 2 * n_kv) * D;
  const float scale = 1.0f / std::sqrt(float(D));
  std::printf("== fused RoPE decode attention, batch 1: us a layer (separate = qkv_rope_store + paged_attention) ==\n");
  Buf<float> qkv{size_t(width)}, q{size_t(n_head * D)}, out{size_t(n_head * D)}, gains{size_t(2 * D)},
      freq{size_t(half)};
  rand_f32(qkv.p, qkv.n, 21);
  rand_f32(gains.p, gains.n, 22);
  rand_f32(freq.p, freq.n, 23);
  for (int64_t ctx : {128, 1024, 2048, 8192}) {
    const int64_t max_ctx = 8192, blocks = (max_ctx + bs - 1) / bs;
    const size_t cache_elems = size_t(blocks * bs * n_kv * D);
    Buf<uint16_t> kc(cache_elems * size_t(layers)), vc(cache_elems * size_t(layers));
    rand_bf16(kc.p, kc.n, 24);
    rand_bf16(vc.p, vc.n, 25);
    std::vector<int32_t> table(static_cast<size_t>(blocks));
    std::iota(table.begin(), table.end(), 0);
    const int32_t p = int32_t(ctx - 1), slot = table[size_t(p / bs)] * int32_t(bs) + p % int32_t(bs), row = 0;
    Buf<int32_t> dtable(table.size()), dpos(1), dslot(1), drow(1);
    check(cudaMemcpy(dtable.p, table.data(), table.size() * 4, cudaMemcpyHostToDevice), "upload");
    check(cudaMemcpy(dpos.p, &p, 4, cudaMemcpyHostToDevice), "upload");
    check(cudaMemcpy(dslot.p, &slot, 4, cudaMemcpyHostToDevice), "upload");
    check(cudaMemcpy(drow.p, &row, 4, cudaMemcpyHostToDevice), "upload");
    augur::cuda::AttnMeta meta;
    meta.positions = dpos.p, meta.slot_mapping = dslot.p, meta.token_row = drow.p, meta.block_tables = dtable.p;
    meta.max_blocks = int32_t(blocks), meta.n_tokens = 1, meta.max_context = int32_t(max_ctx), meta.max_row_tokens = 1;
    Buf<char> ws(augur::cuda::attention_workspace_bytes(1, n_head, D, max_ctx));
    auto time = [&](bool fused) {
      return time_graph([&](Stream s) {
               for (int64_t l = 0; l < layers; ++l) {
                 uint16_t* k = kc.p + size_t(l) * cache_elems;
                 uint16_t* v = vc.p + size_t(l) * cache_elems;
                 if (fused) {
                   augur::cuda::decode_attention_rope(qkv.p, gains.p, gains.p + D, 1e-6f, freq.p, half, k, v, bs,
                                                      n_head, n_kv, D, meta, scale, 0, out.p, ws.p, s, Half::BF16);
                 } else {
                   augur::cuda::qkv_rope_store(qkv.p, n_head, n_kv, D, gains.p, gains.p + D, 1e-6f, freq.p, half, meta,
                                               q.p, k, v, s, Half::BF16);
                   augur::cuda::paged_attention(q.p, k, v, bs, n_head, n_kv, D, meta, scale, 0, out.p, ws.p, s,
                                                Half::BF16);
                 }
               }
             }) *
             1e3 / double(layers);
    };
    const double sep = time(false), fused = time(true);
    std::printf("ctx %5ld: separate %.2f, fused %.2f\n", long(ctx), sep, fused);
  }
  std::printf("\n");
}

// An affine map of fill_f32's values onto [lo, hi).
__global__ void to_range(float* p, size_t n, float lo, float hi) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = lo + (hi - lo) * 0.5f * (p[i] + 1.0f);
}
void rand_range(float* p, size_t n, uint32_t seed, float lo, float hi) {
  rand_f32(p, n, seed);
  to_range<<<2048, 256>>>(p, n, lo, hi);
  check(cudaDeviceSynchronize(), "to_range");
}

// One layer's chunked delta rule over a prompt of T tokens (one row, chunks
// of 64), as a prefill runs it: time and the tokens a second it allows.
void delta_rule_sweep() {
  struct DeltaShape {
    const char* name;
    int64_t n_head_k, n_head, dk, dv;
  };
  const DeltaShape shapes[] = {{"7B hybrid (16 k / 32 v heads)", 16, 32, 128, 128},
                               {"Qwen3.5-27B (16 k / 48 v heads)", 16, 48, 128, 128}};
  std::printf("== chunked gated delta rule, one layer, one row, chunks of 64 ==\n");
  std::printf("%-34s %6s %10s %12s\n", "shape", "T", "us", "tok/s");
  for (const DeltaShape& sh : shapes)
    for (int64_t T : {2048, 16384}) {
      Buf<float> q(size_t(T * sh.n_head_k * sh.dk)), k(q.n), v(size_t(T * sh.n_head * sh.dv)), out(v.n);
      Buf<float> g(size_t(T * sh.n_head)), beta(g.n), state(size_t(sh.n_head * sh.dk * sh.dv));
      rand_range(q.p, q.n, 1, -0.09f, 0.09f);  // about unit rows, as after the l2norm
      rand_range(k.p, k.n, 2, -0.09f, 0.09f);
      rand_f32(v.p, v.n, 3);
      rand_range(g.p, g.n, 4, -0.2f, -0.001f);
      rand_range(beta.p, beta.n, 5, 0.05f, 0.95f);
      rand_range(state.p, state.n, 6, -0.1f, 0.1f);
      Buf<augur::cuda::RecurrentRow> row(1);
      const augur::cuda::RecurrentRow host{0, int32_t(T), 0};
      check(cudaMemcpy(row.p, &host, sizeof host, cudaMemcpyHostToDevice), "row");
      const augur::cuda::DeltaRuleDims dims{sh.n_head_k, sh.n_head, sh.dk, sh.dv};
      const double ms = time_graph([&](Stream s) {
        augur::cuda::gated_delta_rule_chunked(q.p, k.p, v.p, g.p, beta.p, 0.088f, 64, dims, row.p, 1, T, state.p,
                                              out.p, s);
      });
      std::printf("%-34s %6lld %10.1f %12.0f\n", sh.name, (long long)T, ms * 1e3, double(T) / (ms * 1e-3));
    }
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (!augur::cuda::available()) {
    std::fprintf(stderr, "cuda_bench: no CUDA device\n");
    return 1;
  }
  augur::cuda::context();
  cudaDeviceProp prop;
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  std::printf("device: %s, %d SMs, L2 %d MB, %.0f GB memory\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20, double(prop.totalGlobalMem) / 1e9);

  const double bw = copy_bandwidth();
  std::printf("ceiling: %.0f GB/s\n\n", bw);
  const bool attention_only = argc > 1 && std::strcmp(argv[1], "--attention") == 0;
  if (argc > 1 && std::strcmp(argv[1], "--stream-epi") == 0) {
    stream_epi_sweep(bw, argc > 2 ? std::atoi(argv[2]) : 1);
    return 0;
  }
  if (argc > 1 && std::strcmp(argv[1], "--lt-sweep") == 0) {
    lt_sweep(bw);
    return 0;
  }
  if (argc > 1 && std::strcmp(argv[1], "--skinny-sweep") == 0) {
    skinny_sweep(bw);
    return 0;
  }
  if (argc > 1 && std::strcmp(argv[1], "--rope") == 0) {
    rope_attention_sweep();
    return 0;
  }
  if (argc > 1 && std::strcmp(argv[1], "--delta-rule") == 0) {
    delta_rule_sweep();
    return 0;
  }
  if (argc > 1 && std::strcmp(argv[1], "--tail") == 0) {
    tail_sweep(bw);
    return 0;
  }

  double fused_us = 0;  // batch-1 matmuls of a token (skinny section), for the attention estimate
  if (!attention_only) {
    // ---- skinny GEMM (decode) ----
    const size_t rot_bytes = size_t(1) << 30;
    Buf<float> x(size_t(16) * 12288), y(size_t(2048) * 151936);
    Buf<uint16_t> xb(size_t(2048) * 12288);
    rand_f32(x.p, x.n, 1);
    rand_bf16(xb.p, xb.n, 2);
    std::printf(
        "== decode matmuls (matmul_bf16: skinny kernel M <= 2, cuBLASLt + x->bf16 above), weight bytes / time ==\n");
    std::printf("%-26s %3s %6s %9s %8s %6s\n", "shape", "M", "splits", "us", "GB/s", "%copy");
    double layer_us = 0, lm_head_us = 0, fused_layer_us = 0;
    for (const Shape& sh : kShapes) {
      const size_t bytes = size_t(sh.N * sh.K) * 2;
      const int copies = int(std::clamp<size_t>(rot_bytes / bytes, 2, 64));
      Buf<uint16_t> w(size_t(copies) * size_t(sh.N * sh.K));
      rand_bf16(w.p, w.n, 3);
      auto row = [&](int64_t M, const char* splits, double ms, const char* note) {
        const double gbs = double(bytes) / (ms * 1e-3) / 1e9;
        std::printf("%-26s %3ld %6s %9.2f %8.0f %5.1f%%%s\n", sh.name, long(M), splits, ms * 1e3, gbs, 100.0 * gbs / bw,
                    note);
      };
      for (int64_t M : {1, 2, 3, 4, 5, 8, 16}) {
        if (quick && M != 1) continue;
        const int auto_s =
            M <= augur::cuda::detail::kSkinnyMaxM ? augur::cuda::detail::skinny_splits(M, sh.K, sh.N) : 0;
        const double ms = skinny_ms(sh, M, Path::Dispatch, 0, w.p, copies, x.p, xb.p, y.p);
        row(M, auto_s > 0 ? std::to_string(auto_s).c_str() : "-", ms, "");
        if (M == 1) {
          const double us = ms * 1e3;
          if (sh.N == 151936)
            lm_head_us = us;
          else if (sh.N == 4096 && sh.K == 4096)
            layer_us += 2 * us, fused_layer_us += us;  // q, o | o
          else if (sh.N == 1024)
            layer_us += 2 * us;  // k, v
          else if (sh.N == 12288)
            layer_us += 2 * us;  // gate, up
          else if (sh.N == 6144 || sh.N == 24576)
            fused_layer_us += us;  // qkv, gate_up
          else
            layer_us += us, fused_layer_us += us;  // down
          if (!quick && auto_s > 1)
            for (int sp : {std::max(1, auto_s / 2), auto_s * 2})
              row(M, std::to_string(sp).c_str(), skinny_ms(sh, M, Path::Skinny, sp, w.p, copies, x.p, xb.p, y.p),
                  "   (split sweep)");
        }
        if (!quick && (M == 1 || M == 4 || M == 8)) {
          if (M <= augur::cuda::detail::kSkinnyMaxM)
            row(M, "-", skinny_ms(sh, M, Path::Lt, 0, w.p, copies, x.p, xb.p, y.p),
                "   (cuBLASLt on bf16 x, for comparison)");
          else
            row(M, "-", skinny_ms(sh, M, Path::Skinny, 0, w.p, copies, x.p, xb.p, y.p),
                "   (skinny kernel, for comparison)");
        }
      }
    }
    const double weights_bytes =
        36.0 * (2 * 4096.0 * 4096 + 2 * 1024.0 * 4096 + 3 * 12288.0 * 4096) * 2 + 151936.0 * 4096 * 2;
    const double token_us = 36 * layer_us + lm_head_us;
    fused_us = 36 * fused_layer_us + lm_head_us;
    std::printf(
        "Qwen3-8B batch-1 matmuls (36 layers + lm_head), unfused q/k/v and gate/up: %.0f us/token, "
        "%.0f GB/s = %.1f%% of copy bandwidth, %.0f tok/s matmul-only\n",
        token_us, weights_bytes / (token_us * 1e-6) / 1e9, 100.0 * weights_bytes / (token_us * 1e-6) / 1e9 / bw,
        1e6 / token_us);
    std::printf(
        "Qwen3-8B batch-1 matmuls, fused qkv and gate_up: %.0f us/token, %.0f GB/s = %.1f%% of copy bandwidth, "
        "%.0f tok/s matmul-only\n\n",
        fused_us, weights_bytes / (fused_us * 1e-6) / 1e9, 100.0 * weights_bytes / (fused_us * 1e-6) / 1e9 / bw,
        1e6 / fused_us);

    // ---- tensor-core GEMM (prefill, batched decode) ----
    std::printf("== GEMM via cuBLASLt (bf16 x bf16 -> f32), TFLOP/s ==\n");
    std::printf("%-22s %5s %10s %10s %10s %6s\n", "shape", "M", "lt(xb)", "+convert", "best algo", "algo");
    for (const Shape& sh : kShapes) {
      if (sh.N == 6144 || sh.N == 24576) continue;
      Buf<uint16_t> w(size_t(sh.N * sh.K));
      rand_bf16(w.p, w.n, 4);
      Buf<float> xf(size_t(2048) * size_t(sh.K));
      rand_f32(xf.p, xf.n, 5);
      for (int64_t M : {8, 32, 128, 2048}) {
        if (quick && M != 2048) continue;
        const double flop = 2.0 * double(M) * double(sh.N) * double(sh.K);
        const double ms_lt =
            time_graph([&](Stream s) { augur::cuda::detail::lt_matmul(xb.p, M, sh.K, w.p, sh.N, y.p, sh.N, s); });
        const double ms_full =
            time_graph([&](Stream s) { augur::cuda::matmul_bf16(xf.p, M, sh.K, sh.K, w.p, sh.N, y.p, sh.N, s); });
        double best = 1e30;
        int best_algo = -1;
        {  // the heuristic's first 8 algorithms
          for (int a = 0; a < 8; ++a) {
            bool ok = true;
            const double ms = time_graph(
                [&](Stream s) { ok = augur::cuda::detail::lt_matmul(xb.p, M, sh.K, w.p, sh.N, y.p, sh.N, s, a); });
            if (ok && ms < best) best = ms, best_algo = a;
          }
        }
        std::printf("%-22s %5ld %10.1f %10.1f %10.1f %6d\n", sh.name, long(M), flop / (ms_lt * 1e-3) / 1e12,
                    flop / (ms_full * 1e-3) / 1e12, best_algo >= 0 ? flop / (best * 1e-3) / 1e12 : 0.0, best_algo);
      }
    }
    std::printf("\n");

  }  // !attention_only
  // ---- attention ----
  const int64_t n_head = 32, n_kv = 8, D = 128, bs = 16, n_layer = 36;
  const float scale = 1.0f / std::sqrt(float(D));
  std::printf("== paged attention, Qwen3-8B (32 q / 8 kv heads, head_dim 128, block 16) ==\n");
  std::printf("%-8s %6s %6s %8s %10s %10s %8s\n", "path", "batch", "ctx", "max_ctx", "us/layer", "us/token", "KV GB/s");
  std::mt19937 rng(6);
  double attn_us_128 = 0, attn_us_8192 = 0;
  for (int64_t batch : {1, 32}) {
    for (int64_t ctx : {128, 1024, 8192}) {
      if (quick && batch != 1) continue;
      const int64_t layers = batch == 1 ? n_layer : 2;  // enough to defeat L2
      const int64_t blocks_per_row = (ctx + bs - 1) / bs;
      const int64_t n_blocks = batch * blocks_per_row;
      const size_t cache_elems = size_t(n_blocks * bs * n_kv * D);
      Buf<uint16_t> kc(cache_elems * size_t(layers)), vc(cache_elems * size_t(layers));
      rand_bf16(kc.p, kc.n, 7);
      rand_bf16(vc.p, vc.n, 8);
      std::vector<int32_t> table(static_cast<size_t>(n_blocks));
      std::iota(table.begin(), table.end(), 0);
      std::shuffle(table.begin(), table.end(), rng);
      std::vector<int32_t> pos(static_cast<size_t>(batch), int32_t(ctx - 1)), row(static_cast<size_t>(batch));
      std::iota(row.begin(), row.end(), 0);
      Buf<int32_t> dtable(table.size()), dpos(pos.size()), drow(row.size());
      check(cudaMemcpy(dtable.p, table.data(), table.size() * 4, cudaMemcpyHostToDevice), "upload");
      check(cudaMemcpy(dpos.p, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice), "upload");
      check(cudaMemcpy(drow.p, row.data(), row.size() * 4, cudaMemcpyHostToDevice), "upload");
      check(cudaDeviceSynchronize(), "upload");
      Buf<float> q(size_t(batch * n_head * D)), out(size_t(batch * n_head * D));
      rand_f32(q.p, q.n, 9);
      std::vector<int64_t> max_ctxs = {ctx};
      if (ctx != 8192) max_ctxs.push_back(8192);
      for (int64_t max_ctx : max_ctxs) {
        augur::cuda::AttnMeta meta;
        meta.positions = dpos.p;
        meta.token_row = drow.p;
        meta.block_tables = dtable.p;
        meta.max_blocks = int32_t(blocks_per_row);
        meta.n_tokens = int32_t(batch);
        meta.max_context = int32_t(max_ctx);
        meta.max_row_tokens = 1;
        Buf<char> ws(augur::cuda::attention_workspace_bytes(batch, n_head, D, max_ctx));
        const double ms = time_graph([&](Stream s) {
          for (int64_t l = 0; l < layers; ++l)
            augur::cuda::paged_attention(q.p, kc.p + size_t(l) * cache_elems, vc.p + size_t(l) * cache_elems, bs,
                                         n_head, n_kv, D, meta, scale, 0, out.p, ws.p, s);
        });
        const double us_layer = ms * 1e3 / double(layers);
        const double kv_bytes = double(batch * ctx * n_kv * D * 2 * 2);
        std::printf("%-8s %6ld %6ld %8ld %10.2f %10.1f %8.0f\n", "decode", long(batch), long(ctx), long(max_ctx),
                    us_layer, us_layer * double(n_layer), kv_bytes / (us_layer * 1e-6) / 1e9);
        if (batch == 1 && max_ctx == 8192 && ctx == 128) attn_us_128 = us_layer * double(n_layer);
        if (batch == 1 && max_ctx == 8192 && ctx == 8192) attn_us_8192 = us_layer * double(n_layer);
        if (max_ctx != 8192 || ctx < 1024 || quick) continue;
        for (int split_len : {64, 128, 256, 512}) {  // split-length sweep
          Buf<char> ws2(size_t(batch * n_head) * size_t((max_ctx + split_len - 1) / split_len) * size_t(D + 2) * 4);
          const double ms2 = time_graph([&](Stream s) {
            for (int64_t l = 0; l < layers; ++l)
              augur::cuda::detail::paged_attention_decode(q.p, kc.p + size_t(l) * cache_elems,
                                                          vc.p + size_t(l) * cache_elems, bs, n_head, n_kv, D, meta,
                                                          scale, 0, out.p, ws2.p, s, split_len);
          });
          const double us2 = ms2 * 1e3 / double(layers);
          std::printf("%-8s %6ld %6ld %8ld %10.2f %10.1f %8.0f  (split_len %d)\n", "decode", long(batch), long(ctx),
                      long(max_ctx), us2, us2 * double(n_layer), kv_bytes / (us2 * 1e-6) / 1e9, split_len);
        }
      }
    }
  }
  // Prefill: rows of tokens starting at position 0, causal.
  for (auto rows_tokens : std::vector<std::pair<int64_t, int64_t>>{{1, 2048}, {4, 512}, {1, 8192}}) {
    const int64_t n_rows = rows_tokens.first, T = rows_tokens.second, n_tok = n_rows * T;
    const int64_t blocks_per_row = (T + bs - 1) / bs, n_blocks = n_rows * blocks_per_row;
    const size_t cache_elems = size_t(n_blocks * bs * n_kv * D);
    Buf<uint16_t> kc(cache_elems), vc(cache_elems);
    rand_bf16(kc.p, kc.n, 10);
    rand_bf16(vc.p, vc.n, 11);
    std::vector<int32_t> table(static_cast<size_t>(n_blocks)), pos, row;
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    for (int64_t r = 0; r < n_rows; ++r)
      for (int64_t t = 0; t < T; ++t) pos.push_back(int32_t(t)), row.push_back(int32_t(r));
    Buf<int32_t> dtable(table.size()), dpos(pos.size()), drow(row.size());
    check(cudaMemcpy(dtable.p, table.data(), table.size() * 4, cudaMemcpyHostToDevice), "upload");
    check(cudaMemcpy(dpos.p, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice), "upload");
    check(cudaMemcpy(drow.p, row.data(), row.size() * 4, cudaMemcpyHostToDevice), "upload");
      check(cudaDeviceSynchronize(), "upload");
    Buf<float> q(size_t(n_tok * n_head * D)), out(size_t(n_tok * n_head * D));
    rand_f32(q.p, q.n, 12);
    augur::cuda::AttnMeta meta;
    meta.positions = dpos.p;
    meta.token_row = drow.p;
    meta.block_tables = dtable.p;
    meta.max_blocks = int32_t(blocks_per_row);
    meta.n_tokens = int32_t(n_tok);
    meta.max_context = int32_t(T);
    const double ms = time_graph([&](Stream s) {
      augur::cuda::paged_attention(q.p, kc.p, vc.p, bs, n_head, n_kv, D, meta, scale, 0, out.p, nullptr, s);
    });
    const double flop = 4.0 * double(n_head * D) * double(n_rows) * double(T) * double(T + 1) / 2.0;
    std::printf("%-8s %6ld %6ld %8s %10.2f %10s %8s  %.1f TFLOP/s (causal)\n", "prefill", long(n_rows), long(T), "-",
                ms * 1e3, "-", "-", flop / (ms * 1e-3) / 1e12);
  }
  if (fused_us > 0 && attn_us_128 > 0 && attn_us_8192 > 0) {
    const double t128 = fused_us + attn_us_128, t8192 = fused_us + attn_us_8192;
    std::printf("\nbatch-1 decode estimate (fused matmuls + attention, graph max_ctx 8192): %.0f us/token at ctx 128, "
                "%.0f us at 8192: +%.1f%%\n",
                t128, t8192, 100.0 * (t8192 / t128 - 1.0));
  }
  augur::cuda::synchronize();
  return 0;
}
