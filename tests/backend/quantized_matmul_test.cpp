// Packed affine-quantized matrices on the CPU (core/quant.h,
// cpu::matmul_quantized and the ops that take them): each gives exactly what
// the same op gives on the dequantized float matrix, on every matmul path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/device.h"
#include "backend/ops.h"
#include "core/quant.h"
#include "core/thread_pool.h"

namespace augur {
namespace {

// mlx's triple for [N, K] at `bits` in groups of `group`, scales in `scale`,
// random codes; biases around zero, so dequantized values of either sign.
Tensor random_quantized(int64_t N, int64_t K, int bits, int group, DType scale, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t words = K * bits / 32, groups = K / group;
  Tensor codes = Tensor::empty(DType::U32, {N, words});
  for (int64_t i = 0; i < codes.numel(); ++i) codes.data<uint32_t>()[i] = uint32_t(rng());
  Tensor scales = Tensor::empty(scale, {N, groups}), biases = Tensor::empty(scale, {N, groups});
  std::uniform_real_distribution<float> s(0.001f, 0.05f), b(-0.4f, 0.1f);
  auto put = [&](const Tensor& t, int64_t i, float v) {
    if (scale == DType::BF16) t.data<uint16_t>()[i] = f32_to_bf16(v);
    else if (scale == DType::F16) t.data<uint16_t>()[i] = f32_to_f16(v);
    else t.data<float>()[i] = v;
  };
  for (int64_t i = 0; i < N * groups; ++i) put(scales, i, s(rng)), put(biases, i, b(rng));
  return pack_affine(codes, scales, biases, bits, group, K, "test");
}

// The float matrix as the CPU keeps a float checkpoint's (f16 widened).
Tensor cpu_float(const Tensor& q) {
  Tensor f = dequantize(q);
  if (f.dtype() != DType::F16) return f;
  Tensor out = Tensor::empty(DType::F32, f.shape().data(), f.ndim());
  for (int64_t i = 0; i < f.numel(); ++i) out.data<float>()[i] = f.float_at(i);
  return out;
}

std::vector<float> random_x(int64_t M, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> x(size_t(M * K));
  for (float& v : x) v = d(rng);
  return x;
}

const cpu::MatmulPath kPaths[] = {cpu::MatmulPath::Scalar, cpu::MatmulPath::Avx2, cpu::MatmulPath::Avx512,
                                  cpu::MatmulPath::Avx512Bf16};

using ForcedFn = void (*)(const float*, int64_t, int64_t, int64_t, const void*, DType, int64_t, float*, int64_t,
                          ThreadPool&);
ForcedFn float_fn(cpu::MatmulPath p) {
  switch (p) {
    case cpu::MatmulPath::Scalar: return &cpu::matmul_scalar;
    case cpu::MatmulPath::Avx2: return &cpu::matmul_avx2;
    case cpu::MatmulPath::Avx512: return &cpu::matmul_avx512;
    case cpu::MatmulPath::Avx512Bf16: return &cpu::matmul_avx512bf16;
  }
  return nullptr;
}

TEST(QuantizedMatmul, EqualsTheDequantizedMatrixOnEveryPath) {
  ThreadPool pool(2);
  int cases = 0;
  for (cpu::MatmulPath path : kPaths) {
    if (!cpu::matmul_path_supported(path)) continue;
    for (int bits : {2, 3, 4, 5, 6, 8})
      for (int group : {32, 64, 128})
        for (DType scale : {DType::BF16, DType::F16, DType::F32}) {
          // 37 rows (no whole tile), K past one block of dequantized rows
          // for some layouts (256 KB: K = 4096 bf16 is 32 rows).
          const int64_t N = 37, K = group == 128 ? 4096 : 2 * group;
          const Tensor q = random_quantized(N, K, bits, group, scale, uint32_t(bits * 1000 + group));
          const Tensor f = cpu_float(q);
          for (int64_t M : {1, 3, 5, 13}) {
            const std::vector<float> x = random_x(M, K, uint32_t(M));
            std::vector<float> want(size_t(M * N)), got(size_t(M * N), -1.f);
            float_fn(path)(x.data(), M, K, K, f.raw(), f.dtype(), N, want.data(), N, pool);
            cpu::matmul_quantized(path, x.data(), M, K, K, q.raw(), q.quant(), N, got.data(), N, pool);
            ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
                << cpu::matmul_path_name(path) << " bits " << bits << " group " << group << " scales "
                << dtype_name(scale) << " M " << M;
            ++cases;
          }
        }
  }
  EXPECT_GE(cases, 216);  // the scalar path at least
}

TEST(QuantizedMatmul, ManyBlocksOfRowsAndThreads) {
  // N past several 256 KB blocks of rows (64 rows of 2048 bf16 values) and
  // split over threads; N = 16 (one unit of columns) splits the rows of x
  // over the threads instead.
  for (int64_t N : {300, 16}) {
    const Tensor q = random_quantized(N, 2048, 4, 64, DType::BF16, 7);
    const Tensor f = cpu_float(q);
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      for (int64_t M : {1, 40}) {
        const std::vector<float> x = random_x(M, 2048, 3);
        std::vector<float> want(size_t(M * N)), got(size_t(M * N), -1.f);
        cpu::matmul(x.data(), M, 2048, 2048, f.raw(), f.dtype(), N, want.data(), N, pool);
        cpu::matmul_quantized(x.data(), M, 2048, 2048, q.raw(), q.quant(), N, got.data(), N, pool);
        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
            << "N " << N << ", " << threads << " threads, M " << M;
      }
    }
  }
}

TEST(QuantizedMatmul, VectorDequantizationEqualsScalar) {
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int group : {32, 64, 128})
      for (DType scale : {DType::BF16, DType::F16, DType::F32}) {
        const Tensor q = random_quantized(3, 256, bits, group, scale, uint32_t(bits + group));
        for (DType out : {dequantized_cpu_type(q.quant()), DType::F32}) {
          const size_t n = 3 * 256 * dtype_size(out);
          std::vector<uint8_t> want(n), got(n);
          dequantize_rows(q.quant(), q.raw(), 3, 256, out, want.data());
          if (cpu::matmul_path_supported(cpu::MatmulPath::Avx2)) {
            std::fill(got.begin(), got.end(), uint8_t(0xaa));
            cpu::detail::dequantize_rows_avx2(q.quant(), q.raw(), 3, 256, out, got.data());
            EXPECT_EQ(want, got) << "avx2 bits " << bits << " group " << group << " " << dtype_name(scale);
          }
          if (cpu::matmul_path_supported(cpu::MatmulPath::Avx512)) {
            std::fill(got.begin(), got.end(), uint8_t(0xaa));
            cpu::detail::dequantize_rows_avx512(q.quant(), q.raw(), 3, 256, out, got.data());
            EXPECT_EQ(want, got) << "avx512 bits " << bits << " group " << group << " " << dtype_name(scale);
          }
        }
      }
}

