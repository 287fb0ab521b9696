// CUDA op tests: every kernel of backend/cuda/kernels.h against the CPU op
// (backend/cpu) on random inputs of odd sizes. Outputs are poisoned (NaN)
// before each run, so an element left unwritten fails.
//
// Tolerances, by what the kernel rounds:
//   exact (bitwise): embedding, add, store_kv (f32 -> bf16 RNE), argmax, to_bf16;
//   f32-class: rms_norm, swiglu, rope, skinny matmul (M <= 2, f32 products), decode
//     attention: |err| <= 1e-5..1e-4 of the output scale (see each test);
//   bf16 operands: cuBLASLt matmul (x rounded to bf16): |err| <= 1e-2 * sum|x w|,
//     rel-L2 <= 1e-2; prefill attention (Q and P rounded to bf16): max |err| <= 2e-2,
//     rel-L2 <= 1e-2.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops_cpu.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/memory.h"
#include "backend/cuda/detail.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace augur::cuda {
namespace {

void check(cudaError_t e, const char* what) { ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e); }

// A device array owned by the test (tests allocate directly; the engine uses its allocator).
template <typename T>
class Dev {
 public:
  explicit Dev(size_t n) : n_(n) {
    if (n_ > 0 && cudaMalloc(&p_, n_ * sizeof(T)) != cudaSuccess) throw std::runtime_error("cudaMalloc failed");
  }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { upload(h); }
  ~Dev() {
    if (p_ != nullptr) cudaFree(p_);
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  T* get() const { return p_; }
  size_t size() const { return n_; }
  // On the ops' stream: it is non-blocking, so legacy-stream copies and
  // memsets would not be ordered with the kernels.
  void upload(const std::vector<T>& h) {
    if (h.size() != n_) throw std::runtime_error("upload size mismatch");
    if (n_ > 0 && cudaMemcpyAsync(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice, stream()) != cudaSuccess)
      throw std::runtime_error("cudaMemcpyAsync H2D failed");
    synchronize();
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    if (n_ > 0 && cudaMemcpyAsync(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost, stream()) != cudaSuccess)
      throw std::runtime_error("cudaMemcpyAsync D2H failed");
    synchronize();
    return h;
  }
  void poison() {
    if (n_ > 0 && cudaMemsetAsync(p_, 0xff, n_ * sizeof(T), stream()) != cudaSuccess)
      throw std::runtime_error("cudaMemsetAsync failed");
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!available()) GTEST_SKIP() << "no CUDA device";
    context();
  }
};

std::vector<float> randn(size_t n, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

std::vector<uint16_t> rand_bf16(size_t n, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(u(rng));
  return v;
}

struct ErrStats {
  double max_abs = 0, rel_l2 = 0;
  bool all_finite = true;
};

ErrStats compare(const std::vector<float>& got, const std::vector<float>& ref) {
  ErrStats s;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) s.all_finite = false;
    const double d = double(got[i]) - ref[i];
    s.max_abs = std::max(s.max_abs, std::fabs(d));
    num += d * d;
    den += double(ref[i]) * ref[i];
  }
  s.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return s;
}

// ---- matmul -------------------------------------------------------------------

struct MatmulCase {
  int64_t M, K, N, ldx_pad, ldy_pad;
};

// y = x·wᵀ on the GPU vs cpu::matmul; per-output tolerance tol * sum_k |x w|:
// f32-class on the skinny path (M <= 2), bf16-class on cuBLASLt (x rounded).
void run_matmul(const MatmulCase& c, uint32_t seed) {
  const bool skinny = c.M <= detail::kSkinnyDispatchM;
  const double tol = skinny ? 1e-5 : 1e-2, rel_l2_tol = skinny ? 1e-5 : 1e-2;
  std::mt19937 rng(seed);
  const int64_t ldx = c.K + c.ldx_pad, ldy = c.N + c.ldy_pad;
  std::vector<float> x = randn(size_t(c.M * ldx), rng);
  std::vector<uint16_t> w = rand_bf16(size_t(c.N * c.K), rng);
  std::vector<float> ref(size_t(c.M * ldy), 0.f);
  cpu::matmul(x.data(), c.M, c.K, ldx, w.data(), DType::BF16, c.N, ref.data(), ldy, ThreadPool::global());
  Dev<float> dx(x), dy(size_t(c.M * ldy));
  Dev<uint16_t> dw(w);
  dy.poison();
  matmul_bf16(dx.get(), c.M, c.K, ldx, dw.get(), c.N, dy.get(), ldy, stream());
  std::vector<float> got = dy.download();
  std::vector<float> g2, r2;
  for (int64_t m = 0; m < c.M; ++m)
    for (int64_t n = 0; n < c.N; ++n) {
      double scale = 0;
      for (int64_t k = 0; k < c.K; ++k) scale += std::fabs(double(x[size_t(m * ldx + k)]) * bf16_to_f32(w[size_t(n * c.K + k)]));
      const float gv = got[size_t(m * ldy + n)], rv = ref[size_t(m * ldy + n)];
      ASSERT_TRUE(std::isfinite(gv)) << "M=" << c.M << " K=" << c.K << " N=" << c.N << " y[" << m << "," << n << "]";
      ASSERT_LE(std::fabs(double(gv) - rv), tol * scale + 1e-6)
          << "M=" << c.M << " K=" << c.K << " N=" << c.N << " y[" << m << "," << n << "] got " << gv << " want " << rv;
      g2.push_back(gv), r2.push_back(rv);
    }
  EXPECT_LE(compare(g2, r2).rel_l2, rel_l2_tol) << "M=" << c.M << " K=" << c.K << " N=" << c.N;
}

using CudaMatmul = CudaTest;

TEST_F(CudaMatmul, SkinnySmall) {
  uint32_t seed = 1;
  for (int64_t M : {1, 2, 3, 8})
    for (auto kn : std::vector<std::pair<int64_t, int64_t>>{{64, 1}, {256, 31}, {136, 33}, {31, 17}, {33, 5}})
      run_matmul({M, kn.first, kn.second, 0, 0}, seed++);
}

TEST_F(CudaMatmul, SmallMOddSizesAndStrides) {
  uint32_t seed = 100;
  for (int64_t M : {1, 2, 5, 8, 11, 16})
    for (auto kn : std::vector<std::pair<int64_t, int64_t>>{
             {4096, 31}, {4104, 33}, {4096, 1024}, {1000, 4097}, {12288, 64}, {8, 4097}, {4097, 3}})
      for (int64_t pad : {0, 4}) run_matmul({M, kn.first, kn.second, pad, pad == 0 ? 0 : 3}, seed++);
}

