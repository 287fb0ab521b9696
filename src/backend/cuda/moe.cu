// Mixture-of-experts kernels: top-k routing and the routed experts' SwiGLU
// MLPs, on the device throughout (no host round trip per layer). Each
// reproduces its CPU op in backend/cpu/moe_cpu.cpp / backend/ops_moe.cpp in f32
// (weights widened from their 16-bit type).
#include <algorithm>

#include "backend/cuda/common.cuh"

namespace augur::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxTopK = 32;

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }

// The better of two (probability, expert) candidates: larger probability,
// then the lower expert id.
__device__ __forceinline__ bool better(float pa, int ia, float pb, int ib) {
  return pa > pb || (pa == pb && ia < ib);
}

// Reference: Qwen3NextTopKRouter.forward. One block per token;
// logits: [n_tokens, E]; weights, ids: [n_tokens, top_k]. Dynamic smem: E floats.
__global__ void moe_route_kernel(const float* __restrict__ logits, int E, int top_k, bool normalize,
                                 float* __restrict__ weights, int32_t* __restrict__ ids) {
  extern __shared__ float p[];  // [E] probabilities; a chosen expert is set to -1
  __shared__ float red_v[32];
  __shared__ int red_i[32];
  __shared__ float chosen_p[kMaxTopK];
  __shared__ int chosen_e[kMaxTopK];
  const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  const float* l = logits + int64_t(t) * E;
  // max
  float mx = -INFINITY;
  for (int e = threadIdx.x; e < E; e += blockDim.x) mx = fmaxf(mx, l[e]);
  mx = warp_max(mx);
  if (lane == 0) red_v[warp] = mx;
  __syncthreads();
  mx = lane < n_warps ? red_v[lane] : -INFINITY;
  mx = warp_max(mx);
  __syncthreads();
  // softmax
  float sum = 0.0f;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    p[e] = expf(l[e] - mx);
    sum += p[e];
  }
  sum = warp_sum(sum);
  if (lane == 0) red_v[warp] = sum;
  __syncthreads();
  sum = lane < n_warps ? red_v[lane] : 0.0f;
  sum = warp_sum(sum);
  for (int e = threadIdx.x; e < E; e += blockDim.x) p[e] /= sum;
  __syncthreads();
  // top_k rounds of a block argmax
  for (int r = 0; r < top_k; ++r) {
    float bv = -2.0f;
    int bi = 0x7fffffff;
    for (int e = threadIdx.x; e < E; e += blockDim.x)
      if (better(p[e], e, bv, bi)) bv = p[e], bi = e;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    if (lane == 0) red_v[warp] = bv, red_i[warp] = bi;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < n_warps; ++w)
        if (better(red_v[w], red_i[w], bv, bi)) bv = red_v[w], bi = red_i[w];
      chosen_p[r] = bv;
      chosen_e[r] = bi;
      p[bi] = -1.0f;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    float kept = 0.0f;
    for (int r = 0; r < top_k; ++r) kept += chosen_p[r];
    for (int r = 0; r < top_k; ++r) {
      ids[int64_t(t) * top_k + r] = chosen_e[r];
      weights[int64_t(t) * top_k + r] = normalize ? chosen_p[r] / kept : chosen_p[r];
    }
  }
}

// Rows (token, expert pairs) and columns of one tile of the grouped GEMMs.
constexpr int kTM = 32, kTN = 64, kTK = 32;

// Workspace of moe_experts: int arrays, then f32 activations.
struct MoeLayout {
  int64_t P, E, d_model, d_ff;
  __host__ __device__ int64_t offsets() const { return 0; }                   // [E + 1] first sorted slot of each expert
  __host__ __device__ int64_t tile_offsets() const { return offsets() + E + 1; }  // [E + 1] first tile of each expert
  __host__ __device__ int64_t order() const { return tile_offsets() + E + 1; }    // [P] pair of each sorted slot
  __host__ __device__ int64_t slot_of() const { return order() + P; }             // [P] sorted slot of each pair
  __host__ __device__ int64_t act() const { return (slot_of() + P + 3) / 4 * 4; }  // f32 [P, d_ff]
  __host__ __device__ int64_t y() const { return act() + P * d_ff; }               // f32 [P, d_model]
  __host__ __device__ int64_t total() const { return y() + P * d_model; }          // 4-byte words
};

