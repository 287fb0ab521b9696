// End-to-end tests through the real `augur` binary: output formats, golden
// logits through --logits-out, and clear errors (non-zero exit, a message
// naming the file and the problem) on malformed checkpoints.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"

namespace augur {
namespace {

namespace fs = std::filesystem;
const std::string kData = AUGUR_TEST_DATA;
const std::string kAugur = std::string(AUGUR_BINARY_DIR) + "/bin/augur";

struct Result {
  int status;
  std::string out;  // stdout + stderr
};

// A shell command's exit status and output.
Result shell(const std::string& command) {
  std::string cmd = command + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  Result r{-1, ""};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

Result run(const std::string& args) { return shell(kAugur + " " + args); }

// A scratch model directory that starts as a copy of a fixture.
struct TempModel {
  fs::path dir;
  explicit TempModel(const std::string& family) {
    dir = fs::temp_directory_path() / ("augur_cli_" + family + "_" + std::to_string(::getpid()) + "_" +
                                       std::to_string(counter()++));
    fs::create_directories(dir);
    for (const char* f : {"config.json", "generation_config.json", "model.safetensors"})
      fs::copy_file(fs::path(kData) / family / f, dir / f);
    fs::permissions(dir / "model.safetensors", fs::perms::owner_write, fs::perm_options::add);
    fs::permissions(dir / "config.json", fs::perms::owner_write, fs::perm_options::add);
  }
  ~TempModel() { fs::remove_all(dir); }
  static int& counter() {
    static int c = 0;
    return c;
  }
  std::string path() const { return dir.string(); }
  void write(const std::string& name, const std::string& bytes) const {
    std::ofstream(dir / name, std::ios::binary) << bytes;
  }
  std::string read(const std::string& name) const {
    std::ifstream in(dir / name, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
};

// Rebuilds model.safetensors with its header JSON edited by `edit`.
void edit_header(const TempModel& m, const std::function<void(nlohmann::json&)>& edit,
                 const std::string& extra_bytes = "") {
  std::string bytes = m.read("model.safetensors");
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  auto header = nlohmann::json::parse(bytes.substr(8, n));
  std::string data = bytes.substr(8 + n);
  edit(header);
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  uint64_t hn = h.size();
  std::string out(reinterpret_cast<const char*>(&hn), 8);
  m.write("model.safetensors", out + h + data + extra_bytes);
}

void expect_error(const Result& r, std::initializer_list<std::string> parts) {
  EXPECT_NE(r.status, 0) << r.out;
  for (const auto& p : parts) EXPECT_NE(r.out.find(p), std::string::npos) << "missing '" << p << "' in: " << r.out;
  EXPECT_EQ(r.out.find("internal error"), std::string::npos) << r.out;
}

TEST(Cli, RunJsonHasIdsAndTimings) {
  Result r = run("run " + kData + "/qwen3 --prompt-ids 175,196,25,502,67,211,407,103,348,185,398 -n 12 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(j["prompt_ids"].size(), 11u);
  // The reference greedy continuation (reference.safetensors greedy_0).
  EXPECT_EQ(j["ids"], nlohmann::json({243, 174, 174, 174, 243, 243, 243, 243, 94, 94, 94, 94}));
  EXPECT_GT(j["timings"]["prefill_tokens_per_s"].get<double>(), 0);
  EXPECT_GT(j["timings"]["decode_tokens_per_s"].get<double>(), 0);
}

std::vector<int32_t> tiny_ids(const std::string& name) {
  auto ref = SafetensorsFile::open(kData + "/augur_tiny/reference.safetensors");
  Tensor t = ref->tensor(*ref->find(name));
  return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel());
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) {
    if (!s.empty()) s += ',';
    s += std::to_string(id);
  }
  return s;
}

// The default model is augur-tiny (models/augur-tiny): greedy from held-out
// text gives transformers' continuation.
TEST(Cli, RunDefaultsToAugurTiny) {
  Result r = run("run --prompt-ids " + join_ids(tiny_ids("greedy_prompt")) +
                 " -n 24 --temperature 0 --ignore-eos --json");
  ASSERT_EQ(r.status, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["model_type"], "qwen3_5_text");
  EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(), tiny_ids("greedy_0"));
}

// A bare `augur run`: the default model, the default prompt, and the
// checkpoint's sampling defaults (generation_config.json: do_sample,
// temperature 0.8, top_k 40, top_p 0.95) unless options override them.
TEST(Cli, BareRunSamplesTextWithTheCheckpointDefaults) {
  Result r = run("run -n 24");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("decode: "), std::string::npos) << r.out;
  Result a = run("run -n 24 --seed 1 --json"), b = run("run -n 24 --seed 2 --json");
  Result g1 = run("run -n 24 --seed 1 --temperature 0 --json"), g2 = run("run -n 24 --seed 2 --temperature 0 --json");
  ASSERT_EQ(a.status, 0) << a.out;
  const auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
  EXPECT_GT(ja["text"].get<std::string>().size(), 40u) << a.out;
  EXPECT_NE(ja["ids"], jb["ids"]);  // sampled: the seed matters
  EXPECT_EQ(nlohmann::json::parse(g1.out)["ids"], nlohmann::json::parse(g2.out)["ids"]);  // greedy: it does not
  EXPECT_EQ(ja["prompt_ids"], nlohmann::json::parse(g1.out)["prompt_ids"]);
}

TEST(Cli, PerplexityOfHeldOutText) {
  const nlohmann::json ref = nlohmann::json::parse(std::ifstream(kData + "/augur_tiny/tokenizer_reference.json"));
  const fs::path file = fs::temp_directory_path() / ("augur_ppl_" + std::to_string(::getpid()) + ".txt");
  std::ofstream(file, std::ios::binary) << ref["text"].get<std::string>();
  Result r = run("perplexity -f " + file.string() + " --json");
  ASSERT_EQ(r.status, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["text_tokens"], ref["ids"].size());
  EXPECT_EQ(j["tokens"], ref["ids"].size() - 1);
  EXPECT_EQ(j["windows"], 1);
  // A trained model: far better than chance (8192), in the range of its
  // held-out perplexity (60).
  EXPECT_GT(j["ppl"].get<double>(), 5.0);
  EXPECT_LT(j["ppl"].get<double>(), 400.0);
  EXPECT_NEAR(std::log(j["ppl"].get<double>()), j["mean_nll"].get<double>(), 1e-9);
  Result w = run("perplexity -f " + file.string() + " --window 100 --max-windows 3 --json");
  ASSERT_EQ(w.status, 0) << w.out;
  EXPECT_EQ(nlohmann::json::parse(w.out)["windows"], 3);
  EXPECT_EQ(nlohmann::json::parse(w.out)["tokens"], 300);
  expect_error(run("perplexity -f /nonexistent/text.txt"), {"/nonexistent/text.txt"});
  expect_error(run("perplexity -f " + file.string() + " --window 0"), {"--window"});
  // A window beyond the model's 2048 positions: refused before any forward.
  const fs::path longer = fs::temp_directory_path() / ("augur_ppl_long_" + std::to_string(::getpid()) + ".txt");
  {
    std::ofstream f(longer);
    for (int i = 0; i < 800; ++i) f << "The river runs to the sea. ";
  }
  expect_error(run("perplexity -f " + longer.string() + " --window 2500"), {"--window 2500", "2048 positions"});
  fs::remove(longer);
  fs::remove(file);
}

TEST(Cli, LogitsOutMatchesTheReference) {
  const fs::path out = fs::temp_directory_path() / ("augur_logits_" + std::to_string(::getpid()) + ".safetensors");
  Result r = run("run " + kData + "/llama --prompt-ids 185,398,23,72 -n 1 --logits-out " + out.string());
  ASSERT_EQ(r.status, 0) << r.out;
  auto got_file = SafetensorsFile::open(out.string());
  auto ref_file = SafetensorsFile::open(kData + "/llama/reference.safetensors");
  Tensor got = got_file->tensor(*got_file->find("prompt_logits"));
  Tensor want = ref_file->tensor(*ref_file->find("logits_1"));
  ASSERT_EQ(got.shape(), want.shape());
  for (int64_t i = 0; i < want.numel(); ++i) ASSERT_NEAR(got.data<float>()[i], want.data<float>()[i], 1e-3f) << i;
  fs::remove(out);
}

TEST(Cli, SamplingIsReproducibleWithASeed) {
  const std::string args = "run --prompt-ids 1,2,3 -n 16 --temperature 0.9 --top-p 0.95 --top-k 50 --seed 5 --json";
  Result a = run(args), b = run(args);
  ASSERT_EQ(a.status, 0) << a.out;
  EXPECT_EQ(nlohmann::json::parse(a.out)["ids"], nlohmann::json::parse(b.out)["ids"]);
}

TEST(Cli, InspectReportsArchitectureAndMemory) {
  Result r = run("inspect " + kData + "/qwen3 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["model_type"], "qwen3");
  EXPECT_EQ(j["architecture"], "Qwen3ForCausalLM");
  EXPECT_EQ(j["n_layer"], 2);
  EXPECT_GT(j["n_params"].get<int64_t>(), 0);
  EXPECT_EQ(j["dtypes"]["BF16"]["tensors"], 24);
  EXPECT_EQ(j["recurrent_bytes_per_sequence"], 0);
  Result hybrid = run("inspect " + kData + "/qwen3_5 --json");
  ASSERT_EQ(hybrid.status, 0) << hybrid.out;
  auto h = nlohmann::json::parse(hybrid.out);
  EXPECT_EQ(h["recurrent_layers"], 3);
  // 3 layers x (conv tail 3 x 128 channels + 4 heads x 16 x 16 state) x 4
  // bytes, and each layer's input history: 8 positions of 128 conv inputs + b, a.
  EXPECT_EQ(h["recurrent_bytes_per_sequence"], 3 * (3 * 128 + 4 * 16 * 16) * 4 + 3 * 8 * (128 + 2 * 4) * 4);
  Result text = run("inspect " + kData + "/llama");
  EXPECT_EQ(text.status, 0);
  EXPECT_NE(text.out.find("LlamaForCausalLM"), std::string::npos);
}

TEST(Cli, BadArgumentsAreClearErrors) {
  expect_error(run("run --prompt-ids 1,x,3"), {"--prompt-ids", "'x'"});
  expect_error(run("run --prompt-ids 1,2 --top-p 0"), {"top_p"});
  expect_error(run("run --prompt-ids 1,99999"), {"99999", "vocabulary"});
  expect_error(run("run /nonexistent/model --prompt-ids 1"), {"/nonexistent/model"});
  expect_error(run("bench --synthetic nope"), {"nope", "qwen3-0.6b"});
  expect_error(run("bench"), {"--synthetic"});
  expect_error(run("bench " + kData + "/qwen3 --synthetic qwen3-0.6b"), {"one of them"});
  expect_error(run("run " + kData + "/qwen3 --prompt-ids 1,2 --block-size 0"), {"--block-size"});
  expect_error(run("run " + kData + "/qwen3 --prompt-ids 1,2 -t 100000"), {"100000 threads"});
  expect_error(run("run " + kData + "/qwen3 --prompt-ids 1,2 --block-size -3"), {"--block-size"});
  // A draft source that is none fails before anything is measured; the MTP
  // head a checkpoint lacks, once it is loaded, before any prefill is timed.
  Result r = run("bench --synthetic qwen3-0.6b --device cpu --draft /nonexistent/draft");
  expect_error(r, {"/nonexistent/draft", "ngram, mtp, replay"});
  EXPECT_EQ(r.out.find("measuring"), std::string::npos) << r.out;
  r = run("bench " + kData + "/qwen3 --device cpu --prompt 8 --gen 2 --draft mtp");
  expect_error(r, {"'mtp'", "qwen3", "no MTP head"});
  EXPECT_EQ(r.out.find("prefill"), std::string::npos) << r.out;
}

// run --draft ngram prints plain greedy's ids and what speculation did.
TEST(Cli, RunWithNgramDraftsEqualsPlainGreedy) {
  const std::string args = "run " + kData + "/qwen3 --prompt-ids 5,6,7,5,6,7,5,6 -n 40 --ignore-eos --json";
  Result plain = run(args + " --temperature 0"), spec = run(args + " --temperature 0 --draft ngram --draft-tokens 3");
  ASSERT_EQ(plain.status, 0) << plain.out;
  ASSERT_EQ(spec.status, 0) << spec.out;
  auto p = nlohmann::json::parse(plain.out), s = nlohmann::json::parse(spec.out);
  EXPECT_EQ(s["ids"], p["ids"]);
  EXPECT_EQ(s["speculation"]["draft"], "ngram");
  EXPECT_GT(s["speculation"]["rounds"].get<int64_t>(), 0);
  EXPECT_LE(s["speculation"]["accepted"].get<int64_t>(), s["speculation"]["drafted"].get<int64_t>());
  expect_error(run(args + " --temperature 0 --draft nope"), {"nope"});
  expect_error(run(args + " --temperature 0 --draft ngram --draft-tokens 0"), {"draft tokens"});
}

// serve with a draft source it cannot make says so and exits before it
// listens, rather than failing every request (`timeout`: a server that
// started would not end).
TEST(Cli, ServeRefusesABadDraftAtStart) {
  const std::string serve = "timeout 120 " + kAugur + " serve --device cpu --port 0 --no-warmup";
  for (const auto& [flags, named] : {std::pair<std::string, std::string>{"--draft /no/such/dir", "/no/such/dir"},
                                     {"--draft mtp --draft-vocab /nonexistent/vocab", "/nonexistent/vocab"},
                                     {"--draft ngram --draft-tokens 99", "draft tokens"}}) {
    const Result r = shell(serve + " " + flags);
    expect_error(r, {named});
    EXPECT_NE(r.status, 124) << "still serving after 120 s: " << r.out;
    EXPECT_EQ(r.out.find("listening"), std::string::npos) << r.out;
  }
}

// run --draft mtp (augur-tiny's trained head), alone and with a draft
// vocabulary that draft-vocab derives from a text: plain greedy's ids; and
// perplexity reports how often the head agrees with the model.
TEST(Cli, RunWithMtpDraftsAndADraftVocabularyEqualsPlainGreedy) {
  const nlohmann::json ref = nlohmann::json::parse(std::ifstream(kData + "/augur_tiny/tokenizer_reference.json"));
  const fs::path corpus = fs::temp_directory_path() / ("augur_corpus_" + std::to_string(::getpid()) + ".txt");
  const fs::path vocab = fs::temp_directory_path() / ("augur_vocab_" + std::to_string(::getpid()) + ".txt");
  std::ofstream(corpus, std::ios::binary) << ref["text"].get<std::string>();
  Result v = run("draft-vocab -f " + corpus.string() + " -n 200 -o " + vocab.string());
  ASSERT_EQ(v.status, 0) << v.out;
  std::ifstream in(vocab);
  int64_t lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  EXPECT_EQ(lines, 200);
  const std::string args = "run -p 'It was a cold morning, and' -n 48 --temperature 0 --ignore-eos --json";
  Result plain = run(args), mtp = run(args + " --draft mtp --draft-tokens 2"),
         cut = run(args + " --draft mtp --draft-tokens 2 --draft-vocab " + vocab.string());
  ASSERT_EQ(plain.status, 0) << plain.out;
  ASSERT_EQ(mtp.status, 0) << mtp.out;
  ASSERT_EQ(cut.status, 0) << cut.out;
  const auto p = nlohmann::json::parse(plain.out), m = nlohmann::json::parse(mtp.out),
             c = nlohmann::json::parse(cut.out);
  EXPECT_EQ(m["ids"], p["ids"]);
  EXPECT_EQ(c["ids"], p["ids"]);
  EXPECT_EQ(m["speculation"]["draft"], "mtp");
  EXPECT_GT(m["speculation"]["accepted"].get<int64_t>(), 0);
  EXPECT_GT(c["speculation"]["accepted"].get<int64_t>(), 0);
  Result ppl = run("perplexity -f " + corpus.string() + " --json");
  ASSERT_EQ(ppl.status, 0) << ppl.out;
  const auto j = nlohmann::json::parse(ppl.out);
  EXPECT_GT(j["mtp"]["rate"].get<double>(), 0.2);
  EXPECT_EQ(j["mtp"]["positions"], ref["ids"].size() - 2);
  expect_error(run(args + " --draft ngram --draft-vocab " + vocab.string()), {"draft vocabulary", "ngram"});
  expect_error(run(args + " --draft mtp --draft-vocab /nonexistent/vocab"), {"/nonexistent/vocab"});
  expect_error(run("run " + kData + "/llama --prompt-ids 1,2 --draft mtp"), {"no MTP head"});
  fs::remove(corpus);
  fs::remove(vocab);
}

// bench --draft replay: on the CPU every replayed draft is accepted, so each
// step makes 1 + k tokens a row.
TEST(Cli, BenchReplayDraftsAreAllAccepted) {
  Result r = run("bench " + kData + "/qwen3_5 --device cpu --prompt 8 --gen 4 --batch 2 -t 1 --draft replay --draft-tokens 3 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const size_t at = r.out.rfind("\n{");
  ASSERT_NE(at, std::string::npos) << r.out;
  auto j = nlohmann::json::parse(r.out.substr(at + 1));
  EXPECT_EQ(j["draft"]["source"], "replay");
  EXPECT_DOUBLE_EQ(j["decode"][0]["tokens_per_step"].get<double>(), 4.0);
}

// bench on a checkpoint: batch 2 decodes both rows together after both prefill.
TEST(Cli, BenchMeasuresACheckpoint) {
  Result r = run("bench " + kData + "/qwen3_5 --device cpu --prompt 8 --gen 3 --batch 1,2 -t 1 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const size_t at = r.out.rfind("\n{");  // the JSON line, after the progress lines
  ASSERT_NE(at, std::string::npos) << r.out;
  auto j = nlohmann::json::parse(r.out.substr(at + 1));
  EXPECT_EQ(j["model"], kData + "/qwen3_5");
  ASSERT_EQ(j["decode"].size(), 2u);
  EXPECT_EQ(j["decode"][1]["batch"], 2);
  for (const auto& d : j["decode"]) EXPECT_GT(d["tokens_per_s"].get<double>(), 0.0);
  // Prefill against the measured matrix-product peak.
  EXPECT_GT(j["gemm_peak_tflops"].get<double>(), 0.0);
  const double fraction = j["prefill"][0]["fraction_of_gemm_peak"].get<double>();
  EXPECT_GT(fraction, 0.0);
  EXPECT_DOUBLE_EQ(fraction, j["prefill"][0]["tflops"].get<double>() / j["gemm_peak_tflops"].get<double>());
}

// quantize writes mlx-lm's layout, which run, inspect and the tokenizer's
// text path load; the quantized model's MTP drafts stay exact; bad bits,
// a quantized input and a used output directory are errors.
TEST(Cli, QuantizeThenRunTheQuantizedCheckpoint) {
  const std::string kTiny = kData + "/../../models/augur-tiny";
  const fs::path out = fs::temp_directory_path() / ("augur_cli_q_" + std::to_string(::getpid()));
  fs::remove_all(out);
  Result q = run("quantize " + kTiny + " " + out.string() + " --bits 4 --group-size 64");
  ASSERT_EQ(q.status, 0) << q.out;
  EXPECT_NE(q.out.find("at 4 bits in groups of 64"), std::string::npos) << q.out;
  EXPECT_NE(q.out.find("quantizing: "), std::string::npos) << q.out;  // progress
  const auto cfg = nlohmann::json::parse(std::ifstream(out / "config.json"));
  EXPECT_EQ(cfg["quantization"]["bits"], 4);
  EXPECT_TRUE(fs::exists(out / "tokenizer.json"));
  EXPECT_LT(fs::file_size(out / "model.safetensors"), fs::file_size(fs::path(kTiny) / "model.safetensors") / 3);
  Result plain = run("run " + out.string() + " --device cpu -p 'The river' -n 24 --temperature 0 --ignore-eos --json");
  ASSERT_EQ(plain.status, 0) << plain.out;
  Result spec =
      run("run " + out.string() + " --device cpu -p 'The river' -n 24 --temperature 0 --ignore-eos --json --draft mtp");
  ASSERT_EQ(spec.status, 0) << spec.out;
  auto ids = [](const std::string& o) { return nlohmann::json::parse(o.substr(o.rfind("\n{") + 1))["ids"]; };
  EXPECT_EQ(ids(plain.out), ids(spec.out));
  Result inspect = run("inspect " + out.string());
  EXPECT_EQ(inspect.status, 0) << inspect.out;
  EXPECT_NE(inspect.out.find("U32"), std::string::npos) << inspect.out;
  EXPECT_NE(inspect.out.find("affine, 4 bits in groups of 64"), std::string::npos) << inspect.out;
  Result again = run("quantize " + out.string() + " " + out.string() + "_2");
  EXPECT_NE(again.status, 0);
  EXPECT_NE(again.out.find("quantized already"), std::string::npos) << again.out;
  Result used = run("quantize " + kTiny + " " + out.string());
  EXPECT_NE(used.status, 0);
  EXPECT_NE(used.out.find("holds a checkpoint already"), std::string::npos) << used.out;
  Result bits = run("quantize " + kTiny + " " + out.string() + "_3 --bits 7");
  EXPECT_NE(bits.status, 0);
  EXPECT_NE(bits.out.find("7 bits"), std::string::npos) << bits.out;
  fs::remove_all(out);
  fs::remove_all(out.string() + "_2");
  fs::remove_all(out.string() + "_3");
}

// --- malformed checkpoints: each exits non-zero naming the file and problem ---

TEST(CliMalformed, HeaderLengthBeyondFile) {
  TempModel m("qwen3");
  std::string bytes = m.read("model.safetensors");
  uint64_t huge = 9000000000000000000ull;
  std::memcpy(bytes.data(), &huge, 8);
  m.write("model.safetensors", bytes);
  expect_error(run("run " + m.path() + " --prompt-ids 1"), {"model.safetensors", "header length"});
}

TEST(CliMalformed, BadJson) {
  TempModel m("qwen3");
  std::string bytes = m.read("model.safetensors");
  bytes[9] = '#';
  m.write("model.safetensors", bytes);
  expect_error(run("run " + m.path() + " --prompt-ids 1"), {"model.safetensors", "JSON"});
}

TEST(CliMalformed, OffsetsOutsideTheData) {
  TempModel m("qwen3");
  edit_header(m, [](nlohmann::json& h) { h["model.norm.weight"]["data_offsets"][1] = 1u << 30; });
  expect_error(run("run " + m.path() + " --prompt-ids 1"), {"model.safetensors", "model.norm.weight"});
}

TEST(CliMalformed, OverlappingTensors) {
  TempModel m("qwen3");
  edit_header(m, [](nlohmann::json& h) {
    h["model.norm.weight"]["data_offsets"] = h["model.layers.0.input_layernorm.weight"]["data_offsets"];
  });
  expect_error(run("run " + m.path() + " --prompt-ids 1"), {"model.safetensors", "overlap"});
}

TEST(CliMalformed, SizeNotMatchingShape) {
  TempModel m("qwen3");
  edit_header(m, [](nlohmann::json& h) { h["model.norm.weight"]["shape"] = {65}; });
  expect_error(run("run " + m.path() + " --prompt-ids 1"), {"model.safetensors", "model.norm.weight"});
}

TEST(CliMalformed, DuplicateNames) {
  TempModel m("qwen3");
  std::string bytes = m.read("model.safetensors");
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  std::string header = bytes.substr(8, n);
  // Repeat the first entry under the same name, by text (JSON objects can't).
  const size_t start = header.find('"', 1);
  const size_t end = header.find('}', start) + 1;
  std::string entry = header.substr(start, end - start);
  header.insert(start, entry + ",");
  while (header.size() % 8) header += ' ';
  uint64_t hn = header.size();
  m.write("model.safetensors", std::string(reinterpret_cast<const char*>(&hn), 8) + header + bytes.substr(8 + n));
  expect_error(run("run " + m.path() + " --prompt-ids 1"), {"model.safetensors", "duplicate"});
}

TEST(CliMalformed, WrongShapeForTheModel) {
  TempModel m("qwen3");
  nlohmann::json cfg = nlohmann::json::parse(m.read("config.json"));
  cfg["intermediate_size"] = 96;
  m.write("config.json", cfg.dump());
  expect_error(run("run " + m.path() + " --prompt-ids 1"), {"gate_proj", "shape"});
}

TEST(CliMalformed, MissingShard) {
  TempModel m("qwen3");
  fs::rename(m.dir / "model.safetensors", m.dir / "model-00001-of-00002.safetensors");
  nlohmann::json index = {{"metadata", nlohmann::json::object()}, {"weight_map", nlohmann::json::object()}};
  auto f = SafetensorsFile::open((m.dir / "model-00001-of-00002.safetensors").string());
  for (const auto& t : f->tensors()) index["weight_map"][t.name] = "model-00001-of-00002.safetensors";
  index["weight_map"]["lm_head.weight"] = "model-00002-of-00002.safetensors";
  m.write("model.safetensors.index.json", index.dump());
  expect_error(run("run " + m.path() + " --prompt-ids 1"), {"model-00002-of-00002.safetensors"});
}

TEST(CliMalformed, UnknownModelTypeListsSupported) {
  TempModel m("qwen3");
  nlohmann::json cfg = nlohmann::json::parse(m.read("config.json"));
  cfg["model_type"] = "mamba9";
  m.write("config.json", cfg.dump());
  expect_error(run("run " + m.path() + " --prompt-ids 1"), {"config.json", "mamba9", "llama", "qwen3"});
}

// A request ends where the model's positions do: finish "length" with the
// tokens plain greedy decoding gives up to there; a prompt longer than the
// positions is an error naming them.
TEST(Cli, GenerationEndsAtTheModelsLastPosition) {
  TempModel m("qwen3");
  nlohmann::json cfg = nlohmann::json::parse(m.read("config.json"));
  cfg["max_position_embeddings"] = 16;
  m.write("config.json", cfg.dump());
  const std::string ids = "175,196,25,502,67,211,407,103,348,185";
  Result r = run("run " + m.path() + " --prompt-ids " + ids + " -n 40 --ignore-eos --json");
  ASSERT_EQ(r.status, 0) << r.out;
  auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(j["finish_reason"], "length");
  ASSERT_EQ(j["ids"].size(), 6u);
  Result full = run("run " + kData + "/qwen3 --prompt-ids " + ids + " -n 6 --ignore-eos --json");
  ASSERT_EQ(full.status, 0) << full.out;
  EXPECT_EQ(j["ids"], nlohmann::json::parse(full.out.substr(full.out.find('{')))["ids"]);
  expect_error(run("run " + m.path() + " --prompt-ids " + ids + "," + ids + " -n 2"), {"20 tokens", "16 positions"});
}

TEST(CliMalformed, RopeFactorMustBePositive) {
  TempModel m("qwen3");
  nlohmann::json cfg = nlohmann::json::parse(m.read("config.json"));
  cfg["rope_parameters"]["rope_type"] = "linear";
  cfg["rope_parameters"]["factor"] = 0;
  m.write("config.json", cfg.dump());
  expect_error(run("run " + m.path() + " --prompt-ids 1"), {"config.json", "factor", "positive"});
}

// mlx's affine quantization loads (Cli.QuantizeThenRunTheQuantizedCheckpoint);
// other quantizers are named errors.
TEST(CliMalformed, UnsupportedQuantizationIsNamed) {
  TempModel m("qwen3");
  nlohmann::json cfg = nlohmann::json::parse(m.read("config.json"));
  cfg["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}};
  m.write("config.json", cfg.dump());
  expect_error(run("run " + m.path() + " --prompt-ids 1"), {"config.json", "quant_method", "gptq"});
  cfg.erase("quantization_config");
  cfg["quantization"] = {{"group_size", 32}, {"bits", 4}, {"mode", "mxfp4"}};
  m.write("config.json", cfg.dump());
  expect_error(run("run " + m.path() + " --prompt-ids 1"), {"config.json", "quantization.mode", "mxfp4"});
}

TEST(CliMalformed, MissingOrContradictoryConfigField) {
  TempModel m("qwen3");
  nlohmann::json cfg = nlohmann::json::parse(m.read("config.json"));
  cfg.erase("hidden_size");
  m.write("config.json", cfg.dump());
  expect_error(run("run " + m.path() + " --prompt-ids 1"), {"config.json", "hidden_size"});
  cfg = nlohmann::json::parse(TempModel("qwen3").read("config.json"));
  cfg["num_key_value_heads"] = 3;
  m.write("config.json", cfg.dump());
  expect_error(run("run " + m.path() + " --prompt-ids 1"), {"config.json", "num_key_value_heads"});
}

TEST(CliMalformed, TruncatedFile) {
  TempModel m("qwen3");
  std::string bytes = m.read("model.safetensors");
  m.write("model.safetensors", bytes.substr(0, bytes.size() / 2));
  expect_error(run("run " + m.path() + " --prompt-ids 1"), {"model.safetensors"});
}

}  // namespace
}  // namespace augur