// The skinny kernel for every M it takes, each of its variants (loads in
// flight, pipelined passes) and any split-K factor gives the same sums within
// rounding (and a split launch leaves the counters at zero). K = 4104 ends
// in a partial pass; 1544 in a partial pipelined pair.
TEST_F(CudaMatmul, SkinnySplitK) {
  std::mt19937 rng(7);
  for (int64_t M : {1, 2, 3, 5, 8})
    for (int64_t K : {4104, 1544, 8}) {
      const int64_t N = 101;
      std::vector<float> x = randn(size_t(M * K), rng);
      std::vector<uint16_t> w = rand_bf16(size_t(N * K), rng);
      std::vector<float> ref(size_t(M * N));
      cpu::matmul(x.data(), M, K, K, w.data(), DType::BF16, N, ref.data(), N, ThreadPool::global());
      Dev<float> dx(x), dy(size_t(M * N));
      Dev<uint16_t> dw(w);
      for (int variant : {0, 1, 2, 3, 4}) {
        // M > 2 has one variant: the others fall back to it. 3 and 4 (the
        // stream kernel) ignore splits: N = 101 rows on fewer blocks than SMs.
        detail::skinny_variant() = variant;
        for (int splits : {1, 2, 3, 7, 16, 1000})
          for (int rep = 0; rep < 2; ++rep) {
            dy.poison();
            detail::skinny_matmul(dx.get(), M, K, K, dw.get(), N, dy.get(), N, stream(), splits);
            const ErrStats e = compare(dy.download(), ref);
            EXPECT_TRUE(e.all_finite) << "M " << M << " K " << K << " variant " << variant << " splits " << splits;
            EXPECT_LE(e.rel_l2, 1e-5) << "M " << M << " K " << K << " variant " << variant << " splits " << splits;
          }
      }
      detail::skinny_variant() = -1;
    }
}

// The MLP's down projection (swiglu_packed then the matmul) against the CPU's
// swiglu then matmul (f32 products, bf16 / f16 weights).
TEST_F(CudaMatmul, SwigluMatmul) {
  std::mt19937 rng(9);
  for (const bool f16 : {false, true})
    for (int64_t M : {1, 2, 3, 8})
      for (auto dn : std::vector<std::pair<int64_t, int64_t>>{{4096, 33}, {1000, 257}, {12288, 64}, {24, 5}}) {
        const int64_t D = dn.first, N = dn.second;
        std::vector<float> gu = randn(size_t(M * 2 * D), rng);
        std::vector<uint16_t> w = rand_bf16(size_t(N * D), rng);
        if (f16)
          for (auto& v : w) v = f32_to_f16(bf16_to_f32(v));
        std::vector<float> act(size_t(M * D)), ref(size_t(M * N));
        for (int64_t m = 0; m < M; ++m)
          for (int64_t i = 0; i < D; ++i) {
            const float g = gu[size_t(m * 2 * D + i)], u = gu[size_t(m * 2 * D + D + i)];
            act[size_t(m * D + i)] = g / (1.0f + std::exp(-g)) * u;
          }
        std::vector<float> wf(w.size());  // the CPU matmul takes bf16 or f32 weights
        for (size_t i = 0; i < w.size(); ++i) wf[i] = f16 ? f16_to_f32(w[i]) : bf16_to_f32(w[i]);
        cpu::matmul(act.data(), M, D, D, wf.data(), DType::F32, N, ref.data(), N, ThreadPool::global());
        Dev<float> dgu(gu), dact(size_t(M * D)), dy(size_t(M * N));
        Dev<uint16_t> dw(w);
        dy.poison();
        swiglu_matmul(dgu.get(), M, D, dw.get(), f16 ? Half::F16 : Half::BF16, N, dact.get(), dy.get(), stream());
        const ErrStats e = compare(dy.download(), ref);
        EXPECT_TRUE(e.all_finite) << "M " << M << " D " << D;
        // Skinny rows: f32 products; the tensor-core path rounds its input.
        EXPECT_LE(e.rel_l2, M <= 2 && D % 8 == 0 ? 1e-5 : 5e-3) << "M " << M << " D " << D << " f16 " << f16;
      }
}

// Run to run bit-identical: the split-K path (variant 0) and the stream
// kernel (variants 3 and 4, its cross-warp sums in fixed order), M = 1 and 2.
TEST_F(CudaMatmul, Deterministic) {
  std::mt19937 rng(8);
  const int64_t K = 4096, N = 1024;
  ASSERT_GT(detail::skinny_splits(1, K, N), 1);  // variant 0 splits K
  Dev<uint16_t> dw(rand_bf16(size_t(N * K), rng));
  for (int64_t M : {1, 2})
    for (int variant : {0, 3, 4}) {
      detail::skinny_variant() = variant;
      Dev<float> dx(randn(size_t(M * K), rng)), dy(size_t(M * N));
      matmul_bf16(dx.get(), M, K, K, dw.get(), N, dy.get(), N, stream());
      const std::vector<float> a = dy.download();
      for (int rep = 0; rep < 5; ++rep) {
        dy.poison();
        matmul_bf16(dx.get(), M, K, K, dw.get(), N, dy.get(), N, stream());
        const std::vector<float> b = dy.download();
        ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "M " << M << " variant " << variant;
      }
    }
  detail::skinny_variant() = -1;
}

