// Normalizers: the text rewrites tokenizer.json applies before splitting
// (HF tokenizers' normalizers module).
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace augur::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites valid UTF-8 `s` in place.
  virtual void normalize(std::string& s) const = 0;
};

// Builds the normalizer described by `j` (null gives null); `where` is
// "[tokenizer] file" for error messages.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const std::string& where);

}  // namespace augur::tok
