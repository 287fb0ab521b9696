// Affine-quantized matrices kept packed in memory (mlx-lm's affine form).
//
// mlx stores a matrix w [.., N, K] as codes (U32 [.., N, K * bits / 32],
// each row one little-endian bit stream: value j at bits [j * bits, (j + 1) *
// bits)), scales and biases ([.., N, K / group], the checkpoint's float type),
// with w[n, j] = scales[n, g] * q[n, j] + biases[n, g], g = j / group.
//
// A QAFFINE tensor holds the same numbers regrouped for reading: each row is
// K / group blocks of {scale, bias, the group's codes} (the codes' bytes are
// the row stream's for that group: a group of 32 or more values at any width
// starts on a byte). Every reader of it computes a weight as mlx's dequantize
// does, fmaf(scale, code, bias) rounded to the scales' type, so a packed
// matrix gives exactly the numbers of its dequantized float matrix.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "core/tensor.h"

namespace augur {

// The blocks of mlx's triple for a matrix of rows of `in` values (shapes
// checked; `name` labels errors). codes: U32; scales, biases: one float type.
Tensor pack_affine(const Tensor& codes, const Tensor& scales, const Tensor& biases, int bits, int group,
                   int64_t in, std::string_view name);

// A fresh QAFFINE host tensor (contents undefined).
Tensor empty_quantized(const QuantLayout& q, const int64_t* shape, int ndim);

// The float matrix of a QAFFINE tensor (contiguous, on the host), in its
// scales' type (mlx's dequantize), or as F32 (those values widened).
Tensor dequantize(const Tensor& q);
Tensor dequantize(const Tensor& q, DType out);

// What the CPU kernels multiply a dequantized weight as: bf16 scales give
// bf16 weights (widened exactly by the matmul kernels); f16 and f32 scales
// give f32 (the CPU keeps f16 matrices widened to f32).
inline DType dequantized_cpu_type(const QuantLayout& q) { return q.scale == DType::BF16 ? DType::BF16 : DType::F32; }

// `rows` rows of K values from their blocks at `src` (row after row) into
// dst, [rows, K] of `out`: the scales' type, or F32 (those values widened).
void dequantize_rows(const QuantLayout& q, const void* src, int64_t rows, int64_t K, DType out, void* dst);

// Each translation unit gets its own copy of these (internal linkage): the
// CPU backend builds them for AVX2 and for AVX-512 as well as for baseline
// x86-64, and an out-of-line copy of one must never serve another's callers.
namespace quant_detail {
namespace {

// (bf16_to_f32, std::fma and QuantLayout's members are inline functions of
// external linkage: an unoptimized build could keep a vector unit's copy of
// them for every caller, so these helpers use their own.)
inline float widen_bf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline size_t block_bytes_of(const QuantLayout& q) {
  return 2 * (q.scale == DType::F32 ? 4u : 2u) + size_t(q.group) * q.bits / 8;
}

inline float load_float(const uint8_t* p, DType t) {
  uint16_t h;
  switch (t) {
    case DType::BF16: std::memcpy(&h, p, 2); return widen_bf16(h);
    case DType::F16: std::memcpy(&h, p, 2); return f16_to_f32(h);
    default: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
  }
}

// Code j of a group's bit stream, the width known at compile time.
template <int kBits>
inline uint32_t code_at(const uint8_t* codes, int j) {
  if constexpr (kBits == 8) {
    return codes[j];
  } else if constexpr (kBits == 4) {
    return (codes[j >> 1] >> ((j & 1) * 4)) & 15u;
  } else if constexpr (kBits == 2) {
    return (codes[j >> 2] >> ((j & 3) * 2)) & 3u;
  } else {
    const int bit = j * kBits, shift = bit & 7;
    uint32_t v = uint32_t(codes[bit >> 3]) | (uint32_t(codes[(bit >> 3) + 1]) << 8);  // a value spans 2 bytes at most
    return (v >> shift) & ((1u << kBits) - 1u);
  }
}

// The values of one block before their rounding: v[j] = fmaf(scale, code j,
// bias). Written as plain loops over a group of compile-time width so that a
// translation unit built for AVX2 or AVX-512 vectorizes them (the 3-, 5- and
// 6-bit forms read two bytes a value, which the last of a stream's groups
// may not have: those read the group from a padded copy).
template <int kBits>
inline void block_values(const uint8_t* block, const QuantLayout& q, float* v) {
  const size_t sb = q.scale == DType::F32 ? 4 : 2;
  const float s = load_float(block, q.scale), b = load_float(block + sb, q.scale);
  const uint8_t* codes = block + 2 * sb;
  const int G = q.group;
  if constexpr (kBits == 3 || kBits == 5 || kBits == 6) {
    uint8_t pad[128 * 6 / 8 + 1];
    const size_t n = size_t(G) * kBits / 8;
    std::memcpy(pad, codes, n);
    pad[n] = 0;
    for (int j = 0; j < G; ++j) v[j] = __builtin_fmaf(s, float(code_at<kBits>(pad, j)), b);
  } else if constexpr (kBits == 4) {  // a byte's two values a step (an index j / 2 does not vectorize)
    for (int i = 0; i < G / 2; ++i) {
      const uint32_t c = codes[i];
      v[2 * i] = __builtin_fmaf(s, float(c & 15u), b);
      v[2 * i + 1] = __builtin_fmaf(s, float(c >> 4), b);
    }
  } else if constexpr (kBits == 2) {
    for (int i = 0; i < G / 4; ++i) {
      const uint32_t c = codes[i];
      v[4 * i] = __builtin_fmaf(s, float(c & 3u), b);
      v[4 * i + 1] = __builtin_fmaf(s, float((c >> 2) & 3u), b);
      v[4 * i + 2] = __builtin_fmaf(s, float((c >> 4) & 3u), b);
      v[4 * i + 3] = __builtin_fmaf(s, float(c >> 6), b);
    }
  } else {
    for (int j = 0; j < G; ++j) v[j] = __builtin_fmaf(s, float(codes[j]), b);
  }
}

// f32 -> bf16 bits (nearest even; NaN stays a quiet NaN): f32_to_bf16 as
// branch-free integer steps that vectorize.
inline uint16_t round_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : rounded);
}

// Rows of blocks into dst as `out` (BF16: bf16 bits; F16: f16 bits; F32:
// the values rounded to the scales' type, widened). `round_f16` rounds
// n floats to f16 and back in place (F16C in the vector builds).
template <int kBits, typename RoundF16>
inline void dequantize_rows_as(const QuantLayout& q, const uint8_t* src, int64_t rows, int64_t K, DType out,
                               void* dst, RoundF16 round_f16) {
  const int G = q.group;
  const size_t bb = block_bytes_of(q);
  const int64_t groups = K / G;
  alignas(64) float v[128];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      block_values<kBits>(src + size_t(r * groups + g) * bb, q, v);
      const int64_t at = r * K + g * G;
      if (out == DType::BF16) {
        uint16_t* d = static_cast<uint16_t*>(dst) + at;
        for (int j = 0; j < G; ++j) d[j] = round_bf16(v[j]);
      } else if (out == DType::F16) {
        uint16_t* d = static_cast<uint16_t*>(dst) + at;
        for (int j = 0; j < G; ++j) d[j] = f32_to_f16(v[j]);
      } else {
        float* d = static_cast<float*>(dst) + at;
        if (q.scale == DType::F16) round_f16(v, G);
        if (q.scale == DType::BF16)
          for (int j = 0; j < G; ++j) d[j] = widen_bf16(round_bf16(v[j]));
        else
          std::memcpy(d, v, size_t(G) * sizeof(float));
      }
    }
}

template <typename RoundF16>
inline void dequantize_rows_with(const QuantLayout& q, const void* src, int64_t rows, int64_t K, DType out, void* dst,
                                 RoundF16 round_f16) {
  const auto* s = static_cast<const uint8_t*>(src);
  switch (q.bits) {
    case 2: return dequantize_rows_as<2>(q, s, rows, K, out, dst, round_f16);
    case 3: return dequantize_rows_as<3>(q, s, rows, K, out, dst, round_f16);
    case 4: return dequantize_rows_as<4>(q, s, rows, K, out, dst, round_f16);
    case 5: return dequantize_rows_as<5>(q, s, rows, K, out, dst, round_f16);
    case 6: return dequantize_rows_as<6>(q, s, rows, K, out, dst, round_f16);
    default: return dequantize_rows_as<8>(q, s, rows, K, out, dst, round_f16);
  }
}

}  // namespace
}  // namespace quant_detail

}  // namespace augur
