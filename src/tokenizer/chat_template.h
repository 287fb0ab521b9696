// Chat templates: a conversation rendered into the prompt text exactly as
// transformers' `tokenizer.apply_chat_template(messages, tokenize=False, ...)`
// renders it, from the `chat_template` of tokenizer_config.json.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "tokenizer/jinja/template.h"

namespace augur {

// The chat-template part of a checkpoint's tokenizer files.
struct ChatTemplateConfig {
  // The template source; empty when the checkpoint has none.
  std::string chat_template;
  // Every template by name when tokenizer_config.json holds a list of
  // {name, template} ("default", "tool_use", ...); else empty.
  std::map<std::string, std::string> named_templates;
  // The "tool_use" template, where the checkpoint names one beside the
  // default (tokenizer_config.json's list, or additional_chat_templates/
  // tool_use.jinja): transformers renders with it whenever tools are given.
  std::string tool_use_template;
  // transformers' special_tokens_map as template variables: bos_token,
  // eos_token, unk_token, sep_token, pad_token, cls_token, mask_token, each
  // a string (an AddedToken object gives its "content"); null ones absent.
  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object();
};

// Reads the chat template and special tokens out of a parsed
// tokenizer_config.json; `where` names it in errors. With a list of named
// templates, `template_name` picks one (transformers uses "default").
ChatTemplateConfig parse_chat_template_config(const nlohmann::ordered_json& tokenizer_config,
                                              std::string_view where,
                                              std::string_view template_name = "default");

// `path` is a tokenizer_config.json or the directory holding it; in a
// directory a chat_template.jinja file, when present, replaces the config's
// template (as transformers loads it).
ChatTemplateConfig load_chat_template_config(const std::string& path,
                                             std::string_view template_name = "default");

class ChatTemplate {
 public:
  // Parses `source`; throws TemplateError naming the line. `special_tokens`
  // (an object such as ChatTemplateConfig::special_tokens) are variables of
  // every apply().
  explicit ChatTemplate(std::string source,
                        nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object());
  explicit ChatTemplate(const ChatTemplateConfig& config);

  // Renders with exactly `context` (an object) as the variables.
  std::string render(const nlohmann::ordered_json& context) const;

  // apply_chat_template(messages, tokenize=False, add_generation_prompt, **extra):
  // the variables are the special tokens, `messages`, `tools` and `documents`
  // (null unless in extra) and `add_generation_prompt`, then the members of
  // `extra` (e.g. tools, enable_thinking, bos_token), which win. With tools
  // (non-null extra["tools"]) the config's tool_use template renders, where
  // there is one.
  std::string apply(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                    const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  const std::string& source() const { return source_; }
  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }

 private:
  std::string source_;
  nlohmann::ordered_json special_tokens_;
  jinja::Template template_;
  std::unique_ptr<jinja::Template> tool_use_;  // ChatTemplateConfig::tool_use_template
};

// One-shot ChatTemplate(source).apply(messages, add_generation_prompt, extra).
std::string apply_chat_template(const std::string& source, const nlohmann::ordered_json& messages,
                                bool add_generation_prompt,
                                const nlohmann::ordered_json& extra = nlohmann::ordered_json::object());

}  // namespace augur
