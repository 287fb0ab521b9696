#include "model/decoder.h"

#include <cmath>

#include "backend/device.h"
#include "core/error.h"
#include "core/progress.h"
#include "io/json_config.h"
#include "model/layers.h"
#include "model/rope.h"
#include "model/weights.h"

namespace augur {

DecoderConfig read_decoder_config(const JsonConfig& cfg) {
  DecoderConfig c;
  static_cast<TransformerDims&>(c) = read_transformer_dims(cfg);
  c.d_ff = cfg.get_int("intermediate_size");
  if (c.d_ff <= 0) cfg.error("intermediate_size", "must be positive");
  c.mlp_bias = cfg.get_bool("mlp_bias", false);
  c.inv_freq = rope_inv_freq(cfg, c.head_dim);
  return c;
}

namespace {

struct LayerWeights {
  Tensor attn_norm;  // [d_model] f32
  AttentionWeights attn;
  Tensor mlp_norm;   // [d_model] f32
  MlpWeights mlp;
};

class DecoderModel final : public Model {
 public:
  DecoderModel(const DecoderConfig& cfg, WeightSource& w, ModelInfo info)
      : cfg_(cfg), scratch_(info.device), device_forward_(info.device, cfg.n_vocab) {
    info_ = std::move(info);
    inv_freq_ = constant_f32(cfg.inv_freq, info_.device);
    const int64_t d = cfg.d_model, q_dim = cfg.n_head * cfg.head_dim, kv_dim = cfg.n_head_kv * cfg.head_dim;
    Progress progress("loading weights", cfg.n_layer + 1);
    embed_ = w.matrix("model.embed_tokens.weight", {cfg.n_vocab, d});  // [n_vocab, d_model]
    for (int64_t i = 0; i < cfg.n_layer; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      LayerWeights l;
      l.attn_norm = w.vector_f32(p + "input_layernorm.weight", d);
      l.attn.wq = w.matrix(p + "self_attn.q_proj.weight", {q_dim, d});
      l.attn.wk = w.matrix(p + "self_attn.k_proj.weight", {kv_dim, d});
      l.attn.wv = w.matrix(p + "self_attn.v_proj.weight", {kv_dim, d});
      l.attn.wo = w.matrix(p + "self_attn.o_proj.weight", {d, q_dim});
      if (cfg.attention_bias) {
        l.attn.bq = w.vector_f32(p + "self_attn.q_proj.bias", q_dim);
        l.attn.bk = w.vector_f32(p + "self_attn.k_proj.bias", kv_dim);
        l.attn.bv = w.vector_f32(p + "self_attn.v_proj.bias", kv_dim);
        l.attn.bo = w.vector_f32(p + "self_attn.o_proj.bias", d);
      }
      if (cfg.qk_norm) {
        l.attn.q_norm = w.vector_f32(p + "self_attn.q_norm.weight", cfg.head_dim);
        l.attn.k_norm = w.vector_f32(p + "self_attn.k_norm.weight", cfg.head_dim);
      }
      l.mlp_norm = w.vector_f32(p + "post_attention_layernorm.weight", d);
      l.mlp.gate = w.matrix(p + "mlp.gate_proj.weight", {cfg.d_ff, d});
      l.mlp.up = w.matrix(p + "mlp.up_proj.weight", {cfg.d_ff, d});
      l.mlp.down = w.matrix(p + "mlp.down_proj.weight", {d, cfg.d_ff});
      if (cfg.mlp_bias) {
        l.mlp.b_gate = w.vector_f32(p + "mlp.gate_proj.bias", cfg.d_ff);
        l.mlp.b_up = w.vector_f32(p + "mlp.up_proj.bias", cfg.d_ff);
        l.mlp.b_down = w.vector_f32(p + "mlp.down_proj.bias", d);
      }
      if (info_.device != Device::CPU) {
        // On an accelerator projections sharing an input run as one GEMM
        // (the skinny decode kernel streams a tall matrix closer to the
        // bandwidth limit, and a step launches fewer kernels). Biases would
        // need fusing too: only without them.
        // (Parts kept in different 16-bit types stay apart.)
        if (!cfg.attention_bias && l.attn.wq.dtype() == l.attn.wk.dtype() && l.attn.wk.dtype() == l.attn.wv.dtype()) {
          l.attn.wqkv = stack_rows({l.attn.wq, l.attn.wk, l.attn.wv});
          l.attn.wq = l.attn.wk = l.attn.wv = Tensor();
        }
        if (!cfg.mlp_bias && l.mlp.gate.dtype() == l.mlp.up.dtype()) {
          l.mlp.gate_up = stack_rows({l.mlp.gate, l.mlp.up});
          l.mlp.gate = l.mlp.up = Tensor();
        }
      }
      layers_.push_back(std::move(l));
      progress.update(i + 1);
    }
    final_norm_ = w.vector_f32("model.norm.weight", d);
    head_ = cfg.tie_embeddings ? embed_ : w.matrix("lm_head.weight", {cfg.n_vocab, d});
    progress.update(cfg.n_layer + 1);

    shape_.n_head = cfg.n_head;
    shape_.n_head_kv = cfg.n_head_kv;
    shape_.head_dim = cfg.head_dim;
    shape_.scale = 1.0f / std::sqrt(float(cfg.head_dim));
    shape_.norm_eps = cfg.rms_eps;

    info_.n_layer = cfg.n_layer;
    info_.d_model = d;
    info_.n_vocab = cfg.n_vocab;
    info_.max_position = cfg.max_position;
    info_.n_params = w.n_params();
    info_.weight_bytes = w.bytes();
    // A decode step reads every matrix once, but only one row of the embedding.
    int64_t read = int64_t(head_.nbytes()) + int64_t(embed_.nbytes() / size_t(cfg.n_vocab));
    for (const auto& l : layers_)
      for (const Tensor* t : {&l.attn.wq, &l.attn.wk, &l.attn.wv, &l.attn.wqkv, &l.attn.wo, &l.mlp.gate, &l.mlp.up,
                              &l.mlp.gate_up, &l.mlp.down})
        if (t->defined()) read += int64_t(t->nbytes());
    info_.decode_weight_bytes = read;
    info_.kv = {cfg.n_layer, cfg.n_head_kv, cfg.head_dim};
  }

