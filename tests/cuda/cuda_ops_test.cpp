// CUDA op tests: the matmul and element-wise kernels of backend/cuda/kernels.h
// against the CPU op (backend/cpu) on random inputs of odd sizes (attention:
// cuda_attention_test.cpp). Outputs are poisoned (NaN) before each run, so an
// element left unwritten fails.
//
// Tolerances, by what the kernel rounds:
//   exact (bitwise): embedding, add, store_kv (f32 -> bf16 RNE), argmax, to_bf16;
//   f32-class: rms_norm, swiglu, rope, skinny matmul (M <= 8, f32 products):
//     |err| <= 1e-5..1e-4 of the output scale (see each test);
//   bf16 operands: cuBLASLt matmul (x rounded to bf16): |err| <= 1e-2 * sum|x w|,
//     rel-L2 <= 1e-2.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops_cpu.h"
#include "backend/cuda/cublaslt.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/memory.h"
#include "backend/cuda/detail.h"
#include "backend/ops.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "cuda_test_util.h"

namespace augur::cuda {
namespace {

void check(cudaError_t e, const char* what) { ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e); }

// ---- cuBLASLt -----------------------------------------------------------------

// The library is opened on first use, not linked: every entry point the
// backend calls resolves (no GPU needed), and the library answers.
TEST(CudaLt, OpensTheLibraryOnFirstUse) {
  const LtApi& api = lt_api();
#define AUGUR_LT_CHECK(member, symbol) EXPECT_NE(api.member, nullptr) << #symbol;
  AUGUR_LT_ENTRY_POINTS(AUGUR_LT_CHECK)
#undef AUGUR_LT_CHECK
  cublasLtMatmulPreference_t pref = nullptr;
  ASSERT_EQ(api.preference_create(&pref), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(api.preference_destroy(pref), CUBLAS_STATUS_SUCCESS);
}

// ---- matmul -------------------------------------------------------------------

struct MatmulCase {
  int64_t M, K, N, ldx_pad, ldy_pad;
};

// y = x·wᵀ on the GPU vs cpu::matmul; per-output tolerance tol * sum_k |x w|:
// f32-class on the skinny path (M <= 8), bf16-class on cuBLASLt (x rounded).
void run_matmul(const MatmulCase& c, uint32_t seed) {
  const bool skinny = c.M <= detail::kSkinnyMaxM;
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

// rows_kernel for every M it takes and any split-K factor gives the same
// sums within rounding (and a split launch leaves the counters at zero).
// K = 4104 ends in a partial pass.
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
      for (int splits : {1, 2, 3, 7, 16, 1000})
        for (int rep = 0; rep < 2; ++rep) {
          dy.poison();
          detail::skinny_matmul(dx.get(), M, K, K, dw.get(), N, dy.get(), N, stream(), splits);
          const ErrStats e = compare(dy.download(), ref);
          EXPECT_TRUE(e.all_finite) << "M " << M << " K " << K << " splits " << splits;
          EXPECT_LE(e.rel_l2, 1e-5) << "M " << M << " K " << K << " splits " << splits;
        }
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
        EXPECT_LE(e.rel_l2, M <= 8 && D % 8 == 0 ? 1e-5 : 5e-3) << "M " << M << " D " << D << " f16 " << f16;
      }
}

// Run to run bit-identical: rows_kernel's split-K path and the stream
// kernel (its cross-warp sums in fixed order), M = 1 and 2.
TEST_F(CudaMatmul, Deterministic) {
  std::mt19937 rng(8);
  const int64_t K = 4096, N = 1024;
  const int splits = detail::skinny_splits(1, K, N);
  ASSERT_GT(splits, 1);  // rows_kernel splits K
  Dev<uint16_t> dw(rand_bf16(size_t(N * K), rng));
  for (int64_t M : {1, 2})
    for (const bool stream_kernel : {false, true}) {
      Dev<float> dx(randn(size_t(M * K), rng)), dy(size_t(M * N));
      auto run = [&] {
        if (stream_kernel) {
          detail::StreamGemv q;
          q.x = dx.get(), q.M = M, q.K = K, q.ldx = K, q.w = dw.get(), q.N = N, q.y = dy.get(), q.ldy = N;
          detail::stream_gemv(q, stream());
        } else {
          detail::skinny_matmul(dx.get(), M, K, K, dw.get(), N, dy.get(), N, stream(), splits);
        }
      };
      run();
      const std::vector<float> a = dy.download();
      for (int rep = 0; rep < 5; ++rep) {
        dy.poison();
        run();
        const std::vector<float> b = dy.download();
        ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "M " << M << " stream " << stream_kernel;
      }
    }
}

// The stream kernel on shapes that end mid-stage: K not a multiple of the
// stage's columns (4104, 5120, 8), N not a multiple of the rows a stage or of
// the SM count, bf16 and f16, against the CPU with f32 products.
TEST_F(CudaMatmul, StreamKernelShapes) {
  std::mt19937 rng(12);
  for (const bool f16 : {false, true})
    for (int64_t M : {1, 2, 3, 5, 8})
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
        detail::StreamGemv q;
        q.x = dx.get(), q.M = M, q.K = K, q.ldx = K, q.w = dw.get(), q.wt = f16 ? Half::F16 : Half::BF16;
        q.N = N, q.y = dy.get(), q.ldy = N;
        detail::stream_gemv(q, stream());
        const ErrStats e = compare(dy.download(), ref);
        const std::string what = "M " + std::to_string(M) + " K " + std::to_string(K) + " N " +
                                 std::to_string(N) + " f16 " + std::to_string(f16);
        EXPECT_TRUE(e.all_finite) << what;
        EXPECT_LE(e.rel_l2, 1e-5) << what;
      }
}

