#include "tokenizer/jinja/value.h"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include "tokenizer/jinja/errors.h"
#include "tokenizer/jinja/pystr.h"

namespace augur::jinja {

namespace {

template <typename Json>
Value convert_json(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null:
      return Value::none();
    case Json::value_t::boolean:
      return Value(j.template get<bool>());
    case Json::value_t::number_integer:
      return Value(j.template get<int64_t>());
    case Json::value_t::number_unsigned: {
      const auto u = j.template get<uint64_t>();
      if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return Value(static_cast<int64_t>(u));
      return Value(static_cast<double>(u));
    }
    case Json::value_t::number_float:
      return Value(j.template get<double>());
    case Json::value_t::string:
      return Value(j.template get<std::string>());
    case Json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(convert_json(e));
      return Value::list(std::move(items));
    }
    case Json::value_t::object: {
      Dict d;
      d.items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it)
        d.items.emplace_back(Value(it.key()), convert_json(it.value()));
      return Value::dict(std::move(d));
    }
    default:
      eval_fail("cannot pass a JSON ", j.type_name(), " value to a template");
  }
}

// Python repr() of a str: single quotes unless the text has ' and no ".
void append_string_repr(std::string& out, const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  out += quote;
  char buf[16];
  for (char32_t c : pystr::decode(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      out += buf;
    } else if (c < 0x80) {
      out += static_cast<char>(c);
    } else {
      // Python prints non-printable code points (controls, format chars,
      // separators other than space, surrogates, unassigned) escaped.
      const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
      const bool printable =
          !(cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
            cat == UTF8PROC_CATEGORY_CS || cat == UTF8PROC_CATEGORY_CO ||
            cat == UTF8PROC_CATEGORY_CN || cat == UTF8PROC_CATEGORY_ZL ||
            cat == UTF8PROC_CATEGORY_ZP || cat == UTF8PROC_CATEGORY_ZS) &&
          !(c >= 0xD800 && c <= 0xDFFF);
      if (printable) {
        pystr::append_utf8(out, c);
      } else if (c <= 0xFF) {
        std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
        out += buf;
      } else if (c <= 0xFFFF) {
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
        out += buf;
      } else {
        std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(c));
        out += buf;
      }
    }
  }
  out += quote;
}

void append_repr(std::string& out, const Value& v, int depth);

// Python reports a self-containing container; deep nesting is refused here.
constexpr int kMaxDepth = 256;

void append_items_repr(std::string& out, const std::vector<Value>& items, int depth) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    append_repr(out, items[i], depth);
  }
}

void append_dict_repr(std::string& out, const Dict& d, int depth) {
  out += '{';
  for (size_t i = 0; i < d.items.size(); ++i) {
    if (i) out += ", ";
    append_repr(out, d.items[i].first, depth);
    out += ": ";
    append_repr(out, d.items[i].second, depth);
  }
  out += '}';
}

void append_repr(std::string& out, const Value& v, int depth) {
  if (++depth > kMaxDepth) eval_fail("maximum recursion depth exceeded while getting the repr of an object");
  switch (v.kind()) {
    case Value::Kind::Undefined:
      out += "Undefined";
      return;
    case Value::Kind::String:
      append_string_repr(out, v.as_string());
      return;
    case Value::Kind::List:
      if (v.is_generator()) {
        out += "<generator object>";
      } else if (v.is_tuple()) {
        out += '(';
        append_items_repr(out, v.items(), depth);
        if (v.items().size() == 1) out += ',';
        out += ')';
      } else {
        out += '[';
        append_items_repr(out, v.items(), depth);
        out += ']';
      }
      return;
    case Value::Kind::Dict:
      append_dict_repr(out, v.as_dict(), depth);
      return;
    case Value::Kind::Namespace: {
      out += "<Namespace {";
      const auto& attrs = v.as_namespace().attrs;
      for (size_t i = 0; i < attrs.size(); ++i) {
        if (i) out += ", ";
        append_string_repr(out, attrs[i].first);
        out += ": ";
        append_repr(out, attrs[i].second, depth);
      }
      out += "}>";
      return;
    }
    default:
      out += v.str();
      return;
  }
}

