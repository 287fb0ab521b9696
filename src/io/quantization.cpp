#include "io/quantization.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/quant.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "io/json_config.h"
#include "io/safetensors_writer.h"

namespace augur {

namespace {

std::string shape_str(const Tensor& t) { return t.shape_str(); }


// v in bf16, rounded toward +inf (up) or -inf.
uint16_t bf16_toward(float v, bool up) {
  uint16_t r = f32_to_bf16(v);
  const float f = bf16_to_f32(r);
  if (up ? f < v : f > v) {
    const bool negative = (r & 0x8000u) != 0;
    if (r == 0x8000u || r == 0u) return up ? uint16_t(0x0001u) : uint16_t(0x8001u);
    r = uint16_t(up != negative ? r + 1 : r - 1);  // one ulp away from zero, or toward it
  }
  return r;
}

}  // namespace

void check_affine(const AffineQuant& q, std::string_view what) {
  if (q.bits != 2 && q.bits != 3 && q.bits != 4 && q.bits != 5 && q.bits != 6 && q.bits != 8)
    fail("[quantization] ", what, ": ", q.bits, " bits; affine quantization takes 2, 3, 4, 5, 6 or 8");
  if (q.group_size != 32 && q.group_size != 64 && q.group_size != 128)
    fail("[quantization] ", what, ": group size ", q.group_size, "; affine quantization takes 32, 64 or 128");
}

QuantConfig QuantConfig::from(const JsonConfig& cfg) {
  QuantConfig out;
  if (cfg.has("quantization_config") && !cfg.is_null("quantization_config")) {
    const JsonConfig qc = cfg.sub("quantization_config");
    if (qc.has("quant_method"))
      qc.error("quant_method", "is " + qc.get_string("quant_method", "?") +
                                   ", a transformers quantizer augur does not load; give the unquantized "
                                   "checkpoint, or one quantized by mlx-lm (affine)");
  }
  const char* key = cfg.has("quantization") && !cfg.is_null("quantization") ? "quantization"
                    : cfg.has("quantization_config") && !cfg.is_null("quantization_config")
                        ? "quantization_config"
                        : nullptr;
  if (key == nullptr) return out;
  const JsonConfig q = cfg.sub(key);
  const std::string mode = q.get_string("mode", "affine");
  if (mode != "affine")
    q.error("mode", "is " + mode + "; augur loads mlx's affine quantization only");
  out.present_ = true;
  out.default_.bits = int(q.get_int("bits"));
  out.default_.group_size = int(q.get_int("group_size"));
  check_affine(out.default_, q.field_name("bits"));
  for (const std::string& k : q.keys()) {
    if (k == "bits" || k == "group_size" || k == "mode") continue;
    // A module's entry: false (left in floats) or its own spec.
    bool quantized = true;
    try {
      quantized = q.get_bool(k);
    } catch (const Error&) {
      const JsonConfig m = q.sub(k);
      if (m.get_string("mode", "affine") != "affine")
        m.error("mode", "is " + m.get_string("mode") + "; augur loads mlx's affine quantization only");
      AffineQuant spec{int(m.get_int("bits", out.default_.bits)), int(m.get_int("group_size", out.default_.group_size))};
      check_affine(spec, q.field_name(k));
      out.modules_[k] = spec;
      continue;
    }
    out.modules_[k] = quantized ? std::optional<AffineQuant>(out.default_) : std::nullopt;
  }
  return out;
}

std::optional<AffineQuant> QuantConfig::for_module(std::string_view module) const {
  if (!present_) return std::nullopt;
  auto it = modules_.find(module);
  return it == modules_.end() ? std::optional<AffineQuant>(default_) : it->second;
}

Tensor dequantize_affine(const Tensor& packed, const Tensor& scales, const Tensor& biases, const AffineQuant& q,
                         int64_t in, std::string_view name) {
  check_affine(q, name);
  return dequantize(pack_affine(packed, scales, biases, q.bits, q.group_size, in, name));
}

AffineTriple quantize_affine(const Tensor& w, const AffineQuant& q, std::string_view name) {
  check_affine(q, name);
  const int nd = w.ndim();
  if (nd < 2 || !w.is_contiguous() || w.device() != Device::CPU)
    fail("[quantization] ", name, ": a contiguous host matrix is needed, got ", shape_str(w));
  if (w.dtype() != DType::F32 && w.dtype() != DType::BF16 && w.dtype() != DType::F16)
    fail("[quantization] ", name, ": ", dtype_name(w.dtype()), " is not a float type");
  const int64_t in = w.dim(nd - 1);
  if (in <= 0 || in % q.group_size != 0)
    fail("[quantization] ", name, ": rows of ", in, " values do not split into groups of ", q.group_size);
  for (int64_t i = 0; i < w.numel(); ++i)
    if (!std::isfinite(w.float_at(i)))
      fail("[quantization] ", name, ": element ", i, " is ", w.float_at(i), "; only finite weights quantize");
  std::vector<int64_t> packed_shape(w.shape().begin(), w.shape().begin() + nd), group_shape = packed_shape;
  packed_shape.back() = in * q.bits / 32;
  group_shape.back() = in / q.group_size;
  AffineTriple t{Tensor::empty(DType::U32, packed_shape.data(), nd), Tensor::empty(DType::BF16, group_shape.data(), nd),
                 Tensor::empty(DType::BF16, group_shape.data(), nd)};
  const int64_t rows = w.numel() / in, groups = in / q.group_size, row_bytes = in * q.bits / 8;
  const float steps = float((1 << q.bits) - 1);
  uint8_t* dst = static_cast<uint8_t*>(t.weight.raw());
  // Rows are whole 32-bit words (group sizes are multiples of 32): no byte
  // is shared between the threads' rows.
  ThreadPool::global().parallel_for(rows, 16, [&](int64_t rb, int64_t re) {
    for (int64_t r = rb; r < re; ++r) {
      uint8_t* row = dst + r * row_bytes;
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t j0 = r * in + g * q.group_size;
        float lo = w.float_at(j0), hi = lo;
        for (int64_t j = 1; j < q.group_size; ++j) lo = std::min(lo, w.float_at(j0 + j)), hi = std::max(hi, w.float_at(j0 + j));
        // The bias at or below the minimum, the scale reaching the maximum.
        const uint16_t b16 = bf16_toward(lo, false);
        const float b = bf16_to_f32(b16);
        const uint16_t s16 = hi > b ? bf16_toward((hi - b) / steps, true) : uint16_t(0);
        const float s = bf16_to_f32(s16);
        t.scales.data<uint16_t>()[r * groups + g] = s16;
        t.biases.data<uint16_t>()[r * groups + g] = b16;
        for (int64_t j = 0; j < q.group_size; ++j) {
          const float v = s > 0.f ? std::nearbyint((w.float_at(j0 + j) - b) / s) : 0.f;
          const uint32_t qv = uint32_t(std::clamp(v, 0.f, steps));
          const int64_t bit = (g * q.group_size + j) * q.bits;
          row[bit >> 3] = uint8_t(row[bit >> 3] | (qv << (bit & 7)));
          if ((bit & 7) + q.bits > 8) row[(bit >> 3) + 1] = uint8_t(row[(bit >> 3) + 1] | (qv >> (8 - (bit & 7))));
        }
      }
    }
  });
  return t;
}

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The spec a tensor is quantized with, or none where it stays as it is.
std::optional<AffineQuant> quantize_as(const std::string& name, const TensorInfo& t, const AffineQuant& q) {
  if (t.dtype != DType::F32 && t.dtype != DType::BF16 && t.dtype != DType::F16) return std::nullopt;
  if (t.shape.size() < 2 || !ends_with(name, ".weight")) return std::nullopt;
  AffineQuant spec = q;
  if (ends_with(name, ".mlp.gate.weight") || ends_with(name, ".shared_expert_gate.weight")) spec.bits = 8;
  if (t.shape.back() <= 0 || t.shape.back() % spec.group_size != 0) return std::nullopt;
  return spec;
}

}  // namespace

