#include "model/layers.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/device.h"
#include "core/error.h"
#include "io/json_config.h"

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

void take_ids(BatchPlan& plan, const Tensor& ids, Device device, int64_t n_vocab) {
  if (!ids.defined()) return;
  if (ids.dtype() != DType::I32 || !ids.is_contiguous() || ids.numel() != plan.n_tokens() || ids.device() != device)
    fail("[forward] token ids ", ids.shape_str(), " should be ", plan.n_tokens(), " contiguous I32 on ",
         device_name(device));
  if (device != Device::CPU) return;
  const int32_t* p = ids.data<int32_t>();
  for (int64_t t = 0; t < plan.n_tokens(); ++t) {
    if (p[t] < 0 || p[t] >= n_vocab) fail("[forward] token id ", p[t], " outside the vocabulary [0, ", n_vocab, ")");
    plan.tokens[size_t(t)] = p[t];
  }
}

void upload_plan(BatchPlan& plan, Device device, int64_t block_size, int64_t max_context) {
  if (device == Device::CPU) return;
  plan.device = ops::upload_batch(device, plan.tokens, plan.rows, block_size, max_context);
}

Tensor Scratch::get(const std::string& slot, std::initializer_list<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  Tensor& buf = buffers_[slot];
  if (!buf.defined() || buf.numel() < n) buf = empty_on(device_, DType::F32, {std::max<int64_t>(n, 1)});
  return Tensor::view_of(buf.buffer(), 0, DType::F32, shape.begin(), int(shape.size()));
}

namespace {

// Attention grids are sized by a bound on the context: the next power of two
// above the longest row (at least 256), capped by the cache. Decode graphs are
// keyed by it, so a growing context re-captures only at powers of two.
int64_t context_bucket(const BatchPlan& plan, const KvCache& kv) {
  int64_t need = 1;
  for (int32_t p : plan.positions) need = std::max<int64_t>(need, int64_t(p) + 1);
  int64_t bucket = 256;
  while (bucket < need) bucket *= 2;
  return std::min(bucket, kv.n_blocks() * kv.block_size());
}

bool is_decode_step(const BatchPlan& plan) {
  if (plan.logit_tokens.size() != plan.rows.size()) return false;
  for (const auto& r : plan.rows)
    if (r.n_tokens != 1) return false;
  return true;
}

}  // namespace

DeviceForward::DeviceForward(Device device, int64_t n_vocab, bool graphs)
    : device_(device), n_vocab_(n_vocab), scratch_(device) {
  const char* env = std::getenv("AUGUR_CUDA_GRAPHS");
  graphs_ = graphs && device == Device::CUDA && !(env && std::string(env) == "0");
}

void DeviceForward::run(BatchPlan& plan, const KvCache& kv, const Tensor& logits, const Body& body,
                        const Tensor& ids) {
  const int64_t ctx = context_bucket(plan, kv), n_out = int64_t(plan.logit_tokens.size());
  // Logits asked for on the device are written in place.
  const bool direct = logits.device() == device_ && logits.is_contiguous();
  if (!graphs_ || !is_decode_step(plan)) {
    upload_plan(plan, device_, kv.block_size(), ctx);
    plan.device.fed_tokens = ids;
    Tensor out = direct ? logits : scratch_.get("logits", {n_out, n_vocab_});
    body(plan, scratch_, out);
    if (!direct) copy_tensor(out, logits);
    return;
  }
  auto& step = steps_[{kv.id(), int64_t(plan.rows.size()), ctx}];
  const void* logits_at = direct ? logits.raw() : nullptr;
  const void* ids_at = ids.defined() ? ids.raw() : nullptr;
  if (!step || step->logits_at != logits_at || step->ids_at != ids_at) {
    // First step of this shape (or of new addresses): run it eagerly (its
    // allocations happen now, outside the recording), then record the same
    // step for later replays.
    if (!step) step = std::make_unique<Step>(Step{Scratch(device_), plan, nullptr});
    step->plan = plan;
    step->work.reset();
    step->logits_at = logits_at;
    step->ids_at = ids_at;
    upload_plan(step->plan, device_, kv.block_size(), ctx);
    step->plan.device.fed_tokens = ids;
    Tensor out = direct ? logits : step->scratch.get("logits", {n_out, n_vocab_});
    body(step->plan, step->scratch, out);
    if (!direct) copy_tensor(out, logits);
    step->work = capture(device_, [&] { body(step->plan, step->scratch, out); });
    return;
  }
  ops::reupload_batch(step->plan.device, plan.tokens, plan.rows, kv.block_size());
  step->work->replay();
  if (!direct) copy_tensor(step->scratch.get("logits", {n_out, n_vocab_}), logits);
}

