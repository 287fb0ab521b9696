// Linear attention (Gated DeltaNet) kernels and the element-wise ops around
// them: slice_cols, causal_conv1d, l2norm, delta_rule_gates, the gated delta
// rule in its recurrent and chunked forms, gated_rms_norm, sigmoid_mul. Each
// reproduces its CPU op in backend/cpu/linear_attn_cpu.cpp, in f32.
#include <cuda_bf16.h>

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
// Tokens the fused input kernel takes a pass: their loads are in flight
// together, and a q/k head's norms need one barrier for all of them (a token
// a pass waited out a load and a barrier per token: 43% of the copy rate).
constexpr int kInputsPass = 8;

// Reference: causal_conv1d_kernel (SiLU) over proj's columns [0, C), then
// l2norm_kernel on each q and k head and delta_rule_gates_kernel, in the
// same arithmetic (the same bits). grid: (2 n_head_k + n_head + 1, n_rows,
// ceil(max_row_tokens / kConvSegment)); block: one head's channels, a thread
// each (blockDim a multiple of 32 >= both head dims). Block x < 2 n_head_k +
// n_head is head x of [q heads | k heads | v heads], a contiguous range of
// the conv's channels; the last one makes the gates of the segment's tokens.
// A thread holds its channel's inputs of the pass (cur) and of the one
// before (prev) in registers: taps up to kInputsPass back come from there,
// older ones (K > kInputsPass + 1) from memory.
// tail_here: as causal_conv1d_kernel.
__global__ void delta_rule_inputs_kernel(const float* __restrict__ proj, int64_t P, int64_t ba_col,
                                         const float* __restrict__ w, int K, DeltaRuleDims d,
                                         const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                                         float qk_eps, const RecurrentRow* __restrict__ rows,
                                         float* __restrict__ conv_state, bool tail_here, float* __restrict__ q,
                                         float* __restrict__ k, float* __restrict__ v, float* __restrict__ g,
                                         float* __restrict__ beta) {
  constexpr int U = kInputsPass;
  __shared__ float red[2][U][kMaxNormHead];  // a pass's normalised head, double-buffered
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
  // This channel's input at token m of the row (m < 0: the kept tail).
  auto input = [&](int m) { return m >= 0 ? xr[int64_t(m) * P + c] : st[int64_t(tail + m) * C + c]; };
  // Taps by distance back r = K-1-j: wr[r] = w[j] for r <= U.
  float wr[U + 1];
#pragma unroll
  for (int r = 0; r <= U; ++r) wr[r] = live && r < K ? wc[K - 1 - r] : 0.f;
  float prev[U], cur[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int m = i0 - U + u;
    prev[u] = live && m >= -tail ? input(m) : 0.f;
  }
  for (int t0 = i0, pass = 0; t0 < i1; t0 += U, ++pass) {
#pragma unroll
    for (int u = 0; u < U; ++u) cur[u] = live && t0 + u < i1 ? input(t0 + u) : 0.f;
    float y[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      // acc over j = 0 .. K-1 in order, i.e. r = K-1 down to 0.
      float acc = 0.0f;
      for (int r = K - 1; r > U; --r) acc += wc[K - 1 - r] * input(t0 + u - r);
#pragma unroll
      for (int r = U; r >= 0; --r)
        if (r < K) acc += wr[r] * (u - r >= 0 ? cur[u - r >= 0 ? u - r : 0] : prev[u - r < 0 ? U + u - r : 0]);
      y[u] = silu_f(acc);
    }
    if (norm) {  // l2norm_kernel's sum: lane l adds channels l, l + 32, ... in turn, then the warp
      float (*buf)[kMaxNormHead] = red[pass & 1];  // a warp still reading the last pass reads the other buffer
      if (live)
#pragma unroll
        for (int u = 0; u < U; ++u) buf[u][i] = y[u];
      __syncthreads();
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float ss = 0.0f;
        for (int e = lane; e < width; e += 32) ss += buf[u][e] * buf[u][e];
        ss = warp_sum(ss);
        const float inv = 1.0f / sqrtf(ss + qk_eps);
        y[u] = y[u] * inv;
      }
    }
    if (live)
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (t0 + u < i1) dst[(int64_t(row.token_begin) + t0 + u) * ld + i] = y[u];
#pragma unroll
    for (int u = 0; u < U; ++u) prev[u] = cur[u];
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
// key head) for every chunk of a segment at once, computes what does not
// depend on the state: T', P T' and the decays. gdr_chunk_scan_kernel, a
// block per (row, value head, 32 state columns), walks a row's chunks in
// order with its state tile in registers and does every product with
// the state, reading q, k and v themselves; the next chunk's operands are
// copied in (cp.async) while this one's products run. Why this split: the
// state-free work a chunk leaves behind is two C x C matrices (32 KB at
// C = 64), where [Q'; W], Kd, U and O0 (the other grouping, S multiplied
// in one product) were ~160 KB a chunk and head, read back by every column
// block of the scan from beyond L2.
// Every product runs on tensor cores with its operands split in two
// (x = hi + lo; hi·hi + hi·lo + lo·hi, sums in f32): the prep's as tf32
// (mma.m16n8k8, ~2^-21 of a product, f32-like, where a single tf32 product
// errs by ~2^-11), the scan's as bf16 (mma.m16n8k16, ~2^-16, its operands
// kept split in shared memory; see below). T is solved a column per 4
// threads (forward substitution on the identity, each thread a quarter of
// each sum); everything else is a product.
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

// Scratch per (chunk of the segment, value head), in floats: T' and P T'
// as bf16 pairs (four planes of [Cp][Cp] bf16: T' hi, T' lo, P T' hi,
// P T' lo), then the decays exp(gc), scale exp(gc), exp(gl - gc) [Cp] each
// (zero past the chunk's tokens) and exp(gl), padded to 4.
struct ChunkScratch {
  int64_t nb, H, Cp;
  __host__ __device__ int64_t unit() const { return 2 * Cp * Cp + 3 * Cp + 4; }
  __host__ __device__ int64_t t(int64_t b, int64_t h) const { return (b * H + h) * unit(); }
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

__device__ __forceinline__ bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// ---- 3 x bf16 warp products, for the scan ----
// The scan keeps its operands in shared memory as bf16 pairs, x = hi + lo
// (hi = bf16(x), lo = bf16(x - hi): 16 bits of mantissa, the bytes of an
// f32), so that a fragment is one ldmatrix a plane and a product over 16 is
// three mma.m16n8k16 (hi·hi + hi·lo + lo·hi, ~2^-16 of a product, sums in
// f32); split as tf32 at the fragment load, every operand element cost
// three instructions each time a warp read it.
struct Bf16Pair {
  uint32_t hi, lo;  // two elements each, the first in the low half
};
__device__ __forceinline__ Bf16Pair split_bf16x2(float x0, float x1) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  const float2 hf = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(x0 - hf.x, x1 - hf.y);
  return {*reinterpret_cast<const uint32_t*>(&h), *reinterpret_cast<const uint32_t*>(&l)};
}
// Not volatile, like mma_tf32.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// A plane: bf16 [rows][pitch], pitch (elements) an odd multiple of 8, so
// that an ldmatrix's 8 rows of 16 bytes fall on distinct banks.
__host__ __device__ constexpr int pitch_bf16(int n) { return n + 8; }
// Lane offsets (elements) into a plane for ldmatrix.x4, with lr = lane % 8,
// l8 = 8 ((lane / 8) % 2), l16 = 8 (lane / 16):
//   A [m][k] (row major):      (m0 + lr + l8) pitch + k0 + l16
//   A from [k][m], .trans:     (k0 + lr + l16) pitch + m0 + l8
//   B from [k][n], .trans, two n tiles (regs b0 b1 of n0, b0 b1 of n0 + 8):
//                              (k0 + lr + l8) pitch + n0 + l16
__device__ __forceinline__ int lane_a(int pitch) {
  const int l = threadIdx.x & 31;
  return ((l & 7) + ((l >> 3) & 1) * 8) * pitch + (l >> 4) * 8;
}
__device__ __forceinline__ int lane_at(int pitch) {
  const int l = threadIdx.x & 31;
  return ((l & 7) + (l >> 4) * 8) * pitch + ((l >> 3) & 1) * 8;
}
// acc[nt] += A B over one 16-row tile, NT (even) 8-column tiles and K (a
// multiple of 16): a_hi/a_lo and b_hi/b_lo point at the tiles' origins plus
// the lane's offset, a_step and b_step advance them 16 along k.
template <int NT>
__device__ __forceinline__ void warp_mma_bf16(float (&acc)[NT][4], const __nv_bfloat16* a_hi,
                                              const __nv_bfloat16* a_lo, int a_step, bool a_trans,
                                              const __nv_bfloat16* b_hi, const __nv_bfloat16* b_lo, int b_step,
                                              int K) {
  for (int k0 = 0; k0 < K; k0 += 16, a_hi += a_step, a_lo += a_step, b_hi += b_step, b_lo += b_step) {
    uint32_t ah[4], al[4], bh[NT / 2][4], bl[NT / 2][4];
    if (a_trans) {
      ldmatrix_x4_trans(ah, a_hi);
      ldmatrix_x4_trans(al, a_lo);
    } else {
      ldmatrix_x4(ah, a_hi);
      ldmatrix_x4(al, a_lo);
    }
#pragma unroll
    for (int p = 0; p < NT / 2; ++p) {
      ldmatrix_x4_trans(bh[p], b_hi + 16 * p);
      ldmatrix_x4_trans(bl[p], b_lo + 16 * p);
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) mma_bf16(acc[nt], al, bh[nt / 2][2 * (nt % 2)], bh[nt / 2][2 * (nt % 2) + 1]);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) mma_bf16(acc[nt], ah, bl[nt / 2][2 * (nt % 2)], bl[nt / 2][2 * (nt % 2) + 1]);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) mma_bf16(acc[nt], ah, bh[nt / 2][2 * (nt % 2)], bh[nt / 2][2 * (nt % 2) + 1]);
  }
}
// The same for two A operands against one B (acc1 += A1 B, acc2 += A2 B),
// both A row major with one pitch.
template <int NT>
__device__ __forceinline__ void warp_mma_bf16_pair(float (&acc1)[NT][4], float (&acc2)[NT][4],
                                                   const __nv_bfloat16* a1_hi, const __nv_bfloat16* a1_lo,
                                                   const __nv_bfloat16* a2_hi, const __nv_bfloat16* a2_lo,
                                                   const __nv_bfloat16* b_hi, const __nv_bfloat16* b_lo, int b_step,
                                                   int K) {
  for (int k0 = 0; k0 < K; k0 += 16) {
    uint32_t a1h[4], a1l[4], a2h[4], a2l[4], bh[NT / 2][4], bl[NT / 2][4];
    ldmatrix_x4(a1h, a1_hi + k0);
    ldmatrix_x4(a1l, a1_lo + k0);
    ldmatrix_x4(a2h, a2_hi + k0);
    ldmatrix_x4(a2l, a2_lo + k0);
#pragma unroll
    for (int p = 0; p < NT / 2; ++p) {
      ldmatrix_x4_trans(bh[p], b_hi + (k0 / 16) * b_step + 16 * p);
      ldmatrix_x4_trans(bl[p], b_lo + (k0 / 16) * b_step + 16 * p);
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      mma_bf16(acc1[nt], a1l, bh[nt / 2][2 * (nt % 2)], bh[nt / 2][2 * (nt % 2) + 1]);
      mma_bf16(acc2[nt], a2l, bh[nt / 2][2 * (nt % 2)], bh[nt / 2][2 * (nt % 2) + 1]);
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      mma_bf16(acc1[nt], a1h, bl[nt / 2][2 * (nt % 2)], bl[nt / 2][2 * (nt % 2) + 1]);
      mma_bf16(acc2[nt], a2h, bl[nt / 2][2 * (nt % 2)], bl[nt / 2][2 * (nt % 2) + 1]);
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      mma_bf16(acc1[nt], a1h, bh[nt / 2][2 * (nt % 2)], bh[nt / 2][2 * (nt % 2) + 1]);
      mma_bf16(acc2[nt], a2h, bh[nt / 2][2 * (nt % 2)], bh[nt / 2][2 * (nt % 2) + 1]);
    }
  }
}
// Stores an accumulator tile's two pairs of adjacent elements (rows g and
// g + 8) as bf16 pairs into the hi and lo planes at (row0, col0).
__device__ __forceinline__ void store_pairs(__nv_bfloat16* hi, __nv_bfloat16* lo, int pitch, int row0, int col0,
                                            const float (&v)[4]) {
  const int r = row0 + lane_g(), c = col0 + 2 * lane_t();
  const Bf16Pair p0 = split_bf16x2(v[0], v[1]), p1 = split_bf16x2(v[2], v[3]);
  *reinterpret_cast<uint32_t*>(hi + r * pitch + c) = p0.hi;
  *reinterpret_cast<uint32_t*>(lo + r * pitch + c) = p0.lo;
  *reinterpret_cast<uint32_t*>(hi + (r + 8) * pitch + c) = p1.hi;
  *reinterpret_cast<uint32_t*>(lo + (r + 8) * pitch + c) = p1.lo;
}

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

