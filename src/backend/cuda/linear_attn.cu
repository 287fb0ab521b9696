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
// x: [n_tokens, C] at row stride ldx.
__global__ void conv_tail_kernel(const float* __restrict__ x, int64_t ldx, int64_t C, int K,
                                 const RecurrentRow* __restrict__ rows, float* __restrict__ conv_state) {
  pdl_entry();
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const RecurrentRow row = rows[blockIdx.y];
  if (c >= C || row.n_tokens <= 0) return;
  const int tail = K - 1, n = row.n_tokens;
  float* st = conv_state + int64_t(row.slot) * tail * C;
  const float* xr = x + int64_t(row.token_begin) * ldx;
  for (int p = 0; p < tail; ++p) {
    const int m = n - tail + p;
    st[int64_t(p) * C + c] = m >= 0 ? xr[int64_t(m) * ldx + c] : st[int64_t(tail + m) * C + c];
  }
}

// Widest q/k head the fused input kernel normalises.
constexpr int kMaxNormHead = 256;

// Reference: causal_conv1d_kernel (SiLU) over proj's columns [0, C), then
// l2norm_kernel on each q and k head and delta_rule_gates_kernel, in the
// same arithmetic (the same bits). grid: (2 n_head_k + n_head + 1, n_rows,
// ceil(max_row_tokens / kConvSegment)); block: one head's channels, a thread
// each (blockDim a multiple of 32 >= both head dims). Block x < 2 n_head_k +
// n_head is head x of [q heads | k heads | v heads], a contiguous range of
// the conv's channels; the last one makes the gates of the segment's tokens.
// tail_here: as causal_conv1d_kernel.
__global__ void delta_rule_inputs_kernel(const float* __restrict__ proj, int64_t P, int64_t ba_col,
                                         const float* __restrict__ w, int K, DeltaRuleDims d,
                                         const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                                         float qk_eps, const RecurrentRow* __restrict__ rows,
                                         float* __restrict__ conv_state, bool tail_here, float* __restrict__ q,
                                         float* __restrict__ k, float* __restrict__ v, float* __restrict__ g,
                                         float* __restrict__ beta) {
  __shared__ float red[2][kMaxNormHead];  // a token's normalised head, double-buffered
  const int hb = blockIdx.x, Hk = int(d.n_head_k), H = int(d.n_head), dk = int(d.head_dim_k);
  const int dv = int(d.head_dim_v);
  const RecurrentRow row = rows[blockIdx.y];
  const int i0 = int(blockIdx.z) * kConvSegment;
  const int i1 = min(row.n_tokens, i0 + kConvSegment);
  if (hb == 2 * Hk + H) {  // the gates
    pdl_entry();
    for (int idx = threadIdx.x; idx < (i1 - i0) * H; idx += blockDim.x) {
      const int64_t t = int64_t(row.token_begin) + i0 + idx / H;
      const int h = idx % H;
      const float* ba = proj + t * P + ba_col;  // [b | a]
      g[t * H + h] = -expf(a_log[h]) * softplus_f(ba[H + h] + dt_bias[h]);
      beta[t * H + h] = sigmoid_f(ba[h]);
    }
    return;
  }
  const int64_t C = 2 * int64_t(Hk) * dk + int64_t(H) * dv;
  const bool is_v = hb >= 2 * Hk, norm = !is_v;
  const int width = is_v ? dv : dk;
  const int64_t c0 = is_v ? 2 * int64_t(Hk) * dk + int64_t(hb - 2 * Hk) * dv : int64_t(hb) * dk;
  float* dst = is_v ? v + int64_t(hb - 2 * Hk) * dv : (hb < Hk ? q + int64_t(hb) * dk : k + int64_t(hb - Hk) * dk);
  const int64_t ld = is_v ? int64_t(H) * dv : int64_t(Hk) * dk;
  const int i = threadIdx.x, lane = i & 31;
  const int64_t c = c0 + i;
  const int tail = K - 1;
  float* st = conv_state + int64_t(row.slot) * tail * C;  // [K-1, C]
  const float* wc = w + c * K;
  const bool live = i < width;
  if (live && i0 < row.n_tokens) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(wc));
    for (int p = 0; p < tail; ++p) asm volatile("prefetch.global.L2 [%0];" ::"l"(st + int64_t(p) * C + c));
  }
  pdl_entry();
  if (i0 >= row.n_tokens) return;  // the whole block
  const float* xr = proj + int64_t(row.token_begin) * P;  // [n, C] at stride P
  for (int t = i0; t < i1; ++t) {
    float y = 0.0f;
    if (live) {
      float acc = 0.0f;
      for (int j = 0; j < K; ++j) {
        const int m = t - tail + j;  // < 0: the kept tail
        const float in = m >= 0 ? xr[int64_t(m) * P + c] : st[int64_t(tail + m) * C + c];
        acc += wc[j] * in;
      }
      y = silu_f(acc);
    }
    if (norm) {  // l2norm_kernel's sum: lane l adds channels l, l + 32, ... in turn, then the warp
      float* buf = red[t & 1];  // a warp still reading token t - 1 reads the other buffer
      if (live) buf[i] = y;
      __syncthreads();
      float ss = 0.0f;
      for (int e = lane; e < width; e += 32) ss += buf[e] * buf[e];
      ss = warp_sum(ss);
      const float inv = 1.0f / sqrtf(ss + qk_eps);
      y = y * inv;
    }
    if (live) dst[(int64_t(row.token_begin) + t) * ld + i] = y;
  }
  if (tail_here && live) {  // as conv_tail_kernel
    const int n = row.n_tokens;
    for (int p = 0; p < tail; ++p) {
      const int m = n - tail + p;
      st[int64_t(p) * C + c] = m >= 0 ? xr[int64_t(m) * P + c] : st[int64_t(tail + m) * C + c];
    }
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

// Reference: Qwen3NextRMSNormGated.forward. One warp per row; x, y: [M, D]
// (y may alias x); z: rows of z_per x-rows of D each, at stride ldz.
__global__ void gated_rms_norm_kernel(const float* x, const float* __restrict__ z, int64_t z_per, int64_t ldz,
                                      const float* __restrict__ w, float eps, int64_t M, int64_t D, float* y) {
  pdl_entry();
  const int64_t m = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (m >= M) return;
  const float* xr = x + m * D;
  const float* zr = z + (m / z_per) * ldz + (m % z_per) * D;
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
// The UT transform as flash-linear-attention writes it, in two kernels whose
// products run on tensor cores. For a chunk of n <= C tokens with state S
// (dk x dv) on entry, cumulative log-decay gc (gl = gc of its last token),
//   A[i][j] = beta_i (k_i·k_j) exp(gc_i - gc_j) (j < i),  T' = (I + A)^-1 diag(beta),
//   P[i][j] = scale (q_i·k_j) exp(gc_i - gc_j) (j <= i),
// the chunk's new values, outputs and next state are
//   x     = v - exp(gc) (K S)
//   v_new = T' x
//   out   = scale exp(gc) (Q S) + (P T') x
//   S    <- exp(gl) S + Kᵀ (exp(gl - gc) v_new)
// (the CPU op's form, regrouped). gdr_chunk_prep_kernel, a block per (chunk,
// value head) for every chunk of a segment at once, computes what does not
// depend on the state: T', P T' and the decays. gdr_chunk_scan_kernel, a
// block per (row, value head, 32 state columns), walks a row's chunks in
// order with its state tile in shared memory and does every product with
// the state, reading q, k and v themselves; the next chunk's operands are
// copied in (cp.async) while this one's products run. Why this split: the
// state-free work a chunk leaves behind is two C x C matrices (32 KB at
// C = 64), where [Q'; W], Kd, U and O0 (the other grouping, S multiplied
// in one product) were ~160 KB a chunk and head, read back by every column
// block of the scan from beyond L2.
// Every product is mma.m16n8k8 on tf32 operands split in two (x = hi + lo,
// both tf32; hi·hi + hi·lo + lo·hi), which errs by ~2^-21 of a product,
// f32-like, where a single tf32 product errs by ~2^-11; sums are f32. T is
// solved a column per 4 threads (forward substitution on the identity, each
// thread a quarter of each sum); everything else is a product.
// Chunks are numbered over the rows in order (row r's first is base(r), the
// sum of ceil(n_tokens / C) before it); the call walks them in segments of
// at most kSegmentChunks (a prep launch, then a scan launch that carries the
// state in memory), so that scratch stays bounded and in L2: per (chunk,
// head) 2 Cp² + 3 Cp + 4 floats (Cp: C rounded up to 16), 33 KB at C = 64.

constexpr int kMaxChunk = 64;
constexpr int kChunkThreads = 256;
constexpr int kChunkWarps = kChunkThreads / 32;
constexpr int kScanColumns = 32;    // state columns a scan block owns: 4 tiles of 8
constexpr int kSegmentChunks = 32;  // chunks a prep launch covers: 2048 tokens of 64

__host__ __device__ constexpr int round8(int x) { return (x + 7) & ~7; }
__host__ __device__ constexpr int round16(int x) { return (x + 15) & ~15; }
// Shared-memory pitches (floats) that put a warp's fragment loads on 32
// distinct banks. Lane (g, t) = (lane / 4, lane % 4) reads element (g, t) of
// an operand read along its rows (A, or Bᵀ stored by rows): pitch 4 mod 8;
// element (t, g) of one read down its columns: pitch 8 mod 16. Both keep
// rows 16-byte aligned for cp.async.
__host__ __device__ constexpr int pitch_rows(int n) { return round8(n) + 4; }
__host__ __device__ constexpr int pitch_cols(int n) { return (round8(n) / 8) % 2 ? round8(n) : round8(n) + 8; }

// Scratch per (chunk of the segment, value head): T' [Cp][Cp], P T'
// [Cp][Cp], then the decays exp(gc), scale exp(gc), exp(gl - gc) [Cp] each
// (zero past the chunk's tokens) and exp(gl), padded to 4.
struct ChunkScratch {
  int64_t nb, H, Cp;
  __host__ __device__ int64_t unit() const { return 2 * Cp * Cp + 3 * Cp + 4; }
  __host__ __device__ int64_t t(int64_t b, int64_t h) const { return (b * H + h) * unit(); }
  __host__ __device__ int64_t pt(int64_t b, int64_t h) const { return t(b, h) + Cp * Cp; }
  __host__ __device__ int64_t decays(int64_t b, int64_t h) const { return t(b, h) + 2 * Cp * Cp; }
  __host__ __device__ int64_t total() const { return nb * H * unit(); }
};

__device__ __forceinline__ int chunks_of(const RecurrentRow& r, int C) { return r.n_tokens > 0 ? (r.n_tokens + C - 1) / C : 0; }

// ---- 3 x tf32 warp products ----
struct Tf32Pair {
  uint32_t hi, lo;
};
__device__ __forceinline__ Tf32Pair split_tf32(float x) {
  uint32_t hi, lo;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(hi) : "f"(x));
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(lo) : "f"(x - __uint_as_float(hi)));
  return {hi, lo};
}
// Not volatile: the compiler may interleave independent products, and an
// accumulator's products must be issued apart (each waits on the last).
__device__ __forceinline__ void mma_tf32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
struct FragA {  // 16 x 8: (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)
  Tf32Pair v[4];
};
struct FragB {  // 8 x 8: (t, g), (t + 4, g)
  Tf32Pair v[2];
};
__device__ __forceinline__ int lane_g() { return (threadIdx.x & 31) >> 2; }
__device__ __forceinline__ int lane_t() { return threadIdx.x & 3; }
// at(m, k): the A operand's element; the tile at (m0, k0).
template <class At>
__device__ __forceinline__ FragA frag_a(const At& at, int m0, int k0) {
  const int g = lane_g(), t = lane_t();
  return {{split_tf32(at(m0 + g, k0 + t)), split_tf32(at(m0 + g + 8, k0 + t)), split_tf32(at(m0 + g, k0 + t + 4)),
           split_tf32(at(m0 + g + 8, k0 + t + 4))}};
}
// at(k, n): the B operand's element; the tile at (k0, n0).
template <class At>
__device__ __forceinline__ FragB frag_b(const At& at, int k0, int n0) {
  const int g = lane_g(), t = lane_t();
  return {{split_tf32(at(k0 + t, n0 + g)), split_tf32(at(k0 + t + 4, n0 + g))}};
}
// One of the three tf32 products of d += A B (pass 0: lo·hi, 1: hi·lo,
// 2: hi·hi, the small ones first). Callers issue a pass over all their
// tiles before the next, so that consecutive products are independent.
__device__ __forceinline__ void mma_pass(float (&d)[4], const FragA& a, const FragB& b, int pass) {
  if (pass == 0)
    mma_tf32(d, a.v[0].lo, a.v[1].lo, a.v[2].lo, a.v[3].lo, b.v[0].hi, b.v[1].hi);
  else if (pass == 1)
    mma_tf32(d, a.v[0].hi, a.v[1].hi, a.v[2].hi, a.v[3].hi, b.v[0].lo, b.v[1].lo);
  else
    mma_tf32(d, a.v[0].hi, a.v[1].hi, a.v[2].hi, a.v[3].hi, b.v[0].hi, b.v[1].hi);
}
// Accumulator element r of a 16 x 8 tile sits at (acc_row(r), acc_col(r)).
__device__ __forceinline__ int acc_row(int r) { return lane_g() + 8 * (r >> 1); }
__device__ __forceinline__ int acc_col(int r) { return 2 * lane_t() + (r & 1); }
// acc[nt] += A[m0 .. m0 + 16, 0 .. K) B[0 .. K, n0 + 8 nt .. + 8) for
// nt < NT; K a multiple of 8.
template <int NT, class AAt, class BAt>
__device__ __forceinline__ void warp_mma(float (&acc)[NT][4], const AAt& a, const BAt& b, int m0, int n0, int K) {
  for (int k0 = 0; k0 < K; k0 += 8) {
    FragB fb[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) fb[nt] = frag_b(b, k0, n0 + 8 * nt);
    const FragA fa = frag_a(a, m0, k0);
#pragma unroll
    for (int pass = 0; pass < 3; ++pass)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma_pass(acc[nt], fa, fb[nt], pass);
  }
}
// The same for two A operands against one B: acc1 += A1 B, acc2 += A2 B,
// B's fragments read once.
template <int NT, class A1At, class A2At, class BAt>
__device__ __forceinline__ void warp_mma_pair(float (&acc1)[NT][4], float (&acc2)[NT][4], const A1At& a1,
                                              const A2At& a2, const BAt& b, int m0, int n0, int K) {
  for (int k0 = 0; k0 < K; k0 += 8) {
    FragB fb[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) fb[nt] = frag_b(b, k0, n0 + 8 * nt);
    const FragA f1 = frag_a(a1, m0, k0), f2 = frag_a(a2, m0, k0);
#pragma unroll
    for (int pass = 0; pass < 3; ++pass)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        mma_pass(acc1[nt], f1, fb[nt], pass);
        mma_pass(acc2[nt], f2, fb[nt], pass);
      }
  }
}

