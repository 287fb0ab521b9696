// Linear attention (Gated DeltaNet) kernels and the element-wise ops around
// them: slice_cols, causal_conv1d, l2norm, delta_rule_gates, the gated delta
// rule in its recurrent and chunked forms, gated_rms_norm, sigmoid_mul. Each
// reproduces its CPU op in backend/cpu/linear_attn_cpu.cpp, in f32.
#include <algorithm>

#include "backend/cuda/common.cuh"

namespace augur::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
// torch.nn.functional.softplus with beta 1, threshold 20.
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// x: [M, N]; y: [M, n]
__global__ void slice_cols_kernel(const float* __restrict__ x, int64_t M, int64_t N, int64_t begin, int64_t n,
                                  float* __restrict__ y) {
  pdl_entry();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= M * n) return;
  const int64_t m = i / n, c = i - m * n;
  y[i] = x[m * N + begin + c];
}

// Columns of a row one block of the copies below moves: 4 a thread, so that
// a verify's few rows still spread over many blocks (one block a row left
// each thread a chain of dependent loads).
constexpr int kCopyColumns = 4 * kThreads;

// grid: (n_tokens, ceil(width / kCopyColumns)). proj: [n_tokens, P]; inputs: [n_slots, n_pos, width]
__global__ void keep_recurrent_inputs_kernel(const float* __restrict__ proj, int64_t P, int64_t n_conv, int64_t n_z,
                                             const int32_t* __restrict__ positions,
                                             const int32_t* __restrict__ token_row,
                                             const RecurrentRow* __restrict__ rows, int n_pos, int64_t width,
                                             float* __restrict__ inputs) {
  pdl_entry();
  const int64_t t = blockIdx.x;
  const RecurrentRow row = rows[token_row[t]];
  if (row.n_tokens < 2 || row.n_tokens > n_pos) return;
  const float* src = proj + t * P;
  float* dst = inputs + (int64_t(row.slot) * n_pos + positions[t] % n_pos) * width;
  const int64_t j0 = int64_t(blockIdx.y) * kCopyColumns, j1 = min(width, j0 + kCopyColumns);
#pragma unroll 4
  for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) dst[j] = src[j < n_conv ? j : j + n_z];
}

// grid: (n_tokens, ceil(width / kCopyColumns)). inputs: [n_slots, n_pos, width]; out: [n_tokens, width]
__global__ void load_recurrent_inputs_kernel(const float* __restrict__ inputs, const int32_t* __restrict__ positions,
                                             const int32_t* __restrict__ token_row,
                                             const RecurrentRow* __restrict__ rows, int n_pos, int64_t width,
                                             float* __restrict__ out) {
  pdl_entry();
  const int64_t t = blockIdx.x;
  const RecurrentRow row = rows[token_row[t]];
  const float* src = inputs + (int64_t(row.slot) * n_pos + positions[t] % n_pos) * width;
  float* dst = out + t * width;
  const int64_t j0 = int64_t(blockIdx.y) * kCopyColumns, j1 = min(width, j0 + kCopyColumns);
#pragma unroll 4
  for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) dst[j] = src[j];
}

// Tokens of a row one block of the conv handles (outputs depend only on
// inputs, so a row's tokens split freely).
constexpr int kConvSegment = 64;

// Reference: causal_conv1d_fn over the kept tail followed by the new inputs,
// taps j = 0 .. K-1. grid: (ceil(C / kThreads), n_rows, ceil(max_row_tokens / kConvSegment)).
// x, out: [n_tokens, C]; w: [C, K]; conv_state: [n_slots, K-1, C] (read only here)
// tail_here (every row one segment): the one thread of each (row, channel)
// also leaves the new tail, after reading the old (no conv_tail_kernel).
__global__ void causal_conv1d_kernel(const float* __restrict__ x, const float* __restrict__ w, int64_t C, int K,
                                     const RecurrentRow* __restrict__ rows, float* __restrict__ conv_state,
                                     bool silu, bool tail_here, float* __restrict__ out) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const RecurrentRow row = rows[blockIdx.y];
  const int i0 = int(blockIdx.z) * kConvSegment;
  const int tail = K - 1;
  float* st = conv_state + int64_t(row.slot) * tail * C;  // [K-1, C]
  const float* wc = w + c * K;
  // The weights and the kept tail (written only by this layer's conv, in an
  // earlier forward) start their way into L2 before the PDL wait, as the
  // recurrent kernel's state does.
  const bool live = c < C && i0 < row.n_tokens;
  if (live) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(wc));
    for (int p = 0; p < tail; ++p) asm volatile("prefetch.global.L2 [%0];" ::"l"(st + int64_t(p) * C + c));
  }
  pdl_entry();
  if (!live) return;
  const int i1 = min(row.n_tokens, i0 + kConvSegment);
  const float* xr = x + int64_t(row.token_begin) * C;             // [n, C]
  float* orow = out + int64_t(row.token_begin) * C;
  for (int i = i0; i < i1; ++i) {
    float acc = 0.0f;
    for (int j = 0; j < K; ++j) {
      const int m = i - tail + j;  // < 0: the kept tail
      const float in = m >= 0 ? xr[int64_t(m) * C + c] : st[int64_t(tail + m) * C + c];
      acc += wc[j] * in;
    }
    orow[int64_t(i) * C + c] = silu ? silu_f(acc) : acc;
  }
  if (tail_here) {  // as conv_tail_kernel
    const int n = row.n_tokens;
    for (int p = 0; p < tail; ++p) {
      const int m = n - tail + p;
      st[int64_t(p) * C + c] = m >= 0 ? xr[int64_t(m) * C + c] : st[int64_t(tail + m) * C + c];
    }
  }
}

