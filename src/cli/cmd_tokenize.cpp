// augur tokenize MODEL_OR_TOKENIZER_DIR (--text TEXT | --decode 1,2,3 |
//                --messages FILE.json [--add-generation-prompt]) [--json]
#include <cstdio>
#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "runtime/text_model.h"

namespace augur::cli {

namespace {

struct TokenizeArgs {
  std::string dir = AUGUR_DEFAULT_MODEL;
  std::optional<std::string> text;  // may be empty: "" encodes to no ids
  std::optional<std::string> decode;
  std::optional<std::string> messages;
  bool add_generation_prompt = false;
  bool add_special_tokens = false;
  bool skip_special_tokens = false;
  bool json = false;
};

void print_ids(const std::vector<int32_t>& ids) {
  for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? "," : "", ids[i]);
  std::printf("\n");
}

int tokenize(const TokenizeArgs& a) {
  const int given = int(a.text.has_value()) + int(a.decode.has_value()) + int(a.messages.has_value());
  if (given != 1) fail("[cli] tokenize: give exactly one of --text, --decode or --messages");
  const TextModel m = TextModel::load(a.dir);
  if (a.decode) {
    const std::vector<int32_t> ids = a.decode->empty() ? std::vector<int32_t>{} : parse_ids(*a.decode, "--decode");
    const std::string out = m.tokenizer.decode(ids, a.skip_special_tokens);
    if (a.json)
      std::printf("%s\n", nlohmann::json({{"text", out}}).dump().c_str());
    else
      std::printf("%s\n", out.c_str());
    return 0;
  }
  if (a.text) {
    const auto ids = m.tokenizer.encode(*a.text, a.add_special_tokens);
    if (a.json) {
      nlohmann::json tokens = nlohmann::json::array();
      for (int32_t id : ids) tokens.push_back(m.tokenizer.id_to_token(id));
      std::printf("%s\n", nlohmann::json({{"ids", ids}, {"tokens", tokens}}).dump().c_str());
    } else {
      print_ids(ids);
    }
    return 0;
  }
  const std::string& file = *a.messages;
  std::ifstream in(file);
  if (!in) fail("[cli] ", file, ": cannot open");
  nlohmann::ordered_json messages;
  try {
    messages = nlohmann::ordered_json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    fail("[cli] ", file, ": bad JSON: ", e.what());
  }
  if (messages.is_object() && messages.contains("messages")) messages = messages["messages"];
  if (!messages.is_array()) fail("[cli] ", file, ": expected an array of {role, content} messages");
  const std::string rendered = m.render_chat(messages, a.add_generation_prompt);
  if (a.json) {
    const auto ids = m.tokenizer.encode(rendered, false);
    std::printf("%s\n", nlohmann::json({{"text", rendered}, {"ids", ids}}).dump().c_str());
  } else {
    std::fwrite(rendered.data(), 1, rendered.size(), stdout);
    if (rendered.empty() || rendered.back() != '\n') std::printf("\n");
  }
  return 0;
}

}  // namespace

Handler add_tokenize(CLI::App& app) {
  auto a = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Encode text, decode ids, or render a chat");
  cmd->add_option("dir", a->dir, "Model or tokenizer directory (tokenizer.json)")->capture_default_str();
  cmd->add_option("--text", a->text, "Text to encode (prints ids)");
  cmd->add_option("--decode", a->decode, "Comma-separated ids to decode (prints text)");
  cmd->add_option("--messages", a->messages, "JSON file with an OpenAI-style messages array to render");
  cmd->add_flag("--add-generation-prompt", a->add_generation_prompt, "End the rendered chat with the assistant prompt");
  cmd->add_flag("--add-special-tokens", a->add_special_tokens, "Add BOS/EOS as the post-processor says (--text)");
  cmd->add_flag("--skip-special-tokens", a->skip_special_tokens, "Leave special tokens out (--decode)");
  cmd->add_flag("--json", a->json, "Print JSON (ids and token strings; rendered text and ids)");
  return [a] { return tokenize(*a); };
}

}  // namespace augur::cli