// The stream kernel (both row layouts) on shapes that end mid-stage: K not a
// multiple of the stage's columns (4104, 5120, 8), N not a multiple of the
// rows a stage or of the SM count, bf16 and f16, against the CPU with f32 products.
TEST_F(CudaMatmul, StreamKernelShapes) {
  std::mt19937 rng(12);
  for (const int variant : {3, 4})
    for (const bool f16 : {false, true})
      for (int64_t M : {1, 2})
        for (auto kn : std::vector<std::pair<int64_t, int64_t>>{{4104, 531}, {5120, 1031}, {8, 700}, {2048, 129},
                                                                {12288, 4099}, {24, 1}}) {
          const int64_t K = kn.first, N = kn.second;
          std::vector<float> x = randn(size_t(M * K), rng);
          std::vector<uint16_t> w = rand_bf16(size_t(N * K), rng);
          if (f16)
            for (auto& v : w) v = f32_to_f16(bf16_to_f32(v));
          std::vector<float> wf(w.size()), ref(size_t(M * N));
          for (size_t i = 0; i < w.size(); ++i) wf[i] = f16 ? f16_to_f32(w[i]) : bf16_to_f32(w[i]);
          cpu::matmul(x.data(), M, K, K, wf.data(), DType::F32, N, ref.data(), N, ThreadPool::global());
          Dev<float> dx(x), dy(size_t(M * N));
          Dev<uint16_t> dw(w);
          dy.poison();
          detail::skinny_variant() = variant;
          detail::skinny_matmul(dx.get(), M, K, K, dw.get(), N, dy.get(), N, stream(), 0,
                                f16 ? Half::F16 : Half::BF16);
          detail::skinny_variant() = -1;
          const ErrStats e = compare(dy.download(), ref);
          const std::string what = "variant " + std::to_string(variant) + " M " + std::to_string(M) + " K " +
                                   std::to_string(K) + " N " + std::to_string(N) + " f16 " + std::to_string(f16);
          EXPECT_TRUE(e.all_finite) << what;
          EXPECT_LE(e.rel_l2, 1e-5) << what;
        }
}

// The stream GEMV's fused ends (detail::StreamGemv) against the CPU: the norm
// in front, Accumulate (with y2) and SwiGLU behind, on shapes that end mid-stage
// and mid-group, with fewer units than SMs, both row layouts.
TEST_F(CudaMatmul, StreamFusedEnds) {
  using detail::StreamEpi;
  std::mt19937 rng(13);
  const std::pair<StreamEpi, bool> ends[] = {
      {StreamEpi::Store, true}, {StreamEpi::Accumulate, false}, {StreamEpi::SwiGLU, true}};
  for (const int variant : {3, 4})
    for (int64_t M : {1, 2})
      for (auto kn : std::vector<std::pair<int64_t, int64_t>>{
               {4104, 1062}, {5120, 2062}, {8, 140}, {2048, 258}, {24, 2}, {12288, 8198}})
        for (const auto& [epi, norm] : ends) {
          const int64_t K = kn.first, N = kn.second, F = N / 2;
          std::vector<float> x = randn(size_t(M * K), rng), g = randn(size_t(K), rng);
          std::vector<float> y0 = randn(size_t(M * N), rng);
          std::vector<uint16_t> w = rand_bf16(size_t(N * K), rng);
          // The reference: xin = x or rms_norm(x) * g; p = xin · wᵀ.
          std::vector<float> xin(x), wf(w.size()), p(size_t(M * N));
          if (norm)
            for (int64_t m = 0; m < M; ++m) {
              double ss = 0;
              for (int64_t k = 0; k < K; ++k) ss += double(x[m * K + k]) * x[m * K + k];
              const float inv = float(1.0 / std::sqrt(ss / double(K) + 1e-6));
              for (int64_t k = 0; k < K; ++k) xin[m * K + k] = g[k] * (x[m * K + k] * inv);
            }
          for (size_t i = 0; i < w.size(); ++i) wf[i] = bf16_to_f32(w[i]);
          cpu::matmul(xin.data(), M, K, K, wf.data(), DType::F32, N, p.data(), N, ThreadPool::global());
          std::vector<float> want_y, want_y2;
          if (epi == StreamEpi::SwiGLU) {
            for (int64_t m = 0; m < M; ++m)
              for (int64_t f = 0; f < F; ++f) {
                const float gt = p[m * N + f], up = p[m * N + F + f];
                want_y.push_back(gt / (1.0f + std::exp(-gt)) * up);
              }
          } else if (epi == StreamEpi::Accumulate) {
            want_y = y0, want_y2 = p;
            for (size_t i = 0; i < p.size(); ++i) want_y[i] += p[i];
          } else {
            want_y = p;
          }
          Dev<float> dx(x), dg(g), dy(want_y.size()), dy2(p.size());
          Dev<uint16_t> dw(w);
          if (epi == StreamEpi::Accumulate)
            dy.upload(y0);
          else
            dy.poison();
          dy2.poison();
          detail::StreamGemv q;
          q.x = dx.get(), q.M = M, q.K = K, q.ldx = K, q.w = dw.get(), q.N = N, q.y = dy.get();
          q.ldy = epi == StreamEpi::SwiGLU ? F : N, q.epi = epi, q.norm = norm, q.g = dg.get(), q.eps = 1e-6f;
          if (epi == StreamEpi::Accumulate) q.y2 = dy2.get();
          ASSERT_TRUE(detail::stream_gemv_fits(M, K, N, epi == StreamEpi::SwiGLU));
          detail::skinny_variant() = variant;
          detail::stream_gemv(q, stream());
          detail::skinny_variant() = -1;
          const std::string what = "variant " + std::to_string(variant) + " M " + std::to_string(M) + " K " +
                                   std::to_string(K) + " N " + std::to_string(N) + " epi " +
                                   std::to_string(int(epi)) + " norm " + std::to_string(norm);
          const ErrStats e = compare(dy.download(), want_y);
          EXPECT_TRUE(e.all_finite) << what;
          EXPECT_LE(e.rel_l2, 1e-5) << what;
          if (epi == StreamEpi::Accumulate) {
            const ErrStats e2 = compare(dy2.download(), want_y2);
            EXPECT_TRUE(e2.all_finite) << what << " (y2)";
            EXPECT_LE(e2.rel_l2, 1e-5) << what << " (y2)";
          }
        }
  EXPECT_FALSE(detail::stream_gemv_fits(1, 4096, 1031, true));  // SwiGLU needs gate and up halves
}

TEST_F(CudaMatmul, TensorCorePath) {
  uint32_t seed = 200;
  for (int64_t M : {17, 33, 64, 130})
    for (auto kn : std::vector<std::pair<int64_t, int64_t>>{{64, 1}, {256, 31}, {1024, 4097}, {4096, 256}})
      run_matmul({M, kn.first, kn.second, 0, 0}, seed++);
  // Strided x / y, and an odd K (cuBLASLt or the generic kernel).
  run_matmul({40, 520, 72, 8, 4}, seed++);
  run_matmul({20, 33, 17, 1, 1}, seed++);
}

