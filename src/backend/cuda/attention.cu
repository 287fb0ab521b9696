// Causal GQA attention over the paged KV cache (bf16 or f16: the F16 template flag).
//
// Decode (few tokens, or one token per row): flash-decoding. Grid
// (n_splits, n_head_kv * head passes, n_tokens); block = 4 warps, one KV head
// and up to GP of its query heads, so K and V are read once per group. The
// context [lo, p] of a token is cut into splits from lo, their length from
// the token's own context (token_split_len: few long splits that still fill
// the GPU; the grid is sized by the plan, so a graph replays at any position);
// each warp streams its own keys of each stage into a private ring of kDepth
// stage buffers with cp.async (kDepth - 1 stages in flight while it computes
// one) and keeps its own online softmax (m, l, acc), so warps never wait on
// each other until the end, where the block merges its 4 warps and writes
// either the output (the token's context fits one split) or a partial
// (acc, m, l). The last block of a (token, KV head, head pass) to write its
// partial (a counter per triple, as the split-K GEMV in gemv.cu) merges all
// the splits in split order and writes the output: one launch, deterministic,
// counters left at zero for the next launch or graph replay. Grid sizes
// depend only on sizes, never on positions: a split with no keys exits at once.
// decode_attention_rope (batch 1 by default, AUGUR_CUDA_ATTN_ROPE; pure decode batches): the
// tensor-core decode kernel takes the q/k/v projection and does
// qkv_rope_store's work itself (see RopeArgs).
//
// Prefill (many tokens): FlashAttention-2 on mma.m16n8k16. A block takes 128
// query rows = consecutive tokens x the G query heads of one KV head (GQA
// packing: K/V tiles are loaded once for all G heads), walks the KV tiles of
// the keys its tokens see with a cp.async double buffer, and keeps the online
// softmax in registers. Q (pre-scaled by scale * log2 e) and P are rounded
// to the caches' type for the tensor cores. Tokens of different rows in one tile are
// handled as segments, one pass each.
//
// Reference for both: eager_attention_forward (backend/cpu/ops_cpu.cpp).
#include <cuda_bf16.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/detail.h"
#include "backend/cuda/stamps.cuh"

