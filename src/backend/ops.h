// The op set that model code calls. Ops take tensor views and check their
// arguments (the op name leads every message); the device of the tensors picks
// the implementation. Every op has a CPU implementation, the reference for
// other backends. Activations are f32; weights may be bf16 or f32.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/tensor.h"

namespace augur::cuda {
class HostLanding;
}

namespace augur::ops {

// out[t, :] = table[ids[t], :]
// table: [n_vocab, d_model] bf16|f32; out: [n_tokens, d_model] f32. On CUDA the
// ids come from device->tokens (checked against `ids` on the host).
struct DeviceBatch;
void embedding(const Tensor& table, std::span<const int32_t> ids, const Tensor& out,
               const DeviceBatch* device = nullptr);

// y = x · wᵀ (PyTorch Linear).  x: [M, K] f32; w: [N, K] bf16|f32; y: [M, N] f32
void linear(const Tensor& x, const Tensor& w, const Tensor& y);

// Per row: y = x / sqrt(mean(x²) + eps) * w.  x, y: [M, D] f32 (may alias); w: [D] f32
void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& y);
// y = (rms_norm(x) * g) · wᵀ: on CUDA for at most 2 rows one stream GEMV with
// the norm in its prologue (a decode step's first projection, its logits),
// otherwise rms_norm into h, then linear (on CUDA's tensor-core path the norm
// writes the matmul's 16-bit input itself, the same bits, and h is not
// written). x, h: [M, K]; g: [K]; w: [N, K]; y: [M, N]
void rms_norm_linear(const Tensor& x, const Tensor& g, float eps, const Tensor& w, const Tensor& h, const Tensor& y);

// a += b.  a, b: same shape, f32
void add_inplace(const Tensor& a, const Tensor& b);

// y[m, :] += bias per row (a no-op for an undefined bias). y: [M, N] f32;
// bias: [N] f32. The CPU only so far (no CUDA family has biases).
void add_bias(const Tensor& y, const Tensor& bias);

// out = silu(gate) * up.  gate, up, out: [M, D] f32 (out may alias gate)
void swiglu(const Tensor& gate, const Tensor& up, const Tensor& out);

// x += o, then h = x / sqrt(mean(x²) + eps) * w per row: the residual add
// fused with the next block's norm (add_inplace then rms_norm).
// x, o, h: [M, D] f32 (h distinct from x and o); w: [D] f32
void add_rms_norm(const Tensor& x, const Tensor& o, const Tensor& w, float eps, const Tensor& h);

// SwiGLU on a fused gate/up projection: out = silu(gate_up[:, :D]) * gate_up[:, D:].
// gate_up: [M, 2D] f32; out: [M, D] f32
void swiglu_packed(const Tensor& gate_up, const Tensor& out);

// The down projection of a fused-gate/up MLP: y = swiglu_packed(gate_up) · wᵀ.
// act: [M, D] f32 scratch for the SwiGLU (not written where, on CUDA, the
// SwiGLU writes the matmul's 16-bit input). gate_up: [M, 2D]; w: [N, D]; y: [M, N]
void swiglu_linear(const Tensor& gate_up, const Tensor& w, const Tensor& act, const Tensor& y);

// The rest of a pre-norm decoder block after its mixer, with a fused gate/up
// SwiGLU MLP (gate_up stacked: gate rows, then up rows):
//   x += a · w_outᵀ;  out = down · swiglu_packed(gate_up · (rms_norm(x) * g))
// and with w_next (the next block's input projection, or the LM head):
//   x += out;  y_next = (rms_norm(x) * g_next) · w_nextᵀ
// (without it x is left at x + a · w_outᵀ, out not added). On CUDA with the
// rows the stream GEMV takes (ProductKernels): stream GEMVs with the residual
// adds, norms and SwiGLU in their ends (h and gu not written); elsewhere
// linear, add_rms_norm, linear, swiglu_linear (+ add_rms_norm, linear)
// through the scratch h, gu, act (on CUDA's tensor-core path the norms and
// the SwiGLU write the matmuls' 16-bit inputs themselves, the same bits, and
// h and act are not written).
// a: [M, Ka]; w_out: [D, Ka]; x, h, out: [M, D]; g, g_next: [D] f32;
// gate_up: [2F, D]; down: [D, F]; gu: [M, 2F]; act: [M, F]; w_next: [N, D]; y_next: [M, N]
void block_tail(const Tensor& a, const Tensor& w_out, const Tensor& x, const Tensor& g, float eps,
                const Tensor& gate_up, const Tensor& down, const Tensor& h, const Tensor& gu, const Tensor& act,
                const Tensor& out, const Tensor& w_next = Tensor(), const Tensor& g_next = Tensor(),
                const Tensor& y_next = Tensor());

