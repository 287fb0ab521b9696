#include "model/registry.h"

#include <filesystem>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/json_config.h"
#include "model/weights.h"

namespace augur {

namespace {

struct Family {
  const char* model_type;
  FamilyFactory factory;
};

// The registry: add a line when a family lands.
constexpr Family kFamilies[] = {
    {"llama", make_llama},
    {"qwen3", make_qwen3},
    {"qwen3_5", make_qwen3_5},          // text_config nested (multimodal checkpoint)
    {"qwen3_5_text", make_qwen3_5},
    {"qwen3_5_moe", make_qwen3_5_moe},  // text_config nested (multimodal checkpoint)
    {"qwen3_5_moe_text", make_qwen3_5_moe},
    {"qwen3_next", make_qwen3_next},
};

void append_ids(const JsonConfig& cfg, const char* key, std::vector<int32_t>& ids) {
  if (!cfg.has(key) || cfg.is_null(key)) return;
  for (int64_t id : cfg.get_int_list(key)) {
    bool seen = false;
    for (int32_t e : ids) seen |= (e == id);
    if (!seen) ids.push_back(int32_t(id));
  }
}

}  // namespace

FamilyFactory find_family(std::string_view model_type) {
  for (const auto& f : kFamilies)
    if (model_type == f.model_type) return f.factory;
  return nullptr;
}

namespace {

const Family& require_family(const JsonConfig& cfg, std::string_view model_type) {
  for (const auto& f : kFamilies)
    if (model_type == f.model_type) return f;
  std::string known;
  for (const auto& n : family_names()) known += (known.empty() ? "" : ", ") + n;
  std::string msg = "'";  // built by appends: GCC 12 misreports "lit" + string&& (-Wrestrict)
  msg += model_type;
  msg += "' is not supported; supported: ";
  msg += known;
  cfg.error("model_type", msg);
}

}  // namespace

std::unique_ptr<Model> build_model(const JsonConfig& cfg, WeightSource& weights, ModelInfo info,
                                   const Placement& placement) {
  const Family* family = &require_family(cfg, info.model_type);
  placement.require_available();
  info.placement = placement;
  weights.set_placement(placement);
  return family->factory(cfg, weights, std::move(info));
}

std::vector<std::string> family_names() {
  std::vector<std::string> names;
  for (const auto& f : kFamilies) names.emplace_back(f.model_type);
  return names;
}

std::unique_ptr<Model> load_model(const std::string& dir, const Placement& placement) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) fail("[model] ", dir, ": not a model directory");
  const JsonConfig cfg = JsonConfig::load((fs::path(dir) / "config.json").string());
  const std::string model_type = cfg.get_string("model_type");
  require_family(cfg, model_type);  // before touching the weights
  // mlx-lm's affine triples load (dequantized as read); transformers'
  // quantizers (GPTQ, AWQ, FP8, ...) and mlx's other modes are refused here,
  // not as a shape mismatch on the first matrix.
  const QuantConfig quant = QuantConfig::from(cfg);
  ModelInfo info;
  info.model_type = model_type;
  if (cfg.has("architectures") && !cfg.is_null("architectures")) {
    auto archs = cfg.get_string_list("architectures");
    if (!archs.empty()) info.architecture = archs[0];
  }
  append_ids(cfg, "eos_token_id", info.eos_ids);
  if (cfg.has("bos_token_id") && !cfg.is_null("bos_token_id")) info.bos_id = int32_t(cfg.get_int("bos_token_id"));
  const fs::path gen = fs::path(dir) / "generation_config.json";
  if (fs::exists(gen)) append_ids(JsonConfig::load(gen.string()), "eos_token_id", info.eos_ids);

  auto ckpt = std::make_shared<const Checkpoint>(Checkpoint::open(dir));
  auto weights = checkpoint_weights(ckpt, quant);
  return build_model(cfg, *weights, std::move(info), placement);
}

}  // namespace augur
