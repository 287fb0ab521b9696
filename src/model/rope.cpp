#include "model/rope.h"

#include <cmath>
#include <string>

#include "core/error.h"
#include "io/json_config.h"

namespace augur {

std::vector<float> rope_inv_freq(const JsonConfig& cfg, int64_t head_dim, double default_partial) {
  // transformers 5 nests everything under rope_parameters; older configs keep
  // rope_theta at the top and scaling under rope_scaling (null when unused).
  const bool nested = cfg.has("rope_parameters") && !cfg.is_null("rope_parameters");
  const bool legacy_scaling = !nested && cfg.has("rope_scaling") && !cfg.is_null("rope_scaling");
  JsonConfig params = nested ? cfg.sub("rope_parameters") : legacy_scaling ? cfg.sub("rope_scaling") : cfg;
  const double theta = nested ? params.get_float("rope_theta") : cfg.get_float("rope_theta", 10000.0);
  std::string type = "default";
  if (nested || legacy_scaling)
    type = params.has("rope_type") ? params.get_string("rope_type") : params.get_string("type", "default");

  double partial = cfg.get_float("partial_rotary_factor", default_partial);
  if (nested && params.has("partial_rotary_factor")) partial = params.get_float("partial_rotary_factor");
  if (!(partial > 0.0 && partial <= 1.0))
    cfg.error("partial_rotary_factor", "must be in (0, 1]");
  const int64_t dim = int64_t(double(head_dim) * partial);
  if (dim < 2 || dim % 2 != 0) cfg.error("partial_rotary_factor", "gives an odd or empty rotary dimension");
  if (!(theta > 0.0)) cfg.error("rope_theta", "must be positive");

  // inv_freq = 1 / (base ** (arange(0, dim, 2) / dim)), in float32.
  std::vector<float> inv(size_t(dim / 2));
  const float base = float(theta);
  for (int64_t i = 0; i < dim / 2; ++i)
    inv[size_t(i)] = 1.0f / std::pow(base, float(2 * i) / float(dim));

  if (type == "default") return inv;
  if (type == "linear") {
    const float factor = float(params.get_float("factor"));
    if (!(factor > 0)) params.error("factor", "must be positive");
    for (auto& f : inv) f /= factor;
    return inv;
  }
  if (type == "llama3") {
    // Reference: _compute_llama3_parameters.
    const float factor = float(params.get_float("factor"));
    const float low = float(params.get_float("low_freq_factor"));
    const float high = float(params.get_float("high_freq_factor"));
    const float old_ctx = float(params.get_int("original_max_position_embeddings"));
    if (!(factor > 0)) params.error("factor", "must be positive");
    if (!(low > 0)) params.error("low_freq_factor", "must be positive");
    if (!(old_ctx > 0)) params.error("original_max_position_embeddings", "must be positive");
    if (!(high > low)) params.error("high_freq_factor", "must exceed low_freq_factor");
    const float low_wavelen = old_ctx / low, high_wavelen = old_ctx / high;
    const float pi = float(M_PI);
    for (auto& f : inv) {
      const float wavelen = 2.0f * pi / f;
      float scaled = wavelen > low_wavelen ? f / factor : f;
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      if (medium) {
        const float smooth = (old_ctx / wavelen - low) / (high - low);
        scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
      }
      f = scaled;
    }
    return inv;
  }
  params.error(nested ? "rope_type" : "type", "rope type '" + type + "' is not supported (default, linear, llama3)");
}

}  // namespace augur
