// augur inspect MODEL_DIR: architecture, parameter count, dtypes, memory.
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "io/checkpoint.h"
#include "io/json_config.h"
#include "io/quantization.h"
#include "model/model.h"

namespace augur::cli {

namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", b, units[u]);
  return buf;
}

int inspect(const std::string& dir, bool json, int64_t ctx) {
  const Checkpoint ckpt = Checkpoint::open(dir);
  std::map<std::string, std::pair<int64_t, int64_t>> by_dtype;  // dtype -> (tensors, bytes)
  for (const auto& name : ckpt.names()) {
    const TensorInfo& t = ckpt.info(name);
    auto& e = by_dtype[std::string(dtype_name(t.dtype))];
    e.first += 1;
    e.second += int64_t(t.nbytes);
  }
  auto model = load_model(dir);
  const ModelInfo& info = model->info();
  // mlx-lm's affine quantization: the default spec (modules may differ).
  const QuantConfig quant = QuantConfig::from(JsonConfig::load(dir + "/config.json"));
  const std::optional<AffineQuant> spec = quant.any() ? quant.for_module("") : std::nullopt;
  const int64_t kv_bytes = info.kv.bytes_per_token() * ctx;
  // Linear-attention layers keep a fixed-size state per sequence and its
  // input history (plus one state copy per captured snapshot), next to the
  // KV cache.
  const int64_t state_bytes =
      info.recurrent.n_layer > 0 ? info.recurrent.bytes_per_slot() + info.recurrent.history_bytes_per_slot() : 0;
  if (json) {
    nlohmann::json dtypes = nlohmann::json::object();
    for (auto& [k, v] : by_dtype) dtypes[k] = {{"tensors", v.first}, {"bytes", v.second}};
    nlohmann::json out = {{"model_type", info.model_type},
                          {"architecture", info.architecture},
                          {"n_layer", info.n_layer},
                          {"d_model", info.d_model},
                          {"n_vocab", info.n_vocab},
                          {"n_head_kv", info.kv.n_head_kv},
                          {"head_dim", info.kv.head_dim},
                          {"n_params", info.n_params},
                          {"weight_bytes", info.weight_bytes},
                          {"checkpoint_bytes", ckpt.total_bytes()},
                          {"dtypes", dtypes},
                          {"kv_bytes_per_token", info.kv.bytes_per_token()},
                          {"context", ctx},
                          {"recurrent_layers", info.recurrent.n_layer},
                          {"recurrent_bytes_per_sequence", state_bytes},
                          {"memory_bytes", info.weight_bytes + kv_bytes + state_bytes},
                          {"eos_token_ids", info.eos_ids}};
    out["quantization"] = nullptr;
    if (quant.any()) {
      const AffineQuant q = quant.for_module("").value_or(AffineQuant{});
      out["quantization"] = {{"mode", "affine"}, {"bits", q.bits}, {"group_size", q.group_size}};
    }
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("model          %s\n", dir.c_str());
  std::printf("architecture   %s (model_type %s)\n", info.architecture.c_str(), info.model_type.c_str());
  std::printf("layers         %lld, d_model %lld, vocab %lld, kv heads %lld x %lld\n", (long long)info.n_layer,
              (long long)info.d_model, (long long)info.n_vocab, (long long)info.kv.n_head_kv,
              (long long)info.kv.head_dim);
  std::printf("parameters     %lld (%.3f B)\n", (long long)info.n_params, double(info.n_params) / 1e9);
  std::printf("dtypes        ");
  for (auto& [k, v] : by_dtype)
    std::printf(" %s: %lld tensors, %s;", k.c_str(), (long long)v.first, human_bytes(double(v.second)).c_str());
  std::printf("\n");
  if (spec)
    std::printf("quantization   affine, %d bits in groups of %d; packed on the CPU (the memory below), dequantized "
                "as loaded on CUDA\n", spec->bits, spec->group_size);
  if (state_bytes > 0)
    std::printf("memory         weights %s + KV %s/token (f32) x %lld tokens + recurrent state %s/sequence (%lld layers) = %s\n",
                human_bytes(double(info.weight_bytes)).c_str(), human_bytes(double(info.kv.bytes_per_token())).c_str(),
                (long long)ctx, human_bytes(double(state_bytes)).c_str(), (long long)info.recurrent.n_layer,
                human_bytes(double(info.weight_bytes + kv_bytes + state_bytes)).c_str());
  else
    std::printf("memory         weights %s + KV %s/token (f32) x %lld tokens = %s\n",
                human_bytes(double(info.weight_bytes)).c_str(), human_bytes(double(info.kv.bytes_per_token())).c_str(),
                (long long)ctx, human_bytes(double(info.weight_bytes + kv_bytes)).c_str());
  return 0;
}

}  // namespace

Handler add_inspect(CLI::App& app) {
  struct Args {
    std::string model = AUGUR_DEFAULT_MODEL;
    bool json = false;
    int64_t ctx = 4096;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("inspect", "Describe a checkpoint: architecture, parameters, dtypes, memory");
  cmd->add_option("model", a->model, "Model directory")->capture_default_str();
  cmd->add_flag("--json", a->json, "Print one JSON object");
  cmd->add_option("--ctx", a->ctx, "Context length for the memory estimate")->capture_default_str();
  return [a] { return inspect(a->model, a->json, a->ctx); };
}

}  // namespace augur::cli
