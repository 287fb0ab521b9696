// AVX-512 matmul bodies (this file is compiled with -mavx512f/bw/vl/dq/bf16).
//
// Two ways to multiply, each one "path" with its own fixed reduction order:
//   avx512      f32 FMA; bf16 weights widened to f32 (exactly) as they load.
//   avx512bf16  for bf16 weights, vdpbf16ps with x split into bf16 hi + lo
//               (x = hi + lo + O(2^-17 |x|)): two dot-pair instructions per
//               32 weights, no widening. f32 weights take the avx512 kernels.
// Both tile the output MR x NR (one 16-lane accumulator per output), split k
// into blocks that keep a tile of x in L1 (accumulators parked in memory
// between blocks, so the order over k does not change), and stream blocks of
// weight rows through L2 once per row tile of x.
//
// Measured on Zen 5 (2 cores): widening on load beats widening a block of
// weights to an f32 panel once, even at M = 512 (the widening runs on ALU
// ports the FMAs leave idle, and bf16 halves the bytes moved); software
// prefetch slows the memory-bound M = 1 case down by 5-10%, so there is none.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

#include "backend/cpu/matmul.h"
#include "core/quant.h"
#include "core/tensor.h"

// GCC 12's unmasked intrinsics that yield a part of a register (extract,
// zero-extend, shift) start from _mm512_undefined_*() and trip
// -Wmaybe-uninitialized; the zero-masked forms below compile the same.

namespace augur::cpu::detail {

namespace {

// Fixed-order sum of 16 lanes.
inline float hsum(__m512 v) {
  __m256 s8 = _mm256_add_ps(_mm512_maskz_extractf32x8_ps(0xff, v, 0),
                            _mm512_maskz_extractf32x8_ps(0xff, v, 1));
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
  return _mm_cvtss_f32(s4);
}

// 16 bf16 -> f32, exactly (a bf16 is the top half of an f32).
inline __m512 widen16(__m256i h) {
  return _mm512_castsi512_ps(
      _mm512_maskz_slli_epi32(0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, h), 16));
}

inline __mmask16 first_n16(int64_t n) { return __mmask16((1u << n) - 1); }
inline __mmask32 first_n32(int64_t n) { return __mmask32((uint64_t(1) << n) - 1); }

// ---- Kernels: steps of k for an MR x NR tile of accumulators ----
// X, W: element types of x and w as the kernel reads them; kStep: k per step.
// step() covers [k, k + kStep); tail() covers [k, K) with K - k < kStep,
// zero-padded, and is the last step of every output.

// x f32 · w f32.
struct FmaF32 {
  using X = float;
  using W = float;
  static constexpr int64_t kStep = 16;
  static constexpr int64_t kXBytes = 4;  // bytes of x per k
  static constexpr int kTileRows = 6;    // MR of the main tile (fewer when M is smaller)

  template <int MR, int NR>
  static void step(__m512 (&acc)[MR][NR], const X* x, int64_t ldx, const W* w, int64_t ldw,
                   int64_t k) {
    __m512 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = _mm512_loadu_ps(w + j * ldw + k);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }

  template <int MR, int NR>
  static void tail(__m512 (&acc)[MR][NR], const X* x, int64_t ldx, const W* w, int64_t ldw,
                   int64_t k, int64_t K) {
    const __mmask16 m = first_n16(K - k);
    __m512 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = _mm512_maskz_loadu_ps(m, w + j * ldw + k);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + i * ldx + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
};

// x f32 · w bf16 widened on load: FmaF32's arithmetic on the widened weights.
struct FmaBf16 {
  using X = float;
  using W = uint16_t;
  static constexpr int64_t kStep = 16;
  static constexpr int64_t kXBytes = 4;
  static constexpr int kTileRows = 6;

  template <int MR, int NR>
  static void step(__m512 (&acc)[MR][NR], const X* x, int64_t ldx, const W* w, int64_t ldw,
                   int64_t k) {
    __m512 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j)
      wv[j] = widen16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + j * ldw + k)));
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }

  template <int MR, int NR>
  static void tail(__m512 (&acc)[MR][NR], const X* x, int64_t ldx, const W* w, int64_t ldw,
                   int64_t k, int64_t K) {
    const __mmask16 m = first_n16(K - k);
    __m512 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = widen16(_mm256_maskz_loadu_epi16(m, w + j * ldw + k));
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + i * ldx + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
};

