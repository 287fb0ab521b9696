#include "tokenizer/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

namespace augur {

namespace {

constexpr const char* kSpecialTokens[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                          "pad_token", "cls_token", "mask_token"};

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("[chat_template] ", path.string(), ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("[chat_template] ", path.string(), ": read failed");
  return ss.str();
}

}  // namespace

ChatTemplateConfig parse_chat_template_config(const nlohmann::ordered_json& config,
                                              std::string_view where,
                                              std::string_view template_name) {
  if (!config.is_object()) fail("[chat_template] ", where, ": tokenizer config is not a JSON object");
  ChatTemplateConfig out;
  const auto ct = config.find("chat_template");
  if (ct != config.end() && !ct->is_null()) {
    if (ct->is_string()) {
      out.chat_template = ct->get<std::string>();
    } else if (ct->is_array()) {
      // transformers' named templates: [{"name": "default", "template": "..."}, ...]
      for (const auto& entry : *ct) {
        const auto name = entry.is_object() ? entry.find("name") : entry.end();
        const auto text = entry.is_object() ? entry.find("template") : entry.end();
        if (!entry.is_object() || name == entry.end() || !name->is_string() ||
            text == entry.end() || !text->is_string())
          fail("[chat_template] ", where, ": chat_template list entries must be {name, template} strings");
        out.named_templates[name->get<std::string>()] = text->get<std::string>();
      }
      const auto it = out.named_templates.find(std::string(template_name));
      if (it == out.named_templates.end()) {
        std::string names;
        for (const auto& [n, t] : out.named_templates) names += (names.empty() ? "" : ", ") + n;
        fail("[chat_template] ", where, ": no chat template named '", template_name,
             "' (has: ", names, ")");
      }
      out.chat_template = it->second;
      if (template_name == "default")
        if (const auto tu = out.named_templates.find("tool_use"); tu != out.named_templates.end())
          out.tool_use_template = tu->second;
    } else {
      fail("[chat_template] ", where, ": chat_template must be a string or a list of {name, template}, got ",
           ct->type_name());
    }
  }
  for (const char* key : kSpecialTokens) {
    const auto t = config.find(key);
    if (t == config.end() || t->is_null()) continue;
    if (t->is_string()) {
      out.special_tokens[key] = *t;
    } else if (t->is_object() && t->contains("content") && (*t)["content"].is_string()) {
      out.special_tokens[key] = (*t)["content"];
    } else {
      fail("[chat_template] ", where, ": ", key, " must be a string or an AddedToken object");
    }
  }
  return out;
}

ChatTemplateConfig load_chat_template_config(const std::string& path, std::string_view template_name) {
  namespace fs = std::filesystem;
  fs::path config_path = path;
  fs::path jinja_path;
  if (fs::is_directory(config_path)) {
    jinja_path = config_path / "chat_template.jinja";
    config_path /= "tokenizer_config.json";
  }
  ChatTemplateConfig out;
  if (fs::exists(config_path) || jinja_path.empty()) {
    nlohmann::ordered_json config;
    try {
      config = nlohmann::ordered_json::parse(read_file(config_path));
    } catch (const nlohmann::json::exception& e) {
      fail("[chat_template] ", config_path.string(), ": bad JSON: ", e.what());
    }
    out = parse_chat_template_config(config, config_path.string(), template_name);
  }
  if (!jinja_path.empty() && fs::exists(jinja_path)) out.chat_template = read_file(jinja_path);
  // Older checkpoints keep some special tokens in special_tokens_map.json
  // alone: it gives those tokenizer_config.json leaves out.
  if (!jinja_path.empty()) {
    const fs::path map_path = jinja_path.parent_path() / "special_tokens_map.json";
    if (fs::exists(map_path)) {
      nlohmann::ordered_json map;
      try {
        map = nlohmann::ordered_json::parse(read_file(map_path));
      } catch (const nlohmann::json::exception& e) {
        fail("[chat_template] ", map_path.string(), ": bad JSON: ", e.what());
      }
      if (map.is_object()) {
        const ChatTemplateConfig from_map = parse_chat_template_config(map, map_path.string(), template_name);
        for (const auto& [key, value] : from_map.special_tokens.items())
          if (!out.special_tokens.contains(key)) out.special_tokens[key] = value;
      }
    }
  }
  // Newer transformers saves named templates beside it, one file each.
  if (!jinja_path.empty()) {
    const fs::path more = jinja_path.parent_path() / "additional_chat_templates";
    if (fs::is_directory(more))
      for (const auto& f : fs::directory_iterator(more))
        if (f.path().extension() == ".jinja") out.named_templates[f.path().stem().string()] = read_file(f.path());
    if (template_name == "default")
      if (const auto tu = out.named_templates.find("tool_use"); tu != out.named_templates.end())
        out.tool_use_template = tu->second;
  }
  return out;
}

ChatTemplate::ChatTemplate(std::string source, nlohmann::ordered_json special_tokens)
    : source_(std::move(source)),
      special_tokens_(std::move(special_tokens)),
      template_(source_, "chat_template") {
  if (!special_tokens_.is_object()) fail("[chat_template] special tokens must be a JSON object");
}

ChatTemplate::ChatTemplate(const ChatTemplateConfig& config)
    : ChatTemplate(config.chat_template, config.special_tokens) {
  if (!config.tool_use_template.empty())
    tool_use_ = std::make_unique<jinja::Template>(config.tool_use_template, "chat_template tool_use");
}

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const {
  return template_.render(context);
}

std::string ChatTemplate::apply(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                const nlohmann::ordered_json& extra) const {
  if (!extra.is_object()) fail("[chat_template] extra template variables must be a JSON object");
  nlohmann::ordered_json context = special_tokens_;
  context["messages"] = messages;
  context["tools"] = nullptr;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = add_generation_prompt;
  for (auto it = extra.begin(); it != extra.end(); ++it) context[it.key()] = it.value();
  const bool tools = extra.contains("tools") && !extra["tools"].is_null();
  return (tools && tool_use_ ? *tool_use_ : template_).render(context);
}

std::string apply_chat_template(const std::string& source, const nlohmann::ordered_json& messages,
                                bool add_generation_prompt, const nlohmann::ordered_json& extra) {
  return ChatTemplate(source).apply(messages, add_generation_prompt, extra);
}

}  // namespace augur