// The kernels of the matrix products a forward queues on this thread while
// this lives, by the batch's longest row (in tokens) and the model's width.
// On CUDA the stream GEMV takes up to 8 rows of x and computes each as it
// would alone, which a verify window needs (its tokens must come out as
// decode steps' would). A batch of one token a row has no window to match,
// and past decode_stream_rows(d_model) rows its products go to cuBLASLt's
// tensor cores, faster there than the stream GEMV's f32 FMAs.
class ProductKernels {
 public:
  ProductKernels(Device device, int64_t max_row_tokens, int64_t d_model);
  ~ProductKernels();
  ProductKernels(const ProductKernels&) = delete;
  ProductKernels& operator=(const ProductKernels&) = delete;

 private:
  int64_t was_ = 0;  // the stream rows before, 0 where nothing was set
};
// The crossover follows where the stream GEMV keeps x in registers: up to 5
// rows where d_model is at most 4096 (then every product but the MLP's down
// holds x there), 3 where it is wider (from 3 rows on x is restaged from
// shared memory for every stage of weights, which at 4 costs more than the
// tensor cores lose). Decode steps on an H100 (docs/benchmarks.md), stream
// GEMV against cuBLASLt: qwen3-8b (4096) 6.09 against 6.42 ms at 5 rows,
// 6.88 against 6.49 at 6; qwen3.5-27b (5120) 19.4 against 20.2 at 3 rows,
// 24.4 against 20.4 at 4.
int64_t decode_stream_rows(int64_t d_model);

// Paged KV cache of one layer: fixed-size blocks of token slots.
struct KvLayer {
  Tensor k;  // [n_blocks, block_size, n_head_kv, head_dim] f32 (CPU) or bf16/f16 (CUDA)
  Tensor v;  // [n_blocks, block_size, n_head_kv, head_dim] f32 (CPU) or bf16/f16 (CUDA)
};

// One row of a flattened batch, as the attention ops see it: tokens
// [token_begin, token_begin + n_tokens) of the batch sit at positions
// pos0, pos0 + 1, ...; the row's KV lives in the blocks of block_table.
struct AttnRow {
  int32_t token_begin;
  int32_t n_tokens;
  int32_t pos0;
  std::span<const int32_t> block_table;
  int32_t state_slot = -1;  // recurrent-state slot (models with recurrent layers)
};

// The batch layout on an accelerator: built from the host rows once per
// forward, so that kernels read positions and block tables from device
// memory (and a captured CUDA graph can replay with new ones).
struct DeviceBatch {
  Tensor tokens;        // [n_tokens] i32
  Tensor positions;     // [n_tokens] i32
  Tensor slot_mapping;  // [n_tokens] i32: block * block_size + offset of each token (-1: a row without blocks)
  Tensor token_row;     // [n_tokens] i32
  Tensor block_tables;  // [n_rows, max_blocks] i32 (unused entries -1)
  int32_t max_blocks = 0;
  int32_t max_context = 0;     // bound on position + 1 that sizes attention grids
  int32_t max_row_tokens = 0;  // 1: a pure decode batch
  int32_t n_rows = 0;          // rows (sequences) of the batch
  // [n_rows] RecurrentRow {token_begin, n_tokens, state_slot}: the rows as
  // the recurrent ops take them, refilled with the rest, so that replayed
  // decode graphs of hybrid models follow the rows' slots.
  Tensor recurrent_rows;
  // When defined, the ids the forward embeds instead of `tokens` ([n_tokens]
  // i32: a previous step's samples, left on the device).
  Tensor fed_tokens;
};

// Where the tokens of a batch sit: host rows and positions always, and the
// device copy when the tensors live on an accelerator.
struct BatchView {
  std::span<const AttnRow> rows;
  std::span<const int32_t> positions;  // [n_tokens]
  const DeviceBatch* device = nullptr;
};

