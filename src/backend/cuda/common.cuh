// Shared by the CUDA kernel files: error checks that throw augur::Error naming
// the call, the Context's definition, and small device helpers (bf16 bits,
// 16-byte loads, warp reductions). Device code only: never include from .cpp.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "backend/cuda/cublaslt.h"
#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace augur::cuda {

[[noreturn]] void throw_cuda(cudaError_t err, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas(cublasStatus_t st, const char* call, const char* file, int line);

}  // namespace augur::cuda

// Every CUDA runtime call goes through AUGUR_CUDA, every cuBLASLt call through
// AUGUR_CUBLAS: a failure throws augur::Error("[cuda] <call>: <reason> (file:line)").
#define AUGUR_CUDA(call)                                                                   \
  do {                                                                                     \
    cudaError_t augur_err_ = (call);                                                       \
    if (augur_err_ != cudaSuccess) ::augur::cuda::throw_cuda(augur_err_, #call, __FILE__, __LINE__); \
  } while (0)
#define AUGUR_CUBLAS(call)                                                                      \
  do {                                                                                          \
    cublasStatus_t augur_st_ = (call);                                                          \
    if (augur_st_ != CUBLAS_STATUS_SUCCESS) ::augur::cuda::throw_cublas(augur_st_, #call, __FILE__, __LINE__); \
  } while (0)
// After each kernel launch: a bad configuration shows up here, named.
#define AUGUR_LAUNCHED(name)                                                                  \
  do {                                                                                        \
    cudaError_t augur_err_ = cudaGetLastError();                                              \
    if (augur_err_ != cudaSuccess) ::augur::cuda::throw_cuda(augur_err_, name, __FILE__, __LINE__); \
  } while (0)

namespace augur::cuda {

// A device allocation owned by one object (Context scratch only; tensors go
// through the engine's allocator).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr, o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A cuBLASLt problem: shape, y's row stride and the operands' alignments
// (packed), which decide the algorithms the heuristic may return.
struct LtAlgoKey {
  int64_t M, N, K, ldy;
  int aligns;
  int f16;  // operands f16 (1) or bf16 (0)
  bool operator<(const LtAlgoKey& o) const {
    return std::tie(M, N, K, ldy, aligns, f16) < std::tie(o.M, o.N, o.K, o.ldy, o.aligns, o.f16);
  }
};

// The process's CUDA state. Scratch buffers are used by one op at a time in
// stream order, so every op that uses them must run on the same stream (or
// the caller serialises streams).
struct Context {
  Context();
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // x converted to bf16 for the tensor-core path; grows on demand (never
  // while a graph is being captured on `s`: it throws then).
  void* bf16_scratch(size_t bytes, Stream s);
  // The chunked delta rule's per-chunk [Q'; W]ᵀ, U, O0, Kd and decay; grows likewise.
  void* delta_rule_scratch(size_t bytes, Stream s);

  int device = 0;
  int sm_count = 0;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  DeviceBuffer lt_workspace;        // kLtWorkspaceBytes for cuBLASLt
  DeviceBuffer splitk_partials;     // kSplitKPartialBytes: skinny-GEMM split-K partial sums
  DeviceBuffer splitk_counters;     // kSplitKCounters int32, zero between launches
  DeviceBuffer attn_counters;       // kAttnCounters int32: flash-decoding split counters, zero between launches
  DeviceBuffer x_bf16;              // grows: bf16 copy of x for cuBLASLt
  DeviceBuffer delta_rule;          // grows: gated_delta_rule_chunked's scratch
  // Counts the reallocations of the growing buffers above: a recorded step
  // holds their addresses, so one recorded before a growth records again.
  std::atomic<uint64_t> scratch_generation{0};

  std::mutex lt_mutex;              // guards lt_algos
  std::map<LtAlgoKey, cublasLtMatmulAlgo_t> lt_algos;

  static constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;
  static constexpr size_t kSplitKPartialBytes = size_t(8) << 20;
  static constexpr int kSplitKCounters = 8192;
  static constexpr int kAttnCounters = 8192;
};

// ---- programmatic dependent launch (Hopper) ---------------------------------
// The decode path's kernels start with pdl_entry(): it waits until the
// previous kernel has finished and its writes are visible, then lets the next
// kernel in the stream begin launching (its blocks become resident and wait in
// their own pdl_wait). Launched through launch() with the
// programmatic-serialization attribute, a kernel's launch latency and its
// prologue (the skinny GEMM's weight prefetch, which reads only weights)
// overlap the previous kernel. Triggering only after the wait keeps at most
// one kernel waiting ahead (triggering first lets whole chains of waiting
// kernels take SM slots, which made batch-1 decode slower). Every kernel
// launched that way must call pdl_wait() before reading or writing memory
// another kernel touches. AUGUR_CUDA_PDL=0 (cuda_settings) drops the attribute.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_entry() {
  pdl_wait();
  pdl_launch_dependents();
}

bool pdl_enabled();  // context.cu: cuda_settings().pdl

#ifdef AUGUR_CUDA_PROFILE
bool skip_kernel(const char* name);  // context.cu: AUGUR_CUDA_SKIP
void timeline_start();               // timeline.cu: AUGUR_CUDA_TIMELINE
#endif

// Every launch asks for all of the SM's memory as shared memory (carveout
// 100%, a launch attribute, so captured graphs keep it): an SM's split is
// fixed when its first block starts, so a block of the next kernel that PDL
// lets in fits beside a stream GEMV's only if the GEMV's launch asked for
// the room (block_tail's last GEMV and the fused RoPE decode attention).
template <typename... Params, typename... Args>
void launch(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
            Args&&... args) {
#ifdef AUGUR_CUDA_PROFILE
  if (skip_kernel(name)) return;
#endif
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
  attr[1].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
  attr[1].val.sharedMemCarveout = 100;
  cfg.attrs = attr;
  cfg.numAttrs = 2;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  if (err != cudaSuccess) throw_cuda(err, name, __FILE__, __LINE__);
  AUGUR_LAUNCHED(name);
}

// ---- device helpers ---------------------------------------------------------

// silu(g) * u, as every SwiGLU path computes it.
__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

__device__ __forceinline__ float bf16_lo(uint32_t packed) { return __uint_as_float(packed << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t packed) { return __uint_as_float(packed & 0xffff0000u); }
__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }

// Round to nearest even, NaN kept quiet: bit-identical to augur::f32_to_bf16.
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
// Two floats as one bf16x2 register (lo in the low half), rounded to nearest even.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return uint32_t(f32_to_bf16_bits(lo)) | (uint32_t(f32_to_bf16_bits(hi)) << 16);
}

// The two 16-bit floats (kernels.h Half) as template flags: F16 true = IEEE
// half, false = bf16. Widening is exact either way; narrowing rounds to
// nearest even, and f16 saturates at +-65504 (NaN stays NaN) rather than
// overflowing to infinity.
constexpr float kF16Max = 65504.0f;
__device__ __forceinline__ float f16_bits_to_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ uint16_t f32_to_f16_bits(float f) {
  const float c = fabsf(f) > kF16Max ? copysignf(kF16Max, f) : f;
  return __half_as_ushort(__float2half_rn(c));
}
template <bool F16>
__device__ __forceinline__ float half_to_f32(uint16_t h) {
  if constexpr (F16) return f16_bits_to_f32(h);
  else return bf16_bits_to_f32(h);
}
template <bool F16>
__device__ __forceinline__ uint16_t f32_to_half(float f) {
  if constexpr (F16) return f32_to_f16_bits(f);
  else return f32_to_bf16_bits(f);
}
// A packed pair (lo in the low half) widened.
template <bool F16>
__device__ __forceinline__ float2 half2_to_float2(uint32_t v) {
  if constexpr (F16) return __half22float2(__halves2half2(__ushort_as_half(uint16_t(v & 0xffffu)), __ushort_as_half(uint16_t(v >> 16))));
  else return make_float2(bf16_lo(v), bf16_hi(v));
}
template <bool F16>
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  return uint32_t(f32_to_half<F16>(lo)) | (uint32_t(f32_to_half<F16>(hi)) << 16);
}
// 8 halves of a 16-byte load, widened. v by value: the caller's load is then
// one 16-byte instruction (through a reference nvcc loaded each 4-byte field
// on its own, four shared loads a row in the stream GEMV).
template <bool F16>
__device__ __forceinline__ void unpack8(const uint4 v, float (&f)[8]) {
  const float2 a = half2_to_float2<F16>(v.x), b = half2_to_float2<F16>(v.y);
  const float2 c = half2_to_float2<F16>(v.z), d = half2_to_float2<F16>(v.w);
  f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y, f[4] = c.x, f[5] = c.y, f[6] = d.x, f[7] = d.y;
}

