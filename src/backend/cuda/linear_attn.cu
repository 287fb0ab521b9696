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
// Two kernels, the UT transform as flash-linear-attention computes it:
// gdr_chunk_prep_kernel takes every chunk of every row and head at once and
// computes what does not depend on the state: the cumulative log-decay gc,
// A[i][j] = beta_i (k_i·k_j) exp(gc_i - gc_j) (j < i), the solves
// (I + A) U = beta v and (I + A) W = beta exp(gc) k by forward substitution
// (a thread a column), and QK[i][j] = (q_i·k_j) exp(gc_i - gc_j) (j <= i);
// U, W, QK and gc go to scratch. gdr_chunk_scan_kernel, one block per (row,
// value head, bv state columns), walks a row's chunks in order:
//   v_new = U - W S
//   out_i = exp(gc_i) (q_i S) + sum_{j <= i} QK_ij v_new_j
//   S <- exp(gc_last) S + sum_i k_i exp(gc_last - gc_i) v_new_iᵀ
// (the CPU op's form). Why two: with both halves in one sequential loop, each
// of a head's column blocks computed A and QK again and one thread a column
// substituted, chunk after chunk: 416 of the 650 ms of a 2048-token prefill
// of the Qwen3.5-27B shape on the H200.
// Chunks are numbered over the rows in order (row r's first is base(r), the
// sum of ceil(n_tokens / C) before it); the call walks them in segments of
// at most kSegmentChunks (a prep launch, then a scan launch that carries the
// state in memory), so that scratch stays bounded: per (chunk b - b0 of the
// segment, head h), W [C, dk], U [C, dv], QK [C, C], gc [C], ~61 KB a token
// a segment on the Qwen3.5 shapes.

constexpr int kMaxChunk = 64;
constexpr int kChunkThreads = 256;
constexpr int kScanColumns = 32;     // state columns a scan block owns
constexpr int kSegmentChunks = 64;   // chunks a prep launch covers: 4096 tokens of 64

struct ChunkScratch {
  int64_t nb, H, C, dk, dv;
  __host__ __device__ int64_t w(int64_t b, int64_t h) const { return ((b * H + h) * C) * dk; }
  __host__ __device__ int64_t u(int64_t b, int64_t h) const { return nb * H * C * dk + ((b * H + h) * C) * dv; }
  __host__ __device__ int64_t qk(int64_t b, int64_t h) const {
    return nb * H * C * (dk + dv) + ((b * H + h) * C) * C;
  }
  __host__ __device__ int64_t gc(int64_t b, int64_t h) const { return nb * H * C * (dk + dv + C) + (b * H + h) * C; }
  __host__ __device__ int64_t total() const { return nb * H * C * (dk + dv + C + 1); }
};

__device__ __forceinline__ int chunks_of(const RecurrentRow& r, int C) { return r.n_tokens > 0 ? (r.n_tokens + C - 1) / C : 0; }

// Shared memory of the prep kernel, in floats: K (rows padded to dk + 1
// against bank conflicts), then scaled Q, whose room the substitution's
// columns [C][kChunkThreads] reuse, A [C][C], gc and beta.
struct PrepSmem {
  int dkp, C;
  __host__ __device__ int64_t k() const { return 0; }
  __host__ __device__ int64_t q() const { return k() + int64_t(C) * dkp; }
  __host__ __device__ int64_t a() const {
    return q() + (int64_t(C) * dkp > int64_t(C) * kChunkThreads ? int64_t(C) * dkp : int64_t(C) * kChunkThreads);
  }
  __host__ __device__ int64_t gc() const { return a() + int64_t(C) * C; }
  __host__ __device__ int64_t beta() const { return gc() + C; }
  __host__ __device__ int64_t total() const { return beta() + C; }
};

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
  const PrepSmem L{dk + 1, C};
  const int dkp = L.dkp;
  float* sK = smem + L.k();  // [C, dkp]
  float* sQ = smem + L.q();  // [C, dkp], scaled; then the substitution's columns [C, kChunkThreads]
  float* sA = smem + L.a();  // [C, C]
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
  float* gc_out = scratch + sc.gc(cb, h);
  for (int i = threadIdx.x; i < n; i += blockDim.x) gc_out[i] = sGc[i];
  // A (strictly lower) into shared memory, QK (lower, diagonal included) to scratch.
  float* qk_out = scratch + sc.qk(cb, h);
  for (int idx = threadIdx.x; idx < n * n; idx += blockDim.x) {
    const int i = idx / n, j = idx % n;
    if (j > i) continue;
    float kk = 0.0f, qk = 0.0f;
    for (int a = 0; a < dk; ++a) {
      const float kj = sK[j * dkp + a];
      kk += sK[i * dkp + a] * kj;
      qk += sQ[i * dkp + a] * kj;
    }
    const float e = expf(sGc[i] - sGc[j]);
    sA[i * C + j] = j < i ? sBeta[i] * kk * e : 0.0f;
    qk_out[i * C + j] = qk * e;
  }
  __syncthreads();  // A complete; Q no longer read, its room becomes the columns
  // Forward substitution, a thread a column of [U | W] (dv + dk columns, in
  // passes of kChunkThreads): x_i = rhs_i - sum_{j < i} A_ij x_j.
  float* sCol = sQ;  // [C, kChunkThreads]
  float* u_out = scratch + sc.u(cb, h);
  float* w_out = scratch + sc.w(cb, h);
  for (int x0 = 0; x0 < dv + dk; x0 += kChunkThreads) {
    const int x = x0 + int(threadIdx.x);
    if (x < dv + dk) {
      float* col = sCol + threadIdx.x;
      for (int i = 0; i < n; ++i) {
        float rhs;
        if (x < dv)
          rhs = sBeta[i] * v[((t0 + i) * n_head + h) * dv + x];
        else
          rhs = sBeta[i] * expf(sGc[i]) * sK[i * dkp + (x - dv)];
        for (int j = 0; j < i; ++j) rhs -= sA[i * C + j] * col[j * kChunkThreads];
        col[i * kChunkThreads] = rhs;
        if (x < dv)
          u_out[int64_t(i) * dv + x] = rhs;
        else
          w_out[int64_t(i) * dk + (x - dv)] = rhs;
      }
    }
  }
}

