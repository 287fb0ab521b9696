// augur chat MODEL_DIR: an interactive conversation. The sequence state stays
// alive between turns: each turn feeds only the tokens after the longest
// prefix the cache already holds, instead of re-processing the conversation.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "backend/device.h"
#include "commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "runtime/runner.h"
#include "text.h"

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
};

int chat(const ChatArgs& a) {
  if (a.threads > 0) ThreadPool::set_global_threads(a.threads);
  const SamplingParams sampling = a.sampling.resolve(a.model);
  const TextModel text = TextModel::load(a.model);
  if (!text.chat) fail("[cli] chat: ", a.model, " has no chat_template");
  const Device device = a.device.empty() ? default_device() : parse_device(a.device);
  auto model = load_model(a.model, device);
  RunnerOptions ro;
  ro.max_cached_tokens = a.ctx;
  Runner runner(*model, ro);
  auto seq = runner.new_sequence();
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
      seq = runner.new_sequence();
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    const std::vector<int32_t> ids = text.encode_chat(messages, true);

    // Reuse the longest prefix the sequence already holds (at least one token
    // must be fed to get the next-token logits).
    const auto& held = seq->tokens();
    size_t keep = 0;
    while (keep < held.size() && keep < ids.size() && held[keep] == ids[keep]) ++keep;
    if (keep == ids.size()) --keep;
    if (keep < held.size()) {
      try {
        seq->truncate(int64_t(keep));
      } catch (const Error&) {  // recurrent state cannot rewind without a snapshot: start over
        seq = runner.new_sequence();
        keep = 0;
      }
    }
    if (int64_t(ids.size()) + a.max_tokens > a.ctx)
      fail("[cli] chat: the conversation (", ids.size(), " tokens) plus --max-tokens ", a.max_tokens,
           " exceeds --ctx ", a.ctx, "; /reset to start over");

    TextSink sink(text.tokenizer, a.stops, /*print=*/true);
    GenerateOptions go;
    go.max_tokens = a.max_tokens;
    go.sampling = sampling;
    go.stop_ids = model->info().eos_ids;
    go.on_token = [&](int32_t t) { return sink.push(t); };
    const std::vector<int32_t> fresh(ids.begin() + long(keep), ids.end());
    GenerateResult res = generate(runner, *seq, fresh, go);
    sink.finish();
    std::printf("\n");
    std::fflush(stdout);
    std::fprintf(stderr, "[%zu tokens reused, %zu prefilled, %zu generated, %.1f tok/s]\n", keep,
                 fresh.size(), res.ids.size(),
                 res.decode_seconds > 0 ? double(res.n_decode_steps) / res.decode_seconds : 0.0);
    messages.push_back({{"role", "assistant"}, {"content", sink.text()}});
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
  a->sampling.add_to(cmd, /*penalties=*/false);
  cmd->add_option("--stop", a->stops, "Stop a reply when it contains this text (repeatable)");
  cmd->add_option("--ctx", a->ctx, "KV cache capacity in tokens")->capture_default_str();
  cmd->add_option("--device", a->device, "cpu | cuda (default: cuda when a GPU is present)");
  cmd->add_option("-t,--threads", a->threads, "CPU threads (default: all cores)");
  return [a] { return chat(*a); };
}

}  // namespace augur::cli
