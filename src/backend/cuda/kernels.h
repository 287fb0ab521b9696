// CUDA kernels behind backend/ops.h, as plain host-callable functions over raw
// device pointers (no CUDA headers here, so the ops_*.cpp files compile
// without nvcc).
//
// Conventions: activations f32, weights and the KV cache bf16 or f16 (raw
// uint16_t bits, a Half says which), accumulation f32. Every launch goes on
// `stream` and depends on sizes only (never on data such as context
// lengths), so a decode step can be captured once in a CUDA graph and
// replayed with new metadata. Errors from CUDA are checked and thrown as
// augur::Error naming the kernel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

struct CUstream_st;

namespace augur::cuda {

using Stream = CUstream_st*;
using bf16_bits = uint16_t;
using half_bits = uint16_t;  // bf16 or f16 bits, as a Half says

// The 16-bit float of weights, K/V caches and tensor-core operands. F16 has
// 3 more mantissa bits than BF16 (rounding error 8x smaller) at the same
// tensor-core rate, but a range of +-65504: the engine stores a weight as F16
// when its values fit, and conversions to F16 saturate.
enum class Half : uint8_t { BF16, F16 };

// The process's CUDA state: device, the stream every op runs on, cuBLASLt
// handle and workspace. Created on first use; throws if no GPU is present.
struct Context;
Context& context();
Stream stream();
bool available();           // a GPU is present and usable (never throws)
void synchronize();         // waits for the stream; throws on a pending error
// Changes whenever a scratch buffer the kernels share is reallocated (work
// recorded before then holds a freed address).
uint64_t scratch_generation();
// The bytes of the shared scratch x takes in 16 bits for cuBLASLt (tests).
size_t bf16_scratch_bytes();

// y[m, n] = sum_k x[m, k] * w[n, k].  x: [M, K] f32 (row stride ldx);
// w: [N, K] bf16 contiguous; y: [M, N] f32 (row stride ldy).
// M <= stream_rows() (8 unless set): a bandwidth-bound skinny kernel (f32
// products; a row's result does not depend on M); larger M: tensor cores
// (cuBLASLt on a bf16 copy of x, f32 output).
void matmul_bf16(const float* x, int64_t M, int64_t K, int64_t ldx, const bf16_bits* w, int64_t N,
                 float* y, int64_t ldy, Stream s);
// The same for weights of either Half; on the tensor-core path x is rounded
// to the weights' type.
void matmul_half(const float* x, int64_t M, int64_t K, int64_t ldx, const half_bits* w, Half wt, int64_t N,
                 float* y, int64_t ldy, Stream s);

// The most rows matmul_half, norm_matmul and block_tail give the stream GEMV
// on the calling thread: 8 (its limit) unless set lower, for work whose rows
// need not match a decode step's bit for bit. set_stream_rows returns the
// previous value.
int64_t stream_rows();
int64_t set_stream_rows(int64_t rows);

// The tensor-core path in two halves, so that projections sharing an input
// (q/k/v, gate/up) convert it to bf16 once. xb: [M, K] bf16 contiguous.
void to_bf16(const float* x, int64_t M, int64_t K, int64_t ldx, bf16_bits* xb, Stream s);
void to_half(const float* x, int64_t M, int64_t K, int64_t ldx, Half t, half_bits* xh, Stream s);
void matmul_bf16_xb(const bf16_bits* xb, int64_t M, int64_t K, const bf16_bits* w, int64_t N, float* y,
                    int64_t ldy, Stream s);

// out[t, :] = table[ids[t], :].  table: [n_vocab, d_model] of Half t; ids: [n_tokens]
void embedding(const half_bits* table, int64_t d_model, const int32_t* ids, int64_t n_tokens,
               float* out, Stream s, Half t = Half::BF16);

// dst = src converted between the 16-bit floats (f16 saturates). src, dst: [n]
void convert_half(const half_bits* src, Half from, half_bits* dst, Half to, int64_t n, Stream s);
// Largest |value| of src: [n] (NaN ignored); waits for the result.
float max_abs_half(const half_bits* src, Half t, int64_t n, Stream s);

// Per row y = x * rsqrt(mean(x^2) + eps) * w.  x, y: [M, D] (may alias); w: [D] f32
void rms_norm(const float* x, const float* w, float eps, int64_t M, int64_t D, float* y, Stream s);

// y = rms_norm(x) * g · wᵀ in one stream GEMV (the norm in its prologue), for
// a decode step's first projection and its logits: no norm kernel, no h.
// norm_matmul_fits: the shapes it takes (M <= stream_rows(), K % 8 == 0 up to 18432;
// operands must be 16-byte aligned).
// x: [M, K] f32 contiguous; g: [K] f32; w: [N, K] half; y: [M, N] f32 contiguous
bool norm_matmul_fits(int64_t M, int64_t K, int64_t N);
void norm_matmul(const float* x, int64_t M, int64_t K, const float* g, float eps, const half_bits* w, Half wt,
                 int64_t N, float* y, Stream s);
// The same for the rows matmul_half sends to cuBLASLt: the norm writes
// cuBLASLt's 16-bit input itself (the bits to_half would make of its f32
// result), so no f32 copy of the normed x is written and read back.
// add_norm_matmul_tc adds o into x first (x += o, as add_rms_norm). Both
// return false, having launched nothing, where matmul_half would not use
// cuBLASLt (M <= kSkinnyMaxM or > 65535, exact matmuls, no algorithm); the
// caller then norms into f32.
// x, o: [M, K] f32 contiguous; g: [K] f32; w: [N, K] half; y: [M, N] f32 contiguous
bool norm_matmul_tc(const float* x, int64_t M, int64_t K, const float* g, float eps, const half_bits* w, Half wt,
                    int64_t N, float* y, Stream s);
bool add_norm_matmul_tc(float* x, const float* o, const float* g, float eps, int64_t M, int64_t K, const half_bits* w,
                        Half wt, int64_t N, float* y, Stream s);
// The row-wise kernels with their results rounded to Half t (the matmul
// inputs above). x, o: [M, D] f32; w: [D] f32; y, h, out: [M, D] half
void rms_norm_half(const float* x, const float* w, float eps, int64_t M, int64_t D, Half t, half_bits* y, Stream s);
void add_rms_norm_half(float* x, const float* o, const float* w, float eps, int64_t M, int64_t D, Half t,
                       half_bits* h, Stream s);
void swiglu_packed_half(const float* gate_up, int64_t M, int64_t D, Half t, half_bits* out, Stream s);

void add_inplace(float* a, const float* b, int64_t n, Stream s);               // a += b
void swiglu(const float* gate, const float* up, float* out, int64_t n, Stream s);  // silu(g) * u

// The residual add fused with the next block's norm: x += o, then
// h = x * rsqrt(mean(x^2) + eps) * w per row. x, o, h: [M, D] (h distinct); w: [D] f32
void add_rms_norm(float* x, const float* o, const float* w, float eps, int64_t M, int64_t D, float* h, Stream s);

// The end of a decoder block at decode (gemv.cu), as four stream GEMVs
// with the residual adds, norms and SwiGLU fused into their ends:
//   x += a · w_outᵀ;  out = down · swiglu(gate_up · (rms_norm(x) * g))
// and with the next block's input projection (n_next > 0):
//   x += out;  y_next = w_next · (rms_norm(x) * g_next)
// (n_next = 0: x is left at x + a · w_outᵀ).
struct BlockTail {
  const float* a = nullptr;  // [M, Ka]
  int64_t M = 0, Ka = 0, D = 0, F = 0;
  const half_bits* w_out = nullptr;  // [D, Ka]
  Half w_out_t = Half::BF16;
  float* x = nullptr;        // [M, D] residual, updated in place
  const float* g = nullptr;  // [D] f32
  float eps = 0;
  const half_bits* gate_up = nullptr;  // [2F, D]: gate rows, then up rows
  Half gate_up_t = Half::BF16;
  const half_bits* down = nullptr;  // [D, F]
  Half down_t = Half::BF16;
  float* act = nullptr;  // [M, F] scratch
  float* out = nullptr;  // [M, D]
  int64_t n_next = 0;
  const half_bits* w_next = nullptr;  // [n_next, D]
  Half w_next_t = Half::BF16;
  const float* g_next = nullptr;  // [D] f32
  float* y_next = nullptr;        // [M, n_next]
};
// The shapes the stream GEMVs take (M <= 8; K of each up to 18432, a multiple of 8).
bool block_tail_fits(int64_t M, int64_t Ka, int64_t D, int64_t F, int64_t n_next = 0);
void block_tail(const BlockTail& t, Stream s);

// SwiGLU on a fused gate/up projection: out[m, i] = silu(gu[m, i]) * gu[m, D + i].
// gate_up: [M, 2 * D] f32; out: [M, D] f32
void swiglu_packed(const float* gate_up, int64_t M, int64_t D, float* out, Stream s);
// y = swiglu_packed(gate_up) · wᵀ: swiglu_packed into act ([M, D] f32
// scratch), then matmul_half; on matmul_half's cuBLASLt path the SwiGLU
// writes the 16-bit input itself (act unwritten). gate_up: [M, 2D]; w: [N, D]; y: [M, N].
void swiglu_matmul(const float* gate_up, int64_t M, int64_t D, const half_bits* w, Half wt, int64_t N, float* act,
                   float* y, Stream s);

// Rotate-half RoPE in place on the first 2*half dims of each head.
// x: [n_tokens, n_head, head_dim] f32; positions: [n_tokens]; inv_freq: [half] f32
void rope(float* x, int64_t n_tokens, int64_t n_head, int64_t head_dim, const int32_t* positions,
          const float* inv_freq, int64_t half, Stream s);

// Where each token of a batch sits, on the device (uploaded once per forward).
struct AttnMeta {
  const int32_t* positions = nullptr;     // [n_tokens] position of each token in its row
  const int32_t* slot_mapping = nullptr;  // [n_tokens] cache slot = block * block_size + offset
  const int32_t* token_row = nullptr;     // [n_tokens] row of each token
  const int32_t* block_tables = nullptr;  // [n_rows, max_blocks] block ids of each row
  int32_t max_blocks = 0;                 // row stride of block_tables
  int32_t n_tokens = 0;
  int32_t max_context = 0;                // upper bound on position + 1 (sizes the grid)
  int32_t max_row_tokens = 0;             // most tokens of any one row; 1 = a pure decode batch
                                          // (0 = unknown: the path follows n_tokens alone)
  int32_t n_rows = 0;                     // rows (sequences) of the batch; 0 = unknown (n_tokens)
};

// k, v: [n_tokens, kv_dim] f32 -> caches [n_blocks, block_size, kv_dim] of Half kv at slot_mapping.
void store_kv(const float* k, const float* v, int64_t kv_dim, const AttnMeta& meta,
              half_bits* k_cache, half_bits* v_cache, Stream s, Half kv = Half::BF16);

// After the fused q/k/v projection of a decoder layer, one pass per token:
// per-head RMSNorm of q and k (when the gains are given: Qwen3), RoPE on q and
// k, q written out, k and v stored into the cache at slot_mapping (a negative
// slot skips the store). Each stage computes what rms_norm, rope and
// store_kv compute.
// qkv: [n_tokens, (n_head + 2 * n_head_kv) * head_dim] f32 (q heads, k heads, v heads);
// q_norm, k_norm: [head_dim] f32 or null; inv_freq: [half]; q_out: [n_tokens, n_head, head_dim] f32;
// caches: [n_slots, n_head_kv * head_dim] of Half kv. gate_out non-null: each
// query head in qkv is followed by its output gate (Qwen3.5's q_proj), and the
// gates are copied to gate_out [n_tokens, n_head, head_dim].
void qkv_rope_store(const float* qkv, int64_t n_head, int64_t n_head_kv, int64_t head_dim, const float* q_norm,
                    const float* k_norm, float eps, const float* inv_freq, int64_t half, const AttnMeta& meta,
                    float* q_out, half_bits* k_cache, half_bits* v_cache, Stream s, Half kv = Half::BF16,
                    float* gate_out = nullptr);

// Causal GQA attention over the paged cache: token t at position p attends to
// positions [max(0, p - window + 1), p] of its row (window 0 = unlimited).
// q, out: [n_tokens, n_head, head_dim] f32; caches [n_blocks, block_size, n_head_kv, head_dim] of Half kv.
// Path: n_tokens <= 8 or max_row_tokens == 1 -> flash-decoding (the context
// split across blocks, partial results in `workspace`, which must hold
// attention_workspace_bytes() bytes); otherwise a tiled tensor-core kernel
// (FlashAttention-2 style, Q and P rounded to the caches' type). head_dim:
// 16, 32, 64, 128 or 256; n_head / n_head_kv <= 128.
size_t attention_workspace_bytes(int64_t n_tokens, int64_t n_head, int64_t head_dim, int64_t max_context);
void paged_attention(const float* q, const half_bits* k_cache, const half_bits* v_cache,
                     int64_t block_size, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                     const AttnMeta& meta, float scale, int32_t window, float* out, void* workspace,
                     Stream s, Half kv = Half::BF16);

// qkv_rope_store and paged_attention in one launch, for a pure decode batch
// (meta.max_row_tokens == 1: one new token a row) without output gates on
// the tensor-core decode kernel: each attention block norms and rotates its
// query heads from qkv, and the block whose split holds the token's position
// writes the token's K/V into the caches (a negative slot skips the store, as
// there). Same results, bit for bit. decode_attention_rope_fits says when it
// applies (any batch); the ops take it for one token (kRopeFusedTokens):
// every block redoes its query heads' norm and RoPE, which costs more than
// it saves at larger batches. Arguments as the two ops'.
constexpr int64_t kRopeFusedTokens = 1;
bool decode_attention_rope_fits(int64_t n_head, int64_t n_head_kv, int64_t head_dim, const AttnMeta& meta,
                                bool gated);
void decode_attention_rope(const float* qkv, const float* q_norm, const float* k_norm, float eps,
                           const float* inv_freq, int64_t half, half_bits* k_cache, half_bits* v_cache,
                           int64_t block_size, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                           const AttnMeta& meta, float scale, int32_t window, float* out, void* workspace, Stream s,
                           Half kv = Half::BF16);

// out[r] = argmax over logits[r, :] (first index on ties). logits: [n_rows, n_vocab]
// host_out: null, or page-locked host memory (HostLanding) written as well, so
// that no copy to the host follows.
void argmax(const float* logits, int64_t n_rows, int64_t n_vocab, int32_t* out, int32_t* host_out, Stream s);

// One row's sampling parameters (runtime/sampler.h), its uniform drawn on the host.
struct SampleRow {
  float temperature;  // 0: greedy (argmax)
  int32_t top_k;      // 0: off
  float top_p;        // 1: off
  float min_p;        // 0: off
  float uniform;      // [0, 1)
};
// A token's penalties in one row: logit = (logit > 0 ? logit / repetition : logit * repetition) - subtract.
struct PenaltyEntry {
  int32_t row;
  int32_t token;
  float repetition;  // 1: none
  float subtract;    // presence + frequency * count, 0: none
};
// logits: [n_rows, n_vocab], in place; entries: [n_entries] (at most one per (row, token)).
void apply_penalties(float* logits, int64_t n_vocab, const PenaltyEntry* entries, int64_t n_entries, Stream s);
// Per row: temperature 0 -> argmax; otherwise softmax(logits / temperature)
// restricted to the top_k best (ties to the lower id), then to the shortest
// prefix of them whose mass reaches top_p, then to those with at least min_p
// times the top probability, and one token drawn with `uniform`, walking the
// kept tokens in id order. Deterministic. logits: [n_rows, n_vocab];
// rows: [n_rows] (device); out: [n_rows] (device); host_out as argmax's
void sample(const float* logits, int64_t n_rows, int64_t n_vocab, const SampleRow* rows, int32_t* out,
            int32_t* host_out, Stream s);

// ---- Linear attention (Gated DeltaNet) --------------------------------------
// Behind the ops of the same names in backend/ops.h (linear_attn.cu); each
// reproduces its CPU op in backend/cpu/linear_attn_cpu.cpp.

// One row of a flattened batch as the recurrent kernels read it (the layout
// of ops::RecurrentRow): tokens [token_begin, token_begin + n_tokens)
// continue the state in `slot`.
struct RecurrentRow {
  int32_t token_begin;
  int32_t n_tokens;
  int32_t slot;
};

// y[m, :] = x[m, begin : begin + n].  x: [M, N] f32; y: [M, n] f32
void slice_cols(const float* x, int64_t M, int64_t N, int64_t begin, int64_t n, float* y, Stream s);

// ops::keep_recurrent_inputs: rows of 2..n_pos tokens copy each token's conv
// input and gates (proj columns [0, n_conv) and [n_conv + n_z, P)) to
// inputs[slot, position % n_pos]. proj: [n_tokens, P]; positions, token_row:
// [n_tokens] (device); rows: the batch's rows (device); inputs: [n_slots, n_pos, width]
void keep_recurrent_inputs(const float* proj, int64_t n_tokens, int64_t P, int64_t n_conv, int64_t n_z,
                           const int32_t* positions, const int32_t* token_row, const RecurrentRow* rows,
                           int64_t n_pos, int64_t width, float* inputs, Stream s);
// ops::load_recurrent_inputs: out[t] = inputs[slot, position % n_pos] for every
// token. inputs: [n_slots, n_pos, width]; out: [n_tokens, width]
void load_recurrent_inputs(const float* inputs, int64_t n_tokens, const int32_t* positions, const int32_t* token_row,
                           const RecurrentRow* rows, int64_t n_pos, int64_t width, float* out, Stream s);

// Causal depthwise conv1d over each row's tokens continuing its kept tail,
// SiLU when `silu`; leaves the last K-1 inputs of each row in its slot.
// x, out: [n_tokens, C] f32; w: [C, K] f32; rows: [n_rows] (device);
// conv_state: [n_slots, K-1, C] f32; max_row_tokens: bound on any row's n_tokens.
void causal_conv1d(const float* x, const float* w, int64_t C, int64_t K, const RecurrentRow* rows, int64_t n_rows,
                   int64_t max_row_tokens, float* conv_state, bool silu, float* out, Stream s);

// Per row y = x / sqrt(sum(x^2) + eps).  x, y: [M, D] f32 (may alias)
void l2norm(const float* x, float eps, int64_t M, int64_t D, float* y, Stream s);

// g = -exp(a_log) * softplus(a + dt_bias), beta = sigmoid(b).
// a, b, g, beta: [n_tokens, n_head] f32; a_log, dt_bias: [n_head] f32
void delta_rule_gates(const float* a, const float* b, const float* a_log, const float* dt_bias, int64_t n_tokens,
                      int64_t n_head, float* g, float* beta, Stream s);

// Shapes of one gated-delta-rule call.
struct DeltaRuleDims {
  int64_t n_head_k, n_head, head_dim_k, head_dim_v;
};
// The gated delta rule (see ops.h). q, k: [n_tokens, n_head_k, head_dim_k] f32;
// v, out: [n_tokens, n_head, head_dim_v] f32; g, beta: [n_tokens, n_head] f32;
// rows: [n_rows] (device); state: [n_slots, n_head, head_dim_k, head_dim_v] f32.
// head_dim_k <= 256.
// Recurrent form: one block per (row, value head, 32 state columns); the
// state is read and written once per call, held in registers across tokens.
// Work a decode step folds into the recurrent form (DeltaRuleFusion given):
// g and beta from the raw projections a, b [n_tokens, n_head] as
// delta_rule_gates makes them (g, beta unused), and, when l2norm, q and k
// L2-normalised with eps as the l2norm op does (q, k raw).
struct DeltaRuleFusion {
  const float* a = nullptr;
  const float* b = nullptr;
  const float* a_log = nullptr;
  const float* dt_bias = nullptr;
  bool l2norm = false;
  float eps = 1e-6f;
};
void gated_delta_rule_recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta,
                                float scale, const DeltaRuleDims& dims, const RecurrentRow* rows, int64_t n_rows,
                                float* state, float* out, Stream s, const DeltaRuleFusion* fuse = nullptr);
