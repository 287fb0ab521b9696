#include "runtime/text_model.h"

#include <filesystem>

#include "core/error.h"

namespace augur {

namespace {

std::filesystem::path tokenizer_path(const std::string& dir) {
  namespace fs = std::filesystem;
  return fs::is_directory(dir) ? fs::path(dir) / "tokenizer.json" : fs::path(dir);
}

}  // namespace

bool TextModel::exists(const std::string& dir) { return std::filesystem::exists(tokenizer_path(dir)); }

TextModel TextModel::load(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path p = tokenizer_path(dir);
  if (!fs::exists(p)) fail("[text] ", dir, ": no tokenizer.json; give the prompt as token ids with --prompt-ids");
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

std::string TextModel::render_chat(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                   const nlohmann::ordered_json& extra) const {
  if (!chat) fail("[text] ", tokenizer.path(), ": the checkpoint has no chat_template");
  return chat->apply(messages, add_generation_prompt, extra);
}

std::vector<int32_t> TextModel::encode_chat(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                            const nlohmann::ordered_json& extra) const {
  return tokenizer.encode(render_chat(messages, add_generation_prompt, extra), /*add_special_tokens=*/false);
}

}  // namespace augur
