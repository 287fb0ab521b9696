#include "text.h"

#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "io/json_config.h"

namespace augur::cli {

TextModel TextModel::load(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path p = fs::is_directory(dir) ? fs::path(dir) / "tokenizer.json" : fs::path(dir);
  if (!fs::exists(p))
    fail("[cli] ", dir, ": no tokenizer.json; give the prompt as token ids with --prompt-ids");
  TextModel m{Tokenizer::load(p.string()), nullptr};
  const fs::path cfg_dir = p.parent_path();
  if (fs::exists(cfg_dir / "tokenizer_config.json") || fs::exists(cfg_dir / "chat_template.jinja")) {
    ChatTemplateConfig cfg = load_chat_template_config(cfg_dir.string());
    if (!cfg.chat_template.empty()) m.chat = std::make_unique<ChatTemplate>(cfg);
  }
  return m;
}

std::vector<int32_t> TextModel::encode_prompt(const std::string& text) const {
  return tokenizer.encode(text, /*add_special_tokens=*/true);
}

std::string TextModel::render_chat(const nlohmann::ordered_json& messages, bool add_generation_prompt) const {
  if (!chat) fail("[cli] ", tokenizer.path(), ": the checkpoint has no chat_template");
  return chat->apply(messages, add_generation_prompt);
}

std::vector<int32_t> TextModel::encode_chat(const nlohmann::ordered_json& messages, bool add_generation_prompt) const {
  return tokenizer.encode(render_chat(messages, add_generation_prompt), /*add_special_tokens=*/false);
}

void SamplingOptions::add_to(CLI::App* cmd, bool penalties) {
  temperature_ = cmd->add_option("--temperature", p_.temperature, "0 = greedy (default: generation_config.json)");
  top_k_ = cmd->add_option("--top-k", p_.top_k, "Keep the k most likely tokens (0 = off)");
  top_p_ = cmd->add_option("--top-p", p_.top_p, "Nucleus sampling mass (1 = off)");
  min_p_ = cmd->add_option("--min-p", p_.min_p, "Drop tokens below min-p x the top probability");
  if (penalties) {
    repetition_ = cmd->add_option("--repetition-penalty", p_.repetition_penalty, "transformers-style (1 = off)");
    cmd->add_option("--presence-penalty", p_.presence_penalty, "OpenAI-style (0 = off)");
    cmd->add_option("--frequency-penalty", p_.frequency_penalty, "OpenAI-style (0 = off)");
  }
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
    if (repetition_ != nullptr && unset(repetition_))
      p.repetition_penalty = float(g.get_float("repetition_penalty", 1.0));
  }
  validate(p);
  return p;
}

TextSink::TextSink(const Tokenizer& tok, std::vector<std::string> stops, bool print)
    : decoder_(tok, /*skip_special=*/true), stop_(std::move(stops)), print_(print) {}

void TextSink::emit(const std::string& piece) {
  if (piece.empty()) return;
  text_ += piece;
  if (print_) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  }
}

bool TextSink::push(int32_t id) {
  if (stopped_) return false;
  StopMatcher::Result r = stop_.feed(decoder_.push(id));
  emit(r.text);
  stopped_ = r.stopped;
  return !stopped_;
}

void TextSink::finish() {
  if (stopped_) return;
  StopMatcher::Result r = stop_.feed(decoder_.flush());
  emit(r.text);
  stopped_ = r.stopped;
  if (!stopped_) emit(stop_.flush());
}

}  // namespace augur::cli