// Chunked form (chunk_size <= 64 tokens, f32 throughout): every chunk's
// UT transform at once into scratch, then one block per (row, value head, 32
// state columns) walking the row's chunks. n_tokens: the tokens of q, k, v.
void gated_delta_rule_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta,
                              float scale, int64_t chunk_size, const DeltaRuleDims& dims, const RecurrentRow* rows,
                              int64_t n_rows, int64_t n_tokens, float* state, float* out, Stream s);

// ops::delta_rule_inputs: the conv + SiLU over proj's columns [0, C), q and
// k heads L2-normalised, and the gates from b, a at proj columns [ba_col,
// ba_col + 2 n_head), as causal_conv1d, l2norm and delta_rule_gates compute
// them. proj: [n_tokens, P]; conv_w: [C, K]; rows: [n_rows] (device);
// conv_state: [n_slots, K-1, C]; q, k: [n_tokens, n_head_k, head_dim_k]; v:
// [n_tokens, n_head, head_dim_v]; g, beta: [n_tokens, n_head]. head_dim_k <=
// 256, head_dim_v <= 1024.
void delta_rule_inputs(const float* proj, int64_t P, int64_t ba_col, const float* conv_w, int64_t K,
                       const DeltaRuleDims& dims, const float* a_log, const float* dt_bias, float qk_eps,
                       const RecurrentRow* rows, int64_t n_rows, int64_t max_row_tokens, float* conv_state, float* q,
                       float* k, float* v, float* g, float* beta, Stream s);

