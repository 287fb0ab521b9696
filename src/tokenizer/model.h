// Tokenization models: turn one pre-tokenized word into ids (HF models).
// BPE is implemented; other model types are refused by name.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace augur::tok {

class Model {
 public:
  virtual ~Model() = default;
  // Appends the ids of `word` (non-empty valid UTF-8) to `out`.
  virtual void tokenize(std::string_view word, std::vector<int32_t>& out) const = 0;
  // -1 when absent.
  virtual int32_t token_to_id(std::string_view token) const = 0;
  // The token of `id`; false when the vocab has no such id.
  virtual bool id_to_token(int32_t id, std::string_view& token) const = 0;
  // One past the largest id of the model's vocab.
  virtual size_t id_limit() const = 0;
};

std::unique_ptr<Model> make_model(const nlohmann::json& j, const std::string& where);

}  // namespace augur::tok
