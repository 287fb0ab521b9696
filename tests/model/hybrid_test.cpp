// The hybrid families beyond the golden fixtures: the multimodal checkpoint
// layout (qwen3_5 / qwen3_5_moe nesting text_config, tensors under
// model.language_model.*), layer patterns and MoE placement from the config,
// and config errors that name their field.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>

#include "core/error.h"
#include "io/json_config.h"
#include "io/safetensors.h"
#include "io/quantization.h"
#include "io/safetensors_writer.h"
#include "model/model.h"
#include "model/registry.h"
#include "model/weights.h"

namespace augur {
namespace {

const std::string kData = AUGUR_TEST_DATA;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "augur_hybrid_XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string dir() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

// Logits at every position of `ids` in one forward (slot 0 for recurrent state).
Tensor forward_all(Model& model, const std::vector<int32_t>& ids) {
  const int64_t n = int64_t(ids.size()), bs = 16;
  KvCache kv(model.info().kv, (n + bs - 1) / bs, bs, model.info().recurrent, 1);
  std::vector<int32_t> table(size_t(kv.n_blocks()));
  std::iota(table.begin(), table.end(), 0);
  ForwardRow row{ids, 0, table, int32_t(n), 0};
  Tensor logits = Tensor::empty(DType::F32, {n, model.info().n_vocab});
  Executor executor(Device::CPU);
  model.forward(executor, {&row, 1}, kv, logits);
  return logits;
}

std::vector<int32_t> prompt_of(const std::string& fixture) {
  auto ref = SafetensorsFile::open(kData + "/" + fixture + "/reference.safetensors");
  Tensor t = ref->tensor(*ref->find("prompt_0"));
  return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel());
}

class MultimodalLayout : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

// The text fixture rewritten as a multimodal checkpoint: the same model.
TEST_P(MultimodalLayout, LoadsTheSameLanguageModel) {
  const auto [fixture, model_type] = GetParam();
  const std::string src = kData + "/" + fixture;
  TempDir tmp;
  nlohmann::json text = nlohmann::json::parse(std::ifstream(src + "/config.json"));
  nlohmann::json top = {{"model_type", model_type},
                        {"architectures", {"Qwen3_5ForConditionalGeneration"}},
                        {"tie_word_embeddings", false},
                        {"text_config", text},
                        {"vision_config", {{"depth", 1}}}};
  std::ofstream(tmp.file("config.json")) << top.dump(2);

  auto file = SafetensorsFile::open(src + "/model.safetensors");
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& info : file->tensors()) {
    std::string name = info.name;
    if (name.rfind("model.", 0) == 0) name = "model.language_model." + name.substr(6);
    tensors.emplace_back(name, file->tensor(info));
  }
  // Tensors of the parts the text model does not load.
  tensors.emplace_back("model.visual.patch_embed.proj.weight", Tensor::empty(DType::F32, {4, 3}));
  tensors.emplace_back("mtp.fc.weight", Tensor::empty(DType::F32, {2, 2}));
  write_safetensors(tmp.file("model.safetensors"), tensors);

  auto a = load_model(src);
  auto b = load_model(tmp.dir());
  EXPECT_EQ(b->info().model_type, model_type);
  const auto ids = prompt_of(fixture);
  Tensor la = forward_all(*a, ids), lb = forward_all(*b, ids);
  EXPECT_EQ(0, std::memcmp(la.raw(), lb.raw(), la.nbytes()));
}

INSTANTIATE_TEST_SUITE_P(Qwen35, MultimodalLayout,
                         ::testing::Values(std::pair<std::string, std::string>{"qwen3_5", "qwen3_5"},
                                           std::pair<std::string, std::string>{"qwen3_5_moe", "qwen3_5_moe"}));

