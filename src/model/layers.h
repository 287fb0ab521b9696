// Shared layers of decoder-only transformers. Family files compose these;
// each block names the transformers function it reproduces. Layers are ops
// over tensors: where a backend fuses ops it does so behind the op's entry
// point, and the layers here never branch on it.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "backend/executor.h"
#include "backend/ops.h"
#include "core/tensor.h"
#include "model/model.h"

namespace augur {

class JsonConfig;
class WeightSource;

// The transformer dimensions every decoder config.json states, as all
// families read them (transformers' names), validated: a missing or
// contradictory field is an error naming it.
struct TransformerDims {
  int64_t d_model = 0, n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  int64_t n_vocab = 0, max_position = 0;
  float rms_eps = 1e-6f;
  bool tie_embeddings = false;
  bool attention_bias = false;  // q/k/v/o biases
};
// head_dim defaults to hidden_size / num_attention_heads when absent.
TransformerDims read_transformer_dims(const JsonConfig& cfg);

// Validates rows against the model (token ids < n_vocab, positions within
// max_position) and flattens them.
BatchPlan plan_batch(std::span<const ForwardRow> rows, int64_t n_vocab, int64_t max_position);

// Projections that share an input are stacked by rows at load time (on every
// device alike), so that each runs as one matmul: q/k/v, gate/up, the
// DeltaNet's four. Biases stack the same way.
// 1-D parts (biases) back to back in one new vector.
Tensor stack_vectors(std::initializer_list<Tensor> parts);

struct AttentionWeights {
  // q, k, v stacked: [(n_head + 2 n_head_kv) * head_dim, d_model]; with an
  // output gate q_proj's [2 n_head * head_dim] rows (per head: query, gate) first.
  Tensor wqkv;
  Tensor wo;              // [d_model, n_head * head_dim]
  Tensor bqkv, bo;        // optional biases, f32
  Tensor q_norm, k_norm;  // optional per-head RMSNorm gains [head_dim], f32 (Qwen3)
  // Gated attention (Qwen3NextAttention): the attention output is multiplied
  // by sigmoid(gate) before wo.
  bool output_gate = false;
};

struct AttentionShape {
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  float scale = 0;       // usually 1/sqrt(head_dim)
  int32_t window = 0;    // sliding window, 0 = none
  float norm_eps = 0;    // for q_norm / k_norm
};

// Self-attention of one layer up to the output projection (LlamaAttention /
// Qwen3Attention / Qwen3NextAttention.forward): project, optional per-head q/k
// norm, RoPE, write K/V, attend, optional sigmoid output gate. Returns the
// input of o_proj, [n_tokens, n_head*head_dim] in scratch.
// x: [n_tokens, d_model] (already normed); `projected`: x · wqkvᵀ already
// computed (block_tail's next projection), or undefined.
Tensor attention_mix(const Tensor& x, const AttentionWeights& w, const AttentionShape& shape, const Tensor& inv_freq,
                     const ops::BatchView& batch, const ops::KvLayer& kv, Scratch& scratch,
                     const Tensor& projected = Tensor());

struct MlpWeights {
  Tensor gate_up;             // gate and up stacked [2 d_ff, d_model]
  Tensor down;                // [d_model, d_ff]
  Tensor b_gate_up, b_down;   // optional biases, f32
};
// gate_proj, up_proj, down_proj (+ biases) under prefix `p` ("...mlp."), stacked.
MlpWeights load_swiglu(WeightSource& w, const std::string& p, int64_t d_model, int64_t d_ff, bool bias = false);

// LlamaMLP.forward: down(silu(gate(x)) * up(x)). x, out: [n_tokens, d_model]
void swiglu_mlp(const Tensor& x, const MlpWeights& w, const Tensor& out, Scratch& scratch);

// The rest of a pre-norm block after its mixer (attention or DeltaNet):
// x += a · w_outᵀ (+ b_out); h = rms_norm(x) * norm; out = swiglu_mlp(h)
// (ops::block_tail). Given the next block's input projection next_w
// ([N, d_model]) and norm gain, also x += out, and returns
// (rms_norm(x) * next_norm) · next_wᵀ ([n_tokens, N], in y_next where given,
// else scratch); otherwise returns undefined and the caller adds out.
// a: [n_tokens, K]; w_out: [d_model, K]; x, h, out: [n_tokens, d_model]
Tensor block_tail(const Tensor& a, const Tensor& w_out, const Tensor& b_out, const Tensor& x, const Tensor& norm,
                  float eps, const MlpWeights& mlp, const Tensor& h, const Tensor& out, Scratch& scratch,
                  const Tensor& next_w = Tensor(), const Tensor& next_norm = Tensor(),
                  const Tensor& y_next = Tensor());

// The first block's input: h = rms_norm(x) * norm and, where w is defined,
// returns x's projection by w ([n_tokens, N], scratch; ops::rms_norm_linear).
// x, h: [n_tokens, d_model]; w: [N, d_model]
Tensor first_block_input(const Tensor& x, const Tensor& norm, float eps, const Tensor& w, const Tensor& h,
                         Scratch& scratch);

// Whether the logits are every token's, in order (decode): then the last
// block_tail can make them (next_w the head, next_norm the final norm,
// y_next the logits).
bool logits_of_every_token(const BatchPlan& plan);

// Final norm and LM head on the tokens whose logits were asked for.
// x: [n_tokens, d_model]; head: [n_vocab, d_model]; logits: [n_out, n_vocab]
void output_logits(const Tensor& x, const Tensor& norm, float eps, const Tensor& head,
                   const BatchPlan& plan, const Tensor& logits, Scratch& scratch);

}  // namespace augur
