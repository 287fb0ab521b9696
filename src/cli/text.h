// Text in, text out for the CLI: the checkpoint's tokenizer and chat
// template, and a sink that turns generated ids into printed text (complete
// UTF-8 only, stop strings honoured across token boundaries).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/sampler.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/stream.h"
#include "tokenizer/tokenizer.h"

namespace augur::cli {

struct TextModel {
  Tokenizer tokenizer;
  std::unique_ptr<ChatTemplate> chat;  // null when the checkpoint has no template

  // Loads tokenizer.json (and tokenizer_config.json) from `dir`; an error names
  // the directory when they are missing.
  static TextModel load(const std::string& dir);
  // Raw text as `tokenizer(text)` encodes it (special tokens added).
  std::vector<int32_t> encode_prompt(const std::string& text) const;
  // messages rendered by the chat template, then encoded without adding
  // special tokens (the template writes them), as apply_chat_template does.
  std::string render_chat(const nlohmann::ordered_json& messages, bool add_generation_prompt) const;
  std::vector<int32_t> encode_chat(const nlohmann::ordered_json& messages, bool add_generation_prompt) const;
};

// The sampling options of `run` and `chat`, registered on a subcommand; the
// ones the user leaves unset take the checkpoint's generation_config.json
// defaults (do_sample, temperature, top_k, top_p, min_p, repetition_penalty),
// as transformers' generate() does: do_sample false or absent means greedy;
// do_sample true with no top_k means top_k 50.
class SamplingOptions {
 public:
  void add_to(CLI::App* cmd, bool penalties);
  // The parameters for the model in `dir`, validated.
  SamplingParams resolve(const std::string& dir) const;

 private:
  SamplingParams p_;
  CLI::Option *temperature_ = nullptr, *top_k_ = nullptr, *top_p_ = nullptr, *min_p_ = nullptr,
              *repetition_ = nullptr;
};

// Collects the text of generated ids; optionally prints it as it completes.
class TextSink {
 public:
  TextSink(const Tokenizer& tok, std::vector<std::string> stops, bool print);
  // Returns false once a stop string has been produced (text before it kept).
  bool push(int32_t id);
  // Flushes what the decoder and stop matcher held back (unless stopped).
  void finish();
  const std::string& text() const { return text_; }
  bool stopped() const { return stopped_; }

 private:
  void emit(const std::string& piece);
  StreamDecoder decoder_;
  StopMatcher stop_;
  bool print_;
  bool stopped_ = false;
  std::string text_;
};

}  // namespace augur::cli