// The new tail, the last K-1 inputs of each row: a launch after the conv,
// which read the old one. Ascending p reads index p + n > p of the old tail,
// so each thread updates its channel in place. grid: (ceil(C / kThreads), n_rows)
__global__ void conv_tail_kernel(const float* __restrict__ x, int64_t C, int K, const RecurrentRow* __restrict__ rows,
                                 float* __restrict__ conv_state) {
  pdl_entry();
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const RecurrentRow row = rows[blockIdx.y];
  if (c >= C || row.n_tokens <= 0) return;
  const int tail = K - 1, n = row.n_tokens;
  float* st = conv_state + int64_t(row.slot) * tail * C;
  const float* xr = x + int64_t(row.token_begin) * C;
  for (int p = 0; p < tail; ++p) {
    const int m = n - tail + p;
    st[int64_t(p) * C + c] = m >= 0 ? xr[int64_t(m) * C + c] : st[int64_t(tail + m) * C + c];
  }
}

// One warp per row. x, y: [M, D] (may alias: each lane reads its elements before writing them)
__global__ void l2norm_kernel(const float* x, float eps, int64_t M, int64_t D, float* y) {
  pdl_entry();
  const int64_t m = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (m >= M) return;
  const float* xr = x + m * D;
  float* yr = y + m * D;
  float ss = 0.0f;
  for (int64_t i = lane; i < D; i += 32) ss += xr[i] * xr[i];
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss + eps);
  for (int64_t i = lane; i < D; i += 32) yr[i] = xr[i] * inv;
}

// Reference: Qwen3NextRMSNormGated.forward. One warp per row; x, z, y: [M, D] (y may alias x)
__global__ void gated_rms_norm_kernel(const float* x, const float* __restrict__ z, const float* __restrict__ w,
                                      float eps, int64_t M, int64_t D, float* y) {
  pdl_entry();
  const int64_t m = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (m >= M) return;
  const float* xr = x + m * D;
  const float* zr = z + m * D;
  float* yr = y + m * D;
  float ss = 0.0f;
  for (int64_t i = lane; i < D; i += 32) ss += xr[i] * xr[i];
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / float(D) + eps);
  for (int64_t i = lane; i < D; i += 32) yr[i] = w[i] * (xr[i] * inv) * silu_f(zr[i]);
}

// a, b, g, beta: [n_tokens, n_head]; a_log, dt_bias: [n_head]
__global__ void delta_rule_gates_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                        const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                                        int64_t n, int64_t n_head, float* __restrict__ g, float* __restrict__ beta) {
  pdl_entry();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t h = i % n_head;
  g[i] = -expf(a_log[h]) * softplus_f(a[i] + dt_bias[h]);
  beta[i] = sigmoid_f(b[i]);
}

// x, y: [M, N] (may alias); gate: [M, N] or [M]
__global__ void sigmoid_mul_kernel(const float* x, const float* __restrict__ gate, bool per_row, int64_t M, int64_t N,
                                   float* y) {
  pdl_entry();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= M * N) return;
  y[i] = x[i] * sigmoid_f(gate[per_row ? i / N : i]);
}

// ---- The gated delta rule, recurrent form ------------------------------------

// Lanes that share one state column (each holds every kNs-th row of it).
constexpr int kNs = 4;
// State columns per block of the recurrent kernel (blockDim = kCols * kNs).
constexpr int kCols = 32;

