// The OpenAI schema layer: requests parsed into engine requests or errors
// naming the field; tool calls found in output, streamed and not.
#include <gtest/gtest.h>

#include "server/openai.h"

namespace augur::server {
namespace {

using json = nlohmann::ordered_json;

ApiContext context() {
  ApiContext c;
  c.model_name = "tiny";
  c.max_context = 1000;
  c.default_max_tokens = 64;
  c.has_chat_template = true;
  return c;
}

ApiError error_of(Endpoint e, const std::string& body) {
  try {
    parse_request(e, body, context(), 1);
  } catch (const ApiError& err) {
    return err;
  }
  ADD_FAILURE() << "no error for " << body;
  return {};
}

TEST(OpenAiParse, ChatRequest) {
  const ApiRequest r = parse_request(Endpoint::ChatCompletions, R"({
    "model": "tiny", "messages": [{"role": "system", "content": "be brief"},
                                  {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
    "max_completion_tokens": 9, "temperature": 0.5, "top_p": 0.9, "top_k": 5, "min_p": 0.1, "seed": 42,
    "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1, "stop": ["x", "yz"],
    "stream": true, "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 3, "n": 2,
    "chat_template_kwargs": {"enable_thinking": false},
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]})",
                                       context(), 7);
  EXPECT_EQ(r.prompts[0].kind, Prompt::Kind::Chat);
  EXPECT_EQ(r.prompts[0].messages[1]["content"], "ab");
  EXPECT_EQ(r.prompts[0].chat_extra["enable_thinking"], false);
  EXPECT_EQ(r.prompts[0].chat_extra["tools"][0]["function"]["name"], "f");
  EXPECT_TRUE(r.tools);
  EXPECT_EQ(r.params.max_tokens, 9);
  EXPECT_FLOAT_EQ(r.params.sampling.temperature, 0.5f);
  EXPECT_EQ(r.params.sampling.top_k, 5);
  EXPECT_EQ(r.params.sampling.seed, 42u);
  EXPECT_FLOAT_EQ(r.params.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(r.params.stop, (std::vector<std::string>{"x", "yz"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.chat_logprobs);
  EXPECT_EQ(r.params.logprobs, 3);
  EXPECT_EQ(r.n, 2);
}

TEST(OpenAiParse, ABatchOfPrompts) {
  const ApiRequest r = parse_request(Endpoint::Completions, R"({"prompt": ["a", [1, 2]], "n": 3})", context(), 7);
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[0].kind, Prompt::Kind::Text);
  EXPECT_EQ(r.prompts[1].ids, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(r.n, 3);
  for (const char* body : {R"({"prompt": [[1], 2]})", R"({"prompt": [["a"]]})", R"({"prompt": ["a", ""]})",
                           R"({"prompt": [[]]})"}) {
    try {
      parse_request(Endpoint::Completions, body, context(), 7);
      ADD_FAILURE() << "no error for " << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param, "prompt") << body;
    }
  }
}

TEST(OpenAiParse, Defaults) {
  const ApiRequest r = parse_request(Endpoint::Completions, R"({"prompt": [1, 2, 3]})", context(), 7);
  EXPECT_EQ(r.prompts[0].ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r.params.max_tokens, 64);
  EXPECT_TRUE(r.params.fit_max_tokens);  // not the client's: cut to the room at admission
  EXPECT_FLOAT_EQ(r.params.sampling.temperature, 1.0f);  // OpenAI's default
  EXPECT_EQ(r.params.sampling.seed, 7u);                 // the server's random seed
  EXPECT_EQ(r.params.logprobs, -1);
  EXPECT_FALSE(r.params.ignore_eos);
  EXPECT_FALSE(r.tools);
  EXPECT_TRUE(parse_request(Endpoint::Completions, R"({"prompt": [1], "ignore_eos": true})", context(), 7).params.ignore_eos);
  EXPECT_FALSE(parse_request(Endpoint::Completions, R"({"prompt": [1], "max_tokens": 64})", context(), 7).params.fit_max_tokens);
  // null is absent (OpenAI's "number or null").
  const ApiRequest nulls = parse_request(Endpoint::Completions, R"({"prompt": [1], "temperature": null,
    "top_p": null, "top_k": null, "min_p": null, "presence_penalty": null, "frequency_penalty": null,
    "repetition_penalty": null, "ignore_eos": null, "max_tokens": null})", context(), 7);
  EXPECT_FLOAT_EQ(nulls.params.sampling.temperature, 1.0f);
  EXPECT_FLOAT_EQ(nulls.params.sampling.top_p, 1.0f);
  EXPECT_EQ(nulls.params.sampling.top_k, 0);
  EXPECT_EQ(nulls.params.max_tokens, 64);
  EXPECT_TRUE(nulls.params.fit_max_tokens);
  // tool_choice none: the tools are not rendered.
  const ApiRequest n = parse_request(Endpoint::ChatCompletions, R"({"messages": [{"role": "user", "content": "x"}],
    "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none"})", context(), 1);
  EXPECT_FALSE(n.tools);
  EXPECT_FALSE(n.prompts[0].chat_extra.contains("tools"));
}

TEST(OpenAiParse, ErrorsNameTheField) {
  struct Case {
    Endpoint e;
    const char* body;
    int status;
    const char* param;
  };
  const Endpoint C = Endpoint::ChatCompletions, P = Endpoint::Completions;
  const Case cases[] = {
      {C, "{", 400, ""},
      {C, "[]", 400, ""},
      {C, R"({"messages": []})", 400, "messages"},
      {C, R"({})", 400, "messages"},
      {C, R"({"messages": [{"role": "wizard", "content": "x"}]})", 400, "messages[0].role"},
      {C, R"({"messages": [{"role": "user", "content": 5}]})", 400, "messages[0].content"},
      {C, R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", 400, "messages[0].content[0]"},
      {C, R"({"model": "other", "messages": [{"role": "user", "content": "x"}]})", 404, "model"},
      {C, R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1})", 400, "max_tokens"},
      {C, R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5000})", 400, "max_tokens"},
      {C, R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2.5})", 400, "max_tokens"},
      {C, R"({"messages": [{"role": "user", "content": "x"}], "temperature": "warm"})", 400, "temperature"},
      {C, R"({"messages": [{"role": "user", "content": "x"}], "temperature": 3})", 400, "temperature"},
      {C, R"({"messages": [{"role": "user", "content": "x"}], "n": 0})", 400, "n"},
      {P, R"({"prompt": "x", "ignore_eos": 1})", 400, "ignore_eos"},
      {C, R"({"messages": [{"role": "user", "content": "x"}], "stop": [1]})", 400, "stop"},
      {C, R"({"messages": [{"role": "user", "content": "x"}], "stop": ["a", "b", "c", "d", "e"]})", 400, "stop"},
      {C, R"({"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": true}})", 400,
       "stream_options"},
      {C, R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", 400, "top_logprobs"},
      {C, R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})", 400, "tool_choice"},
      {C, R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", 400, "tools[0]"},
      {C, R"({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"5": 2}})", 400, "logit_bias"},
      {P, R"({"prompt": ""})", 400, "prompt"},
      {P, R"({"prompt": [-1]})", 400, "prompt"},
      {P, R"({"prompt": "x", "messages": []})", 400, "messages"},
      {P, R"({"prompt": "x", "logprobs": 9})", 400, "logprobs"},
      {C, R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": 5, "function": {"name": "f"}}]})",
       400, "tools[0]"},
      {C, R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": null, "function": {"name": "f"}}]})",
       400, "tools[0]"},
      {C, R"({"messages": [{"role": "user", "content": "x"}], "top_p": 0})", 400, "top_p"},
  };
  for (const Case& c : cases) {
    const ApiError e = error_of(c.e, c.body);
    EXPECT_EQ(e.status, c.status) << c.body << ": " << e.message;
    EXPECT_EQ(e.param, c.param) << c.body << ": " << e.message;
    const json body = e.body();
    EXPECT_EQ(body["error"]["message"], e.message);
    EXPECT_EQ(body["error"]["type"], e.type);
  }
  // Nesting past 128 levels is refused before parsing: copies of such values
  // recurse, and a million levels overflowed the stack. Brackets inside
  // strings do not count.
  const std::string deep = R"({"messages": )" + std::string(200000, '[') + std::string(200000, ']') + "}";
  const ApiError d = error_of(C, deep);
  EXPECT_EQ(d.status, 400);
  EXPECT_NE(d.message.find("deeper than 128"), std::string::npos) << d.message;
  EXPECT_EQ(error_of(C, R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"a": )" +
                            std::string(129, '[') + std::string(129, ']') + "}}")
                .status,
            400);
  try {
    parse_request(C, R"({"messages": [{"role": "user", "content": ")" + std::string(500, '[') +
                         R"(\"{"}], "chat_template_kwargs": {"a": )" + std::string(120, '[') + std::string(120, ']') +
                         "}}",
                  context(), 1);
  } catch (const ApiError& e) {
    ADD_FAILURE() << e.message;
  }
  ApiContext no_template = context();
  no_template.has_chat_template = false;
  EXPECT_THROW(parse_request(Endpoint::ChatCompletions, R"({"messages": [{"role": "user", "content": "x"}]})",
                             no_template, 1),
               ApiError);
}

