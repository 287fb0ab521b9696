// Row-wise and element-wise kernels: embedding, rms_norm, add, swiglu, rope,
// store_kv, and the decoder's fused forms of them (add_rms_norm,
// swiglu_packed, qkv_rope_store). Each reproduces its CPU op in
// backend/cpu/ops_cpu.cpp.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "backend/cuda/common.cuh"

namespace augur::cuda {
namespace {

constexpr int kThreads = 256;
// Threads of a row-wise kernel's block (one block a row of D).
int row_threads(int64_t D) { return D >= 4096 ? 1024 : D >= 1024 ? 512 : kThreads; }

// table: [n_vocab, d_model] bf16 or f16; ids: [n_tokens]; out: [n_tokens, d_model] f32
template <bool F16>
__global__ void embedding_kernel(const uint16_t* __restrict__ table, int64_t d_model,
                                 const int32_t* __restrict__ ids, float* __restrict__ out) {
  pdl_entry();
  const int64_t t = blockIdx.x;
  const uint16_t* src = table + int64_t(ids[t]) * d_model;
  float* dst = out + t * d_model;
  if (d_model % 8 == 0 && aligned16(table) && aligned16(out)) {
    for (int64_t i = threadIdx.x * 8; i < d_model; i += blockDim.x * 8) {
      const uint4 v = *reinterpret_cast<const uint4*>(src + i);
      float f[8];
      unpack8<F16>(v, f);
      *reinterpret_cast<float4*>(dst + i) = make_float4(f[0], f[1], f[2], f[3]);
      *reinterpret_cast<float4*>(dst + i + 4) = make_float4(f[4], f[5], f[6], f[7]);
    }
  } else {
    for (int64_t i = threadIdx.x; i < d_model; i += blockDim.x) dst[i] = half_to_f32<F16>(src[i]);
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

// Where a row-wise kernel's f32 results go: T = float keeps them; T =
// uint16_t rounds them to bf16 (F16: f16) for a tensor-core matmul's input,
// the bits to_half would make of the f32 results (gemm_lt.cu), without the
// f32 copy's write and read.
template <typename T, bool F16>
__device__ __forceinline__ void store1(T* p, float v) {
  if constexpr (std::is_same_v<T, float>)
    *p = v;
  else
    *p = f32_to_half<F16>(v);
}
template <typename T, bool F16>
__device__ __forceinline__ void store4(T* p, float4 v) {
  if constexpr (std::is_same_v<T, float>)
    *reinterpret_cast<float4*>(p) = v;
  else
    *reinterpret_cast<uint2*>(p) = make_uint2(pack_half2<F16>(v.x, v.y), pack_half2<F16>(v.z, v.w));
}

// Reference: LlamaRMSNorm.forward. One block per row; x, y: [M, D] (may alias when T is float); w: [D]
template <typename T, bool F16>
__global__ void rms_norm_kernel(const float* x, const float* __restrict__ w, float eps, int64_t D, T* y) {
  pdl_entry();
  __shared__ float red[32];
  const float* xr = x + int64_t(blockIdx.x) * D;
  T* yr = y + int64_t(blockIdx.x) * D;
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
      store4<T, F16>(yr + i, make_float4(g.x * (v.x * inv), g.y * (v.y * inv), g.z * (v.z * inv), g.w * (v.w * inv)));
    }
  } else {
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) store1<T, F16>(yr + i, w[i] * (xr[i] * inv));
  }
}

__global__ void add_kernel(float* __restrict__ a, const float* __restrict__ b, int64_t n, bool vec) {
  pdl_entry();
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

// out = silu(gate) * up; out may alias gate (each element is read before written).
__global__ void swiglu_kernel(const float* gate, const float* __restrict__ up, float* out, int64_t n, bool vec) {
  pdl_entry();
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
  pdl_entry();
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

// k, v: [n_tokens, kv_dim] f32 -> caches [n_slots, kv_dim] bf16 or f16 at slot_mapping
// (a negative slot skips the token: padding of a captured batch).
template <bool F16>
__global__ void store_kv_kernel(const float* __restrict__ k, const float* __restrict__ v, int64_t kv_dim,
                                const int32_t* __restrict__ slot_mapping, uint16_t* __restrict__ k_cache,
                                uint16_t* __restrict__ v_cache, bool vec) {
  pdl_entry();
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
      *reinterpret_cast<uint2*>(kd + i) = make_uint2(pack_half2<F16>(a.x, a.y), pack_half2<F16>(a.z, a.w));
      *reinterpret_cast<uint2*>(vd + i) = make_uint2(pack_half2<F16>(b.x, b.y), pack_half2<F16>(b.z, b.w));
    }
  } else {
    for (int64_t i = threadIdx.x; i < kv_dim; i += blockDim.x) {
      kd[i] = f32_to_half<F16>(ks[i]);
      vd[i] = f32_to_half<F16>(vs[i]);
    }
  }
}

// x += o, then h = rms_norm(x) * w. One block per row; x, o, h: [M, D]; w: [D]
template <typename T, bool F16>
__global__ void add_rms_norm_kernel(float* __restrict__ x, const float* __restrict__ o, const float* __restrict__ w,
                                    float eps, int64_t D, T* __restrict__ h, bool vec) {
  pdl_entry();
  __shared__ float red[32];
  float* xr = x + int64_t(blockIdx.x) * D;
  const float* orow = o + int64_t(blockIdx.x) * D;
  T* hr = h + int64_t(blockIdx.x) * D;
  float ss = 0.f;
  if (vec) {
    for (int64_t i = threadIdx.x * 4; i < D; i += blockDim.x * 4) {
      float4 v = *reinterpret_cast<const float4*>(xr + i);
      const float4 b = *reinterpret_cast<const float4*>(orow + i);
      v.x += b.x, v.y += b.y, v.z += b.z, v.w += b.w;
      *reinterpret_cast<float4*>(xr + i) = v;
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
      const float v = xr[i] + orow[i];
      xr[i] = v;
      ss += v * v;
    }
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / float(D) + eps);
  // Each thread reads back only what it wrote above.
  if (vec) {
    for (int64_t i = threadIdx.x * 4; i < D; i += blockDim.x * 4) {
      const float4 v = *reinterpret_cast<const float4*>(xr + i);
      const float4 g = *reinterpret_cast<const float4*>(w + i);
      store4<T, F16>(hr + i, make_float4(g.x * (v.x * inv), g.y * (v.y * inv), g.z * (v.z * inv), g.w * (v.w * inv)));
    }
  } else {
    for (int64_t i = threadIdx.x; i < D; i += blockDim.x) store1<T, F16>(hr + i, w[i] * (xr[i] * inv));
  }
}

// out[m, i] = silu(gu[m, i]) * gu[m, D + i]. gu: [M, 2D]; out: [M, D]; n = M * D
template <typename T, bool F16>
__global__ void swiglu_packed_kernel(const float* __restrict__ gu, int64_t D, int64_t n, T* __restrict__ out,
                                     bool vec) {
  pdl_entry();
  const int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (vec && i + 4 <= n) {
    const int64_t m = i / D, c = i % D;  // D % 4 == 0: the 4 stay in one row
    const float* g = gu + m * 2 * D + c;
    const float4 a = *reinterpret_cast<const float4*>(g);
    const float4 b = *reinterpret_cast<const float4*>(g + D);
    store4<T, F16>(out + i, make_float4(silu_mul(a.x, b.x), silu_mul(a.y, b.y), silu_mul(a.z, b.z), silu_mul(a.w, b.w)));
  } else {
    for (int64_t j = i; j < i + 4 && j < n; ++j) {
      const int64_t m = j / D, c = j % D;
      store1<T, F16>(out + j, silu_mul(gu[m * 2 * D + c], gu[m * 2 * D + D + c]));
    }
  }
}

// Grid (token, group of heads), one warp per head: q and k heads are
// normed (optional), rotated and written; v heads are stored. The head goes
// through the warp's smem row so that rotate_half can read its partner.
// qkv: [n_tokens, n_head * q_stride + 2 n_head_kv * D], q_stride D, or 2 D when
// each query head is followed by its output gate (gate_out non-null: the
// gates are copied there, [n_tokens, n_head, D]). Dynamic smem: 2 * half +
// (2 * D with the norms) + warps * D floats.
// Before its PDL wait a block reads what no earlier kernel writes (the
// layout goes up before the step's first kernel; the rest are weights): its
// position's cos/sin, its slot and the norm gains, so that after the wait
// only the projection's load is a trip to memory.
template <bool F16>
__global__ void qkv_rope_store_kernel(const float* __restrict__ qkv, int n_head, int n_head_kv, int D,
                                      const float* __restrict__ q_norm, const float* __restrict__ k_norm, float eps,
                                      const int32_t* __restrict__ positions, const int32_t* __restrict__ slot_mapping,
                                      const float* __restrict__ inv_freq, int half, float* __restrict__ q_out,
                                      uint16_t* __restrict__ k_cache, uint16_t* __restrict__ v_cache,
                                      float* __restrict__ gate_out) {
  extern __shared__ float smem[];
  float* cs = smem;             // [cos(half), sin(half)]
  float* gains = cs + 2 * half;  // [q_norm(D), k_norm(D)] when given
  const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  const float pos = float(positions[t]);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = pos * inv_freq[i];
    cs[i] = cosf(angle);
    cs[half + i] = sinf(angle);
  }
  if (q_norm != nullptr)
    for (int i = threadIdx.x; i < D; i += blockDim.x) gains[i] = q_norm[i], gains[D + i] = k_norm[i];
  const int64_t slot = slot_mapping[t];
  pdl_entry();
  __syncthreads();
  float* buf = gains + (q_norm != nullptr ? 2 * D : 0) + warp * D;
  const float* qg = q_norm != nullptr ? gains : nullptr;
  const float* kg = q_norm != nullptr ? gains + D : nullptr;
  const int n_total = n_head + 2 * n_head_kv;
  const int64_t kv_dim = int64_t(n_head_kv) * D, q_stride = gate_out != nullptr ? 2 * D : D;
  const float* row = qkv + int64_t(t) * (n_head * q_stride + 2 * kv_dim);
  for (int hh = int(blockIdx.y) * n_warps + warp; hh < n_total; hh += int(gridDim.y) * n_warps) {
    const float* src = hh < n_head ? row + hh * q_stride : row + n_head * q_stride + int64_t(hh - n_head) * D;
    if (hh < n_head && gate_out != nullptr) {
      float* g = gate_out + (int64_t(t) * n_head + hh) * D;
      for (int d = lane; d < D; d += 32) g[d] = src[D + d];
    }
    if (hh >= n_head + n_head_kv) {  // v head
      if (slot >= 0) {
        uint16_t* dst = v_cache + slot * kv_dim + int64_t(hh - n_head - n_head_kv) * D;
        for (int d = lane; d < D; d += 32) dst[d] = f32_to_half<F16>(src[d]);
      }
      continue;
    }
    const bool is_q = hh < n_head;
    if (!is_q && slot < 0) continue;
    norm_rope_head(src, D, is_q ? qg : kg, eps, cs, half, buf, lane, [&](int d, float r) {
      if (is_q)
        q_out[(int64_t(t) * n_head + hh) * D + d] = r;
      else
        k_cache[slot * kv_dim + int64_t(hh - n_head) * D + d] = f32_to_half<F16>(r);
    });
  }
}

