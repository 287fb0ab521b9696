// Post-processors: what encode adds around the model's ids when asked for
// special tokens (HF processors). Offsets are not tracked, so ByteLevel's
// offset trimming is a no-op here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace augur::tok {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Rewrites the ids of a single sequence.
  virtual void process(std::vector<int32_t>& ids, bool add_special_tokens) const = 0;
};

std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& j,
                                                   const std::string& where);

}  // namespace augur::tok
