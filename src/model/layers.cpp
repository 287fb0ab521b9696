#include "model/layers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"
#include "io/json_config.h"
#include "model/weights.h"

namespace augur {

TransformerDims read_transformer_dims(const JsonConfig& cfg) {
  TransformerDims c;
  for (const char* key : {"hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"})
    if (cfg.get_int(key) <= 0) cfg.error(key, "must be positive");
  c.d_model = cfg.get_int("hidden_size");
  c.n_layer = cfg.get_int("num_hidden_layers");
  c.n_head = cfg.get_int("num_attention_heads");
  c.n_head_kv = cfg.get_int("num_key_value_heads", c.n_head);
  c.n_vocab = cfg.get_int("vocab_size");
  c.max_position = cfg.get_int("max_position_embeddings", 0);
  c.rms_eps = float(cfg.get_float("rms_norm_eps", 1e-6));
  c.tie_embeddings = cfg.get_bool("tie_word_embeddings", false);
  c.attention_bias = cfg.get_bool("attention_bias", false);
  if (c.n_head_kv <= 0 || c.n_head % c.n_head_kv != 0)
    cfg.error("num_key_value_heads", "must divide num_attention_heads (" + std::to_string(c.n_head) + ")");
  if (cfg.has("head_dim") && !cfg.is_null("head_dim")) {
    c.head_dim = cfg.get_int("head_dim");
    if (c.head_dim <= 0) cfg.error("head_dim", "must be positive");
  } else {
    if (c.d_model % c.n_head != 0) cfg.error("hidden_size", "is not a multiple of num_attention_heads and no head_dim is given");
    c.head_dim = c.d_model / c.n_head;
  }
  const std::string act = cfg.get_string("hidden_act", "silu");
  if (act != "silu") cfg.error("hidden_act", "'" + act + "' is not supported (silu)");
  return c;
}

BatchPlan plan_batch(std::span<const ForwardRow> rows, int64_t n_vocab, int64_t max_position) {
  BatchPlan plan;
  for (size_t r = 0; r < rows.size(); ++r) {
    const ForwardRow& row = rows[r];
    if (row.tokens.empty()) fail("[forward] row ", r, " has no tokens");
    if (row.n_logits < 0 || size_t(row.n_logits) > row.tokens.size())
      fail("[forward] row ", r, " asks for ", row.n_logits, " logits of ", row.tokens.size(), " tokens");
    if (max_position > 0 && int64_t(row.pos0) + int64_t(row.tokens.size()) > max_position)
      fail("[forward] row ", r, " reaches position ", int64_t(row.pos0) + int64_t(row.tokens.size()),
           ", beyond the model's max_position_embeddings ", max_position);
    const int32_t begin = int32_t(plan.tokens.size());
    for (size_t i = 0; i < row.tokens.size(); ++i) {
      const int32_t id = row.tokens[i];
      if (id < 0 || id >= n_vocab) fail("[forward] token id ", id, " outside the vocabulary [0, ", n_vocab, ")");
      plan.tokens.push_back(id);
      plan.positions.push_back(row.pos0 + int32_t(i));
    }
    const int32_t n = int32_t(row.tokens.size());
    plan.rows.push_back({begin, n, row.pos0, row.block_table, row.state_slot});
    for (int32_t i = n - row.n_logits; i < n; ++i) plan.logit_tokens.push_back(begin + i);
  }
  return plan;
}

Tensor attention_mix(const Tensor& x, const AttentionWeights& w, const AttentionShape& s, const Tensor& inv_freq,
                     const ops::BatchView& batch, const ops::KvLayer& kv, Scratch& scratch, const Tensor& projected) {
  const int64_t T = x.dim(0);
  const int64_t q_width = (w.output_gate ? 2 : 1) * s.n_head * s.head_dim;
  Tensor qkv = projected;
  if (!qkv.defined()) {
    qkv = scratch.get("attn.qkv", {T, q_width + 2 * s.n_head_kv * s.head_dim});
    ops::linear(x, w.wqkv, qkv);
  }
  ops::add_bias(qkv, w.bqkv);
  // q/k norm, RoPE, the cache writes (and the output gates copied out), then
  // attention and the gate.
  Tensor q = scratch.get("attn.q", {T, s.n_head, s.head_dim});
  Tensor gate = w.output_gate ? scratch.get("attn.gate", {T, s.n_head * s.head_dim}) : Tensor();
  Tensor attn = scratch.get("attn.out", {T, s.n_head, s.head_dim});
  Tensor workspace = scratch.get("attn.workspace", {ops::attention_workspace(q, batch)});
  ops::qkv_rope_attention(qkv, w.q_norm, w.k_norm, s.norm_eps, batch, inv_freq, kv, s.scale, s.window, q, gate, attn,
                          workspace);
  return attn.reshape({T, s.n_head * s.head_dim});
}

Tensor stack_vectors(std::initializer_list<Tensor> parts) {
  std::vector<Tensor> columns;
  int64_t n = 0;
  for (const Tensor& p : parts) {
    columns.push_back(p.reshape({p.numel(), 1}));
    n += p.numel();
  }
  return stack_rows(columns).reshape({n});
}

MlpWeights load_swiglu(WeightSource& w, const std::string& p, int64_t d_model, int64_t d_ff, bool bias) {
  MlpWeights m;
  const Tensor gate_up[] = {w.matrix(p + "gate_proj.weight", {d_ff, d_model}),
                            w.matrix(p + "up_proj.weight", {d_ff, d_model})};
  m.gate_up = stack_rows(gate_up);
  m.down = w.matrix(p + "down_proj.weight", {d_model, d_ff});
  if (bias) {
    m.b_gate_up = stack_vectors({w.vector_f32(p + "gate_proj.bias", d_ff), w.vector_f32(p + "up_proj.bias", d_ff)});
    m.b_down = w.vector_f32(p + "down_proj.bias", d_model);
  }
  return m;
}

void swiglu_mlp(const Tensor& x, const MlpWeights& w, const Tensor& out, Scratch& scratch) {
  const int64_t T = x.dim(0), d_ff = w.gate_up.dim(0) / 2;
  Tensor gate_up = scratch.get("mlp.gate_up", {T, 2 * d_ff});
  Tensor act = scratch.get("mlp.act", {T, d_ff});
  ops::linear(x, w.gate_up, gate_up);
  if (!w.b_gate_up.defined() && !w.b_down.defined()) {
    ops::swiglu_linear(gate_up, w.down, act, out);
    return;
  }
  ops::add_bias(gate_up, w.b_gate_up);
  ops::swiglu_packed(gate_up, act);
  ops::linear(act, w.down, out);
  ops::add_bias(out, w.b_down);
}

Tensor block_tail(const Tensor& a, const Tensor& w_out, const Tensor& b_out, const Tensor& x, const Tensor& norm,
                  float eps, const MlpWeights& mlp, const Tensor& h, const Tensor& out, Scratch& scratch,
                  const Tensor& next_w, const Tensor& next_norm, const Tensor& y_next) {
  if (b_out.defined() || mlp.b_gate_up.defined() || mlp.b_down.defined()) {  // biases: the ops one by one
    ops::linear(a, w_out, out);
    ops::add_bias(out, b_out);
    ops::add_rms_norm(x, out, norm, eps, h);  // x += out; h = norm(x)
    swiglu_mlp(h, mlp, out, scratch);
    return Tensor();
  }
  const int64_t T = a.dim(0), d_ff = mlp.down.dim(1);
  Tensor y;
  if (next_w.defined())
    y = y_next.defined() ? y_next : scratch.get("tail.next" + std::to_string(next_w.dim(0)), {T, next_w.dim(0)});
  ops::block_tail(a, w_out, x, norm, eps, mlp.gate_up, mlp.down, h, scratch.get("mlp.gate_up", {T, 2 * d_ff}),
                  scratch.get("mlp.act", {T, d_ff}), out, next_w, next_norm, y);
  return y;
}

Tensor first_block_input(const Tensor& x, const Tensor& norm, float eps, const Tensor& w, const Tensor& h,
                         Scratch& scratch) {
  if (!w.defined()) {
    ops::rms_norm(x, norm, eps, h);
    return Tensor();
  }
  Tensor y = scratch.get("tail.next" + std::to_string(w.dim(0)), {x.dim(0), w.dim(0)});
  ops::rms_norm_linear(x, norm, eps, w, h, y);
  return y;
}

bool logits_of_every_token(const BatchPlan& plan) {
  const int64_t n_out = int64_t(plan.logit_tokens.size());
  if (n_out == 0 || n_out != plan.n_tokens()) return false;
  for (int64_t i = 0; i < n_out; ++i)
    if (plan.logit_tokens[size_t(i)] != i) return false;
  return true;
}

void output_logits(const Tensor& x, const Tensor& norm, float eps, const Tensor& head,
                   const BatchPlan& plan, const Tensor& logits, Scratch& scratch) {
  const int64_t d_model = x.dim(1), n_out = int64_t(plan.logit_tokens.size());
  if (n_out == 0) return;
  if (logits_of_every_token(plan)) {  // no rows to gather: the norm in the head's matmul
    ops::rms_norm_linear(x, norm, eps, head, scratch.get("out.h", {n_out, d_model}), logits);
    return;
  }
  Tensor h = scratch.get("out.h", {n_out, d_model});
  for (int64_t i = 0; i < n_out; ++i) {
    const int64_t t = plan.logit_tokens[size_t(i)];
    copy_tensor(x.slice_rows(t, t + 1), h.slice_rows(i, i + 1));
  }
  ops::rms_norm(h, norm, eps, h);
  ops::linear(h, head, logits);
}

}  // namespace augur
