// Values of the Jinja interpreter: the Python objects a chat template sees
// under jinja2 (None, bool, int, float, str, list, tuple, dict, namespace,
// callables) plus jinja2's Undefined. Containers are shared and immutable, as
// under transformers' ImmutableSandboxedEnvironment; only a namespace mutates.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace augur::jinja {

class Interpreter;
struct Array;
struct Dict;
struct Namespace;
struct Function;
struct CallArgs;

class Value {
 public:
  enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Function };

  Value() = default;  // Undefined with no hint
  explicit Value(bool b) : kind_(Kind::Bool), data_(b) {}
  explicit Value(int64_t i) : kind_(Kind::Int), data_(i) {}
  explicit Value(int i) : kind_(Kind::Int), data_(static_cast<int64_t>(i)) {}
  explicit Value(double f) : kind_(Kind::Float), data_(f) {}
  explicit Value(std::string s) : kind_(Kind::String), data_(std::move(s)) {}
  explicit Value(const char* s) : kind_(Kind::String), data_(std::string(s)) {}
  explicit Value(std::shared_ptr<const Array> a) : kind_(Kind::List), data_(std::move(a)) {}
  explicit Value(std::shared_ptr<const Dict> d) : kind_(Kind::Dict), data_(std::move(d)) {}
  explicit Value(std::shared_ptr<Namespace> n) : kind_(Kind::Namespace), data_(std::move(n)) {}
  explicit Value(std::shared_ptr<const Function> f) : kind_(Kind::Function), data_(std::move(f)) {}

  // `hint` says what is undefined, for the error raised when it is used:
  // "'foo' is undefined", "'dict object' has no attribute 'bar'".
  static Value undefined(std::string hint);
  static Value none();
  static Value list(std::vector<Value> items);
  static Value tuple(std::vector<Value> items);
  // What jinja2's map/select/items/unique/reverse/batch return: a Python
  // generator, always true, with no len() and no indexing.
  static Value generator(std::vector<Value> items);
  static Value dict(Dict d);
  static Value function(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn);

  static Value from_json(const nlohmann::json& j);
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_int() const { return kind_ == Kind::Int; }
  bool is_float() const { return kind_ == Kind::Float; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_list() const { return kind_ == Kind::List; }  // list or tuple
  bool is_tuple() const;
  bool is_generator() const;
  bool is_dict() const { return kind_ == Kind::Dict; }
  bool is_namespace() const { return kind_ == Kind::Namespace; }
  bool is_function() const { return kind_ == Kind::Function; }

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const { return std::get<int64_t>(data_); }
  double as_float() const { return std::get<double>(data_); }
  const std::string& as_string() const { return std::get<std::string>(data_); }
  const std::string& undefined_hint() const;
  const Array& as_array() const { return *std::get<std::shared_ptr<const Array>>(data_); }
  const std::vector<Value>& items() const;  // of a list, tuple or generator
  const Dict& as_dict() const { return *std::get<std::shared_ptr<const Dict>>(data_); }
  Namespace& as_namespace() const { return *std::get<std::shared_ptr<Namespace>>(data_); }
  const Function& as_function() const { return *std::get<std::shared_ptr<const Function>>(data_); }
  const void* identity() const;  // the shared object, for `is sameas`

  // Numeric value of int, float or bool (bool is an int in Python).
  double to_double() const;
  // int or bool as int64.
  int64_t to_int() const;

  bool truthy() const;        // Python bool()
  std::string str() const;    // Python str(); Undefined renders as ""
  std::string repr() const;   // Python repr()
  std::string type_name() const;  // Python type name: 'str', 'NoneType', ...

 private:
  Kind kind_ = Kind::Undefined;
  std::variant<std::monostate, bool, int64_t, double, std::string, std::shared_ptr<const Array>,
               std::shared_ptr<const Dict>, std::shared_ptr<Namespace>,
               std::shared_ptr<const Function>>
      data_;
};

struct Array {
  std::vector<Value> items;
  bool tuple = false;
  bool generator = false;
};

// A Python dict: insertion-ordered, keys compared with Python ==.
struct Dict {
  std::vector<std::pair<Value, Value>> items;

  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(Value key, Value value);  // replaces an equal key in place
};

// jinja2's namespace(): the one mutable object, changed by `{% set ns.x = ... %}`.
struct Namespace {
  std::vector<std::pair<std::string, Value>> attrs;

  const Value* find(std::string_view name) const;
  void set(const std::string& name, Value value);
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

struct Function {
  std::string name;
  std::function<Value(Interpreter&, CallArgs&)> fn;
};

// Python ==.
bool equals(const Value& a, const Value& b);
// Python a < b (and so on); throws EvalError for unorderable types.
bool less(const Value& a, const Value& b);

// Python repr() of a float ("1.0", "1e+16", "0.0001").
std::string float_repr(double f);

struct JsonOptions {
  bool ensure_ascii = false;
  bool pretty = false;  // indent given
  std::string indent;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};
// json.dumps(value, ...): what transformers' `tojson` filter returns.
std::string to_json(const Value& v, const JsonOptions& options);

}  // namespace augur::jinja
