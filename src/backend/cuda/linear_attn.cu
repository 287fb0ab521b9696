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

constexpr int kMaxChunk = 64;
constexpr int kChunkThreads = 256;

// Shared memory of the chunked kernel, in floats: K and scaled Q of a chunk
// (rows padded to dk + 1 against bank conflicts), the intra-chunk matrices A
// and QK, the state tile, v_new, and per-token gc, beta, decay to the end.
struct ChunkSmem {
  int dkp, C, bv;
  __host__ __device__ int64_t k() const { return 0; }
  __host__ __device__ int64_t q() const { return k() + int64_t(C) * dkp; }
  __host__ __device__ int64_t a() const { return q() + int64_t(C) * dkp; }
  __host__ __device__ int64_t qk() const { return a() + int64_t(C) * C; }
  __host__ __device__ int64_t s() const { return qk() + int64_t(C) * C; }
  __host__ __device__ int64_t vn() const { return s() + int64_t(dkp - 1) * bv; }
  __host__ __device__ int64_t gc() const { return vn() + int64_t(C) * bv; }
  __host__ __device__ int64_t beta() const { return gc() + C; }
  __host__ __device__ int64_t dec() const { return beta() + C; }
  __host__ __device__ int64_t total() const { return dec() + C; }
};

// Reference: torch_chunk_gated_delta_rule. Per chunk of L tokens with
// cumulative log-decay gc (A[i][j] = beta_i (k_i·k_j) exp(gc_i - gc_j), j < i):
//   v_new = (I + A)^-1 beta (v - exp(gc) K S)   (forward substitution)
//   out_i = exp(gc_i) (q_i S) + sum_{j <= i} (q_i·k_j) exp(gc_i - gc_j) v_new_j
//   S <- exp(gc_last) S + sum_i k_i exp(gc_last - gc_i) v_new_iᵀ
// (the CPU op's U - W S, with W S folded in before the substitution: equal
// within float rounding). Columns of S evolve independently, so a block owns
// `bv` of them. grid: (n_rows, n_head, ceil(dv / bv)); block: kChunkThreads.
__global__ void __launch_bounds__(kChunkThreads) gdr_chunked_kernel(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ g, const float* __restrict__ beta, float scale, int C, int n_head_k, int n_head, int dk,
    int dv, int bv, const RecurrentRow* __restrict__ rows, float* __restrict__ state, float* __restrict__ out) {
  pdl_entry();
  extern __shared__ float smem[];
  const RecurrentRow row = rows[blockIdx.x];
  if (row.n_tokens <= 0) return;  // uniform over the block
  const int h = blockIdx.y, hk = h / (n_head / n_head_k), col0 = blockIdx.z * bv;
  const int ncol = min(bv, dv - col0);
  const ChunkSmem L{dk + 1, C, bv};
  const int dkp = L.dkp;
  float* sK = smem + L.k();    // [C, dkp]
  float* sQ = smem + L.q();    // [C, dkp], scaled
  float* sA = smem + L.a();    // [C, C]
  float* sQK = smem + L.qk();  // [C, C]
  float* sS = smem + L.s();    // [dk, bv]
  float* sV = smem + L.vn();   // [C, bv]
  float* sGc = smem + L.gc();
  float* sBeta = smem + L.beta();
  float* sDec = smem + L.dec();
  float* S = state + (int64_t(row.slot) * n_head + h) * dk * dv;  // [dk, dv]

  for (int idx = threadIdx.x; idx < dk * bv; idx += blockDim.x) {
    const int a = idx / bv, j = idx % bv;
    sS[idx] = j < ncol ? S[int64_t(a) * dv + col0 + j] : 0.0f;
  }
  for (int c0 = 0; c0 < row.n_tokens; c0 += C) {
    const int n = min(C, row.n_tokens - c0);
    const int64_t t0 = int64_t(row.token_begin) + c0;
    __syncthreads();  // the previous chunk is done with every buffer
    for (int idx = threadIdx.x; idx < n * dk; idx += blockDim.x) {
      const int i = idx / dk, a = idx % dk;
      const int64_t src = ((t0 + i) * n_head_k + hk) * dk + a;
      sK[i * dkp + a] = k[src];
      sQ[i * dkp + a] = q[src] * scale;
    }
    if (threadIdx.x == 0) {
      float cum = 0.0f;
      for (int i = 0; i < n; ++i) {
        cum += g[(t0 + i) * n_head + h];
        sGc[i] = cum;
        sBeta[i] = beta[(t0 + i) * n_head + h];
      }
      for (int i = 0; i < n; ++i) sDec[i] = expf(cum - sGc[i]);
    }
    __syncthreads();
    // A (strictly lower) and QK (lower, diagonal included).
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
      sQK[i * C + j] = qk * e;
    }
    // R = beta (v - exp(gc) K S) into sV.
    for (int idx = threadIdx.x; idx < n * bv; idx += blockDim.x) {
      const int i = idx / bv, j = idx % bv;
      float ks = 0.0f;
      for (int a = 0; a < dk; ++a) ks += sK[i * dkp + a] * sS[a * bv + j];
      const float vij = j < ncol ? v[((t0 + i) * n_head + h) * dv + col0 + j] : 0.0f;
      sV[i * bv + j] = sBeta[i] * (vij - expf(sGc[i]) * ks);
    }
    __syncthreads();
    // Forward substitution, one thread per column: v_new_i = R_i - sum_{j<i} A_ij v_new_j.
    if (threadIdx.x < bv) {
      const int j = threadIdx.x;
      for (int i = 1; i < n; ++i) {
        float r = sV[i * bv + j];
        for (int jj = 0; jj < i; ++jj) r -= sA[i * C + jj] * sV[jj * bv + j];
        sV[i * bv + j] = r;
      }
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
                              int64_t n_rows, float* state, float* out, Stream s) {
  check_delta_rule_launch("gated_delta_rule_chunked", d, n_rows);
  if (chunk_size < 1 || chunk_size > kMaxChunk)
    fail("[gated_delta_rule_chunked] chunk_size ", chunk_size, " outside [1, ", kMaxChunk, "] on CUDA");
  if (n_rows == 0 || d.head_dim_v == 0) return;
  const int bv = 32;
  const ChunkSmem layout{int(d.head_dim_k) + 1, int(chunk_size), bv};
  const size_t smem = size_t(layout.total()) * sizeof(float);
  static size_t granted = 0;  // the kernel's dynamic shared memory limit, raised once as needed
  if (smem > 48 * 1024 && smem > granted) {
    AUGUR_CUDA(cudaFuncSetAttribute(gdr_chunked_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    granted = smem;
  }
  const dim3 grid(unsigned(n_rows), unsigned(d.n_head), blocks_for(d.head_dim_v, bv));
  gdr_chunked_kernel<<<grid, kChunkThreads, smem, s>>>(q, k, v, g, beta, scale, int(chunk_size), int(d.n_head_k),
                                                       int(d.n_head), int(d.head_dim_k), int(d.head_dim_v), bv, rows,
                                                       state, out);
  AUGUR_LAUNCHED("gated_delta_rule_chunked");
}

}  // namespace augur::cuda