// x split into bf16 hi + lo · w bf16, by vdpbf16ps: lane l of an accumulator
// takes the pairs k = 32s + 2l, 32s + 2l + 1 of step s, hi first, then lo.
// x rows as split_rows() lays them out: [hi: Kp][lo: Kp], Kp = ldx / 2,
// zero-padded past K, so only w needs a mask in the tail.
struct DpBf16 {
  using X = uint16_t;
  using W = uint16_t;
  static constexpr int64_t kStep = 32;
  static constexpr int64_t kXBytes = 4;  // hi + lo
  // 4 x 6 tiles: as fast as 6 x 4 at M = 512, 5-10% faster for M = 8, 16.
  static constexpr int kTileRows = 4;

  template <int MR, int NR>
  static void fma_pairs(__m512 (&acc)[MR][NR], const X* x, int64_t ldx, const __m512bh (&wv)[NR],
                        int64_t k) {
    const int64_t kp = ldx / 2;
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512bh hi = (__m512bh)_mm512_loadu_si512(x + i * ldx + k);
      const __m512bh lo = (__m512bh)_mm512_loadu_si512(x + i * ldx + kp + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) {
        acc[i][j] = _mm512_dpbf16_ps(acc[i][j], hi, wv[j]);
        acc[i][j] = _mm512_dpbf16_ps(acc[i][j], lo, wv[j]);
      }
    }
  }

  template <int MR, int NR>
  static void step(__m512 (&acc)[MR][NR], const X* x, int64_t ldx, const W* w, int64_t ldw,
                   int64_t k) {
    __m512bh wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = (__m512bh)_mm512_loadu_si512(w + j * ldw + k);
    fma_pairs(acc, x, ldx, wv, k);
  }

  template <int MR, int NR>
  static void tail(__m512 (&acc)[MR][NR], const X* x, int64_t ldx, const W* w, int64_t ldw,
                   int64_t k, int64_t K) {
    const __mmask32 m = first_n32(K - k);
    __m512bh wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = (__m512bh)_mm512_maskz_loadu_epi16(m, w + j * ldw + k);
    fma_pairs(acc, x, ldx, wv, k);
  }
};

// Splits rows of x into bf16 hi + lo (round to nearest even, twice).
// x: [M, K] stride ldx -> out: [M, 2 * Kp], Kp = K rounded up to 32.
void split_rows(const float* x, int64_t M, int64_t K, int64_t ldx, uint16_t* out) {
  const int64_t kp = (K + 31) / 32 * 32;
  for (int64_t m = 0; m < M; ++m) {
    uint16_t* hi = out + m * 2 * kp;
    uint16_t* lo = hi + kp;
    for (int64_t k = 0; k < kp; k += 16) {
      const __mmask16 mk = first_n16(std::clamp<int64_t>(K - k, 0, 16));
      const __m512 v = _mm512_maskz_loadu_ps(mk, x + m * ldx + k);
      const __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
      const __m256i l = (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, widen16(h)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + k), h);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + k), l);
    }
  }
}

// ---- Tiles ----

// Accumulates k in [k0, k1) into an MR x NR tile: y[i, j] += x[i, :] · w[j, :].
// x: [MR, *] stride ldx; w: [NR, *] stride ldw; y: [MR, NR] stride ldy.
// Starts from zero when k0 == 0, else from `park`; finishes (tail, then the
// horizontal sum into y) when k1 == K, else parks the accumulators. Every
// output sees the same sequence whatever the tile shape and blocking.
// Prefetches pf_lines cache lines from address pf on per step.
template <typename P, int MR, int NR>
void tile(const typename P::X* x, int64_t ldx, const typename P::W* w, int64_t ldw, int64_t k0,
          int64_t k1, int64_t K, float* park, float* y, int64_t ldy, uintptr_t pf, int pf_lines) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j)
      acc[i][j] = k0 == 0 ? _mm512_setzero_ps() : _mm512_load_ps(park + (i * NR + j) * 16);
  int64_t k = k0;
  for (; k + P::kStep <= k1; k += P::kStep) {
    for (int q = 0; q < pf_lines; ++q, pf += 64)
      _mm_prefetch(reinterpret_cast<const char*>(pf), _MM_HINT_T1);
    P::template step<MR, NR>(acc, x, ldx, w, ldw, k);
  }
  if (k1 < K) {
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) _mm512_store_ps(park + (i * NR + j) * 16, acc[i][j]);
    return;
  }
  if (k < K) P::template tail<MR, NR>(acc, x, ldx, w, ldw, k, K);
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = hsum(acc[i][j]);
}

