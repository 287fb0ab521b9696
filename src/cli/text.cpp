#include "text.h"

#include <cstdio>
#include <filesystem>

#include "core/error.h"

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