namespace augur::cuda {
namespace {

constexpr int kDecodeMaxTokens = 8;
constexpr int64_t kMaxPartials = 8192;  // n_tokens * n_head * n_splits bound (workspace size)
constexpr int kMinSplitLen = 64;     // the grid's splits, and a short context's (below kShortContext)
constexpr int kLongSplitLen = 128;   // the shortest split of a longer context
constexpr int kShortContext = 256;
constexpr int kAllSplits = 1 << 30;  // DecodePlan::want: every split min_len keys
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
  const int len = ((span + want - 1) / want + 63) / 64 * 64;
  // 64-key splits pay at 128 keys (2-3 blocks a KV head instead of 1: batch 1
  // 4.612 vs 4.635 ms a step, and 4.62 vs 4.71 in an earlier call) and cost
  // at 2048 (33 splits instead of 17: 4.91 vs 4.78), hence kShortContext.
  return max(len, max(min_len, span < kShortContext ? 0 : kLongSplitLen));
}

// The end of a flash-decoding block, once its warps' results are in smem:
// red_acc [kWarps][GP][D] (unnormalised sums), red_ml [kWarps][GP][2] (m, l;
// log2 domain). Merges the warps, then writes the output (the token's
// context fits this split) or the split's partial; the last block of a
// (token, KV head, head pass) to finish merges the partials. scratch: smem for
// the merge, MergeCfg<D, GP>::kFloats floats (may overlap red_acc).
constexpr int kMerge1Splits = 16;  // finish_decode's one-trip merge: at most this many splits
constexpr int64_t kOneTripContext = 4096;  // contexts (the plan's bound) that take at most kMerge1Splits splits

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
// counters: [n_tokens, n_head_kv * n_hpass] blocks arrived, zero between launches.
template <int D, int GP, bool F16>
__global__ void __launch_bounds__(128) decode_kernel(const float* __restrict__ q, const uint16_t* __restrict__ k_cache,
                                                     const uint16_t* __restrict__ v_cache, Geometry geo, int min_len,
                                                     int want, int n_splits, int n_hpass, float* __restrict__ out,
                                                     float* __restrict__ part_acc, float2* __restrict__ part_ml,
                                                     int* __restrict__ counters) {
  using C = DecodeCfg<D>;
  extern __shared__ __align__(16) unsigned char smem[];
  float* qs = reinterpret_cast<float*>(smem);                        // [GP][D], pre-scaled
  float* ps = qs + GP * D;                                            // [warp][key][GP]
  uint16_t* kv = reinterpret_cast<uint16_t*>(ps + C::kWarps * C::kKeys * GP);

  const int split = blockIdx.x;
  const int kvh = int(blockIdx.y) / n_hpass, hpass = int(blockIdx.y) % n_hpass;
  const int t = blockIdx.z;
  const int h0 = kvh * geo.group + hpass * GP;                        // first query head of this block
  const int n_heads_here = min(GP, geo.group - hpass * GP);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // Before the wait for the previous kernel (PDL, see pdl_entry): positions,
  // rows and block tables are copied from the host before the step and no
  // kernel writes them. A block without keys exits at once, but split 0
  // always waits, so the grid never ends before the previous kernel.
  const int p = geo.positions[t];
  const int lo = first_key(p, geo.window);
  const int split_len = token_split_len(p - lo + 1, min_len, want);
  const int k_begin = lo + split * split_len;
  if (k_begin > p) {  // nothing of this token's context falls in this split
    if (split == 0) pdl_wait();  // (split 0 has keys unless p < 0)
    return;
  }
  const int k_end = min(p + 1, k_begin + split_len);
  const int32_t* bt = geo.block_tables + int64_t(geo.token_row[t]) * geo.max_blocks;
  const size_t row_stride = size_t(geo.n_head_kv) * D;
  // The first stage's K/V lines into L2 while the previous kernel (which
  // writes this token's K/V) runs: a prefetch returns no data, and cp.async.cg
  // below reads L2, which the previous kernel's stores update, so nothing is
  // stale. Only the first stage: later stages are hidden by the ring, and
  // whole splits overrun L2 when many blocks are resident (batch 32, context
  // 8192: 1 GB of K/V a layer; with whole-split prefetch it measured 496 us a
  // layer, 360 before this kernel had any; cuda_bench --attention).
  {
    constexpr int kLines = D * 2 >= 128 ? D * 2 / 128 : 1;  // 128-byte lines of a key's row
    const int n_keys = min(k_end - k_begin, C::kStage);
    for (int i = tid; i < n_keys * kLines; i += blockDim.x) {
      const size_t off =
          size_t(slot_of(bt, k_begin + i / kLines, geo)) * row_stride + size_t(kvh) * D + (i % kLines) * 64;
      prefetch_l2(k_cache + off);
      prefetch_l2(v_cache + off);
    }
  }
  pdl_entry();  // q and the caches are read, and out, partials and counters written, only from here

  for (int i = tid; i < GP * D; i += blockDim.x) {
    const int h = i / D;
    qs[i] = h < n_heads_here ? q[(int64_t(t) * geo.n_head + h0 + h) * D + i % D] * geo.qscale : 0.f;
  }
  __syncthreads();

  uint16_t* wbuf = kv + warp * C::kWarpBuf;
  float* wps = ps + warp * C::kKeys * GP;
  const int n_stages = (k_end - k_begin + C::kStage - 1) / C::kStage;

  auto issue = [&](int st) {
    uint16_t* kb = wbuf + (st % C::kDepth) * 2 * C::kKeys * C::kStride;
    uint16_t* vb = kb + C::kKeys * C::kStride;
    const int key0 = k_begin + st * C::kStage + warp * C::kKeys;
    for (int i = lane; i < C::kKeys * C::kChunks; i += 32) {
      const int kl = i / C::kChunks, c = i % C::kChunks;
      const int pos = key0 + kl;
      const bool valid = pos < k_end;
      const size_t off = valid ? size_t(slot_of(bt, pos, geo)) * row_stride + size_t(kvh) * D + c * 8 : 0;
      cp_async16(kb + kl * C::kStride + c * 8, k_cache + off, valid);
      cp_async16(vb + kl * C::kStride + c * 8, v_cache + off, valid);
    }
  };

  float m[GP], l[GP], acc[GP][8];
#pragma unroll
  for (int h = 0; h < GP; ++h) {
    m[h] = -INFINITY, l[h] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[h][e] = 0.f;
  }
  const int kl_s = lane / C::kParts, part = lane % C::kParts;        // score phase
  const int c_v = lane % C::kLanesPerRow, kg = lane / C::kLanesPerRow;  // value phase

  // Ring: stage st lives in buffer st % kDepth; kDepth - 1 stages ahead are in flight.
#pragma unroll
  for (int st = 0; st < C::kDepth - 1; ++st) {
    if (st < n_stages) issue(st);
    cp_async_commit();
  }
  for (int st = 0; st < n_stages; ++st) {
    if (st + C::kDepth - 1 < n_stages) issue(st + C::kDepth - 1);
    cp_async_commit();
    cp_async_wait<C::kDepth - 1>();
    __syncwarp();
    const uint16_t* kb = wbuf + (st % C::kDepth) * 2 * C::kKeys * C::kStride;
    const uint16_t* vb = kb + C::kKeys * C::kStride;
    const int pos = k_begin + st * C::kStage + warp * C::kKeys + kl_s;
    const bool valid = pos < k_end;

    // Scores (log2 domain): lane (key kl_s, part) covers chunks part, part + kParts, ...
    float s[GP];
#pragma unroll
    for (int h = 0; h < GP; ++h) s[h] = 0.f;
#pragma unroll
    for (int ci = 0; ci < C::kChunks / C::kParts; ++ci) {
      const int c = part + ci * C::kParts;
      const uint4 kr = *reinterpret_cast<const uint4*>(kb + kl_s * C::kStride + c * 8);
      float kf[8];
      unpack8<F16>(kr, kf);
#pragma unroll
      for (int h = 0; h < GP; ++h) {
        const float4 qa = *reinterpret_cast<const float4*>(qs + h * D + c * 8);
        const float4 qb = *reinterpret_cast<const float4*>(qs + h * D + c * 8 + 4);
        s[h] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] + qb.x * kf[4] + qb.y * kf[5] +
                qb.z * kf[6] + qb.w * kf[7];
      }
    }
#pragma unroll
    for (int h = 0; h < GP; ++h) {
#pragma unroll
      for (int o = 1; o < C::kParts; o <<= 1) s[h] += __shfl_xor_sync(0xffffffffu, s[h], o);
      s[h] = valid ? s[h] : -INFINITY;
      // Online softmax over this warp's keys.
      float mx = s[h];
#pragma unroll
      for (int o = C::kParts; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_new = fmaxf(m[h], mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = exp2f(m[h] - m_use);
      const float pv = exp2f(s[h] - m_use);
      float sum = pv;
#pragma unroll
      for (int o = C::kParts; o < 32; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      l[h] = l[h] * alpha + sum;
      m[h] = m_new;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[h][e] *= alpha;
      if (part == 0) wps[kl_s * GP + h] = pv;
    }
    __syncwarp();
    // Values: lane (key group kg, chunk c_v) accumulates keys kg, kg + kKeyGroups, ...
#pragma unroll
    for (int ki = 0; ki < C::kKeys / C::kKeyGroups; ++ki) {
      const int kl = kg + ki * C::kKeyGroups;
      const uint4 vr = *reinterpret_cast<const uint4*>(vb + kl * C::kStride + c_v * 8);
      float vf[8];
      unpack8<F16>(vr, vf);
#pragma unroll
      for (int h = 0; h < GP; ++h) {
        const float pw = wps[kl * GP + h];
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[h][e] += pw * vf[e];
      }
    }
    __syncwarp();
  }
  cp_async_wait<0>();

  // Merge the key groups of the warp (same m), then the 4 warps.
#pragma unroll
  for (int o = C::kLanesPerRow; o < 32; o <<= 1)
#pragma unroll
    for (int h = 0; h < GP; ++h)
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[h][e] += __shfl_xor_sync(0xffffffffu, acc[h][e], o);
  __syncthreads();  // every warp is done with its stage buffers
  float* red_acc = reinterpret_cast<float*>(kv);           // [warp][GP][D]
  float* red_ml = red_acc + C::kWarps * GP * D;             // [warp][GP][2]
  if (kg == 0) {
#pragma unroll
    for (int h = 0; h < GP; ++h)
#pragma unroll
      for (int e = 0; e < 8; ++e) red_acc[(warp * GP + h) * D + c_v * 8 + e] = acc[h][e];
  }
  if (lane == 0) {
#pragma unroll
    for (int h = 0; h < GP; ++h) red_ml[(warp * GP + h) * 2] = m[h], red_ml[(warp * GP + h) * 2 + 1] = l[h];
  }
  __syncthreads();
  finish_decode<D, GP, C::kWarps>(reinterpret_cast<float*>(kv), red_acc, red_ml, geo, t, p, lo, split, split_len,
                                   n_splits, h0, n_heads_here, out, part_acc, part_ml, counters);
}

// ---- prefill: FlashAttention-2 on mma.sync ------------------------------------


template <int D>
struct PrefillCfg {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRows = kWarps * 16;                         // (token, head) rows per block
  static constexpr int kBk = D <= 64 ? 64 : (D <= 128 ? 32 : 16);   // keys per KV tile
  static constexpr int kStride = D + 8;                             // halves per smem row (16-byte pad)
  static constexpr int kChunks = D / 8;
  static constexpr int kMinBlocks = D >= 256 ? 1 : 2;
  // Q, K and V tiles, then per-token ints (position, row) and the segment list.
  static constexpr size_t kSmem = (size_t(kRows) + 4 * kBk) * kStride * 2 + (6 * kRows + 4) * 4;
  static_assert(D % 16 == 0 && D <= 256, "head_dim must be a multiple of 16, at most 256");
};

// q, out: [n_tokens, n_head, D] f32; caches: [n_blocks, block_size, n_head_kv, D] bf16 or f16.
// Grid (ceil(n_tokens / tokens_per_block), n_head_kv).
template <int D, bool F16>
__global__ void __launch_bounds__(PrefillCfg<D>::kThreads, PrefillCfg<D>::kMinBlocks)
    prefill_kernel(const float* __restrict__ q, const uint16_t* __restrict__ k_cache,
                   const uint16_t* __restrict__ v_cache, Geometry geo, int tokens_per_block,
                   float* __restrict__ out) {
  pdl_entry();
  using C = PrefillCfg<D>;
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* qs = reinterpret_cast<uint16_t*>(smem);   // [kRows][kStride]
  uint16_t* ks = qs + C::kRows * C::kStride;          // [2][kBk][kStride]
  uint16_t* vs = ks + 2 * C::kBk * C::kStride;        // [2][kBk][kStride]
  int* s_pos = reinterpret_cast<int*>(vs + 2 * C::kBk * C::kStride);  // [kRows] per token of the tile
  int* s_row = s_pos + C::kRows;
  int* s_seg = s_row + C::kRows;                      // [kRows][4] segments: start, end, kv_lo, kv_hi
  int* s_nseg = s_seg + 4 * C::kRows;

  const int G = geo.group;
  const int tile = int(gridDim.x) - 1 - int(blockIdx.x);  // heavy (late) tiles first
  const int kvh = blockIdx.y;
  const int t0 = tile * tokens_per_block;
  const int t1 = min(geo.n_tokens, t0 + tokens_per_block);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, tq = lane & 3;

  for (int i = tid; i < t1 - t0; i += blockDim.x) {
    s_pos[i] = geo.positions[t0 + i];
    s_row[i] = geo.token_row[t0 + i];
  }
  // Q tile: row r = token (r / G) x head (r % G), scaled, in the caches' type.
  for (int i = tid; i < C::kRows * (D / 4); i += blockDim.x) {
    const int r = i / (D / 4), d = (i % (D / 4)) * 4;
    const int tl = r / G, t = t0 + tl;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (tl < tokens_per_block && t < t1) {
      v = *reinterpret_cast<const float4*>(q + (int64_t(t) * geo.n_head + kvh * G + r % G) * D + d);
      v.x *= geo.qscale, v.y *= geo.qscale, v.z *= geo.qscale, v.w *= geo.qscale;
    }
    *reinterpret_cast<uint2*>(qs + r * C::kStride + d) = make_uint2(half2_rn<F16>(v.x, v.y), half2_rn<F16>(v.z, v.w));
  }
  __syncthreads();
  // Segments: maximal runs of tokens of one row, with the keys they see.
  if (tid == 0) {
    int n = 0;
    for (int a = 0; a < t1 - t0;) {
      int b = a + 1, klo = first_key(s_pos[a], geo.window), khi = s_pos[a];
      while (b < t1 - t0 && s_row[b] == s_row[a]) {
        klo = min(klo, first_key(s_pos[b], geo.window));
        khi = max(khi, s_pos[b]);
        ++b;
      }
      s_seg[4 * n] = a, s_seg[4 * n + 1] = b, s_seg[4 * n + 2] = klo, s_seg[4 * n + 3] = khi;
      ++n;
      a = b;
    }
    *s_nseg = n;
  }
  __syncthreads();

  // This thread's two rows (g and g + 8 of the warp's 16).
  int rp[2], rlo[2], rtok[2];
  bool rvalid[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = warp * 16 + g + 8 * i;
    const int tl = r / G;
    rvalid[i] = tl < tokens_per_block && t0 + tl < t1;
    rtok[i] = tl;
    rp[i] = rvalid[i] ? s_pos[tl] : -1;
    rlo[i] = rvalid[i] ? first_key(rp[i], geo.window) : 0;
  }

  float o[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const size_t row_stride = size_t(geo.n_head_kv) * D;

  const int n_seg = *s_nseg;
  for (int sg = 0; sg < n_seg; ++sg) {
    const int seg_a = s_seg[4 * sg], seg_b = s_seg[4 * sg + 1];
    const int kv_lo = s_seg[4 * sg + 2], kv_hi = s_seg[4 * sg + 3];
    const int32_t* bt = geo.block_tables + int64_t(s_row[seg_a]) * geo.max_blocks;
    bool act[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) act[i] = rvalid[i] && rtok[i] >= seg_a && rtok[i] < seg_b;
    const int n_tiles = (kv_hi - kv_lo) / C::kBk + 1;

    auto issue = [&](int it) {
      uint16_t* kb = ks + (it & 1) * C::kBk * C::kStride;
      uint16_t* vb = vs + (it & 1) * C::kBk * C::kStride;
      const int key0 = kv_lo + it * C::kBk;
      for (int i = tid; i < C::kBk * C::kChunks; i += blockDim.x) {
        const int kl = i / C::kChunks, c = i % C::kChunks;
        const int pos = key0 + kl;
        const bool valid = pos <= kv_hi;
        const size_t off =
            valid ? size_t(slot_of(bt, pos, geo)) * row_stride + size_t(kvh) * D + c * 8 : 0;
        cp_async16(kb + kl * C::kStride + c * 8, k_cache + off, valid);
        cp_async16(vb + kl * C::kStride + c * 8, v_cache + off, valid);
      }
    };

    issue(0);
    cp_async_commit();
    for (int it = 0; it < n_tiles; ++it) {
      if (it + 1 < n_tiles) issue(it + 1);
      cp_async_commit();
      cp_async_wait<1>();
      __syncthreads();
      const uint16_t* kb = ks + (it & 1) * C::kBk * C::kStride;
      const uint16_t* vb = vs + (it & 1) * C::kBk * C::kStride;
      const int key0 = kv_lo + it * C::kBk;

      // S = Q Kᵀ: [16 rows x kBk keys] per warp.
      float sc[C::kBk / 8][4];
#pragma unroll
      for (int j = 0; j < C::kBk / 8; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4(a, qs + (warp * 16 + (lane & 15)) * C::kStride + kk * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int np = 0; np < C::kBk / 16; ++np) {
          uint32_t b[4];
          ldmatrix_x4(b, kb + (np * 16 + (lane >> 4) * 8 + (lane & 7)) * C::kStride + kk * 16 + ((lane >> 3) & 1) * 8);
          mma_16816<F16>(sc[2 * np], a, b[0], b[1]);
          mma_16816<F16>(sc[2 * np + 1], a, b[2], b[3]);
        }
      }
      // Mask, online softmax (rows g: e = 0, 1; g + 8: e = 2, 3).
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < C::kBk / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = e >> 1, key = key0 + j * 8 + 2 * tq + (e & 1);
          const bool ok = act[i] && key >= rlo[i] && key <= rp[i];
          sc[j][e] = ok ? sc[j][e] : -INFINITY;
          mx[i] = fmaxf(mx[i], sc[j][e]);
        }
      float alpha[2], mu[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
        mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        const float m_new = fmaxf(m[i], mx[i]);
        mu[i] = m_new == -INFINITY ? 0.f : m_new;
        alpha[i] = exp2f(m[i] - mu[i]);
        m[i] = m_new;
        l[i] *= alpha[i];
      }
#pragma unroll
      for (int j = 0; j < C::kBk / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float pv = exp2f(sc[j][e] - mu[e >> 1]);
          sc[j][e] = pv;
          l[e >> 1] += pv;
        }
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        o[j][0] *= alpha[0], o[j][1] *= alpha[0];
        o[j][2] *= alpha[1], o[j][3] *= alpha[1];
      }
      // O += P V.
#pragma unroll
      for (int kk = 0; kk < C::kBk / 16; ++kk) {
        const uint32_t a[4] = {half2_rn<F16>(sc[2 * kk][0], sc[2 * kk][1]),
                               half2_rn<F16>(sc[2 * kk][2], sc[2 * kk][3]),
                               half2_rn<F16>(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                               half2_rn<F16>(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, vb + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * C::kStride + dp * 16 +
                                   (lane >> 4) * 8);
          mma_16816<F16>(o[2 * dp], a, b[0], b[1]);
          mma_16816<F16>(o[2 * dp + 1], a, b[2], b[3]);
        }
      }
      __syncthreads();  // the buffer is refilled by the next issue
    }
    cp_async_wait<0>();
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (!rvalid[i]) continue;
    const int r = warp * 16 + g + 8 * i;
    const int t = t0 + rtok[i];
    float* dst = out + (int64_t(t) * geo.n_head + kvh * G + r % G) * D;
    const float inv = 1.0f / l[i];
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      *reinterpret_cast<float2*>(dst + j * 8 + 2 * tq) = make_float2(o[j][2 * i] * inv, o[j][2 * i + 1] * inv);
  }
}

// Built with -DAUGUR_STAMPS (stamps.cuh; a measurement, never by default):
// each decode_tc_kernel block stamps its start, the PDL wait's return, q
// ready, its keys done, reduced, and its end; the newest launches are
// printed at exit (attention_stamps_dump).
#ifdef AUGUR_STAMPS
__device__ stamps::Log g_attn_stamps;
#endif

// ---- flash-decoding on tensor cores -------------------------------------------

// The G <= 16 query heads of one KV head and token are the rows of one
// m16n8k16 A tile (rows G..15 zero), so a decode block is prefill_kernel's
// warp shape turned sideways: grid and splits as decode_kernel, each warp
// streaming its own 16-key stages of the split through a private cp.async
// ring, S = Q·Kᵀ and O += P·V on mma fragments with the online softmax on
// the accumulator rows. Q and P are rounded to the caches' type as in
// prefill; the block's end (warp merge, partials, split merge) is
// decode_kernel's. The scalar decode_kernel spends its time on smem reads of
// q and shuffle chains (latency-bound at 1.3-1.7 TB/s of K/V); here a stage
// of 16 keys is 2 x D/16 mma for the scores and 2 x D/16 for the values.
template <int D>
struct DecodeTcCfg {
  static constexpr int kWarps = 4;
  static constexpr int kKeys = 16;                   // keys per warp stage (one mma k-step of P·V)
  static constexpr int kStage = kWarps * kKeys;      // keys per block stage
  static constexpr int kStride = D + 8;              // halves per smem row (16-byte pad: ldmatrix rows)
  static constexpr int kChunks = D / 8;              // 16-byte chunks of a key row
  static constexpr int kDepth = 2;                   // ring: one stage in flight while one is multiplied
  static constexpr int kWarpBuf = kDepth * 2 * kKeys * kStride;  // halves: [stage][K|V][key][kStride]
  static constexpr size_t kQBytes = size_t(16) * kStride * 2;
  static constexpr size_t kRingBytes = size_t(kWarps) * kWarpBuf * 2;
  static constexpr size_t kRedBytes = size_t(kWarps) * 16 * (D + 2) * 4;
  static constexpr size_t kMergeBytes = MergeCfg<D, 16>::kFloats * 4;
  static constexpr size_t kSmem =
      kQBytes + (kRingBytes > kRedBytes ? (kRingBytes > kMergeBytes ? kRingBytes : kMergeBytes)
                                        : (kRedBytes > kMergeBytes ? kRedBytes : kMergeBytes));
  static_assert(D % 16 == 0 && D <= 256, "head_dim must be a multiple of 16, at most 256");
  static_assert(kWarps * 32 == MergeCfg<D, 16>::kThreads, "finish_decode merges with decode_kernel's block size");
  // ROPE with AHEAD: the RoPE scratch (cos/sin, two gains, [warp][2][D])
  // past the ring, which holds two stages before the wait.
  static constexpr size_t kRopeScratchBytes = size_t(11) * D * 4;
  static constexpr size_t kSmemRope = kSmem + kRopeScratchBytes;
};

// qkv_rope_store's work done by the decode attention (ROPE): every block
// norms and rotates its own query heads from the projection, and the block
// whose split holds the token's own position writes the token's K/V into the
// cache before it streams its keys. One new token a row only: no other
// block reads that position.
struct RopeArgs {
  const float* qkv = nullptr;  // [n_tokens, (n_head + 2 n_head_kv) * D]: q heads, k heads, v heads
  const float* q_norm = nullptr;  // [D] or null (no per-head norm)
  const float* k_norm = nullptr;
  float eps = 0.f;
  const float* inv_freq = nullptr;  // [half]
  int half = 0;
  const int32_t* slot_mapping = nullptr;  // [n_tokens] cache slot of the token (negative: not stored)
  uint16_t* k_cache = nullptr;  // the caches again, writable
  uint16_t* v_cache = nullptr;
};

// As decode_kernel (same arguments but n_hpass, always 1 here): grid
// (n_splits, n_head_kv, n_tokens), 128 threads. ROPE: q is unused; rope has
// the projection and the rest of qkv_rope_store's inputs (its cos/sin, norm
// gains and slot read before the PDL wait). EARLY: the first stage's keys
// that earlier steps cached (positions before the row's first new token) are
// copied into shared memory before the PDL wait, and only the new ones after
// it, alongside q: one round trip to L2 less after the wait (the default
// prefetches them into L2 only). With ROPE the block that makes the token's
// K/V also puts them into its stage 0 directly. EARLY 2: also the split
// merge's loads at once (finish_decode's MERGE1).
template <int D, bool F16, bool ROPE, int EARLY = 0>
__global__ void __launch_bounds__(128) decode_tc_kernel(const float* __restrict__ q,
                                                        const uint16_t* __restrict__ k_cache,
                                                        const uint16_t* __restrict__ v_cache, Geometry geo,
                                                        int min_len, int want, int n_splits, float* __restrict__ out,
                                                        float* __restrict__ part_acc, float2* __restrict__ part_ml,
                                                        int* __restrict__ counters, RopeArgs rope, bool ahead) {
  using C = DecodeTcCfg<D>;
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* qs = reinterpret_cast<uint16_t*>(smem);  // [16][kStride], pre-scaled, caches' type
  uint16_t* kv = qs + 16 * C::kStride;               // per-warp rings, later the block's end
  const int split = blockIdx.x, kvh = blockIdx.y, t = blockIdx.z;
  AUGUR_STAMP_BEGIN(g_attn_stamps);
  const int G = geo.group, h0 = kvh * G;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, tq = lane & 3;
  // Positions and block tables before the PDL wait, as decode_kernel.
  const int p = geo.positions[t];
  const int lo = first_key(p, geo.window);
  const int split_len = token_split_len(p - lo + 1, min_len, want);
  const int k_begin = lo + split * split_len;
  if (k_begin > p) {
    if (split == 0) pdl_wait();
    return;
  }
  const int k_end = min(p + 1, k_begin + split_len);
  const int32_t* bt = geo.block_tables + int64_t(geo.token_row[t]) * geo.max_blocks;
  const size_t row_stride = size_t(geo.n_head_kv) * D;
  uint16_t* wbuf = kv + warp * C::kWarpBuf;
  const int n_stages = (k_end - k_begin + C::kStage - 1) / C::kStage;
  // Stage st's keys of this warp into its ring slot, those with `take(pos)`;
  // positions past the split's end are zero-filled (P is 0 there, and 0 x 0
  // stays 0).
  auto issue_if = [&](int st, auto take) {
    uint16_t* kb = wbuf + (st % C::kDepth) * 2 * C::kKeys * C::kStride;
    uint16_t* vb = kb + C::kKeys * C::kStride;
    const int key0 = k_begin + st * C::kStage + warp * C::kKeys;
    for (int i = lane; i < C::kKeys * C::kChunks; i += 32) {
      const int kl = i / C::kChunks, c = i % C::kChunks;
      const int pos = key0 + kl;
      if (!take(pos)) continue;
      const bool valid = pos < k_end;
      const size_t off = valid ? size_t(slot_of(bt, pos, geo)) * row_stride + size_t(kvh) * D + c * 8 : 0;
      cp_async16(kb + kl * C::kStride + c * 8, k_cache + off, valid);
      cp_async16(vb + kl * C::kStride + c * 8, v_cache + off, valid);
    }
  };
  auto issue = [&](int st) { issue_if(st, [](int) { return true; }); };
  // Positions from `fresh_from` on are written by this step (the row's new
  // tokens: consecutive positions, consecutive in the batch, this one last).
  int fresh_from = p;
  const bool two_ahead = EARLY != 0 && ahead;
  if constexpr (EARLY != 0) {
    const int row = geo.token_row[t];
    for (int u = t - 1; u >= 0 && geo.token_row[u] == row; --u) --fresh_from;
    issue_if(0, [&](int pos) { return pos < fresh_from || pos >= k_end; });
    cp_async_commit();
    // AHEAD: stage 1's cached keys too, in the ring's other slot (ROPE: its
    // scratch then lies past the ring).
    if (ahead && n_stages > 1) issue_if(1, [&](int pos) { return pos < fresh_from || pos >= k_end; });
    cp_async_commit();
  }
  {
    constexpr int kLines = D * 2 >= 128 ? D * 2 / 128 : 1;
    // The first stage not in flight already; AHEAD: the next two.
    const int first = EARLY == 0 ? 0 : (ahead ? 2 : 1) * C::kStage;
    const int n_keys = max(0, min(k_end - k_begin - first, (ahead ? 2 : 1) * C::kStage));
    for (int i = tid; i < n_keys * kLines; i += blockDim.x) {
      const size_t off =
          size_t(slot_of(bt, k_begin + first + i / kLines, geo)) * row_stride + size_t(kvh) * D + (i % kLines) * 64;
      prefetch_l2(k_cache + off);
      prefetch_l2(v_cache + off);
    }
  }
  // ROPE: [cos(half), sin(half)], q's and k's norm gains [D] each, then
  // [warp][2][D] (at most 11 D floats): in the ring until its first use; with
  // EARLY in warp 0's second slot (stage 0 is in flight); with AHEAD past
  // the ring (both slots are in flight).
  static_assert(11 * D * 4 <= 2 * C::kKeys * C::kStride * 2, "RoPE scratch fits a ring slot");
  float* cs = reinterpret_cast<float*>(two_ahead ? smem + C::kSmem
                                                 : reinterpret_cast<unsigned char*>(EARLY != 0 ? kv + 2 * C::kKeys * C::kStride : kv));
  float* q_gain = cs + 2 * rope.half;
  float* k_gain = q_gain + D;
  int64_t slot = -1;
  if constexpr (ROPE) {
    for (int i = tid; i < rope.half; i += blockDim.x) {
      const float angle = float(p) * rope.inv_freq[i];
      cs[i] = cosf(angle);
      cs[rope.half + i] = sinf(angle);
    }
    for (int d = tid; d < D; d += blockDim.x) {
      if (rope.q_norm != nullptr) q_gain[d] = rope.q_norm[d];
      if (rope.k_norm != nullptr) k_gain[d] = rope.k_norm[d];
    }
    slot = rope.slot_mapping[t];
  }
  pdl_entry();
  AUGUR_STAMP(g_attn_stamps, 1);
  if constexpr (EARLY != 0 && !ROPE) {  // the new keys of stage 0 (AHEAD: and 1), in flight beside q's load
    issue_if(0, [&](int pos) { return pos >= fresh_from && pos < k_end; });
    if (ahead && n_stages > 1) issue_if(1, [&](int pos) { return pos >= fresh_from && pos < k_end; });
    cp_async_commit();
  }

  if constexpr (ROPE) {
    __syncthreads();  // cs, gains
    float* buf = k_gain + D + warp * 2 * D;  // the head in, then rotated
    float* rot = buf + D;
    const int64_t kv_dim = int64_t(geo.n_head_kv) * D;
    const float* row = rope.qkv + int64_t(t) * (int64_t(geo.n_head) * D + 2 * kv_dim);
    const bool own = k_end == p + 1 && slot >= 0;  // this split holds the token's own key
    if (own && warp < 2) {  // the K (warp 0) or V (warp 1) row on its way to L1 beside q's loads
      const float* src = row + int64_t(geo.n_head) * D + warp * kv_dim + int64_t(kvh) * D;
      if (lane * 32 < D) asm volatile("prefetch.global.L1 [%0];" ::"l"(src + lane * 32));
    }
    for (int r = warp; r < 16; r += C::kWarps) {
      if (r < G)
        norm_rope_head(row + int64_t(h0 + r) * D, D, rope.q_norm != nullptr ? q_gain : nullptr, rope.eps, cs,
                       rope.half, buf, lane, [&](int d, float v) { rot[d] = v; });
      for (int d = 2 * lane; d < D; d += 64) {  // as the q load below: scaled, rounded in pairs
        const float a = r < G ? rot[d] * geo.qscale : 0.f, b = r < G ? rot[d + 1] * geo.qscale : 0.f;
        *reinterpret_cast<uint32_t*>(qs + r * C::kStride + d) = half2_rn<F16>(a, b);
      }
      __syncwarp();
    }
    // EARLY: the token's K row in stage 0's ring when it falls there (AHEAD:
    // stage 0's or 1's; V's follows it), written directly; else the loop
    // loads it from the cache.
    const int at = p - k_begin;
    const int at_stage = at / C::kStage;
    uint16_t* own_k = EARLY != 0 && at_stage < (two_ahead ? 2 : 1)
                          ? kv + ((at % C::kStage) / C::kKeys) * C::kWarpBuf +
                                at_stage * 2 * C::kKeys * C::kStride + (at % C::kKeys) * C::kStride
                          : nullptr;
    if (own) {
      if (warp == 0) {
        norm_rope_head(row + int64_t(geo.n_head) * D + int64_t(kvh) * D, D, rope.k_norm != nullptr ? k_gain : nullptr,
                       rope.eps, cs, rope.half, buf, lane, [&](int d, float v) {
                         const uint16_t h = f32_to_half<F16>(v);
                         rope.k_cache[slot * kv_dim + int64_t(kvh) * D + d] = h;
                         if (own_k != nullptr) own_k[d] = h;
                       });
      } else if (warp == 1) {
        const float* src = row + int64_t(geo.n_head) * D + kv_dim + int64_t(kvh) * D;
        for (int d = lane; d < D; d += 32) {
          const uint16_t h = f32_to_half<F16>(src[d]);
          rope.v_cache[slot * kv_dim + int64_t(kvh) * D + d] = h;
          if (own_k != nullptr) own_k[C::kKeys * C::kStride + d] = h;
        }
      }
    } else if (EARLY != 0 && k_end == p + 1 && own_k != nullptr) {
      issue_if(at_stage, [&](int pos) { return pos == p; });  // a padding slot: what the cache holds
    }
    if constexpr (EARLY != 0) cp_async_commit();
    // The K/V stores reach L2 before any thread's cp.async below reads them
    // (the barrier orders the block's global accesses; cp.async.cg reads L2).
    __threadfence_block();
  } else {
    for (int i = tid; i < 16 * (D / 4); i += blockDim.x) {
      const int r = i / (D / 4), d = (i % (D / 4)) * 4;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (r < G) {
        v = *reinterpret_cast<const float4*>(q + (int64_t(t) * geo.n_head + h0 + r) * D + d);
        v.x *= geo.qscale, v.y *= geo.qscale, v.z *= geo.qscale, v.w *= geo.qscale;
      }
      *reinterpret_cast<uint2*>(qs + r * C::kStride + d) = make_uint2(half2_rn<F16>(v.x, v.y), half2_rn<F16>(v.z, v.w));
    }
  }
  __syncthreads();
  AUGUR_STAMP(g_attn_stamps, 2);

  // Rows g (fragment elements 0, 1) and g + 8 (2, 3) of the 16.
  float o[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  if constexpr (EARLY == 0) {
    issue(0);
    cp_async_commit();
  }
  // AHEAD (EARLY only): stages 0 and 1 are in flight before the loop, and
  // stage st + 2 is issued once stage st is multiplied, into its slot: one
  // round trip exposed a split, not one a stage (the loop below issues a
  // stage only when the one before it has arrived). Groups so far: stage 0's
  // cached keys, stage 1's, then the new keys (ROPE: the own key's, when its
  // slot is a padding one).
  // Stage 0 needs every group but the newest (stage 1) where its keys are
  // all cached (ROPE: every group but stage 1's), else all of them.
  const bool new0 = fresh_from < min(k_end, k_begin + C::kStage);
  for (int st = 0; st < n_stages; ++st) {
    if (two_ahead) {
      if (st > 0) {
        cp_async_wait<1>();  // all but stage st + 1's
      } else if (ROPE || new0) {  // ROPE: the own key's group may be stage 1's
        cp_async_wait<0>();
      } else {
        cp_async_wait<2>();  // stage 0's cached keys: not stage 1's nor the (empty here) new keys'
      }
    } else {
      if (st + 1 < n_stages) issue(st + 1);
      cp_async_commit();
      cp_async_wait<1>();  // every group but the newest (EARLY: stage 0 is two)
    }
    __syncwarp();
    const uint16_t* kb = wbuf + (st % C::kDepth) * 2 * C::kKeys * C::kStride;
    const uint16_t* vb = kb + C::kKeys * C::kStride;
    const int key0 = k_begin + st * C::kStage + warp * C::kKeys;

    // S = Q Kᵀ: [16 rows x 16 keys].
    float sc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t a[4], b[4];
      ldmatrix_x4(a, qs + (lane & 15) * C::kStride + kk * 16 + (lane >> 4) * 8);
      ldmatrix_x4(b, kb + ((lane >> 4) * 8 + (lane & 7)) * C::kStride + kk * 16 + ((lane >> 3) & 1) * 8);
      mma_16816<F16>(sc[0], a, b[0], b[1]);
      mma_16816<F16>(sc[1], a, b[2], b[3]);
    }
    // Mask keys past the split's end, online softmax (log2 domain).
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + j * 8 + 2 * tq + (e & 1);
        sc[j][e] = key < k_end ? sc[j][e] : -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], sc[j][e]);
      }
    float alpha[2], mu[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
      const float m_new = fmaxf(m[i], mx[i]);
      mu[i] = m_new == -INFINITY ? 0.f : m_new;
      alpha[i] = exp2f(m[i] - mu[i]);
      m[i] = m_new;
      l[i] *= alpha[i];
    }
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pv = exp2f(sc[j][e] - mu[e >> 1]);
        sc[j][e] = pv;
        l[e >> 1] += pv;
      }
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      o[j][0] *= alpha[0], o[j][1] *= alpha[0];
      o[j][2] *= alpha[1], o[j][3] *= alpha[1];
    }
    // O += P V: one k-step of the 16 keys.
    const uint32_t a[4] = {half2_rn<F16>(sc[0][0], sc[0][1]), half2_rn<F16>(sc[0][2], sc[0][3]),
                           half2_rn<F16>(sc[1][0], sc[1][1]), half2_rn<F16>(sc[1][2], sc[1][3])};
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, vb + ((lane & 7) + ((lane >> 3) & 1) * 8) * C::kStride + dp * 16 + (lane >> 4) * 8);
      mma_16816<F16>(o[2 * dp], a, b[0], b[1]);
      mma_16816<F16>(o[2 * dp + 1], a, b[2], b[3]);
    }
    __syncwarp();  // this stage's buffer is refilled by the next issue
    if (two_ahead) {
      if (st + 2 < n_stages) issue(st + 2);
      cp_async_commit();
    }
  }
  cp_async_wait<0>();
  AUGUR_STAMP(g_attn_stamps, 3);

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
  __syncthreads();  // every warp is done with its ring
  float* red_acc = reinterpret_cast<float*>(kv);  // [kWarps][16][D]
  float* red_ml = red_acc + C::kWarps * 16 * D;   // [kWarps][16][2]
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = g + 8 * i;
    if (r >= G) continue;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      *reinterpret_cast<float2*>(red_acc + (warp * 16 + r) * D + j * 8 + 2 * tq) = make_float2(o[j][2 * i], o[j][2 * i + 1]);
    if (tq == 0) red_ml[(warp * 16 + r) * 2] = m[i], red_ml[(warp * 16 + r) * 2 + 1] = l[i];
  }
  __syncthreads();
  AUGUR_STAMP(g_attn_stamps, 4);
  finish_decode<D, 16, C::kWarps, EARLY == 2>(reinterpret_cast<float*>(kv), red_acc, red_ml, geo, t, p, lo, split,
                                               split_len,
                                   n_splits, h0, G, out, part_acc, part_ml, counters);
  AUGUR_STAMP(g_attn_stamps, 5);
}

