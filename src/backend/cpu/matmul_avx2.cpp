// AVX2 + FMA matmul body (this file is compiled with -mavx2 -mfma -mf16c).
//
// The scheme of matmul_avx512.cpp's FMA path with 8-lane accumulators and 16
// registers: f32 FMA, bf16 weights widened to f32 (exactly) as they load;
// MR x NR output tiles; k-blocks that keep a row tile of x in L1, the
// accumulators parked between blocks so the order over k never changes.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <utility>

#include "backend/cpu/matmul.h"
#include "core/quant.h"
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

// 8 bf16 -> f32, exactly (a bf16 is the top half of an f32).
inline __m256 widen8(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
  return widen8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// The first n (< 8) values, zeros after.
template <typename T>
inline __m256 load8_tail(const T* p, int64_t n) {
  alignas(32) T buf[8] = {};
  std::memcpy(buf, p, size_t(n) * sizeof(T));
  return load8(buf);
}

// How far ahead a single row of x (decode, memory-bound) prefetches each
// weight row: 5-10% faster on Zen 5 here, unlike the AVX-512 kernels, which
// read twice the bytes per instruction.
constexpr int64_t kPrefetchBytes = 512;
constexpr int64_t kStep = 8;

// Accumulates k in [k0, k1) into an MR x NR tile: y[i, j] += x[i, :] · w[j, :].
// x: [MR, *] f32 stride ldx; w: [NR, *] f32 or bf16 stride ldw; y: [MR, NR]
// stride ldy. Starts from zero when k0 == 0, else from `park`; finishes (the
// zero-padded tail, then the horizontal sum into y) when k1 == K, else parks
// the accumulators. Every output gets the same sequence whatever the tile
// shape and blocking: one 8-lane accumulator, k ascending in steps of 8 (FMA),
// the tail, hsum.
template <typename W, int MR, int NR>
void tile(const float* x, int64_t ldx, const W* w, int64_t ldw, int64_t k0, int64_t k1, int64_t K,
          float* park, float* y, int64_t ldy) {
  __m256 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j)
      acc[i][j] = k0 == 0 ? _mm256_setzero_ps() : _mm256_load_ps(park + (i * NR + j) * 8);
  int64_t k = k0;
  for (; k + kStep <= k1; k += kStep) {
    __m256 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      // A single streamed row is bound by memory: prefetch ahead of it.
      if constexpr (MR == 1)
        _mm_prefetch(reinterpret_cast<const char*>(w + j * ldw + k) + kPrefetchBytes, _MM_HINT_T0);
      wv[j] = load8(w + j * ldw + k);
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if (k1 < K) {
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) _mm256_store_ps(park + (i * NR + j) * 8, acc[i][j]);
    return;
  }
  if (k < K) {
    __m256 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = load8_tail(w + j * ldw + k, K - k);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 xv = load8_tail(x + i * ldx + k, K - k);
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
constexpr int kRegs = 16;

// Widest NR whose tile fits the registers for MR rows (accumulators, one
// vector per weight row, x); a single row streams its weights through one.
constexpr int nr_for(int mr) {
  if (mr == 1) return kMaxNR;
  int nr = kMaxNR;
  while (mr * nr + nr + 1 > kRegs) --nr;
  return nr;
}

template <typename W>
using TileFn = void (*)(const float*, int64_t, const W*, int64_t, int64_t, int64_t, int64_t, float*,
                        float*, int64_t);

template <typename W, int I>
constexpr TileFn<W> tile_entry() {
  constexpr int mr = I / kMaxNR + 1, nr = I % kMaxNR + 1;
  if constexpr (nr <= nr_for(mr))
    return &tile<W, mr, nr>;
  else
    return nullptr;
}
template <typename W, int... I>
constexpr std::array<TileFn<W>, sizeof...(I)> tile_table(std::integer_sequence<int, I...>) {
  return {tile_entry<W, I>()...};
}
// kTiles<W>[(mr - 1) * kMaxNR + nr - 1]: the mr x nr tile (nullptr if it does not fit).
template <typename W>
constexpr auto kTiles = tile_table<W>(std::make_integer_sequence<int, kMaxMR * kMaxNR>());

// ---- Blocking ----

constexpr int64_t kMaxBlockRows = 64;       // weight rows per block
constexpr int64_t kBlockBytes = 256 << 10;  // a block of weights: a quarter of L2
constexpr int64_t kXTileBytes = 24 << 10;   // a k-block of a row tile of x: half of L1

struct Plan {
  int MR, NR;
  int64_t block_rows;  // weight rows per block, a multiple of NR
  int64_t kc;          // k per block, a multiple of kStep (or all of K)
};

Plan plan_for(int64_t M, int64_t K, size_t w_bytes) {
  Plan p;
  p.MR = int(std::min<int64_t>(M, kMaxMR));
  p.NR = nr_for(p.MR);
  const int64_t row_bytes = std::max<int64_t>(1, K * int64_t(w_bytes));
  p.block_rows = std::clamp<int64_t>(kBlockBytes / row_bytes, p.NR, kMaxBlockRows) / p.NR * p.NR;
  // k-blocks of even length, each keeping a row tile of x within kXTileBytes.
  const int64_t kc_max =
      std::max(kStep, kXTileBytes / (p.MR * int64_t(sizeof(float))) / kStep * kStep);
  if (kc_max >= K) {
    p.kc = K;
  } else {
    const int64_t n_blocks = (K + kc_max - 1) / kc_max;
    p.kc = ((K + n_blocks - 1) / n_blocks + kStep - 1) / kStep * kStep;
  }
  return p;
}

// y[0:M, 0:rows] = x[0:M] · w[0:rows]ᵀ for one block of weight rows.
// x: [M, K] stride ldx; w: [rows, K] stride ldw; y: [M, rows] stride ldy.
template <typename W>
void run_block(const Plan& p, const float* x, int64_t M, int64_t K, int64_t ldx, const W* w,
               int64_t ldw, int64_t rows, float* y, int64_t ldy) {
  alignas(64) float park[kMaxBlockRows * kMaxMR * 8];  // parked accumulators
  for (int64_t m = 0; m < M; m += p.MR) {
    const int mr = int(std::min<int64_t>(p.MR, M - m));
    for (int64_t k0 = 0;; k0 += p.kc) {
      const int64_t k1 = std::min(K, k0 + p.kc);
      for (int64_t n = 0; n < rows; n += p.NR) {
        const int nr = int(std::min<int64_t>(p.NR, rows - n));
        kTiles<W>[(mr - 1) * kMaxNR + (nr - 1)](x + m * ldx, ldx, w + n * ldw, ldw, k0, k1, K,
                                                park + n * p.MR * 8, y + m * ldy + n, ldy);
      }
      if (k1 == K) break;
    }
  }
}

// y[0:M, n_begin:n_end], block by block of weight rows.
template <typename W>
void run_range(const float* x, int64_t M, int64_t K, int64_t ldx, const W* w, float* y, int64_t ldy,
               int64_t n_begin, int64_t n_end) {
  const Plan p = plan_for(M, K, sizeof(W));
  for (int64_t n = n_begin; n < n_end; n += p.block_rows)
    run_block(p, x, M, K, ldx, w + n * K, K, std::min(p.block_rows, n_end - n), y + n, ldy);
}

}  // namespace

void matmul_range_avx2(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w,
                       DType w_dtype, float* y, int64_t ldy, int64_t n_begin, int64_t n_end) {
  if (w_dtype == DType::F32)
    return run_range(x, M, K, ldx, static_cast<const float*>(w), y, ldy, n_begin, n_end);
  run_range(x, M, K, ldx, static_cast<const uint16_t*>(w), y, ldy, n_begin, n_end);
}

namespace {

// n (a multiple of 8) floats rounded to f16 and back, by F16C.
void round_f16_f16c(float* v, int n) {
  for (int i = 0; i < n; i += 8)
    _mm256_storeu_ps(v + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(v + i), _MM_FROUND_TO_NEAREST_INT)));
}

}  // namespace

void dequantize_rows_avx2(const QuantLayout& q, const void* src, int64_t rows, int64_t K, DType out, void* dst) {
  quant_detail::dequantize_rows_with(q, src, rows, K, out, dst, &round_f16_f16c);
}

}  // namespace augur::cpu::detail
