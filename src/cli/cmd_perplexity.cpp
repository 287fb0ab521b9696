// augur perplexity [MODEL_DIR] --file TEXT [--window 1024] [--max-windows N] [--json]
// Held-out perplexity of a text file, windows as in runtime/perplexity.h.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>

#include "backend/device.h"
#include "commands.h"
#include "core/error.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "runtime/perplexity.h"

namespace augur::cli {

namespace {

struct PerplexityArgs {
  std::string model = AUGUR_DEFAULT_MODEL;
  std::string file;
  std::string device;
  int64_t window = 1024;
  int64_t max_windows = 0;
  bool json = false;
  int threads = 0;
};

int perplexity_cmd(const PerplexityArgs& a) {
  if (a.threads > 0) ThreadPool::set_global_threads(a.threads);
  if (a.window < 1) fail("[cli] perplexity: --window must be at least 1");
  if (a.max_windows < 0) fail("[cli] perplexity: --max-windows must be >= 0");
  std::ifstream in(a.file, std::ios::binary);
  if (!in) fail("[cli] perplexity: cannot read '", a.file, "'");
  std::ostringstream text;
  text << in.rdbuf();
  const TextModel tm = TextModel::load(a.model);
  // Special tokens written in the text (e.g. <|endoftext|> between documents)
  // are matched as such, as Hugging Face tokenizers do.
  const std::vector<int32_t> ids = tm.tokenizer.encode(text.str(), /*add_special_tokens=*/false);
  if (ids.size() < 2) fail("[cli] perplexity: '", a.file, "' encodes to ", ids.size(), " tokens; need 2 or more");

  const Device device = a.device.empty() ? default_device() : parse_device(a.device);
  // A window longer than the text is the text (the cache is sized by it).
  const int64_t window = std::min<int64_t>(a.window, int64_t(ids.size()) - 1);
  auto model = load_model(a.model, device);
  if (model->info().max_position > 0 && window > model->info().max_position)
    fail("[cli] perplexity: --window ", window, " exceeds the model's ", model->info().max_position,
         " positions (max_position_embeddings)");
  EngineOptions eo;
  eo.max_cached_tokens = window + 1;
  eo.max_sequences = 1;
  Engine engine(std::move(model), std::nullopt, eo);
  PerplexityOptions po;
  po.window = window;
  po.max_windows = a.max_windows;
  const int64_t n_windows = (int64_t(ids.size()) - 1 + window - 1) / window;
  Progress progress("perplexity", a.max_windows > 0 ? std::min(a.max_windows, n_windows) : n_windows);
  po.on_window = [&](int64_t done, int64_t) { progress.update(done); };
  const PerplexityResult r = perplexity(engine, ids, po);
  progress.finish();
  // A model with an MTP head: how often its one-token draft would be accepted.
  std::optional<MtpAgreement> mtp;
  if (engine.model().mtp()) {
    Progress mtp_progress("MTP head", a.max_windows > 0 ? std::min(a.max_windows, n_windows) : n_windows);
    po.on_window = [&](int64_t done, int64_t) { mtp_progress.update(done); };
    mtp = mtp_agreement(engine.model(), ids, po);
    mtp_progress.finish();
  }
  const double tps = r.seconds > 0 ? double(r.tokens) / r.seconds : 0;
  if (a.json) {
    nlohmann::json out = {{"model", a.model},     {"model_type", engine.info().model_type},
                          {"device", device_name(device)}, {"file", a.file},
                          {"text_tokens", ids.size()}, {"window", window},
                          {"windows", r.windows}, {"tokens", r.tokens},
                          {"mean_nll", r.mean_nll}, {"ppl", r.ppl},
                          {"seconds", r.seconds}, {"tokens_per_s", tps}};
    if (mtp) out["mtp"] = {{"positions", mtp->positions}, {"agree_with_greedy", mtp->agree}, {"rate", mtp->rate}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("perplexity %.4f (mean NLL %.6f nats over %lld tokens, %lld windows of %lld) | %.0f tok/s\n", r.ppl,
                r.mean_nll, (long long)r.tokens, (long long)r.windows, (long long)window, tps);
    if (mtp)
      std::printf("MTP head: its top-1 at t+2 is the model's greedy choice at %.2f%% of %lld positions\n",
                  100.0 * mtp->rate, (long long)mtp->positions);
  }
  return 0;
}

}  // namespace

Handler add_perplexity(CLI::App& app) {
  auto a = std::make_shared<PerplexityArgs>();
  CLI::App* cmd = app.add_subcommand("perplexity", "Perplexity of a text file under a model");
  cmd->add_option("model", a->model, "Model directory (config.json + safetensors + tokenizer)")->capture_default_str();
  cmd->add_option("-f,--file", a->file, "Text file (UTF-8)")->required();
  cmd->add_option("--window", a->window, "Predicted tokens per window (each window starts fresh)")
      ->capture_default_str();
  cmd->add_option("--max-windows", a->max_windows, "Stop after this many windows (0 = all)");
  cmd->add_flag("--json", a->json, "Print one JSON object");
  cmd->add_option("--device", a->device, "cpu | cuda (default: cuda when a GPU is present)");
  cmd->add_option("-t,--threads", a->threads, "CPU threads (default: all cores)");
  return [a] { return perplexity_cmd(*a); };
}

}  // namespace augur::cli
