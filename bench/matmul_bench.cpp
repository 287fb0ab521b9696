// CPU matmul throughput: weight bytes/s for decode (memory-bound), FLOP/s for
// prefill (compute-bound), against a memcpy and a plain read over the same
// threads.
//
//   AUGUR_THREADS=2 ./matmul_bench --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true [--benchmark_filter=...]
//
// On a shared machine read the best run: the time of the *_min row and the
// rates of the *_max row.
//
// "cold" decode cycles through enough copies of the weights to defeat the L3
// (as in a real forward pass, where each weight is read once per token);
// "hot" reuses one copy, which an L3-sized matrix then serves from cache.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/matmul.h"
#include "core/quant.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace {

using augur::DType;
using augur::HostBuffer;
using augur::ThreadPool;
using augur::cpu::MatmulPath;

constexpr size_t kColdBytes = size_t(512) << 20;  // well past any L3

using MatmulFn = void (*)(const float*, int64_t, int64_t, int64_t, const void*, DType, int64_t,
                          float*, int64_t, ThreadPool&);

MatmulFn path_fn(MatmulPath p) {
  switch (p) {
    case MatmulPath::Avx512Bf16: return &augur::cpu::matmul_avx512bf16;
    case MatmulPath::Avx512: return &augur::cpu::matmul_avx512;
    case MatmulPath::Avx2: return &augur::cpu::matmul_avx2;
    case MatmulPath::Scalar: return &augur::cpu::matmul_scalar;
  }
  return nullptr;
}

void fill_random(void* p, size_t bytes, DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  if (dtype == DType::F32) {
    float* f = static_cast<float*>(p);
    for (size_t i = 0; i < bytes / 4; ++i) f[i] = dist(rng);
  } else {
    uint16_t* h = static_cast<uint16_t*>(p);
    for (size_t i = 0; i < bytes / 2; ++i) h[i] = augur::f32_to_bf16(dist(rng));
  }
}

// 1 GiB copied, split over the pool's threads: bytes/s counts bytes copied.
void BM_memcpy(benchmark::State& state) {
  ThreadPool& pool = ThreadPool::global();
  const size_t n = size_t(1) << 30;
  HostBuffer src(n), dst(n);
  std::memset(src.data(), 1, n);
  const char* s = static_cast<const char*>(src.data());
  char* d = static_cast<char*>(dst.data());
  for (auto _ : state) {
    pool.run([&](int tid, int nt) {
      const size_t b = n * tid / nt / 64 * 64, e = n * (tid + 1) / nt / 64 * 64;
      std::memcpy(d + b, s + b, e - b);
    });
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(n));
  state.counters["threads"] = pool.size();
}