// dst[i] = src[i] from one 16-bit float to the other (f16 saturates).
template <bool FromF16, bool ToF16>
__global__ void convert_half_kernel(const uint16_t* __restrict__ src, uint16_t* __restrict__ dst, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = f32_to_half<ToF16>(half_to_f32<FromF16>(src[i]));
}

// *out = max |src[i]| (NaN ignored) as the bits of a non-negative float, by atomicMax.
template <bool F16>
__global__ void max_abs_half_kernel(const uint16_t* __restrict__ src, int64_t n, unsigned* __restrict__ out) {
  float m = 0.f;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = fabsf(half_to_f32<F16>(src[i]));
    if (v > m) m = v;  // NaN compares false
  }
  m = warp_max(m);
  if ((threadIdx.x & 31) == 0) atomicMax(out, __float_as_uint(m));
}

}  // namespace

void embedding(const half_bits* table, int64_t d_model, const int32_t* ids, int64_t n_tokens, float* out,
               Stream s, Half t) {
  if (n_tokens <= 0) return;
  launch("embedding_kernel", t == Half::F16 ? embedding_kernel<true> : embedding_kernel<false>,
         dim3(blocks_for(n_tokens, 1)), dim3(kThreads), 0, s, table, d_model, ids, out);
}

void convert_half(const half_bits* src, Half from, half_bits* dst, Half to, int64_t n, Stream s) {
  if (n <= 0) return;
  const unsigned blocks = unsigned(std::min<int64_t>(ceil_div(n, kThreads), 65536));
  const bool a = from == Half::F16, b = to == Half::F16;
  if (a && b) convert_half_kernel<true, true><<<blocks, kThreads, 0, s>>>(src, dst, n);
  else if (a) convert_half_kernel<true, false><<<blocks, kThreads, 0, s>>>(src, dst, n);
  else if (b) convert_half_kernel<false, true><<<blocks, kThreads, 0, s>>>(src, dst, n);
  else convert_half_kernel<false, false><<<blocks, kThreads, 0, s>>>(src, dst, n);
  AUGUR_LAUNCHED("convert_half_kernel");
}