// Rewrites a text fixture the way mlx-lm's converter stores it:
// language_model.model.* / language_model.lm_head, conv kernels [C, K, 1],
// the 1 + γ gains stored shifted, a layer's experts stacked as SwitchGLU's
// mlp.switch_mlp.{gate,up,down}_proj [E, rows, cols]. γ + 1 is kept in f32,
// so the two layouts carry the same numbers (mlx-lm itself writes bf16,
// rounding away low bits of γ: the tiny fixture magnifies that to ~0.3 in
// the logits).
void write_mlx_layout(const std::string& fixture, const TempDir& tmp) {
  const std::string src = kData + "/" + fixture;
  std::filesystem::copy_file(src + "/config.json", tmp.file("config.json"));
  auto file = SafetensorsFile::open(src + "/model.safetensors");
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::map<int, Tensor>> experts;  // "...mlp.switch_mlp.gate_proj.weight" -> expert -> matrix
  for (const auto& info : file->tensors()) {
    Tensor t = file->tensor(info);
    std::string name = "language_model." + info.name;
    if (const size_t at = name.find("mlp.experts."); at != std::string::npos) {
      const size_t dot = name.find('.', at + 12);
      experts[name.substr(0, at) + "mlp.switch_mlp" + name.substr(dot)][std::stoi(name.substr(at + 12, dot - at - 12))] = t;
      continue;
    }
    const bool shifted = name.find("layernorm.weight") != std::string::npos || name.ends_with("model.norm.weight") ||
                         name.ends_with("q_norm.weight") || name.ends_with("k_norm.weight");
    if (shifted) {
      Tensor g = Tensor::empty(DType::F32, {t.numel()});
      for (int64_t i = 0; i < t.numel(); ++i) g.data<float>()[i] = bf16_to_f32(t.data<uint16_t>()[i]) + 1.0f;
      t = g;
    } else if (name.ends_with("conv1d.weight")) {
      t = t.reshape({t.dim(0), t.dim(2), 1});  // [C, 1, K] -> [C, K, 1]: same bytes
    }
    tensors.emplace_back(name, t);
  }
  for (const auto& [name, by_expert] : experts) {
    const Tensor& first = by_expert.begin()->second;
    Tensor stacked = Tensor::empty(first.dtype(), {int64_t(by_expert.size()), first.dim(0), first.dim(1)});
    for (const auto& [x, m] : by_expert)
      std::memcpy(static_cast<char*>(stacked.raw()) + size_t(x) * m.nbytes(), m.raw(), m.nbytes());
    tensors.emplace_back(name, stacked);
  }
  write_safetensors(tmp.file("model.safetensors"), tensors);
}

TEST(MlxLayout, GivesTheSameLogitsAsTheTransformersLayout) {
  for (const std::string fixture : {"qwen3_5", "qwen3_5_moe"}) {
    SCOPED_TRACE(fixture);
    TempDir tmp;
    write_mlx_layout(fixture, tmp);
    auto a = load_model(kData + "/" + fixture);
    auto b = load_model(tmp.dir());
    const auto ids = prompt_of(fixture);
    Tensor la = forward_all(*a, ids), lb = forward_all(*b, ids);
    EXPECT_EQ(0, std::memcmp(la.raw(), lb.raw(), la.nbytes()));
  }
}

// An mlx-community checkpoint: mlx-lm's names and layouts with its matrices
// quantized (SwitchGLU experts stacked [E, rows, cols]) loads as the
// quantized transformers layout does: the same groups, the same logits.
TEST(MlxLayout, QuantizedGivesTheSameLogitsAsTheQuantizedTransformersLayout) {
  for (const std::string fixture : {"qwen3_5", "qwen3_5_moe"}) {
    SCOPED_TRACE(fixture);
    TempDir mlx, mlx_q, hf_q;
    write_mlx_layout(fixture, mlx);
    quantize_checkpoint(mlx.dir(), mlx_q.dir(), {4, 32});
    quantize_checkpoint(kData + "/" + fixture, hf_q.dir(), {4, 32});
    auto file = SafetensorsFile::open(mlx_q.file("model.safetensors"));
    int quantized = 0, seen = 0;  // the DeltaNet's projections and (MoE) the stacked experts
    for (const auto& info : file->tensors())
      if (info.name.ends_with("mlp.switch_mlp.down_proj.weight") || info.name.ends_with("linear_attn.in_proj_qkv.weight"))
        ++seen, quantized += info.dtype == DType::U32;
    EXPECT_GT(seen, 0);
    EXPECT_EQ(quantized, seen);
    auto a = load_model(hf_q.dir());
    auto b = load_model(mlx_q.dir());
    const auto ids = prompt_of(fixture);
    Tensor la = forward_all(*a, ids), lb = forward_all(*b, ids);
    EXPECT_EQ(0, std::memcmp(la.raw(), lb.raw(), la.nbytes()));
  }
}

TEST(MlxLayout, MisShapedConvIsAnErrorNamingTheTensor) {
  TempDir tmp;
  write_mlx_layout("qwen3_5", tmp);
  auto file = SafetensorsFile::open(tmp.file("model.safetensors"));
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& info : file->tensors()) {
    Tensor t = file->tensor(info);
    if (info.name == "language_model.model.layers.1.linear_attn.conv1d.weight")
      t = t.reshape({t.dim(0) / 2, t.dim(1) * 2, 1});
    tensors.emplace_back(info.name, t);
  }
  write_safetensors(tmp.file("model2.safetensors"), tensors);
  std::filesystem::rename(tmp.file("model2.safetensors"), tmp.file("model.safetensors"));
  try {
    load_model(tmp.dir());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("language_model.model.layers.1.linear_attn.conv1d.weight"), std::string::npos)
        << e.what();
  }
}

// A tiny model of a family from a config, with synthetic weights.
std::unique_ptr<Model> synthetic(const std::string& text) {
  const JsonConfig cfg = JsonConfig::parse(text, "test-config");
  ModelInfo info;
  info.model_type = cfg.get_string("model_type");
  auto weights = synthetic_weights(1);
  FamilyFactory f = find_family(info.model_type);
  EXPECT_NE(f, nullptr) << info.model_type;
  return f(cfg, *weights, std::move(info));
}

