// augur bench (a checkpoint, or --synthetic NAME: a model of a known shape with
// random weights): prefill and decode speed, against the device's copy
// bandwidth (bytes read + written) and matrix-product peak, both measured here.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/device.h"
#include "backend/ops.h"
#include "commands.h"
#include "core/error.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "runtime/engine.h"

namespace augur::cli {

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Copy bandwidth of `device`: a 1 GiB copy (split over the threads on the
// CPU), best of several, counted as bytes read + bytes written. A GPU is
// first kept copying for 0.2 s (an idle one clocks down: one run's figure
// came out 12% low), then each timed repeat is 4 copies, so the host's
// launch and sync overhead is small against the copies.
double measure_copy_bandwidth(Device device) {
  const int64_t bytes = int64_t(1) << 30;
  Tensor src = empty_on(device, DType::U8, {bytes}), dst = empty_on(device, DType::U8, {bytes});
  if (device == Device::CPU) std::memset(src.raw(), 1, size_t(bytes));
  ThreadPool& pool = ThreadPool::global();
  const int64_t chunk = int64_t(1) << 20;
  const bool gpu = device != Device::CPU;
  if (gpu) {
    const auto warm = Clock::now();
    while (seconds(warm, Clock::now()) < 0.2) {
      copy_tensor(src, dst);
      synchronize(device);
    }
  }
  const int copies = gpu ? 4 : 1;
  double best = 0;
  for (int rep = 0; rep < (gpu ? 10 : 6); ++rep) {
    synchronize(device);
    auto t0 = Clock::now();
    for (int c = 0; c < copies; ++c) {
      if (gpu)
        copy_tensor(src, dst);
      else
        pool.parallel_for(bytes / chunk, 1, [&](int64_t b, int64_t e) {
          std::memcpy(dst.data<char>() + b * chunk, src.data<char>() + b * chunk, size_t((e - b) * chunk));
        });
    }
    synchronize(device);
    if (gpu || rep > 0) best = std::max(best, 2.0 * double(bytes) * copies / seconds(t0, Clock::now()));
  }
  return best;
}

// The device's matrix-product peak as prefill computes its projections
// (ops::linear: f32 x, bf16 weights, f32 y): a square product of side 8192
// (1024 on the CPU) over random values (a GPU multiplying zeros runs faster
// than on data), after 0.2 s of warm-up on a GPU, best of several, in FLOP/s.
// Prefill's FLOP rate is reported as a fraction of it.
double measure_gemm_peak(Device device) {
  const bool gpu = device != Device::CPU;
  const int64_t n = gpu ? 8192 : 1024;
  Tensor x = Tensor::empty(DType::F32, {n, n}), w = Tensor::empty(DType::BF16, {n, n});
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (int64_t i = 0; i < n * n; ++i) {
    const float v = dist(rng);
    x.data<float>()[i] = v;
    w.data<uint16_t>()[i] = f32_to_bf16(v * 0.03f);
  }
  x = to_device(x, device);
  w = to_device(w, device);
  Tensor y = empty_on(device, DType::F32, {n, n});
  const int products = gpu ? 3 : 1;
  auto time_once = [&] {
    synchronize(device);
    const auto t0 = Clock::now();
    for (int p = 0; p < products; ++p) ops::linear(x, w, y);
    synchronize(device);
    return seconds(t0, Clock::now());
  };
  if (gpu) {
    const auto warm = Clock::now();
    while (seconds(warm, Clock::now()) < 0.2) time_once();
  } else {
    time_once();
  }
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) best = std::max(best, 2.0 * double(n) * double(n) * double(n) * products / time_once());
  return best;
}

std::vector<int32_t> random_ids(int64_t n, int64_t n_vocab, std::mt19937& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = int32_t(rng() % uint32_t(n_vocab));
  return ids;
}

struct DecodeFigures {
  int64_t batch, context, steps;
  double seconds, tokens_per_s, bytes_per_step, bytes_per_s;
  int64_t tokens = 0;  // generated in the timed steps (batch x steps without speculation)
  DraftStats drafts;   // over the whole run, warm-up included
};

// `batch` requests of `context` random prompt tokens decode greedily
// together through the engine (on an accelerator each step is queued before
// the last step's ids are read). Prompts are fed a chunk a step, so the first
// requests decode while the last still prefill: once every request has its
// first three tokens (the decode graph captured, first-use allocations
// made), the next `steps` steps are timed, every row decoding in each (each
// request may make enough tokens for that). With speculation each step
// verifies drafts; the "replay" source replays a first, untimed plain run's
// continuation of each prompt (every draft accepted: the upper bound). k is
// fixed (no adaptation), so that a figure belongs to one k.
DecodeFigures time_decode(std::unique_ptr<Model>& model, int64_t batch, int64_t context, int64_t steps,
                          std::mt19937& rng, const SpeculationParams& spec) {
  EngineOptions eo;
  eo.step_tokens = std::min<int64_t>(context, 4096);
  const int64_t prefill_steps = batch * ((context + eo.step_tokens - 1) / eo.step_tokens);
  const int64_t per_step = spec.draft.empty() ? 1 : 1 + spec.k;
  RequestParams params;
  params.ignore_eos = true;
  params.max_tokens = (prefill_steps + steps + 8) * per_step;
  eo.max_cached_tokens = batch * (context + params.max_tokens + 16);
  eo.max_sequences = batch;
  Engine engine(std::move(model), std::nullopt, eo);
  const ModelInfo& info = engine.info();
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t b = 0; b < batch; ++b) prompts.push_back(random_ids(context, info.n_vocab, rng));
  std::vector<std::vector<int32_t>> records(prompts);
  if (spec.draft == "replay") {
    std::map<RequestId, size_t> row;
    for (size_t b = 0; b < prompts.size(); ++b) row[engine.submit(Prompt::of_ids(prompts[b]), params)] = b;
    while (!engine.idle())
      for (const Event& e : engine.step()) records[row[e.id]].insert(records[row[e.id]].end(), e.ids.begin(), e.ids.end());
  }
  std::map<RequestId, int64_t> made;  // tokens each request has made
  for (size_t b = 0; b < prompts.size(); ++b) {
    params.speculation = spec;
    params.speculation.adaptive = false;
    if (spec.draft == "replay") params.speculation.replay = records[b];
    made[engine.submit(Prompt::of_ids(prompts[b]), params)] = 0;
  }
  auto every_has = [&](int64_t n) {
    for (const auto& [id, k] : made)
      if (k < n) return false;
    return true;
  };
  while (!every_has(3))
    for (const Event& e : engine.step()) made[e.id] += int64_t(e.ids.size());
  synchronize(info.placement.device());
  double kv_tokens = 0;  // K/V positions the timed steps read, over all rows
  for (const auto& [id, k] : made) kv_tokens += double(steps) * double(context + k) + double(steps * (steps - 1) / 2);
  int64_t tokens = 0;
  const auto t0 = Clock::now();
  for (int64_t s = 0; s < steps; ++s)
    for (const Event& e : engine.step()) tokens += int64_t(e.ids.size());
  synchronize(info.placement.device());
  DecodeFigures f{batch, context, steps, seconds(t0, Clock::now()), 0, 0, 0, tokens, {}};
  for (const auto& [id, k] : made) engine.cancel(id);
  while (!engine.idle())
    for (const Event& e : engine.step())
      if (e.done) {
        f.drafts.rounds += e.drafts.rounds;
        f.drafts.drafted += e.drafts.drafted;
        f.drafts.accepted += e.drafts.accepted;
        f.drafts.full_rounds += e.drafts.full_rounds;
      }
  model = engine.release();
  // (Chained steps deliver each step's ids one step late: the count is
  // batch x steps all the same.)
  if (spec.draft.empty()) f.tokens = batch * steps;
  f.tokens_per_s = double(f.tokens) / f.seconds;
  // A step reads every weight once, plus the K/V of every row's context, and
  // reads and writes each row's recurrent state (hybrid models).
  f.bytes_per_step = double(info.decode_weight_bytes) +
                     double(info.kv.bytes_per_token(info.placement.device())) * kv_tokens / double(steps) +
                     2.0 * double(info.recurrent.bytes_per_slot()) * double(batch);
  f.bytes_per_s = f.bytes_per_step * double(steps) / f.seconds;
  return f;
}