float max_abs_half(const half_bits* src, Half t, int64_t n, Stream s) {
  if (n <= 0) return 0.f;
  DeviceBuffer result(sizeof(unsigned));
  AUGUR_CUDA(cudaMemsetAsync(result.get(), 0, sizeof(unsigned), s));
  const unsigned blocks = unsigned(std::min<int64_t>(ceil_div(n, kThreads), 4096));
  auto* out = static_cast<unsigned*>(result.get());
  if (t == Half::F16)
    max_abs_half_kernel<true><<<blocks, kThreads, 0, s>>>(src, n, out);
  else
    max_abs_half_kernel<false><<<blocks, kThreads, 0, s>>>(src, n, out);
  AUGUR_LAUNCHED("max_abs_half_kernel");
  unsigned bits = 0;
  AUGUR_CUDA(cudaMemcpyAsync(&bits, out, sizeof(bits), cudaMemcpyDeviceToHost, s));
  AUGUR_CUDA(cudaStreamSynchronize(s));
  float m;
  std::memcpy(&m, &bits, sizeof(m));
  return m;
}

void rms_norm(const float* x, const float* w, float eps, int64_t M, int64_t D, float* y, Stream s) {
  if (M <= 0) return;
  launch("rms_norm_kernel", rms_norm_kernel<float, false>, dim3(blocks_for(M, 1)), dim3(row_threads(D)), 0, s, x, w,
         eps, D, y);
}