// grid: (chunks of the segment, n_head_k); block: kChunkThreads. The value
// heads that share a key head share K Kᵀ and Q Kᵀ: a block computes them
// once and then each of those heads' T' and P T' in turn.
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
  const int c0 = b * C, n = min(C, row.n_tokens - c0), hk = int(blockIdx.y), ratio = n_head / n_head_k;
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
  __syncthreads();
  // K Kᵀ and Q Kᵀ: warp w the 16 x 32 block at rows 16 (w % 4), columns
  // 32 (w / 4) of both, kept in registers for every value head.
  static_assert(kChunkWarps == 8 && kMaxChunk == 64, "8 warps cover a 64 x 64 chunk in 16 x 32 blocks");
  const int m0 = 16 * (warp % 4), n0 = 32 * (warp / 4);
  const bool has_block = m0 < Cp && n0 < Cp;
  float kk[4][4] = {}, qk[4][4] = {};
  if (has_block) {
    const auto kat = [&](int i, int a) { return sK[i * pk + a]; };
    const auto qat = [&](int i, int a) { return sQ[i * pk + a]; };
    const auto ktat = [&](int a, int j) { return sK[j * pk + a]; };  // Kᵀ; rows past Cp read sQ's, not kept
    warp_mma_pair(kk, qk, kat, qat, ktat, m0, n0, dkr);
  }
  for (int h = hk * ratio; h < (hk + 1) * ratio; ++h) {
    for (int i = tid; i < Cp; i += kChunkThreads) {
      sGc[i] = i < n ? g[(t0 + i) * n_head + h] : 0.0f;
      sBeta[i] = i < n ? beta[(t0 + i) * n_head + h] : 0.0f;
    }
    __syncthreads();  // and the last head's T' and P are no longer read
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
    // A = beta_i (K Kᵀ) exp(gc_i - gc_j) below the diagonal, P = (Q Kᵀ)
    // exp(gc_i - gc_j) on and below it.
    if (has_block) {
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
    // T' and P T' out as bf16 pairs, the planes the scan reads: T' hi, T' lo,
    // P T' hi, P T' lo, [Cp][Cp] each. P T': warp w the 16 x 32 block as above.
    __nv_bfloat16* t_out = reinterpret_cast<__nv_bfloat16*>(scratch + sc.t(cb, h));
    const int pl = Cp * Cp;
    for (int idx = tid; idx < Cp * Cp / 2; idx += kChunkThreads) {
      const int i = idx / (Cp / 2), j = 2 * (idx % (Cp / 2));
      const Bf16Pair pr = split_bf16x2(sA[i * pc + j], sA[i * pc + j + 1]);
      *reinterpret_cast<uint32_t*>(t_out + i * Cp + j) = pr.hi;
      *reinterpret_cast<uint32_t*>(t_out + pl + i * Cp + j) = pr.lo;
    }
    if (has_block) {
      float acc[4][4] = {};
      const auto pat = [&](int i, int j) { return sP[i * pc + j]; };
      const auto tat = [&](int j, int x) { return sA[j * pc + x]; };  // columns past Cp read the next row's: not kept
      warp_mma(acc, pat, tat, m0, n0, Cp);
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
        if (n0 + 8 * nt < Cp) store_pairs(t_out + 2 * pl, t_out + 3 * pl, Cp, m0, n0 + 8 * nt, acc[nt]);
    }
  }
}

