// cpu::matmul: every path against a float64 reference, and the exactness
// property the engine relies on (a row's bits do not depend on the batch, the
// tiling or the thread count).
#include "backend/cpu/matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"

namespace augur::cpu {

void PrintTo(MatmulPath p, std::ostream* os) { *os << matmul_path_name(p); }

namespace {

using MatmulFn = void (*)(const float*, int64_t, int64_t, int64_t, const void*, DType, int64_t,
                          float*, int64_t, ThreadPool&);

MatmulFn fn_of(MatmulPath p) {
  switch (p) {
    case MatmulPath::Scalar: return &matmul_scalar;
    case MatmulPath::Avx2: return &matmul_avx2;
    case MatmulPath::Avx512: return &matmul_avx512;
    case MatmulPath::Avx512Bf16: return &matmul_avx512bf16;
  }
  return nullptr;
}

// Weights as stored ([N, K], bf16 bits or f32) and as the reference reads them.
struct Weights {
  DType dtype;
  std::vector<uint16_t> bf16;
  std::vector<float> f32;
  std::vector<double> value;  // [N, K]
  const void* data() const {
    return dtype == DType::BF16 ? static_cast<const void*>(bf16.data()) : f32.data();
  }
};

Weights make_weights(DType dtype, int64_t N, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  Weights w{dtype, {}, {}, std::vector<double>(size_t(N * K))};
  if (dtype == DType::BF16)
    w.bf16.resize(size_t(N * K));
  else
    w.f32.resize(size_t(N * K));
  for (size_t i = 0; i < size_t(N * K); ++i) {
    const float v = dist(rng);
    if (dtype == DType::BF16) {
      w.bf16[i] = f32_to_bf16(v);
      w.value[i] = bf16_to_f32(w.bf16[i]);
    } else {
      w.f32[i] = v;
      w.value[i] = v;
    }
  }
  return w;
}

// x: [M, K] with row stride ldx; the padding holds NaN, which must never be read.
std::vector<float> make_x(int64_t M, int64_t K, int64_t ldx, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<float> x(size_t(M * ldx), std::numeric_limits<float>::quiet_NaN());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) x[size_t(m * ldx + k)] = dist(rng);
  return x;
}

constexpr float kSentinel = -12345.f;

class MatmulPathTest : public ::testing::TestWithParam<MatmulPath> {
 protected:
  void SetUp() override {
    if (!matmul_path_supported(GetParam()))
      GTEST_SKIP() << matmul_path_name(GetParam()) << " not available on this CPU";
  }
  void run(const float* x, int64_t M, int64_t K, int64_t ldx, const Weights& w, int64_t N, float* y,
           int64_t ldy, ThreadPool& pool) const {
    fn_of(GetParam())(x, M, K, ldx, w.data(), w.dtype, N, y, ldy, pool);
  }
};

// |y - ref| <= 1e-5 * sum_k |x w| (f32-class) for odd sizes, strided x and y
// (the largest products, up to M = 64 x K = 4097 x N = 4097, are skipped).
TEST_P(MatmulPathTest, MatchesFloat64Reference) {
  ThreadPool pool(2);
  constexpr double kTol = 1e-5;
  constexpr int64_t kMaxMacs = int64_t(20) << 20;  // keeps the suite fast
  for (DType dtype : {DType::BF16, DType::F32}) {
    for (int64_t K : {1, 31, 33, 64, 4097}) {
      for (int64_t N : {1, 31, 33, 4097}) {
        const Weights w = make_weights(dtype, N, K, uint32_t(K * 7 + N));
        for (int64_t M : {1, 2, 3, 5, 17, 64}) {
          if (M * N * K > kMaxMacs) continue;
          const int64_t ldx = K + 3, ldy = N + 5;
          const std::vector<float> x = make_x(M, K, ldx, uint32_t(M + K));
          std::vector<float> y(size_t(M * ldy), kSentinel);
          run(x.data(), M, K, ldx, w, N, y.data(), ldy, pool);
          double worst = 0;
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t n = 0; n < N; ++n) {
              double ref = 0, mag = 0;
              for (int64_t k = 0; k < K; ++k) {
                const double p = double(x[size_t(m * ldx + k)]) * w.value[size_t(n * K + k)];
                ref += p;
                mag += std::fabs(p);
              }
              const double err = std::fabs(double(y[size_t(m * ldy + n)]) - ref);
              worst = std::max(worst, err / (mag + 1e-30));
              ASSERT_LE(err, kTol * mag + 1e-30)
                  << dtype_name(dtype) << " M=" << M << " K=" << K << " N=" << N << " at [" << m
                  << ", " << n << "]: " << y[size_t(m * ldy + n)] << " vs " << ref;
            }
            for (int64_t n = N; n < ldy; ++n)
              ASSERT_EQ(y[size_t(m * ldy + n)], kSentinel) << "wrote past row end, M=" << M;
          }
          std::ostringstream key, value;
          key << dtype_name(dtype) << "_M" << M << "_K" << K << "_N" << N;
          value << std::scientific << worst;
          RecordProperty(key.str(), value.str());  // worst error / sum |x w|
        }
      }
    }
  }
}