// Reference: torch_recurrent_gated_delta_rule. Per token, for state column j
// (columns evolve independently):
//   S[:, j] *= exp(g);  kv = S[:, j]·k;  delta = beta (v[j] - kv);
//   S[:, j] += k delta;  o[j] = S[:, j]·(scale q)
// grid: (n_rows, n_head, ceil(dv / kCols)); block: kCols * kNs threads; lane
// (c, s) of a column group holds rows s, s + kNs, ... of column c in
// registers for the whole call (KPT of them: head_dim_k <= kNs * KPT).
template <int KPT>
__global__ void __launch_bounds__(kCols* kNs) gdr_recurrent_kernel(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ g, const float* __restrict__ beta, float scale, int n_head_k, int n_head, int dk,
    int dv, const RecurrentRow* __restrict__ rows, float* __restrict__ state, float* __restrict__ out,
    DeltaRuleFusion fuse) {
  __shared__ float sk[kNs * KPT], sq[kNs * KPT], inv_norm[2];
  // The rows (uploaded before the forward) and this layer's state (written
  // only by this kernel, in an earlier forward) are read before the PDL wait:
  // the state's DRAM latency overlaps the previous kernel (decode: about 2 us
  // of a 27B layer's 8). Nothing earlier in the stream can still be writing
  // them: the previous kernel waited for its own predecessor before letting
  // this one start.
  const RecurrentRow row = rows[blockIdx.x];
  const int h = blockIdx.y, hk = h / (n_head / n_head_k);
  const int col = blockIdx.z * kCols + threadIdx.x / kNs, s = threadIdx.x % kNs;
  const bool active = col < dv && row.n_tokens > 0;
  float* S = state + (int64_t(row.slot) * n_head + h) * dk * dv;  // [dk, dv]
  float reg[KPT];
#pragma unroll
  for (int i = 0; i < KPT; ++i) {
    const int a = s + kNs * i;
    reg[i] = active && a < dk ? S[int64_t(a) * dv + col] : 0.0f;
  }
  pdl_entry();
  if (row.n_tokens <= 0) return;  // uniform over the block
  for (int it = 0; it < row.n_tokens; ++it) {
    const int64_t t = int64_t(row.token_begin) + it;
    __syncthreads();  // the previous token's reads of sk, sq are done
    for (int a = threadIdx.x; a < dk; a += blockDim.x) {
      sk[a] = k[(t * n_head_k + hk) * dk + a];
      sq[a] = q[(t * n_head_k + hk) * dk + a] * (fuse.l2norm ? 1.0f : scale);
    }
    __syncthreads();
    if (fuse.l2norm) {  // as l2norm_kernel (same sums), then the scale
      if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        float kk = 0.0f, qq = 0.0f;
        for (int a = lane; a < dk; a += 32) {
          kk += sk[a] * sk[a];
          qq += sq[a] * sq[a];
        }
        kk = warp_sum(kk);
        qq = warp_sum(qq);
        if (lane == 0) {
          inv_norm[0] = 1.0f / sqrtf(kk + fuse.eps);
          inv_norm[1] = 1.0f / sqrtf(qq + fuse.eps);
        }
      }
      __syncthreads();
      for (int a = threadIdx.x; a < dk; a += blockDim.x) {
        sk[a] = sk[a] * inv_norm[0];
        sq[a] = sq[a] * inv_norm[1] * scale;
      }
      __syncthreads();
    }
    float decay, b;
    if (fuse.a != nullptr) {  // as delta_rule_gates_kernel
      const float gt = -expf(fuse.a_log[h]) * softplus_f(fuse.a[t * n_head + h] + fuse.dt_bias[h]);
      decay = expf(gt);
      b = sigmoid_f(fuse.b[t * n_head + h]);
    } else {
      decay = expf(g[t * n_head + h]);
      b = beta[t * n_head + h];
    }
    float kv = 0.0f;
#pragma unroll
    for (int i = 0; i < KPT; ++i) {
      const int a = s + kNs * i;
      if (a < dk) {
        reg[i] *= decay;
        kv += reg[i] * sk[a];
      }
    }
    kv += __shfl_xor_sync(0xffffffffu, kv, 1);
    kv += __shfl_xor_sync(0xffffffffu, kv, 2);
    const float vj = active ? v[(t * n_head + h) * dv + col] : 0.0f;
    const float delta = (vj - kv) * b;
    float o = 0.0f;
#pragma unroll
    for (int i = 0; i < KPT; ++i) {
      const int a = s + kNs * i;
      if (a < dk) {
        reg[i] += sk[a] * delta;
        o += reg[i] * sq[a];
      }
    }
    o += __shfl_xor_sync(0xffffffffu, o, 1);
    o += __shfl_xor_sync(0xffffffffu, o, 2);
    if (active && s == 0) out[(t * n_head + h) * dv + col] = o;
  }
#pragma unroll
  for (int i = 0; i < KPT; ++i) {
    const int a = s + kNs * i;
    if (active && a < dk) S[int64_t(a) * dv + col] = reg[i];
  }
}

static_assert(kNs == 4, "the shuffles above reduce over 4 lanes");

// ---- The gated delta rule, chunked form ---------------------------------------
// Two kernels, the UT transform as flash-linear-attention computes it.
// gdr_chunk_prep_kernel takes every chunk of every row and head at once and
// computes all that does not depend on the state: the cumulative log-decay
// gc, A[i][j] = beta_i (k_i·k_j) exp(gc_i - gc_j) (j < i), the solves
// (I + A) U = beta v and (I + A) W = beta exp(gc) k by forward substitution
// (a thread a column), QK[i][j] = (q_i·k_j) exp(gc_i - gc_j) (j <= i), and
// from them
//   Q' = exp(gc) q - QK W,  O0 = QK U,  Kd = k exp(gc_last - gc),
// so that, with v_new = U - W S, the chunk's outputs and next state are
//   out = exp(gc) (q S) + QK v_new = Q' S + O0
//   S  <- exp(gc_last) S + Kdᵀ v_new
// (the CPU op's form, regrouped). gdr_chunk_scan_kernel, one block per (row,
// value head, 32 state columns), walks a row's chunks in order and does only
// the two products with the state: [Q'; W] S (2C x dk by dk x 32), then
// Kdᵀ v_new (dk x C by C x 32), each thread a 4 x 4 tile of the output in
// registers, operands read as float4 from shared memory (two 16-byte loads
// for 16 FMAs). Why this split: the state recurrence is the only sequential
// part; a scan that also built A and QK and substituted, chunk after chunk,
// spent 416 of the 650 ms of a 2048-token prefill of the Qwen3.5-27B shape on
// the H200, and one with scalar shared-memory operands 204 of 462.
// Chunks are numbered over the rows in order (row r's first is base(r), the
// sum of ceil(n_tokens / C) before it); the call walks them in segments of
// at most kSegmentChunks (a prep launch, then a scan launch that carries the
// state in memory), so that scratch stays bounded: per (chunk, head) [Q'; W]ᵀ
// [dk4][2 Cp], Kd [Cp][dk4], U and O0 [Cp][dv] (Cp, dk4: C, dk rounded up to
// 4), ~123 KB a token a segment on the Qwen3.5 shapes.

constexpr int kMaxChunk = 64;
constexpr int kChunkThreads = 256;
constexpr int kColPitch = kChunkThreads + 1;  // the substitution's columns, read across by the write-out
constexpr int kScanColumns = 32;              // state columns a scan block owns: 8 groups of 4
constexpr int kSegmentChunks = 32;            // chunks a prep launch covers: 2048 tokens of 64

__host__ __device__ constexpr int round4(int x) { return (x + 3) & ~3; }

