#include "model/hybrid.h"

#include <cmath>
#include <string>

#include "core/error.h"
#include "io/json_config.h"
#include "model/rope.h"
#include "model/weights.h"

namespace augur {

HybridConfig read_hybrid_config(const JsonConfig& cfg) {
  HybridConfig c;
  for (const char* key : {"head_dim", "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
                          "linear_num_value_heads"})
    if (cfg.get_int(key) <= 0) cfg.error(key, "must be positive");
  static_cast<TransformerDims&>(c) = read_transformer_dims(cfg);
  if (!cfg.get_bool("attn_output_gate", true))
    cfg.error("attn_output_gate", "false is not supported: the hybrid families gate their attention output");
  // Qwen3_5TextConfig / Qwen3NextConfig default partial_rotary_factor to 0.25.
  c.inv_freq = rope_inv_freq(cfg, c.head_dim, 0.25);

  c.gdn.n_head_k = cfg.get_int("linear_num_key_heads");
  c.gdn.n_head = cfg.get_int("linear_num_value_heads");
  c.gdn.head_dim_k = cfg.get_int("linear_key_head_dim");
  c.gdn.head_dim_v = cfg.get_int("linear_value_head_dim");
  c.gdn.conv_kernel = cfg.get_int("linear_conv_kernel_dim", 4);
  c.gdn.norm_eps = c.rms_eps;
  if (c.gdn.n_head % c.gdn.n_head_k != 0)
    cfg.error("linear_num_value_heads", "must be a multiple of linear_num_key_heads (" +
                                            std::to_string(c.gdn.n_head_k) + ")");
  if (c.gdn.conv_kernel < 1) cfg.error("linear_conv_kernel_dim", "must be positive");

  // Layer pattern: layer_types (legacy names remapped as transformers'
  // remap_legacy_layer_types does), else every full_attention_interval-th layer.
  if (cfg.has("layer_types") && !cfg.is_null("layer_types")) {
    const auto types = cfg.get_string_list("layer_types");
    if (int64_t(types.size()) != c.n_layer)
      cfg.error("layer_types", "has " + std::to_string(types.size()) + " entries for " +
                                   std::to_string(c.n_layer) + " layers");
    for (size_t i = 0; i < types.size(); ++i) {
      const std::string& t = types[i];
      if (t == "linear_attention" || t == "mamba")
        c.linear.push_back(true);
      else if (t == "full_attention" || t == "attention")
        c.linear.push_back(false);
      else
        cfg.error("layer_types", "entry " + std::to_string(i) + " '" + t +
                                     "' is not supported (linear_attention, full_attention)");
    }
  } else {
    const int64_t interval = cfg.get_int("full_attention_interval", 4);
    if (interval <= 0) cfg.error("full_attention_interval", "must be positive");
    for (int64_t i = 0; i < c.n_layer; ++i) c.linear.push_back((i + 1) % interval != 0);
  }
  return c;
}

MoeConfig read_moe_config(const JsonConfig& cfg) {
  MoeConfig m;
  for (const char* key : {"num_experts", "num_experts_per_tok", "moe_intermediate_size"})
    if (cfg.get_int(key) <= 0) cfg.error(key, "must be positive");
  m.n_expert = cfg.get_int("num_experts");
  m.n_expert_used = cfg.get_int("num_experts_per_tok");
  m.d_ff_expert = cfg.get_int("moe_intermediate_size");
  m.d_ff_shared = cfg.get_int("shared_expert_intermediate_size", 0);
  if (m.d_ff_shared < 0) cfg.error("shared_expert_intermediate_size", "must not be negative");
  if (m.n_expert_used > m.n_expert) cfg.error("num_experts_per_tok", "exceeds num_experts");
  return m;
}

Tensor load_centred_norm(WeightSource& w, const std::string& name, int64_t n) {
  return w.vector_f32(name, n, 1.0f);  // Qwen3NextRMSNorm: x_normed * (1 + weight)
}

AttentionWeights load_gated_attention(WeightSource& w, const std::string& p, const HybridConfig& c) {
  const int64_t d = c.d_model, q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
  AttentionWeights a;
  a.output_gate = true;
  a.wq = w.matrix(p + "self_attn.q_proj.weight", {2 * q_dim, d});  // per head: query, gate
  a.wk = w.matrix(p + "self_attn.k_proj.weight", {kv_dim, d});
  a.wv = w.matrix(p + "self_attn.v_proj.weight", {kv_dim, d});
  a.wo = w.matrix(p + "self_attn.o_proj.weight", {d, q_dim});
  if (c.attention_bias) {
    a.bq = w.vector_f32(p + "self_attn.q_proj.bias", 2 * q_dim);
    a.bk = w.vector_f32(p + "self_attn.k_proj.bias", kv_dim);
    a.bv = w.vector_f32(p + "self_attn.v_proj.bias", kv_dim);
    a.bo = w.vector_f32(p + "self_attn.o_proj.bias", d);
  }
  a.q_norm = load_centred_norm(w, p + "self_attn.q_norm.weight", c.head_dim);
  a.k_norm = load_centred_norm(w, p + "self_attn.k_norm.weight", c.head_dim);
  return a;
}

MlpWeights load_swiglu(WeightSource& w, const std::string& p, int64_t d_model, int64_t d_ff) {
  MlpWeights m;
  m.gate = w.matrix(p + "gate_proj.weight", {d_ff, d_model});
  m.up = w.matrix(p + "up_proj.weight", {d_ff, d_model});
  m.down = w.matrix(p + "down_proj.weight", {d_model, d_ff});
  return m;
}

void load_deltanet_common(WeightSource& w, const std::string& p, const HybridConfig& c,
                          GatedDeltaNetWeights& out) {
  const GatedDeltaNetShape& s = c.gdn;
  const std::string q = p + "linear_attn.";
  // nn.Conv1d(groups=C) weight [C, 1, K] -> [C, K]
  out.conv = w.tensor_f32(q + "conv1d.weight", {s.conv_dim(), 1, s.conv_kernel})
                 .reshape({s.conv_dim(), s.conv_kernel});
  out.a_log = w.vector_f32(q + "A_log", s.n_head);
  out.dt_bias = w.vector_f32(q + "dt_bias", s.n_head);
  out.norm = w.vector_f32(q + "norm.weight", s.head_dim_v);  // RMSNormGated: γ as stored
  out.out = w.matrix(q + "out_proj.weight", {c.d_model, s.value_dim()});
}

MoeWeights load_moe(WeightSource& w, const std::string& p, int64_t d_model, const MoeConfig& m) {
  MoeWeights e;
  e.n_expert_used = m.n_expert_used;
  e.norm_topk = m.norm_topk;
  e.router = w.matrix(p + "mlp.gate.weight", {m.n_expert, d_model});
  const int64_t I = m.d_ff_expert;
  if (w.has(p + "mlp.experts.gate_up_proj")) {
    // Fused experts (Qwen3NextExperts): gate_up [E, 2I, d] (gate rows first), down [E, d, I].
    Tensor gate_up = w.matrix(p + "mlp.experts.gate_up_proj", {m.n_expert, 2 * I, d_model});
    Tensor down = w.matrix(p + "mlp.experts.down_proj", {m.n_expert, d_model, I});
    for (int64_t x = 0; x < m.n_expert; ++x) {
      Tensor gu = gate_up.slice_rows(x, x + 1).reshape({2 * I, d_model});
      MlpWeights ex;
      ex.gate = gu.slice_rows(0, I);
      ex.up = gu.slice_rows(I, 2 * I);
      ex.down = down.slice_rows(x, x + 1).reshape({d_model, I});
      e.experts.push_back(std::move(ex));
    }
  } else {
    for (int64_t x = 0; x < m.n_expert; ++x)
      e.experts.push_back(load_swiglu(w, p + "mlp.experts." + std::to_string(x) + ".", d_model, I));
  }
  if (m.d_ff_shared > 0) {
    e.shared = load_swiglu(w, p + "mlp.shared_expert.", d_model, m.d_ff_shared);
    e.shared_gate = w.matrix(p + "mlp.shared_expert_gate.weight", {1, d_model});
  }
  return e;
}

namespace {

class HybridModel final : public Model {
 public:
  // Decode steps on an accelerator replay as graphs: the recurrent ops read
  // the rows' slots from the batch layout, which each replay refills.
  HybridModel(const HybridConfig& cfg, HybridWeights weights, const WeightSource& src, ModelInfo info)
      : cfg_(cfg), w_(std::move(weights)), scratch_(info.device), device_forward_(info.device, cfg.n_vocab) {
    info_ = std::move(info);
    inv_freq_ = constant_f32(cfg.inv_freq, info_.device);
    AUGUR_ASSERT(int64_t(w_.layers.size()) == cfg.n_layer, "one HybridLayer per layer");
    shape_.n_head = cfg.n_head;
    shape_.n_head_kv = cfg.n_head_kv;
    shape_.head_dim = cfg.head_dim;
    shape_.scale = 1.0f / std::sqrt(float(cfg.head_dim));
    shape_.norm_eps = cfg.rms_eps;

    // Each layer's index into the KV cache (full attention) or the recurrent
    // state (linear attention).
    int64_t n_full = 0, n_linear = 0;
    for (const auto& l : w_.layers) cache_index_.push_back(l.linear ? n_linear++ : n_full++);

    info_.n_layer = cfg.n_layer;
    info_.d_model = cfg.d_model;
    info_.n_vocab = cfg.n_vocab;
    info_.max_position = cfg.max_position;
    info_.n_params = src.n_params();
    info_.weight_bytes = src.bytes();
    info_.kv = {n_full, cfg.n_head_kv, cfg.head_dim};
    const GatedDeltaNetShape& g = cfg.gdn;
    info_.recurrent = {n_linear, g.conv_dim(), g.conv_kernel - 1, g.n_head, g.head_dim_k, g.head_dim_v};

    // A decode step reads every dense matrix once, the routed experts' share
    // of the expert matrices, and one row of the embedding.
    double read = double(w_.head.nbytes()) + double(w_.embed.nbytes()) / double(cfg.n_vocab);
    auto add = [&](const Tensor& t, double share = 1.0) {
      if (t.defined()) read += double(t.nbytes()) * share;
    };
    auto add_mlp = [&](const MlpWeights& m, double share = 1.0) {
      add(m.gate, share);
      add(m.up, share);
      add(m.down, share);
    };
    for (const auto& l : w_.layers) {
      if (l.linear) {
        for (const Tensor* t : {&l.gdn.in_qkv, &l.gdn.in_z, &l.gdn.in_b, &l.gdn.in_a, &l.gdn.out}) add(*t);
      } else {
        for (const Tensor* t : {&l.attn.wq, &l.attn.wk, &l.attn.wv, &l.attn.wo}) add(*t);
      }
      if (l.moe) {
        add(l.experts.router);
        const double share = double(l.experts.n_expert_used) / double(l.experts.experts.size());
        for (const auto& e : l.experts.experts) add_mlp(e, share);
        add_mlp(l.experts.shared);
        add(l.experts.shared_gate);
      } else {
        add_mlp(l.mlp);
      }
    }
    info_.decode_weight_bytes = int64_t(read);

    if (info_.device != Device::CPU) {
      // On an accelerator: experts stacked for the on-device MoE op, and
      // projections sharing an input fused into one GEMM (the DeltaNet's
      // four, attention's q/k/v, gate/up).
      auto fuse = [](MlpWeights& m) {
        if (m.gate.defined() && m.gate.dtype() == m.up.dtype()) {
          m.gate_up = stack_rows({m.gate, m.up});
          m.gate = m.up = Tensor();
        }
      };
      for (auto& l : w_.layers) {
        GatedDeltaNetWeights& g = l.gdn;
        if (l.linear && g.in_qkv.dtype() == g.in_z.dtype() && g.in_qkv.dtype() == g.in_b.dtype() &&
            g.in_qkv.dtype() == g.in_a.dtype()) {
          g.in_all = stack_rows({g.in_qkv, g.in_z, g.in_b, g.in_a});
          g.in_qkv = g.in_z = g.in_b = g.in_a = Tensor();
        }
        AttentionWeights& at = l.attn;
        if (!l.linear && !at.bq.defined() && at.wq.dtype() == at.wk.dtype() && at.wq.dtype() == at.wv.dtype()) {
          at.wqkv = stack_rows({at.wq, at.wk, at.wv});
          at.wq = at.wk = at.wv = Tensor();
        }
        if (l.moe) {
          stack_experts(l.experts);
          fuse(l.experts.shared);
        } else {
          fuse(l.mlp);
        }
      }
    }
  }