struct BenchArgs {
  std::string device;  // "" = CUDA where a GPU is present, else the CPU
  std::string model;      // a checkpoint directory, or
  std::string synthetic;  // a shape with random weights
  std::string prompts = "512";
  int64_t gen = 32;
  std::string batches = "1";
  std::string contexts;
  int threads = 0;
  bool json = false;
  SpeculationParams spec;  // decode with drafts: spec.draft as RequestParams', or "replay"
};

std::vector<int64_t> parse_list(const std::string& text, const char* option) {
  std::vector<int64_t> out;
  for (int32_t v : parse_ids(text, option)) {
    if (v <= 0) fail("[bench] ", option, " values must be positive");
    out.push_back(v);
  }
  return out;
}

int bench(const BenchArgs& a) {
  if (a.threads > 0) ThreadPool::set_global_threads(a.threads);
  if (a.synthetic.empty() == a.model.empty()) fail("[bench] give a model directory or --synthetic NAME (one of them)");
  if (a.gen <= 0) fail("[bench] --gen must be positive");
  if (a.spec.draft == "replay") {
    SpeculationParams check = a.spec;
    check.replay = {0};  // made per request
    validate(check);
  } else {
    validate(a.spec);
  }
  if (!a.spec.draft.empty()) check_draft_source(a.spec.draft, nullptr);
  const std::vector<int64_t> prompts = parse_list(a.prompts, "--prompt");
  const int64_t prompt_len = prompts[0];  // the decode runs' context
  const auto names = synthetic_model_names();
  if (!a.synthetic.empty() && std::find(names.begin(), names.end(), a.synthetic) == names.end())
    make_synthetic_model(a.synthetic);  // throws, listing the known shapes
  const std::vector<int64_t> batches = parse_list(a.batches, "--batch");
  const std::vector<int64_t> contexts = a.contexts.empty() ? std::vector<int64_t>{} : parse_list(a.contexts, "--context");
  const Device device = a.device.empty() ? default_device() : parse_device(a.device);
  const int threads = ThreadPool::global().size();

  std::fprintf(stderr, "measuring %s copy bandwidth...\n", std::string(device_name(device)).c_str());
  const double copy_bw = measure_copy_bandwidth(device);
  std::fprintf(stderr, "measuring %s matrix-product peak...\n", std::string(device_name(device)).c_str());
  const double gemm_peak = measure_gemm_peak(device);
  const std::string name = a.synthetic.empty() ? a.model : a.synthetic;
  std::fprintf(stderr, "%s %s on %s...\n", a.synthetic.empty() ? "loading" : "building with random weights",
               name.c_str(), std::string(device_name(device)).c_str());
  auto model = a.synthetic.empty() ? load_model(a.model, device) : make_synthetic_model(a.synthetic, 1, device);
  const ModelInfo& info = model->info();
  if (!a.spec.draft.empty()) check_draft_source(a.spec.draft, model.get());
  std::mt19937 rng(7);

  // Prefill: one sequence, the whole prompt in one forward, per prompt length.
  struct PrefillFigures {
    int64_t tokens;
    double seconds, tokens_per_s, tflops;
  };
  std::vector<PrefillFigures> prefill;
  for (int64_t n : prompts) {
    std::fprintf(stderr, "prefill %lld tokens...\n", (long long)n);
    EngineOptions eo;
    eo.max_cached_tokens = 2 * (n + 16);
    eo.step_tokens = n;
    eo.max_sequences = 2;
    Engine engine(std::move(model), std::nullopt, eo);
    const auto prompt = random_ids(n, info.n_vocab, rng);
    RequestParams params;
    params.max_tokens = 1;
    engine.run(engine.submit(Prompt::of_ids(prompt), params));  // warm-up: allocations, kernel selection
    synchronize(device);
    auto t0 = Clock::now();
    engine.run(engine.submit(Prompt::of_ids(prompt), params));
    const double sec = seconds(t0, Clock::now());
    prefill.push_back({n, sec, double(n) / sec, 2.0 * double(info.n_params) * double(n) / sec / 1e12});
    model = engine.release();
  }

  std::vector<DecodeFigures> decode;
  for (int64_t b : batches) {
    std::fprintf(stderr, "decode: batch %lld, context %lld, %lld steps...\n", (long long)b, (long long)prompt_len,
                 (long long)a.gen);
    decode.push_back(time_decode(model, b, prompt_len, a.gen, rng, a.spec));
  }
  for (int64_t c : contexts) {
    std::fprintf(stderr, "decode: batch 1, context %lld, %lld steps...\n", (long long)c, (long long)a.gen);
    decode.push_back(time_decode(model, 1, c, a.gen, rng, a.spec));
  }

  if (a.json) {
    nlohmann::json d = nlohmann::json::array();
    for (const auto& f : decode)
      d.push_back({{"batch", f.batch},
                   {"context", f.context},
                   {"steps", f.steps},
                   {"tokens_per_s", f.tokens_per_s},
                   {"ms_per_step", 1e3 * f.seconds / double(f.steps)},
                   {"bytes_per_step", f.bytes_per_step},
                   {"bytes_per_s", f.bytes_per_s},
                   {"fraction_of_copy_bandwidth", f.bytes_per_s / copy_bw},
                   {"tokens_per_step", double(f.tokens) / double(f.batch * f.steps)},
                   {"drafted", f.drafts.drafted},
                   {"accepted", f.drafts.accepted},
                   {"acceptance_rate", f.drafts.drafted > 0 ? double(f.drafts.accepted) / double(f.drafts.drafted) : 0.0}});
    nlohmann::json out = {{"model", name},
                          {"device", device_name(device)},
                          {"threads", threads},
                          {"n_params", info.n_params},
                          {"weight_bytes", info.weight_bytes},
                          {"copy_bandwidth_bytes_per_s", copy_bw},
                          {"gemm_peak_tflops", gemm_peak / 1e12},
                          {"prefill_tokens", prefill[0].tokens},
                          {"prefill_tokens_per_s", prefill[0].tokens_per_s},
                          {"prefill_tflops", prefill[0].tflops},
                          {"prefill_fraction_of_gemm_peak", prefill[0].tflops * 1e12 / gemm_peak},
                          {"decode", d}};
    if (!a.spec.draft.empty()) out["draft"] = {{"source", a.spec.draft}, {"tokens", a.spec.k}};
    for (const auto& p : prefill)
      out["prefill"].push_back({{"tokens", p.tokens},
                                {"tokens_per_s", p.tokens_per_s},
                                {"tflops", p.tflops},
                                {"fraction_of_gemm_peak", p.tflops * 1e12 / gemm_peak}});
    // The batch-1 figures at the top level, for scripts.
    if (!decode.empty()) {
      out["decode_tokens_per_s"] = decode[0].tokens_per_s;
      out["decode_fraction_of_copy_bandwidth"] = decode[0].bytes_per_s / copy_bw;
    }
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("model            %s (%.2f B params, %.2f GB weights) on %s%s\n", name.c_str(),
              double(info.n_params) / 1e9, double(info.weight_bytes) / 1e9, std::string(device_name(device)).c_str(),
              device == Device::CPU ? (", " + std::to_string(threads) + " threads").c_str() : "");
  std::printf("copy bandwidth   %.2f GB/s (read + write)\n", copy_bw / 1e9);
  std::printf("matrix products  %.2f TFLOP/s (f32 x bf16, %s)\n", gemm_peak / 1e12,
              device == Device::CPU ? "1024 x 1024 x 1024" : "8192 x 8192 x 8192");
  for (const auto& p : prefill)
    std::printf("prefill          %lld tokens: %.1f tok/s (%.2f TFLOP/s = %.1f%% of matrix products)\n",
                (long long)p.tokens, p.tokens_per_s, p.tflops, 100.0 * p.tflops * 1e12 / gemm_peak);
  for (const auto& f : decode) {
    std::printf("decode           batch %lld, context %lld: %.2f tok/s, %.3f ms/step", (long long)f.batch,
                (long long)f.context, f.tokens_per_s, 1e3 * f.seconds / double(f.steps));
    if (a.spec.draft.empty())
      std::printf(", %.1f GB/s = %.1f%% of copy bandwidth\n", f.bytes_per_s / 1e9, 100.0 * f.bytes_per_s / copy_bw);
    else
      std::printf(", %.2f tokens a row a step (%s drafts, %d a step, %.1f%% accepted)\n",
                  double(f.tokens) / double(f.batch * f.steps), a.spec.draft.c_str(), a.spec.k,
                  f.drafts.drafted > 0 ? 100.0 * double(f.drafts.accepted) / double(f.drafts.drafted) : 0.0);
  }
  return 0;
}

}  // namespace