// Row m of an M-row call is bit-equal to a 1-row call on that row, whatever
// row tiles (remainders included), k-blocks (K = 4097 spans several), chunks
// of rows (M = 250) or split over M (N = 1 cannot be split over N) the batch
// went through.
TEST_P(MatmulPathTest, BatchRowsEqualSingleRows) {
  ThreadPool pool(2);
  struct Shape {
    int64_t K, N;
  };
  for (DType dtype : {DType::BF16, DType::F32}) {
    for (Shape s : {Shape{33, 4097}, Shape{4097, 1}, Shape{4097, 31}, Shape{1031, 300}}) {
      const Weights w = make_weights(dtype, s.N, s.K, 3);
      for (int64_t M : {2, 5, 17, 64, 250}) {
        if (M * s.N * s.K > (int64_t(40) << 20)) continue;
        const std::vector<float> x = make_x(M, s.K, s.K, uint32_t(M));
        std::vector<float> batch(size_t(M * s.N));
        std::vector<float> single(static_cast<size_t>(s.N));
        run(x.data(), M, s.K, s.K, w, s.N, batch.data(), s.N, pool);
        for (int64_t m = 0; m < M; ++m) {
          run(x.data() + m * s.K, 1, s.K, s.K, w, s.N, single.data(), s.N, pool);
          ASSERT_EQ(std::memcmp(single.data(), batch.data() + m * s.N, size_t(s.N) * 4), 0)
              << dtype_name(dtype) << " M=" << M << " K=" << s.K << " N=" << s.N << " row " << m;
        }
      }
    }
  }
}

// 1, 2, 3 and 5 threads give the same bits.
TEST_P(MatmulPathTest, ThreadCountDoesNotChangeBits) {
  ThreadPool p1(1), p2(2), p3(3), p5(5);
  ThreadPool* pools[] = {&p2, &p3, &p5};
  for (DType dtype : {DType::BF16, DType::F32}) {
    for (int64_t M : {1, 3, 17}) {
      for (int64_t N : {31, 700}) {
        const int64_t K = 1031;
        const Weights w = make_weights(dtype, N, K, 5);
        const std::vector<float> x = make_x(M, K, K, 9);
        std::vector<float> want(size_t(M * N));
        std::vector<float> got(want.size());
        run(x.data(), M, K, K, w, N, want.data(), N, p1);
        for (ThreadPool* pool : pools) {
          std::fill(got.begin(), got.end(), 0.f);
          run(x.data(), M, K, K, w, N, got.data(), N, *pool);
          ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0)
              << dtype_name(dtype) << " M=" << M << " N=" << N << " threads=" << pool->size();
        }
      }
    }
  }
}

// K = 0 gives zeros; M = 0 or N = 0 touches nothing.
TEST_P(MatmulPathTest, EmptySizes) {
  ThreadPool pool(2);
  const Weights w = make_weights(DType::BF16, 3, 0, 1);
  std::vector<float> y(6, kSentinel);
  const float x[2] = {1.f, 2.f};
  run(x, 2, 0, 1, w, 3, y.data(), 3, pool);
  for (float v : y) EXPECT_EQ(v, 0.f);
  std::fill(y.begin(), y.end(), kSentinel);
  run(x, 0, 0, 1, w, 3, y.data(), 3, pool);
  run(x, 2, 0, 1, w, 0, y.data(), 3, pool);
  for (float v : y) EXPECT_EQ(v, kSentinel);
}

INSTANTIATE_TEST_SUITE_P(Paths, MatmulPathTest,
                         ::testing::Values(MatmulPath::Scalar, MatmulPath::Avx2, MatmulPath::Avx512,
                                           MatmulPath::Avx512Bf16),
                         [](const ::testing::TestParamInfo<MatmulPath>& info) {
                           return std::string(matmul_path_name(info.param));
                         });

// matmul() takes the path matmul_path() names, which the CPU supports.
TEST(Matmul, DispatchUsesASupportedPath) {
  const MatmulPath path = matmul_path();
  EXPECT_TRUE(matmul_path_supported(path)) << matmul_path_name(path);
  ThreadPool pool(2);
  const Weights w = make_weights(DType::BF16, 40, 70, 2);
  const std::vector<float> x = make_x(3, 70, 70, 4);
  std::vector<float> a(120), b(120);
  matmul(x.data(), 3, 70, 70, w.data(), w.dtype, 40, a.data(), 40, pool);
  fn_of(path)(x.data(), 3, 70, 70, w.data(), w.dtype, 40, b.data(), 40, pool);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}

// The f16-input experiment (detail::round_inputs_to_f16): M > 8 multiplies x
// rounded to f16 (saturated at ±65504), M <= 8 multiplies x as it is.
TEST(Matmul, RoundInputsToF16Experiment) {
  ThreadPool pool(2);
  const Weights w = make_weights(DType::BF16, 40, 70, 2);
  std::vector<float> x = make_x(9, 70, 72, 4);  // row stride 72 (NaN padding)
  x[5] = 1e6f;                                   // beyond f16: saturates
  std::vector<float> rounded(9 * 70);
  for (int64_t m = 0; m < 9; ++m)
    for (int64_t k = 0; k < 70; ++k)
      rounded[size_t(m * 70 + k)] = f16_to_f32(f32_to_f16(std::clamp(x[size_t(m * 72 + k)], -65504.f, 65504.f)));
  std::vector<float> got(360), want(360), exact(360), got2(320);
  detail::round_inputs_to_f16() = true;
  matmul(x.data(), 9, 70, 72, w.data(), w.dtype, 40, got.data(), 40, pool);
  matmul(x.data(), 8, 70, 72, w.data(), w.dtype, 40, got2.data(), 40, pool);
  detail::round_inputs_to_f16() = false;
  matmul(rounded.data(), 9, 70, 70, w.data(), w.dtype, 40, want.data(), 40, pool);
  matmul(x.data(), 9, 70, 72, w.data(), w.dtype, 40, exact.data(), 40, pool);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0);
  EXPECT_NE(std::memcmp(got.data(), exact.data(), got.size() * 4), 0);
  EXPECT_EQ(std::memcmp(got2.data(), exact.data(), got2.size() * 4), 0);  // M = 8: x as it is
}

}  // namespace
}  // namespace augur::cpu