TEST_F(CudaMatmul, PreconvertedInput) {
  std::mt19937 rng(9);
  const int64_t M = 48, K = 1024, N = 333;
  std::vector<float> x = randn(size_t(M * K), rng);
  std::vector<uint16_t> w = rand_bf16(size_t(N * K), rng);
  Dev<float> dx(x), dy(size_t(M * N));
  Dev<uint16_t> dxb(size_t(M * K)), dw(w);
  to_bf16(dx.get(), M, K, K, dxb.get(), stream());
  const std::vector<uint16_t> xb = dxb.download();
  std::vector<float> xr(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(xb[i], f32_to_bf16(x[i])) << i;
    xr[i] = bf16_to_f32(xb[i]);
  }
  std::vector<float> ref(size_t(M * N));
  cpu::matmul(xr.data(), M, K, K, w.data(), DType::BF16, N, ref.data(), N, ThreadPool::global());
  dy.poison();
  matmul_bf16_xb(dxb.get(), M, K, dw.get(), N, dy.get(), N, stream());
  const ErrStats e = compare(dy.download(), ref);
  EXPECT_TRUE(e.all_finite);
  EXPECT_LE(e.rel_l2, 1e-5);
}

// A split-K matmul captured in a CUDA graph and replayed gives the same result
// each time (the per-tile counters return to zero).
TEST_F(CudaMatmul, GraphReplay) {
  std::mt19937 rng(10);
  const int64_t M = 2, K = 4096, N = 512;
  std::vector<float> x = randn(size_t(M * K), rng);
  std::vector<uint16_t> w = rand_bf16(size_t(N * K), rng);
  std::vector<float> ref(size_t(M * N));
  cpu::matmul(x.data(), M, K, K, w.data(), DType::BF16, N, ref.data(), N, ThreadPool::global());
  Dev<float> dx(x), dy(size_t(M * N));
  Dev<uint16_t> dw(w);
  Stream s = stream();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "begin capture");
  matmul_bf16(dx.get(), M, K, K, dw.get(), N, dy.get(), N, s);
  check(cudaStreamEndCapture(s, &graph), "end capture");
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (int rep = 0; rep < 3; ++rep) {
    dy.poison();
    check(cudaGraphLaunch(exec, s), "launch");
    EXPECT_LE(compare(dy.download(), ref).rel_l2, 1e-5) << "replay " << rep;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// ---- element-wise ops ---------------------------------------------------------------

using CudaOps = CudaTest;

TEST_F(CudaOps, Embedding) {
  std::mt19937 rng(20);
  for (int64_t d_model : {1, 31, 33, 4096}) {
    const int64_t n_vocab = 97, n_tokens = 9;
    std::vector<uint16_t> table = rand_bf16(size_t(n_vocab * d_model), rng);
    std::vector<int32_t> ids = {0, 96, 5, 5, 17, 0, 50, 96, 1};
    std::vector<float> ref(size_t(n_tokens * d_model));
    cpu::embedding(table.data(), DType::BF16, d_model, ids, ref.data());
    Dev<uint16_t> dt(table);
    Dev<int32_t> di(ids);
    Dev<float> dout(ref.size());
    dout.poison();
    embedding(dt.get(), d_model, di.get(), n_tokens, dout.get(), stream());
    const std::vector<float> got = dout.download();
    ASSERT_EQ(0, std::memcmp(got.data(), ref.data(), ref.size() * 4)) << "d_model " << d_model;
  }
}

TEST_F(CudaOps, RmsNorm) {
  std::mt19937 rng(21);
  for (int64_t D : {1, 31, 33, 4096, 4097})
    for (int64_t M : {1, 3, 7})
      for (bool in_place : {false, true}) {
        std::vector<float> x = randn(size_t(M * D), rng, -3.f, 3.f), w = randn(size_t(D), rng);
        std::vector<float> ref(x.size());
        cpu::rms_norm(x.data(), w.data(), 1e-6f, M, D, ref.data());
        Dev<float> dx(x), dw(w), dy(x.size());
        dy.poison();
        float* out = in_place ? dx.get() : dy.get();
        rms_norm(dx.get(), dw.get(), 1e-6f, M, D, out, stream());
        const std::vector<float> got = in_place ? dx.download() : dy.download();
        for (size_t i = 0; i < ref.size(); ++i)
          ASSERT_NEAR(got[i], ref[i], 2e-6 * std::fabs(ref[i]) + 1e-6) << "D=" << D << " M=" << M << " i=" << i;
      }
}

TEST_F(CudaOps, AddAndSwiglu) {
  std::mt19937 rng(22);
  for (int64_t n : {1, 31, 33, 4097, (1 << 20) + 3})
    for (int64_t offset : {0, 1}) {  // offset 1: not 16-byte aligned
      std::vector<float> a = randn(size_t(n + offset), rng, -8.f, 8.f), b = randn(size_t(n + offset), rng, -8.f, 8.f);
      Dev<float> da(a), db(b), dout(size_t(n + offset));
      // add
      std::vector<float> ref_add(a);
      cpu::add_inplace(ref_add.data() + offset, b.data() + offset, n);
      add_inplace(da.get() + offset, db.get() + offset, n, stream());
      std::vector<float> got = da.download();
      ASSERT_EQ(0, std::memcmp(got.data(), ref_add.data(), got.size() * 4)) << "add n=" << n;
      // swiglu (gate = a, up = b)
      std::vector<float> ref(static_cast<size_t>(n));
      cpu::swiglu(a.data() + offset, b.data() + offset, ref.data(), n);
      da.upload(a);
      dout.poison();
      swiglu(da.get() + offset, db.get() + offset, dout.get() + offset, n, stream());
      got = dout.download();
      for (int64_t i = 0; i < n; ++i)
        ASSERT_NEAR(got[size_t(i + offset)], ref[size_t(i)], 2e-6 * std::fabs(ref[size_t(i)]) + 1e-7)
            << "swiglu n=" << n << " i=" << i;
      // swiglu in place on gate
      swiglu(da.get() + offset, db.get() + offset, da.get() + offset, n, stream());
      got = da.download();
      for (int64_t i = 0; i < n; ++i)
        ASSERT_NEAR(got[size_t(i + offset)], ref[size_t(i)], 2e-6 * std::fabs(ref[size_t(i)]) + 1e-7)
            << "swiglu in place n=" << n << " i=" << i;
    }
}

TEST_F(CudaOps, Rope) {
  std::mt19937 rng(23);
  for (int64_t head_dim : {16, 64, 128})
    for (int64_t half : {head_dim / 2, head_dim / 4})
      for (int64_t n_head : {1, 3}) {
        const int64_t n_tokens = 5;
        std::vector<float> x = randn(size_t(n_tokens * n_head * head_dim), rng);
        std::vector<int32_t> pos = {0, 1, 77, 8191, 100000};
        std::vector<float> inv_freq(static_cast<size_t>(half));
        for (int64_t i = 0; i < half; ++i)
          inv_freq[size_t(i)] = float(1.0 / std::pow(1e6, double(2 * i) / double(2 * half)));
        std::vector<float> ref(x);
        cpu::rope(ref.data(), n_tokens, n_head, head_dim, pos, inv_freq);
        Dev<float> dx(x), df(inv_freq);
        Dev<int32_t> dp(pos);
        rope(dx.get(), n_tokens, n_head, head_dim, dp.get(), df.get(), half, stream());
        const std::vector<float> got = dx.download();
        for (size_t i = 0; i < ref.size(); ++i)
          ASSERT_NEAR(got[i], ref[i], 1e-5) << "head_dim=" << head_dim << " half=" << half << " i=" << i;
      }
}

TEST_F(CudaOps, StoreKv) {
  std::mt19937 rng(24);
  for (int64_t kv_dim : {16, 33, 1024}) {
    const int64_t n_tokens = 7, n_slots = 40;
    std::vector<float> k = randn(size_t(n_tokens * kv_dim), rng, -100.f, 100.f);
    std::vector<float> v = randn(size_t(n_tokens * kv_dim), rng, -1e-3f, 1e-3f);
    std::vector<int32_t> slots = {3, 39, 0, -1, 17, 18, 5};  // -1: padding, skipped
    Dev<float> dk(k), dv(v);
    Dev<int32_t> ds(slots);
    Dev<uint16_t> kc(size_t(n_slots * kv_dim)), vc(size_t(n_slots * kv_dim));
    kc.poison(), vc.poison();
    AttnMeta meta;
    meta.slot_mapping = ds.get();
    meta.n_tokens = int32_t(n_tokens);
    store_kv(dk.get(), dv.get(), kv_dim, meta, kc.get(), vc.get(), stream());
    const std::vector<uint16_t> gk = kc.download(), gv = vc.download();
    for (int64_t s = 0; s < n_slots; ++s) {
      const auto it = std::find(slots.begin(), slots.end(), int32_t(s));
      for (int64_t i = 0; i < kv_dim; ++i) {
        const size_t at = size_t(s * kv_dim + i);
        if (it == slots.end()) {
          ASSERT_EQ(gk[at], 0xffff) << "slot " << s << " was written";
          continue;
        }
        const size_t t = size_t(it - slots.begin());
        ASSERT_EQ(gk[at], f32_to_bf16(k[t * size_t(kv_dim) + size_t(i)])) << "k slot " << s << " i " << i;
        ASSERT_EQ(gv[at], f32_to_bf16(v[t * size_t(kv_dim) + size_t(i)])) << "v slot " << s << " i " << i;
      }
    }
  }
}

int32_t cpu_argmax(const float* v, int64_t n) {
  int32_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (v[i] > v[best]) best = int32_t(i);
  return best;
}

TEST_F(CudaOps, Argmax) {
  std::mt19937 rng(25);
  for (int64_t n_vocab : {1, 31, 4097, 151936}) {
    const int64_t n_rows = 5;
    std::vector<float> logits = randn(size_t(n_rows * n_vocab), rng, -20.f, 20.f);
    if (n_vocab > 3) {
      float* r1 = logits.data() + n_vocab;  // row 1: a tie between two maxima
      r1[n_vocab - 1] = 50.f, r1[n_vocab / 2] = 50.f, r1[2] = 49.f;
      float* r2 = logits.data() + 2 * n_vocab;  // row 2: all equal
      std::fill(r2, r2 + n_vocab, 1.5f);
      float* r3 = logits.data() + 3 * n_vocab;  // row 3: all -inf
      std::fill(r3, r3 + n_vocab, -INFINITY);
    }
    Dev<float> dl(logits);
    Dev<int32_t> dout(static_cast<size_t>(n_rows));
    dout.poison();
    HostLanding landing(size_t(n_rows) * 4);  // the ids written to the host as well
    std::fill_n(static_cast<int32_t*>(landing.data()), n_rows, -7);
    argmax(dl.get(), n_rows, n_vocab, dout.get(), static_cast<int32_t*>(landing.data()), stream());
    landing.mark();
    const std::vector<int32_t> got = dout.download();
    const auto* on_host = static_cast<const int32_t*>(landing.wait());
    for (int64_t r = 0; r < n_rows; ++r) {
      EXPECT_EQ(got[size_t(r)], cpu_argmax(logits.data() + r * n_vocab, n_vocab)) << "n_vocab " << n_vocab << " row " << r;
      EXPECT_EQ(on_host[r], got[size_t(r)]) << "n_vocab " << n_vocab << " row " << r;
    }
    if (n_vocab > 3) {
      EXPECT_EQ(got[1], n_vocab / 2);
    }
  }
  // One row (the most splits), many rows (one block a row): the maximum in
  // the last split, NaN never chosen.
  for (int64_t n_rows : {1, 8, 700}) {
    const int64_t n_vocab = 151936;
    std::vector<float> logits = randn(size_t(n_rows * n_vocab), rng, -20.f, 20.f);
    for (int64_t r = 0; r < n_rows; ++r) {
      float* row = logits.data() + r * n_vocab;
      row[n_vocab - 1 - r % 5000] = 30.f;
      row[n_vocab / 3] = NAN;
    }
    Dev<float> dl(logits);
    Dev<int32_t> dout(static_cast<size_t>(n_rows));
    dout.poison();
    for (int rep = 0; rep < 2; ++rep) {  // the split counters are back at zero after a launch
      argmax(dl.get(), n_rows, n_vocab, dout.get(), nullptr, stream());
      const std::vector<int32_t> got = dout.download();
      for (int64_t r = 0; r < n_rows; ++r)
        ASSERT_EQ(got[size_t(r)], n_vocab - 1 - r % 5000) << "n_rows " << n_rows << " row " << r << " rep " << rep;
    }
  }
}

// ---- attention ----------------------------------------------------------------------

struct AttnRowSpec {
  int32_t n_tokens;  // new tokens of this row in the batch
  int32_t pos0;      // position of the first of them (the cache holds 0..pos0+n_tokens-1)
};

struct AttnCase {
  int64_t n_head, n_head_kv, head_dim, block_size;
  std::vector<AttnRowSpec> rows;
  int32_t window = 0;
  int32_t max_context = 0;  // 0: the largest position + 1
  bool decode_hint = false; // set max_row_tokens (1 when every row has one token)
};

std::string describe(const AttnCase& c) {
  std::string s = "heads " + std::to_string(c.n_head) + "/" + std::to_string(c.n_head_kv) + " dim " +
                  std::to_string(c.head_dim) + " block " + std::to_string(c.block_size) + " window " +
                  std::to_string(c.window) + " rows";
  for (const auto& r : c.rows) s += " (" + std::to_string(r.n_tokens) + "@" + std::to_string(r.pos0) + ")";
  return s;
}

// Builds a paged cache with each row's blocks scattered, runs the GPU kernel and
// the CPU reference (on the same bf16 values widened to f32), returns the error.
ErrStats run_attention(const AttnCase& c, uint32_t seed, Stream s = nullptr, bool graph_replay = false) {
  std::mt19937 rng(seed);
  const int64_t D = c.head_dim, kv_dim = c.n_head_kv * D;
  const int64_t n_rows = int64_t(c.rows.size());
  int64_t max_blocks = 1, total_blocks = 0, n_tokens = 0;
  int32_t max_pos = 0, max_row_tokens = 0;
  for (const auto& r : c.rows) {
    const int64_t len = r.pos0 + r.n_tokens;
    max_blocks = std::max(max_blocks, (len + c.block_size - 1) / c.block_size);
    total_blocks += (len + c.block_size - 1) / c.block_size;
    n_tokens += r.n_tokens;
    max_pos = std::max(max_pos, r.pos0 + r.n_tokens - 1);
    max_row_tokens = std::max(max_row_tokens, r.n_tokens);
  }
  const int64_t n_blocks = total_blocks + 3;  // a few never used
  std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> block_tables(size_t(n_rows * max_blocks), 0);
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(n_rows));
  size_t next = 0;
  std::vector<ops::AttnRow> rows;
  std::vector<int32_t> positions, token_row;
  int32_t tb = 0;
  for (int64_t r = 0; r < n_rows; ++r) {
    const auto& spec = c.rows[size_t(r)];
    const int64_t nb = (spec.pos0 + spec.n_tokens + c.block_size - 1) / c.block_size;
    for (int64_t b = 0; b < nb; ++b) {
      block_tables[size_t(r * max_blocks + b)] = perm[next];
      tables[size_t(r)].push_back(perm[next++]);
    }
    rows.push_back({tb, spec.n_tokens, spec.pos0, tables[size_t(r)]});
    for (int32_t i = 0; i < spec.n_tokens; ++i) positions.push_back(spec.pos0 + i), token_row.push_back(int32_t(r));
    tb += spec.n_tokens;
  }
  const size_t cache_elems = size_t(n_blocks * c.block_size * kv_dim);
  std::vector<uint16_t> kc = rand_bf16(cache_elems, rng), vc = rand_bf16(cache_elems, rng);
  std::vector<float> kf(cache_elems), vf(cache_elems);
  for (size_t i = 0; i < cache_elems; ++i) kf[i] = bf16_to_f32(kc[i]), vf[i] = bf16_to_f32(vc[i]);
  std::vector<float> q = randn(size_t(n_tokens * c.n_head * D), rng, -2.f, 2.f);
  const float scale = 1.0f / std::sqrt(float(D));
  std::vector<float> ref(q.size());
  cpu::paged_attention(q.data(), kf.data(), vf.data(), c.block_size, c.n_head, c.n_head_kv, D, rows, scale, c.window,
                       ref.data());

  Dev<float> dq(q), dout(q.size());
  Dev<uint16_t> dk(kc), dv(vc);
  Dev<int32_t> dpos(positions), drow(token_row), dbt(block_tables);
  AttnMeta meta;
  meta.positions = dpos.get();
  meta.token_row = drow.get();
  meta.block_tables = dbt.get();
  meta.max_blocks = int32_t(max_blocks);
  meta.n_tokens = int32_t(n_tokens);
  meta.max_context = c.max_context > 0 ? c.max_context : max_pos + 1;
  meta.max_row_tokens = c.decode_hint ? max_row_tokens : 0;
  const size_t ws_bytes = attention_workspace_bytes(n_tokens, c.n_head, D, meta.max_context);
  Dev<float> ws(ws_bytes / 4 + 1);
  if (s == nullptr) s = stream();
  dout.poison();
  if (!graph_replay) {
    paged_attention(dq.get(), dk.get(), dv.get(), c.block_size, c.n_head, c.n_head_kv, D, meta, scale, c.window,
                    dout.get(), ws.get(), s);
  } else {
    // Capture with the positions shifted back, then replay with the real ones:
    // the graph must follow positions it reads on the device.
    std::vector<int32_t> early(positions);
    for (auto& p : early) p = std::max(0, p / 3);
    dpos.upload(early);
    paged_attention(dq.get(), dk.get(), dv.get(), c.block_size, c.n_head, c.n_head_kv, D, meta, scale, c.window,
                    dout.get(), ws.get(), s);  // warm-up (first use sets kernel attributes)
    synchronize();
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return {1e9, 1e9, false};
    paged_attention(dq.get(), dk.get(), dv.get(), c.block_size, c.n_head, c.n_head_kv, D, meta, scale, c.window,
                    dout.get(), ws.get(), s);
    if (cudaStreamEndCapture(s, &graph) != cudaSuccess) return {1e9, 1e9, false};
    if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) return {1e9, 1e9, false};
    dpos.upload(positions);
    dout.poison();
    if (cudaGraphLaunch(exec, s) != cudaSuccess) return {1e9, 1e9, false};
    synchronize();
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  return compare(dout.download(), ref);
}