// Builds the device copy of a layout (block_size of the cache it addresses;
// max_context a bound on every position + 1).
DeviceBatch upload_batch(Device d, std::span<const int32_t> tokens, std::span<const AttnRow> rows,
                         int64_t block_size, int64_t max_context);
// Refills `into` (same sizes: a replayed graph reads it) with a new layout.
void reupload_batch(const DeviceBatch& into, std::span<const int32_t> tokens, std::span<const AttnRow> rows,
                    int64_t block_size);

// Rotary embedding, rotate-half (GPT-NeoX) layout, on the first 2*len(inv_freq)
// dims of each head; the rest pass through.
// x: [n_tokens, n_head, head_dim] f32, in place; inv_freq: [rot_dim / 2] f32 on x's device
void rope(const Tensor& x, const BatchView& batch, const Tensor& inv_freq);

// Writes k, v of every token into its row's slots (position p of a row lives
// in block block_table[p / block_size], slot p % block_size).
// k, v: [n_tokens, n_head_kv, head_dim] f32
void store_kv(const Tensor& k, const Tensor& v, const BatchView& batch, const KvLayer& cache);

// After a fused q/k/v projection: per-head RMSNorm of q and k when q_norm and
// k_norm are defined (Qwen3), RoPE on q and k, q written to q_out, k and v
// written into the cache; the same as slicing, rms_norm, rope and store_kv.
// qkv: [n_tokens, (n_head + 2 n_head_kv) * head_dim] f32 (q heads, then k, then v);
// q_norm, k_norm: [head_dim] f32 or undefined; q_out: [n_tokens, n_head, head_dim] f32
// gate_out defined: each query head in qkv is followed by its output gate
// (gated attention's q_proj: qkv [n_tokens, (2 n_head + 2 n_head_kv) * head_dim]),
// and the gates are copied to gate_out [n_tokens, n_head * head_dim] f32.
void qkv_rope_store(const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm, float eps,
                    const BatchView& batch, const Tensor& inv_freq, const KvLayer& cache, const Tensor& q_out,
                    const Tensor& gate_out = Tensor());

// qkv_rope_store, then paged_attention, then (gated) out *= sigmoid(gate):
// attention from the fused q/k/v projection. On CUDA, for one new token
// without an output gate, one kernel does it all (the same results, bit for
// bit); otherwise exactly those ops, with q as qkv_rope_store's q_out.
// q: [n_tokens, n_head, head_dim] f32 scratch; gate: undefined, or
// [n_tokens, n_head * head_dim] f32 scratch meaning qkv holds gated
// attention's layout (as qkv_rope_store's gate_out); out: [n_tokens, n_head,
// head_dim] f32; workspace: attention_workspace(q, batch) floats.
void qkv_rope_attention(const Tensor& qkv, const Tensor& q_norm, const Tensor& k_norm, float eps,
                        const BatchView& batch, const Tensor& inv_freq, const KvLayer& cache, float scale,
                        int32_t window, const Tensor& q, const Tensor& gate, const Tensor& out,
                        const Tensor& workspace);

// Causal attention over the paged cache, GQA (n_head a multiple of n_head_kv):
// token t of a row at position p attends to positions [max(0, p - window + 1), p]
// of its row (window 0 = unlimited).
// q: [n_tokens, n_head, head_dim] f32; out: [n_tokens, n_head, head_dim] f32;
// workspace: attention_workspace(...) elements of f32 on q's device (CUDA's
// split-context partials; unused on the CPU), owned by the caller so that a
// captured graph keeps addressing it.
int64_t attention_workspace(const Tensor& q, const BatchView& batch);
void paged_attention(const Tensor& q, const KvLayer& cache, const BatchView& batch, float scale,
                     int32_t window, const Tensor& out, const Tensor& workspace);

// ---- Sampling ---------------------------------------------------------------

// One row's sampling parameters (runtime/sampler.h), with its uniform drawn.
struct SampleRow {
  float temperature = 0;  // 0: greedy (argmax)
  int32_t top_k = 0;      // 0: off
  float top_p = 1;        // 1: off
  float min_p = 0;        // 0: off
  float uniform = 0;      // [0, 1)
};