constexpr int kMaxMR = 6;
constexpr int kMaxNR = 8;
constexpr int kRegs = 32;

// Widest NR whose tile fits the registers for MR rows (accumulators, one
// vector per weight row, x).
constexpr int nr_for(int mr) {
  int nr = kMaxNR;
  while (mr * nr + nr + 2 > kRegs) --nr;
  return nr;
}

template <typename P>
using TileFn = void (*)(const typename P::X*, int64_t, const typename P::W*, int64_t, int64_t,
                        int64_t, int64_t, float*, float*, int64_t, uintptr_t, int);

template <typename P, int I>
constexpr TileFn<P> tile_entry() {
  constexpr int mr = I / kMaxNR + 1, nr = I % kMaxNR + 1;
  if constexpr (nr <= nr_for(mr))
    return &tile<P, mr, nr>;
  else
    return nullptr;
}
template <typename P, int... I>
constexpr std::array<TileFn<P>, sizeof...(I)> tile_table(std::integer_sequence<int, I...>) {
  return {tile_entry<P, I>()...};
}
// kTiles<P>[(mr - 1) * kMaxNR + nr - 1]: the mr x nr tile (nullptr if it does not fit).
template <typename P>
constexpr auto kTiles = tile_table<P>(std::make_integer_sequence<int, kMaxMR * kMaxNR>());

// ---- Blocking ----

constexpr int64_t kMaxBlockRows = 64;        // weight rows per block
constexpr int64_t kBlockBytes = 256 << 10;   // a block of weights: a quarter of L2
constexpr int64_t kXTileBytes = 24 << 10;    // a k-block of a row tile of x: half of L1
constexpr int64_t kSplitRows = 240;          // rows of x split to hi + lo at a time
constexpr int64_t kMaxPrefetchRowTiles = 8;  // see run_block

struct Plan {
  int MR, NR;
  int64_t block_rows;  // weight rows per block, a multiple of NR
  int64_t kc;          // k per block, a multiple of kStep (or all of K)
};

template <typename P>
Plan plan_for(int64_t M, int64_t K) {
  Plan p;
  // All rows in one tile while they fit, else tiles of the kernel's choice.
  p.MR = int(M <= kMaxMR ? M : P::kTileRows);
  p.NR = nr_for(p.MR);
  const int64_t row_bytes = std::max<int64_t>(1, K * int64_t(sizeof(typename P::W)));
  p.block_rows = std::clamp<int64_t>(kBlockBytes / row_bytes, p.NR, kMaxBlockRows) / p.NR * p.NR;
  // k-blocks of even length, each keeping a row tile of x within kXTileBytes.
  const int64_t kc_max =
      std::max(P::kStep, kXTileBytes / (p.MR * P::kXBytes) / P::kStep * P::kStep);
  if (kc_max >= K) {
    p.kc = K;
  } else {
    const int64_t n_blocks = (K + kc_max - 1) / kc_max;
    p.kc = ((K + n_blocks - 1) / n_blocks + P::kStep - 1) / P::kStep * P::kStep;
  }
  return p;
}