using CudaAttention = CudaTest;

// Decode attention runs on tensor cores (groups of at most 16 heads; Q and P
// rounded to the caches' type, as prefill: prefill's tolerance) unless the
// f32-attention experiment (Precision::decode_attention) selects the scalar
// flash-decoding kernel (f32 Q and P: 2e-5). Decode tests run in both modes.
struct DecodeMode {
  explicit DecodeMode(bool scalar) : saved(detail::precision()) { detail::precision().decode_attention = scalar; }
  ~DecodeMode() { detail::precision() = saved; }
  detail::Precision saved;
};
bool scalar_decode() { return detail::precision().decode_attention; }
double decode_tol() { return scalar_decode() ? 2e-5 : 2e-2; }

void expect_decode_ok(const AttnCase& c, uint32_t seed) {
  for (bool scalar : {false, true}) {
    DecodeMode mode(scalar);
    const ErrStats e = run_attention(c, seed);
    EXPECT_TRUE(e.all_finite) << describe(c) << (scalar ? " (scalar)" : " (tensor cores)");
    EXPECT_LE(e.max_abs, decode_tol()) << describe(c) << (scalar ? " (scalar)" : " (tensor cores)");
    EXPECT_LE(e.rel_l2, scalar ? 1e-5 : 1e-2) << describe(c) << (scalar ? " (scalar)" : " (tensor cores)");
  }
}