Tensor constant_f32(std::span<const float> values, Device device) {
  Tensor host = Tensor::empty(DType::F32, {int64_t(values.size())});
  std::copy(values.begin(), values.end(), host.data<float>());
  return to_device(host, device);
}

Tensor stack_rows(std::initializer_list<Tensor> parts) {
  AUGUR_ASSERT(parts.size() > 0, "stack_rows of nothing");
  const Tensor& first = *parts.begin();
  int64_t rows = 0;
  for (const Tensor& p : parts) {
    if (p.ndim() != 2 || p.dim(1) != first.dim(1) || p.dtype() != first.dtype() || p.device() != first.device())
      fail("[stack_rows] ", p.shape_str(), " does not stack onto ", first.shape_str());
    rows += p.dim(0);
  }
  Tensor out = empty_on(first.device(), first.dtype(), {rows, first.dim(1)});
  int64_t at = 0;
  for (const Tensor& p : parts) {
    copy_tensor(p, out.slice_rows(at, at + p.dim(0)));
    at += p.dim(0);
  }
  return out;
}

void add_bias(const Tensor& y, const Tensor& bias) {
  if (!bias.defined()) return;
  if (y.device() != Device::CPU) fail("[add_bias] biases are not supported on ", device_name(y.device()), " yet");
  const int64_t N = y.dim(-1), M = y.numel() / N;
  AUGUR_ASSERT(bias.numel() == N, "bias length");
  float* p = y.data<float>();
  const float* b = bias.data<float>();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) p[m * N + n] += b[n];
}

Tensor attention_mix(const Tensor& x, const AttentionWeights& w, const AttentionShape& s, const Tensor& inv_freq,
                     const BatchPlan& plan, const ops::KvLayer& kv, Scratch& scratch, const Tensor& projected) {
  const int64_t T = x.dim(0);
  Tensor q = scratch.get("attn.q", {T, s.n_head, s.head_dim});
  Tensor gate;  // [T, n_head * head_dim] with an output gate
  const ops::BatchView batch = plan.view();
  if (w.wqkv.defined()) {
    // Fused: one projection, then q/k norm, RoPE and the cache writes in one
    // pass (which also copies out the output gates of gated attention).
    const int64_t q_width = (w.output_gate ? 2 : 1) * s.n_head * s.head_dim;
    Tensor qkv = projected;
    if (!qkv.defined()) {
      qkv = scratch.get("attn.qkv", {T, q_width + 2 * s.n_head_kv * s.head_dim});
      ops::linear(x, w.wqkv, qkv);
    }
    if (!w.output_gate) {  // where the backend fuses them (ops.h), attention does the norms, RoPE and cache writes
      Tensor attn = scratch.get("attn.out", {T, s.n_head, s.head_dim});
      Tensor workspace = scratch.get("attn.workspace", {ops::attention_workspace(q, batch)});
      if (ops::qkv_rope_attention(qkv, w.q_norm, w.k_norm, s.norm_eps, batch, inv_freq, kv, s.scale, s.window, attn,
                                  workspace))
        return attn.reshape({T, s.n_head * s.head_dim});
    }
    if (w.output_gate) gate = scratch.get("attn.gate", {T, s.n_head * s.head_dim});
    ops::qkv_rope_store(qkv, w.q_norm, w.k_norm, s.norm_eps, batch, inv_freq, kv, q, gate);
  } else if (w.output_gate) {
    AUGUR_ASSERT(!projected.defined(), "attention_mix: a projection made ahead needs wqkv");
    // q_proj(x).view(T, n_head, 2 * head_dim).chunk(2, -1): query, then gate
    Tensor qg = scratch.get("attn.qg", {T * s.n_head, 2 * s.head_dim});
    ops::linear(x, w.wq, qg.reshape({T, s.n_head * 2 * s.head_dim}));
    add_bias(qg.reshape({T, s.n_head * 2 * s.head_dim}), w.bq);
    gate = scratch.get("attn.gate", {T, s.n_head * s.head_dim});
    ops::slice_cols(qg, 0, q.reshape({T * s.n_head, s.head_dim}));
    ops::slice_cols(qg, s.head_dim, gate.reshape({T * s.n_head, s.head_dim}));
  } else {
    AUGUR_ASSERT(!projected.defined(), "attention_mix: a projection made ahead needs wqkv");
    ops::linear(x, w.wq, q.reshape({T, s.n_head * s.head_dim}));
    add_bias(q, w.bq);
  }
  if (!w.wqkv.defined()) {
    Tensor k = scratch.get("attn.k", {T, s.n_head_kv, s.head_dim});
    Tensor v = scratch.get("attn.v", {T, s.n_head_kv, s.head_dim});
    ops::linear(x, w.wk, k.reshape({T, s.n_head_kv * s.head_dim}));
    ops::linear(x, w.wv, v.reshape({T, s.n_head_kv * s.head_dim}));
    add_bias(k, w.bk);
    add_bias(v, w.bv);
    if (w.q_norm.defined()) {  // Qwen3: RMSNorm over each head before RoPE
      ops::rms_norm(q, w.q_norm, s.norm_eps, q);
      ops::rms_norm(k, w.k_norm, s.norm_eps, k);
    }
    ops::rope(q, batch, inv_freq);
    ops::rope(k, batch, inv_freq);
    ops::store_kv(k, v, batch, kv);
  }
  Tensor attn = scratch.get("attn.out", {T, s.n_head, s.head_dim});
  Tensor workspace = scratch.get("attn.workspace", {ops::attention_workspace(q, batch)});
  ops::paged_attention(q, kv, batch, s.scale, s.window, attn, workspace);
  Tensor flat = attn.reshape({T, s.n_head * s.head_dim});
  if (w.output_gate) ops::sigmoid_mul(flat, gate, flat);
  return flat;
}