// ---- planning and launch ------------------------------------------------------

struct DecodePlan {
  int n_splits;
  int split_len;  // the shortest split; a token's own is token_split_len
  int want;       // splits a token's context is cut into (each at least split_len); 0: by occupancy
};

// Depends on sizes only. split_len is a multiple of every head_dim's stage.
// The shortest split: AUGUR_CUDA_ATTN_SPLIT (a multiple of 64), else kMinSplitLen.
int64_t min_split_len() {
  static const int64_t v = [] {
    const char* e = std::getenv("AUGUR_CUDA_ATTN_SPLIT");
    const int64_t n = e == nullptr ? 0 : std::atoll(e);
    return n >= 64 ? ceil_div(n, int64_t(64)) * 64 : int64_t(kMinSplitLen);
  }();
  return v;
}

DecodePlan plan_decode(int64_t n_tokens, int64_t n_head, int64_t max_context) {
  const int64_t cap = std::max<int64_t>(1, kMaxPartials / std::max<int64_t>(1, n_tokens * n_head));
  const int64_t n = std::clamp<int64_t>(ceil_div(max_context, min_split_len()), 1, cap);
  int64_t len = ceil_div(ceil_div(max_context, n), 64) * 64;
  len = std::max<int64_t>(len, min_split_len());
  return {int(ceil_div(max_context, len)), int(len), 0};
}

