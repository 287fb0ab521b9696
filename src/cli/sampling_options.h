// The sampling options of `run` and `chat`, registered on a subcommand.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "runtime/sampler.h"

namespace augur::cli {

// The options the user leaves unset take the checkpoint's
// generation_config.json defaults (do_sample, temperature, top_k, top_p,
// min_p, repetition_penalty), as transformers' generate() does: do_sample
// false or absent means greedy; do_sample true with no top_k means top_k 50.
class SamplingOptions {
 public:
  void add_to(CLI::App* cmd);
  // The parameters for the model in `dir`, validated.
  SamplingParams resolve(const std::string& dir) const;

 private:
  SamplingParams p_;
  CLI::Option *temperature_ = nullptr, *top_k_ = nullptr, *top_p_ = nullptr, *min_p_ = nullptr,
              *repetition_ = nullptr;
};

}  // namespace augur::cli