void attention_block(const Tensor& x, const AttentionWeights& w, const AttentionShape& s,
                     const Tensor& inv_freq, const BatchPlan& plan,
                     const ops::KvLayer& kv, const Tensor& out, Scratch& scratch) {
  ops::linear(attention_mix(x, w, s, inv_freq, plan, kv, scratch), w.wo, out);
  add_bias(out, w.bo);
}

void swiglu_mlp(const Tensor& x, const MlpWeights& w, const Tensor& out, Scratch& scratch) {
  if (w.gate_up.defined()) {  // fused gate/up: one projection, SwiGLU over its halves
    const int64_t T = x.dim(0), d_ff = w.gate_up.dim(0) / 2;
    Tensor gate_up = scratch.get("mlp.gate_up", {T, 2 * d_ff});
    Tensor act = scratch.get("mlp.act", {T, d_ff});
    ops::linear(x, w.gate_up, gate_up);
    ops::swiglu_linear(gate_up, w.down, act, out);
    return;
  }
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

Tensor block_tail(const Tensor& a, const Tensor& w_out, const Tensor& b_out, const Tensor& x, const Tensor& norm,
                  float eps, const MlpWeights& mlp, const Tensor& h, const Tensor& out, Scratch& scratch,
                  const Tensor& next_w, const Tensor& next_norm, const Tensor& y_next) {
  if (!b_out.defined() && mlp.gate_up.defined() && ops::decode_tail_fits(a, w_out, mlp.gate_up, mlp.down)) {
    const int64_t T = a.dim(0), d_ff = mlp.down.dim(1);
    const bool next = next_w.defined() && ops::decode_tail_fits(a, w_out, mlp.gate_up, mlp.down, next_w);
    Tensor y;
    if (next) y = y_next.defined() ? y_next : scratch.get("tail.next" + std::to_string(next_w.dim(0)), {T, next_w.dim(0)});
    ops::decode_tail(a, w_out, x, norm, eps, mlp.gate_up, mlp.down, scratch.get("tail.o", {T, x.dim(1)}),
                     scratch.get("mlp.act", {T, d_ff}), out, next ? next_w : Tensor(),
                     next ? next_norm : Tensor(), y);
    return y;
  }
  ops::linear(a, w_out, out);
  add_bias(out, b_out);
  ops::add_rms_norm(x, out, norm, eps, h);  // x += out; h = norm(x)
  swiglu_mlp(h, mlp, out, scratch);
  return Tensor();
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

bool logits_of_every_token(const BatchPlan& plan, const Tensor& x, const Tensor& logits) {
  const int64_t n_out = int64_t(plan.logit_tokens.size());
  if (n_out == 0 || n_out != x.dim(0) || !logits.defined() || logits.device() != x.device()) return false;
  for (int64_t i = 0; i < n_out; ++i)
    if (plan.logit_tokens[size_t(i)] != i) return false;
  return true;
}

void output_logits(const Tensor& x, const Tensor& norm, float eps, const Tensor& head,
                   const BatchPlan& plan, const Tensor& logits, Scratch& scratch) {
  const int64_t d_model = x.dim(1), n_out = int64_t(plan.logit_tokens.size());
  if (n_out == 0) return;
  if (logits_of_every_token(plan, x, logits)) {  // no rows to gather: the norm in the head's GEMV where it fits
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