struct ChunkScratch {
  int64_t nb, H, Cp, dk4, dv;
  __host__ __device__ int64_t unit(int64_t b, int64_t h) const { return b * H + h; }
  // [Q'; W] transposed: [dk4][2 Cp], Q' in columns [0, Cp), W in [Cp, 2 Cp).
  __host__ __device__ int64_t at(int64_t b, int64_t h) const { return unit(b, h) * dk4 * 2 * Cp; }
  __host__ __device__ int64_t kd(int64_t b, int64_t h) const { return nb * H * dk4 * 2 * Cp + unit(b, h) * Cp * dk4; }
  __host__ __device__ int64_t el(int64_t b, int64_t h) const { return nb * H * dk4 * 3 * Cp + unit(b, h); }
  __host__ __device__ int64_t u(int64_t b, int64_t h) const {
    return nb * H * dk4 * 3 * Cp + round4(int(nb * H)) + unit(b, h) * Cp * dv;
  }
  __host__ __device__ int64_t o0(int64_t b, int64_t h) const { return u(nb, 0) + unit(b, h) * Cp * dv; }
  __host__ __device__ int64_t total() const { return o0(nb, 0); }
};

__device__ __forceinline__ int chunks_of(const RecurrentRow& r, int C) { return r.n_tokens > 0 ? (r.n_tokens + C - 1) / C : 0; }

// Shared memory of the prep kernel, in floats: K and scaled Q (rows padded
// to dk + 1 against bank conflicts), the columns of [U | W] being solved
// [C][kColPitch], A and QK [C][C], gc and beta.
struct PrepSmem {
  int dkp, C;
  __host__ __device__ int64_t k() const { return 0; }
  __host__ __device__ int64_t q() const { return k() + int64_t(C) * dkp; }
  __host__ __device__ int64_t col() const { return q() + int64_t(C) * dkp; }
  __host__ __device__ int64_t a() const { return col() + int64_t(C) * kColPitch; }
  __host__ __device__ int64_t qk() const { return a() + int64_t(C) * C; }
  __host__ __device__ int64_t gc() const { return qk() + int64_t(C) * C; }
  __host__ __device__ int64_t beta() const { return gc() + C; }
  __host__ __device__ int64_t total() const { return beta() + C; }
};

// sum_{j < end} m[j] col[j * kColPitch], in four interleaved partial sums
// (a chain of dependent FMAs a thread is what these loops wait on).
__device__ __forceinline__ float row_dot(const float* __restrict__ m, const float* col, int end) {
  float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
  int j = 0;
  for (; j + 4 <= end; j += 4) {
    s0 = fmaf(m[j], col[j * kColPitch], s0);
    s1 = fmaf(m[j + 1], col[(j + 1) * kColPitch], s1);
    s2 = fmaf(m[j + 2], col[(j + 2) * kColPitch], s2);
    s3 = fmaf(m[j + 3], col[(j + 3) * kColPitch], s3);
  }
  for (; j < end; ++j) s0 = fmaf(m[j], col[j * kColPitch], s0);
  return (s0 + s1) + (s2 + s3);
}