[[noreturn]] void fail_undefined(const Value& v) {
  eval_fail(v.undefined_hint().empty() ? std::string("value is undefined") : v.undefined_hint());
}

void append_json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  char buf[16];
  out += '"';
  auto escape_unit = [&](unsigned u) {
    std::snprintf(buf, sizeof buf, "\\u%04x", u);
    out += buf;
  };
  auto plain = [&](char32_t c) {
    switch (c) {
      case '"': out += "\\\""; return true;
      case '\\': out += "\\\\"; return true;
      case '\n': out += "\\n"; return true;
      case '\r': out += "\\r"; return true;
      case '\t': out += "\\t"; return true;
      case '\b': out += "\\b"; return true;
      case '\f': out += "\\f"; return true;
      default: break;
    }
    if (c < 0x20) {
      escape_unit(c);
      return true;
    }
    return false;
  };
  if (!ensure_ascii) {
    for (char ch : s) {
      if (!plain(static_cast<unsigned char>(ch))) out += ch;
    }
  } else {
    for (char32_t c : pystr::decode(s)) {
      if (plain(c)) continue;
      if (c >= 0x20 && c < 0x7F) {
        out += static_cast<char>(c);
      } else if (c < 0x10000) {
        escape_unit(c);
      } else {
        const char32_t v = c - 0x10000;
        escape_unit(0xD800 + (v >> 10));
        escape_unit(0xDC00 + (v & 0x3FF));
      }
    }
  }
  out += '"';
}

std::string json_float(double f) {
  if (std::isnan(f)) return "NaN";
  if (std::isinf(f)) return f > 0 ? "Infinity" : "-Infinity";
  return float_repr(f);
}

// Mirrors json.encoder's _iterencode.
void append_json(std::string& out, const Value& v, const JsonOptions& o, int level) {
  if (level > kMaxDepth) eval_fail("Circular reference detected or nesting too deep for JSON");
  switch (v.kind()) {
    case Value::Kind::None:
      out += "null";
      return;
    case Value::Kind::Bool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::Int:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::Float:
      out += json_float(v.as_float());
      return;
    case Value::Kind::String:
      append_json_string(out, v.as_string(), o.ensure_ascii);
      return;
    default:
      break;
  }
  std::string newline_indent;
  if (o.pretty) {
    newline_indent = "\n";
    for (int i = 0; i <= level; ++i) newline_indent += o.indent;
  }
  const std::string separator = o.item_separator + newline_indent;
  auto close = [&](char c) {
    if (o.pretty) {
      out += '\n';
      for (int i = 0; i < level; ++i) out += o.indent;
    }
    out += c;
  };
  if (v.is_list() && !v.is_generator()) {
    const auto& items = v.items();
    if (items.empty()) {
      out += "[]";
      return;
    }
    out += '[';
    out += newline_indent;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += separator;
      append_json(out, items[i], o, level + 1);
    }
    close(']');
    return;
  }
  if (v.is_dict()) {
    const auto& d = v.as_dict();
    if (d.items.empty()) {
      out += "{}";
      return;
    }
    std::vector<const std::pair<Value, Value>*> entries;
    entries.reserve(d.items.size());
    for (const auto& kv : d.items) entries.push_back(&kv);
    if (o.sort_keys) {
      std::stable_sort(entries.begin(), entries.end(),
                       [](const auto* a, const auto* b) { return less(a->first, b->first); });
    }
    out += '{';
    out += newline_indent;
    for (size_t i = 0; i < entries.size(); ++i) {
      if (i) out += separator;
      const Value& key = entries[i]->first;
      switch (key.kind()) {
        case Value::Kind::String:
          append_json_string(out, key.as_string(), o.ensure_ascii);
          break;
        case Value::Kind::Int:
          out += '"' + std::to_string(key.as_int()) + '"';
          break;
        case Value::Kind::Float:
          out += '"' + json_float(key.as_float()) + '"';
          break;
        case Value::Kind::Bool:
          out += key.as_bool() ? "\"true\"" : "\"false\"";
          break;
        case Value::Kind::None:
          out += "\"null\"";
          break;
        default:
          eval_fail("keys must be str, int, float, bool or None, not ", key.type_name());
      }
      out += o.key_separator;
      append_json(out, entries[i]->second, o, level + 1);
    }
    close('}');
    return;
  }
  eval_fail("Object of type ", v.type_name(), " is not JSON serializable");
}