// K and Q of a chunk as the scan prefetches them into registers a chunk
// ahead: groups of 4 columns of [K; Q] (2 Cp rows), kPrefetch a thread.
// The host keeps 2 Cp pow2(dkr / 4) <= kPrefetch kChunkThreads.
constexpr int kPrefetch = 16;

// Shared memory of the scan kernel, in bytes: as bf16 planes (hi, then lo)
// the state tile [dkr][ps], K and Q [Cp][pk] each, T' and P T' [Cp][pt]
// each, x and exp(gl - gc) v_new [Cp][ps] each; in f32, v's 32 columns of
// two chunks [2][Cp][pv] (this one's and the next's, in flight) and the
// decays of two chunks [2][nd].
struct ScanSmem {
  int Cp, dkr;
  __host__ __device__ ScanSmem(int C, int dk) : Cp(round16(C)), dkr(round16(dk)) {}
  __host__ __device__ int ps() const { return pitch_bf16(kScanColumns); }
  __host__ __device__ int pk() const { return pitch_bf16(dkr); }
  __host__ __device__ int pt() const { return pitch_bf16(Cp); }
  __host__ __device__ int pv() const { return pitch_cols(kScanColumns); }
  __host__ __device__ int nd() const { return 3 * Cp + 4; }
  __host__ __device__ int64_t plane_s() const { return int64_t(dkr) * ps() * 2; }  // bytes of one plane
  __host__ __device__ int64_t plane_k() const { return int64_t(Cp) * pk() * 2; }
  __host__ __device__ int64_t plane_t() const { return int64_t(Cp) * pt() * 2; }
  __host__ __device__ int64_t plane_x() const { return int64_t(Cp) * ps() * 2; }
  __host__ __device__ int64_t s() const { return 0; }
  __host__ __device__ int64_t k() const { return s() + 2 * plane_s(); }
  __host__ __device__ int64_t q() const { return k() + 2 * plane_k(); }
  __host__ __device__ int64_t t() const { return q() + 2 * plane_k(); }  // T' hi, T' lo, P T' hi, P T' lo
  __host__ __device__ int64_t x() const { return t() + 4 * plane_t(); }
  __host__ __device__ int64_t vn() const { return x() + 2 * plane_x(); }
  __host__ __device__ int64_t v() const { return vn() + 2 * plane_x(); }
  __host__ __device__ int64_t dec() const { return v() + 2 * int64_t(Cp) * pv() * 4; }
  __host__ __device__ int64_t bytes() const { return dec() + 2 * int64_t(nd()) * 4; }
};