// For idx in [0, n), over a block's threads: store(idx, load(idx)), with
// kLoadBatch loads in flight a thread. One element at a time, each store
// would wait out the load's latency before the thread's next load could
// issue (a warp issues in order), at one block an SM.
constexpr int kLoadBatch = 8;
template <class Load, class Store>
__device__ __forceinline__ void batched_fill(int n, const Load& load, const Store& store) {
  for (int base = int(threadIdx.x); base < n; base += kLoadBatch * kChunkThreads) {
    decltype(load(0)) val[kLoadBatch];
#pragma unroll
    for (int u = 0; u < kLoadBatch; ++u)
      if (base + u * kChunkThreads < n) val[u] = load(base + u * kChunkThreads);
#pragma unroll
    for (int u = 0; u < kLoadBatch; ++u)
      if (base + u * kChunkThreads < n) store(base + u * kChunkThreads, val[u]);
  }
}

// dst[i][a] (pitch dpitch) = src[i * stride + a] for i < n_valid and
// a < cols, zero elsewhere in rows x cols_pad, over a block's threads: by
// cp.async (the caller commits and waits) where vec (cols, stride and src
// multiples of 16 bytes, dst and dpitch too), else by plain loads.
__device__ __forceinline__ void load_tile(float* dst, int dpitch, const float* src, int64_t stride, int rows,
                                          int n_valid, int cols, int cols_pad, bool vec) {
  if (vec) {
    const int per_row = cols_pad / 4;
    for (int idx = int(threadIdx.x); idx < rows * per_row; idx += kChunkThreads) {
      const int i = idx / per_row, a = 4 * (idx % per_row);
      const bool in = i < n_valid && a < cols;
      cp_async16(dst + i * dpitch + a, in ? src + i * stride + a : src, in);
    }
  } else {
    for (int idx = int(threadIdx.x); idx < rows * cols_pad; idx += kChunkThreads) {
      const int i = idx / cols_pad, a = idx % cols_pad;
      dst[i * dpitch + a] = i < n_valid && a < cols ? src[i * stride + a] : 0.0f;
    }
  }
}
__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Shared memory of the prep kernel, in floats: K and scaled Q [Cp][pk], A
// (then T') and P [Cp][pc], gc and beta.
struct PrepSmem {
  int Cp, dkr;
  __host__ __device__ PrepSmem(int C, int dk) : Cp(round16(C)), dkr(round16(dk)) {}
  __host__ __device__ int pk() const { return pitch_rows(dkr); }
  __host__ __device__ int pc() const { return pitch_rows(Cp); }
  __host__ __device__ int64_t k() const { return 0; }
  __host__ __device__ int64_t q() const { return k() + int64_t(Cp) * pk(); }
  __host__ __device__ int64_t a() const { return q() + int64_t(Cp) * pk(); }
  __host__ __device__ int64_t p() const { return a() + int64_t(Cp) * pc(); }
  __host__ __device__ int64_t gc() const { return p() + int64_t(Cp) * pc(); }
  __host__ __device__ int64_t beta() const { return gc() + Cp; }
  __host__ __device__ int64_t total() const { return beta() + Cp; }
};