// grid: (chunks of the segment, n_head); block: kChunkThreads.
__global__ void __launch_bounds__(kChunkThreads) gdr_chunk_prep_kernel(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ g, const float* __restrict__ beta, float scale, int C, int n_head_k, int n_head, int dk,
    int dv, const RecurrentRow* __restrict__ rows, int n_rows, int b0, ChunkScratch sc, float* __restrict__ scratch) {
  pdl_entry();
  extern __shared__ float smem[];
  // This block's (row, chunk): chunk b0 + blockIdx.x of the rows in order.
  int b = b0 + int(blockIdx.x), r = 0;
  for (; r < n_rows; ++r) {
    const int nc = chunks_of(rows[r], C);
    if (b < nc) break;
    b -= nc;
  }
  if (r == n_rows) return;  // past the last chunk (uniform over the block)
  const RecurrentRow row = rows[r];
  const int c0 = b * C, n = min(C, row.n_tokens - c0), h = int(blockIdx.y), hk = h / (n_head / n_head_k);
  const int64_t t0 = int64_t(row.token_begin) + c0, cb = int64_t(blockIdx.x);  // its place in the segment
  const int Cp = int(sc.Cp), dk4 = int(sc.dk4);
  const PrepSmem L{dk + 1, C};
  const int dkp = L.dkp;
  float* sK = smem + L.k();      // [C, dkp]
  float* sQ = smem + L.q();      // [C, dkp], scaled
  float* sCol = smem + L.col();  // [C, kColPitch]
  float* sA = smem + L.a();      // [C, C]
  float* sQK = smem + L.qk();    // [C, C]
  float* sGc = smem + L.gc();
  float* sBeta = smem + L.beta();
  for (int idx = threadIdx.x; idx < n * dk; idx += blockDim.x) {
    const int i = idx / dk, a = idx % dk;
    const int64_t src = ((t0 + i) * n_head_k + hk) * dk + a;
    sK[i * dkp + a] = k[src];
    sQ[i * dkp + a] = q[src] * scale;
  }
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    sGc[i] = g[(t0 + i) * n_head + h];
    sBeta[i] = beta[(t0 + i) * n_head + h];
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // the cumulative log-decay, in token order
    float cum = 0.0f;
    for (int i = 0; i < n; ++i) {
      cum += sGc[i];
      sGc[i] = cum;
    }
  }
  __syncthreads();
  // A (strictly lower) and QK (lower, diagonal included): thread (ti, tj)
  // takes rows 4 ti.. and columns 4 tj.. of both, on or below the diagonal.
  static_assert(kChunkThreads == (kMaxChunk / 4) * (kMaxChunk / 4), "a thread a 4 x 4 tile of a 64 x 64 chunk");
  {
    const int i0 = 4 * (int(threadIdx.x) / (kMaxChunk / 4)), j0 = 4 * (int(threadIdx.x) % (kMaxChunk / 4));
    if (j0 <= i0 && i0 < n) {
      float kk[4][4] = {}, qk[4][4] = {};
      for (int a = 0; a < dk; ++a) {
        float ki[4], qi[4], kj[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int ii = min(i0 + e, n - 1), jj = min(j0 + e, n - 1);  // rows past n: any loaded row
          ki[e] = sK[ii * dkp + a], qi[e] = sQ[ii * dkp + a], kj[e] = sK[jj * dkp + a];
        }
#pragma unroll
        for (int r2 = 0; r2 < 4; ++r2)
#pragma unroll
          for (int c2 = 0; c2 < 4; ++c2) kk[r2][c2] = fmaf(ki[r2], kj[c2], kk[r2][c2]), qk[r2][c2] = fmaf(qi[r2], kj[c2], qk[r2][c2]);
      }
#pragma unroll
      for (int r2 = 0; r2 < 4; ++r2)
#pragma unroll
        for (int c2 = 0; c2 < 4; ++c2) {
          const int i = i0 + r2, j = j0 + c2;
          if (i >= n || j > i) continue;
          const float e = expf(sGc[i] - sGc[j]);
          sA[i * C + j] = j < i ? sBeta[i] * kk[r2][c2] * e : 0.0f;
          sQK[i * C + j] = qk[r2][c2] * e;
        }
    }
  }
  // Kd (pad columns zero: they meet the state's zero pad rows), the decay
  // over the chunk, and the pad rows of [Q'; W]ᵀ.
  float* kd_out = scratch + sc.kd(cb, h);
  for (int idx = threadIdx.x; idx < n * dk4; idx += blockDim.x) {
    const int i = idx / dk4, a = idx % dk4;
    kd_out[idx] = a < dk ? sK[i * dkp + a] * expf(sGc[n - 1] - sGc[i]) : 0.0f;
  }
  if (threadIdx.x == 0) scratch[sc.el(cb, h)] = expf(sGc[n - 1]);
  float* at_out = scratch + sc.at(cb, h);  // [dk4][2 Cp]
  for (int idx = threadIdx.x; idx < (dk4 - dk) * 2 * Cp; idx += blockDim.x) at_out[int64_t(dk) * 2 * Cp + idx] = 0.0f;
  float* u_out = scratch + sc.u(cb, h);
  float* o0_out = scratch + sc.o0(cb, h);
  // Columns of [U | W] (dv + dk of them) in passes of kChunkThreads.
  for (int x0 = 0; x0 < dv + dk; x0 += kChunkThreads) {
    __syncthreads();  // A and QK complete; the previous pass is done with the columns
    // Right-hand sides, beta v and beta exp(gc) k, loaded by all threads at once.
    for (int idx = threadIdx.x; idx < n * kChunkThreads; idx += blockDim.x) {
      const int i = idx / kChunkThreads, c = idx % kChunkThreads, x = x0 + c;
      if (x < dv)
        sCol[i * kColPitch + c] = sBeta[i] * v[((t0 + i) * n_head + h) * dv + x];
      else if (x < dv + dk)
        sCol[i * kColPitch + c] = sBeta[i] * expf(sGc[i]) * sK[i * dkp + (x - dv)];
    }
    __syncthreads();
    const int x = x0 + int(threadIdx.x);
    const bool mine = x < dv + dk;
    float* col = sCol + threadIdx.x;
    // Forward substitution, a thread a column: x_i = rhs_i - sum_{j < i} A_ij x_j.
    if (mine) {
      for (int i = 0; i < n; ++i) {
        const float xi = col[i * kColPitch] - row_dot(sA + i * C, col, i);
        col[i * kColPitch] = xi;
        if (x < dv) u_out[int64_t(i) * dv + x] = xi;
      }
    }
    // This pass's W columns (state rows a in [a_lo, a_hi)) to [Q'; W]ᵀ's
    // right half, row by row (the columns' pitch keeps the reads apart);
    // the rows a short chunk lacks, up to Cp, as zeros (the scan reads them).
    const int a_lo = max(x0, dv) - dv, a_hi = min(x0 + kChunkThreads, dv + dk) - dv;
    auto write_rows = [&](int half) {
      for (int idx = threadIdx.x; idx < (a_hi - a_lo) * Cp; idx += blockDim.x) {
        const int a = a_lo + idx / Cp, i = idx % Cp;
        at_out[int64_t(a) * 2 * Cp + half * Cp + i] = i < n ? sCol[i * kColPitch + (a + dv - x0)] : 0.0f;
      }
    };
    __syncthreads();
    write_rows(1);
    __syncthreads();
    // QK times the column, from the last row up, so that Q' can replace W
    // in place: row i reads rows j <= i only.
    if (mine) {
      for (int i = n - 1; i >= 0; --i) {
        const float acc = row_dot(sQK + i * C, col, i + 1);
        if (x < dv)
          o0_out[int64_t(i) * dv + x] = acc;
        else
          col[i * kColPitch] = expf(sGc[i]) * sQ[i * dkp + (x - dv)] - acc;
      }
    }
    __syncthreads();
    write_rows(0);
  }
}

