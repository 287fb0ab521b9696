// Causal GQA attention over the paged KV cache (bf16 or f16): which kernel
// runs when, and how flash-decoding cuts a context into splits.
//
// Paths (paged_attention):
// - flash-decoding (attention_decode.cu) for few tokens (at most
//   kDecodeMaxTokens) or one new token a row: the context of each token is
//   cut into splits; one block per (split, KV head, token), partial results
//   merged by the last block to finish. The tensor-core kernel takes groups
//   of at most 16 query heads a KV head, the scalar kernel the rest.
// - prefill (attention_prefill.cu) otherwise: FlashAttention-2 on tensor cores.
// decode_attention_rope (attention_decode.cu) is the tensor-core decode
// kernel doing qkv_rope_store's work too.
//
// Grid sizes depend only on sizes (n_tokens, n_head, max_context), never on
// positions, so a captured decode graph replays at any position: a split
// with no keys exits at once.
// Reference for every path: eager_attention_forward (backend/cpu/ops_cpu.cpp).
#include <algorithm>
#include <bit>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/detail.h"

namespace augur::cuda {
namespace attn {

int64_t plan_rows(int64_t n_tokens, int64_t n_rows) {
  return n_rows > 0 ? std::min(n_rows, n_tokens) : n_tokens;
}

// Split lengths are multiples of 64 keys, a multiple of every head_dim's stage.
// The partials bound counts rows: a batch of few rows with several tokens
// each (n_tokens <= kDecodeMaxTokens) gets workspace for up to 8x the splits
// (attention_workspace_bytes).
DecodePlan plan_decode(int64_t rows, int64_t n_head, int64_t max_context) {
  const int64_t cap = std::max<int64_t>(1, kMaxPartials / std::max<int64_t>(1, rows * n_head));
  const int64_t n = std::clamp<int64_t>(ceil_div(max_context, int64_t(kMinSplitLen)), 1, cap);
  int64_t len = ceil_div(ceil_div(max_context, n), 64) * 64;
  len = std::max<int64_t>(len, kMinSplitLen);
  return {int(ceil_div(max_context, len)), int(len), 0, int(rows)};
}

// A block's fixed cost (the q load, its warps' merge, the partials and the
// split merge) is paid once a split, so splits should be long; the grid
// should still fill the GPU. Fitted to cuda_bench --attention on the H200
// (Qwen3-8B heads): a token-and-KV-head pair takes one split plus its share
// of 2 blocks an SM (batch 1: 34 splits; batch 32: 3). Up to 4,096 keys, at
// most kMerge1Splits, so that the split merge takes one trip to L2
// (finish_decode's MERGE1), which costs less than the longer splits do: each
// token's own span decides that (token_split_len), the plan's bound only
// sizes the grid. Counted by rows, not tokens (plan_rows).
int want_splits(int64_t rows, int64_t blocks_per_split, const DecodePlan& plan) {
  const int64_t pairs = std::max<int64_t>(1, rows * blocks_per_split);
  int64_t want = 1 + ceil_div(int64_t(2) * context().sm_count, pairs);
  if (int64_t(plan.n_splits) * plan.split_len <= kOneTripContext) want = std::min<int64_t>(want, kMerge1Splits);
  return int(std::clamp<int64_t>(want, 1, kAllSplits));
}

// The scalar kernel also where a test asks for f32 Q and P (detail::precision).
bool use_decode_tc(int group) { return group <= 16 && !detail::precision().decode_attention; }

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

}  // namespace attn

namespace {

bool use_decode(const AttnMeta& meta) {
  return meta.n_tokens <= attn::kDecodeMaxTokens || meta.max_row_tokens == 1 || detail::precision().decode_attention;
}

}  // namespace

namespace detail {

void paged_attention_decode(const float* q, const half_bits* k_cache, const half_bits* v_cache, int64_t block_size,
                            int64_t n_head, int64_t n_head_kv, int64_t head_dim, const AttnMeta& meta, float scale,
                            int32_t window, float* out, void* workspace, Stream s, int split_len, Half kv) {
  if (meta.n_tokens <= 0) return;
  const attn::Geometry geo =
      attn::check_geometry(q, k_cache, v_cache, block_size, n_head, n_head_kv, meta, scale, window, out);
  if (meta.n_tokens > 65535) fail("[cuda] paged_attention: ", meta.n_tokens, " decode tokens exceed 65535");
  attn::DecodePlan plan = attn::plan_decode(attn::plan_rows(meta.n_tokens, meta.n_rows), n_head, meta.max_context);
  if (split_len > 0) plan = {int(ceil_div(meta.max_context, split_len)), split_len, attn::kAllSplits, 1};
  if (plan.n_splits > 1 && workspace == nullptr)
    fail("[cuda] paged_attention: flash-decoding needs attention_workspace_bytes() of workspace");
  attn::decode(q, k_cache, v_cache, geo, plan, head_dim, out, workspace, s, kv);
}

}  // namespace detail

size_t attention_workspace_bytes(int64_t n_tokens, int64_t n_head, int64_t head_dim, int64_t max_context) {
  if (n_tokens <= 0 || max_context <= 0) return 0;
  // The most splits any batch of n_tokens can plan: a batch of a few tokens
  // may be one row (plan_rows).
  const int64_t rows = n_tokens <= attn::kDecodeMaxTokens ? 1 : n_tokens;
  const attn::DecodePlan plan = attn::plan_decode(rows, n_head, max_context);
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
  const attn::Geometry geo =
      attn::check_geometry(q, k_cache, v_cache, block_size, n_head, n_head_kv, meta, scale, window, out);
  attn::prefill(q, k_cache, v_cache, geo, head_dim, out, s, kv);
}

}  // namespace augur::cuda
