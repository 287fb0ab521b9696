#include "server/openai.h"

#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <random>
#include <set>
#include <string_view>

namespace augur::server {

using json = nlohmann::ordered_json;

json ApiError::body() const {
  json e;
  e["message"] = message;
  e["type"] = type;
  e["param"] = param.empty() ? json(nullptr) : json(param);
  e["code"] = code.empty() ? json(nullptr) : json(code);
  return json{{"error", e}};
}

namespace {

std::string trim(std::string_view s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace((unsigned char)s[a])) ++a;
  while (b > a && std::isspace((unsigned char)s[b - 1])) --b;
  return std::string(s.substr(a, b - a));
}

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError{400, message, "invalid_request_error", param, ""};
}

// nlohmann's parser and destructor walk nested values without recursion, but
// its copies recurse: a 2 MB body of a million nested arrays overflowed the
// stack when the messages were copied. So JSON nesting deeper than this is
// refused before it is parsed (request bodies) or not taken (tool calls).
constexpr int kMaxJsonDepth = 128;
// Choices a request may ask for (prompts x n), each an engine request.
constexpr size_t kMaxChoices = 64;

bool nesting_within(std::string_view text, int limit) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char ch : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (ch == '\\')
        escaped = true;
      else if (ch == '"')
        in_string = false;
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      if (++depth > limit) return false;
    } else if (ch == ']' || ch == '}') {
      --depth;
    }
  }
  return true;
}

// An optional field: absent or null (OpenAI's "number or null").
bool given(const json& body, const char* key) { return body.contains(key) && !body[key].is_null(); }

double number(const json& body, const char* key, double lo, double hi) {
  const json& v = body[key];
  if (!v.is_number()) bad(key, std::string(key) + " must be a number");
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    bad(key, std::string(key) + " must be between " + std::to_string(lo) + " and " + std::to_string(hi));
  return d;
}

int64_t integer(const json& body, const char* key, int64_t lo, int64_t hi) {
  const json& v = body[key];
  if (!v.is_number_integer()) bad(key, std::string(key) + " must be an integer");
  const int64_t i = v.get<int64_t>();
  if (i < lo || i > hi)
    bad(key, std::string(key) + " must be between " + std::to_string(lo) + " and " + std::to_string(hi));
  return i;
}

bool boolean(const json& body, const char* key) {
  const json& v = body[key];
  if (!v.is_boolean()) bad(key, std::string(key) + " must be a boolean");
  return v.get<bool>();
}

json chat_logprobs(const std::vector<TokenLogprob>& lps, const TokenText& token_text) {
  auto entry = [&](int32_t id, float lp) {
    json bytes = json::array();
    for (unsigned char c : token_text.bytes(id)) bytes.push_back(int(c));
    return json{{"token", token_text.text(id)}, {"logprob", lp}, {"bytes", bytes}};
  };
  json content = json::array();
  for (const auto& lp : lps) {
    json e = entry(lp.id, lp.logprob);
    json top = json::array();
    for (const auto& [id, v] : lp.top) top.push_back(entry(id, v));
    e["top_logprobs"] = top;
    content.push_back(e);
  }
  return json{{"content", content}};
}

json completion_logprobs(const std::vector<TokenLogprob>& lps, const TokenText& token_text) {
  json tokens = json::array(), values = json::array(), tops = json::array();
  for (const auto& lp : lps) {
    tokens.push_back(token_text.text(lp.id));
    values.push_back(lp.logprob);
    json top = json::object();
    for (const auto& [id, v] : lp.top) top[token_text.text(id)] = v;
    tops.push_back(top);
  }
  return json{{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}};
}

json logprobs_of(const ApiRequest& r, const std::vector<TokenLogprob>& lps, const TokenText& token_text) {
  if (r.params.logprobs < 0) return nullptr;
  return r.endpoint == Endpoint::ChatCompletions ? chat_logprobs(lps, token_text) : completion_logprobs(lps, token_text);
}

