// Writes host tensors to a safetensors file (used for --logits-out and tests).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace augur {

// Tensors must be defined, contiguous and on the host; names unique. Data is
// laid out in the given order; the header is space-padded to a multiple of 8
// bytes so every tensor starts 8-byte aligned relative to the file when the
// tensors before it have sizes that are multiples of 8.
// Throws augur::Error "[safetensors] <path>: ..." on bad input or a failed write.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace augur