// Sorts the P = n_tokens * top_k (token, expert) pairs by expert, pairs in
// batch order within an expert (deterministic), and counts each expert's
// tiles of kTM. One block; thread e handles experts e, e + blockDim, ...
__global__ void moe_sort_kernel(const int32_t* __restrict__ ids, int P, int E, int32_t* ws) {
  int32_t* offsets = ws;
  int32_t* tile_offsets = offsets + E + 1;
  int32_t* order = tile_offsets + E + 1;
  int32_t* slot_of = order + P;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int n = 0;
    for (int p = 0; p < P; ++p) n += ids[p] == e;
    offsets[e + 1] = n;  // counts for now
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    offsets[0] = 0;
    tile_offsets[0] = 0;
    for (int e = 0; e < E; ++e) {
      const int n = offsets[e + 1];
      offsets[e + 1] = offsets[e] + n;
      tile_offsets[e + 1] = tile_offsets[e] + (n + kTM - 1) / kTM;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int at = offsets[e];
    for (int p = 0; p < P; ++p)
      if (ids[p] == e) {
        order[at] = p;
        slot_of[p] = at;
        ++at;
      }
  }
}

// One tile of a grouped GEMM: sorted slots [begin, end) of expert e.
// grid.x: an upper bound on the tiles (ceil(P / kTM) + E; the rest exit),
// grid.y: ceil(N / kTN). 256 threads, each 2 rows x 4 columns of the tile.
//   GATE_UP: act[slot, n] = silu(x_t · Wg_e[n]) * (x_t · Wu_e[n]), t = order[slot] / top_k,
//            W: [E, 2N, K] (gate rows, then up rows); out = act: [P, N]
//   else:    y[slot, n] = act[slot] · Wd_e[n]; W: [E, N, K]; out = y: [P, N]
template <bool F16, bool GATE_UP>
__global__ void __launch_bounds__(kThreads) moe_gemm_kernel(const float* __restrict__ A, const int32_t* __restrict__ ws,
                                                           int P, int E, int top_k, const uint16_t* __restrict__ W,
                                                           int64_t N, int64_t K, float* __restrict__ out) {
  __shared__ float As[kTK][kTM + 1];
  __shared__ float Bg[kTK][kTN + 1];
  __shared__ float Bu[GATE_UP ? kTK : 1][kTN + 1];
  __shared__ int s_e, s_begin, s_end;
  const int32_t* offsets = ws;
  const int32_t* tile_offsets = offsets + E + 1;
  const int32_t* order = tile_offsets + E + 1;
  if (threadIdx.x == 0) {
    const int tile = blockIdx.x;
    s_e = -1;
    if (tile < tile_offsets[E]) {
      int lo = 0, hi = E;  // the last e with tile_offsets[e] <= tile
      while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (tile_offsets[mid] <= tile) lo = mid;
        else hi = mid;
      }
      s_e = lo;
      s_begin = offsets[lo] + (tile - tile_offsets[lo]) * kTM;
      s_end = min(offsets[lo + 1], s_begin + kTM);
    }
  }
  __syncthreads();
  if (s_e < 0) return;
  const int e = s_e, begin = s_begin, rows = s_end - s_begin;
  const int64_t n0 = int64_t(blockIdx.y) * kTN;
  const uint16_t* We = W + int64_t(e) * (GATE_UP ? 2 * N : N) * K;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc_g[2][4] = {}, acc_u[2][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kTK) {
    for (int idx = threadIdx.x; idx < kTM * kTK; idx += blockDim.x) {
      const int r = idx / kTK, kk = idx % kTK;
      float val = 0.0f;
      if (r < rows && k0 + kk < K) {
        const int slot = begin + r;
        const int64_t src_row = GATE_UP ? order[slot] / top_k : slot;
        val = A[src_row * K + k0 + kk];
      }
      As[kk][r] = val;
    }
    for (int idx = threadIdx.x; idx < kTN * kTK; idx += blockDim.x) {
      const int n = idx / kTK, kk = idx % kTK;
      const int64_t col = n0 + n;
      const bool ok = col < N && k0 + kk < K;
      Bg[kk][n] = ok ? half_to_f32<F16>(We[col * K + k0 + kk]) : 0.0f;
      if constexpr (GATE_UP) Bu[kk][n] = ok ? half_to_f32<F16>(We[(N + col) * K + k0 + kk]) : 0.0f;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kTK; ++kk) {
      float a[2], bg[4], bu[4];
#pragma unroll
      for (int r = 0; r < 2; ++r) a[r] = As[kk][ty + 16 * r];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        bg[c] = Bg[kk][tx + 16 * c];
        if constexpr (GATE_UP) bu[c] = Bu[kk][tx + 16 * c];
      }
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          acc_g[r][c] += a[r] * bg[c];
          if constexpr (GATE_UP) acc_u[r][c] += a[r] * bu[c];
        }
    }
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = ty + 16 * r;
    if (row >= rows) continue;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int64_t col = n0 + tx + 16 * c;
      if (col >= N) continue;
      out[int64_t(begin + row) * N + col] = GATE_UP ? silu_f(acc_g[r][c]) * acc_u[r][c] : acc_g[r][c];
    }
  }
}

