// Internal to the attention files (attention_plan.cu, attention_decode.cu,
// attention_prefill.cu): the batch geometry the kernels read, the device
// helpers they share, the split plan of flash-decoding and the end of a
// flash-decoding block (finish_decode), which the scalar and the
// tensor-core decode kernels both use. Device code only.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <mutex>

#include "backend/cuda/common.cuh"

namespace augur::cuda::attn {

constexpr int kDecodeMaxTokens = 8;     // batches this small always take flash-decoding
constexpr int64_t kMaxPartials = 8192;  // n_tokens * n_head * n_splits bound (workspace size)
constexpr int kMinSplitLen = 64;        // the grid's splits, and a short context's (below kShortContext)
constexpr int kLongSplitLen = 128;      // the shortest split of a longer context
constexpr int kShortContext = 256;
constexpr int kAllSplits = 1 << 30;     // DecodePlan::want: every split min_len keys
constexpr int kMerge1Splits = 16;       // finish_decode's one-trip merge: at most this many splits
constexpr int64_t kOneTripContext = 4096;  // contexts (the plan's bound) that take at most kMerge1Splits splits
constexpr float kLog2e = 1.4426950408889634f;
// Planned splits: n_splits > 1 only while n_tokens * n_head * n_splits <= kMaxPartials,
// so n_tokens * n_head_kv * head passes <= kMaxPartials / 2 counters.
static_assert(Context::kAttnCounters >= kMaxPartials / 2);

// ---- shared helpers ---------------------------------------------------------

__device__ __forceinline__ uint32_t bf16x2_rn(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
// Tensor-core operands (Q, P) in the caches' type.
template <bool F16>
__device__ __forceinline__ uint32_t half2_rn(float lo, float hi) {
  if constexpr (F16) return pack_half2<true>(lo, hi);
  else return bf16x2_rn(lo, hi);
}

struct Geometry {
  const int32_t* positions;
  const int32_t* token_row;
  const int32_t* block_tables;
  int max_blocks;
  int n_tokens;
  int block_size;
  int block_shift;  // log2(block_size) when a power of two (the usual 16), else -1
  int n_head;
  int n_head_kv;
  int group;  // n_head / n_head_kv
  int window;
  float qscale;  // scale * log2(e)
};

__device__ __forceinline__ int first_key(int p, int window) { return window > 0 ? max(0, p - window + 1) : 0; }

// Cache slot of position `pos` of a row (block table `bt`); shifts instead of
// an integer division when the block size is a power of two.
__device__ __forceinline__ int64_t slot_of(const int32_t* bt, int pos, const Geometry& geo) {
  if (geo.block_shift >= 0)
    return (int64_t(__ldg(bt + (pos >> geo.block_shift))) << geo.block_shift) + (pos & (geo.block_size - 1));
  return int64_t(__ldg(bt + pos / geo.block_size)) * geo.block_size + pos % geo.block_size;
}

// ---- flash-decoding ---------------------------------------------------------

template <int D>
struct DecodeCfg {
  static constexpr int kWarps = 4;
  static constexpr int kChunks = D / 8;                        // 16-byte chunks of a key row
  static constexpr int kParts = kChunks < 4 ? kChunks : 4;     // lanes per key, score phase
  static constexpr int kKeys = 32 / kParts;                    // keys per warp per stage
  static constexpr int kStage = kWarps * kKeys;                // keys per block per stage
  static constexpr int kLanesPerRow = kChunks < 32 ? kChunks : 32;  // value phase: lanes across D
  static constexpr int kKeyGroups = 32 / kLanesPerRow;
  static constexpr int kStride = D + 8;                        // halves per smem key row (16-byte pad)
  static constexpr int kDepth = D >= 256 ? 2 : 3;              // stage buffers per warp (4 blocks/SM at D 128)
  static constexpr int kWarpBuf = kDepth * 2 * kKeys * kStride;  // [stage][K|V][key][kStride]
  static_assert(D % 16 == 0 && D <= 256, "head_dim must be a multiple of 16, at most 256");
};

// The split merge: float4 lanes of the GP heads; kGroups threads per lane
// take splits g, g + kGroups, ... and are summed in group order after.
template <int D, int GP>
struct MergeCfg {
  static constexpr int kThreads = DecodeCfg<D>::kWarps * 32;
  static constexpr int kLanes = GP * D / 4;
  static constexpr int kGroups = kLanes >= kThreads ? 1 : kThreads / kLanes;
  static constexpr size_t kFloats = size_t(kGroups) * GP * D + 2 * GP;  // [kGroups][GP][D] sums, [GP] (max, 1/l)
};

template <int D, int GP>
constexpr size_t decode_smem_bytes() {
  using C = DecodeCfg<D>;
  const size_t q = size_t(GP) * D * 4;
  const size_t p = size_t(C::kWarps) * C::kKeys * GP * 4;
  const size_t kv = size_t(C::kWarps) * C::kWarpBuf * 2;
  const size_t red = size_t(C::kWarps) * GP * (D + 2) * 4;
  const size_t merge = MergeCfg<D, GP>::kFloats * 4;
  return q + p + std::max({kv, red, merge});
}

// A token's split length: its context of `span` keys in about `want` splits
// (enough blocks to fill the GPU, each as long as it can be), never shorter
// than the plan's min_len, so it never needs more splits than the grid has.
// A multiple of 64 keys, as the plan's.
__device__ __forceinline__ int token_split_len(int span, int min_len, int want) {
  if (want == kAllSplits) return min_len;  // a forced split length
  // A context the one-trip merge takes whole takes at most its splits,
  // whatever the batch's longest context (want_splits bounds the grid so).
  if (span <= kOneTripContext) want = min(want, kMerge1Splits);
  const int len = ((span + want - 1) / want + 63) / 64 * 64;
  // 64-key splits pay below kShortContext keys (more blocks a KV head) and
  // cost on long contexts (twice the splits to merge), hence kLongSplitLen there.
  return max(len, max(min_len, span < kShortContext ? 0 : kLongSplitLen));
}

// The end of a flash-decoding block, once its warps' results are in smem:
// red_acc [kWarps][GP][D] (unnormalised sums), red_ml [kWarps][GP][2] (m, l;
// log2 domain). Merges the warps, then writes the output (the token's
// context fits this split) or the split's partial; the last block of a
// (token, KV head, head pass) to finish merges the partials. scratch: smem for
// the merge, MergeCfg<D, GP>::kFloats floats (may overlap red_acc).
template <int D, int GP, int kWarps, bool MERGE1 = false>
__device__ void finish_decode(float* scratch, const float* red_acc, const float* red_ml, const Geometry& geo, int t,
                              int p, int lo, int split, int split_len, int n_splits, int h0, int n_heads_here,
                              float* __restrict__ out, float* __restrict__ part_acc, float2* __restrict__ part_ml,
                              int* __restrict__ counters) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const bool whole = p - lo < split_len;  // the whole context is in this split: no merge needed
  const int64_t th0 = int64_t(t) * geo.n_head + h0;  // (token, first head of the block)
  for (int i = tid; i < n_heads_here * D; i += blockDim.x) {
    const int h = i / D, d = i % D;
    float mm = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mm = fmaxf(mm, red_ml[(w * GP + h) * 2]);
    float a = 0.f, ll = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = exp2f(red_ml[(w * GP + h) * 2] - mm);  // a warp without keys has m = -inf: f = 0
      a += f * red_acc[(w * GP + h) * D + d];
      ll += f * red_ml[(w * GP + h) * 2 + 1];
    }
    const int64_t th = th0 + h;
    if (whole) {
      out[th * D + d] = a / ll;
    } else {
      part_acc[(th * n_splits + split) * D + d] = a;
      if (d == 0) part_ml[th * n_splits + split] = make_float2(mm, ll);
    }
  }
  if (whole) return;