json header(const ApiRequest& r, const ResponseMeta& m, bool chunk) {
  const bool chat = r.endpoint == Endpoint::ChatCompletions;
  return json{{"id", m.id},
              {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
              {"created", m.created},
              {"model", m.model}};
}

// A message's content: a string, null, or an array of text parts (joined).
json content_text(const json& c, const std::string& at) {
  if (c.is_string() || c.is_null()) return c;
  if (!c.is_array()) bad(at, at + " must be a string or an array of text parts");
  std::string text;
  for (size_t i = 0; i < c.size(); ++i) {
    const json& part = c[i];
    const std::string pat = at + "[" + std::to_string(i) + "]";
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
        !part["text"].is_string())
      bad(pat, pat + " must be {\"type\": \"text\", \"text\": ...} (only text parts are supported)");
    text += part["text"].get<std::string>();
  }
  return text;
}

json tool_call_json(const ToolCall& c, int index) {
  // Unique across restarts and replicas, so that a conversation spanning
  // them never holds two calls of one id.
  static const uint64_t salt = (uint64_t(std::random_device{}()) << 32) | std::random_device{}();
  static std::atomic<uint64_t> next{1};
  char id[40];
  std::snprintf(id, sizeof id, "call_%016llx%08llx", (unsigned long long)salt,
                (unsigned long long)(next++ & 0xffffffffull));
  return json{{"index", index},
              {"id", id},
              {"type", "function"},
              {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}

// OpenAI parameters this server does not implement. Clients and frameworks
// send some of them on every request at values that change nothing; those
// are taken (neutral), any other value is refused by name.
const std::set<std::string> chat_unimplemented = {
    "response_format", "logit_bias", "metadata",      "store",    "service_tier", "reasoning_effort",
    "prediction",      "audio",      "modalities",    "functions", "function_call", "web_search_options",
    "verbosity",       "prompt_cache_key", "safety_identifier"};
const std::set<std::string> completion_unimplemented = {"logit_bias", "echo", "best_of", "suffix", "metadata", "store"};

bool neutral(const std::string& key, const json& v) {
  if (v.is_null()) return true;
  if (key == "response_format") return v.is_object() && v.size() == 1 && v.value("type", "") == "text";
  if (key == "logit_bias") return v.is_object() && v.empty();
  if (key == "store" || key == "echo") return v.is_boolean() && !v.get<bool>();
  if (key == "best_of") return v.is_number_integer() && v.get<int64_t>() == 1;
  if (key == "service_tier") return v.is_string() && (v == "auto" || v == "default");
  if (key == "modalities") return v == json::array({"text"});
  // Labels that never reach the model.
  return key == "metadata" || key == "prompt_cache_key" || key == "safety_identifier";
}

}  // namespace

const char* finish_name(FinishReason r) { return r == FinishReason::Length ? "length" : "stop"; }

ApiRequest parse_request(Endpoint endpoint, const std::string& text, const ApiContext& ctx, uint64_t random_seed) {
  json body;
  if (!nesting_within(text, kMaxJsonDepth))
    bad("", "the body nests arrays and objects deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  try {
    body = json::parse(text);
  } catch (const json::exception& e) {
    bad("", std::string("the body is not valid JSON: ") + e.what());
  }
  if (!body.is_object()) bad("", "the body must be a JSON object");
  const bool chat = endpoint == Endpoint::ChatCompletions;
  static const std::set<std::string> common = {
      "model",      "max_tokens",        "temperature",       "top_p",  "top_k", "min_p",          "seed",
      "stop",       "presence_penalty",  "frequency_penalty", "stream", "n",     "stream_options", "logprobs",
      "user",       "repetition_penalty", "ignore_eos"};
  static const std::set<std::string> chat_only = {"messages", "max_completion_tokens", "top_logprobs", "tools",
                                                  "tool_choice", "chat_template_kwargs", "parallel_tool_calls"};
  static const std::set<std::string> completion_only = {"prompt"};
  for (const auto& [key, value] : body.items()) {
    if (common.count(key) || (chat ? chat_only : completion_only).count(key)) continue;
    if (!(chat ? chat_unimplemented : completion_unimplemented).count(key))
      bad(key, "unsupported parameter: " + key);
    if (!neutral(key, value))
      bad(key, "unsupported parameter: " + key + " (this server takes it only where it changes nothing: null" +
                   (key == "response_format" ? ", {\"type\": \"text\"}" : key == "logit_bias" ? ", {}" : "") + ")");
  }
  ApiRequest r;
  r.endpoint = endpoint;
  if (body.contains("model")) {
    if (!body["model"].is_string()) bad("model", "model must be a string");
    r.model = body["model"].get<std::string>();
    if (r.model != ctx.model_name)
      throw ApiError{404, "the model '" + r.model + "' does not exist; this server serves '" + ctx.model_name + "'",
                     "invalid_request_error", "model", "model_not_found"};
  } else {
    r.model = ctx.model_name;
  }
  if (chat) {
    if (!body.contains("messages")) bad("messages", "messages is required");
    if (!body["messages"].is_array() || body["messages"].empty()) bad("messages", "messages must be a non-empty array");
    json msgs = body["messages"];
    for (size_t i = 0; i < msgs.size(); ++i) {
      json& m = msgs[i];
      const std::string at = "messages[" + std::to_string(i) + "]";
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        bad(at, at + " must be an object with a string role");
      const std::string role = m["role"].get<std::string>();
      if (role != "system" && role != "user" && role != "assistant" && role != "developer" && role != "tool")
        bad(at + ".role", at + ".role '" + role + "' is not one of system, developer, user, assistant, tool");
      // OpenAI's developer messages are the system instructions of newer
      // models; chat templates know only system (Qwen's raise on others).
      if (role == "developer") m["role"] = "system";
      if (m.contains("content")) m["content"] = content_text(m["content"], at + ".content");
      if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
        if (!m["tool_calls"].is_array()) bad(at + ".tool_calls", at + ".tool_calls must be an array");
        // A call's arguments come back as the JSON text OpenAI sent; templates
        // read them as a mapping (Qwen3.5: arguments|items) or encode them
        // (tojson), so the text is parsed back where it holds an object.
        for (json& call : m["tool_calls"]) {
          if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) continue;
          json& fn = call["function"];
          auto args = fn.find("arguments");
          if (args == fn.end() || !args->is_string()) continue;
          const std::string text = args->get<std::string>();
          if (trim(text).empty()) {  // a call without arguments
            *args = json::object();
            continue;
          }
          if (!nesting_within(text, kMaxJsonDepth)) continue;
          json parsed = json::parse(text, nullptr, /*allow_exceptions=*/false);
          if (parsed.is_object()) *args = std::move(parsed);
        }
      }
    }
    if (!ctx.has_chat_template) bad("messages", "the served model has no chat template; use /v1/completions");
    json extra = json::object();
    if (body.contains("chat_template_kwargs") && !body["chat_template_kwargs"].is_null()) {
      if (!body["chat_template_kwargs"].is_object())
        bad("chat_template_kwargs", "chat_template_kwargs must be an object");
      for (const auto& [key, value] : body["chat_template_kwargs"].items()) {
        if (key == "messages" || key == "add_generation_prompt")
          bad("chat_template_kwargs." + key, "chat_template_kwargs may not set " + key);
        extra[key] = value;
      }
    }
    std::string tool_choice = "auto";
    if (body.contains("tool_choice") && !body["tool_choice"].is_null()) {
      const json& tc = body["tool_choice"];
      if (!tc.is_string() || (tc != "auto" && tc != "none"))
        bad("tool_choice", "tool_choice must be \"auto\" or \"none\" (forcing a tool is not supported)");
      tool_choice = tc.get<std::string>();
    }
    if (body.contains("parallel_tool_calls") && !body["parallel_tool_calls"].is_null())
      (void)boolean(body, "parallel_tool_calls");
    if (body.contains("tools") && !body["tools"].is_null()) {
      const json& tools = body["tools"];
      if (!tools.is_array()) bad("tools", "tools must be an array");
      for (size_t i = 0; i < tools.size(); ++i) {
        const json& t = tools[i];
        const std::string at = "tools[" + std::to_string(i) + "]";
        if (!t.is_object() || !t.contains("type") || t["type"] != "function" || !t.contains("function") ||
            !t["function"].is_object() || !t["function"].contains("name") || !t["function"]["name"].is_string())
          bad(at, at + " must be {\"type\": \"function\", \"function\": {\"name\": ..., ...}}");
      }
      if (!tools.empty() && tool_choice != "none") {
        extra["tools"] = tools;
        r.tools = true;
      }
    }
    r.prompts.push_back(Prompt::of_chat(msgs, true, extra));
  } else {
    if (!body.contains("prompt")) bad("prompt", "prompt is required");
    // One prompt (text or token ids), or a batch of them (an array of texts,
    // or of id arrays): each gets n choices.
    const json& p = body["prompt"];
    auto one = [](const json& q) {
      if (q.is_string()) {
        if (q.get<std::string>().empty()) bad("prompt", "prompt must not be empty");
        return Prompt::of_text(q.get<std::string>());
      }
      if (!q.is_array() || q.empty() || !q[0].is_number_integer())
        bad("prompt", "prompt must be a non-empty string, an array of token ids, or an array of either");
      std::vector<int32_t> ids;
      for (const json& t : q) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
          bad("prompt", "prompt token ids must be non-negative integers");
        ids.push_back(int32_t(t.get<int64_t>()));
      }
      return Prompt::of_ids(std::move(ids));
    };
    if (p.is_array() && !p.empty() && (p[0].is_string() || p[0].is_array())) {
      if (p.size() > kMaxChoices) bad("prompt", "a batch holds at most " + std::to_string(kMaxChoices) + " prompts");
      for (const json& q : p) {
        if (!q.is_string() && !q.is_array()) bad("prompt", "a batch of prompts holds texts or arrays of token ids");
        r.prompts.push_back(one(q));
      }
    } else {
      r.prompts.push_back(one(p));
    }
  }
  RequestParams& q = r.params;
  // Not asked for: the default, cut at admission to what the context leaves
  // beside the prompt (a long prompt is not refused for a limit the client
  // never set).
  q.max_tokens = ctx.default_max_tokens;
  q.fit_max_tokens = true;
  const int64_t limit = ctx.max_context > 0 ? ctx.max_context : (int64_t(1) << 30);
  for (const char* key : {"max_tokens", "max_completion_tokens"})
    if (given(body, key)) q.max_tokens = integer(body, key, 1, limit), q.fit_max_tokens = false;
  SamplingParams& s = q.sampling;
  s.temperature = 1.0f;  // OpenAI's default
  if (given(body, "temperature")) s.temperature = float(number(body, "temperature", 0, 2));
  if (given(body, "top_p")) {
    s.top_p = float(number(body, "top_p", 0, 1));
    if (!(s.top_p > 0.f)) bad("top_p", "top_p must be greater than 0 (and at most 1)");
  }
  if (given(body, "top_k")) s.top_k = int32_t(integer(body, "top_k", 0, 1 << 20));
  if (given(body, "min_p")) s.min_p = float(number(body, "min_p", 0, 1));
  if (given(body, "presence_penalty")) s.presence_penalty = float(number(body, "presence_penalty", -2, 2));
  if (given(body, "frequency_penalty")) s.frequency_penalty = float(number(body, "frequency_penalty", -2, 2));
  if (given(body, "repetition_penalty")) s.repetition_penalty = float(number(body, "repetition_penalty", 0.01, 10));
  // ignore_eos (as vLLM and llama.cpp's servers take it): generate max_tokens
  // whatever the model says; benchmarks ask for it.
  if (given(body, "ignore_eos")) q.ignore_eos = boolean(body, "ignore_eos");
  s.seed = random_seed;
  if (body.contains("seed") && !body["seed"].is_null()) s.seed = uint64_t(integer(body, "seed", INT64_MIN, INT64_MAX));
  if (body.contains("n") && !body["n"].is_null()) r.n = int(integer(body, "n", 1, 16));
  if (r.prompts.size() * size_t(r.n) > kMaxChoices)
    bad("n", std::to_string(r.prompts.size()) + " prompts of " + std::to_string(r.n) + " choices each exceed " +
                 std::to_string(kMaxChoices) + " choices");
  if (body.contains("stop") && !body["stop"].is_null()) {
    const json& st = body["stop"];
    if (st.is_string()) {
      q.stop.push_back(st.get<std::string>());
    } else if (st.is_array() && st.size() <= 4) {
      for (const json& x : st) {
        if (!x.is_string()) bad("stop", "stop must be a string or an array of up to 4 strings");
        q.stop.push_back(x.get<std::string>());
      }
    } else {
      bad("stop", "stop must be a string or an array of up to 4 strings");
    }
    for (const auto& x : q.stop)
      if (x.empty()) bad("stop", "stop strings must not be empty");
  }
  if (body.contains("stream") && !body["stream"].is_null()) r.stream = boolean(body, "stream");
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const json& so = body["stream_options"];
    if (!so.is_object()) bad("stream_options", "stream_options must be an object");
    for (const auto& [key, value] : so.items())
      if (key != "include_usage") bad("stream_options." + key, "unsupported parameter: stream_options." + key);
    if (given(so, "include_usage")) r.include_usage = boolean(so, "include_usage");
    if (!r.stream) bad("stream_options", "stream_options is only allowed with stream: true");
  }
  if (chat) {
    if (body.contains("logprobs") && !body["logprobs"].is_null()) r.chat_logprobs = boolean(body, "logprobs");
    if (r.chat_logprobs) q.logprobs = 0;
    if (body.contains("top_logprobs") && !body["top_logprobs"].is_null()) {
      if (!r.chat_logprobs) bad("top_logprobs", "top_logprobs needs logprobs: true");
      q.logprobs = int32_t(integer(body, "top_logprobs", 0, 20));
    }
  } else if (body.contains("logprobs") && !body["logprobs"].is_null()) {
    q.logprobs = int32_t(integer(body, "logprobs", 0, 5));
  }
  return r;
}

