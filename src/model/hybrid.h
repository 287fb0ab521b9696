// The block structure shared by the hybrid linear-attention families
// (Qwen3.5 dense and MoE, Qwen3-Next):
//   x += mixer(rms_norm(x)); x += mlp(rms_norm(x))
// where the mixer is a Gated DeltaNet or gated full attention as `layer_types`
// says, the MLP a dense SwiGLU or a sparse MoE, and every RMSNorm outside the
// DeltaNet is zero-centred (gain 1 + γ). Families parse their config into
// HybridConfig, load their weights into HybridWeights (their checkpoint names,
// through the loaders below where names are shared) and call make_hybrid_model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/gated_deltanet.h"
#include "model/layers.h"
#include "model/model.h"
#include "model/moe.h"

namespace augur {

class JsonConfig;
class WeightSource;

struct HybridConfig : TransformerDims {
  std::vector<float> inv_freq;    // [rot_dim / 2] (partial rotary)
  std::vector<bool> linear;       // per layer: Gated DeltaNet (true) or full attention
  GatedDeltaNetShape gdn;
};

// The fields every hybrid text config has, validated; the layer pattern from
// `layer_types` or, without it, `full_attention_interval` (default 4: every
// fourth layer is full attention).
HybridConfig read_hybrid_config(const JsonConfig& cfg);

struct HybridLayer {
  bool linear = false;
  Tensor attn_norm;            // [d_model] f32, 1 + γ
  GatedDeltaNetWeights gdn;    // linear-attention layers
  AttentionWeights attn;       // full-attention layers: output gate, q/k norms 1 + γ
  Tensor mlp_norm;             // [d_model] f32, 1 + γ
  bool moe = false;
  MlpWeights mlp;              // dense MLP layers
  MoeWeights experts;          // MoE layers
};

struct HybridWeights {
  Tensor embed;                // [n_vocab, d_model]
  std::vector<HybridLayer> layers;
  Tensor final_norm;           // [d_model] f32, 1 + γ
  Tensor head;                 // [n_vocab, d_model]
};

// Loaders for the tensors the hybrid families name alike; `p` is the layer's
// prefix ("model.layers.3.").
Tensor load_centred_norm(WeightSource& w, const std::string& name, int64_t n);  // 1 + γ
AttentionWeights load_gated_attention(WeightSource& w, const std::string& p, const HybridConfig& c);
MlpWeights load_swiglu(WeightSource& w, const std::string& p, int64_t d_model, int64_t d_ff);
// conv1d, A_log, dt_bias, norm and out_proj of a Gated DeltaNet (the
// projections differ between families).
void load_deltanet_common(WeightSource& w, const std::string& p, const HybridConfig& c,
                          GatedDeltaNetWeights& out);

struct MoeConfig {
  int64_t n_expert = 0, n_expert_used = 0, d_ff_expert = 0, d_ff_shared = 0;
  bool norm_topk = true;
};
// Reads num_experts, num_experts_per_tok, moe_intermediate_size,
// shared_expert_intermediate_size.
MoeConfig read_moe_config(const JsonConfig& cfg);
// mlp.gate, mlp.experts.{e}.{gate,up,down}_proj (or the fused
// mlp.experts.gate_up_proj / down_proj), mlp.shared_expert.*, mlp.shared_expert_gate.
MoeWeights load_moe(WeightSource& w, const std::string& p, int64_t d_model, const MoeConfig& m);

// Builds the model; `info` carries the family's identity, shapes and sizes are
// filled in here (`src` for the parameter counts).
std::unique_ptr<Model> make_hybrid_model(const HybridConfig& cfg, HybridWeights weights,
                                         const WeightSource& src, ModelInfo info);

}  // namespace augur
