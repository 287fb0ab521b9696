// Prefill attention (many tokens a row): FlashAttention-2 on mma.m16n8k16.
// A block takes 128 query rows = consecutive tokens x the G query heads of
// one KV head (GQA packing: K/V tiles are loaded once for all G heads), walks
// the KV tiles of the keys its tokens see with a cp.async double buffer, and
// keeps the online softmax in registers. Q (pre-scaled by scale * log2 e) and
// P are rounded to the caches' type for the tensor cores. Tokens of
// different rows in one tile are handled as segments, one pass each.
// Reference: eager_attention_forward (backend/cpu/ops_cpu.cpp).
#include <mutex>

#include "backend/cuda/attention.cuh"

namespace augur::cuda::attn {
namespace {

template <int D>
struct PrefillCfg {
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRows = kWarps * 16;                         // (token, head) rows per block
  // Keys per KV tile. head_dim 256 takes 64 too (206 KB of smem, 249
  // registers, no spills; one block an SM either way): each tile's Q fragment
  // reloads, barrier, softmax pass and rescale of O serve 64 keys, not 32.
  static constexpr int kBk = D <= 64 || D == 256 ? 64 : 32;
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

}  // namespace

void prefill(const float* q, const half_bits* k_cache, const half_bits* v_cache, const Geometry& geo,
             int64_t head_dim, float* out, Stream s, Half kv) {
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

}  // namespace augur::cuda::attn
