// Model families keyed by config.json's model_type.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "model/model.h"

namespace augur {

class JsonConfig;
class WeightSource;

// Builds a family's model from its config and weights; `info` arrives with the
// identity fields (model_type, architecture, eos/bos ids) already set.
using FamilyFactory = std::unique_ptr<Model> (*)(const JsonConfig& cfg, WeightSource& weights, ModelInfo info);

// nullptr when no family has that model_type.
FamilyFactory find_family(std::string_view model_type);
// Looks up info.model_type (an error listing the supported ones when
// unknown) and builds it with its weights placed by `placement` (an error
// when its device is not available).
std::unique_ptr<Model> build_model(const JsonConfig& cfg, WeightSource& weights, ModelInfo info,
                                   const Placement& placement);
std::vector<std::string> family_names();

// One line per family (defined in the family's file).
std::unique_ptr<Model> make_llama(const JsonConfig&, WeightSource&, ModelInfo);
std::unique_ptr<Model> make_qwen3(const JsonConfig&, WeightSource&, ModelInfo);
std::unique_ptr<Model> make_qwen3_5(const JsonConfig&, WeightSource&, ModelInfo);      // qwen3_5.cpp
std::unique_ptr<Model> make_qwen3_5_moe(const JsonConfig&, WeightSource&, ModelInfo);  // qwen3_5.cpp
std::unique_ptr<Model> make_qwen3_next(const JsonConfig&, WeightSource&, ModelInfo);

}  // namespace augur