TEST(OpenAiToolCalls, ParsesQwenCalls) {
  const auto calls = parse_tool_calls(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>{\"name\": \"time\", \"arguments\": \"{}\"}</tool_call>");
  ASSERT_TRUE(calls.has_value());
  EXPECT_EQ(calls->content, "Let me check.");
  ASSERT_EQ(calls->calls.size(), 2u);
  EXPECT_EQ(calls->calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(calls->calls[0].arguments), json::parse(R"({"city": "Paris"})"));
  EXPECT_EQ(calls->calls[1].arguments, "{}");
  EXPECT_FALSE(parse_tool_calls("no calls here").has_value());
  EXPECT_FALSE(parse_tool_calls("<tool_call>not json</tool_call>").has_value());
  EXPECT_FALSE(parse_tool_calls("<tool_call>{\"arguments\": {}}</tool_call>").has_value());
  // Cut off by max_tokens after a whole object: still a call.
  EXPECT_TRUE(parse_tool_calls("<tool_call>{\"name\": \"f\"}").has_value());
  // Arguments nested past 128 levels (a model can be led to write them) are
  // text, not a call; within the limit they are a call.
  auto nested = [](int depth) {
    return "<tool_call>{\"name\": \"f\", \"arguments\": " + std::string(size_t(depth), '[') +
           std::string(size_t(depth), ']') + "}</tool_call>";
  };
  EXPECT_FALSE(parse_tool_calls(nested(100000)).has_value());
  EXPECT_TRUE(parse_tool_calls(nested(100)).has_value());
}

// Qwen3.5's form: parameters as text, typed by the tool's schema where it
// declares them other than strings; a call cut off before </function> is
// text.
TEST(OpenAiToolCalls, ParsesQwen35ParameterCalls) {
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "book", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "nights": {"type": "integer"}, "zip": {"type": ["string", "null"]},
      "opts": {"type": "object"}, "code": {"anyOf": [{"type": "string"}, {"type": "null"}]}}}}}])");
  const auto calls = parse_tool_calls(
      "I will book it.\n<tool_call>\n<function=book>\n<parameter=city>\nNew York\n</parameter>\n"
      "<parameter=nights>\n3\n</parameter>\n<parameter=zip>\n94105\n</parameter>\n"
      "<parameter=opts>\n{\"late\": true}\n</parameter>\n<parameter=code>\n123\n</parameter>\n"
      "<parameter=note>\nfirst line\nsecond\n</parameter>\n</function>\n</tool_call>",
      tools);
  ASSERT_TRUE(calls.has_value());
  EXPECT_EQ(calls->content, "I will book it.");
  ASSERT_EQ(calls->calls.size(), 1u);
  EXPECT_EQ(calls->calls[0].name, "book");
  EXPECT_EQ(json::parse(calls->calls[0].arguments),
            json::parse(R"({"city": "New York", "nights": 3, "zip": "94105", "opts": {"late": true},
                            "code": "123", "note": "first line\nsecond"})"));
  // No schema: every value is the text the model wrote.
  const auto bare = parse_tool_calls("<tool_call><function=f><parameter=n>42</parameter></function></tool_call>");
  ASSERT_TRUE(bare.has_value());
  EXPECT_EQ(bare->calls[0].arguments, R"({"n":"42"})");
  // A value whose </parameter> is missing ends at the next tag.
  const auto loose = parse_tool_calls(
      "<tool_call>\n<function=f>\n<parameter=a>\n1\n<parameter=b>\n2\n</function>\n</tool_call>");
  ASSERT_TRUE(loose.has_value());
  EXPECT_EQ(json::parse(loose->calls[0].arguments), json::parse(R"({"a": "1", "b": "2"})"));
  // Cut off before </function> (max_tokens): text, not a call.
  EXPECT_FALSE(parse_tool_calls("<tool_call>\n<function=f>\n<parameter=q>\nabc").has_value());
  EXPECT_FALSE(parse_tool_calls("<tool_call>\n<function=f>\n").has_value());
  // Closed by </tool_call> without </function>: the model ended the call.
  EXPECT_TRUE(parse_tool_calls("<tool_call><function=f><parameter=q>x</parameter></tool_call>").has_value());
  EXPECT_FALSE(parse_tool_calls("<tool_call>text <function=f></function></tool_call>").has_value());
  EXPECT_FALSE(parse_tool_calls("<tool_call><function=></function></tool_call>").has_value());
}