__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// 16-byte load of data read once (weights, KV): skip L1.
__device__ __forceinline__ uint4 ld_stream16(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// One head of q or k by one warp, as rms_norm_kernel and rope_kernel would:
// x = src[0, D), RMS-normed (x * rsqrt(mean(x^2) + eps) * gain) when gain is
// given, then rotate_half RoPE on dims [0, 2 half) with cs = [cos(half),
// sin(half)]; emit(d, value) for d = lane, lane + 32, ... buf: D floats of
// the warp's shared memory. qkv_rope_store_kernel and the decode attention
// that does its work both go through here, so their q and k are bit-equal.
template <typename Emit>
__device__ __forceinline__ void norm_rope_head(const float* src, int D, const float* gain, float eps,
                                               const float* cs, int half, float* buf, int lane, Emit emit) {
  float ss = 0.f;
  for (int d = lane; d < D; d += 32) {
    const float v = src[d];
    buf[d] = v;
    ss += v * v;
  }
  if (gain != nullptr) {
    ss = warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / float(D) + eps);
    for (int d = lane; d < D; d += 32) buf[d] = gain[d] * (buf[d] * inv);
  }
  __syncwarp();
  for (int d = lane; d < D; d += 32) {
    const float xv = buf[d];
    float r = xv;
    if (d < half) {
      r = __fsub_rn(__fmul_rn(xv, cs[d]), __fmul_rn(buf[d + half], cs[half + d]));
    } else if (d < 2 * half) {
      const int i = d - half;
      r = __fadd_rn(__fmul_rn(xv, cs[i]), __fmul_rn(buf[i], cs[half + i]));
    }
    emit(d, r);
  }
  __syncwarp();  // buf may be refilled by the next head
}