// A token's penalties in one row (RepetitionPenaltyLogitsProcessor, then the
// OpenAI presence/frequency penalties):
//   logit = (logit > 0 ? logit / repetition : logit * repetition) - subtract
struct PenaltyEntry {
  int32_t row = 0;
  int32_t token = 0;
  float repetition = 1;  // 1: none
  float subtract = 0;    // presence + frequency * count
};

// logits: [n_rows, n_vocab] f32, in place; at most one entry per (row, token).
void apply_penalties(const Tensor& logits, std::span<const PenaltyEntry> entries);

// One token per row of logits: [n_rows, n_vocab] f32 (any device); ids: [n_rows] on the host.
// Temperature 0 is argmax (first id on ties). Otherwise the distribution
// softmax(logits / temperature) restricted, in rank order (logit desc, id asc),
// to the top_k best, then to the shortest prefix whose mass reaches top_p of
// theirs, then to the tokens with at least min_p times the top probability;
// one token is drawn with `uniform`, walking the kept tokens in id order.
// Only ids cross to the host.
void sample(const Tensor& logits, std::span<const SampleRow> rows, std::span<int32_t> ids);
// sample()'s rule in two halves, on the host, for one row (speculative
// verification): the weights it draws from (weights: [n_vocab], zero outside
// the kept tokens, not normalised; row.uniform unused), and the token its
// walk in id order picks for `uniform` from any such weights.
void sample_weights(std::span<const float> logits, const SampleRow& row, std::span<float> weights);
int32_t sample_pick(std::span<const float> weights, float uniform);

// Ids sampled where their logits are, on their way to the host: device()
// ([n_rows] i32 on the logits' device) can feed the next forward at once
// (Runner::step_ahead), so the host queues it before it reads host().
class SampledIds {
 public:
  SampledIds() = default;
  // Ids the host already has (logits sampled on the host).
  static SampledIds on_host(std::span<const int32_t> ids);
  const Tensor& device() const { return device_; }
  // Waits for the ids to land on the host (once).
  std::span<const int32_t> host();

 private:
  friend SampledIds sample_async(const Tensor&, std::span<const SampleRow>, const Tensor&);
  Tensor device_;
  std::vector<int32_t> host_;
  std::shared_ptr<cuda::HostLanding> landing_;  // written by the sampling kernel, until host()
};
// sample() without waiting: the same draws, the ids left on the logits' device
// (in `into`, [n_rows] i32 there, when given: a buffer a captured graph reads)
// and written to the host by the same kernel.
SampledIds sample_async(const Tensor& logits, std::span<const SampleRow> rows, const Tensor& into = Tensor());

// ---- Linear attention (Gated DeltaNet) -------------------------------------

// y[m, :] = x[m, begin : begin + n]: a block of columns.  x: [M, N] f32; y: [M, n] f32
void slice_cols(const Tensor& x, int64_t begin, const Tensor& y);

// One row of a flattened batch as the recurrent ops see it: tokens
// [token_begin, token_begin + n_tokens) continue the state held in `slot`.
// On an accelerator the ops take the rows from `device` (the batch's
// DeviceBatch::recurrent_rows) when given and `rows` are all of its rows (a
// replayable step); otherwise they copy `rows` to the device themselves.
struct RecurrentRow {
  int32_t token_begin;
  int32_t n_tokens;
  int32_t slot;
};

// Recurrent state of one linear-attention layer, one slot per live sequence.
struct RecurrentLayer {
  Tensor conv;   // [n_slots, conv_tail, conv_dim] f32: the last K-1 inputs of the conv
  Tensor state;  // [n_slots, n_head, head_dim_k, head_dim_v] f32: the delta-rule matrix
  // [n_slots, n_pos, conv_dim + 2 n_head] f32: the inputs of the slot's
  // latest verify-window tokens, position p at p % n_pos (keep_recurrent_inputs).
  Tensor inputs;
};

// Causal depthwise conv1d over each row's tokens, continuing the inputs kept in
// its slot, then SiLU when `silu` (causal_conv1d_update / causal_conv1d_fn):
//   out[t, c] = sum_j w[c, j] * in[t - (K-1) + j, c]
// where `in` is the row's kept tail followed by its tokens. Leaves the last K-1
// inputs of each row in its slot. Rows must use distinct slots.
// x, out: [n_tokens, C] f32 (distinct); w: [C, K] f32; conv_state: [n_slots, K-1, C] f32
void causal_conv1d(const Tensor& x, const Tensor& w, std::span<const RecurrentRow> rows,
                   const Tensor& conv_state, bool silu, const Tensor& out,
                   const DeviceBatch* device = nullptr);

