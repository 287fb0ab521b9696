// CPU matrix multiply y = x·wᵀ: f32 activations, bf16 or f32 weights.
//
// One body per instruction set (matmul_avx512.cpp, matmul_avx2.cpp, the scalar
// one in matmul.cpp); matmul() picks one at run time from cpu_features():
// avx512 > avx2 > scalar, so AUGUR_CPU=avx2|scalar forces a path;
// AUGUR_CPU=avx512bf16 opts in to the bf16 dot-product path.
//
// Exactness: every y[m, n] is bit-identical whatever M, the tile or thread it
// falls in and the thread count. Each output is one dot product whose order
// over k depends only on K and the path: one vector accumulator of L lanes
// per output (L = 16 avx512, 8 avx2 and scalar) takes k in ascending steps of
// L (avx512bf16: 32, as 16 pairs), the last step zero-padded, then a fixed
// horizontal sum.
//
// Accuracy: avx512, avx2 and scalar widen bf16 weights to f32 (exactly) and
// multiply in f32: an f32 dot product (error ~1e-7 of sum |x·w| in the tests).
// avx512bf16 multiplies bf16 weights with vdpbf16ps, x split into bf16 hi +
// lo, so x carries ~17 bits (error up to ~7e-6 of sum |x·w|, at K = 1); f32
// weights take the avx512 kernels. On Zen 5 it is 3-15% faster than avx512
// for decode, small batches and prefill alike, but the hybrid families'
// golden tests need the f32 paths, so it is opt-in (AUGUR_CPU=avx512bf16).
// (x = ±inf gives NaN there, as hi - inf is NaN.)
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/tensor.h"
#include "core/thread_pool.h"

namespace augur::cpu {

// y[m, n] = sum_k x[m, k] * w[n, k]     (x·wᵀ, PyTorch Linear layout)
// x: f32 [M, K], row stride ldx; w: [N, K] contiguous rows, BF16 or F32;
// y: f32 [M, N], row stride ldy. Split over N across `pool` (and over M when
// N is too narrow to feed every thread).
void matmul(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w, DType w_dtype,
            int64_t N, float* y, int64_t ldy, ThreadPool& pool);

enum class MatmulPath : uint8_t { Scalar, Avx2, Avx512, Avx512Bf16 };

// y = x·wᵀ for an affine-quantized w: QAFFINE rows [N, K] (core/quant.h).
// Each thread dequantizes its rows a block at a time (256 KB of
// dequantized_cpu_type, then still in L2) and multiplies them with the
// path's float kernel, so every y[m, n] is bit-identical to matmul() on the
// dequantized matrix (and so, as there, whatever M, tiling and threads).
// The weights stay packed in memory: a 4-bit matrix reads about a quarter
// of a bf16 one's bytes.
void matmul_quantized(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w, const QuantLayout& q,
                      int64_t N, float* y, int64_t ldy, ThreadPool& pool);
// One path, forced (tests, benchmarks). Aborts if the CPU lacks it.
void matmul_quantized(MatmulPath path, const float* x, int64_t M, int64_t K, int64_t ldx, const void* w,
                      const QuantLayout& q, int64_t N, float* y, int64_t ldy, ThreadPool& pool);

// The path matmul() takes on this CPU (after AUGUR_CPU).
MatmulPath matmul_path();
bool matmul_path_supported(MatmulPath path);
const char* matmul_path_name(MatmulPath path);

// One path, forced (tests, benchmarks). Aborts if the CPU lacks it.
void matmul_scalar(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w, DType w_dtype,
                   int64_t N, float* y, int64_t ldy, ThreadPool& pool);
void matmul_avx2(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w, DType w_dtype,
                 int64_t N, float* y, int64_t ldy, ThreadPool& pool);
void matmul_avx512(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w, DType w_dtype,
                   int64_t N, float* y, int64_t ldy, ThreadPool& pool);
void matmul_avx512bf16(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w,
                       DType w_dtype, int64_t N, float* y, int64_t ldy, ThreadPool& pool);

namespace detail {

// Precision experiment (tests): when set, matmul rounds x to f16 (round to
// nearest even, saturating at ±65504) before multiplying whenever M > 8, as
// the CUDA backend's tensor-core path does (its skinny kernels, M <= 8, keep x
// exact). It tells how much a model's logits move from that rounding alone.
bool& round_inputs_to_f16();

// The single-threaded body of one path: y[0:M, n_begin:n_end] (x and y
// already offset to the first row of the caller's share).
using MatmulRangeFn = void (*)(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w,
                               DType w_dtype, float* y, int64_t ldy, int64_t n_begin,
                               int64_t n_end);

void matmul_range_scalar(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w,
                         DType w_dtype, float* y, int64_t ldy, int64_t n_begin, int64_t n_end);
void matmul_range_avx2(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w,
                       DType w_dtype, float* y, int64_t ldy, int64_t n_begin, int64_t n_end);
void matmul_range_avx512(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w,
                         DType w_dtype, float* y, int64_t ldy, int64_t n_begin, int64_t n_end);
void matmul_range_avx512bf16(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w,
                             DType w_dtype, float* y, int64_t ldy, int64_t n_begin, int64_t n_end);

// core/quant.h's dequantize_rows built for one instruction set (the same
// values: IEEE fma and rounding; F16C rounds to f16).
using DequantRowsFn = void (*)(const QuantLayout& q, const void* src, int64_t rows, int64_t K, DType out, void* dst);
void dequantize_rows_avx2(const QuantLayout& q, const void* src, int64_t rows, int64_t K, DType out, void* dst);
void dequantize_rows_avx512(const QuantLayout& q, const void* src, int64_t rows, int64_t K, DType out, void* dst);

}  // namespace detail

}  // namespace augur::cpu