void rms_norm_half(const float* x, const float* w, float eps, int64_t M, int64_t D, Half t, half_bits* y, Stream s) {
  if (M <= 0) return;
  auto kernel = t == Half::F16 ? rms_norm_kernel<uint16_t, true> : rms_norm_kernel<uint16_t, false>;
  launch("rms_norm_kernel", kernel, dim3(blocks_for(M, 1)), dim3(row_threads(D)), 0, s, x, w, eps, D, y);
}

void add_inplace(float* a, const float* b, int64_t n, Stream s) {
  if (n <= 0) return;
  const bool vec = aligned16(a) && aligned16(b);
  launch("add_kernel", add_kernel, dim3(blocks_for(n, kThreads * 4)), dim3(kThreads), 0, s, a, b, n, vec);
}

void swiglu(const float* gate, const float* up, float* out, int64_t n, Stream s) {
  if (n <= 0) return;
  const bool vec = aligned16(gate) && aligned16(up) && aligned16(out);
  launch("swiglu_kernel", swiglu_kernel, dim3(blocks_for(n, kThreads * 4)), dim3(kThreads), 0, s, gate, up, out, n,
         vec);
}

void rope(float* x, int64_t n_tokens, int64_t n_head, int64_t head_dim, const int32_t* positions,
          const float* inv_freq, int64_t half, Stream s) {
  if (n_tokens <= 0 || half <= 0) return;
  if (2 * half > head_dim) fail("[cuda] rope: 2 * half = ", 2 * half, " exceeds head_dim ", head_dim);
  if (half > 4096) fail("[cuda] rope: half = ", half, " too large");
  launch("rope_kernel", rope_kernel, dim3(blocks_for(n_tokens, 1)), dim3(kThreads), size_t(2 * half) * sizeof(float),
         s, x, n_head, head_dim, positions, inv_freq, half);
}

void store_kv(const float* k, const float* v, int64_t kv_dim, const AttnMeta& meta, half_bits* k_cache,
              half_bits* v_cache, Stream s, Half kv) {
  if (meta.n_tokens <= 0) return;
  const bool vec = kv_dim % 4 == 0 && aligned16(k) && aligned16(v) && (reinterpret_cast<uintptr_t>(k_cache) & 7) == 0 &&
                   (reinterpret_cast<uintptr_t>(v_cache) & 7) == 0;
  auto kernel = kv == Half::F16 ? store_kv_kernel<true> : store_kv_kernel<false>;
  launch("store_kv_kernel", kernel, dim3(blocks_for(meta.n_tokens, 1)), dim3(128), 0, s, k, v, kv_dim,
         meta.slot_mapping, k_cache, v_cache, vec);
}

