// augur run MODEL_DIR (--prompt-ids 1,2,3 | -p TEXT | --chat TEXT) [-n N] [sampling]
//           [--stop S]... [--json] [--logits-out FILE] [--draft ngram|mtp|DIR [--draft-tokens K] [--draft-vocab FILE]]
#include <cstdio>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/device.h"
#include "commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "io/safetensors_writer.h"
#include "runtime/engine.h"
#include "sampling_options.h"

namespace augur::cli {

std::vector<int32_t> parse_ids(const std::string& text, const char* option) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i <= text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    std::string part = text.substr(i, j - i);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (part.empty() || used != part.size() || v < 0 || v > INT32_MAX)
      fail("[cli] ", option, ": '", part, "' is not a token id (expected e.g. 1,2,3)");
    ids.push_back(int32_t(v));
    i = j + 1;
  }
  return ids;
}

namespace {

// The prompt of a plain `augur run`.
constexpr const char* kDefaultPrompt = "It was a cold morning, and";

struct RunArgs {
  std::string device;  // "" = CUDA where a GPU is present, else the CPU
  std::string model = AUGUR_DEFAULT_MODEL;
  std::string prompt_ids;
  std::string prompt;               // raw text
  std::string chat;                 // one user turn through the chat template
  std::string system;               // optional system message for --chat
  std::vector<std::string> stops;
  int64_t max_tokens = 16;
  SamplingOptions sampling;
  bool ignore_eos = false;
  bool json = false;
  std::string logits_out;
  int threads = 0;
  int64_t ctx = 0;
  int64_t block_size = 16;
  int64_t prefill_chunk = 512;
  std::string draft;         // speculative decoding's draft source (SpeculationParams::draft)
  int32_t draft_tokens = 4;  // most drafts a step
  std::string draft_vocab;   // a draft vocabulary file (SpeculationParams::draft_vocab)
};

int run(const RunArgs& a) {
  if (a.threads > 0) ThreadPool::set_global_threads(a.threads);
  const int given = int(!a.prompt_ids.empty()) + int(!a.prompt.empty()) + int(!a.chat.empty());
  if (given > 1) fail("[cli] run: give at most one of --prompt-ids 1,2,3, --prompt TEXT or --chat TEXT");
  const SamplingParams sampling = a.sampling.resolve(a.model);
  // No prompt: the default one, for a model with a tokenizer.
  const std::string prompt_text = given == 0 ? std::string(kDefaultPrompt) : a.prompt;
  const bool text_prompt = a.prompt_ids.empty();
  std::optional<TextModel> text;
  if (text_prompt) text.emplace(TextModel::load(a.model));
  Prompt prompt;
  if (!text_prompt) {
    prompt = Prompt::of_ids(parse_ids(a.prompt_ids, "--prompt-ids"));
  } else if (!prompt_text.empty()) {
    prompt = Prompt::of_text(prompt_text);
  } else {
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (!a.system.empty()) messages.push_back({{"role", "system"}, {"content", a.system}});
    messages.push_back({{"role", "user"}, {"content", a.chat}});
    prompt = Prompt::of_chat(messages);
  }
  if (!a.stops.empty() && !text) fail("[cli] --stop needs a text prompt (--prompt or --chat)");
  if (a.max_tokens < 0) fail("[cli] --max-tokens must be >= 0");
  // The prompt's length sizes the cache: encode it before loading weights.
  int64_t n_prompt = int64_t(prompt.ids.size());
  if (text) {
    std::vector<int32_t> ids = prompt.kind == Prompt::Kind::Text ? text->encode_prompt(prompt.text)
                                                                 : text->encode_chat(prompt.messages, true);
    if (ids.empty()) fail("[cli] run: the prompt encodes to no tokens");
    n_prompt = int64_t(ids.size());
    prompt = Prompt::of_ids(std::move(ids));
  }

  if (a.block_size < 1 || a.block_size > 4096) fail("[cli] --block-size must be in [1, 4096], got ", a.block_size);
  if (a.prefill_chunk < 1) fail("[cli] --prefill-chunk must be positive, got ", a.prefill_chunk);
  if (a.ctx < 0) fail("[cli] --ctx must be positive, got ", a.ctx);
  const Device device = a.device.empty() ? default_device() : parse_device(a.device);
  auto model = load_model(a.model, device);
  // The sequence ends where the model's positions do (finish "length"), so
  // the cache need not hold more.
  const int64_t max_position = model->info().max_position;
  if (max_position > 0 && n_prompt > max_position)
    fail("[cli] the prompt (", n_prompt, " tokens) is longer than the model's ", max_position,
         " positions (max_position_embeddings)");
  const int64_t want = n_prompt + std::min<int64_t>(a.max_tokens, int64_t(1) << 40);
  const int64_t holds = max_position > 0 ? std::min(want, max_position) : want;
  EngineOptions eo;
  eo.block_size = a.block_size;
  eo.step_tokens = a.prefill_chunk;
  eo.max_sequences = 1;
  eo.max_cached_tokens = a.ctx > 0 ? a.ctx : holds + 1;
  if (holds > eo.max_cached_tokens)
    fail("[cli] --ctx ", eo.max_cached_tokens, " cannot hold the prompt (", n_prompt, ") plus --max-tokens ",
         a.max_tokens);
  Engine engine(std::move(model), std::move(text), eo);
  const ModelInfo& info = engine.info();

  RequestParams params;
  params.max_tokens = a.max_tokens;
  params.sampling = sampling;
  params.ignore_eos = a.ignore_eos;
  params.stop = a.stops;
  params.prompt_logits = !a.logits_out.empty();
  params.speculation.draft = a.draft;
  params.speculation.k = a.draft_tokens;
  params.speculation.draft_vocab = a.draft_vocab;
  engine.prepare_speculation(params.speculation);  // not in the request's timings
  std::string out_text;
  std::vector<int32_t> ids;  // every generated id
  const bool print_text = engine.text() != nullptr && !a.json;
  const Event res = engine.run(engine.submit(prompt, params), [&](const Event& e) {
    out_text += e.text;
    ids.insert(ids.end(), e.ids.begin(), e.ids.end());
    if (print_text) {
      std::fwrite(e.text.data(), 1, e.text.size(), stdout);
    } else if (!a.json && !engine.text()) {
      for (int32_t t : e.ids) std::printf("%d ", t);
    }
    std::fflush(stdout);
  });

  if (!a.logits_out.empty()) write_safetensors(a.logits_out, {{"prompt_logits", res.prompt_logits}});
  const Timings& t = res.timings;
  const double prefill_tps = t.prefill_s > 0 ? double(t.prefill_tokens) / t.prefill_s : 0;
  const double decode_tps = t.decode_s > 0 ? double(t.decode_tokens) / t.decode_s : 0;
  if (a.json) {
    nlohmann::json out = {
        {"model", a.model},
        {"model_type", info.model_type},
        {"device", device_name(device)},
        {"prompt_ids", res.prompt_ids},
        {"ids", ids},
        {"finish_reason", finish_reason_name(res.finish)},
        {"timings",
         {{"prefill_tokens", t.prefill_tokens},
          {"prefill_s", t.prefill_s},
          {"prefill_tokens_per_s", prefill_tps},
          {"decode_tokens", t.decode_tokens},
          {"decode_s", t.decode_s},
          {"decode_tokens_per_s", decode_tps}}}};
    if (engine.text()) out["text"] = out_text;
    if (!a.draft.empty()) {
      const DraftStats& d = res.drafts;
      out["speculation"] = {{"draft", a.draft},
                            {"rounds", d.rounds},
                            {"drafted", d.drafted},
                            {"accepted", d.accepted},
                            {"full_rounds", d.full_rounds},
                            {"acceptance_rate", d.drafted > 0 ? double(d.accepted) / double(d.drafted) : 0.0},
                            {"mean_accepted_per_round", d.rounds > 0 ? double(d.accepted) / double(d.rounds) : 0.0},
                            {"tokens_per_round", d.rounds > 0 ? double(d.accepted + d.rounds) / double(d.rounds) : 0.0}};
    }
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("\n");
    std::fflush(stdout);
    std::fprintf(stderr, "prefill: %lld tokens, %.1f tok/s | decode: %lld tokens, %.1f tok/s | %s\n",
                 (long long)t.prefill_tokens, prefill_tps, (long long)t.decode_tokens, decode_tps,
                 finish_reason_name(res.finish));
    if (!a.draft.empty())
      std::fprintf(stderr, "speculation (%s): %lld of %lld drafts accepted in %lld verify steps\n", a.draft.c_str(),
                   (long long)res.drafts.accepted, (long long)res.drafts.drafted, (long long)res.drafts.rounds);
  }
  return 0;
}

}  // namespace

