// augur chat MODEL_DIR: an interactive conversation, one engine session: each
// turn feeds only the tokens after the longest prefix the session already
// holds, instead of re-processing the conversation.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "backend/device.h"
#include "commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "runtime/engine.h"
#include "sampling_options.h"

namespace augur::cli {

namespace {

struct ChatArgs {
  std::string device;  // "" = CUDA where a GPU is present, else the CPU
  std::string model = AUGUR_DEFAULT_MODEL;
  std::string system;
  int64_t max_tokens = 256;
  SamplingOptions sampling;
  std::vector<std::string> stops;
  int64_t ctx = 4096;
  int threads = 0;
  std::string draft;  // speculative decoding's draft source (SpeculationParams::draft)
  int32_t draft_tokens = 4;
  std::string draft_vocab;  // a draft vocabulary file (SpeculationParams::draft_vocab)
};

int chat(const ChatArgs& a) {
  if (a.threads > 0) ThreadPool::set_global_threads(a.threads);
  const SamplingParams sampling = a.sampling.resolve(a.model);
  TextModel text = TextModel::load(a.model);
  if (!text.chat) fail("[cli] chat: ", a.model, " has no chat_template");
  if (a.max_tokens < 1) fail("[cli] chat: --max-tokens must be positive, got ", a.max_tokens);
  if (a.ctx < 1) fail("[cli] chat: --ctx must be positive, got ", a.ctx);
  const Device device = a.device.empty() ? default_device() : parse_device(a.device);
  auto model = load_model(a.model, device);
  // The conversation lives within the cache and the model's positions.
  const int64_t max_position = model->info().max_position;
  const int64_t ctx = max_position > 0 ? std::min(a.ctx, max_position) : a.ctx;
  EngineOptions eo;
  eo.max_cached_tokens = ctx;
  eo.max_sequences = 1;
  Engine engine(std::move(model), std::move(text), eo);
  SpeculationParams speculation;
  speculation.draft = a.draft;
  speculation.k = a.draft_tokens;
  speculation.draft_vocab = a.draft_vocab;
  engine.prepare_speculation(speculation);  // a bad draft fails before the first turn
  int64_t session = engine.open_session();
  const bool tty = isatty(STDIN_FILENO);

  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!a.system.empty()) messages.push_back({{"role", "system"}, {"content", a.system}});
  if (tty) std::fprintf(stderr, "augur chat: /reset clears the conversation, /exit or Ctrl-D ends it\n");
  std::string line;
  for (;;) {
    if (tty) {
      std::fprintf(stderr, "> ");
      std::fflush(stderr);
    }
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit") break;
    if (line == "/reset") {
      messages.erase(messages.begin() + (a.system.empty() ? 0 : 1), messages.end());
      engine.close_session(session);
      session = engine.open_session();
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    const Prompt prompt = Prompt::of_chat(messages);
    // A turn that does not fit is refused and forgotten; the conversation
    // goes on. A reply that would pass the end is cut short (finish
    // "length").
    int64_t n_prompt = 0;
    try {
      n_prompt = int64_t(engine.encode(prompt).size());
    } catch (const Error& e) {
      std::fprintf(stderr, "augur: error: %s\n", e.what());
      messages.erase(messages.end() - 1);
      continue;
    }
    if (n_prompt >= ctx) {
      std::fprintf(stderr, "augur: the conversation (%lld tokens) leaves no room for a reply in %lld tokens%s; /reset to start over\n",
                   (long long)n_prompt, (long long)ctx, ctx < a.ctx ? " (the model's positions)" : " (--ctx)");
      messages.erase(messages.end() - 1);
      continue;
    }

    RequestParams params;
    params.max_tokens = std::min(a.max_tokens, ctx - n_prompt);
    params.sampling = sampling;
    params.stop = a.stops;
    params.session = session;
    params.speculation = speculation;
    std::string reply;
    const Event res = engine.run(engine.submit(prompt, params), [&](const Event& e) {
      reply += e.text;
      std::fwrite(e.text.data(), 1, e.text.size(), stdout);
      std::fflush(stdout);
    });
    std::printf("\n");
    std::fflush(stdout);
    const Timings& t = res.timings;
    std::fprintf(stderr, "[%lld tokens reused, %lld prefilled, %lld generated, %.1f tok/s",
                 (long long)res.usage.cached_tokens, (long long)t.prefill_tokens,
                 (long long)res.usage.completion_tokens, t.decode_s > 0 ? double(t.decode_tokens) / t.decode_s : 0.0);
    if (!a.draft.empty())
      std::fprintf(stderr, "; %lld of %lld drafts accepted", (long long)res.drafts.accepted,
                   (long long)res.drafts.drafted);
    if (res.finish == FinishReason::Length && res.usage.completion_tokens < a.max_tokens)
      std::fprintf(stderr, "; cut short: the context is full");
    std::fprintf(stderr, "]\n");
    messages.push_back({{"role", "assistant"}, {"content", reply}});
  }
  return 0;
}

}  // namespace

Handler add_chat(CLI::App& app) {
  auto a = std::make_shared<ChatArgs>();
  CLI::App* cmd = app.add_subcommand("chat", "Interactive multi-turn chat through the model's chat template");
  cmd->add_option("model", a->model, "Model directory (with tokenizer.json and a chat template)")->capture_default_str();
  cmd->add_option("--system", a->system, "System message");
  cmd->add_option("-n,--max-tokens", a->max_tokens, "Most tokens per reply")->capture_default_str();
  a->sampling.add_to(cmd);
  cmd->add_option("--stop", a->stops, "Stop a reply when it contains this text (repeatable)");
  cmd->add_option("--ctx", a->ctx, "KV cache capacity in tokens")->capture_default_str();
  cmd->add_option("--device", a->device, "cpu | cuda (default: cuda when a GPU is present)");
  cmd->add_option("-t,--threads", a->threads, "CPU threads (default: all cores)");
  cmd->add_option("--draft", a->draft,
                  "Speculative decoding: ngram (prompt lookup), mtp (the checkpoint's MTP head) or a draft model's "
                  "directory; the replies are what plain decoding gives");
  cmd->add_option("--draft-tokens", a->draft_tokens, "Most draft tokens a step")->capture_default_str();
  cmd->add_option("--draft-vocab", a->draft_vocab,
                  "Draft vocabulary (augur draft-vocab): the draft head scores only these tokens");
  return [a] { return chat(*a); };
}

}  // namespace augur::cli
