#include "model/layers.h"

#include <cmath>
#include <cstring>

#include "core/error.h"

namespace augur {

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
    plan.rows.push_back({begin, n, row.pos0, row.block_table});
    for (int32_t i = n - row.n_logits; i < n; ++i) plan.logit_tokens.push_back(begin + i);
  }
  return plan;
}

Tensor Scratch::get(const std::string& slot, std::initializer_list<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  Tensor& buf = buffers_[slot];
  if (!buf.defined() || buf.numel() < n) buf = Tensor::empty(DType::F32, {n});
  return Tensor::view_of(buf.buffer(), 0, DType::F32, shape.begin(), int(shape.size()));
}

void add_bias(const Tensor& y, const Tensor& bias) {
  if (!bias.defined()) return;
  const int64_t N = y.dim(-1), M = y.numel() / N;
  AUGUR_ASSERT(bias.numel() == N, "bias length");
  float* p = y.data<float>();
  const float* b = bias.data<float>();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) p[m * N + n] += b[n];
}

void attention_block(const Tensor& x, const AttentionWeights& w, const AttentionShape& s,
                     std::span<const float> inv_freq, const BatchPlan& plan,
                     const ops::KvLayer& kv, const Tensor& out, Scratch& scratch) {
  const int64_t T = x.dim(0);
  Tensor q = scratch.get("attn.q", {T, s.n_head, s.head_dim});
  Tensor k = scratch.get("attn.k", {T, s.n_head_kv, s.head_dim});
  Tensor v = scratch.get("attn.v", {T, s.n_head_kv, s.head_dim});
  Tensor gate;  // [T, n_head * head_dim] with an output gate
  if (w.output_gate) {
    // q_proj(x).view(T, n_head, 2 * head_dim).chunk(2, -1): query, then gate
    Tensor qg = scratch.get("attn.qg", {T * s.n_head, 2 * s.head_dim});
    ops::linear(x, w.wq, qg.reshape({T, s.n_head * 2 * s.head_dim}));
    add_bias(qg.reshape({T, s.n_head * 2 * s.head_dim}), w.bq);
    gate = scratch.get("attn.gate", {T, s.n_head * s.head_dim});
    ops::slice_cols(qg, 0, q.reshape({T * s.n_head, s.head_dim}));
    ops::slice_cols(qg, s.head_dim, gate.reshape({T * s.n_head, s.head_dim}));
  } else {
    ops::linear(x, w.wq, q.reshape({T, s.n_head * s.head_dim}));
    add_bias(q, w.bq);
  }
  ops::linear(x, w.wk, k.reshape({T, s.n_head_kv * s.head_dim}));
  ops::linear(x, w.wv, v.reshape({T, s.n_head_kv * s.head_dim}));
  add_bias(k, w.bk);
  add_bias(v, w.bv);
  if (w.q_norm.defined()) {  // Qwen3: RMSNorm over each head before RoPE
    ops::rms_norm(q, w.q_norm, s.norm_eps, q);
    ops::rms_norm(k, w.k_norm, s.norm_eps, k);
  }
  ops::rope(q, plan.positions, inv_freq);
  ops::rope(k, plan.positions, inv_freq);
  ops::store_kv(k, v, plan.rows, kv);
  Tensor attn = scratch.get("attn.out", {T, s.n_head, s.head_dim});
  ops::paged_attention(q, kv, plan.rows, s.scale, s.window, attn);
  if (w.output_gate) {
    Tensor flat = attn.reshape({T, s.n_head * s.head_dim});
    ops::sigmoid_mul(flat, gate, flat);
  }
  ops::linear(attn.reshape({T, s.n_head * s.head_dim}), w.wo, out);
  add_bias(out, w.bo);
}

void swiglu_mlp(const Tensor& x, const MlpWeights& w, const Tensor& out, Scratch& scratch) {
  const int64_t T = x.dim(0), d_ff = w.gate.dim(0);
  Tensor gate = scratch.get("mlp.gate", {T, d_ff});
  Tensor up = scratch.get("mlp.up", {T, d_ff});
  ops::linear(x, w.gate, gate);
  ops::linear(x, w.up, up);
  add_bias(gate, w.b_gate);
  add_bias(up, w.b_up);
  ops::swiglu(gate, up, gate);
  ops::linear(gate, w.down, out);
  add_bias(out, w.b_down);
}

void output_logits(const Tensor& x, const Tensor& norm, float eps, const Tensor& head,
                   const BatchPlan& plan, const Tensor& logits, Scratch& scratch) {
  const int64_t d_model = x.dim(1), n_out = int64_t(plan.logit_tokens.size());
  if (n_out == 0) return;
  Tensor h = scratch.get("out.h", {n_out, d_model});
  for (int64_t i = 0; i < n_out; ++i)
    std::memcpy(h.data<float>() + i * d_model, x.data<float>() + plan.logit_tokens[size_t(i)] * d_model,
                size_t(d_model) * 4);
  ops::rms_norm(h, norm, eps, h);
  ops::linear(h, head, logits);
}

}  // namespace augur