Handler add_run(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* cmd = app.add_subcommand("run", "Generate tokens from a prompt");
  cmd->add_option("model", a->model, "Model directory (config.json + safetensors)")->capture_default_str();
  cmd->add_option("--prompt-ids", a->prompt_ids, "Prompt as comma-separated token ids");
  cmd->add_option("-p,--prompt", a->prompt,
                  std::string("Prompt as raw text (encoded with the model's tokenizer; default \"") + kDefaultPrompt +
                      "\")");
  cmd->add_option("--chat", a->chat, "One user turn, rendered through the model's chat template");
  cmd->add_option("--system", a->system, "System message for --chat");
  cmd->add_option("--stop", a->stops, "Stop when the output contains this text (repeatable)");
  cmd->add_option("-n,--max-tokens", a->max_tokens, "Tokens to generate")->capture_default_str();
  a->sampling.add_to(cmd);
  cmd->add_flag("--ignore-eos", a->ignore_eos, "Do not stop at the model's EOS tokens");
  cmd->add_flag("--json", a->json, "Print one JSON object");
  cmd->add_option("--logits-out", a->logits_out, "Write prompt_logits [n_prompt, n_vocab] as safetensors");
  cmd->add_option("--device", a->device, "cpu | cuda (default: cuda when a GPU is present)");
  cmd->add_option("-t,--threads", a->threads, "CPU threads (default: all cores)");
  cmd->add_option("--ctx", a->ctx, "KV cache capacity in tokens (default: prompt + max tokens)");
  cmd->add_option("--block-size", a->block_size, "Tokens per KV block")->capture_default_str();
  cmd->add_option("--prefill-chunk", a->prefill_chunk, "Longest prompt chunk per forward")->capture_default_str();
  cmd->add_option("--draft", a->draft,
                  "Speculative decoding: ngram (prompt lookup), mtp (the checkpoint's MTP head) or a draft model's "
                  "directory; the output is what plain decoding gives");
  cmd->add_option("--draft-tokens", a->draft_tokens, "Most draft tokens a step")->capture_default_str();
  cmd->add_option("--draft-vocab", a->draft_vocab,
                  "Draft vocabulary (augur draft-vocab): the draft head scores only these tokens");
  return [a] { return run(*a); };
}

}  // namespace augur::cli