// The stream GEMV's fused ends (detail::StreamGemv) against the CPU: the norm
// in front, Accumulate (with y2) and SwiGLU behind, on shapes that end mid-stage
// and mid-group, with fewer units than SMs, and with a smaller ring.
TEST_F(CudaMatmul, StreamFusedEnds) {
  using detail::StreamEpi;
  std::mt19937 rng(13);
  const std::pair<StreamEpi, bool> ends[] = {
      {StreamEpi::Store, true}, {StreamEpi::Accumulate, false}, {StreamEpi::SwiGLU, true}};
  for (const int ring_kb : {160, 144})
    for (int64_t M : {1, 2, 4, 7})
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
          q.ring_kb = ring_kb;
          ASSERT_TRUE(detail::stream_gemv_fits(M, K, N, epi == StreamEpi::SwiGLU));
          detail::stream_gemv(q, stream());
          const std::string what = "ring " + std::to_string(ring_kb) + " M " + std::to_string(M) + " K " +
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

// A verify step's rows are computed as a decode step's: every row of an
// M-row product (M = 3..8, the stream kernel's wide form, and rows_kernel on
// short matrices) is bit-equal to the same row multiplied alone, for every
// fused end. This is what makes speculative greedy decoding equal plain
// greedy decoding on the GPU.
TEST_F(CudaMatmul, RowsOfAWiderProductEqualRowsAlone) {
  using detail::StreamEpi;
  std::mt19937 rng(14);
  const std::pair<StreamEpi, bool> ends[] = {{StreamEpi::Store, false},
                                             {StreamEpi::Store, true},
                                             {StreamEpi::Accumulate, false},
                                             {StreamEpi::SwiGLU, true}};
  for (auto kn : std::vector<std::pair<int64_t, int64_t>>{{4096, 1024}, {12288, 4100}, {4104, 24576}, {2048, 300}})
    for (const auto& [epi, norm] : ends)
      for (int64_t M : {3, 4, 5, 8}) {
        const int64_t K = kn.first, N = kn.second, ldy = epi == StreamEpi::SwiGLU ? N / 2 : N;
        const std::vector<float> x = randn(size_t(M * K), rng), g = randn(size_t(K), rng);
        const std::vector<float> y0 = randn(size_t(M * ldy), rng);
        const std::vector<uint16_t> w = rand_bf16(size_t(N * K), rng);
        Dev<float> dx(x), dg(g), dy(y0.size()), dy2(size_t(M * ldy));
        Dev<uint16_t> dw(w);
        auto run = [&](int64_t m0, int64_t rows) {
          detail::StreamGemv q;
          q.x = dx.get() + m0 * K, q.M = rows, q.K = K, q.ldx = K, q.w = dw.get(), q.N = N;
          q.y = dy.get() + m0 * ldy, q.ldy = ldy, q.epi = epi, q.norm = norm, q.g = dg.get(), q.eps = 1e-6f;
          if (epi == StreamEpi::Accumulate) q.y2 = dy2.get() + m0 * ldy;
          if (detail::stream_gemv_fits(rows, K, N, epi == StreamEpi::SwiGLU) && !norm && epi == StreamEpi::Store)
            detail::skinny_matmul(q.x, rows, K, K, dw.get(), N, q.y, ldy, stream());  // the dispatch
          else
            detail::stream_gemv(q, stream());
        };
        auto reset = [&] {
          dy.upload(y0);
          dy2.poison();
        };
        reset();
        run(0, M);
        const std::vector<float> together = dy.download(), together2 = dy2.download();
        reset();
        for (int64_t m = 0; m < M; ++m) run(m, 1);
        const std::vector<float> alone = dy.download(), alone2 = dy2.download();
        const std::string what = "M " + std::to_string(M) + " K " + std::to_string(K) + " N " + std::to_string(N) +
                                 " epi " + std::to_string(int(epi)) + " norm " + std::to_string(norm);
        ASSERT_EQ(0, std::memcmp(together.data(), alone.data(), alone.size() * 4)) << what;
        if (epi == StreamEpi::Accumulate) {
          ASSERT_EQ(0, std::memcmp(together2.data(), alone2.data(), alone2.size() * 4)) << what << " (y2)";
        }
      }
  // Short matrices take rows_kernel (split K) at every M.
  for (int64_t M : {3, 8}) {
    const int64_t K = 4096, N = 256;
    Dev<float> dx(randn(size_t(M * K), rng)), dy(size_t(M * N));
    Dev<uint16_t> dw(rand_bf16(size_t(N * K), rng));
    matmul_bf16(dx.get(), M, K, K, dw.get(), N, dy.get(), N, stream());
    const std::vector<float> together = dy.download();
    for (int64_t m = 0; m < M; ++m) matmul_bf16(dx.get() + m * K, 1, K, K, dw.get(), N, dy.get() + m * N, N, stream());
    const std::vector<float> alone = dy.download();
    ASSERT_EQ(0, std::memcmp(together.data(), alone.data(), alone.size() * 4)) << "rows_kernel, M " << M;
  }
}

TEST_F(CudaMatmul, TensorCorePath) {
  uint32_t seed = 200;
  for (int64_t M : {17, 33, 64, 130})
    for (auto kn : std::vector<std::pair<int64_t, int64_t>>{{64, 1}, {256, 31}, {1024, 4097}, {4096, 256}})
      run_matmul({M, kn.first, kn.second, 0, 0}, seed++);
  // Strided x / y, and an odd K (cuBLASLt or the generic kernel).
  run_matmul({40, 520, 72, 8, 4}, seed++);
  run_matmul({20, 33, 17, 1, 1}, seed++);
  // Lengths that run their power-of-two bucket's algorithm (gemm_lt.cu).
  run_matmul({1000, 2048, 1536, 0, 0}, seed++);
  run_matmul({2047, 512, 3072, 0, 8}, seed++);
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

// Rows beyond stream_rows() go to cuBLASLt (the bits of to_bf16 then
// matmul_bf16_xb); rows within it keep the stream GEMV's (each row as it
// would be alone). A limit outside 1..8 is an error.
TEST_F(CudaMatmul, StreamRowsPickTheKernel) {
  std::mt19937 rng(15);
  const int64_t M = 6, K = 4096, N = 4096;
  Dev<float> dx(randn(size_t(M * K), rng)), dy(size_t(M * N)), dlt(size_t(M * N)), dalone(size_t(M * N));
  Dev<uint16_t> dw(rand_bf16(size_t(N * K), rng)), dxb(size_t(M * K));
  to_bf16(dx.get(), M, K, K, dxb.get(), stream());
  matmul_bf16_xb(dxb.get(), M, K, dw.get(), N, dlt.get(), N, stream());
  for (int64_t m = 0; m < M; ++m)
    matmul_bf16(dx.get() + m * K, 1, K, K, dw.get(), N, dalone.get() + m * N, N, stream());
  const std::vector<float> lt = dlt.download(), alone = dalone.download();

  ASSERT_EQ(stream_rows(), 8);
  const int64_t was = set_stream_rows(5);
  EXPECT_EQ(was, 8);
  EXPECT_EQ(stream_rows(), 5);
  EXPECT_FALSE(norm_matmul_fits(M, K, N));
  EXPECT_TRUE(norm_matmul_fits(5, K, N));
  dy.poison();
  matmul_bf16(dx.get(), M, K, K, dw.get(), N, dy.get(), N, stream());
  std::vector<float> got = dy.download();
  EXPECT_EQ(0, std::memcmp(got.data(), lt.data(), lt.size() * 4)) << "6 rows past a limit of 5: cuBLASLt";
  dy.poison();
  matmul_bf16(dx.get(), 5, K, K, dw.get(), N, dy.get(), N, stream());
  got = dy.download();
  EXPECT_EQ(0, std::memcmp(got.data(), alone.data(), size_t(5 * N) * 4)) << "5 rows within it: the stream GEMV";
  set_stream_rows(was);

  dy.poison();
  matmul_bf16(dx.get(), M, K, K, dw.get(), N, dy.get(), N, stream());
  got = dy.download();
  EXPECT_EQ(0, std::memcmp(got.data(), alone.data(), alone.size() * 4)) << "6 rows within 8: the stream GEMV";
  EXPECT_THROW(set_stream_rows(0), Error);
  EXPECT_THROW(set_stream_rows(9), Error);
  EXPECT_EQ(stream_rows(), 8);
}

// A forward over rows of one token each gives the stream GEMV
// decode_stream_rows(d_model) rows; one with a window of several tokens (a
// verify, a prefill chunk) and work on the CPU leave it at 8.
TEST_F(CudaMatmul, ForwardsSetTheStreamRowsByTheirLongestRow) {
  EXPECT_EQ(ops::decode_stream_rows(4096), 5);
  EXPECT_EQ(ops::decode_stream_rows(5120), 3);
  {
    const ops::ProductKernels decode(Device::CUDA, 1, 5120);
    EXPECT_EQ(stream_rows(), 3);
  }
  EXPECT_EQ(stream_rows(), 8);
  {
    const ops::ProductKernels verify(Device::CUDA, 5, 4096);
    EXPECT_EQ(stream_rows(), 8);
  }
  {
    const ops::ProductKernels host(Device::CPU, 1, 4096);
    EXPECT_EQ(stream_rows(), 8);
  }
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

}  // namespace
}  // namespace augur::cuda
