// augur bench --synthetic NAME: prefill and decode speed of a model of a known
// shape with random weights, against the machine's measured copy bandwidth.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "commands.h"
#include "core/error.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "runtime/runner.h"

namespace augur::cli {

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Copy bandwidth, counted as bytes read + bytes written per second: a large
// memcpy split over the pool's threads, best of several runs.
double measure_copy_bandwidth(ThreadPool& pool) {
  const size_t bytes = size_t(1) << 30;
  HostBuffer src(bytes), dst(bytes);
  std::memset(src.data(), 1, bytes);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = Clock::now();
    pool.parallel_for(int64_t(bytes >> 20), 1, [&](int64_t b, int64_t e) {
      std::memcpy(static_cast<char*>(dst.data()) + (b << 20), static_cast<char*>(src.data()) + (b << 20),
                  size_t(e - b) << 20);
    });
    best = std::max(best, 2.0 * double(bytes) / seconds(t0, Clock::now()));
  }
  return best;
}

struct BenchArgs {
  std::string synthetic;
  int64_t prompt = 512;
  int64_t gen = 32;
  int threads = 0;
  bool json = false;
};

int bench(const BenchArgs& a) {
  if (a.threads > 0) ThreadPool::set_global_threads(a.threads);
  ThreadPool& pool = ThreadPool::global();
  if (a.synthetic.empty()) fail("[bench] give --synthetic NAME");
  if (a.prompt <= 0 || a.gen <= 0) fail("[bench] --prompt and --gen must be positive");
  const auto names = synthetic_model_names();
  if (std::find(names.begin(), names.end(), a.synthetic) == names.end())
    make_synthetic_model(a.synthetic);  // throws, listing the known shapes

  std::fprintf(stderr, "measuring copy bandwidth (%d threads)...\n", pool.size());
  const double copy_bw = measure_copy_bandwidth(pool);
  std::fprintf(stderr, "building %s with random weights...\n", a.synthetic.c_str());
  auto model = make_synthetic_model(a.synthetic, 1);
  const ModelInfo& info = model->info();

  RunnerOptions ro;
  ro.max_cached_tokens = a.prompt + a.gen + 64;
  ro.prefill_chunk = a.prompt;
  Runner runner(*model, ro);
  std::mt19937 rng(7);
  std::vector<int32_t> prompt(size_t(a.prompt));
  for (auto& t : prompt) t = int32_t(rng() % uint32_t(info.n_vocab));

  {  // warm-up: touches scratch buffers and faults in pages
    auto warm = runner.new_sequence();
    runner.feed(*warm, std::span<const int32_t>(prompt.data(), 8));
  }
  auto seq = runner.new_sequence();
  std::fprintf(stderr, "prefill %lld tokens...\n", (long long)a.prompt);
  auto t0 = Clock::now();
  Tensor logits = runner.feed(*seq, prompt);
  const double prefill_s = seconds(t0, Clock::now());

  std::fprintf(stderr, "decode %lld tokens...\n", (long long)a.gen);
  const int64_t n_vocab = info.n_vocab;
  int32_t tok = argmax({logits.data<float>(), size_t(n_vocab)});
  int64_t kv_tokens_read = 0;
  t0 = Clock::now();
  for (int64_t i = 0; i < a.gen; ++i) {
    kv_tokens_read += seq->length() + 1;
    Tensor next = runner.feed(*seq, std::span<const int32_t>(&tok, 1));
    tok = argmax({next.data<float>(), size_t(n_vocab)});
  }
  const double decode_s = seconds(t0, Clock::now());

  const double prefill_tps = double(a.prompt) / prefill_s;
  const double decode_tps = double(a.gen) / decode_s;
  // Bytes one decode step must move: every weight it reads once, plus the
  // K/V of the context so far.
  const double bytes_per_token = double(info.decode_weight_bytes) +
                                 double(info.kv.bytes_per_token()) * double(kv_tokens_read) / double(a.gen);
  const double decode_bw = bytes_per_token * decode_tps;
  const double prefill_flops = 2.0 * double(info.n_params) * double(a.prompt);

  if (a.json) {
    nlohmann::json out = {{"model", a.synthetic},
                          {"threads", pool.size()},
                          {"n_params", info.n_params},
                          {"weight_bytes", info.weight_bytes},
                          {"copy_bandwidth_bytes_per_s", copy_bw},
                          {"prefill_tokens", a.prompt},
                          {"prefill_tokens_per_s", prefill_tps},
                          {"prefill_gflops", prefill_flops / prefill_s / 1e9},
                          {"decode_tokens", a.gen},
                          {"decode_tokens_per_s", decode_tps},
                          {"decode_bytes_per_token", bytes_per_token},
                          {"decode_bytes_per_s", decode_bw},
                          {"decode_fraction_of_copy_bandwidth", decode_bw / copy_bw}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("model            %s (%.2f B params, %.2f GB weights), %d threads\n", a.synthetic.c_str(),
                double(info.n_params) / 1e9, double(info.weight_bytes) / 1e9, pool.size());
    std::printf("copy bandwidth   %.2f GB/s (read + write)\n", copy_bw / 1e9);
    std::printf("prefill          %lld tokens: %.1f tok/s (%.1f GFLOP/s)\n", (long long)a.prompt, prefill_tps,
                prefill_flops / prefill_s / 1e9);
    std::printf("decode           %lld tokens: %.2f tok/s, %.2f GB/s = %.1f%% of copy bandwidth\n",
                (long long)a.gen, decode_tps, decode_bw / 1e9, 100.0 * decode_bw / copy_bw);
  }
  return 0;
}

}  // namespace

Handler add_bench(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure prefill and decode speed");
  cmd->add_option("--synthetic", a->synthetic, "Model shape with random weights: " + [] {
    std::string s;
    for (const auto& n : synthetic_model_names()) s += (s.empty() ? "" : ", ") + n;
    return s;
  }())->required();
  cmd->add_option("--prompt", a->prompt, "Prefill length")->capture_default_str();
  cmd->add_option("--gen", a->gen, "Decode steps")->capture_default_str();
  cmd->add_option("-t,--threads", a->threads, "CPU threads (default: all cores)");
  cmd->add_flag("--json", a->json, "Print one JSON object");
  return [a] { return bench(*a); };
}

}  // namespace augur::cli