// Shared memory of the scan kernel, in floats: the state tile [dk4][32],
// [Q'; W]ᵀ of a chunk [dk4][2 Cp] (whose room Kd [Cp][dk4] then takes), U,
// O0 and v_new [Cp][32].
struct ScanSmem {
  int dk4, Cp;
  __host__ __device__ int64_t s() const { return 0; }
  __host__ __device__ int64_t buf() const { return s() + int64_t(dk4) * kScanColumns; }
  __host__ __device__ int64_t u() const { return buf() + int64_t(dk4) * 2 * Cp; }
  __host__ __device__ int64_t o0() const { return u() + int64_t(Cp) * kScanColumns; }
  __host__ __device__ int64_t vn() const { return o0() + int64_t(Cp) * kScanColumns; }
  __host__ __device__ int64_t total() const { return vn() + int64_t(Cp) * kScanColumns; }
};

__device__ __forceinline__ void outer_acc(float (&acc)[4][4], const float4 a, const float4 b) {
  const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[r][c] = fmaf(av[r], bv[c], acc[r][c]);
}

// grid: (n_rows, n_head, ceil(dv / 32)); block: kChunkThreads, thread t owns
// columns 4 (t % 8) + [0, 4) and row group t / 8 of each product. Chunks
// b0..b1 - 1 of the segment.
__global__ void __launch_bounds__(kChunkThreads, 2) gdr_chunk_scan_kernel(
    int C, int n_head, int dk, int dv, const RecurrentRow* __restrict__ rows, int b0, int b1, ChunkScratch sc,
    const float* __restrict__ scratch, float* __restrict__ state, float* __restrict__ out) {
  pdl_entry();
  extern __shared__ float smem[];
  const int r = int(blockIdx.x);
  const RecurrentRow row = rows[r];
  int base = 0;  // the row's first chunk
  for (int rr = 0; rr < r; ++rr) base += chunks_of(rows[rr], C);
  // The row's chunks in this segment (uniform over the block).
  const int lo = max(0, b0 - base), hi = min(chunks_of(row, C), b1 - base);
  if (lo >= hi) return;
  const int h = blockIdx.y, col0 = blockIdx.z * kScanColumns, ncol = min(kScanColumns, dv - col0);
  const int Cp = int(sc.Cp), dk4 = int(sc.dk4);
  const ScanSmem L{dk4, Cp};
  float* sS = smem + L.s();      // [dk4][32]
  float* sBuf = smem + L.buf();  // [dk4][2 Cp], then [Cp][dk4]
  float* sU = smem + L.u();      // [Cp][32]
  float* sO0 = smem + L.o0();    // [Cp][32]
  float* sV = smem + L.vn();     // [Cp][32]
  const float4* sS4 = reinterpret_cast<const float4*>(sS);
  const float4* sBuf4 = reinterpret_cast<const float4*>(sBuf);
  const float4* sV4 = reinterpret_cast<const float4*>(sV);
  const int cg = threadIdx.x % 8, rg = threadIdx.x / 8;
  float* S = state + (int64_t(row.slot) * n_head + h) * dk * dv;  // [dk, dv]

  for (int idx = threadIdx.x; idx < dk4 * kScanColumns; idx += blockDim.x) {
    const int a = idx / kScanColumns, j = idx % kScanColumns;
    sS[idx] = a < dk && j < ncol ? S[int64_t(a) * dv + col0 + j] : 0.0f;
  }
  for (int cb = lo; cb < hi; ++cb) {
    const int c0 = cb * C, n = min(C, row.n_tokens - c0);
    const int64_t t0 = int64_t(row.token_begin) + c0, b = base + cb - b0;  // in the segment's scratch
    __syncthreads();  // the previous chunk is done with every buffer
    const float4* at_in = reinterpret_cast<const float4*>(scratch + sc.at(b, h));
    for (int idx = threadIdx.x; idx < dk4 * 2 * Cp / 4; idx += blockDim.x) reinterpret_cast<float4*>(sBuf)[idx] = at_in[idx];
    const float* u_in = scratch + sc.u(b, h);
    const float* o0_in = scratch + sc.o0(b, h);
    for (int idx = threadIdx.x; idx < Cp * kScanColumns; idx += blockDim.x) {
      const int i = idx / kScanColumns, j = idx % kScanColumns;
      const bool in = i < n && j < ncol;
      sU[idx] = in ? u_in[int64_t(i) * dv + col0 + j] : 0.0f;
      sO0[idx] = in ? o0_in[int64_t(i) * dv + col0 + j] : 0.0f;
    }
    __syncthreads();
    // [Q'; W] S: rows [0, Cp) are Q' S, the outputs less O0; rows [Cp, 2 Cp)
    // are W S, giving v_new = U - W S.
    if (rg < 2 * Cp / 4) {
      float acc[4][4] = {};
      for (int a = 0; a < dk4; ++a) outer_acc(acc, sBuf4[a * (2 * Cp / 4) + rg], sS4[a * (kScanColumns / 4) + cg]);
      const int row0 = 4 * rg;
      if (row0 < Cp) {
#pragma unroll
        for (int rr = 0; rr < 4; ++rr) {
          const int i = row0 + rr;
          if (i >= n) break;
          float* o = out + ((t0 + i) * n_head + h) * dv + col0;
#pragma unroll
          for (int c = 0; c < 4; ++c)
            if (4 * cg + c < ncol) o[4 * cg + c] = acc[rr][c] + sO0[i * kScanColumns + 4 * cg + c];
        }
      } else {
#pragma unroll
        for (int rr = 0; rr < 4; ++rr) {
          const int i = row0 - Cp + rr;
          const float* u = sU + i * kScanColumns + 4 * cg;
          reinterpret_cast<float4*>(sV)[i * (kScanColumns / 4) + cg] =
              make_float4(u[0] - acc[rr][0], u[1] - acc[rr][1], u[2] - acc[rr][2], u[3] - acc[rr][3]);
        }
      }
    }
    __syncthreads();
    const float4* kd_in = reinterpret_cast<const float4*>(scratch + sc.kd(b, h));
    for (int idx = threadIdx.x; idx < n * dk4 / 4; idx += blockDim.x) reinterpret_cast<float4*>(sBuf)[idx] = kd_in[idx];
    const float el = scratch[sc.el(b, h)];
    __syncthreads();
    // S <- el S + Kdᵀ v_new, a 4 x 4 tile of S at a time.
    for (int a0 = 4 * rg; a0 < dk4; a0 += 4 * (kChunkThreads / 8)) {
      float acc[4][4];
#pragma unroll
      for (int rr = 0; rr < 4; ++rr) {
        const float4 s = sS4[(a0 + rr) * (kScanColumns / 4) + cg];
        acc[rr][0] = s.x * el, acc[rr][1] = s.y * el, acc[rr][2] = s.z * el, acc[rr][3] = s.w * el;
      }
      for (int i = 0; i < n; ++i) outer_acc(acc, sBuf4[i * (dk4 / 4) + a0 / 4], sV4[i * (kScanColumns / 4) + cg]);
#pragma unroll
      for (int rr = 0; rr < 4; ++rr)
        reinterpret_cast<float4*>(sS)[(a0 + rr) * (kScanColumns / 4) + cg] =
            make_float4(acc[rr][0], acc[rr][1], acc[rr][2], acc[rr][3]);
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < dk4 * kScanColumns; idx += blockDim.x) {
    const int a = idx / kScanColumns, j = idx % kScanColumns;
    if (a < dk && j < ncol) S[int64_t(a) * dv + col0 + j] = sS[idx];
  }
}

}  // namespace