// out[t, :] = sum over the token's experts in ascending id of weight * y[slot].
// One block per token; y: [P, d_model] by sorted slot.
__global__ void moe_combine_kernel(const float* __restrict__ y, const int32_t* __restrict__ ids,
                                   const float* __restrict__ weights, const int32_t* __restrict__ slot_of, int top_k,
                                   int64_t d_model, float* __restrict__ out) {
  __shared__ int s_slot[kMaxTopK];
  __shared__ float s_w[kMaxTopK];
  const int64_t t = blockIdx.x;
  if (threadIdx.x == 0) {
    int e[kMaxTopK];
    for (int i = 0; i < top_k; ++i) {
      // insertion by expert id (ids of one token are distinct)
      const int id = ids[t * top_k + i];
      int j = i;
      while (j > 0 && e[j - 1] > id) {
        e[j] = e[j - 1];
        s_slot[j] = s_slot[j - 1];
        s_w[j] = s_w[j - 1];
        --j;
      }
      e[j] = id;
      s_slot[j] = slot_of[t * top_k + i];
      s_w[j] = weights[t * top_k + i];
    }
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < d_model; c += blockDim.x) {
    float acc = 0.0f;
    for (int i = 0; i < top_k; ++i) acc += y[int64_t(s_slot[i]) * d_model + c] * s_w[i];
    out[t * d_model + c] = acc;
  }
}

}  // namespace

void moe_route(const float* logits, int64_t n_tokens, int64_t n_expert, int64_t top_k, bool normalize,
               float* weights, int32_t* ids, Stream s) {
  if (top_k < 1 || top_k > kMaxTopK || top_k > n_expert)
    fail("[moe_route] top_k ", top_k, " outside [1, min(", kMaxTopK, ", ", n_expert, ")] on CUDA");
  if (n_tokens == 0) return;
  const size_t smem = size_t(n_expert) * sizeof(float);
  if (smem > 48 * 1024) fail("[moe_route] ", n_expert, " experts exceed the kernel's shared memory");
  moe_route_kernel<<<unsigned(n_tokens), kThreads, smem, s>>>(logits, int(n_expert), int(top_k), normalize, weights,
                                                              ids);
  AUGUR_LAUNCHED("moe_route");
}

size_t moe_workspace_bytes(int64_t n_tokens, int64_t top_k, int64_t n_expert, int64_t d_model, int64_t d_ff) {
  return size_t(MoeLayout{n_tokens * top_k, n_expert, d_model, d_ff}.total()) * 4;
}

void moe_experts(const float* x, int64_t n_tokens, int64_t d_model, const half_bits* gate_up,
                 const half_bits* down, Half wt, int64_t n_expert, int64_t d_ff, const int32_t* ids,
                 const float* weights, int64_t top_k, float* out, void* workspace, Stream s) {
  if (top_k < 1 || top_k > kMaxTopK) fail("[moe_experts] top_k ", top_k, " outside [1, ", kMaxTopK, "] on CUDA");
  if (n_tokens == 0) return;
  const int64_t P = n_tokens * top_k;
  if (P > 0x7fffffff / 2) fail("[moe_experts] ", P, " routed pairs exceed one launch");
  const MoeLayout L{P, n_expert, d_model, d_ff};
  int32_t* ws = static_cast<int32_t*>(workspace);
  float* act = reinterpret_cast<float*>(ws + L.act());
  float* y = reinterpret_cast<float*>(ws + L.y());
  moe_sort_kernel<<<1, kThreads, 0, s>>>(ids, int(P), int(n_expert), ws);
  AUGUR_LAUNCHED("moe_experts (sort)");
  const unsigned tiles = unsigned(ceil_div(P, kTM) + n_expert);
  const bool f16 = wt == Half::F16;
  const dim3 g1(tiles, unsigned(ceil_div(d_ff, kTN))), g2(tiles, unsigned(ceil_div(d_model, kTN)));
  if (f16) {
    moe_gemm_kernel<true, true><<<g1, kThreads, 0, s>>>(x, ws, int(P), int(n_expert), int(top_k), gate_up, d_ff,
                                                        d_model, act);
    moe_gemm_kernel<true, false><<<g2, kThreads, 0, s>>>(act, ws, int(P), int(n_expert), int(top_k), down, d_model,
                                                         d_ff, y);
  } else {
    moe_gemm_kernel<false, true><<<g1, kThreads, 0, s>>>(x, ws, int(P), int(n_expert), int(top_k), gate_up, d_ff,
                                                         d_model, act);
    moe_gemm_kernel<false, false><<<g2, kThreads, 0, s>>>(act, ws, int(P), int(n_expert), int(top_k), down, d_model,
                                                          d_ff, y);
  }
  AUGUR_LAUNCHED("moe_experts (gemm)");
  moe_combine_kernel<<<unsigned(n_tokens), kThreads, 0, s>>>(y, ids, weights, ws + L.slot_of(), int(top_k), d_model,
                                                             out);
  AUGUR_LAUNCHED("moe_experts (combine)");
}

}  // namespace augur::cuda