QuantizeReport quantize_checkpoint(const std::string& dir, const std::string& out, const AffineQuant& q,
                                   const std::function<void(int64_t, int64_t)>& progress) {
  namespace fs = std::filesystem;
  using nlohmann::json;
  check_affine(q, "quantize");
  const Checkpoint ckpt = Checkpoint::open(dir);
  const fs::path config_in = fs::path(dir) / "config.json";
  std::ifstream cf(config_in);
  if (!cf) fail("[quantize] ", config_in.string(), ": cannot read");
  json config;
  try {
    config = json::parse(cf);
  } catch (const json::exception& e) {
    fail("[quantize] ", config_in.string(), ": ", e.what());
  }
  for (const char* key : {"quantization", "quantization_config"})
    if (config.contains(key) && !config[key].is_null())
      fail("[quantize] ", config_in.string(), ": field '", key, "' says the checkpoint is quantized already");
  // A new or empty directory, not inside the checkpoint's (whose files are
  // copied over).
  if (fs::exists(out) && !(fs::is_directory(out) && fs::is_empty(out)))
    fail("[quantize] ", out, ": ", fs::exists(fs::path(out) / "config.json") ? "holds a checkpoint already" : "is not empty",
         "; give an empty or new directory");
  const bool created = fs::create_directories(out);
  {
    const fs::path src = fs::canonical(dir);
    for (fs::path p = fs::canonical(out); p.has_relative_path(); p = p.parent_path())
      if (fs::equivalent(p, src)) {
        if (created) fs::remove(out);
        fail("[quantize] ", out, ": inside the checkpoint's directory ", dir, "; give one outside it");
      }
  }

  QuantizeReport report;
  const std::vector<std::string> names = ckpt.names();
  json quant = {{"group_size", q.group_size}, {"bits", q.bits}, {"mode", "affine"}};
  std::vector<std::pair<std::string, Tensor>> shard;
  std::vector<std::vector<std::string>> shard_names;
  size_t shard_bytes = 0;
  constexpr size_t kShardBytes = size_t(4) << 30;
  auto flush = [&] {
    if (shard.empty()) return;
    const std::string file = "part-" + std::to_string(shard_names.size()) + ".safetensors";
    write_safetensors((fs::path(out) / file).string(), shard, {{"format", "mlx"}});
    shard_names.emplace_back();
    for (const auto& [name, t] : shard) shard_names.back().push_back(name);
    shard.clear();
    shard_bytes = 0;
  };
  auto add = [&](std::string name, Tensor t) {
    shard_bytes += t.nbytes();
    report.bytes_out += t.nbytes();
    shard.emplace_back(std::move(name), std::move(t));
  };
  int64_t done = 0;
  for (const std::string& name : names) {
    const TensorInfo& info = ckpt.info(name);
    report.bytes_in += info.nbytes;
    const Tensor t = ckpt.get(name);
    if (ends_with(name, "mlp.experts.gate_up_proj") || ends_with(name, "mlp.experts.down_proj")) {
      // Fused experts (transformers' Qwen3NextExperts: gate_up [E, 2I, d],
      // gate rows first; down [E, d, I]) become mlx-lm's SwitchGLU triples
      // (switch_mlp.gate_proj and up_proj [E, I, d], down_proj [E, d, I]).
      const bool gate_up = ends_with(name, "gate_up_proj");
      const std::string p =
          name.substr(0, name.size() - std::string_view(gate_up ? "experts.gate_up_proj" : "experts.down_proj").size());
      std::vector<std::pair<std::string, Tensor>> parts;
      if (!gate_up) {
        parts.emplace_back(p + "switch_mlp.down_proj", t);
      } else {
        if (t.ndim() != 3 || t.dim(1) % 2 != 0)
          fail("[quantize] ", ckpt.dir(), ": '", name, "' is ", t.shape_str(), ", expected [experts, 2 x rows, columns]");
        const int64_t E = t.dim(0), I = t.dim(1) / 2, D = t.dim(2);
        const size_t half = size_t(I * D) * dtype_size(t.dtype());
        for (int which = 0; which < 2; ++which) {
          Tensor part = Tensor::uninitialized(t.dtype(), std::vector<int64_t>{E, I, D}.data(), 3);
          for (int64_t x = 0; x < E; ++x)
            std::memcpy(static_cast<char*>(part.raw()) + size_t(x) * half,
                        static_cast<const char*>(t.raw()) + size_t(2 * x + which) * half, half);
          parts.emplace_back(p + (which == 0 ? "switch_mlp.gate_proj" : "switch_mlp.up_proj"), part);
        }
      }
      bool any = false;
      for (auto& [module, w] : parts) {
        TensorInfo as = info;
        as.shape.assign(w.shape().begin(), w.shape().begin() + w.ndim());
        if (const auto spec = quantize_as(module + ".weight", as, q)) {
          AffineTriple triple = quantize_affine(w, *spec, module + ".weight");
          add(module + ".weight", std::move(triple.weight));
          add(module + ".scales", std::move(triple.scales));
          add(module + ".biases", std::move(triple.biases));
          any = true;
        } else {
          add(module + ".weight", w);
        }
      }
      ++(any ? report.quantized : report.kept);
    } else if (const auto spec = quantize_as(name, info, q)) {
      AffineTriple triple = quantize_affine(t, *spec, name);
      const std::string module = name.substr(0, name.size() - std::string_view(".weight").size());
      if (spec->bits != q.bits) quant[module] = {{"group_size", spec->group_size}, {"bits", spec->bits}};
      add(name, std::move(triple.weight));
      add(module + ".scales", std::move(triple.scales));
      add(module + ".biases", std::move(triple.biases));
      ++report.quantized;
    } else {
      add(name, t);  // a view of the mapped file
      ++report.kept;
    }
    if (shard_bytes >= kShardBytes) flush();
    if (progress) progress(++done, int64_t(names.size()));
  }
  flush();

  // Shards named as transformers and mlx-lm name them, with an index where
  // there are several.
  report.shards = int(shard_names.size());
  json weight_map = json::object();
  for (size_t i = 0; i < shard_names.size(); ++i) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, shard_names.size());
    const std::string file = shard_names.size() == 1 ? "model.safetensors" : buf;
    fs::rename(fs::path(out) / ("part-" + std::to_string(i) + ".safetensors"), fs::path(out) / file);
    for (const auto& n : shard_names[i]) weight_map[n] = file;
  }
  if (shard_names.size() > 1) {
    std::ofstream idx(fs::path(out) / "model.safetensors.index.json");
    idx << json{{"metadata", {{"total_size", report.bytes_out}}}, {"weight_map", weight_map}}.dump(2) << "\n";
    if (!idx) fail("[quantize] ", out, ": cannot write model.safetensors.index.json");
  }
  config["quantization"] = quant;
  config["quantization_config"] = quant;
  std::ofstream co(fs::path(out) / "config.json");
  co << config.dump(2) << "\n";
  if (!co) fail("[quantize] ", out, ": cannot write config.json");

  // The other top-level files (tokenizer, templates, generation config) and
  // the templates' folder as they are; other folders (such as the original
  // consolidated weights some repositories carry) are not the checkpoint's.
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string file = e.path().filename().string();
    if (file == "config.json" || file == "model.safetensors.index.json" || ends_with(file, ".safetensors")) continue;
    if (e.is_regular_file())
      fs::copy_file(e.path(), fs::path(out) / file, fs::copy_options::overwrite_existing);
    else if (e.is_directory() && file == "additional_chat_templates")
      fs::copy(e.path(), fs::path(out) / file, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  }
  return report;
}

}  // namespace augur