void slice_cols(const float* x, int64_t M, int64_t N, int64_t begin, int64_t n, float* y, Stream s) {
  if (M * n == 0) return;
  launch("slice_cols_kernel", slice_cols_kernel, dim3(blocks_for(M * n, kThreads)), dim3(kThreads), 0, s, x, M, N,
         begin, n, y);
}

void keep_recurrent_inputs(const float* proj, int64_t n_tokens, int64_t P, int64_t n_conv, int64_t n_z,
                           const int32_t* positions, const int32_t* token_row, const RecurrentRow* rows,
                           int64_t n_pos, int64_t width, float* inputs, Stream s) {
  if (n_tokens == 0) return;
  if (n_tokens > 0x7fffffff) fail("[keep_recurrent_inputs] ", n_tokens, " tokens exceed one launch");
  const dim3 grid(unsigned(n_tokens), blocks_for(width, kCopyColumns));
  launch("keep_recurrent_inputs_kernel", keep_recurrent_inputs_kernel, grid, dim3(kThreads), 0, s, proj, P, n_conv,
         n_z, positions, token_row, rows, int(n_pos), width, inputs);
}

void load_recurrent_inputs(const float* inputs, int64_t n_tokens, const int32_t* positions, const int32_t* token_row,
                           const RecurrentRow* rows, int64_t n_pos, int64_t width, float* out, Stream s) {
  if (n_tokens == 0) return;
  if (n_tokens > 0x7fffffff) fail("[load_recurrent_inputs] ", n_tokens, " tokens exceed one launch");
  const dim3 grid(unsigned(n_tokens), blocks_for(width, kCopyColumns));
  launch("load_recurrent_inputs_kernel", load_recurrent_inputs_kernel, grid, dim3(kThreads), 0, s, inputs, positions,
         token_row, rows, int(n_pos), width, out);
}

void causal_conv1d(const float* x, const float* w, int64_t C, int64_t K, const RecurrentRow* rows, int64_t n_rows,
                   int64_t max_row_tokens, float* conv_state, bool silu, float* out, Stream s) {
  if (n_rows == 0 || max_row_tokens <= 0 || C == 0) return;
  if (n_rows > 65535) fail("[causal_conv1d] ", n_rows, " rows exceed one launch");
  const dim3 grid(blocks_for(C, kThreads), unsigned(n_rows), blocks_for(max_row_tokens, kConvSegment));
  const bool tail_here = max_row_tokens <= kConvSegment;
  launch("causal_conv1d_kernel", causal_conv1d_kernel, grid, dim3(kThreads), 0, s, x, w, C, int(K), rows, conv_state,
         silu, tail_here, out);
  if (K > 1 && !tail_here) {
    conv_tail_kernel<<<dim3(blocks_for(C, kThreads), unsigned(n_rows)), kThreads, 0, s>>>(x, C, int(K), rows,
                                                                                          conv_state);
    AUGUR_LAUNCHED("causal_conv1d (tail)");
  }
}

void l2norm(const float* x, float eps, int64_t M, int64_t D, float* y, Stream s) {
  if (M == 0) return;
  launch("l2norm_kernel", l2norm_kernel, dim3(blocks_for(M, kThreads / 32)), dim3(kThreads), 0, s, x, eps, M, D, y);
}

void delta_rule_gates(const float* a, const float* b, const float* a_log, const float* dt_bias, int64_t n_tokens,
                      int64_t n_head, float* g, float* beta, Stream s) {
  const int64_t n = n_tokens * n_head;
  if (n == 0) return;
  launch("delta_rule_gates_kernel", delta_rule_gates_kernel, dim3(blocks_for(n, kThreads)), dim3(kThreads), 0, s, a, b,
         a_log, dt_bias, n, n_head, g, beta);
}

void gated_rms_norm(const float* x, const float* z, const float* w, float eps, int64_t M, int64_t D, float* y,
                    Stream s) {
  if (M == 0) return;
  launch("gated_rms_norm_kernel", gated_rms_norm_kernel, dim3(blocks_for(M, kThreads / 32)), dim3(kThreads), 0, s, x, z,
         w, eps, M, D, y);
}