// Splits a token's context is cut into. A block's fixed cost (the q load,
// its warps' merge, the partials and the split merge) is paid once a split,
// so splits should be long; the grid should still fill the GPU. Fitted to
// cuda_bench --attention on the H200 (Qwen3-8B heads, sixth session): a
// token-and-KV-head pair takes one split plus its share of 2 blocks an SM,
// e.g. batch 1: 34 splits (context 8,192: 256 keys, 17.8 against 22.7 us a
// layer with 128-key splits); batch 32: 3 (context 8,192: 283 against 293).
// Up to 4,096 keys (the plan's bound), at most kMerge1Splits: the split
// merge then takes one trip to L2 (attention_early), which costs less than
// the longer splits (twelfth session, batch 1 at context 2048: 16 splits
// 4.081 / 4.083 ms a step against 34 splits 4.097 / 4.100).
// AUGUR_CUDA_ATTN_BLOCKS=n: about n blocks in all instead; 0: every split
// the plan's min_len.
int want_splits(int64_t n_tokens, int64_t blocks_per_split, const DecodePlan& plan) {
  static const int64_t env = [] {
    const char* e = std::getenv("AUGUR_CUDA_ATTN_BLOCKS");
    return e == nullptr ? int64_t(-1) : int64_t(std::atoll(e));
  }();
  const int64_t pairs = std::max<int64_t>(1, n_tokens * blocks_per_split);
  if (env == 0) return kAllSplits;
  int64_t want = env > 0 ? ceil_div(env, pairs) : 1 + ceil_div(int64_t(2) * context().sm_count, pairs);
  if (env < 0 && int64_t(plan.n_splits) * plan.split_len <= kOneTripContext)
    want = std::min<int64_t>(want, kMerge1Splits);
  return int(std::clamp<int64_t>(want, 1, kAllSplits));
}