// A history's call arguments, JSON text as OpenAI sends them, reach the
// template as objects; absent ones stay absent, empty ones are {}.
TEST(OpenAiParse, HistoryToolCallArgumentsAreObjects) {
  const ApiRequest r = parse_request(Endpoint::ChatCompletions, R"({"messages": [{"role": "user", "content": "x"},
      {"role": "assistant", "content": null, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{\"k\": 1}"}},
        {"id": "b", "type": "function", "function": {"name": "g", "arguments": ""}},
        {"id": "c", "type": "function", "function": {"name": "h"}},
        {"id": "d", "type": "function", "function": {"name": "i", "arguments": "not json"}}]},
      {"role": "tool", "tool_call_id": "a", "content": "1"}]})", context(), 7);
  const json& calls = r.prompts[0].messages[1]["tool_calls"];
  EXPECT_EQ(calls[0]["function"]["arguments"], json::parse(R"({"k": 1})"));
  EXPECT_EQ(calls[1]["function"]["arguments"], json::object());
  EXPECT_FALSE(calls[2]["function"].contains("arguments"));
  EXPECT_EQ(calls[3]["function"]["arguments"], "not json");
}

TEST(OpenAiToolCalls, StreamHoldsBackWhatMayBeACall) {
  ToolCallFilter f;
  std::string sent;
  for (const char* d : {"Hello ", "<too", "l wait", " <", "tool_", "call>{\"name\": ", "\"f\"}</tool_call>"})
    sent += f.feed(d);
  EXPECT_EQ(sent, "Hello <tool wait ");
  EXPECT_EQ(f.held(), "<tool_call>{\"name\": \"f\"}</tool_call>");
  const auto calls = parse_tool_calls(f.held());
  ASSERT_TRUE(calls.has_value());
  EXPECT_EQ(calls->calls[0].name, "f");
  ToolCallFilter plain;
  EXPECT_EQ(plain.feed("a <b> c"), "a <b> c");
  EXPECT_EQ(plain.feed(" <"), " ");
  EXPECT_EQ(plain.held(), "<");
}

