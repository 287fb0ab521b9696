// augur quantize MODEL_DIR OUT_DIR [--bits B] [--group-size G]: an
// affine-quantized copy of a checkpoint in mlx-lm's layout (mlx-community
// checkpoints are made the same way), which augur run | chat | serve load.
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "commands.h"
#include "core/error.h"
#include "io/quantization.h"

namespace augur::cli {

namespace {

struct QuantizeArgs {
  std::string model;
  std::string out;
  int bits = 4;
  int group_size = 64;
};

int quantize(const QuantizeArgs& a) {
  int last = -10;  // the tenth last shown
  const bool tty = isatty(fileno(stderr)) != 0;  // one line rewritten, else a line each tenth
  const QuantizeReport r = quantize_checkpoint(a.model, a.out, {a.bits, a.group_size}, [&](int64_t done, int64_t total) {
    const int pct = int(100 * done / std::max<int64_t>(total, 1));
    if (pct / 10 != last / 10 || done == total) {
      std::fprintf(stderr, "%squantizing: %lld of %lld tensors (%d%%)%s", tty ? "\r" : "",
                   static_cast<long long>(done), static_cast<long long>(total), pct, tty ? "" : "\n");
      last = pct;
    }
  });
  if (tty) std::fprintf(stderr, "\n");
  std::printf("%s: %lld matrices at %d bits in groups of %d, %lld tensors kept; %.3f GB -> %.3f GB in %d file%s\n",
              a.out.c_str(), static_cast<long long>(r.quantized), a.bits, a.group_size, static_cast<long long>(r.kept),
              double(r.bytes_in) / 1e9, double(r.bytes_out) / 1e9, r.shards, r.shards == 1 ? "" : "s");
  return 0;
}

}  // namespace

Handler add_quantize(CLI::App& app) {
  auto a = std::make_shared<QuantizeArgs>();
  CLI::App* cmd = app.add_subcommand("quantize", "Write an affine-quantized copy of a checkpoint (mlx-lm's layout)");
  cmd->add_option("model", a->model, "Checkpoint directory (config.json + safetensors)")->required();
  cmd->add_option("out", a->out, "Output directory")->required();
  cmd->add_option("--bits", a->bits, "Bits a weight: 2, 3, 4, 5, 6 or 8")->capture_default_str();
  cmd->add_option("--group-size", a->group_size, "Weights sharing a scale and bias: 32, 64 or 128")
      ->capture_default_str();
  return [a] { return quantize(*a); };
}

}  // namespace augur::cli