// grid: (n_rows, n_head, ceil(dv / 32)); block: kChunkThreads. Chunks
// b0..b1 - 1 of the segment. kStateTiles: 16-row tiles of the state a warp
// owns, dkr <= 128 kStateTiles.
template <int kStateTiles>
__global__ void __launch_bounds__(kChunkThreads) gdr_chunk_scan_kernel(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v, int C, int n_head_k,
    int n_head, int dk, int dv, const RecurrentRow* __restrict__ rows, int b0, int b1, ChunkScratch sc,
    const float* __restrict__ scratch, float* __restrict__ state, float* __restrict__ out) {
  pdl_entry();
  extern __shared__ __align__(16) unsigned char smem_bytes[];
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
  const int Cp = L.Cp, dkr = L.dkr, ps = L.ps(), pk = L.pk(), pt = L.pt(), pv = L.pv(), nd = L.nd();
  using bf = __nv_bfloat16;
  bf* sSh = reinterpret_cast<bf*>(smem_bytes + L.s());
  bf* sSl = reinterpret_cast<bf*>(smem_bytes + L.s() + L.plane_s());
  bf* sKh = reinterpret_cast<bf*>(smem_bytes + L.k());
  bf* sKl = reinterpret_cast<bf*>(smem_bytes + L.k() + L.plane_k());
  bf* sQh = reinterpret_cast<bf*>(smem_bytes + L.q());
  bf* sQl = reinterpret_cast<bf*>(smem_bytes + L.q() + L.plane_k());
  bf* sT = reinterpret_cast<bf*>(smem_bytes + L.t());  // 4 planes of [Cp][pt]
  bf* sXh = reinterpret_cast<bf*>(smem_bytes + L.x());
  bf* sXl = reinterpret_cast<bf*>(smem_bytes + L.x() + L.plane_x());
  bf* sVh = reinterpret_cast<bf*>(smem_bytes + L.vn());
  bf* sVl = reinterpret_cast<bf*>(smem_bytes + L.vn() + L.plane_x());
  float* sV = reinterpret_cast<float*>(smem_bytes + L.v());      // [2][Cp][pv]
  float* sDec = reinterpret_cast<float*>(smem_bytes + L.dec());  // [2][nd]
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const bool vec_qk = dk % 4 == 0 && aligned16(q) && aligned16(k), vec_v = dv % 4 == 0 && aligned16(v);
  const auto tokens = [&](int c) { return min(C, row.n_tokens - c * C); };
  const auto first = [&](int c) { return int64_t(row.token_begin) + int64_t(c) * C; };

  // The state: warp w owns rows 16 w, 16 (w + 8) of its tile in f32
  // registers (accumulator layout) and writes them as bf16 pairs to the
  // planes the products read.
  float st[kStateTiles][4][4];
  float* S = state + (int64_t(row.slot) * n_head + h) * dk * dv;  // [dk, dv]
  const auto each_state = [&](auto&& f) {  // f(element, its row, its column) over this lane's
#pragma unroll
    for (int u = 0; u < kStateTiles; ++u) {
      const int mt = warp + kChunkWarps * u;
      if (16 * mt >= dkr) continue;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) f(st[u][nt][e], 16 * mt + acc_row(e), 8 * nt + acc_col(e));
    }
  };
  const auto state_to_planes = [&]() {
#pragma unroll
    for (int u = 0; u < kStateTiles; ++u) {
      const int mt = warp + kChunkWarps * u;
      if (16 * mt >= dkr) continue;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) store_pairs(sSh, sSl, ps, 16 * mt, 8 * nt, st[u][nt]);
    }
  };
  each_state([&](float& x, int a, int j) { x = a < dk && j < ncol ? S[int64_t(a) * dv + col0 + j] : 0.0f; });
  state_to_planes();

  // K and Q of a chunk: [K; Q] (2 Cp rows) in groups of 4 columns, cgp
  // groups a row (dkr / 4 rounded up to a power of two; those past dkr are
  // skipped), so that a thread keeps one column group and walks the rows
  // 256 / cgp apart.
  const int lg = 31 - __clz(max(1, dkr / 4 - 1)) + 1, rstep = kChunkThreads >> lg;
  const int g_row = tid >> lg, g_col = 4 * (tid & ((1 << lg) - 1));
  const bool g_in = g_col < dkr;
  float4 pf[kPrefetch];
  const auto prefetch = [&](int c) {
    const int n = tokens(c);
    const int64_t t0 = first(c);
    const int64_t stride = int64_t(n_head_k) * dk;
    const float* kb = k + (t0 * n_head_k + hk) * dk + g_col;
    const float* qb = q + (t0 * n_head_k + hk) * dk + g_col;
#pragma unroll
    for (int u = 0; u < kPrefetch; ++u) {
      const int i = g_row + rstep * u, tok = i < Cp ? i : i - Cp;
      const float* src = (i < Cp ? kb : qb) + tok * stride;
      float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (i < 2 * Cp && tok < n) {
        if (vec_qk) {
          if (g_col < dk) x = *reinterpret_cast<const float4*>(src);
        } else {
          x.x = g_col < dk ? src[0] : 0.0f;
          x.y = g_col + 1 < dk ? src[1] : 0.0f;
          x.z = g_col + 2 < dk ? src[2] : 0.0f;
          x.w = g_col + 3 < dk ? src[3] : 0.0f;
        }
      }
      pf[u] = x;
    }
  };
  const auto store_prefetched = [&]() {
#pragma unroll
    for (int u = 0; u < kPrefetch; ++u) {
      const int i = g_row + rstep * u;
      if (g_in && i < 2 * Cp) {
        const int off = (i < Cp ? i : i - Cp) * pk + g_col;
        const Bf16Pair p0 = split_bf16x2(pf[u].x, pf[u].y), p1 = split_bf16x2(pf[u].z, pf[u].w);
        *reinterpret_cast<uint2*>((i < Cp ? sKh : sQh) + off) = make_uint2(p0.hi, p1.hi);
        *reinterpret_cast<uint2*>((i < Cp ? sKl : sQl) + off) = make_uint2(p0.lo, p1.lo);
      }
    }
  };
  // Copies in flight, as cp.async groups in the order issued: v and the
  // decays of chunk c + 1 (other buffers) as chunk c starts, T' and P T' of
  // c + 1 once c's products with them are done. A group past the row's last
  // chunk is empty.
  const auto load_v = [&](int c) {
    if (c < hi) {
      const int n = tokens(c);
      const int64_t t0 = first(c);
      float* dst = sV + (c & 1) * Cp * pv;
      const float* src = v + (t0 * n_head + h) * dv + col0;
      const int64_t stride = int64_t(n_head) * dv;
      for (int i = warp; i < Cp; i += kChunkWarps) {  // a warp a row, a lane 4 columns
        if (lane >= kScanColumns / 4) continue;
        const int a = 4 * lane;
        if (vec_v) {
          const bool in = i < n && a < ncol;
          cp_async16(dst + i * pv + a, in ? src + i * stride + a : src, in);
        } else {
          for (int e = 0; e < 4; ++e) dst[i * pv + a + e] = i < n && a + e < ncol ? src[i * stride + a + e] : 0.0f;
        }
      }
      const float* dsrc = scratch + sc.decays(base + c - b0, h);
      for (int x = tid; x < nd / 4; x += kChunkThreads) cp_async16(sDec + (c & 1) * nd + 4 * x, dsrc + 4 * x, true);
    }
    cp_async_commit();
  };
  const auto load_t = [&](int c) {
    if (c < hi) {
      const bf* src = reinterpret_cast<const bf*>(scratch + sc.t(base + c - b0, h));  // 4 planes of [Cp][Cp]
      const int per_row = Cp / 8;                                                    // 16-byte pieces
      for (int idx = tid; idx < 4 * Cp * per_row; idx += kChunkThreads) {
        const int i = idx / per_row, x = idx % per_row;
        cp_async16(sT + i * pt + 8 * x, src + i * Cp + 8 * x, true);
      }
    }
    cp_async_commit();
  };
  // Warp w's tile of the chunk's products with its tokens: rows 16 (w % 4),
  // columns 16 (w / 4), both 16 long.
  const int m0 = 16 * (warp % 4), n0 = 16 * (warp / 4);
  const bool has_tile = m0 < Cp;
  const int la_k = lane_a(pk), la_t = lane_a(pt), lat_k = lane_at(pk), lb_s = lane_a(ps);  // B .trans: same form as A's
  load_v(lo);
  load_t(lo);
  prefetch(lo);
  store_prefetched();
  for (int c = lo; c < hi; ++c) {
    const int n = tokens(c);
    const int64_t t0 = first(c);
    const float* vb = sV + (c & 1) * Cp * pv;
    const float* db = sDec + (c & 1) * nd;  // exp(gc), scale exp(gc), exp(gl - gc), exp(gl)
    load_v(c + 1);  // the previous chunk is done with those buffers
    if (c + 1 < hi) prefetch(c + 1);
    cp_async_wait<2>();
    __syncthreads();  // v and the decays of chunk c are in; K, Q and the state's planes written
    // K S and Q S. x = v - exp(gc) (K S) to its planes (zero past n and
    // ncol: K, v and the decay are); scale exp(gc) (Q S) kept, the outputs
    // less (P T') x.
    float o[2][4] = {};
    if (has_tile) {
      float ks[2][4] = {};
      warp_mma_bf16_pair(ks, o, sKh + m0 * pk + la_k, sKl + m0 * pk + la_k, sQh + m0 * pk + la_k,
                         sQl + m0 * pk + la_k, sSh + n0 + lb_s, sSl + n0 + lb_s, 16 * ps, dkr);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int i = m0 + lane_g(), j = n0 + 8 * nt + 2 * lane_t();  // elements (i, j..j+1), (i + 8, j..j+1)
        const float2 v0 = *reinterpret_cast<const float2*>(vb + i * pv + j);
        const float2 v1 = *reinterpret_cast<const float2*>(vb + (i + 8) * pv + j);
        const float x[4] = {v0.x - db[i] * ks[nt][0], v0.y - db[i] * ks[nt][1], v1.x - db[i + 8] * ks[nt][2],
                            v1.y - db[i + 8] * ks[nt][3]};
#pragma unroll
        for (int e = 0; e < 4; ++e) o[nt][e] *= db[Cp + m0 + acc_row(e)];
        store_pairs(sXh, sXl, ps, m0, n0 + 8 * nt, x);
      }
    }
    cp_async_wait<1>();
    __syncthreads();  // x complete; T' and P T' of chunk c are in
    // v_new = T' x, kept as exp(gl - gc) v_new for the state; out += (P T') x.
    if (has_tile) {
      float vn[2][4] = {};
      const int pl = Cp * pt;  // elements a plane
      warp_mma_bf16_pair(vn, o, sT + m0 * pt + la_t, sT + pl + m0 * pt + la_t, sT + 2 * pl + m0 * pt + la_t,
                         sT + 3 * pl + m0 * pt + la_t, sXh + n0 + lb_s, sXl + n0 + lb_s, 16 * ps, Cp);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        float x[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = m0 + acc_row(e), j = n0 + 8 * nt + acc_col(e);
          x[e] = db[2 * Cp + i] * vn[nt][e];
          if (i < n && j < ncol) out[((t0 + i) * n_head + h) * dv + col0 + j] = o[nt][e];
        }
        store_pairs(sVh, sVl, ps, m0, n0 + 8 * nt, x);
      }
    }
    __syncthreads();  // v_new complete; T' and P T' free
    load_t(c + 1);
    // S <- exp(gl) S + Kᵀ (exp(gl - gc) v_new) on the owners' registers,
    // then to the planes.
    const float el = db[3 * Cp];
    each_state([&](float& x, int, int) { x *= el; });