// Qwen3NextRMSNormGated: y = w * (x / sqrt(mean(x^2) + eps)) * silu(z).
// x, y: [M, D] f32 (y may alias x); w: [D] f32; z: rows of z_width (a
// multiple of D) at stride ldz, x's row m gated by z's row m / (z_width / D)
// from column (m % (z_width / D)) D
void gated_rms_norm(const float* x, const float* z, int64_t z_width, int64_t ldz, const float* w, float eps,
                    int64_t M, int64_t D, float* y, Stream s);

// y = x * sigmoid(gate); gate [M, N], or [M] when per_row.  x, y: [M, N] f32 (may alias)
void sigmoid_mul(const float* x, const float* gate, bool per_row, int64_t M, int64_t N, float* y, Stream s);

// ---- Mixture of experts (moe.cu) ----------------------------------------------

// Top-k routing over a softmax in f32 (ties to the lower expert id),
// renormalised when `normalize`. logits: [n_tokens, n_expert];
// weights: [n_tokens, top_k] f32; ids: [n_tokens, top_k] i32. top_k <= 32.
void moe_route(const float* logits, int64_t n_tokens, int64_t n_expert, int64_t top_k, bool normalize,
               float* weights, int32_t* ids, Stream s);

// The routed experts' SwiGLU MLPs, summed with the routing weights per token
// in ascending expert order (out overwritten). On the device throughout: the
// (token, expert) pairs are sorted by expert, then two grouped GEMMs read
// each routed expert's weights once per tile of up to 32 of its tokens.
// x, out: [n_tokens, d_model] f32; gate_up: [n_expert, 2 * d_ff, d_model]
// (per expert gate rows, then up rows) and down: [n_expert, d_model, d_ff],
// of Half wt; ids, weights: [n_tokens, top_k]; workspace: moe_workspace_bytes().
size_t moe_workspace_bytes(int64_t n_tokens, int64_t top_k, int64_t n_expert, int64_t d_model, int64_t d_ff);
void moe_experts(const float* x, int64_t n_tokens, int64_t d_model, const half_bits* gate_up,
                 const half_bits* down, Half wt, int64_t n_expert, int64_t d_ff, const int32_t* ids,
                 const float* weights, int64_t top_k, float* out, void* workspace, Stream s);

}  // namespace augur::cuda

namespace augur::cuda {

// CUDA graphs of the backend stream: everything launched between
// begin_capture() and end_capture() is recorded, not run, and replays with
// launch() (same pointers, same sizes). Decode steps are captured once per
// batch shape, so a step costs one launch instead of hundreds.
class Graph;
struct GraphDeleter {
  void operator()(Graph* g) const;
};
using GraphPtr = std::unique_ptr<Graph, GraphDeleter>;
void begin_capture();
GraphPtr end_capture();
// Ends a capture that went wrong (an exception mid-way), discarding it.
void abort_capture() noexcept;
void launch(Graph& g);

}  // namespace augur::cuda
