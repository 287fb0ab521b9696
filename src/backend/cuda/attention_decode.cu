// Decode attention (few tokens, or one new token a row): flash-decoding
// over the paged cache. Grid (n_splits, n_head_kv * head passes, n_tokens);
// block = 4 warps, one KV head and up to GP of its query heads, so K and V
// are read once per group. The context [lo, p] of a token is cut into
// splits from lo, their length from the token's own context
// (token_split_len: few long splits that still fill the GPU; the grid is
// sized by the plan, attention_plan.cu). Each warp streams its own keys of
// each stage into a private ring of stage buffers with cp.async and keeps its
// own online softmax (m, l, acc), so warps never wait on each other until
// the end, where the block merges its 4 warps and writes either the output
// (the token's context fits one split) or a partial (acc, m, l). The last
// block of a (token, KV head, head pass) to write its partial (a counter per
// triple, as the split-K GEMV in gemv.cu) merges all the splits in split
// order and writes the output: one launch, deterministic, counters left at
// zero for the next launch or graph replay (finish_decode, attention.cuh).
// Two kernels: decode_tc_kernel on tensor cores (groups of at most 16 query
// heads; with ROPE also qkv_rope_store's work, decode_attention_rope), and
// the scalar decode_kernel (f32 Q and P) for larger groups.
// Reference: eager_attention_forward (backend/cpu/ops_cpu.cpp).
#include <algorithm>
#include <mutex>
#include <type_traits>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/detail.h"