Handler add_bench(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure prefill and decode speed");
  cmd->add_option("model", a->model, "Checkpoint directory (config.json + safetensors)");
  cmd->add_option("--synthetic", a->synthetic, "Instead of a checkpoint, a model shape with random weights: " + [] {
    std::string s;
    for (const auto& n : synthetic_model_names()) s += (s.empty() ? "" : ", ") + n;
    return s;
  }());
  cmd->add_option("--prompt", a->prompts, "Prefill lengths, e.g. 2048,16384; the first is the decode runs' context")
      ->capture_default_str();
  cmd->add_option("--gen", a->gen, "Decode steps")->capture_default_str();
  cmd->add_option("--batch", a->batches, "Decode batch sizes, e.g. 1,8,32,128")->capture_default_str();
  cmd->add_option("--context", a->contexts, "Extra batch-1 decode runs at these context lengths, e.g. 128,8192");
  cmd->add_option("--device", a->device, "cpu | cuda (default: cuda when a GPU is present)");
  cmd->add_option("-t,--threads", a->threads, "CPU threads (default: all cores)");
  cmd->add_flag("--json", a->json, "Print one JSON object");
  cmd->add_option("--draft", a->spec.draft,
                  "Decode speculatively: ngram (prompt lookup), mtp (the checkpoint's MTP head), a draft model's "
                  "directory, or replay (a first run's own continuation: every draft accepted, the upper bound)");
  cmd->add_option("--draft-tokens", a->spec.k, "Most draft tokens a step")->capture_default_str();
  cmd->add_option("--draft-vocab", a->spec.draft_vocab,
                  "Draft vocabulary (augur draft-vocab): the draft head scores only these tokens");
  return [a] { return bench(*a); };
}

}  // namespace augur::cli
