// Typed reads from a JSON object (config.json, generation_config.json, ...).
// Model families build their typed configs from this; every bad or missing
// field is an augur::Error naming the file and the field's full path:
//   "[config] config.json: field 'rope_parameters.rope_type' must be a string, got null"
// The JSON library stays out of this header.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace augur {

class JsonConfig {
 public:
  // Errors: missing file, bad JSON (with line and column), not an object.
  static JsonConfig load(const std::string& path);
  // The same from text in memory; `path` only labels messages.
  static JsonConfig parse(std::string_view text, const std::string& path);

  // Present, whatever its value (null included).
  bool has(std::string_view key) const;
  // Present and null (HF writes null for "not set": "sliding_window": null).
  bool is_null(std::string_view key) const;

  // Without a fallback, a missing or null field is an error. With one, missing
  // or null gives the fallback; a present value of the wrong type is still an error.
  int64_t get_int(std::string_view key) const;
  int64_t get_int(std::string_view key, int64_t fallback) const;
  double get_float(std::string_view key) const;  // accepts integers too
  double get_float(std::string_view key, double fallback) const;
  bool get_bool(std::string_view key) const;
  bool get_bool(std::string_view key, bool fallback) const;
  std::string get_string(std::string_view key) const;
  std::string get_string(std::string_view key, std::string_view fallback) const;

  // A scalar reads as a one-element list (eos_token_id is either).
  std::vector<int64_t> get_int_list(std::string_view key) const;
  std::vector<double> get_float_list(std::string_view key) const;
  std::vector<std::string> get_string_list(std::string_view key) const;

  // A nested object; its messages name fields as "key.inner".
  JsonConfig sub(std::string_view key) const;
  // This object's keys, sorted.
  std::vector<std::string> keys() const;

  const std::string& path() const { return path_; }
  // The full dotted name of `key` as messages show it.
  std::string field_name(std::string_view key) const;
  // Throws "[config] <path>: field '<full key>' <what>", for contradictions a
  // family finds between fields.
  [[noreturn]] void error(std::string_view key, std::string_view what) const;

 private:
  struct Node;  // the parsed document and a position in it
  JsonConfig(std::shared_ptr<const Node> node, std::string path, std::string prefix);

  std::shared_ptr<const Node> node_;
  std::string path_;
  std::string prefix_;  // "" at the top, "rope_parameters." below
};

}  // namespace augur