json usage_json(const Usage& u) {
  return json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

namespace {
constexpr std::string_view kCallOpen = "<tool_call>", kCallClose = "</tool_call>";

}  // namespace

namespace {

// Whether a tool declares a parameter with a JSON type other than string
// (a "type" that is, or lists, only non-string types; anyOf / oneOf whose
// members all are). Undeclared parameters are strings, as the model wrote
// them.
bool typed_not_string(const json& schema) {
  if (!schema.is_object()) return false;
  if (schema.contains("type")) {
    const json& t = schema["type"];
    if (t.is_string()) return t != "string";
    if (t.is_array()) {
      for (const json& m : t)
        if (!m.is_string() || m == "string") return false;
      return !t.empty();
    }
    return false;
  }
  for (const char* key : {"anyOf", "oneOf"})
    if (schema.contains(key) && schema[key].is_array() && !schema[key].empty()) {
      for (const json& m : schema[key])
        if (!typed_not_string(m)) return false;
      return true;
    }
  return false;
}

bool param_is_typed(const json& tools, const std::string& fn, const std::string& param) {
  if (!tools.is_array()) return false;
  for (const json& t : tools) {
    const json* f = t.is_object() && t.contains("function") ? &t["function"] : nullptr;
    if (!f || !f->is_object() || f->value("name", "") != fn) continue;
    const json& params = f->contains("parameters") ? (*f)["parameters"] : json();
    if (params.is_object() && params.contains("properties") && params["properties"].is_object() &&
        params["properties"].contains(param))
      return typed_not_string(params["properties"][param]);
  }
  return false;
}

// Qwen3.5's (and Qwen3-Coder's) form of a call's body:
//   <function=NAME>
//   <parameter=ARG>
//   VALUE
//   </parameter>
//   </function>
// A value is text, ending at its </parameter> (or, where the model left that
// out, at the next <parameter= or </function>); where the tool declares the
// parameter with a non-string type, a value that parses as JSON is that JSON.
// A call is taken once </function> (or the closing </tool_call>: `closed`)
// ends it: one cut off by max_tokens is the reply's text, finish "length".
std::optional<ToolCall> parse_xml_call(std::string_view body, bool closed, const json& tools) {
  constexpr std::string_view kFn = "<function=", kFnEnd = "</function>", kParam = "<parameter=",
                             kParamEnd = "</parameter>";
  const size_t fn = body.find(kFn);
  if (fn == std::string_view::npos || !trim(body.substr(0, fn)).empty()) return std::nullopt;
  const size_t name_end = body.find('>', fn);
  if (name_end == std::string_view::npos) return std::nullopt;
  size_t fn_end = body.find(kFnEnd, name_end);
  if (fn_end == std::string_view::npos) {
    if (!closed) return std::nullopt;
    fn_end = body.size();
  }
  ToolCall c;
  c.name = trim(body.substr(fn + kFn.size(), name_end - fn - kFn.size()));
  if (c.name.empty()) return std::nullopt;
  json args = json::object();
  size_t at = name_end + 1;
  for (;;) {
    const size_t p = body.find(kParam, at);
    if (p == std::string_view::npos || p >= fn_end) break;
    const size_t pname_end = body.find('>', p);
    if (pname_end == std::string_view::npos || pname_end >= fn_end) break;
    const std::string pname = trim(body.substr(p + kParam.size(), pname_end - p - kParam.size()));
    const size_t end = std::min({body.find(kParamEnd, pname_end), body.find(kParam, pname_end), fn_end});
    std::string_view value = body.substr(pname_end + 1, end - pname_end - 1);
    if (!value.empty() && value.front() == '\n') value.remove_prefix(1);
    if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
    json v = value;
    if (param_is_typed(tools, c.name, pname) && nesting_within(value, kMaxJsonDepth)) {
      json parsed = json::parse(value, nullptr, /*allow_exceptions=*/false);
      if (!parsed.is_discarded()) v = std::move(parsed);
    }
    args[pname] = std::move(v);
    at = body.substr(end, kParamEnd.size()) == kParamEnd ? end + kParamEnd.size() : end;
  }
  c.arguments = args.dump();
  return c;
}

}  // namespace

std::optional<ToolCalls> parse_tool_calls(const std::string& text, const json& tools) {
  ToolCalls out;
  size_t at = 0;
  std::string content;
  while (true) {
    const size_t open = text.find(kCallOpen, at);
    if (open == std::string::npos) break;
    const size_t body = open + kCallOpen.size();
    size_t close = text.find(kCallClose, body);
    const bool closed = close != std::string::npos;
    if (!closed) close = text.size();  // a call cut off by max_tokens or a stop token
    const std::string_view call_text = std::string_view(text).substr(body, close - body);
    if (auto xml = parse_xml_call(call_text, closed, tools)) {
      out.calls.push_back(std::move(*xml));
    } else {
      if (!nesting_within(call_text, kMaxJsonDepth)) return std::nullopt;
      json call = json::parse(call_text, nullptr, /*allow_exceptions=*/false);
      if (call.is_discarded() || !call.is_object() || !call.contains("name") || !call["name"].is_string())
        return std::nullopt;
      ToolCall c;
      c.name = call["name"].get<std::string>();
      const json args = call.contains("arguments") ? call["arguments"] : json::object();
      c.arguments = args.is_string() ? args.get<std::string>() : args.dump();
      out.calls.push_back(std::move(c));
    }
    content += text.substr(at, open - at);
    at = closed ? close + kCallClose.size() : text.size();
  }
  if (out.calls.empty()) return std::nullopt;
  content += text.substr(at);
  out.content = trim(content);
  return out;
}

std::string ToolCallFilter::feed(const std::string& delta) {
  if (in_call_) {
    held_ += delta;
    return {};
  }
  held_ += delta;
  const size_t open = held_.find(kCallOpen);
  if (open != std::string::npos) {
    in_call_ = true;
    std::string send = held_.substr(0, open);
    held_.erase(0, open);
    return send;
  }
  // Hold the longest tail that could begin "<tool_call>".
  size_t keep = 0;
  for (size_t n = std::min(held_.size(), kCallOpen.size() - 1); n > 0; --n)
    if (std::string_view(held_).substr(held_.size() - n) == kCallOpen.substr(0, n)) {
      keep = n;
      break;
    }
  std::string send = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return send;
}

json response_body(const ApiRequest& r, const ResponseMeta& m, const std::vector<ChoiceOutput>& choices,
                   const Usage& usage, const TokenText& token_text) {
  json out = header(r, m, false);
  json list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceOutput& c = choices[i];
    json choice;
    choice["index"] = int(i);
    std::string finish = finish_name(c.finish);
    if (r.endpoint == Endpoint::ChatCompletions) {
      json message = {{"role", "assistant"}, {"content", c.text}};
      if (r.tools)
        if (const auto calls = parse_tool_calls(c.text, r.prompts[0].chat_extra.value("tools", json()))) {
          message["content"] = calls->content.empty() ? json(nullptr) : json(calls->content);
          json tc = json::array();
          for (size_t k = 0; k < calls->calls.size(); ++k) {
            json one = tool_call_json(calls->calls[k], int(k));
            one.erase("index");
            tc.push_back(one);
          }
          message["tool_calls"] = tc;
          finish = "tool_calls";
        }
      choice["message"] = message;
    } else {
      choice["text"] = c.text;
    }
    choice["logprobs"] = logprobs_of(r, c.logprobs, token_text);
    choice["finish_reason"] = finish;
    list.push_back(choice);
  }
  out["choices"] = list;
  out["usage"] = usage_json(usage);
  return out;
}

