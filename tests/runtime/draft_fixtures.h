// Checkpoints written by the speculative-decoding tests (CPU and CUDA):
// fixtures with an MTP head added, perturbed copies to draft for them, and
// augur-tiny cut to its first layers.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "io/io_test_util.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"

namespace augur {
namespace {

inline const std::string kDraftData = AUGUR_TEST_DATA;
inline const std::string kDraftTiny = kDraftData + "/../../models/augur-tiny";

// The hybrid fixture with an MTP head added: config mtp_num_hidden_layers 1,
// mtp.layers.0.* a copy of its full-attention layer 3, the three norms a copy
// of model.norm, and mtp.fc random (seeded).
inline void write_with_mtp(const std::string& fixture, const test::TempDir& tmp) {
  const std::string src = kDraftData + "/" + fixture;
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src + "/config.json"));
  ASSERT_EQ(cfg["layer_types"][3], "full_attention");
  cfg["mtp_num_hidden_layers"] = 1;
  std::ofstream(tmp.file("config.json")) << cfg.dump(2);
  auto file = SafetensorsFile::open(src + "/model.safetensors");
  std::vector<std::pair<std::string, Tensor>> tensors;
  const std::string layer = "model.layers.3.";
  for (const auto& info : file->tensors()) {
    tensors.emplace_back(info.name, file->tensor(info));
    if (info.name.rfind(layer, 0) == 0)
      tensors.emplace_back("mtp.layers.0." + info.name.substr(layer.size()), file->tensor(info));
    if (info.name == "model.norm.weight")
      for (const char* n : {"mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"})
        tensors.emplace_back(n, file->tensor(info));
  }
  const int64_t d = cfg["hidden_size"];
  Tensor fc = Tensor::empty(DType::F32, {d, 2 * d});
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const float a = std::sqrt(3.0f / float(2 * d));
  for (int64_t i = 0; i < fc.numel(); ++i) fc.data<float>()[i] = a * u(rng);
  tensors.emplace_back("mtp.fc.weight", fc);
  write_safetensors(tmp.file("model.safetensors"), tensors);
}

// The fixture with every matrix of its last layer scaled by 1 + noise
// (seeded, relative `scale`): another model of its vocabulary that mostly
// agrees with it.
inline void write_perturbed(const std::string& fixture, float scale, const test::TempDir& tmp) {
  const std::string src = kDraftData + "/" + fixture;
  std::filesystem::copy_file(src + "/config.json", tmp.file("config.json"));
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src + "/config.json"));
  const std::string last = "model.layers." + std::to_string(int64_t(cfg["num_hidden_layers"]) - 1) + ".";
  auto file = SafetensorsFile::open(src + "/model.safetensors");
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::mt19937 rng(3);
  std::normal_distribution<float> noise(0.0f, scale);
  for (const auto& info : file->tensors()) {
    Tensor t = file->tensor(info);
    if (info.name.rfind(last, 0) == 0 && t.ndim() == 2 && t.dtype() == DType::BF16) {
      Tensor f = Tensor::empty(DType::F32, {t.dim(0), t.dim(1)});
      for (int64_t i = 0; i < t.numel(); ++i)
        f.data<float>()[i] = bf16_to_f32(t.data<uint16_t>()[i]) * (1.0f + noise(rng));
      t = f;
    }
    tensors.emplace_back(info.name, t);
  }
  write_safetensors(tmp.file("model.safetensors"), tensors);
}

// augur-tiny cut to its first `n_layer` layers (same embedding and head): a
// model of its vocabulary, to draft for it.
inline void write_truncated_tiny(int64_t n_layer, const test::TempDir& tmp) {
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(kDraftTiny + "/config.json"));
  cfg["num_hidden_layers"] = n_layer;
  cfg["layer_types"] = std::vector<nlohmann::json>(cfg["layer_types"].begin(), cfg["layer_types"].begin() + n_layer);
  cfg["mtp_num_hidden_layers"] = 0;
  std::ofstream(tmp.file("config.json")) << cfg.dump(2);
  auto file = SafetensorsFile::open(kDraftTiny + "/model.safetensors");
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& info : file->tensors()) {
    const std::string& name = info.name;
    if (name.rfind("mtp.", 0) == 0) continue;
    if (name.rfind("model.layers.", 0) == 0 && std::stoll(name.substr(13)) >= n_layer) continue;
    tensors.emplace_back(name, file->tensor(info));
  }
  write_safetensors(tmp.file("model.safetensors"), tensors);
}

}  // namespace
}  // namespace augur
