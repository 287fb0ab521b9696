#include "tokenizer/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/decoder.h"
#include "tokenizer/model.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace augur {

namespace {

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("[tokenizer] ", path.string(), ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    fail("[tokenizer] ", path.string(), ": invalid JSON: ", e.what());
  }
}

}  // namespace

Tokenizer Tokenizer::load(const std::string& dir_or_file) {
  namespace fs = std::filesystem;
  fs::path file = dir_or_file;
  if (fs::is_directory(file)) file /= "tokenizer.json";
  if (!fs::exists(file)) fail("[tokenizer] ", file.string(), ": no such file");
  const fs::path config_path = file.parent_path() / "tokenizer_config.json";
  nlohmann::json config = nlohmann::json::object();
  if (fs::exists(config_path)) config = read_json(config_path);
  return from_json(read_json(file), std::move(config), file.string());
}

Tokenizer Tokenizer::from_json(const nlohmann::json& j, nlohmann::json config,
                               const std::string& name) {
  auto impl = std::make_shared<Impl>();
  impl->path = name;
  impl->where = "[tokenizer] " + name;
  impl->config = config.is_object() ? std::move(config) : nlohmann::json::object();
  const std::string& where = impl->where;
  try {
    if (!j.is_object()) fail(where, ": not a JSON object");
    auto part = [&](const char* key) -> const nlohmann::json& {
      static const nlohmann::json null_json;
      auto it = j.find(key);
      return it == j.end() ? null_json : *it;
    };
    if (part("model").is_null()) fail(where, ": no model");
    impl->normalizer = tok::make_normalizer(part("normalizer"), where);
    impl->pre_tokenizer = tok::make_pre_tokenizer(part("pre_tokenizer"), where);
    impl->model = tok::make_model(part("model"), where);
    impl->post_processor = tok::make_post_processor(part("post_processor"), where);
    impl->decoder = tok::make_decoder(part("decoder"), where);
    impl->added.load(part("added_tokens"), impl->normalizer.get(), where);
  } catch (const nlohmann::json::exception& e) {
    fail(where, ": malformed: ", e.what());
  }
  impl->vocab_size = impl->model->id_limit();
  for (const auto& t : impl->added.tokens()) {
    impl->vocab_size = std::max(impl->vocab_size, size_t(t.id) + 1);
  }
  return Tokenizer(std::move(impl));
}

void Tokenizer::Impl::encode_text(std::string_view text, bool at_origin,
                                  std::vector<int32_t>& ids) const {
  auto model_sink = [&](tok::Piece p) { model->tokenize(p.text, ids); };
  auto on_text = [&](size_t start, size_t end) {
    const tok::Piece piece{text.substr(start, end - start), at_origin && start == 0};
    if (pre_tokenizer) {
      pre_tokenizer->pre_tokenize(piece, model_sink);
    } else {
      model_sink(piece);
    }
  };
  added.split(text, true, on_text, [&](int32_t id) { ids.push_back(id); });
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& im = *impl_;
  const size_t bad = tok::find_invalid_utf8(text);
  if (bad != std::string_view::npos) {
    fail(im.where, ": encode: input is not valid UTF-8 (byte ", bad, ")");
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  // HF AddedVocabulary::extract_and_normalize: tokens matched on the raw
  // text first; each stretch between them is normalized on its own, then
  // searched for tokens that match normalized text.
  im.added.split(
      text, false,
      [&](size_t start, size_t end) {
        const std::string_view raw = text.substr(start, end - start);
        if (!im.normalizer) {
          im.encode_text(raw, start == 0, ids);
          return;
        }
        std::string normalized(raw);
        im.normalizer->normalize(normalized);
        if (!normalized.empty()) im.encode_text(normalized, start == 0, ids);
      },
      [&](int32_t id) { ids.push_back(id); });
  if (im.post_processor) im.post_processor->process(ids, add_special_tokens);
  return ids;
}

bool Tokenizer::Impl::token_text(int32_t id, bool skip_special, std::string_view& text) const {
  if (const tok::AddedToken* t = added.by_id(id)) {
    if (skip_special && t->special) return false;
    text = t->surface;
    return true;
  }
  return model->id_to_token(id, text);
}

std::string Tokenizer::Impl::decode_tokens(std::vector<std::string>& tokens, bool lossy) const {
  std::string out;
  if (!decoder) {
    // HF joins with spaces when there is no decoder.
    for (size_t k = 0; k < tokens.size(); ++k) {
      if (k) out += ' ';
      out += tokens[k];
    }
    return out;
  }
  if (lossy) {
    decoder->decode_chain(tokens);
  } else {
    decoder->decode_bytes(tokens);
  }
  for (const std::string& t : tokens) out += t;
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  std::string_view text;
  for (int32_t id : ids) {
    if (impl_->token_text(id, skip_special_tokens, text)) tokens.emplace_back(text);
  }
  return impl_->decode_tokens(tokens);
}

int32_t Tokenizer::token_to_id(std::string_view token) const {
  const int32_t id = impl_->added.find(token);
  return id >= 0 ? id : impl_->model->token_to_id(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  std::string_view text;
  return impl_->token_text(id, false, text) ? std::string(text) : std::string();
}

std::string Tokenizer::token_bytes(int32_t id) const {
  std::string_view text;
  if (!impl_->token_text(id, false, text)) return {};
  if (!impl_->decoder) return std::string(text);  // decode() joins such tokens with spaces
  // Decoded after a copy of itself, less that copy's bytes: decoders that
  // treat the text's first token apart (Metaspace, Strip) see it mid-text.
  std::vector<std::string> one{std::string(text)}, two{std::string(text), std::string(text)};
  const std::string a = impl_->decode_tokens(one, false), b = impl_->decode_tokens(two, false);
  return b.starts_with(a) ? b.substr(a.size()) : a;
}

size_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

bool Tokenizer::is_special(int32_t id) const {
  const tok::AddedToken* t = impl_->added.by_id(id);
  return t && t->special;
}

const nlohmann::json& Tokenizer::config() const { return impl_->config; }

const std::string& Tokenizer::path() const { return impl_->path; }

}  // namespace augur