  using Model::forward;
  // Reference: Qwen3_5TextModel.forward / Qwen3NextModel.forward.
  void forward(std::span<const ForwardRow> rows, KvCache& kv, const Tensor& logits, const Tensor& ids) override {
    BatchPlan plan = plan_batch(rows, cfg_.n_vocab, cfg_.max_position);
    take_ids(plan, ids, info_.device, cfg_.n_vocab);
    if (logits.dim(0) != int64_t(plan.logit_tokens.size()) || logits.dim(-1) != cfg_.n_vocab ||
        (logits.device() != Device::CPU && logits.device() != info_.device))
      fail("[forward] logits ", logits.shape_str(), " should be [", plan.logit_tokens.size(), ", ", cfg_.n_vocab,
           "] on the host or the model's device");
    const std::vector<ops::RecurrentRow> rec = recurrent_rows(rows, plan, kv);
    auto body = [&](const BatchPlan& p, Scratch& scratch, const Tensor& out) { layers(p, rec, kv, scratch, out); };
    if (info_.device == Device::CPU)
      body(plan, scratch_, logits);
    else
      device_forward_.run(plan, kv, logits, body, ids);
  }

 private:
  void layers(const BatchPlan& plan, std::span<const ops::RecurrentRow> rec, KvCache& kv, Scratch& scratch,
              const Tensor& logits) {
    const int64_t T = plan.n_tokens(), d = cfg_.d_model;
    Tensor x = scratch.get("x", {T, d});  // residual stream
    Tensor h = scratch.get("h", {T, d});  // normed input of a block
    Tensor o = scratch.get("o", {T, d});  // output of a block
    ops::embedding(w_.embed, plan.tokens, x, &plan.device);
    // A layer's input projection, when made ahead (gated_deltanet_mix takes
    // one for one token only).
    auto input_w = [&](const HybridLayer& l) {
      return l.linear ? (T == 1 ? l.gdn.in_all : Tensor()) : l.attn.wqkv;
    };
    Tensor projected = first_block_input(x, w_.layers[0].attn_norm, cfg_.rms_eps, input_w(w_.layers[0]), h, scratch);
    const bool fuse_head = logits_of_every_token(plan, x, logits);
    for (int64_t i = 0; i < cfg_.n_layer; ++i) {
      const HybridLayer& l = w_.layers[size_t(i)];
      const HybridLayer* next = i + 1 < cfg_.n_layer ? &w_.layers[size_t(i + 1)] : nullptr;
      const int64_t c = cache_index_[size_t(i)];
      const Tensor a = l.linear ? gated_deltanet_mix(h, l.gdn, cfg_.gdn, rec, kv.recurrent_layer(c), scratch,
                                                     plan.device.tokens.defined() ? &plan.device : nullptr, projected)
                                : attention_mix(h, l.attn, shape_, inv_freq_, plan, kv.layer(c), scratch, projected);
      projected = Tensor();
      const Tensor& w_out = l.linear ? l.gdn.out : l.attn.wo;
      const Tensor b_out = l.linear ? Tensor() : l.attn.bo;
      if (l.moe) {
        ops::linear(a, w_out, o);
        add_bias(o, b_out);
        ops::add_rms_norm(x, o, l.mlp_norm, cfg_.rms_eps, h);  // x += o; h = norm(x)
        sparse_moe_block(h, l.experts, o, scratch);
      } else {
        // o = mlp(norm(x += out(a))), and at decode on CUDA the next layer's
        // projection (after the last layer, the logits)
        const bool head = next == nullptr && fuse_head;
        const Tensor next_w = next != nullptr ? input_w(*next) : (head ? w_.head : Tensor());
        projected = block_tail(a, w_out, b_out, x, l.mlp_norm, cfg_.rms_eps, l.mlp, h, o, scratch, next_w,
                               next != nullptr ? next->attn_norm : (head ? w_.final_norm : Tensor()),
                               head ? logits : Tensor());
        if (projected.defined() && head) return;  // x += o and the logits done there
        if (projected.defined()) continue;        // x += o done there
      }
      if (next != nullptr)
        ops::add_rms_norm(x, o, next->attn_norm, cfg_.rms_eps, h);
      else
        ops::add_inplace(x, o);  // output_logits norms the rows it needs
    }
    output_logits(x, w_.final_norm, cfg_.rms_eps, w_.head, plan, logits, scratch);
  }