// Per row: y = x / sqrt(sum(x²) + eps) (FLA's l2norm).  x, y: [M, D] f32 (may alias)
void l2norm(const Tensor& x, float eps, const Tensor& y);

// Gates of the gated delta rule (Qwen3NextGatedDeltaNet.forward):
//   g = -exp(A_log) * softplus(a + dt_bias),  beta = sigmoid(b)
// a, b, g, beta: [n_tokens, n_head] f32; a_log, dt_bias: [n_head] f32
void delta_rule_gates(const Tensor& a, const Tensor& b, const Tensor& a_log, const Tensor& dt_bias,
                      const Tensor& g, const Tensor& beta);

// The gated delta rule over each row, starting from the state in its slot and
// leaving the final state there. Per value head, with S: [head_dim_k, head_dim_v]:
//   S <- exp(g_t) S;  S <- S + k_t (beta_t (v_t - Sᵀ k_t))ᵀ;  o_t = Sᵀ (scale q_t)
// Value head h reads query/key head h / (n_head / n_head_k) (repeat_interleave).
// q, k: [n_tokens, n_head_k, head_dim_k] f32 (L2-normalised by the caller);
// v, out: [n_tokens, n_head, head_dim_v] f32; g, beta: [n_tokens, n_head] f32;
// state: [n_slots, n_head, head_dim_k, head_dim_v] f32. Rows must use distinct slots.
//
// Recurrent form, one token at a time (torch_recurrent_gated_delta_rule): decode
// and short windows.
void gated_delta_rule_recurrent(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                const Tensor& beta, float scale, std::span<const RecurrentRow> rows,
                                const Tensor& state, const Tensor& out,
                                const DeviceBatch* device = nullptr);
// A decode step of the Gated DeltaNet core in one pass: q and k L2-normalised
// with qk_eps (as l2norm), g and beta from the raw projections (as
// delta_rule_gates), then the recurrent form. Equal to those three ops in
// turn; q and k are left as they are. Rows must be short (recurrent form).
// q, k: [n_tokens, n_head_k, head_dim_k] f32 (not yet normalised); a, b:
// [n_tokens, n_head] f32 (raw in_proj_a / in_proj_b); a_log, dt_bias: [n_head] f32
void gated_delta_rule_step(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& a, const Tensor& b,
                           const Tensor& a_log, const Tensor& dt_bias, float qk_eps, float scale,
                           std::span<const RecurrentRow> rows, const Tensor& state, const Tensor& out,
                           const DeviceBatch* device = nullptr);
// Chunked form (torch_chunk_gated_delta_rule): chunks of chunk_size tokens from
// each row's first token, intra-chunk work by the UT transform, one state update
// per chunk. Equal to the recurrent form within float rounding. (CUDA:
// chunk_size <= 64, head_dim_k <= 256, as for the recurrent form.)
void gated_delta_rule_chunked(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                              const Tensor& beta, float scale, int64_t chunk_size,
                              std::span<const RecurrentRow> rows, const Tensor& state, const Tensor& out,
                              const DeviceBatch* device = nullptr);

// The chunked form's inputs from a Gated DeltaNet's input projection, in one
// pass, bit for bit what these ops give in turn: proj's columns [0, C)
// through causal_conv1d with SiLU (continuing each row's kept tail and
// leaving its new one), its output split into q, k and v heads, q and k
// through l2norm with qk_eps, and delta_rule_gates over b = proj[:, ba_col :
// ba_col + n_head] and a = the next n_head columns. Only the rows' tokens are
// written. proj: [n_tokens, P] f32; conv_w: [C, K] with C = 2 n_head_k
// head_dim_k + n_head head_dim_v; conv_state: [n_slots, K-1, C]; q, k:
// [n_tokens, n_head_k, head_dim_k]; v: [n_tokens, n_head, head_dim_v]; g,
// beta: [n_tokens, n_head]; a_log, dt_bias: [n_head]. Rows must use distinct slots.
void delta_rule_inputs(const Tensor& proj, int64_t ba_col, const Tensor& conv_w, const Tensor& a_log,
                       const Tensor& dt_bias, float qk_eps, std::span<const RecurrentRow> rows,
                       const Tensor& conv_state, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                       const Tensor& beta, const DeviceBatch* device = nullptr);

