// AVX2 + FMA matmul body (this file is compiled with -mavx2 -mfma -mf16c).
// The same scheme as matmul_avx512.cpp with 8-lane accumulators and 16 registers.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <utility>

#include "backend/cpu/matmul.h"
#include "core/tensor.h"

namespace augur::cpu::detail {

namespace {

// Fixed-order sum of 8 lanes.
inline float hsum(__m256 v) {
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
  return _mm_cvtss_f32(s4);
}

// 8 consecutive weights as f32 (bf16 widens exactly: its bits are the top half).
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
  __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
// The first n (< 8) of them, zeros after.
template <typename T>
inline __m256 load8_tail(const T* p, int64_t n) {
  alignas(32) T buf[8] = {};
  std::memcpy(buf, p, size_t(n) * sizeof(T));
  return load8(buf);
}

// y[i, j] = x[i, :] · w[j, :] for one MR x NR tile.
// x: [MR, K] stride ldx; w: [NR, K] stride K; y: [MR, NR] stride ldy.
// Every output gets the same sequence whatever MR and NR: one 8-lane
// accumulator, k ascending in steps of 8 (fused multiply-add), a zero-padded
// last step, hsum.
template <int MR, int NR, typename WT>
void tile(const float* x, int64_t ldx, const WT* w, int64_t K, float* y, int64_t ldy) {
  __m256 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = load8(w + j * K + k);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      __m256 xv = _mm256_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if (k < K) {
    __m256 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = load8_tail(w + j * K + k, K - k);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      __m256 xv = load8_tail(x + i * ldx + k, K - k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = hsum(acc[i][j]);
}

constexpr int kMaxMR = 4;
constexpr int kMaxNR = 8;

template <typename WT>
using TileFn = void (*)(const float*, int64_t, const WT*, int64_t, float*, int64_t);

// Shapes that fit the 16 registers (a single row streams its weights).
template <typename WT, int I>
constexpr TileFn<WT> tile_entry() {
  constexpr int mr = I / kMaxNR + 1, nr = I % kMaxNR + 1;
  if constexpr (mr == 1 || mr * nr + nr + 1 <= 16) return &tile<mr, nr, WT>;
  else return nullptr;
}
template <typename WT, int... I>
constexpr std::array<TileFn<WT>, sizeof...(I)> tile_table(std::integer_sequence<int, I...>) {
  return {tile_entry<WT, I>()...};
}
template <typename WT>
constexpr auto kTiles = tile_table<WT>(std::make_integer_sequence<int, kMaxMR * kMaxNR>());

// y[0:M, 0:rows] for weight rows w[0:rows] (stride K), in MR x NR tiles.
template <typename WT>
void run_block(const float* x, int64_t M, int64_t K, int64_t ldx, const WT* w, int64_t rows,
               float* y, int64_t ldy, int MR, int NR) {
  for (int64_t m = 0; m < M; m += MR) {
    const int mr = int(std::min<int64_t>(MR, M - m));
    for (int64_t n = 0; n < rows; n += NR) {
      const int nr = int(std::min<int64_t>(NR, rows - n));
      kTiles<WT>[(mr - 1) * kMaxNR + (nr - 1)](x + m * ldx, ldx, w + n * K, K, y + m * ldy + n, ldy);
    }
  }
}

float* scratch(size_t n_floats) {
  thread_local std::unique_ptr<HostBuffer> buf;
  if (!buf || buf->size() < n_floats * sizeof(float))
    buf = std::make_unique<HostBuffer>(n_floats * sizeof(float));
  return static_cast<float*>(buf->data());
}

// Widens rows bf16 -> f32: dst [rows, K] from src [rows, K].
void widen_rows(const uint16_t* src, int64_t rows, int64_t K, float* dst) {
  const int64_t n = rows * K;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8(src + i));
  for (; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

constexpr int64_t kPanelMinM = 8;   // from this many rows, widen weights once per panel
constexpr int64_t kPanelRows = 16;  // weight rows per widened panel
constexpr int64_t kBlockBytes = 256 << 10;  // weight rows per block: about half of L2

}  // namespace

void matmul_range_avx2(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w,
                       DType w_dtype, float* y, int64_t ldy, int64_t n_begin, int64_t n_end) {
  const int MR = M == 1 ? 1 : 4;
  const int NR = M == 1 ? 8 : 3;
  if (w_dtype == DType::F32 || M < kPanelMinM) {
    // Blocks of weight rows that stay in L2 while every row tile of x passes.
    const int64_t esize = int64_t(dtype_size(w_dtype));
    const int64_t nb = std::max<int64_t>(NR, kBlockBytes / std::max<int64_t>(1, K * esize) / NR * NR);
    for (int64_t n = n_begin; n < n_end; n += nb) {
      const int64_t rows = std::min(nb, n_end - n);
      if (w_dtype == DType::F32)
        run_block(x, M, K, ldx, static_cast<const float*>(w) + n * K, rows, y + n, ldy, MR, NR);
      else
        run_block(x, M, K, ldx, static_cast<const uint16_t*>(w) + n * K, rows, y + n, ldy, MR, NR);
    }
    return;
  }
  // Many rows: widen a panel of weight rows to f32 once, reuse it for every row of x.
  float* panel = scratch(size_t(kPanelRows * K));
  for (int64_t n = n_begin; n < n_end; n += kPanelRows) {
    const int64_t rows = std::min(kPanelRows, n_end - n);
    widen_rows(static_cast<const uint16_t*>(w) + n * K, rows, K, panel);
    run_block(x, M, K, ldx, panel, rows, y + n, ldy, MR, NR);
  }
}

}  // namespace augur::cpu::detail