namespace augur::cuda::attn {
namespace {

// ---- flash-decoding, f32 Q and P -------------------------------------------------

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
  // 8192: 1 GB of K/V a layer).
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
// The scalar kernel stays for groups of more than 16 query heads and for
// tests that want f32 Q and P.
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
  // ROPE: the RoPE scratch (cos/sin, two gains, [warp][2][D]) past the
  // ring, which holds two stages before the wait.
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
// (n_splits, n_head_kv, n_tokens), 128 threads. The first stage's keys that
// earlier steps cached (positions before the row's first new token) are
// copied into shared memory before the PDL wait, and only the new ones after
// it, alongside q: one round trip to L2 less after the wait.
// ROPE: q is unused; rope has the projection and the rest of
// qkv_rope_store's inputs (its cos/sin, norm gains and slot read before the
// PDL wait). The block that makes the token's K/V also puts them into its
// ring directly. Its blocks start beside the q/k/v GEMV's (block_tail's
// last), so the first two stages go in flight before the wait, and a stage
// is issued two ahead of the one multiplied.
// MERGE1: the split merge's loads at once (finish_decode), where every
// token's splits fit the one trip.
template <int D, bool F16, bool ROPE, bool MERGE1>
__global__ void __launch_bounds__(128) decode_tc_kernel(const float* __restrict__ q,
                                                        const uint16_t* __restrict__ k_cache,
                                                        const uint16_t* __restrict__ v_cache, Geometry geo,
                                                        int min_len, int want, int n_splits, float* __restrict__ out,
                                                        float* __restrict__ part_acc, float2* __restrict__ part_ml,
                                                        int* __restrict__ counters, RopeArgs rope) {
  using C = DecodeTcCfg<D>;
  extern __shared__ __align__(16) unsigned char smem[];
  uint16_t* qs = reinterpret_cast<uint16_t*>(smem);  // [16][kStride], pre-scaled, caches' type
  uint16_t* kv = qs + 16 * C::kStride;               // per-warp rings, later the block's end
  const int split = blockIdx.x, kvh = blockIdx.y, t = blockIdx.z;
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
  {
    const int row = geo.token_row[t];
    for (int u = t - 1; u >= 0 && geo.token_row[u] == row; --u) --fresh_from;
    issue_if(0, [&](int pos) { return pos < fresh_from || pos >= k_end; });
    cp_async_commit();
    // ROPE: stage 1's cached keys too, in the ring's other slot.
    if (ROPE && n_stages > 1) issue_if(1, [&](int pos) { return pos < fresh_from || pos >= k_end; });
    cp_async_commit();
  }
  {
    // Into L2, the stages after those in flight (ROPE: the next two, else one).
    constexpr int kLines = D * 2 >= 128 ? D * 2 / 128 : 1;
    constexpr int kAhead = ROPE ? 2 : 1;
    const int first = kAhead * C::kStage;
    const int n_keys = max(0, min(k_end - k_begin - first, kAhead * C::kStage));
    for (int i = tid; i < n_keys * kLines; i += blockDim.x) {
      const size_t off =
          size_t(slot_of(bt, k_begin + first + i / kLines, geo)) * row_stride + size_t(kvh) * D + (i % kLines) * 64;
      prefetch_l2(k_cache + off);
      prefetch_l2(v_cache + off);
    }
  }
  // ROPE: [cos(half), sin(half)], q's and k's norm gains [D] each, then
  // [warp][2][D] (at most 11 D floats), past the ring (both its slots are in flight).
  float* cs = reinterpret_cast<float*>(smem + C::kSmem);
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
  if constexpr (!ROPE) {  // the new keys of stage 0, in flight beside q's load
    issue_if(0, [&](int pos) { return pos >= fresh_from && pos < k_end; });
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
    // The token's K row in stage 0's or 1's ring slot when it falls there
    // (V's follows it), written directly; else the loop loads it from the cache.
    const int at = p - k_begin;
    const int at_stage = at / C::kStage;
    uint16_t* own_k = at_stage < 2
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
    } else if (k_end == p + 1 && own_k != nullptr) {
      issue_if(at_stage, [&](int pos) { return pos == p; });  // a padding slot: what the cache holds
    }
    cp_async_commit();
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

  // Rows g (fragment elements 0, 1) and g + 8 (2, 3) of the 16.
  float o[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  // ROPE: stages 0 and 1 are in flight before the loop, and stage st + 2 is
  // issued once stage st is multiplied, into its slot: one round trip
  // exposed a split, not one a stage. Groups so far: stage 0's cached keys,
  // stage 1's, then the own key's (when its slot is a padding one), so stage
  // 0 waits for all of them. Otherwise a stage is issued when the one before
  // it has arrived; groups so far: stage 0's cached keys, an empty one, stage
  // 0's new keys.
  for (int st = 0; st < n_stages; ++st) {
    if constexpr (ROPE) {
      if (st > 0)
        cp_async_wait<1>();  // all but stage st + 1's
      else
        cp_async_wait<0>();
    } else {
      if (st + 1 < n_stages) issue(st + 1);
      cp_async_commit();
      cp_async_wait<1>();  // every group but the newest
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
    if constexpr (ROPE) {
      if (st + 2 < n_stages) issue(st + 2);
      cp_async_commit();
    }
  }
  cp_async_wait<0>();

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
  finish_decode<D, 16, C::kWarps, MERGE1>(reinterpret_cast<float*>(kv), red_acc, red_ml, geo, t, p, lo, split,
                                           split_len, n_splits, h0, G, out, part_acc, part_ml, counters);
}

// ---- launch ------------------------------------------------------------------------

template <int D, int GP, bool F16>
void launch_decode(const float* q, const uint16_t* k_cache, const uint16_t* v_cache, const Geometry& geo,
                   const DecodePlan& plan, float* out, void* workspace, Stream s) {
  const int n_hpass = (geo.group + GP - 1) / GP;
  // A token needs at most `want` splits: the grid has no more.
  const int want = plan.want > 0 ? plan.want : want_splits(plan.rows, int64_t(geo.n_head_kv) * n_hpass, plan);
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

template <int D, bool F16, bool ROPE = false>
void launch_decode_tc(const float* q, const uint16_t* k_cache, const uint16_t* v_cache, const Geometry& geo,
                      const DecodePlan& plan, float* out, void* workspace, Stream s, const RopeArgs& rope = {}) {
  using C = DecodeTcCfg<D>;
  const int want = plan.want > 0 ? plan.want : want_splits(plan.rows, geo.n_head_kv, plan);
  const int n_splits = std::min(plan.n_splits, want);  // a token needs at most `want` splits
  const dim3 grid(unsigned(n_splits), unsigned(geo.n_head_kv), unsigned(geo.n_tokens));
  if (n_splits > 1 && int64_t(geo.n_tokens) * grid.y > Context::kAttnCounters) {
    fail("[cuda] paged_attention: ", geo.n_tokens, " tokens x ", grid.y, " KV heads exceed ", Context::kAttnCounters,
         " split counters");
  }
  float* part_acc = static_cast<float*>(workspace);
  auto* part_ml = reinterpret_cast<float2*>(part_acc + int64_t(geo.n_tokens) * geo.n_head * n_splits * D);
  int* counters = static_cast<int*>(context().attn_counters.get());
  // A flag a kernel: the two share one function type, so a static in go
  // would set only the first one's shared-memory limit.
  static std::once_flag once[2];
  constexpr size_t smem = ROPE ? C::kSmemRope : C::kSmem;
  constexpr const char* name = ROPE ? "decode_tc_rope_kernel" : "decode_tc_kernel";
  auto go = [&](auto kernel, std::once_flag& once) {
    set_smem(kernel, smem, once);
    launch(name, kernel, grid, dim3(C::kWarps * 32), smem, s, q, k_cache, v_cache, geo, plan.split_len, want,
           n_splits, out, part_acc, part_ml, counters, rope);
  };
  // The one-trip merge where it fits every split; its registers cost more
  // than it saves where it does not.
  if (n_splits <= kMerge1Splits)
    go(decode_tc_kernel<D, F16, ROPE, true>, once[1]);
  else
    go(decode_tc_kernel<D, F16, ROPE, false>, once[0]);
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

}  // namespace

void decode(const float* q, const half_bits* k_cache, const half_bits* v_cache, const Geometry& geo,
            const DecodePlan& plan, int64_t head_dim, float* out, void* workspace, Stream s, Half kv) {
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

}  // namespace augur::cuda::attn

namespace augur::cuda {

bool decode_attention_rope_fits(int64_t n_head, int64_t n_head_kv, int64_t head_dim, const AttnMeta& meta,
                                bool gated) {
  return !gated && meta.max_row_tokens == 1 && meta.n_tokens > 0 && n_head_kv > 0 &&
         n_head % n_head_kv == 0 && attn::use_decode_tc(int(n_head / n_head_kv)) &&
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
  const attn::Geometry geo = attn::check_geometry(out, k_cache, v_cache, block_size, n_head, n_head_kv, meta, scale, window, out);
  if (meta.n_tokens > 65535) fail("[cuda] paged_attention: ", meta.n_tokens, " decode tokens exceed 65535");
  const attn::DecodePlan plan = attn::plan_decode(attn::plan_rows(meta.n_tokens, meta.n_rows), n_head, meta.max_context);
  if (plan.n_splits > 1 && workspace == nullptr)
    fail("[cuda] paged_attention: flash-decoding needs attention_workspace_bytes() of workspace");
  attn::RopeArgs r;
  r.qkv = qkv, r.q_norm = q_norm, r.k_norm = k_norm, r.eps = eps, r.inv_freq = inv_freq, r.half = int(half);
  r.slot_mapping = meta.slot_mapping, r.k_cache = reinterpret_cast<uint16_t*>(k_cache);
  r.v_cache = reinterpret_cast<uint16_t*>(v_cache);
  const auto* kc = reinterpret_cast<const uint16_t*>(k_cache);
  const auto* vc = reinterpret_cast<const uint16_t*>(v_cache);
  const bool f16 = kv == Half::F16;
  auto go = [&](auto d) {
    constexpr int D = decltype(d)::value;
    f16 ? attn::launch_decode_tc<D, true, true>(nullptr, kc, vc, geo, plan, out, workspace, s, r)
        : attn::launch_decode_tc<D, false, true>(nullptr, kc, vc, geo, plan, out, workspace, s, r);
  };
  switch (head_dim) {
    case 16: return go(std::integral_constant<int, 16>());
    case 32: return go(std::integral_constant<int, 32>());
    case 64: return go(std::integral_constant<int, 64>());
    case 128: return go(std::integral_constant<int, 128>());
    default: return go(std::integral_constant<int, 256>());
  }
}

}  // namespace augur::cuda
