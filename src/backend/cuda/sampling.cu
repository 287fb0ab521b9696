// Sampling on the GPU, so only token ids cross to the host.
#include "backend/cuda/common.cuh"

namespace augur::cuda {
namespace {

constexpr int kThreads = 1024;

// a beats b: larger value, or the same value at a smaller index (torch.argmax,
// runtime/sampler.cpp argmax). NaN never beats anything.
__device__ __forceinline__ bool better(float va, int ia, float vb, int ib) {
  return va > vb || (va == vb && ia < ib);
}

// One block per row. logits: [n_rows, n_vocab]; out: [n_rows]
__global__ void __launch_bounds__(kThreads) argmax_kernel(const float* __restrict__ logits, int64_t n_vocab,
                                                          int32_t* __restrict__ out) {
  __shared__ float sv[32];
  __shared__ int si[32];
  const float* row = logits + int64_t(blockIdx.x) * n_vocab;
  float bv = -INFINITY;
  int bi = int(n_vocab);  // loses to any real index
  for (int64_t i = threadIdx.x; i < n_vocab; i += blockDim.x) {
    const float v = row[i];
    if (better(v, int(i), bv, bi)) bv = v, bi = int(i);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sv[warp] = bv, si[warp] = bi;
  __syncthreads();
  if (warp == 0) {
    const int n_warps = int(blockDim.x >> 5);
    bv = lane < n_warps ? sv[lane] : -INFINITY;
    bi = lane < n_warps ? si[lane] : int(n_vocab);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    // All -inf or NaN: index 0, as the CPU loop (which starts at 0) returns.
    if (lane == 0) out[blockIdx.x] = bi < n_vocab ? bi : 0;
  }
}

}  // namespace

void argmax(const float* logits, int64_t n_rows, int64_t n_vocab, int32_t* out, Stream s) {
  if (n_rows <= 0) return;
  if (n_vocab <= 0 || n_vocab >= (int64_t(1) << 31)) fail("[cuda] argmax: bad n_vocab ", n_vocab);
  if (n_rows > 0x7fffffff) fail("[cuda] argmax: too many rows ", n_rows);
  argmax_kernel<<<unsigned(n_rows), kThreads, 0, s>>>(logits, n_vocab, out);
  AUGUR_LAUNCHED("argmax_kernel");
}

}  // namespace augur::cuda
