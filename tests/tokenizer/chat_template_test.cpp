// Chat templates rendered exactly as transformers' apply_chat_template
// (tokenize=False) renders them, for the real tokenizer_config.json of each
// family fetched by scripts/fetch_tokenizers.sh.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/chat_template.h"

namespace augur {
namespace {

const char* const kFamilies[] = {"qwen3", "llama3", "deepseek_v3", "gemma3"};

std::string family_dir(const std::string& name) {
  return std::string(AUGUR_TEST_DATA) + "/tokenizers/" + name;
}

// A missing download fails the test with the way to fix it.
ChatTemplate load_family(const std::string& name) {
  const std::string path = family_dir(name) + "/tokenizer_config.json";
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << "tokenizer data missing: " << path << "; run scripts/fetch_tokenizers.sh";
    throw std::runtime_error("missing " + path);
  }
  return ChatTemplate(load_chat_template_config(family_dir(name)));
}

const nlohmann::ordered_json& reference() {
  static const nlohmann::ordered_json ref = [] {
    std::ifstream in(std::string(AUGUR_TEST_DATA) + "/tokenizer/reference.json", std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return nlohmann::ordered_json::parse(ss.str());
  }();
  return ref;
}

class ChatGolden : public testing::TestWithParam<const char*> {};

// Every case recorded by transformers for this family renders identically.
TEST_P(ChatGolden, MatchesTransformers) {
  const std::string name = GetParam();
  const auto& cases = reference().at("chat_" + name);
  ASSERT_FALSE(cases.empty());
  const ChatTemplate tmpl = load_family(name);
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    EXPECT_EQ(tmpl.apply(c.at("messages"), c.at("add_generation_prompt").get<bool>()),
              c.at("rendered").get<std::string>())
        << name << " case " << i << ": " << c.at("messages").dump();
  }
}

INSTANTIATE_TEST_SUITE_P(Families, ChatGolden, testing::ValuesIn(kFamilies),
                         [](const testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

// Conversations beyond the recorded ones (tools, tool calls, thinking
// switches, content parts), rendered by jinja2 3.1.6 in transformers'
// environment with the same special tokens and context.
struct Scenario {
  const char* name;
  const char* family;
  const char* messages;
  bool add_generation_prompt;
  const char* extra;
  const char* expected;
};

const Scenario kScenarios[] = {
    {"qwen3_tools_and_tool_calls", "qwen3",
     R"json([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}, {"role": "tool", "content": "sunny, 24°C"}])json",
     true, R"json({"tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get the weather ✓", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]})json",
     "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the weather ✓\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsunny, 24°C\n</tool_response><|im_end|>\n<|im_start|>assistant\n"},
    {"qwen3_thinking_disabled", "qwen3",
     R"json([{"role": "user", "content": "Hi"}])json",
     true, R"json({"enable_thinking": false})json",
     "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"},
    {"qwen3_reasoning_kept_after_last_query", "qwen3",
     R"json([{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"}, {"role": "user", "content": "3+3?"}, {"role": "assistant", "content": "6", "reasoning_content": "add again"}])json",
     false, R"json({})json",
     "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n<think>\nadd again\n</think>\n\n6<|im_end|>\n"},
    {"deepseek_v3_tool_calls", "deepseek_v3",
     R"json([{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}, {"role": "tool", "content": "sunny"}, {"role": "assistant", "content": "Sunny."}])json",
     true, R"json({})json",
     "<｜begin▁of▁sentence｜><｜User｜>Weather?<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>sunny<｜tool▁output▁end｜><｜tool▁outputs▁end｜>Sunny.<｜end▁of▁sentence｜><｜Assistant｜>"},
    {"gemma3_content_parts", "gemma3",
     R"json([{"role": "system", "content": [{"type": "text", "text": "Sys."}]}, {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " Describe. "}]}])json",
     true, R"json({})json",
     "<bos><start_of_turn>user\nSys.\n\n<start_of_image>Describe.<end_of_turn>\n<start_of_turn>model\n"},
};

class ChatScenario : public testing::TestWithParam<Scenario> {};

TEST_P(ChatScenario, MatchesJinja2) {
  const Scenario& s = GetParam();
  const ChatTemplate tmpl = load_family(s.family);
  EXPECT_EQ(tmpl.apply(nlohmann::ordered_json::parse(s.messages), s.add_generation_prompt,
                       nlohmann::ordered_json::parse(s.extra)),
            s.expected);
}

INSTANTIATE_TEST_SUITE_P(Families, ChatScenario, testing::ValuesIn(kScenarios),
                         [](const testing::TestParamInfo<Scenario>& info) {
                           return std::string(info.param.name);
                         });

TEST(ChatTemplate, GemmaRaisesOnNonAlternatingRoles) {
  const ChatTemplate tmpl = load_family("gemma3");
  const auto messages = nlohmann::ordered_json::parse(
      R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])");
  try {
    tmpl.apply(messages, true);
    FAIL() << "expected raise_exception";
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.reason(), "Conversation roles must alternate user/assistant/user/assistant/...");
    EXPECT_EQ(e.line(), 19);
    EXPECT_EQ(std::string(e.what()).rfind("[chat_template] line 19: ", 0), 0u) << e.what();
  }
}

