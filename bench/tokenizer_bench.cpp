// Tokenizer throughput on Moby Dick (~1.2 MB of English), single-threaded.
// Data: scripts/fetch_tokenizers.sh.
//
//   tokenizer_bench --benchmark_filter=Encode
//
// BM_Encode/<family> encodes the whole book per iteration; the BPE word
// cache is warm after the first. BM_EncodeCold uses a fresh tokenizer
// instance (and so an empty cache) each iteration, loading excluded.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "tokenizer/stream.h"
#include "tokenizer/tokenizer.h"

namespace {

const std::string kData = std::string(AUGUR_TEST_DATA) + "/tokenizers";

const std::string& book() {
  static const std::string text = [] {
    std::ifstream in(kData + "/moby_dick.txt", std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }();
  return text;
}

const augur::Tokenizer* family(const std::string& name) {
  static std::map<std::string, std::unique_ptr<augur::Tokenizer>> cache;
  auto& slot = cache[name];
  if (!slot) slot = std::make_unique<augur::Tokenizer>(augur::Tokenizer::load(kData + "/" + name));
  return slot.get();
}

bool have_data(benchmark::State& state, const std::string& name) {
  if (book().empty() || !std::ifstream(kData + "/" + name + "/tokenizer.json")) {
    state.SkipWithError("tokenizer data missing: run scripts/fetch_tokenizers.sh");
    return false;
  }
  return true;
}

void BM_Encode(benchmark::State& state, const std::string& name) {
  if (!have_data(state, name)) return;
  const augur::Tokenizer& tok = *family(name);
  const std::string& text = book();
  size_t n_tokens = 0;
  for (auto _ : state) {
    auto ids = tok.encode(text);
    n_tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(text.size()));
  state.counters["tokens"] = double(n_tokens);
}

void BM_EncodeCold(benchmark::State& state, const std::string& name) {
  if (!have_data(state, name)) return;
  const std::string& text = book();
  for (auto _ : state) {
    state.PauseTiming();
    // A new instance starts with an empty word cache.
    auto tok = augur::Tokenizer::load(kData + "/" + name);
    state.ResumeTiming();
    auto ids = tok.encode(text);
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(text.size()));
}

void BM_Decode(benchmark::State& state, const std::string& name) {
  if (!have_data(state, name)) return;
  const augur::Tokenizer& tok = *family(name);
  const auto ids = tok.encode(book());
  for (auto _ : state) {
    auto text = tok.decode(ids);
    benchmark::DoNotOptimize(text.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(book().size()));
}

void BM_StreamDecode(benchmark::State& state, const std::string& name) {
  if (!have_data(state, name)) return;
  const augur::Tokenizer& tok = *family(name);
  const auto ids = tok.encode(book().substr(0, 100000));
  for (auto _ : state) {
    augur::StreamDecoder stream(tok);
    size_t n = 0;
    for (int32_t id : ids) n += stream.push(id).size();
    n += stream.flush().size();
    benchmark::DoNotOptimize(n);
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * int64_t(ids.size()));
}

}  // namespace

BENCHMARK_CAPTURE(BM_Encode, qwen3, std::string("qwen3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, llama3, std::string("llama3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, deepseek_v3, std::string("deepseek_v3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, gemma3, std::string("gemma3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeCold, qwen3, std::string("qwen3"))
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5);
BENCHMARK_CAPTURE(BM_Decode, qwen3, std::string("qwen3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_StreamDecode, qwen3, std::string("qwen3"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_StreamDecode, gemma3, std::string("gemma3"))->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