TEST(OpenAiResponse, ChoicesUsageAndToolCalls) {
  ApiRequest r = parse_request(Endpoint::ChatCompletions, R"({"messages": [{"role": "user", "content": "x"}],
    "tools": [{"type": "function", "function": {"name": "f"}}], "n": 2})", context(), 1);
  ResponseMeta m{"chatcmpl-1", 100, "tiny"};
  std::vector<ChoiceOutput> out(2);
  out[0].text = "plain answer";
  out[0].finish = FinishReason::Stop;
  out[1].text = "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>";
  out[1].finish = FinishReason::Stop;
  Usage u{10, 7, 4};
  const TokenText tt{[](int32_t) { return std::string("\xEF\xBF\xBD"); }, [](int32_t) { return std::string("\xE4"); }};
  const json body = response_body(r, m, out, u, tt);
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "plain answer");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(body["choices"][1]["message"]["content"].is_null());
  EXPECT_EQ(body["choices"][1]["message"]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(body["choices"][1]["message"]["tool_calls"][0]["type"], "function");
  EXPECT_EQ(body["choices"][1]["finish_reason"], "tool_calls");
  EXPECT_EQ(body["usage"]["total_tokens"], 17);
  EXPECT_EQ(body["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
  const json chunk = delta_chunk(r, m, 1, "hi", {}, true, tt);
  EXPECT_EQ(chunk["object"], "chat.completion.chunk");
  EXPECT_EQ(chunk["choices"][0]["index"], 1);
  EXPECT_EQ(chunk["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(chunk["choices"][0]["delta"]["content"], "hi");
  EXPECT_EQ(finish_chunk(r, m, 0, "length")["choices"][0]["finish_reason"], "length");
}

// A logprob's token is its text and `bytes` its raw bytes: part of a
// character where the token holds one, not the U+FFFD of its text.
TEST(OpenAiResponse, LogprobBytesAreTheTokensOwn) {
  ApiRequest r = parse_request(Endpoint::ChatCompletions, R"({"messages": [{"role": "user", "content": "x"}],
    "logprobs": true, "top_logprobs": 1})", context(), 1);
  ResponseMeta m{"chatcmpl-1", 100, "tiny"};
  const TokenText tt{[](int32_t) { return std::string("\xEF\xBF\xBD"); }, [](int32_t) { return std::string("\xE4"); }};
  const std::vector<TokenLogprob> lps = {{7, -0.5f, {{7, -0.5f}}}};
  const json chunk = delta_chunk(r, m, 0, "", lps, false, tt);
  const json& e = chunk["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(e["token"], "\xEF\xBF\xBD");
  EXPECT_EQ(e["bytes"], json::array({0xE4}));
  EXPECT_EQ(e["top_logprobs"][0]["bytes"], json::array({0xE4}));
}

}  // namespace
}  // namespace augur::server