std::vector<float> floats_of(const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[size_t(i)] = t.float_at(i);
  return v;
}

TEST(QuantizedOps, LinearAndEmbeddingEqualTheDequantizedMatrix) {
  const Tensor q = random_quantized(50, 128, 4, 32, DType::BF16, 11);
  const Tensor f = cpu_float(q);
  EXPECT_LT(q.nbytes() * 3, f.nbytes());  // 4.5 bits a weight against 16
  const std::vector<float> xv = random_x(3, 128, 5);
  Tensor x = Tensor::empty(DType::F32, {3, 128});
  std::memcpy(x.raw(), xv.data(), xv.size() * 4);
  Tensor y1 = Tensor::empty(DType::F32, {3, 50}), y2 = Tensor::empty(DType::F32, {3, 50});
  ops::linear(x, f, y1);
  ops::linear(x, q, y2);
  EXPECT_EQ(floats_of(y1), floats_of(y2));
  const int32_t ids[] = {49, 0, 7, 7};
  Tensor e1 = Tensor::empty(DType::F32, {4, 128}), e2 = Tensor::empty(DType::F32, {4, 128});
  ops::embedding(f, ids, e1);
  ops::embedding(q, ids, e2);
  EXPECT_EQ(floats_of(e1), floats_of(e2));
}

TEST(QuantizedOps, RowsAndColumnsRegroupAsTheFloatMatrix) {
  const Tensor a = random_quantized(6, 256, 4, 64, DType::F16, 1), b = random_quantized(3, 256, 4, 64, DType::F16, 2);
  const Tensor parts[] = {a, b};
  const Tensor stacked = stack_rows(parts);
  ASSERT_TRUE(stacked.is_quantized());
  const Tensor fparts[] = {dequantize(a), dequantize(b)};
  EXPECT_EQ(floats_of(dequantize(stacked)), floats_of(stack_rows(fparts)));
  EXPECT_EQ(floats_of(dequantize(stacked.slice_rows(4, 8))), floats_of(dequantize(stacked).slice_rows(4, 8)));
  const int64_t rows[] = {8, 0, 3};
  const Tensor picked = select_rows(stacked, rows);
  ASSERT_TRUE(picked.is_quantized());
  EXPECT_EQ(floats_of(dequantize(picked)), floats_of(select_rows(dequantize(stacked), rows)));
  const Tensor cols = select_cols(stacked, 64, 192);  // whole blocks: still packed
  ASSERT_TRUE(cols.is_quantized());
  EXPECT_EQ(floats_of(dequantize(cols)), floats_of(select_cols(dequantize(stacked), 64, 192)));
  const Tensor split = select_cols(stacked, 32, 96);  // through a block: floats
  EXPECT_FALSE(split.is_quantized());
  EXPECT_EQ(floats_of(split), floats_of(select_cols(dequantize(stacked), 32, 96)));
  // Parts quantized unlike one another stack as the floats the CPU
  // multiplies (f16 values widened to f32), and multiply as their parts.
  const Tensor c = random_quantized(2, 256, 8, 64, DType::BF16, 3);
  const Tensor mixed[] = {a, c};
  const Tensor m = stack_rows(mixed);
  EXPECT_FALSE(m.is_quantized());
  EXPECT_EQ(m.dtype(), DType::F32);
  const std::vector<float> xv = random_x(2, 256, 9);
  Tensor x = Tensor::empty(DType::F32, {2, 256});
  std::memcpy(x.raw(), xv.data(), xv.size() * 4);
  Tensor ym = Tensor::empty(DType::F32, {2, 8}), ya = Tensor::empty(DType::F32, {2, 6}),
         yc = Tensor::empty(DType::F32, {2, 2});
  ops::linear(x, m, ym);
  ops::linear(x, a, ya);
  ops::linear(x, c, yc);
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t n = 0; n < 8; ++n)
      EXPECT_EQ(ym.data<float>()[r * 8 + n], n < 6 ? ya.data<float>()[r * 6 + n] : yc.data<float>()[r * 2 + n - 6]);
  EXPECT_EQ(split.dtype(), DType::F32);  // f16 scales: the CPU's F32, which linear takes
  ops::linear(Tensor::empty(DType::F32, {2, 64}), split, Tensor::empty(DType::F32, {2, 9}));
}

}  // namespace
}  // namespace augur