template <typename Kernel>
void set_smem(Kernel kernel, size_t bytes, std::once_flag& once) {
  std::call_once(once, [&] {
    AUGUR_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  });
}

template <int D, int GP, bool F16>
void launch_decode(const float* q, const uint16_t* k_cache, const uint16_t* v_cache, const Geometry& geo,
                   const DecodePlan& plan, float* out, void* workspace, Stream s) {
  const int n_hpass = (geo.group + GP - 1) / GP;
  // A token needs at most `want` splits: the grid has no more.
  const int want = plan.want > 0 ? plan.want : want_splits(geo.n_tokens, int64_t(geo.n_head_kv) * n_hpass, plan);
  const int n_splits = std::min(plan.n_splits, want);
  const dim3 grid(unsigned(n_splits), unsigned(geo.n_head_kv * n_hpass), unsigned(geo.n_tokens));
  if (n_splits > 1 && int64_t(geo.n_tokens) * grid.y > Context::kAttnCounters) {
    fail("[cuda] paged_attention: ", geo.n_tokens, " tokens x ", grid.y, " head groups exceed ",
         Context::kAttnCounters, " split counters");
  }
  const size_t smem = decode_smem_bytes<D, GP>();
  static std::once_flag once;
  set_smem(decode_kernel<D, GP, F16>, smem, once);
  float* part_acc = static_cast<float*>(workspace);
  auto* part_ml = reinterpret_cast<float2*>(part_acc + int64_t(geo.n_tokens) * geo.n_head * n_splits * D);
  int* counters = static_cast<int*>(context().attn_counters.get());
  launch("decode_kernel", decode_kernel<D, GP, F16>, dim3(grid), dim3(128), smem, s, q, k_cache, v_cache, geo,
         plan.split_len, want, n_splits, n_hpass, out, part_acc, part_ml, counters);
}