// y[0:M, 0:rows] = x[0:M] · w[0:rows]ᵀ for one block of weight rows.
// x: [M, K] stride ldx; w: [rows, K] stride ldw; y: [M, rows] stride ldy.
// Few rows (M <= ~32): while the row tiles after the first reuse the block
// from L2, the next block's bytes [next, next + next_bytes) are prefetched, a
// few lines per step, so that memory keeps streaming (M = 16: 10-25% faster;
// with more row tiles the compute hides the memory anyway).
template <typename P>
void run_block(const Plan& p, const typename P::X* x, int64_t M, int64_t K, int64_t ldx,
               const typename P::W* w, int64_t ldw, int64_t rows, float* y, int64_t ldy,
               uintptr_t next, int64_t next_bytes) {
  alignas(64) float park[kMaxBlockRows * kMaxMR * 16];  // parked accumulators
  const int64_t row_tiles = (M + p.MR - 1) / p.MR;
  const int64_t steps = ((rows + p.NR - 1) / p.NR) * (K / P::kStep);  // per row tile
  int pf_lines = 0;  // per step of the row tiles after the first
  if (row_tiles > 1 && row_tiles <= kMaxPrefetchRowTiles && steps > 0) {
    const int64_t later_steps = (row_tiles - 1) * steps;
    pf_lines = int((next_bytes / 64 + later_steps - 1) / later_steps);
  }
  const uintptr_t pf_end = next + uintptr_t(next_bytes);
  for (int64_t m = 0; m < M; m += p.MR) {
    const int mr = int(std::min<int64_t>(p.MR, M - m));
    for (int64_t k0 = 0;; k0 += p.kc) {
      const int64_t k1 = std::min(K, k0 + p.kc);
      for (int64_t n = 0; n < rows; n += p.NR) {
        const int nr = int(std::min<int64_t>(p.NR, rows - n));
        const int lines = m > 0 && next < pf_end ? pf_lines : 0;
        kTiles<P>[(mr - 1) * kMaxNR + (nr - 1)](x + m * ldx, ldx, w + n * ldw, ldw, k0, k1, K,
                                                park + n * p.MR * 16, y + m * ldy + n, ldy, next,
                                                lines);
        next += uintptr_t(lines) * 64 * uintptr_t((k1 - k0) / P::kStep);
      }
      if (k1 == K) break;
    }
  }
}

// y[0:M, n_begin:n_end], block by block of weight rows.
template <typename P>
void run_range(const typename P::X* x, int64_t M, int64_t K, int64_t ldx, const typename P::W* w,
               float* y, int64_t ldy, int64_t n_begin, int64_t n_end) {
  const Plan p = plan_for<P>(M, K);
  for (int64_t n = n_begin; n < n_end; n += p.block_rows) {
    const int64_t rows = std::min(p.block_rows, n_end - n);
    const int64_t next_rows = std::min(p.block_rows, n_end - n - rows);
    run_block<P>(p, x, M, K, ldx, w + n * K, K, rows, y + n, ldy,
                 reinterpret_cast<uintptr_t>(w + (n + rows) * K),
                 next_rows * K * int64_t(sizeof(typename P::W)));
  }
}

// Per-thread scratch for the split x, kept between calls.
uint16_t* split_scratch(size_t n) {
  thread_local std::unique_ptr<HostBuffer> buf;
  if (!buf || buf->size() < n * sizeof(uint16_t))
    buf = std::make_unique<HostBuffer>(n * sizeof(uint16_t));
  return static_cast<uint16_t*>(buf->data());
}

}  // namespace

void matmul_range_avx512(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w,
                         DType w_dtype, float* y, int64_t ldy, int64_t n_begin, int64_t n_end) {
  if (w_dtype == DType::F32)
    return run_range<FmaF32>(x, M, K, ldx, static_cast<const float*>(w), y, ldy, n_begin, n_end);
  run_range<FmaBf16>(x, M, K, ldx, static_cast<const uint16_t*>(w), y, ldy, n_begin, n_end);
}

void matmul_range_avx512bf16(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w,
                             DType w_dtype, float* y, int64_t ldy, int64_t n_begin, int64_t n_end) {
  if (w_dtype == DType::F32)
    return run_range<FmaF32>(x, M, K, ldx, static_cast<const float*>(w), y, ldy, n_begin, n_end);
  // Split x a chunk of rows at a time, which bounds the scratch; each chunk
  // streams the weights once more, a small cost next to the multiplies.
  const int64_t kp = (K + 31) / 32 * 32;
  const int64_t chunk = std::min(M, kSplitRows);
  uint16_t* xs = split_scratch(size_t(chunk * 2 * kp));  // [chunk, hi Kp | lo Kp]
  for (int64_t m = 0; m < M; m += chunk) {
    const int64_t rows = std::min(chunk, M - m);
    split_rows(x + m * ldx, rows, K, ldx, xs);
    run_range<DpBf16>(xs, rows, K, 2 * kp, static_cast<const uint16_t*>(w), y + m * ldy, ldy,
                      n_begin, n_end);
  }
}

namespace {

// n (a multiple of 8) floats rounded to f16 and back, by F16C (eight at a
// time: GCC 12 warns inside its own 16-wide intrinsics).
void round_f16_f16c(float* v, int n) {
  for (int i = 0; i < n; i += 8)
    _mm256_storeu_ps(v + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(v + i), _MM_FROUND_TO_NEAREST_INT)));
}

