// Reading tokenizer.json components: typed fields with defaults, and the
// {"String": ...} / {"Regex": ...} pattern objects.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/regex.h"

namespace augur::tok {

// j[key] when present and not null, else `fallback`.
template <typename T>
T value_or(const nlohmann::json& j, const char* key, T fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  return it->get<T>();
}

inline const nlohmann::json& required(const nlohmann::json& j, const char* key,
                                      const std::string& where, std::string_view component) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) fail(where, ": ", component, " lacks '", key, "'");
  return *it;
}

inline std::string type_of(const nlohmann::json& j, const std::string& where,
                           std::string_view kind) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    fail(where, ": ", kind, " without a type");
  }
  return j["type"].get<std::string>();
}

// A pattern object: {"String": "literal"} or {"Regex": "onig pattern"}.
inline Regex pattern_of(const nlohmann::json& j, const std::string& where,
                        std::string_view component) {
  if (j.is_object() && j.contains("String")) return Regex::literal(j["String"].get<std::string>());
  if (j.is_object() && j.contains("Regex")) {
    return Regex::compile(j["Regex"].get<std::string>(), where + ": " + std::string(component));
  }
  fail(where, ": ", component, " pattern is neither String nor Regex");
}

}  // namespace augur::tok