  // Count this block in; the last of the n_active blocks of its (token, KV
  // head, head pass) merges. Barrier, then one thread fences and counts (the
  // pattern of cooperative groups' grid sync): the fence before the atomic
  // publishes the block's partials, the one after it orders the other
  // blocks' partials before the merge's loads (__ldcg: from L2, never L1).
  __syncthreads();
  const int n_active = min(n_splits, (p - lo) / split_len + 1);
  int* counter = counters + int64_t(t) * gridDim.y + blockIdx.y;
  bool last = false;
  if (tid == 0) {
    __threadfence();
    last = atomicAdd(counter, 1) == n_active - 1;
    __threadfence();
    if (last) *counter = 0;  // every block has counted; the next launch starts from zero
  }
  if (!__syncthreads_or(last)) return;

  // Merge the splits in split order, whichever block came last: weights
  // w_s = exp2(m_s - max_s m_s), out = sum_s w_s acc_s / sum_s w_s l_s.
  // MERGE1, where a warp holds a head's D / 4 float4 lanes and there are at
  // most kMerge1 splits: every load at once (one round trip to L2, not two),
  // the same arithmetic in the same order as below, so the same bits.
  constexpr int kMerge1 = kMerge1Splits;
  if constexpr (MERGE1 && D == 128) {
    if (n_active <= kMerge1 && n_heads_here <= kWarps) {
      if (warp >= n_heads_here) return;
      const int64_t th = th0 + warp;
      const float2* ml = part_ml + th * n_splits;
      const float* pacc = part_acc + th * n_splits * D + lane * 4;
      const float2 v0 = lane < n_active ? __ldcg(ml + lane) : make_float2(-INFINITY, 0.f);
      float4 acc[kMerge1];
#pragma unroll
      for (int s = 0; s < kMerge1; ++s)
        if (s < n_active) acc[s] = __ldcg(reinterpret_cast<const float4*>(pacc + int64_t(s) * D));
      const float mx = warp_max(v0.x);
      const float ll = warp_sum(lane < n_active ? exp2f(v0.x - mx) * v0.y : 0.f);
      const float inv = 1.0f / ll;
      float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int s = 0; s < kMerge1; ++s) {
        const float m_s = __shfl_sync(0xffffffffu, v0.x, s);
        if (s < n_active) {
          const float w = exp2f(m_s - mx);
          a.x += w * acc[s].x, a.y += w * acc[s].y, a.z += w * acc[s].z, a.w += w * acc[s].w;
        }
      }
      *reinterpret_cast<float4*>(out + th * D + lane * 4) = make_float4(a.x * inv, a.y * inv, a.z * inv, a.w * inv);
      return;
    }
  }
  using M = MergeCfg<D, GP>;
  float* sums = scratch;  // [kGroups][GP][D]
  float* stat = sums + M::kGroups * GP * D;    // [GP] (max, 1 / l)
  for (int h = warp; h < n_heads_here; h += kWarps) {
    const float2* ml = part_ml + (th0 + h) * n_splits;
    const float2 v0 = lane < n_active ? __ldcg(ml + lane) : make_float2(-INFINITY, 0.f);
    float mx = v0.x;
    for (int s = lane + 32; s < n_active; s += 32) mx = fmaxf(mx, __ldcg(&ml[s].x));
    mx = warp_max(mx);
    float ll = lane < n_active ? exp2f(v0.x - mx) * v0.y : 0.f;
    for (int s = lane + 32; s < n_active; s += 32) {
      const float2 v = __ldcg(ml + s);
      ll += exp2f(v.x - mx) * v.y;
    }
    ll = warp_sum(ll);
    if (lane == 0) stat[2 * h] = mx, stat[2 * h + 1] = 1.0f / ll;
  }
  __syncthreads();
  // Thread (group, lane): float4 lane of the GP x D outputs, splits group, group + kGroups, ...
  const int group = tid / M::kLanes;
  for (int i = tid % M::kLanes; i < M::kLanes; i += M::kThreads) {
    const int h = i / (D / 4), d = (i % (D / 4)) * 4;
    if (h >= n_heads_here) continue;
    const float mx = stat[2 * h];
    const float2* ml = part_ml + (th0 + h) * n_splits;
    const float* pacc = part_acc + (th0 + h) * n_splits * D + d;
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8  // 16 loads in flight: at context 8192 one thread walks 65 splits
    for (int s = group; s < n_active; s += M::kGroups) {
      const float w = exp2f(__ldcg(&ml[s].x) - mx);  // bit-equal to the weight in stat's sum
      const float4 v = __ldcg(reinterpret_cast<const float4*>(pacc + int64_t(s) * D));
      a.x += w * v.x, a.y += w * v.y, a.z += w * v.z, a.w += w * v.w;
    }
    if constexpr (M::kGroups == 1) {
      const float inv = stat[2 * h + 1];
      *reinterpret_cast<float4*>(out + (th0 + h) * D + d) = make_float4(a.x * inv, a.y * inv, a.z * inv, a.w * inv);
    } else {
      *reinterpret_cast<float4*>(sums + (group * GP + h) * D + d) = a;
    }
  }
  if constexpr (M::kGroups > 1) {
    __syncthreads();
    for (int i = tid; i < n_heads_here * D; i += M::kThreads) {
      float a = 0.f;
      for (int g = 0; g < M::kGroups; ++g) a += sums[g * GP * D + i];
      out[th0 * D + i] = a * stat[2 * (i / D) + 1];
    }
  }
}

