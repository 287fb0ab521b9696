// AVX-512 matmul body (this file is compiled with -mavx512f/bw/vl/dq/bf16).
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <memory>
#include <utility>

#include "backend/cpu/matmul.h"
#include "core/tensor.h"

namespace augur::cpu::detail {

namespace {

// ---- tuning (TEMP: env overrides while measuring) ----
int64_t env_or(const char* name, int64_t def) {
  const char* s = std::getenv(name);
  return s ? std::atoll(s) : def;
}
const int64_t kPrefetch = env_or("AUGUR_MM_PF", 0);
const int64_t kPanelMinM = env_or("AUGUR_MM_PANEL_M", 8);
const int64_t kPanelRows = env_or("AUGUR_MM_PANEL_ROWS", 16);
const bool kDp = env_or("AUGUR_MM_DP", 0) != 0;

// Fixed-order sum of 16 lanes.
inline float hsum(__m512 v) {
  __m256 s8 = _mm256_add_ps(_mm512_maskz_extractf32x8_ps(0xff, v, 0), _mm512_maskz_extractf32x8_ps(0xff, v, 1));
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
  return _mm_cvtss_f32(s4);
}

// 16 consecutive weights as f32 (bf16 widens exactly: its bits are the top half).
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
// (Zero-masked forms throughout: GCC 12's unmasked ones trip -Wmaybe-uninitialized.)
inline __m512 widen16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, h), 16));
}
inline __m512 load16(const uint16_t* p) {
  return widen16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
// The first popcount(m) of them, zeros after.
inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load16(const uint16_t* p, __mmask16 m) { return widen16(_mm256_maskz_loadu_epi16(m, p)); }

// y[i, j] = x[i, :] · w[j, :] for one MR x NR tile.
// x: [MR, K] stride ldx; w: [NR, K] stride K; y: [MR, NR] stride ldy.
// Every output gets the same sequence whatever MR and NR: one 16-lane
// accumulator, k ascending in steps of 16 (fused multiply-add), a zero-padded
// last step, hsum. That is what makes results independent of tiling.
template <int MR, int NR, typename WT>
void tile(const float* x, int64_t ldx, const WT* w, int64_t K, float* y, int64_t ldy) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      if (kPrefetch) _mm_prefetch(reinterpret_cast<const char*>(w + j * K + k) + kPrefetch, _MM_HINT_T0);
      wv[j] = load16(w + j * K + k);
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      __m512 xv = _mm512_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if (k < K) {
    const __mmask16 m = __mmask16((1u << (K - k)) - 1);
    __m512 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = load16(w + j * K + k, m);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      __m512 xv = _mm512_maskz_loadu_ps(m, x + i * ldx + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = hsum(acc[i][j]);
}

constexpr int kMaxMR = 6;
constexpr int kMaxNR = 8;

template <typename WT>
using TileFn = void (*)(const float*, int64_t, const WT*, int64_t, float*, int64_t);

// Shapes that fit the 32 registers (accumulators + weights + one x).
template <typename WT, int I>
constexpr TileFn<WT> tile_entry() {
  constexpr int mr = I / kMaxNR + 1, nr = I % kMaxNR + 1;
  if constexpr (mr * nr + nr + 1 <= 32) return &tile<mr, nr, WT>;
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
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load16(src + i));
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(dst + i, m, load16(src + i, m));
  }
}