json delta_chunk(const ApiRequest& r, const ResponseMeta& m, int index, const std::string& text,
                 const std::vector<TokenLogprob>& logprobs, bool first, const TokenText& token_text) {
  json out = header(r, m, true);
  json choice;
  choice["index"] = index;
  if (r.endpoint == Endpoint::ChatCompletions) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = logprobs_of(r, logprobs, token_text);
  choice["finish_reason"] = nullptr;
  out["choices"] = json::array({choice});
  if (r.include_usage) out["usage"] = nullptr;
  return out;
}

json tool_calls_chunk(const ApiRequest& r, const ResponseMeta& m, int index, const std::vector<ToolCall>& calls,
                      bool first) {
  json out = header(r, m, true);
  json delta = json::object();
  if (first) delta["role"] = "assistant";
  json tc = json::array();
  for (size_t k = 0; k < calls.size(); ++k) tc.push_back(tool_call_json(calls[k], int(k)));
  delta["tool_calls"] = tc;
  out["choices"] = json::array({json{{"index", index}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", nullptr}}});
  if (r.include_usage) out["usage"] = nullptr;
  return out;
}

json finish_chunk(const ApiRequest& r, const ResponseMeta& m, int index, const char* finish) {
  json out = header(r, m, true);
  json choice;
  choice["index"] = index;
  if (r.endpoint == Endpoint::ChatCompletions)
    choice["delta"] = json::object();
  else
    choice["text"] = "";
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = finish;
  out["choices"] = json::array({choice});
  if (r.include_usage) out["usage"] = nullptr;
  return out;
}

json usage_chunk(const ResponseMeta& m, const ApiRequest& r, const Usage& usage) {
  json out = header(r, m, true);
  out["choices"] = json::array();
  out["usage"] = usage_json(usage);
  return out;
}

}  // namespace augur::server
