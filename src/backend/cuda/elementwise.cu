// Row-wise and element-wise kernels: embedding, rms_norm, add, swiglu, rope,
// store_kv. Each reproduces its CPU op in backend/cpu/ops_cpu.cpp.
#include <algorithm>

#include "backend/cuda/common.cuh"

namespace augur::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n, int64_t per_block) {
  const int64_t b = ceil_div(n, per_block);
  if (b > int64_t(0x7fffffff)) fail("[cuda] ", n, " elements are too many for one launch");
  return unsigned(std::max<int64_t>(b, 1));
}

// table: [n_vocab, d_model] bf16; ids: [n_tokens]; out: [n_tokens, d_model] f32
__global__ void embedding_kernel(const uint16_t* __restrict__ table, int64_t d_model,
                                 const int32_t* __restrict__ ids, float* __restrict__ out) {
  const int64_t t = blockIdx.x;
  const uint16_t* src = table + int64_t(ids[t]) * d_model;
  float* dst = out + t * d_model;
  if (d_model % 8 == 0 && aligned16(table) && aligned16(out)) {
    for (int64_t i = threadIdx.x * 8; i < d_model; i += blockDim.x * 8) {
      const uint4 v = *reinterpret_cast<const uint4*>(src + i);
      *reinterpret_cast<float4*>(dst + i) = make_float4(bf16_lo(v.x), bf16_hi(v.x), bf16_lo(v.y), bf16_hi(v.y));
      *reinterpret_cast<float4*>(dst + i + 4) =
          make_float4(bf16_lo(v.z), bf16_hi(v.z), bf16_lo(v.w), bf16_hi(v.w));
    }
  } else {
    for (int64_t i = threadIdx.x; i < d_model; i += blockDim.x) dst[i] = bf16_bits_to_f32(src[i]);
  }
}

__device__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < n_warps ? red[lane] : 0.f;
  v = warp_sum(v);
  __syncthreads();  // red may be reused
  return v;
}

// Reference: LlamaRMSNorm.forward. One block per row; x, y: [M, D] (may alias); w: [D]
__global__ void rms_norm_kernel(const float* x, const float* __restrict__ w, float eps, int64_t D, float* y) {
  __shared__ float red[32];
  const float* xr = x + int64_t(blockIdx.x) * D;
  float* yr = y + int64_t(blockIdx.x) * D;
  const bool vec = D % 4 == 0 && aligned16(x) && aligned16(y) && aligned16(w);
  float ss = 0.f;
  if (vec) {
    for (int64_t i = threadIdx.x * 4; i < D; i += blockDim.x * 4) {
      const float4 v = *reinterpret_cast<const float4*>(xr + i);
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) ss += xr[i] * xr[i];
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / float(D) + eps);
  if (vec) {
    for (int64_t i = threadIdx.x * 4; i < D; i += blockDim.x * 4) {
      const float4 v = *reinterpret_cast<const float4*>(xr + i);
      const float4 g = *reinterpret_cast<const float4*>(w + i);
      *reinterpret_cast<float4*>(yr + i) =
          make_float4(g.x * (v.x * inv), g.y * (v.y * inv), g.z * (v.z * inv), g.w * (v.w * inv));
    }
  } else {
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) yr[i] = w[i] * (xr[i] * inv);
  }
}

__global__ void add_kernel(float* __restrict__ a, const float* __restrict__ b, int64_t n, bool vec) {
  const int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (vec && i + 4 <= n) {
    float4 va = *reinterpret_cast<float4*>(a + i);
    const float4 vb = *reinterpret_cast<const float4*>(b + i);
    va.x += vb.x, va.y += vb.y, va.z += vb.z, va.w += vb.w;
    *reinterpret_cast<float4*>(a + i) = va;
  } else {
    for (int64_t j = i; j < i + 4 && j < n; ++j) a[j] += b[j];
  }
}

__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// out = silu(gate) * up; out may alias gate (each element is read before written).
__global__ void swiglu_kernel(const float* gate, const float* __restrict__ up, float* out, int64_t n, bool vec) {
  const int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (vec && i + 4 <= n) {
    const float4 g = *reinterpret_cast<const float4*>(gate + i);
    const float4 u = *reinterpret_cast<const float4*>(up + i);
    *reinterpret_cast<float4*>(out + i) =
        make_float4(silu_mul(g.x, u.x), silu_mul(g.y, u.y), silu_mul(g.z, u.z), silu_mul(g.w, u.w));
  } else {
    for (int64_t j = i; j < i + 4 && j < n; ++j) out[j] = silu_mul(gate[j], up[j]);
  }
}

// Reference: apply_rotary_pos_emb with rotate_half. One block per token;
// angles pos * inv_freq in f32, then cosf / sinf (full-range, like std::cos).
// x: [n_tokens, n_head, head_dim]; inv_freq: [half]; dynamic smem: 2 * half floats
__global__ void rope_kernel(float* __restrict__ x, int64_t n_head, int64_t head_dim,
                            const int32_t* __restrict__ positions, const float* __restrict__ inv_freq,
                            int64_t half) {
  extern __shared__ float cs[];  // [cos(half), sin(half)]
  const int64_t t = blockIdx.x;
  const float pos = float(positions[t]);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = pos * inv_freq[i];
    cs[i] = cosf(angle);
    cs[half + i] = sinf(angle);
  }
  __syncthreads();
  float* xt = x + t * n_head * head_dim;
  for (int64_t j = threadIdx.x; j < n_head * half; j += blockDim.x) {
    const int64_t h = j / half, i = j % half;
    float* v = xt + h * head_dim;
    const float x1 = v[i], x2 = v[i + half];
    const float c = cs[i], s = cs[half + i];
    // Unfused, as the CPU computes it.
    v[i] = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
    v[i + half] = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
  }
}