// grid: (chunks of the segment, n_head); block: kChunkThreads.
__global__ void __launch_bounds__(kChunkThreads) gdr_chunk_prep_kernel(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ g,
    const float* __restrict__ beta, float scale, int C, int n_head_k, int n_head, int dk,
    const RecurrentRow* __restrict__ rows, int n_rows, int b0, ChunkScratch sc, float* __restrict__ scratch) {
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
  const PrepSmem L(C, dk);
  const int Cp = L.Cp, dkr = L.dkr, pk = L.pk(), pc = L.pc();
  float* sK = smem + L.k();  // [Cp][pk]
  float* sQ = smem + L.q();  // [Cp][pk], scaled
  float* sA = smem + L.a();  // [Cp][pc]: A, then T'
  float* sP = smem + L.p();  // [Cp][pc]
  float* sGc = smem + L.gc();
  float* sBeta = smem + L.beta();
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  batched_fill(  // rows past n, columns past dk: zero
      Cp * dkr,
      [&](int idx) {
        const int i = idx / dkr, a = idx % dkr;
        const int64_t src = ((t0 + i) * n_head_k + hk) * dk + a;
        return i < n && a < dk ? make_float2(k[src], q[src]) : make_float2(0.0f, 0.0f);
      },
      [&](int idx, float2 kq) {
        const int i = idx / dkr, a = idx % dkr;
        sK[i * pk + a] = kq.x;
        sQ[i * pk + a] = kq.y * scale;
      });
  for (int i = tid; i < Cp; i += kChunkThreads) {
    sGc[i] = i < n ? g[(t0 + i) * n_head + h] : 0.0f;
    sBeta[i] = i < n ? beta[(t0 + i) * n_head + h] : 0.0f;
  }
  __syncthreads();
  if (warp == 0) {  // the cumulative log-decay: two tokens a lane, an inclusive scan over the lanes
    static_assert(kMaxChunk == 64, "two tokens a lane");
    const float x0 = 2 * lane < Cp ? sGc[2 * lane] : 0.0f, x1 = 2 * lane + 1 < Cp ? sGc[2 * lane + 1] : 0.0f;
    float s = x0 + x1;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float y = __shfl_up_sync(0xffffffffu, s, o);
      if (lane >= o) s += y;
    }
    float before = __shfl_up_sync(0xffffffffu, s, 1);
    if (lane == 0) before = 0.0f;
    if (2 * lane < n) sGc[2 * lane] = before + x0;
    if (2 * lane + 1 < n) sGc[2 * lane + 1] = before + x0 + x1;
    __syncwarp();
    float* dec = scratch + sc.decays(cb, h);  // exp(gc), scale exp(gc), exp(gl - gc), exp(gl)
    const float gl = sGc[n - 1];
    for (int i = lane; i < Cp; i += 32) {
      const float e = i < n ? expf(sGc[i]) : 0.0f;
      dec[i] = e;
      dec[Cp + i] = scale * e;
      dec[2 * Cp + i] = i < n ? expf(gl - sGc[i]) : 0.0f;
    }
    if (lane < 4) dec[3 * Cp + lane] = lane == 0 ? expf(gl) : 0.0f;
  }
  __syncthreads();
  // A and P: warp w the 16 x 32 block at rows 16 (w % 4), columns 32 (w / 4)
  // of both (K Kᵀ and Q Kᵀ share their B fragments).
  {
    static_assert(kChunkWarps == 8 && kMaxChunk == 64, "8 warps cover a 64 x 64 chunk in 16 x 32 blocks");
    const int m0 = 16 * (warp % 4), n0 = 32 * (warp / 4);
    if (m0 < Cp && n0 < Cp) {
      float kk[4][4] = {}, qk[4][4] = {};
      const auto kat = [&](int i, int a) { return sK[i * pk + a]; };
      const auto qat = [&](int i, int a) { return sQ[i * pk + a]; };
      const auto ktat = [&](int a, int j) { return sK[j * pk + a]; };  // Kᵀ; rows past Cp read sQ's, not kept
      warp_mma_pair(kk, qk, kat, qat, ktat, m0, n0, dkr);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = m0 + acc_row(e), j = n0 + 8 * nt + acc_col(e);
          if (j >= Cp) continue;
          const bool lower = i < n && j <= i;
          const float d = lower ? expf(sGc[i] - sGc[j]) : 0.0f;
          sA[i * pc + j] = j < i ? sBeta[i] * kk[nt][e] * d : 0.0f;
          sP[i * pc + j] = qk[nt][e] * d;
        }
    }
  }
  __syncthreads();
  // T = (I + A)^-1 by forward substitution on the identity: column c by
  // threads 4c .. 4c + 3, thread s holding T[j][c] for j = s mod 4 and
  // summing those terms of each row's sum. Stored as T' = T diag(beta).
  {
    static_assert(kChunkThreads == 4 * kMaxChunk, "4 threads a column of T");
    const int c = tid / 4, s = tid % 4;
    float x[kMaxChunk / 4] = {};
#pragma unroll
    for (int i = 0; i < kMaxChunk; ++i) {
      if (i >= Cp) break;
      float part = 0.0f;
#pragma unroll
      for (int u = 0; u <= i / 4; ++u)
        if (4 * u + s < i) part = fmaf(sA[i * pc + 4 * u + s], x[u], part);
      part += __shfl_xor_sync(0xffffffffu, part, 1);
      part += __shfl_xor_sync(0xffffffffu, part, 2);
      if (s == i % 4) x[i / 4] = (i == c ? 1.0f : 0.0f) - part;
    }
    __syncthreads();  // every column is done reading A
    if (c < Cp) {
      const float bc = sBeta[c];  // zero past n: so are T''s columns there (and its rows, T's being the identity's)
#pragma unroll
      for (int u = 0; u < kMaxChunk / 4; ++u)
        if (4 * u + s < Cp) sA[(4 * u + s) * pc + c] = x[u] * bc;
    }
  }
  __syncthreads();
  // T' out, and P T': warp w the 16 x 32 block as above.
  float* t_out = scratch + sc.t(cb, h);    // [Cp][Cp]
  float* pt_out = scratch + sc.pt(cb, h);  // [Cp][Cp]
  for (int idx = tid; idx < Cp * Cp; idx += kChunkThreads) t_out[idx] = sA[(idx / Cp) * pc + idx % Cp];
  {
    const int m0 = 16 * (warp % 4), n0 = 32 * (warp / 4);
    if (m0 < Cp && n0 < Cp) {
      float acc[4][4] = {};
      const auto pat = [&](int i, int j) { return sP[i * pc + j]; };
      const auto tat = [&](int j, int x) { return sA[j * pc + x]; };  // columns past Cp read the next row's: not kept
      warp_mma(acc, pat, tat, m0, n0, Cp);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = m0 + acc_row(e), j = n0 + 8 * nt + acc_col(e);
          if (j < Cp) pt_out[i * Cp + j] = acc[nt][e];
        }
    }
  }
}