// Shared memory of the scan kernel, in floats: the state tile [dk, bv], Q
// (scaled), K and W of a chunk [C, dk + 1] each, QK [C, C], v_new [C, bv], gc
// and the decay to the chunk's end.
struct ScanSmem {
  int dkp, C, bv;
  __host__ __device__ int64_t s() const { return 0; }
  __host__ __device__ int64_t q() const { return s() + int64_t(dkp - 1) * bv; }
  __host__ __device__ int64_t k() const { return q() + int64_t(C) * dkp; }
  __host__ __device__ int64_t w() const { return k() + int64_t(C) * dkp; }
  __host__ __device__ int64_t qk() const { return w() + int64_t(C) * dkp; }
  __host__ __device__ int64_t vn() const { return qk() + int64_t(C) * C; }
  __host__ __device__ int64_t gc() const { return vn() + int64_t(C) * bv; }
  __host__ __device__ int64_t dec() const { return gc() + C; }
  __host__ __device__ int64_t total() const { return dec() + C; }
};

// grid: (n_rows, n_head, ceil(dv / bv)); block: kChunkThreads. Chunks b0..b1 - 1.
__global__ void __launch_bounds__(kChunkThreads) gdr_chunk_scan_kernel(
    const float* __restrict__ q, const float* __restrict__ k, float scale, int C, int n_head_k, int n_head, int dk,
    int dv, int bv, const RecurrentRow* __restrict__ rows, int b0, int b1, ChunkScratch sc,
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
  const int h = blockIdx.y, hk = h / (n_head / n_head_k), col0 = blockIdx.z * bv;
  const int ncol = min(bv, dv - col0);
  const ScanSmem L{dk + 1, C, bv};
  const int dkp = L.dkp;
  float* sS = smem + L.s();    // [dk, bv]
  float* sQ = smem + L.q();    // [C, dkp], scaled
  float* sK = smem + L.k();    // [C, dkp]
  float* sW = smem + L.w();    // [C, dkp]
  float* sQK = smem + L.qk();  // [C, C]
  float* sV = smem + L.vn();   // [C, bv]: U, then v_new
  float* sGc = smem + L.gc();
  float* sDec = smem + L.dec();
  float* S = state + (int64_t(row.slot) * n_head + h) * dk * dv;  // [dk, dv]

  for (int idx = threadIdx.x; idx < dk * bv; idx += blockDim.x) {
    const int a = idx / bv, j = idx % bv;
    sS[idx] = j < ncol ? S[int64_t(a) * dv + col0 + j] : 0.0f;
  }
  for (int cb = lo; cb < hi; ++cb) {
    const int c0 = cb * C, n = min(C, row.n_tokens - c0);
    const int64_t t0 = int64_t(row.token_begin) + c0, b = base + cb - b0;  // in the segment's scratch
    __syncthreads();  // the previous chunk is done with every buffer
    const float* w_in = scratch + sc.w(b, h);
    for (int idx = threadIdx.x; idx < n * dk; idx += blockDim.x) {
      const int i = idx / dk, a = idx % dk;
      const int64_t src = ((t0 + i) * n_head_k + hk) * dk + a;
      sK[i * dkp + a] = k[src];
      sQ[i * dkp + a] = q[src] * scale;
      sW[i * dkp + a] = w_in[int64_t(i) * dk + a];
    }
    const float* qk_in = scratch + sc.qk(b, h);
    for (int idx = threadIdx.x; idx < n * C; idx += blockDim.x) {
      const int i = idx / C, j = idx % C;
      if (j <= i) sQK[idx] = qk_in[idx];
    }
    const float* u_in = scratch + sc.u(b, h);
    for (int idx = threadIdx.x; idx < n * bv; idx += blockDim.x) {
      const int i = idx / bv, j = idx % bv;
      sV[idx] = j < ncol ? u_in[int64_t(i) * dv + col0 + j] : 0.0f;
    }
    const float* gc_in = scratch + sc.gc(b, h);
    for (int i = threadIdx.x; i < n; i += blockDim.x) sGc[i] = gc_in[i];
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) sDec[i] = expf(sGc[n - 1] - sGc[i]);
    // v_new = U - W S
    for (int idx = threadIdx.x; idx < n * bv; idx += blockDim.x) {
      const int i = idx / bv, j = idx % bv;
      float ws = 0.0f;
      for (int a = 0; a < dk; ++a) ws += sW[i * dkp + a] * sS[a * bv + j];
      sV[idx] -= ws;
    }
    __syncthreads();
    // Outputs, from the state before this chunk.
    for (int idx = threadIdx.x; idx < n * bv; idx += blockDim.x) {
      const int i = idx / bv, j = idx % bv;
      if (j >= ncol) continue;
      float qs = 0.0f;
      for (int a = 0; a < dk; ++a) qs += sQ[i * dkp + a] * sS[a * bv + j];
      float o = qs * expf(sGc[i]);
      for (int jj = 0; jj <= i; ++jj) o += sQK[i * C + jj] * sV[jj * bv + j];
      out[((t0 + i) * n_head + h) * dv + col0 + j] = o;
    }
    __syncthreads();
    // State update.
    const float el = expf(sGc[n - 1]);
    for (int idx = threadIdx.x; idx < dk * bv; idx += blockDim.x) {
      const int a = idx / bv, j = idx % bv;
      float s = sS[idx] * el;
      for (int i = 0; i < n; ++i) s += sK[i * dkp + a] * sDec[i] * sV[i * bv + j];
      sS[idx] = s;
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < dk * bv; idx += blockDim.x) {
    const int a = idx / bv, j = idx % bv;
    if (j < ncol) S[int64_t(a) * dv + col0 + j] = sS[idx];
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
  const int dk = int(d.head_dim_k), dv = int(d.head_dim_v), H = int(d.n_head), bv = kScanColumns;
  // Chunks shorter than asked where the scan's shared memory would not fit
  // (head_dim_k > 128): the result differs by rounding only.
  int C = int(chunk_size);
  while (C > 8 && ScanSmem{dk + 1, C, bv}.total() * int64_t(sizeof(float)) > 227 * 1024) C /= 2;
  const int64_t n_chunks = ceil_div(n_tokens, int64_t(C)) + n_rows;  // a bound: rows may end mid-chunk
  if (n_chunks > 0x7fffffff) fail("[gated_delta_rule_chunked] ", n_tokens, " tokens exceed one launch");
  const ChunkScratch sc{std::min<int64_t>(n_chunks, kSegmentChunks), H, C, dk, dv};
  float* scratch = static_cast<float*>(context().delta_rule_scratch(size_t(sc.total()) * sizeof(float), s));
  auto grant = [](auto kernel, size_t smem, size_t& granted) {  // raised once as needed
    if (smem > 48 * 1024 && smem > granted) {
      AUGUR_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      granted = smem;
    }
  };
  const size_t prep_smem = size_t(PrepSmem{dk + 1, C}.total()) * sizeof(float);
  const size_t scan_smem = size_t(ScanSmem{dk + 1, C, bv}.total()) * sizeof(float);
  static size_t prep_granted = 0, scan_granted = 0;
  grant(gdr_chunk_prep_kernel, prep_smem, prep_granted);
  grant(gdr_chunk_scan_kernel, scan_smem, scan_granted);
  for (int64_t b0 = 0; b0 < n_chunks; b0 += sc.nb) {
    const int64_t b1 = std::min(n_chunks, b0 + sc.nb);
    launch("gdr_chunk_prep_kernel", gdr_chunk_prep_kernel, dim3(unsigned(b1 - b0), unsigned(H)), dim3(kChunkThreads),
           prep_smem, s, q, k, v, g, beta, scale, C, int(d.n_head_k), H, dk, dv, rows, int(n_rows), int(b0), sc,
           scratch);
    launch("gdr_chunk_scan_kernel", gdr_chunk_scan_kernel, dim3(unsigned(n_rows), unsigned(H), blocks_for(dv, bv)),
           dim3(kChunkThreads), scan_smem, s, q, k, scale, C, int(d.n_head_k), H, dk, dv, bv, rows, int(b0), int(b1),
           sc, static_cast<const float*>(scratch), state, out);
  }
}

}  // namespace augur::cuda
