// Internal (host) entry points behind kernels.h: the matmul paths (gemv.cu,
// gemm_lt.cu) and flash-decoding with a chosen split length
// (attention_decode.cu), for the dispatch, the tests and the benchmark.
#pragma once

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace augur::cuda::detail {

// Reference modes for tests (tests/cuda): every matmul on f32 products (the
// skinny or generic kernel, slow), every attention through the scalar
// flash-decoding kernel (f32 Q and P). Off by default; set before the work is
// queued.
struct Precision {
  bool exact_matmul = false;
  bool decode_attention = false;
};
Precision& precision();

// Rows of x the skinny kernels take (matmul_half sends M <= stream_rows(),
// at most this, to them, larger M to cuBLASLt): all of a verify step's at
// batch 1 (1 + k <= 8 tokens), so that its rows are computed as a decode
// step's are.
constexpr int64_t kSkinnyMaxM = 8;

// Skinny path (M <= kSkinnyMaxM). splits = 0 picks the kernel (the stream
// GEMV where every SM gets a stage's rows, else rows_kernel) and
// its split-K factor; otherwise rows_kernel with K cut into about `splits`
// pieces (tests, benchmark sweeps).
void skinny_matmul(const float* x, int64_t M, int64_t K, int64_t ldx, const half_bits* w, int64_t N,
                   float* y, int64_t ldy, Stream s, int splits = 0, Half wt = Half::BF16);
// The split-K factor rows_kernel picks (0 if skinny_matmul takes the generic kernel).
int skinny_splits(int64_t M, int64_t K, int64_t N);

// The stream GEMV (gemv.cu, M <= 8) with the decode step's fused ends:
//   y = f(x) · wᵀ, f(x) = x, or rms_norm(x) * g when norm (x: the residual);
//   Store: y = the product; Accumulate: y += it (the residual), and y2 = it
//   when y2 is given (row stride ldy too); SwiGLU: w is a fused gate/up
//   [N, K] (the gate's N / 2 rows, then the up's) and y[m, i] = silu(gate_i)
//   * up_i, y: [M, N / 2].
// x: [M, K] f32 (row stride ldx); w: [N, K] half.
enum class StreamEpi { Store, Accumulate, SwiGLU };
struct StreamGemv {
  const float* x = nullptr;
  int64_t M = 0, K = 0, ldx = 0;
  const half_bits* w = nullptr;
  Half wt = Half::BF16;
  int64_t N = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  StreamEpi epi = StreamEpi::Store;
  float* y2 = nullptr;
  bool norm = false;
  const float* g = nullptr;  // [K] f32
  float eps = 0;
  // Shared-memory ring an SM, in KB (32-224; fewer where a SwiGLU stash needs the room).
  int ring_kb = 160;
  // The launch's name, for error messages and profiles (block_tail names its four GEMVs).
  const char* name = "stream_kernel";
};
// Shapes it takes: M <= 8, K % 8 == 0 up to 18432; SwiGLU: N even, N / 2 <= 65536.
bool stream_gemv_fits(int64_t M, int64_t K, int64_t N, bool swiglu = false);
void stream_gemv(const StreamGemv& q, Stream s);

// cuBLASLt on x already in bf16 (xb: [M, K] contiguous). algo < 0: the best
// heuristic result (cached per shape); otherwise the algo-th heuristic result.
// Returns false when cuBLASLt has no algorithm (or no algo-th one).
bool lt_matmul(const half_bits* xb, int64_t M, int64_t K, const half_bits* w, int64_t N, float* y,
               int64_t ldy, Stream s, int algo = -1, Half t = Half::BF16);
// Fallback for shapes cuBLASLt refuses: one warp per output column.
void generic_matmul(const float* x, int64_t M, int64_t K, int64_t ldx, const half_bits* w, int64_t N,
                    float* y, int64_t ldy, Stream s, Half wt = Half::BF16);

// Flash-decoding whatever n_tokens is. split_len 0: the planned split length
// (as paged_attention); otherwise `split_len` keys per split, and `workspace`
// must hold n_tokens * n_head * ceil(max_context / split_len) * (head_dim + 2) floats.
void paged_attention_decode(const float* q, const half_bits* k_cache, const half_bits* v_cache, int64_t block_size,
                            int64_t n_head, int64_t n_head_kv, int64_t head_dim, const AttnMeta& meta, float scale,
                            int32_t window, float* out, void* workspace, Stream s, int split_len,
                            Half kv = Half::BF16);

}  // namespace augur::cuda::detail