// 16 floats rounded to bf16 bits as quant_detail::round_bf16 does (nearest
// even; NaN quiet).
__m256i round_bf16x16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_maskz_srli_epi32(0xffff, u, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_maskz_srli_epi32(0xffff, _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i quiet = _mm512_or_si512(_mm512_maskz_srli_epi32(0xffff, u, 16), _mm512_set1_epi32(0x40));
  return _mm512_maskz_cvtepi32_epi16(0xffff, _mm512_mask_blend_epi32(nan, rounded, quiet));
}

// The 16 values fmaf(s, c, b) for c = 0..15 in bf16, twice over: a vpermw
// table of 32 words.
__m512i bf16_table16(float s, float b) {
  const __m512 v = _mm512_fmadd_ps(_mm512_set1_ps(s),
                                   _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                   _mm512_set1_ps(b));
  return _mm512_maskz_broadcast_i64x4(0xff, round_bf16x16(v));
}

// 8-bit rows with bf16 scales into bf16: 16 codes a step widened, fmaf'd
// and rounded in vectors (the generic form, which GCC vectorizes less
// well, ran at half the 4-bit rate).
void dequantize_8bit_bf16(const QuantLayout& q, const uint8_t* src, int64_t rows, int64_t K, uint16_t* dst) {
  const int G = q.group;
  const size_t bb = quant_detail::block_bytes_of(q);
  const int64_t groups = K / G;
  for (int64_t i = 0; i < rows * groups; ++i) {
    const uint8_t* block = src + size_t(i) * bb;
    uint16_t sb, bb16;
    std::memcpy(&sb, block, 2);
    std::memcpy(&bb16, block + 2, 2);
    const __m512 s = _mm512_set1_ps(quant_detail::widen_bf16(sb)), b = _mm512_set1_ps(quant_detail::widen_bf16(bb16));
    uint16_t* d = dst + i * G;
    for (int j = 0; j < G; j += 16) {
      const __m512i c = _mm512_maskz_cvtepu8_epi32(0xffff, _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 4 + j)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + j),
                          round_bf16x16(_mm512_fmadd_ps(s, _mm512_maskz_cvtepi32_ps(0xffff, c), b)));
    }
  }
}

// 4-bit rows with bf16 scales into bf16 (the common mlx checkpoint): a
// group's 16 possible values are computed once, in one vector, and its
// codes looked up 32 at a time by vpermw (computing each value took ~3x as
// long as augur-tiny's bf16 decode step).
void dequantize_4bit_bf16(const QuantLayout& q, const uint8_t* src, int64_t rows, int64_t K, uint16_t* dst) {
  const int G = q.group;
  const size_t bb = quant_detail::block_bytes_of(q);
  const int64_t groups = K / G;
  const __m128i low4 = _mm_set1_epi8(0x0f);
  for (int64_t i = 0; i < rows * groups; ++i) {
    const uint8_t* block = src + size_t(i) * bb;
    uint16_t sb, bb16;
    std::memcpy(&sb, block, 2);
    std::memcpy(&bb16, block + 2, 2);
    const __m512i table = bf16_table16(quant_detail::widen_bf16(sb), quant_detail::widen_bf16(bb16));
    const uint8_t* codes = block + 4;
    uint16_t* d = dst + i * G;
    for (int j = 0; j < G; j += 32) {  // 16 bytes: 32 codes, low nibble first
      const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + j / 2));
      const __m128i lo = _mm_and_si128(packed, low4), hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low4);
      const __m256i idx8 = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
      const __m512i idx = _mm512_maskz_cvtepu8_epi16(0xffffffff, idx8);
      _mm512_storeu_si512(d + j, _mm512_permutexvar_epi16(idx, table));
    }
  }
}

}  // namespace

void dequantize_rows_avx512(const QuantLayout& q, const void* src, int64_t rows, int64_t K, DType out, void* dst) {
  if (q.bits == 4 && q.scale == DType::BF16 && out == DType::BF16)
    return dequantize_4bit_bf16(q, static_cast<const uint8_t*>(src), rows, K, static_cast<uint16_t*>(dst));
  if (q.bits == 8 && q.scale == DType::BF16 && out == DType::BF16)
    return dequantize_8bit_bf16(q, static_cast<const uint8_t*>(src), rows, K, static_cast<uint16_t*>(dst));
  quant_detail::dequantize_rows_with(q, src, rows, K, out, dst, &round_f16_f16c);
}

}  // namespace augur::cpu::detail
