// augur serve [MODEL_DIR] [--host H] [--port P] [--device D] [--max-batch B]
//             [--memory-fraction F | --ctx TOKENS] [--no-prefix-cache] [--draft ngram|mtp|DIR ...]
// The OpenAI-compatible server (server/server.h) on one model.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

#include "backend/device.h"
#include "commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "runtime/engine.h"
#include "server/server.h"

namespace augur::cli {

namespace {

struct ServeArgs {
  std::string model = AUGUR_DEFAULT_MODEL;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string device;  // "" = CUDA where a GPU is present, else the CPU
  std::string name;    // the model's id in the API (default: the directory's name)
  int64_t max_batch = 16;
  int64_t max_queue = 256;
  double memory_fraction = 0;  // 0: the default for the device (see below)
  int64_t ctx = 0;             // KV tokens over all requests; 0: from memory
  int64_t default_max_tokens = 256;
  int64_t step_tokens = 512;
  int threads = 0;
  bool warmup = true;
  bool prefix_cache = true;
  std::string draft;
  int32_t draft_tokens = 4;
  std::string draft_vocab;
};

// Every position of every running request, at most.
int64_t ceiling_tokens(const ModelInfo& info, int64_t max_batch) {
  const int64_t per = info.max_position > 0 ? info.max_position : 32768;
  return per * max_batch;
}

int serve(const ServeArgs& a) {
  if (a.threads > 0) ThreadPool::set_global_threads(a.threads);
  if (a.max_batch <= 0) fail("[cli] serve: --max-batch must be positive");
  if (a.memory_fraction < 0 || a.memory_fraction > 1) fail("[cli] serve: --memory-fraction must be in (0, 1]");
  if (a.ctx < 0) fail("[cli] serve: --ctx must be positive");
  if (a.ctx > 0 && a.memory_fraction > 0) fail("[cli] serve: give --ctx or --memory-fraction, not both");
  if (a.default_max_tokens < 1) fail("[cli] serve: --default-max-tokens must be positive, got ", a.default_max_tokens);
  if (a.max_queue < 0) fail("[cli] serve: --max-queue must not be negative");
  if (a.step_tokens < 1) fail("[cli] serve: --step-tokens must be positive");
  if (a.port < 0 || a.port > 65535) fail("[cli] serve: --port must be 0-65535");
  const Device device = a.device.empty() ? default_device() : parse_device(a.device);
  std::optional<TextModel> text;
  if (TextModel::exists(a.model)) text.emplace(TextModel::load(a.model));
  std::unique_ptr<Model> model = load_model(a.model, device);
  const ModelInfo& info = model->info();

  // The cache: --ctx tokens, else a fraction of the memory left after the
  // weights (CUDA: 0.9 by default, less 1 GiB for a step's activations; the
  // host: by default what max_batch requests of 4096 tokens fill).
  const int64_t per_token = std::max<int64_t>(1, info.kv.bytes_per_token(device));
  // Hybrids: a state slot (and its input history) per running request, a
  // saved copy per running request (the mark a verify rolls back to, or the
  // cached state it resumed from), and the prefix cache's state copies.
  const int64_t prefix_states = a.prefix_cache ? a.max_batch : 0;
  const int64_t state_bytes =
      info.recurrent.n_layer > 0 ? info.recurrent.bytes_per_slot() * (2 * a.max_batch + prefix_states) +
                                       info.recurrent.history_bytes_per_slot() * a.max_batch
                                 : 0;
  int64_t tokens = a.ctx;
  if (tokens == 0) {
    const double fraction = a.memory_fraction > 0 ? a.memory_fraction : device == Device::CUDA ? 0.9 : 0.0;
    if (fraction > 0) {
      const double budget = fraction * double(free_memory(device)) - double(state_bytes) -
                            (device == Device::CUDA ? double(int64_t(1) << 30) : 0.0);
      tokens = int64_t(std::max(0.0, budget) / double(per_token));
      if (tokens < 256)
        fail("[cli] serve: ", fraction, " of the free memory holds only ", tokens, " KV tokens; lower --max-batch or give --ctx");
    } else {
      tokens = a.max_batch * std::min<int64_t>(4096, info.max_position > 0 ? info.max_position : 4096);
    }
    tokens = std::min(tokens, ceiling_tokens(info, a.max_batch));
  }
  EngineOptions eo;
  eo.max_cached_tokens = tokens;
  eo.max_sequences = a.max_batch;
  eo.step_tokens = a.step_tokens;
  eo.prefix_cache = a.prefix_cache;
  eo.prefix_states = prefix_states;
  Engine engine(std::move(model), std::move(text), eo);

  SchedulerOptions so;
  so.max_batch = a.max_batch;
  so.max_queue = a.max_queue;
  so.warmup = a.warmup;
  server::ServerOptions o;
  o.host = a.host;
  o.port = a.port;
  o.model_name = !a.name.empty() ? a.name : std::filesystem::path(a.model).lexically_normal().filename().string();
  if (o.model_name.empty()) o.model_name = std::filesystem::path(a.model).lexically_normal().parent_path().filename();
  o.default_max_tokens = a.default_max_tokens;
  o.speculation.draft = a.draft;
  o.speculation.k = a.draft_tokens;
  o.speculation.draft_vocab = a.draft_vocab;
  server::Server srv(engine, so, o);
  srv.bind();
  std::fprintf(stderr, "augur serve: listening on http://%s:%d (model %s on %s, KV cache %lld tokens, max batch %lld)\n",
               a.host.c_str(), srv.port(), o.model_name.c_str(), std::string(device_name(device)).c_str(),
               (long long)tokens, (long long)a.max_batch);
  std::fflush(stderr);
  srv.run();
  std::fprintf(stderr, "augur serve: stopped\n");
  return 0;
}

}  // namespace

Handler add_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  cmd->add_option("model", a->model, "Model directory (config.json + safetensors)")->capture_default_str();
  cmd->add_option("--host", a->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", a->port, "Port to listen on (0: any free port)")->capture_default_str();
  cmd->add_option("--device", a->device, "cpu | cuda (default: cuda when a GPU is present)");
  cmd->add_option("--served-model-name", a->name, "The model's id in the API (default: the directory's name)");
  cmd->add_option("--max-batch", a->max_batch, "Requests running at once")->capture_default_str();
  cmd->add_option("--max-queue", a->max_queue, "Requests waiting beyond those; more get 429")->capture_default_str();
  cmd->add_option("--memory-fraction", a->memory_fraction,
                  "Fraction of the memory left after the weights that the KV cache takes (CUDA default 0.9)");
  cmd->add_option("--ctx", a->ctx, "KV cache tokens over all requests (instead of --memory-fraction)");
  cmd->add_option("--default-max-tokens", a->default_max_tokens, "max_tokens of a request that gives none")
      ->capture_default_str();
  cmd->add_option("--step-tokens", a->step_tokens, "Most prompt tokens one step feeds (chunked prefill)")
      ->capture_default_str();
  cmd->add_option("-t,--threads", a->threads, "CPU threads (default: all cores)");
  cmd->add_flag("!--no-warmup", a->warmup, "Skip the warm-up request at start");
  cmd->add_flag("!--no-prefix-cache", a->prefix_cache,
                "Prefill every prompt whole (no reuse of earlier requests' KV blocks and states)");
  cmd->add_option("--draft", a->draft, "Speculative decoding for every request: ngram, mtp or a draft model's directory");
  cmd->add_option("--draft-tokens", a->draft_tokens, "Most draft tokens a step")->capture_default_str();
  cmd->add_option("--draft-vocab", a->draft_vocab, "Draft vocabulary (augur draft-vocab)");
  return [a] { return serve(*a); };
}

}  // namespace augur::cli