int compare_sequences(const std::vector<Value>& a, const std::vector<Value>& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if (equals(a[i], b[i])) continue;
    return less(a[i], b[i]) ? -1 : 1;
  }
  return a.size() < b.size() ? -1 : (a.size() > b.size() ? 1 : 0);
}

}  // namespace

Value Value::undefined(std::string hint) {
  Value v;
  v.data_ = std::move(hint);
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::None;
  return v;
}

Value Value::list(std::vector<Value> items) {
  return Value(std::shared_ptr<const Array>(std::make_shared<Array>(Array{std::move(items), false})));
}

Value Value::tuple(std::vector<Value> items) {
  return Value(std::shared_ptr<const Array>(std::make_shared<Array>(Array{std::move(items), true})));
}

Value Value::generator(std::vector<Value> items) {
  return Value(std::shared_ptr<const Array>(std::make_shared<Array>(Array{std::move(items), false, true})));
}

Value Value::dict(Dict d) {
  return Value(std::shared_ptr<const Dict>(std::make_shared<Dict>(std::move(d))));
}

Value Value::function(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn) {
  return Value(std::shared_ptr<const Function>(
      std::make_shared<Function>(Function{std::move(name), std::move(fn)})));
}

Value Value::from_json(const nlohmann::json& j) { return convert_json(j); }
Value Value::from_json(const nlohmann::ordered_json& j) { return convert_json(j); }

bool Value::is_tuple() const { return kind_ == Kind::List && as_array().tuple; }
bool Value::is_generator() const { return kind_ == Kind::List && as_array().generator; }

const std::string& Value::undefined_hint() const {
  static const std::string kEmpty;
  const auto* s = std::get_if<std::string>(&data_);
  return (kind_ == Kind::Undefined && s) ? *s : kEmpty;
}

const std::vector<Value>& Value::items() const { return as_array().items; }

const void* Value::identity() const {
  switch (kind_) {
    case Kind::List: return std::get<std::shared_ptr<const Array>>(data_).get();
    case Kind::Dict: return std::get<std::shared_ptr<const Dict>>(data_).get();
    case Kind::Namespace: return std::get<std::shared_ptr<Namespace>>(data_).get();
    case Kind::Function: return std::get<std::shared_ptr<const Function>>(data_).get();
    default: return nullptr;
  }
}

double Value::to_double() const {
  switch (kind_) {
    case Kind::Bool: return as_bool() ? 1.0 : 0.0;
    case Kind::Int: return static_cast<double>(as_int());
    case Kind::Float: return as_float();
    default: eval_fail("expected a number, got ", type_name());
  }
}

int64_t Value::to_int() const {
  switch (kind_) {
    case Kind::Bool: return as_bool() ? 1 : 0;
    case Kind::Int: return as_int();
    default: eval_fail("expected an integer, got ", type_name());
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return as_bool();
    case Kind::Int: return as_int() != 0;
    case Kind::Float: return as_float() != 0.0;
    case Kind::String: return !as_string().empty();
    case Kind::List: return is_generator() || !items().empty();
    case Kind::Dict: return !as_dict().items.empty();
    default: return true;
  }
}

std::string Value::str() const {
  switch (kind_) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return as_bool() ? "True" : "False";
    case Kind::Int: return std::to_string(as_int());
    case Kind::Float: return float_repr(as_float());
    case Kind::String: return as_string();
    case Kind::Function: return "<function " + as_function().name + ">";
    default: return repr();
  }
}