// Element (r, m) of a warp-uniform R x MR tile, on lane r * MR + m (0 on lanes past R * MR).
template <int R, int MR>
__device__ __forceinline__ float lane_element(const float (&acc)[R][MR], int lane) {
  float mine = 0.f;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MR; ++m)
      if (lane == r * MR + m) mine = acc[r][m];
  return mine;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// D += A·B, m16n8k16, bf16 inputs, f32 accumulators (PTX fragment layouts).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// The same with f16 inputs.
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// cp.async (16 bytes, zero-filled when !valid) and ldmatrix, for the tensor-core kernels.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned s = unsigned(__cvta_generic_to_shared(smem));
  const int n = valid ? 16 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n) : "memory");
}
// 4 bytes, through L1 (.cg takes only 16).
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  const unsigned s = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  const unsigned s = unsigned(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  const unsigned s = unsigned(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
template <bool F16>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (F16) mma_f16_16816(d, a, b0, b1);
  else mma_bf16_16816(d, a, b0, b1);
}

// ---- mbarriers and bulk copies (Hopper TMA, 1-D) ------------------------------
// A bulk copy moves a contiguous run of global memory into shared memory on
// the copy engine and counts its bytes on an mbarrier (complete_tx): one
// thread keeps many kilobytes in flight without registers.
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
// Makes initialised mbarriers visible to the copy engine (then __syncthreads).
__device__ __forceinline__ void mbar_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
// One arrival that also expects `bytes` of bulk copies in this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
// Spins until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
// bytes % 16 == 0; both addresses 16-byte aligned.
__device__ __forceinline__ void bulk_copy_g2s(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_u32(smem)),
               "l"(gmem), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
#endif
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
// Blocks of per_block elements covering n (at least one), for a 1-D grid.
inline unsigned blocks_for(int64_t n, int64_t per_block) {
  const int64_t b = ceil_div(n, per_block);
  if (b > int64_t(0x7fffffff)) fail("[cuda] ", n, " elements are too many for one launch");
  return unsigned(b > 1 ? b : 1);
}
__host__ __device__ inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace augur::cuda