// The tensor-core decode for groups of at most 16 query heads, unless
// AUGUR_CUDA_DECODE_TC=0 or the f32-attention precision experiment asks for
// the scalar kernel.
bool use_decode_tc(int group) {
  static const bool on = [] {
    const char* e = std::getenv("AUGUR_CUDA_DECODE_TC");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
  return on && group <= 16 && !detail::precision().decode_attention;
}

// decode_tc_kernel's EARLY for a launch of n_splits splits:
// detail::attention_early_variant() if set (tests), else AUGUR_CUDA_ATTN_EARLY
// (0 off, 1 early keys, 2 early keys and the one-trip merge), else 2 where
// every split merge fits the one trip (finish_decode's kMerge1) and 1 where
// none does (2's registers cost it there). H200, Qwen3-8B batch 1 (eleventh
// session), ms a step at context 2048 / 128: 0 4.113 / 4.008, 1 4.084 /
// 3.990, 2 4.095 / 3.967.
int attention_early(int n_splits) {
  if (detail::attention_early_variant() >= 0) return std::min(detail::attention_early_variant(), 2);
  static const int v = [] {
    const char* e = std::getenv("AUGUR_CUDA_ATTN_EARLY");
    return e == nullptr ? -1 : std::clamp(std::atoi(e), 0, 2);
  }();
  if (v >= 0) return v;
  return n_splits <= kMerge1Splits ? 2 : 1;
}

#ifdef AUGUR_STAMPS
void attention_stamps_dump() {
  static const char* const names[stamps::kEvents] = {"start", "wait", "q", "keys", "reduced", "end"};
  stamps::dump_symbol("attention", g_attn_stamps, names, 8);
}
#endif

// decode_tc_kernel's AHEAD (with EARLY) for the plain (rope false) or fused
// RoPE kernel: detail::attention_ahead_variant() if set (tests), else
// AUGUR_CUDA_ATTN_AHEAD: 0 off, 1 both, 2 (default) the fused kernel only.
// Not the plain kernel: its blocks start ~1.5 us before their wait returns,
// and the second stage's copies delay it (sixteenth session). The fused
// kernel's blocks sit beside the q/k/v GEMV's from its start: two stages
// before the wait took 4.110 -> 4.081 ms a step at context 2048
// (seventeenth session).
bool attention_ahead(bool rope) {
  if (detail::attention_ahead_variant() >= 0) return detail::attention_ahead_variant() != 0;
  static const int v = [] {
    const char* e = std::getenv("AUGUR_CUDA_ATTN_AHEAD");
    return e == nullptr ? 2 : std::atoi(e);
  }();
  return v == 1 || (v == 2 && rope);
}

template <int D, bool F16, bool ROPE = false>
void launch_decode_tc(const float* q, const uint16_t* k_cache, const uint16_t* v_cache, const Geometry& geo,
                      const DecodePlan& plan, float* out, void* workspace, Stream s, const RopeArgs& rope = {}) {
  using C = DecodeTcCfg<D>;
  const int want = plan.want > 0 ? plan.want : want_splits(geo.n_tokens, geo.n_head_kv, plan);
  const int n_splits = std::min(plan.n_splits, want);  // a token needs at most `want` splits
  const dim3 grid(unsigned(n_splits), unsigned(geo.n_head_kv), unsigned(geo.n_tokens));
  if (n_splits > 1 && int64_t(geo.n_tokens) * grid.y > Context::kAttnCounters) {
    fail("[cuda] paged_attention: ", geo.n_tokens, " tokens x ", grid.y, " KV heads exceed ", Context::kAttnCounters,
         " split counters");
  }
  float* part_acc = static_cast<float*>(workspace);
  auto* part_ml = reinterpret_cast<float2*>(part_acc + int64_t(geo.n_tokens) * geo.n_head * n_splits * D);
  int* counters = static_cast<int*>(context().attn_counters.get());
#ifdef AUGUR_STAMPS
  static std::once_flag dump_once;  // registered after the CUDA runtime's own exit handler: runs before it
  std::call_once(dump_once, [] { std::atexit(attention_stamps_dump); });
#endif
  // A flag a kernel: the variants share one function type, so a static in
  // go would set only the first one's shared-memory limit.
  static std::once_flag once[3];
  const int early = attention_early(n_splits);
  const bool ahead = early != 0 && attention_ahead(ROPE);
  auto go = [&](auto kernel, const char* name, std::once_flag& once) {
    const size_t smem = ROPE && ahead ? C::kSmemRope : C::kSmem;
    set_smem(kernel, ROPE ? C::kSmemRope : C::kSmem, once);
    launch(name, kernel, grid, dim3(C::kWarps * 32), smem, s, q, k_cache, v_cache, geo, plan.split_len, want,
           n_splits, out, part_acc, part_ml, counters, rope, ahead);
  };
  if constexpr (ROPE) {
    if (early == 1)
      go(decode_tc_kernel<D, F16, true, 1>, "decode_tc_rope_kernel", once[1]);
    else if (early == 2)
      go(decode_tc_kernel<D, F16, true, 2>, "decode_tc_rope_kernel", once[2]);
    else
      go(decode_tc_kernel<D, F16, true>, "decode_tc_rope_kernel", once[0]);
  } else if (early == 1) {
    go(decode_tc_kernel<D, F16, false, 1>, "decode_tc_early_kernel", once[1]);
  } else if (early == 2) {
    go(decode_tc_kernel<D, F16, false, 2>, "decode_tc_early_kernel", once[2]);
  } else {
    go(decode_tc_kernel<D, F16, false>, "decode_tc_kernel", once[0]);
  }
}

template <int D, bool F16>
void decode_by_group(const float* q, const uint16_t* k_cache, const uint16_t* v_cache, const Geometry& geo,
                     const DecodePlan& plan, float* out, void* workspace, Stream s) {
  if (use_decode_tc(geo.group)) return launch_decode_tc<D, F16>(q, k_cache, v_cache, geo, plan, out, workspace, s);
  if (geo.group == 1) return launch_decode<D, 1, F16>(q, k_cache, v_cache, geo, plan, out, workspace, s);
  if (geo.group == 2) return launch_decode<D, 2, F16>(q, k_cache, v_cache, geo, plan, out, workspace, s);
  if (geo.group <= 4) return launch_decode<D, 4, F16>(q, k_cache, v_cache, geo, plan, out, workspace, s);
  launch_decode<D, 8, F16>(q, k_cache, v_cache, geo, plan, out, workspace, s);
}

template <int D, bool F16>
void launch_prefill(const float* q, const uint16_t* k_cache, const uint16_t* v_cache, const Geometry& geo,
                    float* out, Stream s) {
  using C = PrefillCfg<D>;
  const int tokens_per_block = C::kRows / geo.group;
  const dim3 grid(unsigned(ceil_div(geo.n_tokens, tokens_per_block)), unsigned(geo.n_head_kv));
  static std::once_flag once;
  set_smem(prefill_kernel<D, F16>, C::kSmem, once);
  launch("prefill_kernel", prefill_kernel<D, F16>, dim3(grid), dim3(C::kThreads), C::kSmem, s, q, k_cache, v_cache,
         geo, tokens_per_block, out);
}

Geometry check_geometry(const float* q, const half_bits* k_cache, const half_bits* v_cache, int64_t block_size,
                        int64_t n_head, int64_t n_head_kv, const AttnMeta& meta, float scale, int32_t window,
                        const float* out) {
  if (n_head_kv <= 0 || n_head % n_head_kv != 0)
    fail("[cuda] paged_attention: n_head ", n_head, " is not a multiple of n_head_kv ", n_head_kv);
  if (n_head / n_head_kv > 128) fail("[cuda] paged_attention: GQA ratio ", n_head / n_head_kv, " exceeds 128");
  if (block_size <= 0 || meta.max_context <= 0 || meta.max_blocks <= 0)
    fail("[cuda] paged_attention: block_size, max_context and max_blocks must be positive");
  if (((reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(k_cache) |
        reinterpret_cast<uintptr_t>(v_cache) | reinterpret_cast<uintptr_t>(out)) & 15) != 0)
    fail("[cuda] paged_attention: q, caches and out must be 16-byte aligned");
  const uint64_t bs = uint64_t(block_size);
  const int block_shift = std::has_single_bit(bs) ? std::countr_zero(bs) : -1;
  return Geometry{meta.positions, meta.token_row, meta.block_tables, meta.max_blocks, meta.n_tokens,
                  int(block_size),  block_shift,    int(n_head),       int(n_head_kv),
                  int(n_head / n_head_kv), window,  scale * kLog2e};
}

bool use_decode(const AttnMeta& meta) {
  return meta.n_tokens <= kDecodeMaxTokens || meta.max_row_tokens == 1 || detail::precision().decode_attention;
}

}  // namespace