const char* kTinyFields = R"("hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1,
  "head_dim": 16, "vocab_size": 64, "max_position_embeddings": 256, "linear_num_key_heads": 1,
  "linear_num_value_heads": 2, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
  "rope_parameters": {"rope_type": "default", "rope_theta": 10000})";

std::string tiny(const std::string& extra) {
  std::string out = "{";
  out.append(kTinyFields).append(", ").append(extra).append("}");
  return out;
}

bool all_finite(const Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i)
    if (!std::isfinite(t.data<float>()[i])) return false;
  return true;
}

TEST(HybridConfig, FullAttentionIntervalSetsTheLayerPattern) {
  auto m = synthetic(tiny(R"("model_type": "qwen3_5_text", "num_hidden_layers": 6, "intermediate_size": 48,
                             "full_attention_interval": 3)"));
  EXPECT_EQ(m->info().kv.n_layer, 2);         // layers 2 and 5
  EXPECT_EQ(m->info().recurrent.n_layer, 4);
  EXPECT_EQ(m->info().recurrent.conv_dim, 2 * 8 + 2 * 8);
  EXPECT_EQ(m->info().recurrent.conv_tail, 3);  // default kernel 4
  EXPECT_EQ(m->info().recurrent.bytes_per_slot(), 4 * (3 * 32 + 2 * 8 * 8) * 4);
  EXPECT_TRUE(all_finite(forward_all(*m, {1, 2, 3, 4, 5})));
}

TEST(HybridConfig, MoePlacementAndFusedExperts) {
  // qwen3_next: layer 1 dense (mlp_only_layers), the others MoE; synthetic
  // weights offer the fused expert tensors, so that layout is taken.
  auto next = synthetic(tiny(R"("model_type": "qwen3_next", "num_hidden_layers": 4, "intermediate_size": 48,
                                "layer_types": ["linear_attention", "full_attention", "linear_attention", "attention"],
                                "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
                                "shared_expert_intermediate_size": 24, "mlp_only_layers": [1],
                                "norm_topk_prob": false)"));
  EXPECT_EQ(next->info().kv.n_layer, 2);
  EXPECT_EQ(next->info().recurrent.n_layer, 2);
  EXPECT_TRUE(all_finite(forward_all(*next, {7, 8, 9})));
  auto moe = synthetic(tiny(R"("model_type": "qwen3_5_moe_text", "num_hidden_layers": 2,
                               "num_experts": 4, "num_experts_per_tok": 1, "moe_intermediate_size": 16,
                               "shared_expert_intermediate_size": 0)"));
  EXPECT_TRUE(all_finite(forward_all(*moe, {7, 8, 9})));
}

TEST(HybridConfig, ErrorsNameTheField) {
  auto expect_field = [](const std::string& text, const std::string& field) {
    try {
      synthetic(text);
      FAIL() << "expected an error about " << field;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'" + field + "'"), std::string::npos) << e.what();
    }
  };
  expect_field(tiny(R"("model_type": "qwen3_5_text", "num_hidden_layers": 2, "intermediate_size": 48,
                       "layer_types": ["linear_attention", "sliding_attention"])"),
               "layer_types");
  expect_field(tiny(R"("model_type": "qwen3_5_text", "num_hidden_layers": 3, "intermediate_size": 48,
                       "layer_types": ["linear_attention", "full_attention"])"),
               "layer_types");
  expect_field(R"({"model_type": "qwen3_5_text", "hidden_size": 32, "num_attention_heads": 2, "head_dim": 16,
                   "vocab_size": 64, "num_hidden_layers": 1, "intermediate_size": 8, "linear_num_key_heads": 2,
                   "linear_num_value_heads": 3, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
                   "rope_parameters": {"rope_theta": 10000}})",
               "linear_num_value_heads");
  expect_field(tiny(R"("model_type": "qwen3_5_moe_text", "num_hidden_layers": 1, "num_experts": 2,
                       "num_experts_per_tok": 3, "moe_intermediate_size": 8)"),
               "num_experts_per_tok");
}

TEST(HybridConfig, MissingTensorIsAnErrorNamingIt) {
  TempDir tmp;
  const std::string src = kData + "/qwen3_5";
  std::filesystem::copy_file(src + "/config.json", tmp.file("config.json"));
  auto file = SafetensorsFile::open(src + "/model.safetensors");
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& info : file->tensors())
    if (info.name != "model.layers.1.linear_attn.dt_bias") tensors.emplace_back(info.name, file->tensor(info));
  write_safetensors(tmp.file("model.safetensors"), tensors);
  try {
    load_model(tmp.dir());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.1.linear_attn.dt_bias"), std::string::npos) << e.what();
  }
}

TEST(Synthetic, Qwen35_27bIsListed) {
  // Only listed here: its weights (~54 GB in bf16) are for the benchmark machines.
  const auto names = synthetic_model_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "qwen3.5-27b"), names.end());
}

}  // namespace
}  // namespace augur
