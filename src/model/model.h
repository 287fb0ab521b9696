// A loaded model: a forward over a flattened batch of rows.
//
// Each row is (KV blocks of one sequence, first position, tokens) and may be a
// prefill chunk, one decode token or a verify window; positions are per row.
// The model returns logits only for the positions asked for.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "core/tensor.h"

namespace augur {

// What the KV cache of a model looks like.
struct KvSpec {
  int64_t n_layer = 0;  // layers that keep K/V
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  int64_t bytes_per_token() const { return n_layer * n_head_kv * head_dim * 2 * 4; }
};

struct ModelInfo {
  std::string model_type;       // config.json model_type, e.g. "qwen3"
  std::string architecture;     // e.g. "Qwen3ForCausalLM"
  int64_t n_layer = 0;
  int64_t d_model = 0;
  int64_t n_vocab = 0;
  int64_t max_position = 0;     // max_position_embeddings
  int64_t n_params = 0;         // parameters held by the model
  int64_t weight_bytes = 0;     // bytes of those parameters as stored
  int64_t decode_weight_bytes = 0;  // weight bytes one decode step reads
  std::vector<int32_t> eos_ids; // config.json + generation_config.json
  int32_t bos_id = -1;
  KvSpec kv;
};

// Paged K/V storage for all layers: fixed-size blocks of token slots, handed
// out to sequences by the runtime's block allocator.
class KvCache {
 public:
  KvCache(const KvSpec& spec, int64_t n_blocks, int64_t block_size);
  const ops::KvLayer& layer(int64_t i) const { return layers_[size_t(i)]; }
  int64_t n_blocks() const { return n_blocks_; }
  int64_t block_size() const { return block_size_; }
  const KvSpec& spec() const { return spec_; }
  // Copies the contents of block `src` into block `dst` in every layer
  // (copy-on-write of a shared, partly filled block).
  void copy_block(int32_t src, int32_t dst);

 private:
  KvSpec spec_;
  int64_t n_blocks_;
  int64_t block_size_;
  std::vector<ops::KvLayer> layers_;
};

struct ForwardRow {
  std::span<const int32_t> tokens;
  int32_t pos0 = 0;                     // position of tokens[0]
  std::span<const int32_t> block_table; // blocks covering [0, pos0 + tokens.size())
  int32_t n_logits = 1;                 // logits for the last n_logits tokens
};

class Model {
 public:
  virtual ~Model() = default;
  const ModelInfo& info() const { return info_; }
  // logits: [sum of rows' n_logits, n_vocab] f32, rows in order.
  virtual void forward(std::span<const ForwardRow> rows, KvCache& kv, const Tensor& logits) = 0;

 protected:
  ModelInfo info_;
};

// Loads a Hugging Face checkpoint directory (config.json + safetensors),
// showing progress on a terminal. Unknown model_type is an error listing the
// supported ones.
std::unique_ptr<Model> load_model(const std::string& dir);

// A model of a known shape with random weights made in memory, for benchmarks
// (see synthetic_model_names()).
std::unique_ptr<Model> make_synthetic_model(const std::string& name, uint64_t seed = 0);
std::vector<std::string> synthetic_model_names();

}  // namespace augur