  // Each row's recurrent slot, checked against the cache; rows starting at
  // position 0 get the empty state.
  std::vector<ops::RecurrentRow> recurrent_rows(std::span<const ForwardRow> rows, const BatchPlan& plan,
                                                KvCache& kv) const {
    const RecurrentSpec& want = info_.recurrent;
    const RecurrentSpec& have = kv.recurrent_spec();
    if (have.n_layer != want.n_layer || have.conv_dim != want.conv_dim || have.conv_tail != want.conv_tail ||
        have.n_head != want.n_head || have.head_dim_k != want.head_dim_k || have.head_dim_v != want.head_dim_v ||
        kv.n_slots() <= 0)
      fail("[forward] ", info_.model_type,
           " keeps recurrent state: the cache needs state slots made for this model's RecurrentSpec");
    std::vector<ops::RecurrentRow> out;
    std::vector<bool> used(size_t(kv.n_slots()), false);
    for (size_t r = 0; r < rows.size(); ++r) {
      const int32_t slot = rows[r].state_slot;
      if (slot < 0 || slot >= kv.n_slots())
        fail("[forward] row ", r, " has state slot ", slot, "; ", info_.model_type,
             " keeps recurrent state and needs a slot in [0, ", kv.n_slots(), ")");
      if (used[size_t(slot)]) fail("[forward] rows of one forward share state slot ", slot);
      used[size_t(slot)] = true;
      out.push_back({plan.rows[r].token_begin, plan.rows[r].n_tokens, slot});
    }
    for (size_t r = 0; r < rows.size(); ++r)
      if (rows[r].pos0 == 0) kv.zero_slot(rows[r].state_slot);
    return out;
  }

  HybridConfig cfg_;
  HybridWeights w_;
  AttentionShape shape_;
  std::vector<int64_t> cache_index_;  // per layer: KV layer or recurrent layer index
  Scratch scratch_;                   // CPU forwards
  DeviceForward device_forward_;      // accelerator forwards (own scratch)
  Tensor inv_freq_;  // [rot_dim / 2] f32
};

}  // namespace

std::unique_ptr<Model> make_hybrid_model(const HybridConfig& cfg, HybridWeights weights,
                                         const WeightSource& src, ModelInfo info) {
  return std::make_unique<HybridModel>(cfg, std::move(weights), src, std::move(info));
}

}  // namespace augur