void expect_prefill_ok(const AttnCase& c, uint32_t seed) {
  const ErrStats e = run_attention(c, seed);
  EXPECT_TRUE(e.all_finite) << describe(c);
  EXPECT_LE(e.max_abs, 2e-2) << describe(c);
  EXPECT_LE(e.rel_l2, 1e-2) << describe(c);
}

TEST_F(CudaAttention, DecodeSmall) {
  expect_decode_ok({4, 2, 16, 4, {{1, 0}}}, 1);
  expect_decode_ok({4, 2, 32, 16, {{1, 9}, {1, 130}, {1, 3}}}, 2);
  expect_decode_ok({8, 2, 128, 16, {{1, 300}}, 0, 1024}, 3);
}

TEST_F(CudaAttention, DecodeContextsAndGroups) {
  uint32_t seed = 10;
  for (int64_t D : {16, 32, 64, 128, 256})
    for (auto heads : std::vector<std::pair<int64_t, int64_t>>{{4, 4}, {8, 4}, {32, 8}, {12, 2}, {16, 1}})
      for (int32_t ctx : {1, 33, 129, 1000}) expect_decode_ok({heads.first, heads.second, D, 16, {{1, ctx - 1}}}, seed++);
  // Long contexts, many splits, odd block sizes.
  for (int64_t bs : {1, 7, 32}) expect_decode_ok({32, 8, 128, bs, {{1, 5000}}}, seed++);
  expect_decode_ok({32, 8, 128, 16, {{1, 8191}}}, seed++);
}

