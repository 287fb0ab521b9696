// Rotary embedding frequencies from config.json, as transformers'
// ROPE_INIT_FUNCTIONS compute them (float32 arithmetic).
#pragma once

#include <cstdint>
#include <vector>

namespace augur {

class JsonConfig;

// inv_freq: [rot_dim / 2] where rot_dim = head_dim * partial_rotary_factor
// (`default_partial` when the config does not set it: 0.25 for the Qwen3.5 /
// Qwen3-Next configs, 1 elsewhere).
// Reads `rope_parameters` (transformers >= 5) or `rope_theta` + `rope_scaling`;
// rope types: default, linear, llama3. Anything else is an error naming it.
std::vector<float> rope_inv_freq(const JsonConfig& cfg, int64_t head_dim, double default_partial = 1.0);

}  // namespace augur