TEST(ChatTemplate, SpecialTokensFromConfig) {
  // deepseek_v3 writes AddedToken objects; qwen3 has a null bos_token, which
  // transformers leaves out of the template variables.
  const auto deepseek = load_chat_template_config(family_dir("deepseek_v3"));
  EXPECT_EQ(deepseek.special_tokens.at("bos_token"), "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(deepseek.special_tokens.at("eos_token"), "<｜end▁of▁sentence｜>");
  const auto qwen = load_chat_template_config(family_dir("qwen3"));
  EXPECT_FALSE(qwen.special_tokens.contains("bos_token"));
  EXPECT_EQ(qwen.special_tokens.at("eos_token"), "<|im_end|>");
  EXPECT_EQ(qwen.special_tokens.at("pad_token"), "<|endoftext|>");
  EXPECT_NE(qwen.chat_template.find("<|im_start|>"), std::string::npos);
}

TEST(ChatTemplate, ApplyProvidesTransformersVariables) {
  const ChatTemplate tmpl(
      "{{ bos_token }}|{{ tools is none }}|{{ documents is none }}|{{ add_generation_prompt }}|"
      "{{ messages|length }}|{{ enable_thinking is defined }}",
      {{"bos_token", "<s>"}});
  const auto messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  EXPECT_EQ(tmpl.apply(messages, true), "<s>|True|True|True|1|False");
  // Extra variables win over the special tokens and the defaults.
  EXPECT_EQ(tmpl.apply(messages, false, {{"bos_token", "<B>"}, {"enable_thinking", false}, {"tools", {1}}}),
            "<B>|False|True|False|1|True");
  EXPECT_EQ(apply_chat_template("{{ messages[0].content }}", messages, false), "hi");
}

TEST(ChatTemplate, ParsesNamedTemplates) {
  const auto config = nlohmann::ordered_json::parse(R"({
    "chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}],
    "bos_token": {"__type": "AddedToken", "content": "<s>"}, "eos_token": null})");
  const auto def = parse_chat_template_config(config, "test");
  EXPECT_EQ(def.chat_template, "D");
  EXPECT_EQ(def.named_templates.size(), 2u);
  EXPECT_EQ(def.special_tokens, nlohmann::ordered_json({{"bos_token", "<s>"}}));
  EXPECT_EQ(parse_chat_template_config(config, "test", "tool_use").chat_template, "T");
  try {
    parse_chat_template_config(config, "test", "rag");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "[chat_template] test: no chat template named 'rag' (has: default, tool_use)");
  }
  EXPECT_THROW(parse_chat_template_config(nlohmann::ordered_json::parse(R"({"chat_template": 3})"), "test"),
               Error);
  EXPECT_EQ(parse_chat_template_config(nlohmann::ordered_json::object(), "test").chat_template, "");
}

TEST(ChatTemplate, ChatTemplateJinjaFileWins) {
  const std::filesystem::path dir =
      std::filesystem::path(testing::TempDir()) / "augur_chat_template_jinja_file";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": "old", "eos_token": "</s>"})";
  std::ofstream(dir / "chat_template.jinja") << "new {{ eos_token }}\n";
  const auto config = load_chat_template_config(dir.string());
  EXPECT_EQ(config.chat_template, "new {{ eos_token }}\n");
  EXPECT_EQ(ChatTemplate(config).apply(nlohmann::ordered_json::array(), false), "new </s>");
  std::filesystem::remove_all(dir);
}

// As transformers' get_chat_template: with tools given, the checkpoint's
// "tool_use" template renders (Hermes-2-Pro, Command-R name one), else the
// default; from tokenizer_config.json's list or additional_chat_templates/.
TEST(ChatTemplate, ToolsPickTheToolUseTemplate) {
  const auto messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  const ChatTemplate listed(parse_chat_template_config(nlohmann::ordered_json::parse(R"({"chat_template": [
      {"name": "default", "template": "D {{ tools }}"}, {"name": "tool_use", "template": "T {{ tools|length }}"}]})"),
      "test"));
  EXPECT_EQ(listed.apply(messages, false), "D None");
  EXPECT_EQ(listed.apply(messages, false, {{"tools", nullptr}}), "D None");
  EXPECT_EQ(listed.apply(messages, false, {{"tools", tools}}), "T 1");
  const std::filesystem::path dir = std::filesystem::path(testing::TempDir()) / "augur_chat_template_additional";
  std::filesystem::create_directories(dir / "additional_chat_templates");
  std::ofstream(dir / "tokenizer_config.json") << R"({"eos_token": "</s>"})";
  std::ofstream(dir / "chat_template.jinja") << "D";
  std::ofstream(dir / "additional_chat_templates" / "tool_use.jinja") << "T {{ bos_token }}{{ eos_token }}";
  // special_tokens_map.json gives what tokenizer_config.json leaves out.
  std::ofstream(dir / "special_tokens_map.json")
      << R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "<other>"})";
  const ChatTemplate files(load_chat_template_config(dir.string()));
  EXPECT_EQ(files.apply(messages, false), "D");
  EXPECT_EQ(files.apply(messages, false, {{"tools", tools}}), "T <s></s>");
  std::filesystem::remove_all(dir);
  // A template without a tool_use one renders the tools itself.
  EXPECT_EQ(ChatTemplate("X {{ tools|length }}").apply(messages, false, {{"tools", tools}}), "X 1");
}

TEST(ChatTemplate, MissingConfigIsAnError) {
  EXPECT_THROW(load_chat_template_config("/nonexistent/augur/tokenizer_config.json"), Error);
}

TEST(ChatTemplate, SyntaxErrorNamesTheLine) {
  try {
    ChatTemplate("{% for m in messages %}\n{{ m.content | shout }}\n{% endfor %}");
    FAIL() << "expected a TemplateError";
  } catch (const TemplateError& e) {
    EXPECT_EQ(std::string(e.what()), "[chat_template] line 2: unknown filter 'shout'");
  }
}

}  // namespace
}  // namespace augur
