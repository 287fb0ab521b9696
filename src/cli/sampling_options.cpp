#include "sampling_options.h"

#include <filesystem>

#include "io/json_config.h"

namespace augur::cli {

void SamplingOptions::add_to(CLI::App* cmd) {
  temperature_ = cmd->add_option("--temperature", p_.temperature, "0 = greedy (default: generation_config.json)");
  top_k_ = cmd->add_option("--top-k", p_.top_k, "Keep the k most likely tokens (0 = off)");
  top_p_ = cmd->add_option("--top-p", p_.top_p, "Nucleus sampling mass (1 = off)");
  min_p_ = cmd->add_option("--min-p", p_.min_p, "Drop tokens below min-p x the top probability");
  repetition_ = cmd->add_option("--repetition-penalty", p_.repetition_penalty, "transformers-style (1 = off)");
  cmd->add_option("--presence-penalty", p_.presence_penalty, "OpenAI-style (0 = off)");
  cmd->add_option("--frequency-penalty", p_.frequency_penalty, "OpenAI-style (0 = off)");
  cmd->add_option("--seed", p_.seed, "Sampling seed");
}

SamplingParams SamplingOptions::resolve(const std::string& dir) const {
  namespace fs = std::filesystem;
  SamplingParams p = p_;
  const fs::path gen = fs::path(dir) / "generation_config.json";
  if (fs::is_directory(dir) && fs::exists(gen)) {
    const JsonConfig g = JsonConfig::load(gen.string());
    auto unset = [](const CLI::Option* o) { return o == nullptr || o->count() == 0; };
    if (g.get_bool("do_sample", false)) {
      if (unset(temperature_)) p.temperature = float(g.get_float("temperature", 1.0));
      if (unset(top_k_)) p.top_k = int32_t(g.get_int("top_k", 50));
      if (unset(top_p_)) p.top_p = float(g.get_float("top_p", 1.0));
      if (unset(min_p_)) p.min_p = float(g.get_float("min_p", 0.0));
    }
    if (unset(repetition_))
      p.repetition_penalty = float(g.get_float("repetition_penalty", 1.0));
  }
  validate(p);
  return p;
}

}  // namespace augur::cli
