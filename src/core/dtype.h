// Element types of tensors and checkpoint data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace augur {

// QAFFINE: affine-quantized matrix rows in blocks (core/quant.h); it has no
// element size (dtype_size is 0), a tensor of it knows its row bytes.
enum class DType : uint8_t { F32, BF16, F16, I32, U32, I64, U8, BOOL, QAFFINE };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);
// Parses a safetensors dtype tag ("F32", "BF16", ...); false if unknown.
bool parse_dtype(std::string_view tag, DType* out);

// bf16 is the upper half of an f32: widening is exact, narrowing rounds to
// nearest even (as torch does).
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

}  // namespace augur