void add_rms_norm(float* x, const float* o, const float* w, float eps, int64_t M, int64_t D, float* h, Stream s) {
  if (M <= 0) return;
  const bool vec = D % 4 == 0 && aligned16(x) && aligned16(o) && aligned16(w) && aligned16(h);
  launch("add_rms_norm_kernel", add_rms_norm_kernel<float, false>, dim3(blocks_for(M, 1)), dim3(row_threads(D)), 0, s,
         x, o, w, eps, D, h, vec);
}

void add_rms_norm_half(float* x, const float* o, const float* w, float eps, int64_t M, int64_t D, Half t,
                       half_bits* h, Stream s) {
  if (M <= 0) return;
  const bool vec = D % 4 == 0 && aligned16(x) && aligned16(o) && aligned16(w) && aligned16(h);
  auto kernel = t == Half::F16 ? add_rms_norm_kernel<uint16_t, true> : add_rms_norm_kernel<uint16_t, false>;
  launch("add_rms_norm_kernel", kernel, dim3(blocks_for(M, 1)), dim3(row_threads(D)), 0, s, x, o, w, eps, D, h, vec);
}

void swiglu_packed(const float* gate_up, int64_t M, int64_t D, float* out, Stream s) {
  const int64_t n = M * D;
  if (n <= 0) return;
  const bool vec = D % 4 == 0 && aligned16(gate_up) && aligned16(out);
  launch("swiglu_packed_kernel", swiglu_packed_kernel<float, false>, dim3(blocks_for(n, kThreads * 4)),
         dim3(kThreads), 0, s, gate_up, D, n, out, vec);
}

void swiglu_packed_half(const float* gate_up, int64_t M, int64_t D, Half t, half_bits* out, Stream s) {
  const int64_t n = M * D;
  if (n <= 0) return;
  const bool vec = D % 4 == 0 && aligned16(gate_up) && aligned16(out);
  auto kernel = t == Half::F16 ? swiglu_packed_kernel<uint16_t, true> : swiglu_packed_kernel<uint16_t, false>;
  launch("swiglu_packed_kernel", kernel, dim3(blocks_for(n, kThreads * 4)), dim3(kThreads), 0, s, gate_up, D, n, out,
         vec);
}

void qkv_rope_store(const float* qkv, int64_t n_head, int64_t n_head_kv, int64_t head_dim, const float* q_norm,
                    const float* k_norm, float eps, const float* inv_freq, int64_t half, const AttnMeta& meta,
                    float* q_out, half_bits* k_cache, half_bits* v_cache, Stream s, Half kv, float* gate_out) {
  if (meta.n_tokens <= 0) return;
  if (2 * half > head_dim) fail("[cuda] qkv_rope_store: 2 * half = ", 2 * half, " exceeds head_dim ", head_dim);
  if (head_dim > 1024 || n_head + 2 * n_head_kv > 65536)
    fail("[cuda] qkv_rope_store: head_dim ", head_dim, " or ", n_head, " + 2 x ", n_head_kv, " heads too large");
  // Grid (token, group of 4 heads), a warp per head: at batch 1 one block
  // walking all heads is a long chain of dependent steps.
  if ((q_norm == nullptr) != (k_norm == nullptr)) fail("[cuda] qkv_rope_store: q_norm and k_norm go together");
  constexpr int warps = 4;
  const size_t smem = size_t(2 * half + (q_norm != nullptr ? 2 : 0) * head_dim + warps * head_dim) * sizeof(float);
  auto kernel = kv == Half::F16 ? qkv_rope_store_kernel<true> : qkv_rope_store_kernel<false>;
  const dim3 grid(blocks_for(meta.n_tokens, 1), unsigned(ceil_div(n_head + 2 * n_head_kv, warps)));
  launch("qkv_rope_store_kernel", kernel, grid, dim3(warps * 32), smem, s, qkv,
         int(n_head), int(n_head_kv), int(head_dim), q_norm, k_norm, eps, meta.positions, meta.slot_mapping, inv_freq,
         int(half), q_out, k_cache, v_cache, gate_out);
}

}  // namespace augur::cuda