// ---- experimental: vdpbf16ps with x split into hi + lo bf16 ----
// Per output: 16-lane accumulator, k in steps of 32 (pairs), hi then lo.
template <int MR, int NR>
void tile_dp(const uint16_t* xs, int64_t ldxs, const uint16_t* w, int64_t K, float* y, int64_t ldy) {
  // xs: per row [Kp] hi then [Kp] lo, Kp = K rounded up to 32, zero padded; ldxs = 2*Kp.
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  const int64_t Kp = ldxs / 2;
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    __m512bh wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      if (kPrefetch) _mm_prefetch(reinterpret_cast<const char*>(w + j * K + k) + kPrefetch, _MM_HINT_T0);
      wv[j] = (__m512bh)_mm512_loadu_si512(w + j * K + k);
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      __m512bh hi = (__m512bh)_mm512_loadu_si512(xs + i * ldxs + k);
      __m512bh lo = (__m512bh)_mm512_loadu_si512(xs + i * ldxs + Kp + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) {
        acc[i][j] = _mm512_dpbf16_ps(acc[i][j], hi, wv[j]);
        acc[i][j] = _mm512_dpbf16_ps(acc[i][j], lo, wv[j]);
      }
    }
  }
  if (k < K) {
    const __mmask32 m = __mmask32((uint64_t(1) << (K - k)) - 1);
    __m512bh wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = (__m512bh)_mm512_maskz_loadu_epi16(m, w + j * K + k);
    for (int i = 0; i < MR; ++i) {
      __m512bh hi = (__m512bh)_mm512_loadu_si512(xs + i * ldxs + k);
      __m512bh lo = (__m512bh)_mm512_loadu_si512(xs + i * ldxs + Kp + k);
      for (int j = 0; j < NR; ++j) {
        acc[i][j] = _mm512_dpbf16_ps(acc[i][j], hi, wv[j]);
        acc[i][j] = _mm512_dpbf16_ps(acc[i][j], lo, wv[j]);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = hsum(acc[i][j]);
}

template <int I>
constexpr auto tile_dp_entry() {
  constexpr int mr = I / kMaxNR + 1, nr = I % kMaxNR + 1;
  using Fn = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, float*, int64_t);
  if constexpr (mr * nr + nr + 2 <= 32) return Fn(&tile_dp<mr, nr>);
  else return Fn(nullptr);
}
template <int... I>
constexpr auto tile_dp_table(std::integer_sequence<int, I...>) {
  return std::array{tile_dp_entry<I>()...};
}
constexpr auto kTilesDp = tile_dp_table(std::make_integer_sequence<int, kMaxMR * kMaxNR>());

void range_dp(const float* x, int64_t M, int64_t K, int64_t ldx, const uint16_t* w, float* y,
              int64_t ldy, int64_t n0, int64_t n1) {
  const int64_t Kp = (K + 31) / 32 * 32;
  uint16_t* xs = reinterpret_cast<uint16_t*>(scratch(size_t(M * Kp)));  // M * 2Kp bf16
  for (int64_t m = 0; m < M; ++m) {
    uint16_t* hi = xs + m * 2 * Kp;
    uint16_t* lo = hi + Kp;
    for (int64_t k = 0; k < Kp; k += 16) {
      const __mmask16 mk = k + 16 <= K ? __mmask16(0xffff) : k < K ? __mmask16((1u << (K - k)) - 1) : 0;
      __m512 v = _mm512_maskz_loadu_ps(mk, x + m * ldx + k);
      __m256bh h = _mm512_cvtneps_pbh(v);
      __m512 hf = widen16((__m256i)h);
      __m256bh l = _mm512_cvtneps_pbh(_mm512_sub_ps(v, hf));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + k), (__m256i)h);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + k), (__m256i)l);
    }
  }
  const int MR = M == 1 ? 1 : kMaxMR, NR = M == 1 ? 8 : 4;
  for (int64_t m = 0; m < M; m += MR) {
    const int mr = int(std::min<int64_t>(MR, M - m));
    for (int64_t n = n0; n < n1; n += NR) {
      const int nr = int(std::min<int64_t>(NR, n1 - n));
      kTilesDp[(mr - 1) * kMaxNR + (nr - 1)](xs + m * 2 * Kp, 2 * Kp, w + n * K, K, y + m * ldy + n, ldy);
    }
  }
}

}  // namespace

void matmul_range_avx512(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w,
                         DType w_dtype, float* y, int64_t ldy, int64_t n_begin, int64_t n_end) {
  const int MR = M == 1 ? 1 : kMaxMR;
  const int NR = M == 1 ? 8 : 4;
  if (w_dtype == DType::F32) {
    const float* wf = static_cast<const float*>(w);
    // Blocks of weight rows small enough to stay in L2 while every row tile of x passes.
    const int64_t nb = std::max<int64_t>(NR, (256 << 10) / std::max<int64_t>(1, K * 4) / NR * NR);
    for (int64_t n = n_begin; n < n_end; n += nb)
      run_block(x, M, K, ldx, wf + n * K, std::min(nb, n_end - n), y + n, ldy, MR, NR);
    return;
  }
  const uint16_t* wh = static_cast<const uint16_t*>(w);
  if (kDp) return range_dp(x, M, K, ldx, wh, y, ldy, n_begin, n_end);
  if (M < kPanelMinM) {
    const int64_t nb = std::max<int64_t>(NR, (256 << 10) / std::max<int64_t>(1, K * 2) / NR * NR);
    for (int64_t n = n_begin; n < n_end; n += nb)
      run_block(x, M, K, ldx, wh + n * K, std::min(nb, n_end - n), y + n, ldy, MR, NR);
    return;
  }
  // Many rows: widen a panel of weight rows to f32 once, reuse it for every row of x.
  const int64_t nb = kPanelRows;
  float* panel = scratch(size_t(nb * K));
  for (int64_t n = n_begin; n < n_end; n += nb) {
    const int64_t rows = std::min(nb, n_end - n);
    widen_rows(wh + n * K, rows, K, panel);
    run_block(x, M, K, ldx, panel, rows, y + n, ldy, MR, NR);
  }
}

}  // namespace augur::cpu::detail