// Shared memory of the scan kernel, in floats: the state tile [dkr][ps];
// K of two chunks [2][Cp][pk] (this one's and the next's, in flight); Q
// [Cp][pk], T' and P T' [Cp][pt] of this chunk; v's 32 columns of two
// chunks [2][Cp][ps]; x and exp(gl - gc) v_new [Cp][ps]; the decays of two
// chunks [2][nd].
struct ScanSmem {
  int Cp, dkr;
  __host__ __device__ ScanSmem(int C, int dk) : Cp(round16(C)), dkr(round16(dk)) {}
  __host__ __device__ int ps() const { return pitch_cols(kScanColumns); }
  __host__ __device__ int pk() const { return pitch_rows(dkr); }
  __host__ __device__ int pt() const { return pitch_rows(Cp); }
  __host__ __device__ int nd() const { return 3 * Cp + 4; }
  __host__ __device__ int64_t s() const { return 0; }
  __host__ __device__ int64_t k() const { return s() + int64_t(dkr) * ps(); }
  __host__ __device__ int64_t q() const { return k() + 2 * int64_t(Cp) * pk(); }
  __host__ __device__ int64_t t() const { return q() + int64_t(Cp) * pk(); }
  __host__ __device__ int64_t pt_() const { return t() + int64_t(Cp) * pt(); }
  __host__ __device__ int64_t v() const { return pt_() + int64_t(Cp) * pt(); }
  __host__ __device__ int64_t x() const { return v() + 2 * int64_t(Cp) * ps(); }
  __host__ __device__ int64_t vn() const { return x() + int64_t(Cp) * ps(); }
  __host__ __device__ int64_t dec() const { return vn() + int64_t(Cp) * ps(); }
  __host__ __device__ int64_t total() const { return dec() + 2 * int64_t(nd()); }
};

