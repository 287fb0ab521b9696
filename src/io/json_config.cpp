#include "io/json_config.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json_text.h"

namespace augur {

using json = nlohmann::json;

struct JsonConfig::Node {
  std::shared_ptr<const json> doc;  // keeps `value` alive
  const json* value;                // an object inside *doc
};

namespace {

using io_detail::kind_of;
using io_detail::parser_message;

}  // namespace

JsonConfig::JsonConfig(std::shared_ptr<const Node> node, std::string path, std::string prefix)
    : node_(std::move(node)), path_(std::move(path)), prefix_(std::move(prefix)) {}

JsonConfig JsonConfig::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("[config] ", path, ": cannot open: ", std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return parse(text.str(), path);
}

JsonConfig JsonConfig::parse(std::string_view text, const std::string& path) {
  auto doc = std::make_shared<json>();
  try {
    *doc = json::parse(text);
  } catch (const json::exception& e) {
    fail("[config] ", path, ": bad JSON: ", parser_message(e));
  }
  if (!doc->is_object()) fail("[config] ", path, ": must be a JSON object, got ", kind_of(*doc));
  const json* root = doc.get();
  return JsonConfig(std::make_shared<const Node>(Node{std::move(doc), root}), path, "");
}

std::string JsonConfig::field_name(std::string_view key) const {
  return prefix_ + std::string(key);
}

void JsonConfig::error(std::string_view key, std::string_view what) const {
  fail("[config] ", path_, ": field '", field_name(key), "' ", what);
}

namespace {

// The value at `key`, or nullptr if absent.
const json* lookup(const json& obj, std::string_view key) {
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

// Typed conversions; false on a type mismatch or an integer outside int64.
bool to_int(const json& j, int64_t* out) {
  if (j.is_number_unsigned()) {
    uint64_t u = j.get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max())) return false;
    *out = int64_t(u);
    return true;
  }
  if (j.is_number_integer()) { *out = j.get<int64_t>(); return true; }
  return false;
}

bool to_float(const json& j, double* out) {
  if (!j.is_number()) return false;
  *out = j.get<double>();
  return true;
}

bool to_bool(const json& j, bool* out) {
  if (!j.is_boolean()) return false;
  *out = j.get<bool>();
  return true;
}

bool to_str(const json& j, std::string* out) {
  if (!j.is_string()) return false;
  *out = j.get<std::string>();
  return true;
}

}  // namespace

namespace {

// One body for every getter: `conv` converts, `type` names the wanted type in
// messages ("an integer"); a null fallback makes the field required.
template <typename T, typename Conv>
T get_scalar(const JsonConfig& cfg, const json& obj, std::string_view key, const T* fallback,
             Conv conv, const char* type) {
  const json* v = lookup(obj, key);
  if ((!v || v->is_null()) && fallback) return *fallback;
  if (!v) fail("[config] ", cfg.path(), ": missing field '", cfg.field_name(key), "'");
  T out{};
  if (!conv(*v, &out)) {
    if (std::is_same_v<T, int64_t> && v->is_number_unsigned())
      cfg.error(key, "is out of the 64-bit integer range");
    cfg.error(key, std::string("must be ") + type + ", got " + kind_of(*v));
  }
  return out;
}

// A list, or a scalar read as a one-element list; elements are named "key[i]".
template <typename T, typename Conv>
std::vector<T> get_list(const JsonConfig& cfg, const json& obj, std::string_view key, Conv conv,
                        const char* type) {
  const json* v = lookup(obj, key);
  if (!v) fail("[config] ", cfg.path(), ": missing field '", cfg.field_name(key), "'");
  std::vector<T> out;
  if (!v->is_array()) {
    T x{};
    if (!conv(*v, &x))
      cfg.error(key, std::string("must be ") + type + " or a list of them, got " + kind_of(*v));
    out.push_back(std::move(x));
    return out;
  }
  for (size_t i = 0; i < v->size(); ++i) {
    const json& e = (*v)[i];
    T x{};
    if (!conv(e, &x)) {
      std::string name = std::string(key) + "[" + std::to_string(i) + "]";
      if (std::is_same_v<T, int64_t> && e.is_number_unsigned())
        cfg.error(name, "is out of the 64-bit integer range");
      cfg.error(name, std::string("must be ") + type + ", got " + kind_of(e));
    }
    out.push_back(std::move(x));
  }
  return out;
}

}  // namespace

bool JsonConfig::has(std::string_view key) const { return lookup(*node_->value, key) != nullptr; }

bool JsonConfig::is_null(std::string_view key) const {
  const json* v = lookup(*node_->value, key);
  return v && v->is_null();
}

int64_t JsonConfig::get_int(std::string_view key) const {
  return get_scalar<int64_t>(*this, *node_->value, key, nullptr, to_int, "an integer");
}
int64_t JsonConfig::get_int(std::string_view key, int64_t fallback) const {
  return get_scalar(*this, *node_->value, key, &fallback, to_int, "an integer");
}
double JsonConfig::get_float(std::string_view key) const {
  return get_scalar<double>(*this, *node_->value, key, nullptr, to_float, "a number");
}
double JsonConfig::get_float(std::string_view key, double fallback) const {
  return get_scalar(*this, *node_->value, key, &fallback, to_float, "a number");
}
bool JsonConfig::get_bool(std::string_view key) const {
  return get_scalar<bool>(*this, *node_->value, key, nullptr, to_bool, "a boolean");
}
bool JsonConfig::get_bool(std::string_view key, bool fallback) const {
  return get_scalar(*this, *node_->value, key, &fallback, to_bool, "a boolean");
}
std::string JsonConfig::get_string(std::string_view key) const {
  return get_scalar<std::string>(*this, *node_->value, key, nullptr, to_str, "a string");
}
std::string JsonConfig::get_string(std::string_view key, std::string_view fallback) const {
  std::string fb(fallback);
  return get_scalar(*this, *node_->value, key, &fb, to_str, "a string");
}

std::vector<int64_t> JsonConfig::get_int_list(std::string_view key) const {
  return get_list<int64_t>(*this, *node_->value, key, to_int, "an integer");
}
std::vector<double> JsonConfig::get_float_list(std::string_view key) const {
  return get_list<double>(*this, *node_->value, key, to_float, "a number");
}
std::vector<std::string> JsonConfig::get_string_list(std::string_view key) const {
  return get_list<std::string>(*this, *node_->value, key, to_str, "a string");
}

JsonConfig JsonConfig::sub(std::string_view key) const {
  const json* v = lookup(*node_->value, key);
  if (!v) fail("[config] ", path_, ": missing field '", field_name(key), "'");
  if (!v->is_object()) error(key, "must be an object, got " + kind_of(*v));
  return JsonConfig(std::make_shared<const Node>(Node{node_->doc, v}), path_,
                    field_name(key) + ".");
}

std::vector<std::string> JsonConfig::keys() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : node_->value->items()) out.push_back(k);
  return out;
}

}  // namespace augur
