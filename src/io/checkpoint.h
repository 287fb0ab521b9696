// A model directory's weights: one model.safetensors, or shards listed by
// model.safetensors.index.json ("weight_map": tensor name -> shard file).
// Lookup is by the checkpoint's own names; renaming to canonical names is the
// job of the checkpoint views above this.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"

namespace augur {

class Checkpoint {
 public:
  // Prefers model.safetensors when both exist (as transformers does).
  // Throws augur::Error "[checkpoint] <dir>: ..." on a missing or bad layout.
  static Checkpoint open(const std::string& dir);

  bool has(std::string_view name) const;
  // Throws "[checkpoint] <dir>: no tensor named X".
  const TensorInfo& info(std::string_view name) const;
  // Zero-copy view into the mapped shard; throws like info().
  Tensor get(std::string_view name) const;
  // Sorted.
  std::vector<std::string> names() const;
  // Sum of all tensors' bytes.
  size_t total_bytes() const;
  const std::string& dir() const { return dir_; }
  const std::vector<std::shared_ptr<SafetensorsFile>>& files() const { return files_; }

 private:
  struct Entry {
    const TensorInfo* info;  // owned by files_[file]
    size_t file;
  };

  std::string dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry, std::less<>> entries_;
};

}  // namespace augur