TEST_F(CudaAttention, DecodeBatchesWindowsAndGridSlack) {
  uint32_t seed = 100;
  // Rows of different lengths in one batch (n_tokens <= 8: flash-decoding).
  expect_decode_ok({32, 8, 128, 16, {{1, 0}, {1, 1}, {1, 200}, {1, 4000}, {1, 17}}}, seed++);
  // A decode batch of 20 rows (max_row_tokens = 1 selects flash-decoding).
  std::vector<AttnRowSpec> many;
  for (int i = 0; i < 20; ++i) many.push_back({1, i * 97 % 1500});
  expect_decode_ok({16, 4, 64, 16, many, 0, 0, true}, seed++);
  // Several tokens per row still on the decode path (n_tokens <= 8).
  expect_decode_ok({8, 2, 64, 16, {{3, 10}, {4, 0}}}, seed++);
  // Sliding windows.
  for (int32_t window : {1, 5, 64, 700}) expect_decode_ok({8, 2, 128, 16, {{1, 1000}, {1, 3}}, window}, seed++);
  // max_context far above the real lengths (a graph captured for long contexts).
  expect_decode_ok({32, 8, 128, 16, {{1, 50}, {1, 700}}, 0, 32768}, seed++);
}

TEST_F(CudaAttention, PrefillSmall) {
  expect_prefill_ok({4, 2, 16, 4, {{9, 0}}}, 1);
  expect_prefill_ok({8, 2, 64, 16, {{12, 0}, {5, 7}}}, 2);
}

TEST_F(CudaAttention, PrefillVarlen) {
  uint32_t seed = 200;
  for (int64_t D : {16, 32, 64, 128, 256})
    for (auto heads : std::vector<std::pair<int64_t, int64_t>>{{4, 4}, {8, 2}, {32, 8}, {12, 4}, {16, 1}})
      expect_prefill_ok({heads.first, heads.second, D, 16, {{37, 0}, {100, 50}, {1, 10}, {64, 3}}}, seed++);
  for (int64_t bs : {1, 5, 64}) expect_prefill_ok({32, 8, 128, bs, {{300, 0}, {129, 1000}}}, seed++);
  for (int32_t window : {1, 16, 100}) expect_prefill_ok({8, 2, 128, 16, {{200, 0}, {50, 300}}, window}, seed++);
  // Many single-token rows without the decode hint: every tile holds several segments.
  std::vector<AttnRowSpec> many;
  for (int i = 0; i < 40; ++i) many.push_back({1 + i % 3, i * 13});
  expect_prefill_ok({8, 2, 64, 16, many}, seed++);
}

TEST_F(CudaAttention, DecodeGraphReplay) {
  // Captured for max_context 4096 with short positions, replayed with longer ones.
  for (auto c : std::vector<AttnCase>{{32, 8, 128, 16, {{1, 3000}}, 0, 4096},
                                      {32, 8, 128, 16, {{1, 100}, {1, 4000}, {1, 2}}, 0, 4096},
                                      {8, 2, 64, 16, {{1, 900}}, 128, 4096}})
    for (bool scalar : {false, true}) {
      DecodeMode mode(scalar);
      const ErrStats e = run_attention(c, 300, nullptr, true);
      EXPECT_TRUE(e.all_finite) << describe(c);
      EXPECT_LE(e.max_abs, decode_tol()) << describe(c) << (scalar ? " (scalar)" : " (tensor cores)");
    }
}

// Flash-decoding with a forced split length, twice in a row on the same
// buffers (cache, q, out, workspace and the Context's split counters), the
// second time at other positions: rows whose context spans several splits
// come to fit one and the reverse, so a counter the first launch left
// non-zero would leave outputs unwritten (poisoned) or merged early. Each
// launch is repeated bit-identically (splits merge in split order, whichever
// block ends last), then both are replayed twice through one CUDA graph.
struct DecodeTwiceCase {
  int64_t n_head, n_head_kv, head_dim;
  int split_len;
  std::vector<int32_t> first, second;  // position of each row's one token, per launch
  int32_t window = 0;
};

std::string describe(const DecodeTwiceCase& c) {
  std::string s = "heads " + std::to_string(c.n_head) + "/" + std::to_string(c.n_head_kv) + " dim " +
                  std::to_string(c.head_dim) + " split_len " + std::to_string(c.split_len) + " window " +
                  std::to_string(c.window) + " positions";
  for (size_t r = 0; r < c.first.size(); ++r) {
    s += ' ';
    s += std::to_string(c.first[r]);
    s += "->";
    s += std::to_string(c.second[r]);
  }
  return s;
}