// 1 GiB read (summed), split over the pool's threads: what decode can hope for.
void BM_read(benchmark::State& state) {
  ThreadPool& pool = ThreadPool::global();
  const size_t n = size_t(1) << 30;
  HostBuffer src(n);
  std::memset(src.data(), 1, n);
  const uint64_t* s = static_cast<const uint64_t*>(src.data());
  std::vector<uint64_t> sums(size_t(pool.size()) * 8);
  for (auto _ : state) {
    pool.run([&](int tid, int nt) {
      const size_t b = n / 8 * tid / nt / 8 * 8, e = n / 8 * (tid + 1) / nt / 8 * 8;
      uint64_t acc[8] = {};
      for (size_t i = b; i < e; i += 8)
        for (int l = 0; l < 8; ++l) acc[l] += s[i + l];
      for (int l = 0; l < 8; ++l) sums[size_t(tid) * 8 + size_t(l)] = acc[l];
    });
    benchmark::DoNotOptimize(sums.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(n));
  state.counters["threads"] = pool.size();
}

// y = x·wᵀ with M rows; weights rotate over enough copies to exceed the L3 when `cold`.
void BM_matmul(benchmark::State& state, MatmulPath path, DType dtype, int64_t M, int64_t K,
               int64_t N, bool cold) {
  if (!augur::cpu::matmul_path_supported(path)) {
    state.SkipWithError("path not supported on this CPU");
    return;
  }
  ThreadPool& pool = ThreadPool::global();
  const size_t w_bytes = size_t(N * K) * augur::dtype_size(dtype);
  const size_t copies = cold ? std::max<size_t>(1, (kColdBytes + w_bytes - 1) / w_bytes) : 1;
  std::vector<std::unique_ptr<HostBuffer>> ws;
  for (size_t c = 0; c < copies; ++c) {
    ws.push_back(std::make_unique<HostBuffer>(w_bytes));
    if (c == 0)
      fill_random(ws[0]->data(), w_bytes, dtype, 1);
    else
      std::memcpy(ws[c]->data(), ws[0]->data(), w_bytes);
  }
  HostBuffer x(size_t(M * K) * 4), y(size_t(M * N) * 4);
  fill_random(x.data(), size_t(M * K) * 4, DType::F32, 99);
  const MatmulFn fn = path_fn(path);
  size_t c = 0;
  for (auto _ : state) {
    fn(static_cast<const float*>(x.data()), M, K, K, ws[c]->data(), dtype, N,
       static_cast<float*>(y.data()), N, pool);
    benchmark::ClobberMemory();
    c = c + 1 == copies ? 0 : c + 1;
  }
  const int64_t it = int64_t(state.iterations());
  state.SetBytesProcessed(it * int64_t(w_bytes));
  state.counters["FLOP/s"] =
      benchmark::Counter(double(it) * 2.0 * double(M * N * K), benchmark::Counter::kIsRate);
  state.counters["threads"] = pool.size();
}

// The same with w affine-quantized (QAFFINE: `bits` in groups of 64, bf16
// scales): bytes/s counts the packed bytes; "weights/s" compares with the
// float forms (a bf16 matrix's bytes/s is twice its weights/s).
void BM_matmul_quantized(benchmark::State& state, MatmulPath path, int bits, int64_t M, int64_t K, int64_t N,
                         bool cold) {
  if (!augur::cpu::matmul_path_supported(path)) {
    state.SkipWithError("path not supported on this CPU");
    return;
  }
  ThreadPool& pool = ThreadPool::global();
  std::mt19937 rng(5);
  augur::Tensor codes = augur::Tensor::empty(DType::U32, {N, K * bits / 32});
  for (int64_t i = 0; i < codes.numel(); ++i) codes.data<uint32_t>()[i] = uint32_t(rng());
  augur::Tensor scales = augur::Tensor::empty(DType::BF16, {N, K / 64});
  augur::Tensor biases = augur::Tensor::empty(DType::BF16, {N, K / 64});
  for (int64_t i = 0; i < scales.numel(); ++i) {
    scales.data<uint16_t>()[i] = augur::f32_to_bf16(0.01f);
    biases.data<uint16_t>()[i] = augur::f32_to_bf16(-0.08f);
  }
  const augur::Tensor q = augur::pack_affine(codes, scales, biases, bits, 64, K, "bench");
  const size_t w_bytes = q.nbytes();
  const size_t copies = cold ? std::max<size_t>(1, (kColdBytes + w_bytes - 1) / w_bytes) : 1;
  std::vector<std::unique_ptr<HostBuffer>> ws;
  for (size_t c = 0; c < copies; ++c) {
    ws.push_back(std::make_unique<HostBuffer>(w_bytes));
    std::memcpy(ws[c]->data(), q.raw(), w_bytes);
  }
  HostBuffer x(size_t(M * K) * 4), y(size_t(M * N) * 4);
  fill_random(x.data(), size_t(M * K) * 4, DType::F32, 99);
  size_t c = 0;
  for (auto _ : state) {
    augur::cpu::matmul_quantized(path, static_cast<const float*>(x.data()), M, K, K, ws[c]->data(), q.quant(), N,
                                 static_cast<float*>(y.data()), N, pool);
    benchmark::ClobberMemory();
    c = c + 1 == copies ? 0 : c + 1;
  }
  const int64_t it = int64_t(state.iterations());
  state.SetBytesProcessed(it * int64_t(w_bytes));
  state.counters["weights/s"] = benchmark::Counter(double(it) * double(N * K), benchmark::Counter::kIsRate);
  state.counters["threads"] = pool.size();
}

// Best of the repetitions (--benchmark_repetitions=N): the machine may be shared,
// and interference only ever slows a run down.
double min_of(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }
double max_of(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

benchmark::internal::Benchmark* with_stats(benchmark::internal::Benchmark* b) {
  return b->UseRealTime()->ComputeStatistics("min", min_of)->ComputeStatistics("max", max_of);
}

struct Shape {
  const char* name;
  int64_t K, N;
};
constexpr Shape kShapes[] = {
    {"up_K1024_N3072", 1024, 3072},
    {"down_K3072_N1024", 3072, 1024},
    {"lm_head_K1024_N151936", 1024, 151936},
};

}  // namespace

int main(int argc, char** argv) {
  with_stats(benchmark::RegisterBenchmark("memcpy_1GiB", BM_memcpy))->Unit(benchmark::kMillisecond);
  with_stats(benchmark::RegisterBenchmark("read_1GiB", BM_read))->Unit(benchmark::kMillisecond);
  const MatmulPath paths[] = {MatmulPath::Avx512Bf16, MatmulPath::Avx512, MatmulPath::Avx2,
                              MatmulPath::Scalar};
  for (MatmulPath path : paths) {
    const std::string pn = augur::cpu::matmul_path_name(path);
    for (DType dtype : {DType::BF16, DType::F32}) {
      // avx512bf16 runs f32 weights through the avx512 kernels.
      if (path == MatmulPath::Avx512Bf16 && dtype == DType::F32) continue;
      const std::string dn = std::string(augur::dtype_name(dtype));
      for (const Shape& s : kShapes) {
        // Decode and small batches (speculative verify): weight bytes/s.
        for (int64_t M : {1, 2, 4, 8, 16}) {
          if (path == MatmulPath::Scalar && M > 1) continue;
          for (bool cold : {true, false}) {
            if (!cold && M > 1) continue;
            const std::string name = "decode/" + pn + "/" + dn + "/" + s.name + "/M" +
                                     std::to_string(M) + (cold ? "/cold" : "/hot");
            with_stats(benchmark::RegisterBenchmark(name.c_str(), BM_matmul, path, dtype, M, s.K,
                                                    s.N, cold))
                ->Unit(benchmark::kMicrosecond);
          }
        }
        // Prefill: FLOP/s (the lm_head is left out: one call takes ~0.5 s).
        if (path == MatmulPath::Scalar || s.N > 100000) continue;
        const std::string name = "prefill/" + pn + "/" + dn + "/" + s.name + "/M512";
        with_stats(benchmark::RegisterBenchmark(name.c_str(), BM_matmul, path, dtype, int64_t(512),
                                                s.K, s.N, false))
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
  for (MatmulPath path : {MatmulPath::Avx512, MatmulPath::Avx2}) {
    const std::string pn = augur::cpu::matmul_path_name(path);
    for (int bits : {4, 8})
      for (const Shape& s : kShapes)
        for (int64_t M : {int64_t(1), int64_t(8)})
          for (bool cold : {true, false}) {
            if (!cold && M > 1) continue;
            const std::string name = "decode/" + pn + "/Q" + std::to_string(bits) + "G64/" + s.name + "/M" +
                                     std::to_string(M) + (cold ? "/cold" : "/hot");
            with_stats(benchmark::RegisterBenchmark(name.c_str(), BM_matmul_quantized, path, bits, M, s.K, s.N, cold))
                ->Unit(benchmark::kMicrosecond);
          }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
