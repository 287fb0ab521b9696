// The OpenAI API's schema, apart from HTTP: a request body becomes an engine
// request (or an ApiError naming what is wrong), and engine events become
// response bodies and server-sent-event chunks.
//
// Endpoints: POST /v1/completions (prompt: a string or token ids) and POST
// /v1/chat/completions (messages, rendered by the checkpoint's chat
// template). Parameters: max_tokens / max_completion_tokens, temperature,
// top_p, top_k, min_p, seed, presence_penalty, frequency_penalty,
// repetition_penalty, stop (a string or up to 4), stream,
// stream_options.include_usage, logprobs (completions: an int; chat: a bool
// with top_logprobs), n, model; chat: tools, tool_choice (auto, none),
// chat_template_kwargs (e.g. enable_thinking). Unknown parameters are errors
// naming them.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace augur::server {

// An OpenAI-style error: the HTTP status and the body's error object.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field, "" if none
  std::string code;   // OpenAI's machine-readable code ("" is null): context_length_exceeded, model_not_found
  nlohmann::ordered_json body() const;
};

enum class Endpoint { Completions, ChatCompletions };

// A parsed request: what the engine runs and how the answer is shaped.
struct ApiRequest {
  Endpoint endpoint = Endpoint::Completions;
  std::vector<Prompt> prompts;  // chat: one; completions: a batch may hold several
  RequestParams params;  // choice p * n + i (of prompt p) samples with seed params.sampling.seed + i
  std::string model;     // as the client named it
  int n = 1;             // choices, each its own engine request
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool chat_logprobs = false;  // chat: logprobs = true (top_logprobs in params.logprobs)
  bool tools = false;          // chat: tools given, so tool calls in the output become tool_calls
};

// What the server knows when it parses: the served model's name and limits.
struct ApiContext {
  std::string model_name;
  int64_t max_context = 0;      // prompt + max_tokens must fit
  int64_t default_max_tokens = 256;
  bool has_chat_template = false;
};

// Parses a request body for `endpoint`; throws ApiError. Without a seed,
// `random_seed` is the first choice's.
ApiRequest parse_request(Endpoint endpoint, const std::string& body, const ApiContext& ctx, uint64_t random_seed);

// Tool calls in a model's output, as Qwen's templates ask for them:
// <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Qwen2.5, Qwen3),
// or <tool_call><function=NAME><parameter=ARG>VALUE</parameter>...
// </function></tool_call> (Qwen3.5, Qwen3-Coder; `tools`, the request's, type
// the values). content is the text outside the calls (trimmed). None when
// there is no call, or one whose body is neither form (the output is then
// plain content).
struct ToolCall {
  std::string name;
  std::string arguments;  // JSON text, as OpenAI's API carries it
};
struct ToolCalls {
  std::string content;
  std::vector<ToolCall> calls;
};
std::optional<ToolCalls> parse_tool_calls(const std::string& text,
                                         const nlohmann::ordered_json& tools = nlohmann::ordered_json());

// A streamed chat with tools: text deltas pass through until a tool call may
// have started ("<tool_call>", or a prefix of it at the end of the text so
// far), then everything is held for parse_tool_calls at the end.
class ToolCallFilter {
 public:
  // The part of `delta` to send as content now.
  std::string feed(const std::string& delta);
  // Whatever was held back (at the end of the output).
  const std::string& held() const { return held_; }

 private:
  std::string held_;
  bool in_call_ = false;
};

// One choice's output, as the server gathers it.
struct ChoiceOutput {
  std::string text;
  std::vector<TokenLogprob> logprobs;  // one per output id (when asked for)
  FinishReason finish = FinishReason::Length;
  int64_t completion_tokens = 0;
  int64_t prompt_tokens = 0, cached_tokens = 0;  // its prompt's, for usage
};

// The response of a finished request, and the pieces of a streamed one. id:
// "cmpl-..." / "chatcmpl-..."; created: seconds since the epoch.
struct ResponseMeta {
  std::string id;
  int64_t created = 0;
  std::string model;
};
// A token's text (decoded alone: U+FFFD where it holds part of a character)
// and its bytes (Tokenizer::token_bytes), for logprobs.
struct TokenText {
  std::function<std::string(int32_t)> text, bytes;
};
// usage: prompt tokens (once), completion tokens over every choice, cached tokens.
nlohmann::ordered_json response_body(const ApiRequest& r, const ResponseMeta& m,
                                     const std::vector<ChoiceOutput>& choices, const Usage& usage,
                                     const TokenText& token_text);
// One streamed chunk of choice `index` with a text delta (and its logprobs);
// first: the chat chunk that carries the assistant role.
nlohmann::ordered_json delta_chunk(const ApiRequest& r, const ResponseMeta& m, int index, const std::string& text,
                                   const std::vector<TokenLogprob>& logprobs, bool first,
                                   const TokenText& token_text);
// A chat chunk with choice `index`'s tool calls.
nlohmann::ordered_json tool_calls_chunk(const ApiRequest& r, const ResponseMeta& m, int index,
                                        const std::vector<ToolCall>& calls, bool first);
// The last chunk of choice `index`: its finish_reason ("stop", "length", "tool_calls").
nlohmann::ordered_json finish_chunk(const ApiRequest& r, const ResponseMeta& m, int index, const char* finish);
// After every choice's last chunk, for include_usage.
nlohmann::ordered_json usage_chunk(const ResponseMeta& m, const ApiRequest& r, const Usage& usage);
nlohmann::ordered_json usage_json(const Usage& usage);
const char* finish_name(FinishReason r);

}  // namespace augur::server