void sigmoid_mul(const float* x, const float* gate, bool per_row, int64_t M, int64_t N, float* y, Stream s) {
  if (M * N == 0) return;
  launch("sigmoid_mul_kernel", sigmoid_mul_kernel, dim3(blocks_for(M * N, kThreads)), dim3(kThreads), 0, s, x, gate,
         per_row, M, N, y);
}

namespace {

void check_delta_rule_launch(const char* op, const DeltaRuleDims& d, int64_t n_rows) {
  if (d.head_dim_k > 256 || d.head_dim_k < 1) fail("[", op, "] head_dim_k ", d.head_dim_k, " outside [1, 256]");
  if (n_rows > 0x7fffffff || d.n_head > 65535)
    fail("[", op, "] ", n_rows, " rows x ", d.n_head, " heads exceed one launch");
}

}  // namespace

void gated_delta_rule_recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta,
                                float scale, const DeltaRuleDims& d, const RecurrentRow* rows, int64_t n_rows,
                                float* state, float* out, Stream s, const DeltaRuleFusion* fuse) {
  check_delta_rule_launch("gated_delta_rule_recurrent", d, n_rows);
  if (n_rows == 0 || d.head_dim_v == 0) return;
  const dim3 grid(unsigned(n_rows), unsigned(d.n_head), blocks_for(d.head_dim_v, kCols));
  const int hk = int(d.n_head_k), h = int(d.n_head), dk = int(d.head_dim_k), dv = int(d.head_dim_v);
  const DeltaRuleFusion f = fuse != nullptr ? *fuse : DeltaRuleFusion{};
  auto launch = [&](auto kernel) {
    augur::cuda::launch("gdr_recurrent_kernel", kernel, grid, dim3(kCols * kNs), 0, s, q, k, v, g, beta, scale, hk, h,
                        dk, dv, rows, state, out, f);
  };
  if (dk <= kNs * 4)
    launch(gdr_recurrent_kernel<4>);
  else if (dk <= kNs * 8)
    launch(gdr_recurrent_kernel<8>);
  else if (dk <= kNs * 16)
    launch(gdr_recurrent_kernel<16>);
  else if (dk <= kNs * 32)
    launch(gdr_recurrent_kernel<32>);
  else
    launch(gdr_recurrent_kernel<64>);
}

void gated_delta_rule_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta,
                              float scale, int64_t chunk_size, const DeltaRuleDims& d, const RecurrentRow* rows,
                              int64_t n_rows, int64_t n_tokens, float* state, float* out, Stream s) {
  check_delta_rule_launch("gated_delta_rule_chunked", d, n_rows);
  if (chunk_size < 1 || chunk_size > kMaxChunk)
    fail("[gated_delta_rule_chunked] chunk_size ", chunk_size, " outside [1, ", kMaxChunk, "] on CUDA");
  if (n_rows == 0 || n_tokens <= 0 || d.head_dim_v == 0) return;
  const int dk = int(d.head_dim_k), dv = int(d.head_dim_v), H = int(d.n_head);
  // Chunks shorter than asked where shared memory would not fit (head_dim_k
  // > 256 is refused above): the result differs by rounding only.
  int C = int(chunk_size);
  auto smem_bytes = [&](int c) {
    return std::max(PrepSmem{dk + 1, c}.total(), ScanSmem{round4(dk), round4(c)}.total()) * int64_t(sizeof(float));
  };
  while (C > 8 && smem_bytes(C) > 227 * 1024) C /= 2;
  const int64_t n_chunks = ceil_div(n_tokens, int64_t(C)) + n_rows;  // a bound: rows may end mid-chunk
  if (n_chunks > 0x7fffffff) fail("[gated_delta_rule_chunked] ", n_tokens, " tokens exceed one launch");
  const ChunkScratch sc{std::min<int64_t>(n_chunks, kSegmentChunks), H, round4(C), round4(dk), dv};
  float* scratch = static_cast<float*>(context().delta_rule_scratch(size_t(sc.total()) * sizeof(float), s));
  auto grant = [](auto kernel, size_t smem, size_t& granted) {  // raised once as needed
    if (smem > 48 * 1024 && smem > granted) {
      AUGUR_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      granted = smem;
    }
  };
  const size_t prep_smem = size_t(PrepSmem{dk + 1, C}.total()) * sizeof(float);
  const size_t scan_smem = size_t(ScanSmem{round4(dk), round4(C)}.total()) * sizeof(float);
  static size_t prep_granted = 0, scan_granted = 0;
  grant(gdr_chunk_prep_kernel, prep_smem, prep_granted);
  grant(gdr_chunk_scan_kernel, scan_smem, scan_granted);
  for (int64_t b0 = 0; b0 < n_chunks; b0 += sc.nb) {
    const int64_t b1 = std::min(n_chunks, b0 + sc.nb);
    launch("gdr_chunk_prep_kernel", gdr_chunk_prep_kernel, dim3(unsigned(b1 - b0), unsigned(H)), dim3(kChunkThreads),
           prep_smem, s, q, k, v, g, beta, scale, C, int(d.n_head_k), H, dk, dv, rows, int(n_rows), int(b0), sc,
           scratch);
    launch("gdr_chunk_scan_kernel", gdr_chunk_scan_kernel,
           dim3(unsigned(n_rows), unsigned(H), blocks_for(dv, kScanColumns)), dim3(kChunkThreads), scan_smem, s, C, H,
           dk, dv, rows, int(b0), int(b1), sc, static_cast<const float*>(scratch), state, out);
  }
}

}  // namespace augur::cuda