namespace detail {

int& attention_rope_variant() {
  static int v = -1;
  return v;
}

int& attention_ahead_variant() {
  static int v = -1;
  return v;
}

int& attention_early_variant() {
  static int v = -1;
  return v;
}

void paged_attention_decode(const float* q, const half_bits* k_cache, const half_bits* v_cache, int64_t block_size,
                            int64_t n_head, int64_t n_head_kv, int64_t head_dim, const AttnMeta& meta, float scale,
                            int32_t window, float* out, void* workspace, Stream s, int split_len, Half kv) {
  if (meta.n_tokens <= 0) return;
  const Geometry geo = check_geometry(q, k_cache, v_cache, block_size, n_head, n_head_kv, meta, scale, window, out);
  if (meta.n_tokens > 65535) fail("[cuda] paged_attention: ", meta.n_tokens, " decode tokens exceed 65535");
  DecodePlan plan = plan_decode(meta.n_tokens, n_head, meta.max_context);
  if (split_len > 0) plan = {int(ceil_div(meta.max_context, split_len)), split_len, kAllSplits};
  if (plan.n_splits > 1 && workspace == nullptr)
    fail("[cuda] paged_attention: flash-decoding needs attention_workspace_bytes() of workspace");
  const bool f16 = kv == Half::F16;
  switch (head_dim) {
    case 16: return f16 ? decode_by_group<16, true>(q, k_cache, v_cache, geo, plan, out, workspace, s)
                        : decode_by_group<16, false>(q, k_cache, v_cache, geo, plan, out, workspace, s);
    case 32: return f16 ? decode_by_group<32, true>(q, k_cache, v_cache, geo, plan, out, workspace, s)
                        : decode_by_group<32, false>(q, k_cache, v_cache, geo, plan, out, workspace, s);
    case 64: return f16 ? decode_by_group<64, true>(q, k_cache, v_cache, geo, plan, out, workspace, s)
                        : decode_by_group<64, false>(q, k_cache, v_cache, geo, plan, out, workspace, s);
    case 128: return f16 ? decode_by_group<128, true>(q, k_cache, v_cache, geo, plan, out, workspace, s)
                         : decode_by_group<128, false>(q, k_cache, v_cache, geo, plan, out, workspace, s);
    case 256: return f16 ? decode_by_group<256, true>(q, k_cache, v_cache, geo, plan, out, workspace, s)
                         : decode_by_group<256, false>(q, k_cache, v_cache, geo, plan, out, workspace, s);
    default: break;
  }
  fail("[cuda] paged_attention: head_dim ", head_dim, " unsupported (16, 32, 64, 128, 256)");
}

}  // namespace detail