  using Model::forward;
  // Reference: LlamaModel.forward / Qwen3Model.forward (pre-norm residual blocks).
  void forward(std::span<const ForwardRow> rows, KvCache& kv, const Tensor& logits, const Tensor& ids) override {
    BatchPlan plan = plan_batch(rows, cfg_.n_vocab, cfg_.max_position);
    take_ids(plan, ids, info_.device, cfg_.n_vocab);
    const int64_t n_out = int64_t(plan.logit_tokens.size());
    if (logits.dim(0) != n_out || logits.dim(-1) != cfg_.n_vocab ||
        (logits.device() != Device::CPU && logits.device() != info_.device))
      fail("[forward] logits ", logits.shape_str(), " should be [", n_out, ", ", cfg_.n_vocab,
           "] on the host or the model's device");
    auto body = [&](const BatchPlan& p, Scratch& scratch, const Tensor& out) { layers(p, kv, scratch, out); };
    if (info_.device == Device::CPU)
      body(plan, scratch_, logits);
    else
      device_forward_.run(plan, kv, logits, body, ids);
  }

 private:
  void layers(const BatchPlan& plan, KvCache& kv, Scratch& scratch, const Tensor& logits) {
    const int64_t T = plan.n_tokens(), d = cfg_.d_model;
    Tensor x = scratch.get("x", {T, d});  // residual stream
    Tensor h = scratch.get("h", {T, d});  // normed input of a block
    Tensor o = scratch.get("o", {T, d});  // output of a block
    ops::embedding(embed_, plan.tokens, x, &plan.device);
    // the q/k/v projection of the layer, when made ahead (the first norm in it)
    Tensor qkv = first_block_input(x, layers_[0].attn_norm, cfg_.rms_eps, layers_[0].attn.wqkv, h, scratch);
    const bool fuse_head = logits_of_every_token(plan, x, logits);
    for (int64_t i = 0; i < cfg_.n_layer; ++i) {
      const LayerWeights& l = layers_[size_t(i)];
      const LayerWeights* next = i + 1 < cfg_.n_layer ? &layers_[size_t(i + 1)] : nullptr;
      const Tensor a = attention_mix(h, l.attn, shape_, inv_freq_, plan, kv.layer(i), scratch, qkv);
      // o = mlp(norm(x += wo·a)), and at decode on CUDA the next projection
      // (after the last layer, the logits)
      const bool head = next == nullptr && fuse_head;
      qkv = block_tail(a, l.attn.wo, l.attn.bo, x, l.mlp_norm, cfg_.rms_eps, l.mlp, h, o, scratch,
                       next ? next->attn.wqkv : (head ? head_ : Tensor()),
                       next ? next->attn_norm : (head ? final_norm_ : Tensor()), head ? logits : Tensor());
      if (qkv.defined() && head) return;  // x += o and the logits done there
      if (qkv.defined()) continue;        // x += o done there
      if (next)
        ops::add_rms_norm(x, o, next->attn_norm, cfg_.rms_eps, h);
      else
        ops::add_inplace(x, o);
    }
    output_logits(x, final_norm_, cfg_.rms_eps, head_, plan, logits, scratch);
  }


  DecoderConfig cfg_;
  AttentionShape shape_;
  Tensor inv_freq_;    // [rot_dim / 2] f32 on the model's device
  Tensor embed_;       // [n_vocab, d_model]
  std::vector<LayerWeights> layers_;
  Tensor final_norm_;  // [d_model] f32
  Tensor head_;        // [n_vocab, d_model]
  Scratch scratch_;               // CPU forwards
  DeviceForward device_forward_;  // accelerator forwards (own scratch, decode graphs)
};

}  // namespace

std::unique_ptr<Model> make_decoder_model(const DecoderConfig& cfg, WeightSource& weights, ModelInfo info) {
  return std::make_unique<DecoderModel>(cfg, weights, std::move(info));
}

}  // namespace augur