// grid: (n_rows, n_head, ceil(dv / 32)); block: kChunkThreads. Chunks
// b0..b1 - 1 of the segment.
__global__ void __launch_bounds__(kChunkThreads) gdr_chunk_scan_kernel(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v, int C, int n_head_k,
    int n_head, int dk, int dv, const RecurrentRow* __restrict__ rows, int b0, int b1, ChunkScratch sc,
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
  const int h = blockIdx.y, hk = h / (n_head / n_head_k), col0 = blockIdx.z * kScanColumns,
            ncol = min(kScanColumns, dv - col0);
  const ScanSmem L(C, dk);
  const int Cp = L.Cp, dkr = L.dkr, ps = L.ps(), pk = L.pk(), pt = L.pt(), nd = L.nd();
  float* sS = smem + L.s();     // [dkr][ps]
  float* sK = smem + L.k();     // [2][Cp][pk]
  float* sQ = smem + L.q();     // [Cp][pk]
  float* sT = smem + L.t();     // [Cp][pt]
  float* sPT = smem + L.pt_();  // [Cp][pt]
  float* sV = smem + L.v();     // [2][Cp][ps]
  float* sX = smem + L.x();     // [Cp][ps]
  float* sVn = smem + L.vn();   // [Cp][ps]
  float* sDec = smem + L.dec();  // [2][nd]
  const int tid = int(threadIdx.x), warp = tid / 32;
  const bool vec_qk = dk % 4 == 0 && aligned16(q) && aligned16(k), vec_v = dv % 4 == 0 && aligned16(v);
  float* S = state + (int64_t(row.slot) * n_head + h) * dk * dv;  // [dk, dv]
  batched_fill(
      dkr * kScanColumns,
      [&](int idx) {
        const int a = idx / kScanColumns, j = idx % kScanColumns;
        return a < dk && j < ncol ? S[int64_t(a) * dv + col0 + j] : 0.0f;
      },
      [&](int idx, float val) { sS[(idx / kScanColumns) * ps + idx % kScanColumns] = val; });
  // Copies in flight, as cp.async groups in the order issued: K, v and the
  // decays of chunk c + 1 (other buffers) as chunk c starts; Q of c + 1 once
  // c's products with Q are done, T' and P T' of c + 1 once c's with them
  // are. A group past the row's last chunk is empty.
  const auto tokens = [&](int c) { return min(C, row.n_tokens - c * C); };
  const auto first = [&](int c) { return int64_t(row.token_begin) + int64_t(c) * C; };
  const auto load_kv = [&](int c) {
    if (c < hi) {
      const int n = tokens(c);
      const int64_t t0 = first(c);
      load_tile(sK + (c & 1) * Cp * pk, pk, k + (t0 * n_head_k + hk) * dk, int64_t(n_head_k) * dk, Cp, n, dk, dkr,
                vec_qk);
      load_tile(sV + (c & 1) * Cp * ps, ps, v + (t0 * n_head + h) * dv + col0, int64_t(n_head) * dv, Cp, n, ncol,
                kScanColumns, vec_v);
      load_tile(sDec + (c & 1) * nd, nd, scratch + sc.decays(base + c - b0, h), 0, 1, 1, nd, nd, true);
    }
    cp_async_commit();
  };
  const auto load_q = [&](int c) {
    if (c < hi)
      load_tile(sQ, pk, q + (first(c) * n_head_k + hk) * dk, int64_t(n_head_k) * dk, Cp, tokens(c), dk, dkr, vec_qk);
    cp_async_commit();
  };
  const auto load_t = [&](int c) {
    if (c < hi) {
      load_tile(sT, pt, scratch + sc.t(base + c - b0, h), Cp, Cp, Cp, Cp, Cp, true);
      load_tile(sPT, pt, scratch + sc.pt(base + c - b0, h), Cp, Cp, Cp, Cp, Cp, true);
    }
    cp_async_commit();
  };
  // Warp w's tile of the chunk's products with its tokens: rows 16 (w % 4),
  // columns 16 (w / 4), both 16 long.
  const int m0 = 16 * (warp % 4), n0 = 16 * (warp / 4);
  const bool has_tile = m0 < Cp;
  const auto sat = [&](int a, int j) { return sS[a * ps + j]; };
  const auto qat = [&](int i, int a) { return sQ[i * pk + a]; };
  const auto tat = [&](int i, int j) { return sT[i * pt + j]; };
  const auto ptat = [&](int i, int j) { return sPT[i * pt + j]; };
  const auto xat = [&](int i, int j) { return sX[i * ps + j]; };
  const auto vnat = [&](int i, int j) { return sVn[i * ps + j]; };
  load_kv(lo);
  load_q(lo);
  load_t(lo);
  for (int c = lo; c < hi; ++c) {
    const int n = tokens(c);
    const int64_t t0 = first(c);
    const float* kb = sK + (c & 1) * Cp * pk;
    const float* vb = sV + (c & 1) * Cp * ps;
    const float* db = sDec + (c & 1) * nd;  // exp(gc), scale exp(gc), exp(gl - gc), exp(gl)
    const auto kat = [&](int i, int a) { return kb[i * pk + a]; };
    const auto ktat = [&](int a, int i) { return kb[i * pk + a]; };  // Kᵀ
    load_kv(c + 1);  // the previous chunk is done with those buffers
    cp_async_wait<2>();
    __syncthreads();  // K, v, the decays and Q of chunk c are in
    // K S and Q S. x = v - exp(gc) (K S) to shared memory (zero past n and
    // ncol: K, v and the decay are); scale exp(gc) (Q S) kept, the outputs
    // less (P T') x.
    float o[2][4] = {};
    if (has_tile) {
      float ks[2][4] = {};
      warp_mma_pair(ks, o, kat, qat, sat, m0, n0, dkr);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = m0 + acc_row(e), j = n0 + 8 * nt + acc_col(e);
          sX[i * ps + j] = vb[i * ps + j] - db[i] * ks[nt][e];
          o[nt][e] *= db[Cp + i];
        }
    }
    __syncthreads();  // x complete; Q free
    load_q(c + 1);
    cp_async_wait<2>();
    __syncthreads();  // T' and P T' of chunk c are in
    // v_new = T' x, kept as exp(gl - gc) v_new for the state; out += (P T') x.
    if (has_tile) {
      float vn[2][4] = {};
      warp_mma_pair(vn, o, tat, ptat, xat, m0, n0, Cp);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = m0 + acc_row(e), j = n0 + 8 * nt + acc_col(e);
          sVn[i * ps + j] = db[2 * Cp + i] * vn[nt][e];
          if (i < n && j < ncol) out[((t0 + i) * n_head + h) * dv + col0 + j] = o[nt][e];
        }
    }
    __syncthreads();  // v_new complete; T' and P T' free
    load_t(c + 1);
    // S <- exp(gl) S + Kᵀ (exp(gl - gc) v_new): warp w the state rows
    // 16 w, 16 (w + 8), ..., each read and written by its own lanes only.
    const float el = db[3 * Cp];
    for (int mt = warp; mt < dkr / 16; mt += kChunkWarps) {
      float acc[4][4];
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[nt][e] = el * sS[(16 * mt + acc_row(e)) * ps + 8 * nt + acc_col(e)];
      warp_mma(acc, ktat, vnat, 16 * mt, 0, Cp);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) sS[(16 * mt + acc_row(e)) * ps + 8 * nt + acc_col(e)] = acc[nt][e];
    }
    __syncthreads();  // the next chunk reads the state and refills this chunk's buffers
  }
  cp_async_wait<0>();
  for (int idx = tid; idx < dkr * kScanColumns; idx += kChunkThreads) {
    const int a = idx / kScanColumns, j = idx % kScanColumns;
    if (a < dk && j < ncol) S[int64_t(a) * dv + col0 + j] = sS[a * ps + j];
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
    conv_tail_kernel<<<dim3(blocks_for(C, kThreads), unsigned(n_rows)), kThreads, 0, s>>>(x, C, C, int(K), rows,
                                                                                          conv_state);
    AUGUR_LAUNCHED("causal_conv1d (tail)");
  }
}