#pragma unroll
    for (int u = 0; u < kStateTiles; ++u) {
      const int mt = warp + kChunkWarps * u;
      if (16 * mt < dkr)
        warp_mma_bf16(st[u], sKh + 16 * mt + lat_k, sKl + 16 * mt + lat_k, 16 * pk, true, sVh + lb_s, sVl + lb_s,
                      16 * ps, Cp);
    }
    state_to_planes();
    __syncthreads();  // every read of this chunk's K and Q is done
    if (c + 1 < hi) store_prefetched();
  }
  cp_async_wait<0>();
  each_state([&](float& x, int a, int j) {
    if (a < dk && j < ncol) S[int64_t(a) * dv + col0 + j] = x;
  });
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
    return std::max(PrepSmem(c, dk).total() * int64_t(sizeof(float)), ScanSmem(c, dk).bytes());
  };
  // The scan prefetches a chunk's K and Q into registers, kPrefetch groups
  // of 4 a thread.
  auto prefetch_fits = [&](int c) {
    int groups = 1;  // a row's column groups, a power of two
    while (groups < round16(dk) / 4) groups *= 2;
    return 2 * round16(c) * groups <= kPrefetch * kChunkThreads;
  };
  while (C > 16 && (smem_bytes(C) > 227 * 1024 || !prefetch_fits(C))) C /= 2;
  if (smem_bytes(C) > 227 * 1024 || !prefetch_fits(C))
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
  const size_t scan_smem = size_t(ScanSmem(C, dk).bytes());
  static size_t prep_granted = 0, scan_granted = 0;
  grant(gdr_chunk_prep_kernel, prep_smem, prep_granted);
  static size_t scan2_granted = 0;
  const bool wide = round16(dk) > 16 * kChunkWarps;  // two state tiles a warp
  if (wide)
    grant(gdr_chunk_scan_kernel<2>, scan_smem, scan2_granted);
  else
    grant(gdr_chunk_scan_kernel<1>, scan_smem, scan_granted);
  for (int64_t b0 = 0; b0 < n_chunks; b0 += sc.nb) {
    const int64_t b1 = std::min(n_chunks, b0 + sc.nb);
    launch("gdr_chunk_prep_kernel", gdr_chunk_prep_kernel, dim3(unsigned(b1 - b0), unsigned(d.n_head_k)),
           dim3(kChunkThreads),
           prep_smem, s, q, k, g, beta, scale, C, int(d.n_head_k), H, dk, rows, int(n_rows), int(b0), sc, scratch);
    launch("gdr_chunk_scan_kernel", wide ? gdr_chunk_scan_kernel<2> : gdr_chunk_scan_kernel<1>,
           dim3(unsigned(n_rows), unsigned(H), blocks_for(dv, kScanColumns)), dim3(kChunkThreads), scan_smem, s, q, k,
           v, C, int(d.n_head_k), H, dk, dv, rows, int(b0), int(b1), sc, static_cast<const float*>(scratch), state,
           out);
  }
}

}  // namespace augur::cuda