void run_decode_twice(const DecodeTwiceCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t D = c.head_dim, bs = 16, n_rows = int64_t(c.first.size());
  int32_t max_pos = 0;
  for (size_t r = 0; r < c.first.size(); ++r) max_pos = std::max({max_pos, c.first[r], c.second[r]});
  const int64_t max_blocks = (max_pos + bs) / bs, n_blocks = n_rows * max_blocks;
  std::vector<int32_t> tables(static_cast<size_t>(n_blocks));  // [n_rows, max_blocks], blocks scattered
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), rng);
  std::vector<int32_t> token_row(static_cast<size_t>(n_rows));
  std::iota(token_row.begin(), token_row.end(), 0);
  const size_t cache_elems = size_t(n_blocks * bs * c.n_head_kv * D);
  std::vector<uint16_t> kc = rand_bf16(cache_elems, rng), vc = rand_bf16(cache_elems, rng);
  std::vector<float> kf(cache_elems), vf(cache_elems);
  for (size_t i = 0; i < cache_elems; ++i) kf[i] = bf16_to_f32(kc[i]), vf[i] = bf16_to_f32(vc[i]);
  const float scale = 1.0f / std::sqrt(float(D));
  const size_t q_elems = size_t(n_rows * c.n_head * D);

  struct Launch {
    std::vector<int32_t> positions;
    std::vector<float> q, ref;
  };
  std::vector<Launch> launches;
  for (const std::vector<int32_t>* pos : {&c.first, &c.second}) {
    Launch l{*pos, randn(q_elems, rng, -2.f, 2.f), std::vector<float>(q_elems)};
    std::vector<ops::AttnRow> rows;
    for (int64_t r = 0; r < n_rows; ++r)
      rows.push_back({int32_t(r), 1, (*pos)[size_t(r)],
                      std::span<const int32_t>(tables.data() + r * max_blocks, size_t(max_blocks))});
    cpu::paged_attention(l.q.data(), kf.data(), vf.data(), bs, c.n_head, c.n_head_kv, D, rows, scale, c.window,
                         l.ref.data());
    launches.push_back(std::move(l));
  }

  Dev<float> dq(q_elems), dout(q_elems);
  Dev<float> ws(size_t(n_rows * c.n_head) * size_t((max_pos + c.split_len) / c.split_len) * size_t(D + 2));
  Dev<uint16_t> dk(kc), dv(vc);
  Dev<int32_t> dpos(c.first), drow(token_row), dbt(tables);
  AttnMeta meta;
  meta.positions = dpos.get();
  meta.token_row = drow.get();
  meta.block_tables = dbt.get();
  meta.max_blocks = int32_t(max_blocks);
  meta.n_tokens = int32_t(n_rows);
  meta.max_context = max_pos + 1;
  meta.max_row_tokens = 1;
  auto decode = [&] {
    detail::paged_attention_decode(dq.get(), dk.get(), dv.get(), bs, c.n_head, c.n_head_kv, D, meta, scale, c.window,
                                   dout.get(), ws.get(), stream(), c.split_len);
  };
  auto expect_ok = [&](const std::vector<float>& got, const Launch& l, const std::string& what) {
    const ErrStats e = compare(got, l.ref);
    EXPECT_TRUE(e.all_finite) << what << ": " << describe(c);
    EXPECT_LE(e.max_abs, decode_tol()) << what << ": " << describe(c) << (scalar_decode() ? " (scalar)" : " (tensor cores)");
  };

  for (size_t i = 0; i < launches.size(); ++i) {
    const Launch& l = launches[i];
    dpos.upload(l.positions);
    dq.upload(l.q);
    ws.poison();  // a merge may read only partials written by its own launch
    dout.poison();
    decode();
    const std::vector<float> got = dout.download();
    expect_ok(got, l, "launch " + std::to_string(i));
    dout.poison();
    decode();
    const std::vector<float> again = dout.download();
    EXPECT_EQ(std::memcmp(again.data(), got.data(), got.size() * sizeof(float)), 0)
        << "launch " << i << " repeated differs: " << describe(c);
  }

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  decode();
  ASSERT_EQ(cudaStreamEndCapture(stream(), &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int rep = 0; rep < 2; ++rep)
    for (size_t i = 0; i < launches.size(); ++i) {
      dpos.upload(launches[i].positions);
      dq.upload(launches[i].q);
      dout.poison();
      EXPECT_EQ(cudaGraphLaunch(exec, stream()), cudaSuccess);
      expect_ok(dout.download(), launches[i], "replay " + std::to_string(rep) + " of launch " + std::to_string(i));
    }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST_F(CudaAttention, DecodeTwiceOnSameBuffers) {
  for (bool scalar : {false, true}) {
    DecodeMode mode(scalar);
    uint32_t seed = 400;
    // Qwen3-8B heads (GP 4): 16 splits -> fits one, 11 -> 16, fits one -> 5.
    run_decode_twice({32, 8, 128, 64, {1000, 700, 5}, {40, 1000, 300}}, seed++);
    // GQA 12 (scalar: two head passes of 8 and 4 heads); head_dim 256.
    run_decode_twice({24, 2, 256, 128, {517, 3}, {900, 129}}, seed++);
    // One head per block, head_dim 16: 32 thread groups share each output lane of the merge.
    run_decode_twice({4, 4, 16, 32, {300, 31}, {31, 100}}, seed++);
    // A split length that is not a multiple of the stage; a row at position 0.
    run_decode_twice({8, 2, 64, 48, {0, 500, 199}, {700, 47, 200}}, seed++);
    // Sliding window: the splits counted from the window's first key.
    run_decode_twice({8, 2, 128, 64, {1000, 90}, {300, 1000}, 200}, seed++);
  }
}

TEST_F(CudaAttention, RejectsBadShapes) {
  AttnMeta meta;
  meta.n_tokens = 1;
  meta.max_context = 16;
  meta.max_blocks = 1;
  Dev<float> dq(64), dout(64);
  Dev<uint16_t> dk(64);
  EXPECT_THROW(paged_attention(dq.get(), dk.get(), dk.get(), 16, 3, 2, 16, meta, 1.f, 0, dout.get(), nullptr, stream()),
               Error);
  EXPECT_THROW(paged_attention(dq.get(), dk.get(), dk.get(), 16, 2, 2, 24, meta, 1.f, 0, dout.get(), nullptr, stream()),
               Error);
}

}  // namespace
}  // namespace augur::cuda