// On by default at batch 1 (kRopeFusedRows): with the q/k/v GEMV's ring at
// 144 KB and the carveout at 100% (gemv.cu, context.cu) its blocks are
// resident beside that GEMV's from its start, so their gains, slots and
// first two stages of keys load while the weights stream. Qwen3-8B batch 1
// on the H200 (seventeenth session, against the unfused default): 3.912
// against 3.960-3.976 ms a step at context 128, 4.081-4.085 against
// 4.084-4.091 at 2048, 4.263 against 4.303 at 4096. Without the room beside
// the GEMV it was slower everywhere (fifteenth session). Batch 8 took 6.35
// ms a step with it against 5.70 without (seventeenth session), and batches
// 8-128 were 1-6% slower in the ninth (every block redoes its query heads'
// norm and RoPE). AUGUR_CUDA_ATTN_ROPE=0: never, 1: at every batch.
constexpr int64_t kRopeFusedRows = 1;
bool decode_attention_rope_enabled(int64_t n_tokens) {
  if (detail::attention_rope_variant() >= 0) return detail::attention_rope_variant() == 1;
  static const int v = [] {
    const char* e = std::getenv("AUGUR_CUDA_ATTN_ROPE");
    return e == nullptr ? -1 : std::atoi(e) != 0;
  }();
  return v < 0 ? n_tokens <= kRopeFusedRows : v == 1;
}

bool decode_attention_rope_fits(int64_t n_head, int64_t n_head_kv, int64_t head_dim, const AttnMeta& meta,
                                bool gated) {
  return !gated && meta.max_row_tokens == 1 && meta.n_tokens > 0 && n_head_kv > 0 &&
         n_head % n_head_kv == 0 && use_decode_tc(int(n_head / n_head_kv)) &&
         (head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128 || head_dim == 256);
}

void decode_attention_rope(const float* qkv, const float* q_norm, const float* k_norm, float eps,
                           const float* inv_freq, int64_t half, half_bits* k_cache, half_bits* v_cache,
                           int64_t block_size, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                           const AttnMeta& meta, float scale, int32_t window, float* out, void* workspace, Stream s,
                           Half kv) {
  if (!decode_attention_rope_fits(n_head, n_head_kv, head_dim, meta, false))
    fail("[cuda] decode_attention_rope: not a pure decode batch on the tensor-core decode kernel (check "
         "decode_attention_rope_fits)");
  if (2 * half > head_dim) fail("[cuda] decode_attention_rope: rotary dims ", 2 * half, " exceed head_dim ", head_dim);
  // q's alignment check stands in for qkv's (read a float at a time).
  const Geometry geo = check_geometry(out, k_cache, v_cache, block_size, n_head, n_head_kv, meta, scale, window, out);
  if (meta.n_tokens > 65535) fail("[cuda] paged_attention: ", meta.n_tokens, " decode tokens exceed 65535");
  const DecodePlan plan = plan_decode(meta.n_tokens, n_head, meta.max_context);
  if (plan.n_splits > 1 && workspace == nullptr)
    fail("[cuda] paged_attention: flash-decoding needs attention_workspace_bytes() of workspace");
  RopeArgs r;
  r.qkv = qkv, r.q_norm = q_norm, r.k_norm = k_norm, r.eps = eps, r.inv_freq = inv_freq, r.half = int(half);
  r.slot_mapping = meta.slot_mapping, r.k_cache = reinterpret_cast<uint16_t*>(k_cache);
  r.v_cache = reinterpret_cast<uint16_t*>(v_cache);
  const auto* kc = reinterpret_cast<const uint16_t*>(k_cache);
  const auto* vc = reinterpret_cast<const uint16_t*>(v_cache);
  const bool f16 = kv == Half::F16;
  auto go = [&](auto d) {
    constexpr int D = decltype(d)::value;
    f16 ? launch_decode_tc<D, true, true>(nullptr, kc, vc, geo, plan, out, workspace, s, r)
        : launch_decode_tc<D, false, true>(nullptr, kc, vc, geo, plan, out, workspace, s, r);
  };
  switch (head_dim) {
    case 16: return go(std::integral_constant<int, 16>());
    case 32: return go(std::integral_constant<int, 32>());
    case 64: return go(std::integral_constant<int, 64>());
    case 128: return go(std::integral_constant<int, 128>());
    default: return go(std::integral_constant<int, 256>());
  }
}

size_t attention_workspace_bytes(int64_t n_tokens, int64_t n_head, int64_t head_dim, int64_t max_context) {
  if (n_tokens <= 0 || max_context <= 0) return 0;
  const DecodePlan plan = plan_decode(n_tokens, n_head, max_context);
  if (plan.n_splits <= 1) return 0;
  return size_t(n_tokens * n_head * plan.n_splits) * size_t(head_dim + 2) * sizeof(float);
}

void paged_attention(const float* q, const half_bits* k_cache, const half_bits* v_cache, int64_t block_size,
                     int64_t n_head, int64_t n_head_kv, int64_t head_dim, const AttnMeta& meta, float scale,
                     int32_t window, float* out, void* workspace, Stream s, Half kv) {
  if (meta.n_tokens <= 0) return;
  if (use_decode(meta)) {
    detail::paged_attention_decode(q, k_cache, v_cache, block_size, n_head, n_head_kv, head_dim, meta, scale, window,
                                   out, workspace, s, 0, kv);
    return;
  }
  const Geometry geo = check_geometry(q, k_cache, v_cache, block_size, n_head, n_head_kv, meta, scale, window, out);
  const bool f16 = kv == Half::F16;
  switch (head_dim) {
    case 16: return f16 ? launch_prefill<16, true>(q, k_cache, v_cache, geo, out, s)
                        : launch_prefill<16, false>(q, k_cache, v_cache, geo, out, s);
    case 32: return f16 ? launch_prefill<32, true>(q, k_cache, v_cache, geo, out, s)
                        : launch_prefill<32, false>(q, k_cache, v_cache, geo, out, s);
    case 64: return f16 ? launch_prefill<64, true>(q, k_cache, v_cache, geo, out, s)
                        : launch_prefill<64, false>(q, k_cache, v_cache, geo, out, s);
    case 128: return f16 ? launch_prefill<128, true>(q, k_cache, v_cache, geo, out, s)
                         : launch_prefill<128, false>(q, k_cache, v_cache, geo, out, s);
    case 256: return f16 ? launch_prefill<256, true>(q, k_cache, v_cache, geo, out, s)
                         : launch_prefill<256, false>(q, k_cache, v_cache, geo, out, s);
    default: break;
  }
  fail("[cuda] paged_attention: head_dim ", head_dim, " unsupported (16, 32, 64, 128, 256)");
}

}  // namespace augur::cuda