// k, v: [n_tokens, kv_dim] f32 -> caches [n_slots, kv_dim] bf16 at slot_mapping
// (a negative slot skips the token: padding of a captured batch).
__global__ void store_kv_kernel(const float* __restrict__ k, const float* __restrict__ v, int64_t kv_dim,
                                const int32_t* __restrict__ slot_mapping, uint16_t* __restrict__ k_cache,
                                uint16_t* __restrict__ v_cache, bool vec) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slot_mapping[t];
  if (slot < 0) return;
  const float* ks = k + t * kv_dim;
  const float* vs = v + t * kv_dim;
  uint16_t* kd = k_cache + slot * kv_dim;
  uint16_t* vd = v_cache + slot * kv_dim;
  if (vec) {
    for (int64_t i = threadIdx.x * 4; i < kv_dim; i += blockDim.x * 4) {
      const float4 a = *reinterpret_cast<const float4*>(ks + i);
      const float4 b = *reinterpret_cast<const float4*>(vs + i);
      *reinterpret_cast<uint2*>(kd + i) =
          make_uint2(uint32_t(f32_to_bf16_bits(a.x)) | (uint32_t(f32_to_bf16_bits(a.y)) << 16),
                     uint32_t(f32_to_bf16_bits(a.z)) | (uint32_t(f32_to_bf16_bits(a.w)) << 16));
      *reinterpret_cast<uint2*>(vd + i) =
          make_uint2(uint32_t(f32_to_bf16_bits(b.x)) | (uint32_t(f32_to_bf16_bits(b.y)) << 16),
                     uint32_t(f32_to_bf16_bits(b.z)) | (uint32_t(f32_to_bf16_bits(b.w)) << 16));
    }
  } else {
    for (int64_t i = threadIdx.x; i < kv_dim; i += blockDim.x) {
      kd[i] = f32_to_bf16_bits(ks[i]);
      vd[i] = f32_to_bf16_bits(vs[i]);
    }
  }
}

}  // namespace

void embedding(const bf16_bits* table, int64_t d_model, const int32_t* ids, int64_t n_tokens, float* out,
               Stream s) {
  if (n_tokens <= 0) return;
  embedding_kernel<<<blocks_for(n_tokens, 1), kThreads, 0, s>>>(table, d_model, ids, out);
  AUGUR_LAUNCHED("embedding_kernel");
}

void rms_norm(const float* x, const float* w, float eps, int64_t M, int64_t D, float* y, Stream s) {
  if (M <= 0) return;
  const int threads = D >= 4096 ? 1024 : D >= 1024 ? 512 : kThreads;
  rms_norm_kernel<<<blocks_for(M, 1), threads, 0, s>>>(x, w, eps, D, y);
  AUGUR_LAUNCHED("rms_norm_kernel");
}

void add_inplace(float* a, const float* b, int64_t n, Stream s) {
  if (n <= 0) return;
  const bool vec = aligned16(a) && aligned16(b);
  add_kernel<<<blocks_for(n, kThreads * 4), kThreads, 0, s>>>(a, b, n, vec);
  AUGUR_LAUNCHED("add_kernel");
}

void swiglu(const float* gate, const float* up, float* out, int64_t n, Stream s) {
  if (n <= 0) return;
  const bool vec = aligned16(gate) && aligned16(up) && aligned16(out);
  swiglu_kernel<<<blocks_for(n, kThreads * 4), kThreads, 0, s>>>(gate, up, out, n, vec);
  AUGUR_LAUNCHED("swiglu_kernel");
}

void rope(float* x, int64_t n_tokens, int64_t n_head, int64_t head_dim, const int32_t* positions,
          const float* inv_freq, int64_t half, Stream s) {
  if (n_tokens <= 0 || half <= 0) return;
  if (2 * half > head_dim) fail("[cuda] rope: 2 * half = ", 2 * half, " exceeds head_dim ", head_dim);
  if (half > 4096) fail("[cuda] rope: half = ", half, " too large");
  rope_kernel<<<blocks_for(n_tokens, 1), kThreads, size_t(2 * half) * sizeof(float), s>>>(
      x, n_head, head_dim, positions, inv_freq, half);
  AUGUR_LAUNCHED("rope_kernel");
}

void store_kv(const float* k, const float* v, int64_t kv_dim, const AttnMeta& meta, bf16_bits* k_cache,
              bf16_bits* v_cache, Stream s) {
  if (meta.n_tokens <= 0) return;
  const bool vec = kv_dim % 4 == 0 && aligned16(k) && aligned16(v) && (reinterpret_cast<uintptr_t>(k_cache) & 7) == 0 &&
                   (reinterpret_cast<uintptr_t>(v_cache) & 7) == 0;
  store_kv_kernel<<<blocks_for(meta.n_tokens, 1), 128, 0, s>>>(k, v, kv_dim, meta.slot_mapping, k_cache, v_cache,
                                                               vec);
  AUGUR_LAUNCHED("store_kv_kernel");
}

}  // namespace augur::cuda
