// matmul dispatch, the split over threads, and the scalar body (compiled for
// baseline x86-64: nothing here may use a wider instruction set).
#include "backend/cpu/matmul.h"

#include <cstdlib>
#include <cstring>

#include <algorithm>
#include <memory>
#include <vector>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/quant.h"

namespace augur::cpu {

namespace detail {

namespace {

inline float widen(float v) { return v; }
inline float widen(uint16_t v) { return bf16_to_f32(v); }

// One output of the scalar path: 8 partial sums, k ascending in steps of 8
// (the last step zero-padded), a fixed pairwise sum — the same for every
// output, so results do not depend on tiling. Kept out of line so that every
// output runs the same instructions.
template <typename WT>
[[gnu::noinline]] float dot_scalar(const float* x, const WT* w, int64_t K) {
  float acc[8] = {};
  int64_t k = 0;
  for (; k + 8 <= K; k += 8)
    for (int l = 0; l < 8; ++l) acc[l] += x[k + l] * widen(w[k + l]);
  for (int l = 0; k + l < K; ++l) acc[l] += x[k + l] * widen(w[k + l]);
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

template <typename WT>
void range_scalar(const float* x, int64_t M, int64_t K, int64_t ldx, const WT* w, float* y,
                  int64_t ldy, int64_t n_begin, int64_t n_end) {
  for (int64_t n = n_begin; n < n_end; ++n)
    for (int64_t m = 0; m < M; ++m) y[m * ldy + n] = dot_scalar(x + m * ldx, w + n * K, K);
}

}  // namespace

void matmul_range_scalar(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w,
                         DType w_dtype, float* y, int64_t ldy, int64_t n_begin, int64_t n_end) {
  if (w_dtype == DType::F32)
    range_scalar(x, M, K, ldx, static_cast<const float*>(w), y, ldy, n_begin, n_end);
  else
    range_scalar(x, M, K, ldx, static_cast<const uint16_t*>(w), y, ldy, n_begin, n_end);
}

}  // namespace detail

namespace {

// Threads split N in units of this many columns (whole tiles, whole cache
// lines of y); M is split too only when N has fewer units than threads.
constexpr int64_t kColumnUnit = 16;
// Below this many multiply-adds the fork costs more than it saves.
constexpr int64_t kMinParallelMacs = 1 << 16;

// Calls range(m0, m1, n0, n1) for each thread's share of y[0:M, 0:N].
template <typename Range>
void split(int64_t M, int64_t K, int64_t N, ThreadPool& pool, Range range) {
  AUGUR_ASSERT(M >= 0 && K >= 0 && N >= 0, "[matmul] negative size");
  if (M == 0 || N == 0) return;
  const int n_threads = pool.size();
  if (n_threads == 1 || M * N * K < kMinParallelMacs) {
    range(int64_t(0), M, int64_t(0), N);
    return;
  }
  const int64_t units = (N + kColumnUnit - 1) / kColumnUnit;
  const int tn = int(std::min<int64_t>(n_threads, units));
  const int tm = int(std::min<int64_t>(n_threads / tn, M));
  pool.run([&](int tid, int) {
    if (tid >= tm * tn) return;
    const int im = tid / tn, in = tid % tn;
    const int64_t m0 = M * im / tm, m1 = M * (im + 1) / tm;
    const int64_t n0 = std::min(N, units * in / tn * kColumnUnit);
    const int64_t n1 = std::min(N, units * (in + 1) / tn * kColumnUnit);
    if (m0 < m1 && n0 < n1) range(m0, m1, n0, n1);
  });
}

void run_split(detail::MatmulRangeFn fn, const float* x, int64_t M, int64_t K, int64_t ldx,
               const void* w, DType w_dtype, int64_t N, float* y, int64_t ldy, ThreadPool& pool) {
  AUGUR_ASSERT(w_dtype == DType::BF16 || w_dtype == DType::F32,
               "[matmul] weights must be BF16 or F32");
  AUGUR_ASSERT(M <= 1 || (ldx >= K && ldy >= N), "[matmul] row stride shorter than the row");
  split(M, K, N, pool, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    fn(x + m0 * ldx, m1 - m0, K, ldx, w, w_dtype, y + m0 * ldy, ldy, n0, n1);
  });
}

// A quantized matrix's rows are dequantized a block at a time into this
// much per-thread scratch (the float kernels' own block of weights, so it
// stays in L2 while every row of x passes over it).
constexpr int64_t kDequantBytes = 256 << 10;

void* dequant_scratch(size_t bytes) {
  thread_local std::unique_ptr<HostBuffer> buf;
  if (!buf || buf->size() < bytes) buf = std::make_unique<HostBuffer>(bytes, Fill::None);
  return buf->data();
}

void run_quantized(detail::MatmulRangeFn fn, detail::DequantRowsFn dequant, const float* x, int64_t M, int64_t K,
                   int64_t ldx, const void* w, const QuantLayout& q, int64_t N, float* y, int64_t ldy,
                   ThreadPool& pool) {
  AUGUR_ASSERT(q.group > 0 && K % q.group == 0, "[matmul] quantized rows split into whole blocks");
  AUGUR_ASSERT(M <= 1 || (ldx >= K && ldy >= N), "[matmul] row stride shorter than the row");
  const DType dt = dequantized_cpu_type(q);
  const size_t row_bytes = size_t(K / q.group) * q.block_bytes(), out_row = size_t(K) * dtype_size(dt);
  const int64_t block = std::max<int64_t>(kColumnUnit, kDequantBytes / int64_t(out_row) / kColumnUnit * kColumnUnit);
  split(M, K, N, pool, [&](int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    void* rows = dequant_scratch(size_t(std::min(block, n1 - n0)) * out_row);
    for (int64_t n = n0; n < n1; n += block) {
      const int64_t nb = std::min(block, n1 - n);
      dequant(q, static_cast<const uint8_t*>(w) + size_t(n) * row_bytes, nb, K, dt, rows);
      fn(x + m0 * ldx, m1 - m0, K, ldx, rows, dt, y + m0 * ldy + n, ldy, 0, nb);
    }
  });
}

}  // namespace

bool matmul_path_supported(MatmulPath path) {
  const CpuFeatures& f = cpu_features();
  switch (path) {
    case MatmulPath::Scalar: return true;
    case MatmulPath::Avx2: return f.avx2 && f.fma && f.f16c;  // (F16C: quantized rows with f16 scales)
    case MatmulPath::Avx512: return f.avx512f && f.avx512bw && f.f16c;
    case MatmulPath::Avx512Bf16: return f.avx512f && f.avx512bw && f.avx512bf16 && f.f16c;
  }
  return false;
}

// The f32-exact paths are the default: the bf16 dot-product path carries x to
// ~17 bits, enough for dense models but not for the hybrid families, whose
// recurrences magnify it past their golden tolerance. AUGUR_CPU=avx512bf16
// opts in (5-15% faster on this machine's Zen 5).
MatmulPath matmul_path() {
  static const MatmulPath path = [] {
    const char* cap = std::getenv("AUGUR_CPU");
    if (cap && std::strcmp(cap, "avx512bf16") == 0 && matmul_path_supported(MatmulPath::Avx512Bf16))
      return MatmulPath::Avx512Bf16;
    return matmul_path_supported(MatmulPath::Avx512) ? MatmulPath::Avx512
           : matmul_path_supported(MatmulPath::Avx2) ? MatmulPath::Avx2
                                                     : MatmulPath::Scalar;
  }();
  return path;
}

const char* matmul_path_name(MatmulPath path) {
  switch (path) {
    case MatmulPath::Scalar: return "scalar";
    case MatmulPath::Avx2: return "avx2";
    case MatmulPath::Avx512: return "avx512";
    case MatmulPath::Avx512Bf16: return "avx512bf16";
  }
  return "?";
}

void matmul_scalar(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w, DType w_dtype,
                   int64_t N, float* y, int64_t ldy, ThreadPool& pool) {
  run_split(&detail::matmul_range_scalar, x, M, K, ldx, w, w_dtype, N, y, ldy, pool);
}

void matmul_avx2(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w, DType w_dtype,
                 int64_t N, float* y, int64_t ldy, ThreadPool& pool) {
  AUGUR_ASSERT(matmul_path_supported(MatmulPath::Avx2), "[matmul] this CPU has no AVX2+FMA");
  run_split(&detail::matmul_range_avx2, x, M, K, ldx, w, w_dtype, N, y, ldy, pool);
}

void matmul_avx512(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w, DType w_dtype,
                   int64_t N, float* y, int64_t ldy, ThreadPool& pool) {
  AUGUR_ASSERT(matmul_path_supported(MatmulPath::Avx512), "[matmul] this CPU has no AVX-512");
  run_split(&detail::matmul_range_avx512, x, M, K, ldx, w, w_dtype, N, y, ldy, pool);
}

void matmul_avx512bf16(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w,
                       DType w_dtype, int64_t N, float* y, int64_t ldy, ThreadPool& pool) {
  AUGUR_ASSERT(matmul_path_supported(MatmulPath::Avx512Bf16),
               "[matmul] this CPU has no AVX-512 BF16");
  run_split(&detail::matmul_range_avx512bf16, x, M, K, ldx, w, w_dtype, N, y, ldy, pool);
}

void matmul_quantized(MatmulPath path, const float* x, int64_t M, int64_t K, int64_t ldx, const void* w,
                      const QuantLayout& q, int64_t N, float* y, int64_t ldy, ThreadPool& pool) {
  AUGUR_ASSERT(matmul_path_supported(path), "[matmul] this CPU lacks the path asked for");
  switch (path) {
    case MatmulPath::Scalar:
      return run_quantized(&detail::matmul_range_scalar, &dequantize_rows, x, M, K, ldx, w, q, N, y, ldy, pool);
    case MatmulPath::Avx2:
      return run_quantized(&detail::matmul_range_avx2, &detail::dequantize_rows_avx2, x, M, K, ldx, w, q, N, y, ldy,
                           pool);
    case MatmulPath::Avx512:
      return run_quantized(&detail::matmul_range_avx512, &detail::dequantize_rows_avx512, x, M, K, ldx, w, q, N, y,
                           ldy, pool);
    case MatmulPath::Avx512Bf16:
      return run_quantized(&detail::matmul_range_avx512bf16, &detail::dequantize_rows_avx512, x, M, K, ldx, w, q, N,
                           y, ldy, pool);
  }
}

void matmul_quantized(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w, const QuantLayout& q,
                      int64_t N, float* y, int64_t ldy, ThreadPool& pool) {
  matmul_quantized(matmul_path(), x, M, K, ldx, w, q, N, y, ldy, pool);
}

namespace detail {

bool& round_inputs_to_f16() {
  static bool on = false;
  return on;
}

}  // namespace detail

namespace {

void dispatch(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w, DType w_dtype, int64_t N, float* y,
              int64_t ldy, ThreadPool& pool) {
  switch (matmul_path()) {
    case MatmulPath::Avx512Bf16:
      return matmul_avx512bf16(x, M, K, ldx, w, w_dtype, N, y, ldy, pool);
    case MatmulPath::Avx512: return matmul_avx512(x, M, K, ldx, w, w_dtype, N, y, ldy, pool);
    case MatmulPath::Avx2: return matmul_avx2(x, M, K, ldx, w, w_dtype, N, y, ldy, pool);
    case MatmulPath::Scalar: return matmul_scalar(x, M, K, ldx, w, w_dtype, N, y, ldy, pool);
  }
}

}  // namespace

void matmul(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w, DType w_dtype,
            int64_t N, float* y, int64_t ldy, ThreadPool& pool) {
  if (detail::round_inputs_to_f16() && M > 8) {
    std::vector<float> xr(static_cast<size_t>(M * K));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) {
        const float v = std::clamp(x[m * ldx + k], -65504.0f, 65504.0f);  // NaN stays NaN
        xr[size_t(m * K + k)] = f16_to_f32(f32_to_f16(v));
      }
    return dispatch(xr.data(), M, K, K, w, w_dtype, N, y, ldy, pool);
  }
  dispatch(x, M, K, ldx, w, w_dtype, N, y, ldy, pool);
}

}  // namespace augur::cpu