// Keeps the inputs of every row of 2..n_pos tokens (a verify window) in its
// slot's input history: the token at position p goes to inputs[slot, p % n_pos]
// as [proj[t, 0:n_conv] | proj[t, n_conv + n_z : n_conv + n_z + 2 n_head]]
// (conv input, b, a: what the conv and the delta rule read). Other rows
// (decode steps, prefill chunks) keep nothing. A rollback then replays the
// recurrence over the kept tokens instead of the whole model.
// proj: [n_tokens, n_conv + n_z + 2 n_head] f32 (a Gated DeltaNet's input
// projection); inputs: [n_slots, n_pos, n_conv + 2 n_head] f32. On an
// accelerator, `batch` must carry the device layout of these rows.
void keep_recurrent_inputs(const Tensor& proj, int64_t n_conv, int64_t n_z, std::span<const RecurrentRow> rows,
                           const BatchView& batch, const Tensor& inputs);
// The inverse, for every row whatever its length: out[t] = inputs[slot,
// position % n_pos] (a rollback's replay reads its kept tokens back).
// inputs: [n_slots, n_pos, W] f32; out: [n_tokens, W] f32
void load_recurrent_inputs(const Tensor& inputs, std::span<const RecurrentRow> rows, const BatchView& batch,
                           const Tensor& out);

// Qwen3NextRMSNormGated: y = w * (x / sqrt(mean(x²) + eps)) * silu(z) per row.
// x, y: [M, D] f32 (y may alias x); w: [D] f32; z: M·D f32 in rows of a
// multiple of D, contiguous or a column slice of a wider tensor (the gate
// columns of a projection, read in place), x's rows taking z's in order.
void gated_rms_norm(const Tensor& x, const Tensor& z, const Tensor& w, float eps, const Tensor& y);

// y = x * sigmoid(gate); gate is [M, N] like x, or [M, 1] (one gate per row).
// x, y: [M, N] f32 (may alias)
void sigmoid_mul(const Tensor& x, const Tensor& gate, const Tensor& y);

// ---- Mixture of experts -----------------------------------------------------

// Top-k routing (Qwen2MoeTopKRouter / Qwen3NextTopKRouter): softmax over the
// experts in f32, the top_k largest in descending order (ties to the lower
// expert id), renormalised to sum to 1 when `normalize`.
// logits: [n_tokens, n_expert] f32; weights: [n_tokens, top_k] f32; ids: [n_tokens, top_k] i32,
// all on one device (CUDA: top_k <= 32, n_expert <= 12288)
void moe_route(const Tensor& logits, int64_t top_k, bool normalize, const Tensor& weights, const Tensor& ids);

// The routed experts of a sparse MoE block over stacked expert weights, on
// x's device without a host round trip: for each token, the SwiGLU MLPs of
// its experts (down(silu(gate x) * up x)) scaled by its routing weights and
// summed, in ascending expert id, into zeros (out is overwritten).
// x, out: [n_tokens, d_model] f32; gate_up: [n_expert, 2 d_ff, d_model] (per
// expert its gate rows, then its up rows); down: [n_expert, d_model, d_ff];
// weights: [n_tokens, top_k] f32; ids: [n_tokens, top_k] i32 (moe_route's);
// workspace: moe_experts_workspace(...) floats on x's device (CUDA; unused on the CPU).
int64_t moe_experts_workspace(const Tensor& x, const Tensor& gate_up, const Tensor& ids);
void moe_experts(const Tensor& x, const Tensor& gate_up, const Tensor& down, const Tensor& weights,
                 const Tensor& ids, const Tensor& out, const Tensor& workspace);

// out[i, :] = x[idx[i], :].  x: [M, N] f32; out: [len(idx), N] f32 (CPU only)
void gather_rows(const Tensor& x, std::span<const int32_t> idx, const Tensor& out);

// out[idx[i], :] += scale[i] * x[i, :], for i in order.
// x: [len(idx), N] f32; scale: [len(idx)]; out: [M, N] f32 (CPU only)
void scatter_add_rows(const Tensor& x, std::span<const int32_t> idx, std::span<const float> scale,
                      const Tensor& out);

}  // namespace augur::ops
