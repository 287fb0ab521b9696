// Text in, text out: a checkpoint's tokenizer and chat template.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace augur {

struct TextModel {
  Tokenizer tokenizer;
  std::unique_ptr<ChatTemplate> chat;  // null when the checkpoint has no template

  // Loads tokenizer.json (and tokenizer_config.json) from `dir`; an error names
  // the directory when they are missing.
  static TextModel load(const std::string& dir);
  // Whether `dir` has a tokenizer.json to load.
  static bool exists(const std::string& dir);
  // Raw text as `tokenizer(text)` encodes it (special tokens added).
  std::vector<int32_t> encode_prompt(const std::string& text) const;
  // messages rendered by the chat template, then encoded without adding
  // special tokens (the template writes them), as apply_chat_template does.
  // extra: more template variables (tools, enable_thinking, ...).
  std::string render_chat(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                          const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;
  std::vector<int32_t> encode_chat(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                   const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;
};

}  // namespace augur