// q, out: [n_tokens, n_head, D] f32; caches: [n_blocks, block_size, n_head_kv, D] bf16 or f16;
// part_acc: [n_tokens, n_head, n_splits, D]; part_ml: [n_tokens, n_head, n_splits] (m, l), log2 domain;

// ---- planning (attention_plan.cu) ----------------------------------------------

struct DecodePlan {
  int n_splits;
  int split_len;  // the shortest split; a token's own is token_split_len
  int want;       // splits a token's context is cut into (each at least split_len); 0: by occupancy
  int rows;       // the rows (sequences) the occupancy counts
};
// The rows a batch's plan counts: its rows, not its tokens, so that the
// 1 + k tokens a row of a verify step are cut into the splits a decode
// step's one token is (their results bit-equal). n_rows 0: unknown, the tokens.
int64_t plan_rows(int64_t n_tokens, int64_t n_rows);
// The grid's splits for a batch, from sizes only (a graph replays at any position).
DecodePlan plan_decode(int64_t rows, int64_t n_head, int64_t max_context);
// Splits a token's context is cut into, for blocks_per_split blocks a row and split.
int want_splits(int64_t rows, int64_t blocks_per_split, const DecodePlan& plan);
// The tensor-core decode kernel takes groups of at most 16 query heads a KV head.
bool use_decode_tc(int group);
// Checks the arguments of an attention launch; the geometry the kernels read.
Geometry check_geometry(const float* q, const half_bits* k_cache, const half_bits* v_cache, int64_t block_size,
                        int64_t n_head, int64_t n_head_kv, const AttnMeta& meta, float scale, int32_t window,
                        const float* out);

template <typename Kernel>
void set_smem(Kernel kernel, size_t bytes, std::once_flag& once) {
  std::call_once(once, [&] {
    AUGUR_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  });
}

// ---- the kernels' launchers ------------------------------------------------------

// Flash-decoding (attention_decode.cu) over the plan: the tensor-core kernel
// where use_decode_tc, else the scalar one.
void decode(const float* q, const half_bits* k_cache, const half_bits* v_cache, const Geometry& geo,
            const DecodePlan& plan, int64_t head_dim, float* out, void* workspace, Stream s, Half kv);
// The tiled tensor-core prefill (attention_prefill.cu).
void prefill(const float* q, const half_bits* k_cache, const half_bits* v_cache, const Geometry& geo,
             int64_t head_dim, float* out, Stream s, Half kv);

}  // namespace augur::cuda::attn