void delta_rule_inputs(const float* proj, int64_t P, int64_t ba_col, const float* conv_w, int64_t K,
                       const DeltaRuleDims& d, const float* a_log, const float* dt_bias, float qk_eps,
                       const RecurrentRow* rows, int64_t n_rows, int64_t max_row_tokens, float* conv_state, float* q,
                       float* k, float* v, float* g, float* beta, Stream s) {
  if (n_rows == 0 || max_row_tokens <= 0) return;
  if (n_rows > 65535) fail("[delta_rule_inputs] ", n_rows, " rows exceed one launch");
  if (d.head_dim_k > kMaxNormHead || d.head_dim_v > 1024)
    fail("[delta_rule_inputs] head dims ", d.head_dim_k, " / ", d.head_dim_v, " beyond ", kMaxNormHead, " / 1024");
  const int64_t C = 2 * d.n_head_k * d.head_dim_k + d.n_head * d.head_dim_v;
  const unsigned threads = unsigned((std::max(d.head_dim_k, d.head_dim_v) + 31) / 32 * 32);
  const dim3 grid(unsigned(2 * d.n_head_k + d.n_head + 1), unsigned(n_rows),
                  blocks_for(max_row_tokens, kConvSegment));
  const bool tail_here = max_row_tokens <= kConvSegment;
  launch("delta_rule_inputs_kernel", delta_rule_inputs_kernel, grid, dim3(threads), 0, s, proj, P, ba_col, conv_w,
         int(K), d, a_log, dt_bias, qk_eps, rows, conv_state, tail_here, q, k, v, g, beta);
  if (K > 1 && !tail_here) {
    conv_tail_kernel<<<dim3(blocks_for(C, kThreads), unsigned(n_rows)), kThreads, 0, s>>>(proj, P, C, int(K), rows,
                                                                                          conv_state);
    AUGUR_LAUNCHED("delta_rule_inputs (tail)");
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

void gated_rms_norm(const float* x, const float* z, int64_t z_width, int64_t ldz, const float* w, float eps,
                    int64_t M, int64_t D, float* y, Stream s) {
  if (M == 0) return;
  launch("gated_rms_norm_kernel", gated_rms_norm_kernel, dim3(blocks_for(M, kThreads / 32)), dim3(kThreads), 0, s, x, z,
         z_width / D, ldz, w, eps, M, D, y);
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
  // Chunks shorter than asked where shared memory would not fit: the result
  // differs by rounding only.
  int C = int(chunk_size);
  auto smem_bytes = [&](int c) {
    return std::max(PrepSmem(c, dk).total(), ScanSmem(c, dk).total()) * int64_t(sizeof(float));
  };
  while (C > 16 && smem_bytes(C) > 227 * 1024) C /= 2;
  if (smem_bytes(C) > 227 * 1024)
    fail("[gated_delta_rule_chunked] head dims ", dk, " x ", dv, " need more shared memory than a block has");
  const int64_t n_chunks = ceil_div(n_tokens, int64_t(C)) + n_rows;  // a bound: rows may end mid-chunk
  if (n_chunks > 0x7fffffff) fail("[gated_delta_rule_chunked] ", n_tokens, " tokens exceed one launch");
  const ChunkScratch sc{std::min<int64_t>(n_chunks, kSegmentChunks), H, round16(C)};
  float* scratch = static_cast<float*>(context().delta_rule_scratch(size_t(sc.total()) * sizeof(float), s));
  auto grant = [](auto kernel, size_t smem, size_t& granted) {  // raised once as needed
    if (smem > 48 * 1024 && smem > granted) {
      AUGUR_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
      granted = smem;
    }
  };
  const size_t prep_smem = size_t(PrepSmem(C, dk).total()) * sizeof(float);
  const size_t scan_smem = size_t(ScanSmem(C, dk).total()) * sizeof(float);
  static size_t prep_granted = 0, scan_granted = 0;
  grant(gdr_chunk_prep_kernel, prep_smem, prep_granted);
  grant(gdr_chunk_scan_kernel, scan_smem, scan_granted);
  for (int64_t b0 = 0; b0 < n_chunks; b0 += sc.nb) {
    const int64_t b1 = std::min(n_chunks, b0 + sc.nb);
    launch("gdr_chunk_prep_kernel", gdr_chunk_prep_kernel, dim3(unsigned(b1 - b0), unsigned(H)), dim3(kChunkThreads),
           prep_smem, s, q, k, g, beta, scale, C, int(d.n_head_k), H, dk, rows, int(n_rows), int(b0), sc, scratch);
    launch("gdr_chunk_scan_kernel", gdr_chunk_scan_kernel,
           dim3(unsigned(n_rows), unsigned(H), blocks_for(dv, kScanColumns)), dim3(kChunkThreads), scan_smem, s, q, k,
           v, C, int(d.n_head_k), H, dk, dv, rows, int(b0), int(b1), sc, static_cast<const float*>(scratch), state,
           out);
  }
}

}  // namespace augur::cuda