std::string Value::repr() const {
  if (kind_ == Kind::Undefined || kind_ == Kind::None || kind_ == Kind::Bool ||
      kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Function) {
    return kind_ == Kind::Undefined ? "Undefined" : str();
  }
  std::string out;
  append_repr(out, *this, 0);
  return out;
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return is_generator() ? "generator" : is_tuple() ? "tuple" : "list";
    case Kind::Dict: return "dict";
    case Kind::Namespace: return "Namespace";
    case Kind::Function: return "function";
  }
  return "object";
}

const Value* Dict::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.as_string()));
  for (const auto& kv : items)
    if (equals(kv.first, key)) return &kv.second;
  return nullptr;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& kv : items)
    if (kv.first.is_string() && kv.first.as_string() == key) return &kv.second;
  return nullptr;
}

void Dict::set(Value key, Value value) {
  for (auto& kv : items) {
    if (equals(kv.first, key)) {
      kv.second = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

const Value* Namespace::find(std::string_view name) const {
  for (const auto& kv : attrs)
    if (kv.first == name) return &kv.second;
  return nullptr;
}

void Namespace::set(const std::string& name, Value value) {
  for (auto& kv : attrs) {
    if (kv.first == name) {
      kv.second = std::move(value);
      return;
    }
  }
  attrs.emplace_back(name, std::move(value));
}

bool equals(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.to_double() == b.to_double();
    return a.to_int() == b.to_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::Undefined:
    case K::None: return true;
    case K::String: return a.as_string() == b.as_string();
    case K::List: {
      if (a.is_generator() || b.is_generator()) return a.identity() == b.identity();
      if (a.is_tuple() != b.is_tuple()) return false;
      const auto& x = a.items();
      const auto& y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!equals(x[i], y[i])) return false;
      return true;
    }
    case K::Dict: {
      const auto& x = a.as_dict();
      const auto& y = b.as_dict();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& kv : x.items) {
        const Value* other = y.find(kv.first);
        if (!other || !equals(kv.second, *other)) return false;
      }
      return true;
    }
    default: return a.identity() == b.identity();
  }
}

bool less(const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.to_double() < b.to_double();
    return a.to_int() < b.to_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple() && !a.is_generator() &&
      !b.is_generator())
    return compare_sequences(a.items(), b.items()) < 0;
  eval_fail("'<' not supported between instances of '", a.type_name(), "' and '", b.type_name(),
            "'");
}

std::string float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  if (f == 0.0) return std::signbit(f) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout rule (float_repr_style
  // 'short'): exponent form when the decimal point falls outside (-4, 16].
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::scientific);
  const std::string sci(buf, res.ptr);
  std::string out;
  size_t i = 0;
  if (sci[0] == '-') {
    out += '-';
    i = 1;
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t k = i; k < e; ++k)
    if (sci[k] != '.') digits += sci[k];
  const int exponent = std::stoi(sci.substr(e + 1));
  const int decpt = exponent + 1;
  const int ndigits = static_cast<int>(digits.size());
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (ndigits > 1) {
      out += '.';
      out += digits.substr(1);
    }
    out += 'e';
    out += exponent < 0 ? '-' : '+';
    const int mag = exponent < 0 ? -exponent : exponent;
    if (mag < 10) out += '0';
    out += std::to_string(mag);
  } else if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<size_t>(-decpt), '0');
    out += digits;
  } else if (decpt >= ndigits) {
    out += digits;
    out.append(static_cast<size_t>(decpt - ndigits), '0');
    out += ".0";
  } else {
    out += digits.substr(0, static_cast<size_t>(decpt));
    out += '.';
    out += digits.substr(static_cast<size_t>(decpt));
  }
  return out;
}

std::string to_json(const Value& v, const JsonOptions& options) {
  std::string out;
  append_json(out, v, options, 0);
  return out;
}

}  // namespace augur::jinja
