// Shared by the tokenizer tests: the real tokenizers fetched by
// scripts/fetch_tokenizers.sh, loaded once per process.
#pragma once

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace augur::test {

inline const char* const kFamilies[] = {"qwen3", "llama3", "deepseek_v3", "gemma3"};
// The families whose decoder is byte-level, so decode(encode(s)) == s.
inline const char* const kByteLevelFamilies[] = {"qwen3", "llama3", "deepseek_v3"};

inline std::string tokenizers_dir() { return std::string(AUGUR_TEST_DATA) + "/tokenizers"; }

// A missing download fails the test (with the way to fix it) rather than
// skipping it.
inline const Tokenizer& family(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return *it->second;
  const std::string dir = tokenizers_dir() + "/" + name;
  if (!std::filesystem::exists(dir + "/tokenizer.json")) {
    throw std::runtime_error("tokenizer data missing: " + dir +
                             "/tokenizer.json; run scripts/fetch_tokenizers.sh");
  }
  auto tok = std::make_unique<Tokenizer>(Tokenizer::load(dir));
  return *cache.emplace(name, std::move(tok)).first->second;
}

inline nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

}  // namespace augur::test
