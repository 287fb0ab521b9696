// jinja2's builtin filters and tests (jinja2/filters.py, jinja2/tests.py),
// transformers' globals and `tojson` (utils/chat_template_utils.py), and the
// Python str/dict/list methods ImmutableSandboxedEnvironment allows.
#include "tokenizer/jinja/builtins.h"

#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstddef>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "tokenizer/jinja/errors.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/pystr.h"

namespace augur::jinja {

namespace {

// jinja2.sandbox.MAX_RANGE
constexpr int64_t kMaxRange = 100000;

[[noreturn]] void fail_undefined(const Value& v) {
  eval_fail(v.undefined_hint().empty() ? std::string("value is undefined") : v.undefined_hint());
}

// A non-negative decimal index ("0", "12"), or nullopt.
std::optional<int64_t> parse_index(const std::string& s) {
  if (s.empty() || s.size() > 18) return std::nullopt;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

bool given(const Value& v) { return !(v.is_undefined() && v.undefined_hint().empty()); }

std::optional<std::string> opt_string(const Value& v, std::string_view what) {
  if (!given(v) || v.is_none()) return std::nullopt;
  if (!v.is_string()) eval_fail(what, " must be None or a string, not ", v.type_name());
  return v.as_string();
}

int64_t int_arg(const Value& v, int64_t dflt, std::string_view what) {
  if (!given(v)) return dflt;
  if (!v.is_int() && !v.is_bool()) eval_fail(what, " must be an integer, not ", v.type_name());
  return v.to_int();
}

bool bool_arg(const Value& v, bool dflt) { return given(v) ? v.truthy() : dflt; }

const std::string& string_arg(const Value& v, std::string_view what) {
  if (!v.is_string()) eval_fail(what, " must be a string, not ", v.type_name());
  return v.as_string();
}

int64_t length_of(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return 0;
    case Value::Kind::String: return pystr::length(v.as_string());
    case Value::Kind::List:
      if (v.is_generator()) eval_fail("object of type 'generator' has no len()");
      return static_cast<int64_t>(v.items().size());
    case Value::Kind::Dict: return static_cast<int64_t>(v.as_dict().items.size());
    default: eval_fail("object of type '", v.type_name(), "' has no len()");
  }
}

// An `attribute=` path such as "function.name", looked up item-first as
// jinja2's make_attrgetter does.
Value get_path(Interpreter& in, const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    Value key(part);
    if (const auto index = parse_index(part)) key = Value(*index);
    v = in.getitem(v, key);
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

// Sort key: lower-cased when comparing strings case-insensitively.
Value sort_key(Interpreter& in, const Value& item, const std::optional<std::string>& attribute,
               bool case_sensitive) {
  Value v = attribute ? get_path(in, item, *attribute) : item;
  if (!case_sensitive && v.is_string()) return Value(pystr::lower(v.as_string()));
  return v;
}

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// Calls a named test with the extra arguments of select()/selectattr().
bool run_test(Interpreter& in, const std::string* test, const Value& v, const std::vector<Value>& extra) {
  if (!test) return v.truthy();
  CallArgs args;
  args.positional = extra;
  return in.apply_test(*test, v, args);
}

// ---- filters ----

Value f_length(Interpreter&, const Value& v, CallArgs& args) {
  bind_args("length", args, {});
  return Value(length_of(v));
}

Value f_trim(Interpreter&, const Value& v, CallArgs& args) {
  const auto a = bind_args("trim", args, {"chars"});
  return Value(pystr::strip(v.str(), opt_string(a[0], "trim chars"), true, true));
}

// transformers' override: json.dumps(x, ensure_ascii=False, indent=None,
// separators=None, sort_keys=False), with no HTML escaping.
Value f_tojson(Interpreter&, const Value& v, CallArgs& args) {
  const auto a = bind_args("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions o;
  o.ensure_ascii = bool_arg(a[0], false);
  const Value& indent = a[1];
  if (given(indent) && !indent.is_none()) {
    o.pretty = true;
    if (indent.is_string()) {
      o.indent = indent.as_string();
    } else {
      o.indent.assign(static_cast<size_t>(std::max<int64_t>(0, int_arg(indent, 0, "indent"))), ' ');
    }
    o.item_separator = ",";
  }
  const Value& sep = a[2];
  if (given(sep) && !sep.is_none()) {
    if (!sep.is_list() || sep.items().size() != 2 || !sep.items()[0].is_string() ||
        !sep.items()[1].is_string())
      eval_fail("separators must be a (item_separator, key_separator) pair of strings");
    o.item_separator = sep.items()[0].as_string();
    o.key_separator = sep.items()[1].as_string();
  }
  o.sort_keys = bool_arg(a[3], false);
  return Value(to_json(v, o));
}

Value f_items(Interpreter&, const Value& v, CallArgs& args) {
  bind_args("items", args, {});
  if (v.is_undefined()) return Value::generator({});
  if (!v.is_dict()) eval_fail("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, val] : v.as_dict().items) out.push_back(Value::tuple({k, val}));
  return Value::generator(std::move(out));
}

Value f_first(Interpreter& in, const Value& v, CallArgs& args) {
  bind_args("first", args, {});
  if (v.is_list() && !v.items().empty()) return v.items().front();
  auto items = in.iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value f_last(Interpreter& in, const Value& v, CallArgs& args) {
  bind_args("last", args, {});
  if (v.is_generator()) eval_fail("'generator' object is not reversible");
  if (v.is_list() && !v.items().empty()) return v.items().back();
  auto items = in.iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value f_join(Interpreter& in, const Value& v, CallArgs& args) {
  const auto a = bind_args("join", args, {"d", "attribute"});
  const std::string sep = given(a[0]) ? a[0].str() : "";
  const auto attribute = opt_string(a[1], "join attribute");
  std::string out;
  bool first = true;
  for (const Value& item : in.iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += attribute ? get_path(in, item, *attribute).str() : item.str();
  }
  return Value(std::move(out));
}

Value f_upper(Interpreter&, const Value& v, CallArgs& args) {
  bind_args("upper", args, {});
  return Value(pystr::upper(v.str()));
}

Value f_lower(Interpreter&, const Value& v, CallArgs& args) {
  bind_args("lower", args, {});
  return Value(pystr::lower(v.str()));
}

Value f_capitalize(Interpreter&, const Value& v, CallArgs& args) {
  bind_args("capitalize", args, {});
  return Value(pystr::capitalize(v.str()));
}

// jinja2's title: a word starts after '-', whitespace or an opening bracket.
Value f_title(Interpreter&, const Value& v, CallArgs& args) {
  bind_args("title", args, {});
  std::string out;
  bool word_start = true;
  for (char32_t c : pystr::decode(v.str())) {
    const bool sep = pystr::is_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      pystr::append_utf8(out, c);
    } else {
      out += word_start ? pystr::upper_char(c) : pystr::lower_char(c);
    }
    word_start = sep;
  }
  return Value(std::move(out));
}

Value f_default(Interpreter&, const Value& v, CallArgs& args) {
  const auto a = bind_args("default", args, {"default_value", "boolean"});
  const bool boolean = bool_arg(a[1], false);
  if (v.is_undefined() || (boolean && !v.truthy())) return given(a[0]) ? a[0] : Value("");
  return v;
}

Value f_string(Interpreter&, const Value& v, CallArgs& args) {
  bind_args("string", args, {});
  return v.is_string() ? v : Value(v.str());
}

std::optional<double> parse_float(const std::string& text) {
  const std::string s = pystr::strip(text, std::nullopt, true, true);
  if (s.empty()) return std::nullopt;
  std::string clean;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_' && i > 0 && i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i - 1])) &&
        std::isdigit(static_cast<unsigned char>(s[i + 1])))
      continue;
    clean += s[i];
  }
  const std::string lower = pystr::lower(clean);
  const bool hexlike = lower.find('x') != std::string::npos || lower.find('p') != std::string::npos;
  if (hexlike) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size()) return std::nullopt;
  return d;
}

std::optional<int64_t> parse_int(const std::string& text, int base) {
  std::string s = pystr::strip(text, std::nullopt, true, true);
  bool neg = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    neg = s[0] == '-';
    s.erase(0, 1);
  }
  if (s.size() > 2 && s[0] == '0') {
    const char p = static_cast<char>(s[1] | 0x20);
    const int prefixed = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (prefixed && (base == prefixed || base == 0)) {
      s.erase(0, 2);
      base = prefixed;
    }
  }
  if (base == 0) base = 10;
  std::string clean;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_' && i > 0 && i + 1 < s.size() && s[i - 1] != '_') continue;
    clean += s[i];
  }
  if (clean.empty()) return std::nullopt;
  int64_t v = 0;
  for (char c : clean) {
    const int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
                  : std::isalpha(static_cast<unsigned char>(c)) ? (c | 0x20) - 'a' + 10
                                                                : 99;
    if (d >= base) return std::nullopt;
    if (__builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, d, &v)) return std::nullopt;
  }
  return neg ? -v : v;
}

Value f_int(Interpreter&, const Value& v, CallArgs& args) {
  const auto a = bind_args("int", args, {"default", "base"});
  const Value dflt = given(a[0]) ? a[0] : Value(int64_t{0});
  const int base = static_cast<int>(int_arg(a[1], 10, "base"));
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_int()) return v;
  if (v.is_bool()) return Value(v.to_int());
  if (v.is_float()) {
    const double f = v.as_float();
    if (!std::isfinite(f)) return dflt;
    return Value(static_cast<int64_t>(std::trunc(f)));
  }
  if (v.is_string()) {
    if (auto i = parse_int(v.as_string(), base)) return Value(*i);
    if (auto f = parse_float(v.as_string()); f && std::isfinite(*f))
      return Value(static_cast<int64_t>(std::trunc(*f)));
  }
  return dflt;
}

Value f_float(Interpreter&, const Value& v, CallArgs& args) {
  const auto a = bind_args("float", args, {"default"});
  const Value dflt = given(a[0]) ? a[0] : Value(0.0);
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_number()) return Value(v.to_double());
  if (v.is_string()) {
    if (auto f = parse_float(v.as_string())) return Value(*f);
  }
  return dflt;
}

Value f_list(Interpreter& in, const Value& v, CallArgs& args) {
  bind_args("list", args, {});
  return Value::list(in.iterate(v));
}

Value f_map(Interpreter& in, const Value& v, CallArgs& args) {
  std::vector<Value> out;
  const Value* attribute = nullptr;
  const Value* dflt = nullptr;
  for (const auto& [name, value] : args.keyword) {
    if (name == "attribute") {
      attribute = &value;
    } else if (name == "default") {
      dflt = &value;
    }
  }
  if (attribute) {
    const std::string path = string_arg(*attribute, "map attribute");
    for (const Value& item : in.iterate(v)) {
      Value r = get_path(in, item, path);
      if (r.is_undefined() && dflt) r = *dflt;
      out.push_back(std::move(r));
    }
    return Value::generator(std::move(out));
  }
  if (args.positional.empty()) eval_fail("map requires a filter name or attribute=");
  const std::string filter = string_arg(args.positional[0], "map filter");
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : in.iterate(v)) {
    CallArgs copy = rest;
    out.push_back(in.apply_filter(filter, item, copy));
  }
  return Value::generator(std::move(out));
}

Value select_impl(Interpreter& in, const Value& v, CallArgs& args, bool keep, bool by_attribute) {
  std::optional<std::string> attribute;
  size_t next = 0;
  if (by_attribute) {
    if (args.positional.empty()) eval_fail("selectattr/rejectattr need an attribute name");
    attribute = string_arg(args.positional[0], "attribute");
    next = 1;
  }
  std::optional<std::string> test;
  if (args.positional.size() > next) test = string_arg(args.positional[next++], "test name");
  std::vector<Value> extra(args.positional.begin() + static_cast<std::ptrdiff_t>(std::min(next, args.positional.size())),
                           args.positional.end());
  std::vector<Value> out;
  for (const Value& item : in.iterate(v)) {
    const Value probe = attribute ? get_path(in, item, *attribute) : item;
    if (run_test(in, test ? &*test : nullptr, probe, extra) == keep) out.push_back(item);
  }
  return Value::generator(std::move(out));
}

Value f_select(Interpreter& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, true, false); }
Value f_reject(Interpreter& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, false, false); }
Value f_selectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, true, true); }
Value f_rejectattr(Interpreter& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, false, true); }

Value f_replace(Interpreter&, const Value& v, CallArgs& args) {
  const auto a = bind_args("replace", args, {"old", "new", "count"});
  if (!given(a[0]) || !given(a[1])) eval_fail("replace needs old and new");
  const int64_t count = (given(a[2]) && !a[2].is_none()) ? int_arg(a[2], -1, "count") : -1;
  return Value(pystr::replace(v.str(), a[0].str(), a[1].str(), count));
}

Value f_safe(Interpreter&, const Value& v, CallArgs& args) {
  bind_args("safe", args, {});
  return v.is_string() ? v : Value(v.str());
}

Value f_escape(Interpreter&, const Value& v, CallArgs& args) {
  bind_args("escape", args, {});
  return Value(html_escape(v.str()));
}

Value f_unique(Interpreter& in, const Value& v, CallArgs& args) {
  const auto a = bind_args("unique", args, {"case_sensitive", "attribute"});
  const bool case_sensitive = bool_arg(a[0], false);
  const auto attribute = opt_string(a[1], "unique attribute");
  std::vector<Value> out, seen;
  for (const Value& item : in.iterate(v)) {
    Value key = sort_key(in, item, attribute, case_sensitive);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) {
      seen.push_back(std::move(key));
      out.push_back(item);
    }
  }
  return Value::generator(std::move(out));
}

Value f_sort(Interpreter& in, const Value& v, CallArgs& args) {
  const auto a = bind_args("sort", args, {"reverse", "case_sensitive", "attribute"});
  const bool reverse = bool_arg(a[0], false);
  const bool case_sensitive = bool_arg(a[1], false);
  const auto attribute = opt_string(a[2], "sort attribute");
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : in.iterate(v)) keyed.emplace_back(sort_key(in, item, attribute, case_sensitive), item);
  // Python's sort is stable, and reverse=True keeps equal items in order.
  std::stable_sort(keyed.begin(), keyed.end(), [reverse](const auto& x, const auto& y) {
    return reverse ? less(y.first, x.first) : less(x.first, y.first);
  });
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return Value::list(std::move(out));
}

Value f_dictsort(Interpreter&, const Value& v, CallArgs& args) {
  const auto a = bind_args("dictsort", args, {"case_sensitive", "by", "reverse"});
  if (!v.is_dict()) eval_fail("dictsort expects a mapping, got ", v.type_name());
  const bool case_sensitive = bool_arg(a[0], false);
  const std::string by = given(a[1]) ? string_arg(a[1], "by") : "key";
  if (by != "key" && by != "value") eval_fail("You can only sort by either \"key\" or \"value\"");
  const bool reverse = bool_arg(a[2], false);
  std::vector<std::pair<Value, Value>> items = v.as_dict().items;
  auto key = [&](const std::pair<Value, Value>& kv) {
    const Value& k = by == "key" ? kv.first : kv.second;
    return (!case_sensitive && k.is_string()) ? Value(pystr::lower(k.as_string())) : k;
  };
  std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) {
    return reverse ? less(key(y), key(x)) : less(key(x), key(y));
  });
  std::vector<Value> out;
  for (auto& kv : items) out.push_back(Value::tuple({kv.first, kv.second}));
  return Value::list(std::move(out));
}

Value f_reverse(Interpreter& in, const Value& v, CallArgs& args) {
  bind_args("reverse", args, {});
  if (v.is_string()) {
    std::u32string u = pystr::decode(v.as_string());
    std::reverse(u.begin(), u.end());
    return Value(pystr::encode(u));
  }
  std::vector<Value> items = in.iterate(v);
  std::reverse(items.begin(), items.end());
  // reversed() of a sequence is an iterator; a generator is not reversible,
  // so jinja2 falls back to a reversed list.
  return v.is_generator() ? Value::list(std::move(items)) : Value::generator(std::move(items));
}

Value f_abs(Interpreter&, const Value& v, CallArgs& args) {
  bind_args("abs", args, {});
  if (v.is_float()) return Value(std::fabs(v.as_float()));
  if (v.is_int() || v.is_bool()) {
    const int64_t i = v.to_int();
    if (i == std::numeric_limits<int64_t>::min()) eval_fail("integer overflow");
    return Value(i < 0 ? -i : i);
  }
  if (v.is_undefined()) fail_undefined(v);
  eval_fail("bad operand type for abs(): '", v.type_name(), "'");
}

// Python's round(x, n): correctly rounded, ties to even on the exact binary
// value, which glibc's printf also does.
double python_round(double x, int64_t digits) {
  if (!std::isfinite(x)) return x;
  if (digits >= 0) {
    if (digits > 300) return x;
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(digits), x);
    return std::strtod(buf, nullptr);
  }
  const double scale = std::pow(10.0, static_cast<double>(-digits));
  return std::nearbyint(x / scale) * scale;
}

Value f_round(Interpreter&, const Value& v, CallArgs& args) {
  const auto a = bind_args("round", args, {"precision", "method"});
  const int64_t precision = int_arg(a[0], 0, "precision");
  const std::string method = given(a[1]) ? string_arg(a[1], "method") : "common";
  if (method != "common" && method != "ceil" && method != "floor")
    eval_fail("method must be common, ceil or floor");
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_number()) eval_fail("type ", v.type_name(), " doesn't define __round__ method");
  if (method == "common") {
    if (!v.is_float() && precision >= 0) return Value(v.to_int());
    const double r = python_round(v.to_double(), precision);
    return v.is_float() ? Value(r) : Value(static_cast<int64_t>(r));
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = v.to_double() * scale;
  return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

Value f_indent(Interpreter&, const Value& v, CallArgs& args) {
  const auto a = bind_args("indent", args, {"width", "first", "blank"});
  std::string indention;
  if (given(a[0]) && a[0].is_string()) {
    indention = a[0].as_string();
  } else {
    indention.assign(static_cast<size_t>(std::max<int64_t>(0, int_arg(a[0], 4, "width"))), ' ');
  }
  const bool first = bool_arg(a[1], false);
  const bool blank = bool_arg(a[2], false);
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_string()) eval_fail("indent expects a string, got ", v.type_name());
  // jinja2 appends a newline so splitlines() sees a trailing empty line.
  const std::vector<std::string> lines = pystr::splitlines(v.str() + "\n", false);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      out += '\n';
      if (blank || !lines[i].empty()) out += indention;
    }
    out += lines[i];
  }
  if (first) out = indention + out;
  return Value(std::move(out));
}

Value f_wordcount(Interpreter&, const Value& v, CallArgs& args) {
  bind_args("wordcount", args, {});
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : pystr::decode(v.str())) {
    const bool w = pystr::is_word(c);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}

Value f_batch(Interpreter& in, const Value& v, CallArgs& args) {
  const auto a = bind_args("batch", args, {"linecount", "fill_with"});
  const int64_t n = int_arg(a[0], 0, "linecount");
  if (n <= 0) eval_fail("batch size must be positive");
  std::vector<Value> out, cur;
  for (const Value& item : in.iterate(v)) {
    cur.push_back(item);
    if (static_cast<int64_t>(cur.size()) == n) out.push_back(Value::list(std::exchange(cur, {})));
  }
  if (!cur.empty()) {
    if (given(a[1]) && !a[1].is_none())
      while (static_cast<int64_t>(cur.size()) < n) cur.push_back(a[1]);
    out.push_back(Value::list(std::move(cur)));
  }
  return Value::generator(std::move(out));
}

Value f_sum(Interpreter& in, const Value& v, CallArgs& args) {
  const auto a = bind_args("sum", args, {"attribute", "start"});
  const auto attribute = opt_string(a[0], "sum attribute");
  Value total = given(a[1]) ? a[1] : Value(int64_t{0});
  for (const Value& item : in.iterate(v)) {
    const Value x = attribute ? get_path(in, item, *attribute) : item;
    if (!x.is_number() || !total.is_number())
      eval_fail("unsupported operand type(s) for +: '", total.type_name(), "' and '", x.type_name(), "'");
    if (x.is_float() || total.is_float()) {
      total = Value(total.to_double() + x.to_double());
    } else {
      int64_t r;
      if (__builtin_add_overflow(total.to_int(), x.to_int(), &r)) eval_fail("integer overflow");
      total = Value(r);
    }
  }
  return total;
}

Value min_max(Interpreter& in, const Value& v, CallArgs& args, bool want_max) {
  const auto a = bind_args(want_max ? "max" : "min", args, {"case_sensitive", "attribute"});
  const bool case_sensitive = bool_arg(a[0], false);
  const auto attribute = opt_string(a[1], "attribute");
  std::optional<Value> best, best_key;
  for (const Value& item : in.iterate(v)) {
    Value key = sort_key(in, item, attribute, case_sensitive);
    if (!best || (want_max ? less(*best_key, key) : less(key, *best_key))) {
      best = item;
      best_key = std::move(key);
    }
  }
  if (!best) return Value::undefined("No aggregated item, sequence was empty.");
  return *best;
}

Value f_min(Interpreter& in, const Value& v, CallArgs& a) { return min_max(in, v, a, false); }
Value f_max(Interpreter& in, const Value& v, CallArgs& a) { return min_max(in, v, a, true); }

Value f_attr(Interpreter& in, const Value& v, CallArgs& args) {
  const auto a = bind_args("attr", args, {"name"});
  const std::string& name = string_arg(a[0], "attr name");
  if (v.is_dict() && !has_method(v, name))
    return Value::undefined("'dict object' has no attribute '" + name + "'");
  return in.getattr(v, name);
}

Value f_center(Interpreter&, const Value& v, CallArgs& args) {
  const auto a = bind_args("center", args, {"width"});
  const int64_t width = int_arg(a[0], 80, "width");
  const std::string s = v.str();
  const int64_t len = pystr::length(s);
  if (width <= len) return Value(s);
  const int64_t pad = width - len;
  const int64_t left = pad / 2 + (pad & width & 1);
  return Value(std::string(static_cast<size_t>(left), ' ') + s +
               std::string(static_cast<size_t>(pad - left), ' '));
}

// jinja2's truncate with its default leeway of 5.
Value f_truncate(Interpreter&, const Value& v, CallArgs& args) {
  const auto a = bind_args("truncate", args, {"length", "killwords", "end", "leeway"});
  const int64_t length = int_arg(a[0], 255, "length");
  const bool killwords = bool_arg(a[1], false);
  const std::string end = given(a[2]) ? string_arg(a[2], "end") : "...";
  const int64_t leeway = (given(a[3]) && !a[3].is_none()) ? int_arg(a[3], 5, "leeway") : 5;
  const int64_t end_len = pystr::length(end);
  if (length < end_len) eval_fail("expected length >= ", end_len, ", got ", length);
  if (leeway < 0) eval_fail("expected leeway >= 0, got ", leeway);
  const std::u32string s = pystr::decode(v.str());
  if (static_cast<int64_t>(s.size()) <= length + leeway) return Value(v.str());
  std::u32string head = s.substr(0, static_cast<size_t>(length - end_len));
  if (!killwords) {
    const size_t space = head.rfind(U' ');
    if (space != std::u32string::npos) head.resize(space);
  }
  return Value(pystr::encode(head) + end);
}

Value f_format(Interpreter&, const Value& v, CallArgs& args) {
  if (!args.positional.empty() && !args.keyword.empty())
    eval_fail("can't handle positional and keyword arguments at the same time");
  if (!args.keyword.empty()) {
    Dict d;
    for (auto& [k, x] : args.keyword) d.set(Value(k), x);
    return Value(percent_format(v.str(), Value::dict(std::move(d))));
  }
  return Value(percent_format(v.str(), Value::tuple(args.positional)));
}

// ---- tests ----

void no_args(std::string_view name, CallArgs& args) { bind_args(name, args, {}); }

bool t_defined(Interpreter&, const Value& v, CallArgs& a) { no_args("defined", a); return !v.is_undefined(); }
bool t_undefined(Interpreter&, const Value& v, CallArgs& a) { no_args("undefined", a); return v.is_undefined(); }
bool t_none(Interpreter&, const Value& v, CallArgs& a) { no_args("none", a); return v.is_none(); }
bool t_boolean(Interpreter&, const Value& v, CallArgs& a) { no_args("boolean", a); return v.is_bool(); }
bool t_true(Interpreter&, const Value& v, CallArgs& a) { no_args("true", a); return v.is_bool() && v.as_bool(); }
bool t_false(Interpreter&, const Value& v, CallArgs& a) { no_args("false", a); return v.is_bool() && !v.as_bool(); }
bool t_integer(Interpreter&, const Value& v, CallArgs& a) { no_args("integer", a); return v.is_int(); }
bool t_float(Interpreter&, const Value& v, CallArgs& a) { no_args("float", a); return v.is_float(); }
// bool is a numbers.Number in Python.
bool t_number(Interpreter&, const Value& v, CallArgs& a) { no_args("number", a); return v.is_number(); }
bool t_string(Interpreter&, const Value& v, CallArgs& a) { no_args("string", a); return v.is_string(); }
bool t_mapping(Interpreter&, const Value& v, CallArgs& a) { no_args("mapping", a); return v.is_dict(); }
// jinja2's Undefined is iterable (as empty) and has __len__/__getitem__.
bool t_iterable(Interpreter&, const Value& v, CallArgs& a) {
  no_args("iterable", a);
  return v.is_undefined() || v.is_list() || v.is_dict() || v.is_string();
}
bool t_sequence(Interpreter&, const Value& v, CallArgs& a) {
  no_args("sequence", a);
  return v.is_undefined() || (v.is_list() && !v.is_generator()) || v.is_dict() || v.is_string();
}
bool t_callable(Interpreter&, const Value& v, CallArgs& a) {
  no_args("callable", a);
  return v.is_function() || v.is_undefined();
}

Value one_arg(std::string_view name, CallArgs& args, std::string_view param) {
  std::vector<Value> bound = bind_args(name, args, {param});
  if (!given(bound[0])) eval_fail("test '", name, "' needs an argument");
  return std::move(bound[0]);
}

bool t_sameas(Interpreter&, const Value& v, CallArgs& a) {
  const Value other = one_arg("sameas", a, "other");
  if (v.kind() != other.kind()) return false;
  if (v.identity()) return v.identity() == other.identity();
  return equals(v, other);
}
bool t_eq(Interpreter&, const Value& v, CallArgs& a) { return equals(v, one_arg("eq", a, "other")); }
bool t_ne(Interpreter&, const Value& v, CallArgs& a) { return !equals(v, one_arg("ne", a, "other")); }
bool t_lt(Interpreter&, const Value& v, CallArgs& a) { return less(v, one_arg("lt", a, "other")); }
bool t_gt(Interpreter&, const Value& v, CallArgs& a) { return less(one_arg("gt", a, "other"), v); }
bool t_le(Interpreter&, const Value& v, CallArgs& a) {
  const Value o = one_arg("le", a, "other");
  return less(v, o) || equals(v, o);
}
bool t_ge(Interpreter&, const Value& v, CallArgs& a) {
  const Value o = one_arg("ge", a, "other");
  return less(o, v) || equals(v, o);
}

// Python's `value in seq`.
bool t_in(Interpreter&, const Value& v, CallArgs& a) {
  const Value seq = one_arg("in", a, "seq");
  switch (seq.kind()) {
    case Value::Kind::Undefined: return false;
    case Value::Kind::String:
      if (!v.is_string())
        eval_fail("'in <string>' requires string as left operand, not ", v.type_name());
      return seq.as_string().find(v.as_string()) != std::string::npos;
    case Value::Kind::List:
      return std::any_of(seq.items().begin(), seq.items().end(), [&](const Value& x) { return equals(x, v); });
    case Value::Kind::Dict:
      if ((v.is_list() && !v.is_tuple()) || v.is_dict()) eval_fail("unhashable type: '", v.type_name(), "'");
      return seq.as_dict().find(v) != nullptr;
    default: eval_fail("argument of type '", seq.type_name(), "' is not iterable");
  }
}

int64_t int_operand(const Value& v) {
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_int() && !v.is_bool()) eval_fail("expected an integer, got ", v.type_name());
  return v.to_int();
}

// value % 2 == 1 (or 0), with Python's % for floats.
double mod2(const Value& v) {
  if (v.is_float()) {
    double r = std::fmod(v.as_float(), 2.0);
    return r < 0 ? r + 2.0 : r;
  }
  const int64_t r = int_operand(v) % 2;
  return static_cast<double>(r < 0 ? r + 2 : r);
}

bool t_odd(Interpreter&, const Value& v, CallArgs& a) { no_args("odd", a); return mod2(v) == 1.0; }
bool t_even(Interpreter&, const Value& v, CallArgs& a) { no_args("even", a); return mod2(v) == 0.0; }
bool t_divisibleby(Interpreter&, const Value& v, CallArgs& a) {
  const Value n = one_arg("divisibleby", a, "num");
  if (v.is_float() || n.is_float()) {
    const double d = n.to_double();
    if (d == 0.0) eval_fail("float modulo");
    return std::fmod(v.to_double(), d) == 0.0;
  }
  const int64_t d = int_operand(n);
  if (d == 0) eval_fail("integer division or modulo by zero");
  return d == -1 || int_operand(v) % d == 0;
}

bool has_cased_all(const std::string& s, bool upper) {
  bool cased = false;
  for (char32_t c : pystr::decode(s)) {
    if (!pystr::is_cased(c)) continue;
    cased = true;
    if ((upper ? pystr::to_upper(c) : pystr::to_lower(c)) != c) return false;
  }
  return cased;
}

bool t_lower(Interpreter&, const Value& v, CallArgs& a) { no_args("lower", a); return has_cased_all(v.str(), false); }
bool t_upper(Interpreter&, const Value& v, CallArgs& a) { no_args("upper", a); return has_cased_all(v.str(), true); }
bool t_escaped(Interpreter&, const Value&, CallArgs& a) { no_args("escaped", a); return false; }
bool t_filter(Interpreter&, const Value& v, CallArgs& a) {
  no_args("filter", a);
  return v.is_string() && find_filter(v.as_string()) != nullptr;
}
bool t_test(Interpreter&, const Value& v, CallArgs& a) {
  no_args("test", a);
  return v.is_string() && find_test(v.as_string()) != nullptr;
}

template <typename Fn>
struct Named {
  std::string_view name;
  Fn fn;
};

constexpr Named<FilterFn> kFilters[] = {
    {"abs", f_abs}, {"attr", f_attr}, {"batch", f_batch}, {"capitalize", f_capitalize},
    {"center", f_center}, {"count", f_length}, {"d", f_default}, {"default", f_default},
    {"dictsort", f_dictsort}, {"e", f_escape}, {"escape", f_escape}, {"first", f_first},
    {"float", f_float}, {"forceescape", f_escape}, {"format", f_format}, {"indent", f_indent},
    {"int", f_int}, {"items", f_items}, {"join", f_join}, {"last", f_last}, {"length", f_length},
    {"list", f_list}, {"lower", f_lower}, {"map", f_map}, {"max", f_max}, {"min", f_min},
    {"reject", f_reject}, {"rejectattr", f_rejectattr}, {"replace", f_replace},
    {"reverse", f_reverse}, {"round", f_round}, {"safe", f_safe}, {"select", f_select},
    {"selectattr", f_selectattr}, {"sort", f_sort}, {"string", f_string}, {"sum", f_sum},
    {"title", f_title}, {"tojson", f_tojson}, {"trim", f_trim}, {"truncate", f_truncate},
    {"unique", f_unique},
    {"upper", f_upper}, {"wordcount", f_wordcount},
};

constexpr Named<TestFn> kTests[] = {
    {"!=", t_ne}, {"<", t_lt}, {"<=", t_le}, {"==", t_eq}, {">", t_gt}, {">=", t_ge},
    {"boolean", t_boolean}, {"callable", t_callable}, {"defined", t_defined},
    {"divisibleby", t_divisibleby}, {"eq", t_eq}, {"equalto", t_eq}, {"escaped", t_escaped},
    {"even", t_even}, {"false", t_false}, {"filter", t_filter}, {"float", t_float},
    {"ge", t_ge}, {"greaterthan", t_gt}, {"gt", t_gt}, {"in", t_in}, {"integer", t_integer},
    {"iterable", t_iterable}, {"le", t_le}, {"lessthan", t_lt}, {"lower", t_lower}, {"lt", t_lt},
    {"mapping", t_mapping}, {"ne", t_ne}, {"none", t_none}, {"number", t_number}, {"odd", t_odd},
    {"sameas", t_sameas}, {"sequence", t_sequence}, {"string", t_string}, {"test", t_test},
    {"true", t_true}, {"undefined", t_undefined}, {"upper", t_upper},
};

// ---- globals ----

Value g_range(Interpreter&, CallArgs& args) {
  if (!args.keyword.empty()) eval_fail("range() takes no keyword arguments");
  const auto& p = args.positional;
  if (p.empty() || p.size() > 3) eval_fail("range expected 1 to 3 arguments, got ", p.size());
  for (const Value& v : p) {
    if (v.is_undefined()) fail_undefined(v);
    if (!v.is_int() && !v.is_bool())
      eval_fail("'", v.type_name(), "' object cannot be interpreted as an integer");
  }
  const int64_t start = p.size() == 1 ? 0 : p[0].to_int();
  const int64_t stop = p.size() == 1 ? p[0].to_int() : p[1].to_int();
  const int64_t step = p.size() == 3 ? p[2].to_int() : 1;
  if (step == 0) eval_fail("range() arg 3 must not be zero");
  const long double span = step > 0 ? static_cast<long double>(stop) - start : static_cast<long double>(start) - stop;
  const long double count = span <= 0 ? 0 : std::ceil(span / std::fabs(static_cast<long double>(step)));
  if (count > kMaxRange)
    eval_fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (", kMaxRange, ").");
  std::vector<Value> out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t i = 0, v = start; i < static_cast<int64_t>(count); ++i, v += step) out.emplace_back(v);
  return Value::list(std::move(out));
}

// dict(mapping, **kwargs) / namespace(mapping, **kwargs)
Dict mapping_from_args(std::string_view fn, CallArgs& args) {
  Dict d;
  if (args.positional.size() > 1) eval_fail(fn, "() expected at most 1 positional argument");
  if (!args.positional.empty()) {
    const Value& m = args.positional[0];
    if (m.is_dict()) {
      d = m.as_dict();
    } else if (m.is_list()) {
      for (const Value& pair : m.items()) {
        if (!pair.is_list() || pair.items().size() != 2) eval_fail(fn, "() sequence elements must be pairs");
        d.set(pair.items()[0], pair.items()[1]);
      }
    } else {
      eval_fail("'", m.type_name(), "' object is not a mapping");
    }
  }
  for (auto& [k, v] : args.keyword) d.set(Value(k), std::move(v));
  return d;
}

Value g_namespace(Interpreter& in, CallArgs& args) {
  auto ns = std::make_shared<Namespace>();
  in.track(ns);
  for (auto& [k, v] : mapping_from_args("namespace", args).items) {
    if (!k.is_string()) eval_fail("namespace() keys must be strings");
    ns->set(k.as_string(), std::move(v));
  }
  return Value(std::move(ns));
}

Value g_dict(Interpreter&, CallArgs& args) { return Value::dict(mapping_from_args("dict", args)); }

// transformers raises jinja2.TemplateError(message).
Value g_raise_exception(Interpreter&, CallArgs& args) {
  const auto a = bind_args("raise_exception", args, {"message"});
  throw EvalError(a[0].str());
}

// datetime.now().strftime(format), in local time as transformers does.
Value g_strftime_now(Interpreter&, CallArgs& args) {
  const auto a = bind_args("strftime_now", args, {"format"});
  const std::string& fmt = string_arg(a[0], "strftime_now format");
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  if (fmt.empty()) return Value("");
  for (size_t cap = 256; cap <= (size_t{1} << 20); cap *= 4) {
    std::string buf(cap, '\0');
    const size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
    if (n > 0) {
      buf.resize(n);
      return Value(std::move(buf));
    }
  }
  return Value("");
}

// ---- methods ----

constexpr std::string_view kStrMethods[] = {
    "capitalize", "count", "endswith", "find", "format", "index", "isalnum", "isalpha",
    "isdecimal", "isdigit", "islower", "isnumeric", "isspace", "isupper", "join", "lower",
    "lstrip", "removeprefix", "removesuffix", "replace", "rfind", "rsplit", "rstrip", "split",
    "splitlines", "startswith", "strip", "title", "upper", "zfill",
};
constexpr std::string_view kDictMethods[] = {"get", "items", "keys", "values"};
constexpr std::string_view kListMethods[] = {"count", "index"};
// Methods ImmutableSandboxedEnvironment refuses (they mutate).
constexpr std::string_view kUnsafeMethods[] = {"append", "clear", "extend", "insert", "pop", "popitem",
                                               "remove", "reverse", "setdefault", "sort", "update"};

template <size_t N>
bool contains(const std::string_view (&list)[N], std::string_view name) {
  return std::find(std::begin(list), std::end(list), name) != std::end(list);
}

// str[start:end] in code points, for startswith/endswith's optional bounds.
std::string substring(const std::string& s, const Value& start, const Value& end) {
  if (!given(start) && !given(end)) return s;
  const std::u32string u = pystr::decode(s);
  const auto n = static_cast<int64_t>(u.size());
  auto norm = [n](const Value& v, int64_t dflt) {
    if (!given(v) || v.is_none()) return dflt;
    int64_t i = v.to_int();
    if (i < 0) i = std::max<int64_t>(0, i + n);
    return std::min(i, n);
  };
  const int64_t b = norm(start, 0), e = norm(end, n);
  if (b >= e) return "";
  return pystr::encode(u.substr(static_cast<size_t>(b), static_cast<size_t>(e - b)));
}

bool affix_match(const std::string& s, const Value& affix, bool prefix, std::string_view fn) {
  auto one = [&](const Value& a) {
    if (!a.is_string())
      eval_fail(fn, " first arg must be str or a tuple of str, not ", a.type_name());
    const std::string& x = a.as_string();
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_tuple()) return std::any_of(affix.items().begin(), affix.items().end(), one);
  return one(affix);
}

bool all_chars(const std::string& s, bool (*pred)(char32_t)) {
  const std::u32string u = pystr::decode(s);
  return !u.empty() && std::all_of(u.begin(), u.end(), pred);
}

bool is_alpha(char32_t c) {
  if (c < 0x80) return ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
  if (c > 0x10FFFF) return false;
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
}
bool is_decimal(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  if (c > 0x10FFFF) return false;
  return utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_ND;
}
bool is_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  if (c > 0x10FFFF) return false;
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}
bool is_alnum(char32_t c) { return is_alpha(c) || is_numeric(c); }
bool is_space_char(char32_t c) { return pystr::is_space(c); }

// Python's str.format for "{}", "{0}", "{name}", "{0.attr}", "{name[key]}"
// and "!r"/"!s"; format specs are not supported.
std::string str_format(Interpreter& in, const std::string& fmt, CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out += '}';
        ++i;
        continue;
      }
      eval_fail("Single '}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    const size_t close = fmt.find('}', i);
    if (close == std::string::npos) eval_fail("Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    i = close;
    char conversion = 0;
    if (const size_t colon = field.find(':'); colon != std::string::npos) {
      if (colon + 1 < field.size()) eval_fail("format specs are not supported in str.format");
      field.resize(colon);
    }
    if (const size_t bang = field.find('!'); bang != std::string::npos) {
      if (bang + 2 != field.size()) eval_fail("bad conversion in format string");
      conversion = field[bang + 1];
      field.resize(bang);
    }
    size_t head_end = std::min(field.find('.'), field.find('['));
    const std::string head = field.substr(0, head_end);
    Value v;
    if (head.empty()) {
      if (auto_index >= args.positional.size()) eval_fail("Replacement index ", auto_index, " out of range");
      v = args.positional[auto_index++];
    } else if (const auto k = parse_index(head)) {
      if (*k >= static_cast<int64_t>(args.positional.size()))
        eval_fail("Replacement index ", *k, " out of range");
      v = args.positional[static_cast<size_t>(*k)];
    } else {
      auto it = std::find_if(args.keyword.begin(), args.keyword.end(),
                             [&](const auto& kv) { return kv.first == head; });
      if (it == args.keyword.end()) eval_fail("KeyError: '", head, "'");
      v = it->second;
    }
    size_t p = head_end;
    while (p < field.size()) {
      if (field[p] == '.') {
        const size_t e = std::min(field.find('.', p + 1), field.find('[', p + 1));
        v = in.getattr(v, field.substr(p + 1, e - p - 1));
        p = e;
      } else {
        const size_t e = field.find(']', p);
        if (e == std::string::npos) eval_fail("Missing ']' in format string");
        const std::string key = field.substr(p + 1, e - p - 1);
        const auto index = parse_index(key);
        v = in.getitem(v, index ? Value(*index) : Value(key));
        p = e + 1;
      }
    }
    out += conversion == 'r' ? v.repr() : v.str();
  }
  return out;
}

}  // namespace

FilterFn find_filter(std::string_view name) {
  for (const auto& f : kFilters)
    if (f.name == name) return f.fn;
  return nullptr;
}

TestFn find_test(std::string_view name) {
  for (const auto& t : kTests)
    if (t.name == name) return t.fn;
  return nullptr;
}

std::vector<std::pair<std::string, Value>> make_globals() {
  std::vector<std::pair<std::string, Value>> g;
  g.emplace_back("range", Value::function("range", g_range));
  g.emplace_back("namespace", Value::function("namespace", g_namespace));
  g.emplace_back("dict", Value::function("dict", g_dict));
  g.emplace_back("raise_exception", Value::function("raise_exception", g_raise_exception));
  g.emplace_back("strftime_now", Value::function("strftime_now", g_strftime_now));
  return g;
}

std::vector<Value> bind_args(std::string_view function, CallArgs& args,
                             std::initializer_list<std::string_view> params) {
  std::vector<Value> out(params.size());
  if (args.positional.size() > params.size())
    eval_fail(function, "() takes at most ", params.size(), " argument(s) (", args.positional.size(),
              " given)");
  std::vector<bool> set(params.size(), false);
  for (size_t i = 0; i < args.positional.size(); ++i) {
    out[i] = std::move(args.positional[i]);
    set[i] = true;
  }
  for (auto& [name, value] : args.keyword) {
    const auto it = std::find(params.begin(), params.end(), name);
    if (it == params.end()) eval_fail(function, "() got an unexpected keyword argument '", name, "'");
    const auto k = static_cast<size_t>(it - params.begin());
    if (set[k]) eval_fail(function, "() got multiple values for argument '", name, "'");
    out[k] = std::move(value);
    set[k] = true;
  }
  return out;
}

bool has_method(const Value& obj, std::string_view name) {
  switch (obj.kind()) {
    case Value::Kind::String: return contains(kStrMethods, name);
    case Value::Kind::Dict: return contains(kDictMethods, name);
    case Value::Kind::List: return contains(kListMethods, name);
    default: return false;
  }
}

bool call_method(Interpreter& in, const Value& obj, std::string_view name, CallArgs& args,
                 Value& out) {
  if ((obj.is_list() || obj.is_dict()) && contains(kUnsafeMethods, name))
    eval_fail("access to attribute '", name, "' of '", obj.type_name(), "' object is unsafe");
  if (!has_method(obj, name)) return false;
  const std::string fn = obj.type_name() + "." + std::string(name);
  if (obj.is_dict()) {
    const Dict& d = obj.as_dict();
    if (name == "get") {
      const auto a = bind_args(fn, args, {"key", "default"});
      const Value* v = d.find(a[0]);
      out = v ? *v : (given(a[1]) ? a[1] : Value::none());
    } else {
      bind_args(fn, args, {});
      std::vector<Value> items;
      for (const auto& [k, v] : d.items) {
        items.push_back(name == "items" ? Value::tuple({k, v}) : name == "keys" ? k : v);
      }
      out = Value::list(std::move(items));
    }
    return true;
  }
  if (obj.is_list()) {
    const auto a = bind_args(fn, args, {"value"});
    const auto& items = obj.items();
    if (name == "count") {
      out = Value(static_cast<int64_t>(
          std::count_if(items.begin(), items.end(), [&](const Value& x) { return equals(x, a[0]); })));
    } else {
      const auto it = std::find_if(items.begin(), items.end(), [&](const Value& x) { return equals(x, a[0]); });
      if (it == items.end()) eval_fail(a[0].repr(), " is not in list");
      out = Value(static_cast<int64_t>(it - items.begin()));
    }
    return true;
  }
  const std::string& s = obj.as_string();
  if (name == "format") {
    out = Value(str_format(in, s, args));
    return true;
  }
  if (name == "startswith" || name == "endswith") {
    const auto a = bind_args(fn, args, {"affix", "start", "end"});
    if (!given(a[0])) eval_fail(fn, "() takes at least 1 argument (0 given)");
    out = Value(affix_match(substring(s, a[1], a[2]), a[0], name == "startswith", name));
  } else if (name == "split" || name == "rsplit") {
    const auto a = bind_args(fn, args, {"sep", "maxsplit"});
    const auto sep = opt_string(a[0], "sep");
    const int64_t maxsplit = int_arg(a[1], -1, "maxsplit");
    std::vector<Value> parts;
    for (auto& p : name == "split" ? pystr::split(s, sep, maxsplit) : pystr::rsplit(s, sep, maxsplit))
      parts.emplace_back(std::move(p));
    out = Value::list(std::move(parts));
  } else if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const auto a = bind_args(fn, args, {"chars"});
    out = Value(pystr::strip(s, opt_string(a[0], "chars"), name != "rstrip", name != "lstrip"));
  } else if (name == "replace") {
    const auto a = bind_args(fn, args, {"old", "new", "count"});
    out = Value(pystr::replace(s, string_arg(a[0], "old"), string_arg(a[1], "new"), int_arg(a[2], -1, "count")));
  } else if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    bind_args(fn, args, {});
    out = Value(name == "upper" ? pystr::upper(s)
                : name == "lower" ? pystr::lower(s)
                : name == "title" ? pystr::title(s)
                                  : pystr::capitalize(s));
  } else if (name == "count" || name == "find" || name == "rfind" || name == "index") {
    const auto a = bind_args(fn, args, {"sub"});
    const std::string& sub = string_arg(a[0], "sub");
    if (name == "count") {
      out = Value(pystr::count(s, sub));
    } else {
      const int64_t at = name == "rfind" ? pystr::rfind(s, sub) : pystr::find(s, sub);
      if (name == "index" && at < 0) eval_fail("substring not found");
      out = Value(at);
    }
  } else if (name == "join") {
    const auto a = bind_args(fn, args, {"iterable"});
    std::string joined;
    size_t k = 0;
    for (const Value& item : in.iterate(a[0])) {
      if (!item.is_string())
        eval_fail("sequence item ", k, ": expected str instance, ", item.type_name(), " found");
      if (k++) joined += s;
      joined += item.as_string();
    }
    out = Value(std::move(joined));
  } else if (name == "splitlines") {
    const auto a = bind_args(fn, args, {"keepends"});
    std::vector<Value> lines;
    for (auto& l : pystr::splitlines(s, bool_arg(a[0], false))) lines.emplace_back(std::move(l));
    out = Value::list(std::move(lines));
  } else if (name == "removeprefix" || name == "removesuffix") {
    const auto a = bind_args(fn, args, {"affix"});
    const std::string& x = string_arg(a[0], "affix");
    const bool prefix = name == "removeprefix";
    if (affix_match(s, a[0], prefix, name)) {
      out = Value(prefix ? s.substr(x.size()) : s.substr(0, s.size() - x.size()));
    } else {
      out = obj;
    }
  } else if (name == "zfill") {
    const auto a = bind_args(fn, args, {"width"});
    const int64_t width = int_arg(a[0], 0, "width");
    const int64_t len = pystr::length(s);
    if (width <= len) {
      out = obj;
    } else {
      const size_t sign = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
      out = Value(s.substr(0, sign) + std::string(static_cast<size_t>(width - len), '0') + s.substr(sign));
    }
  } else {
    bind_args(fn, args, {});
    if (name == "isalnum") {
      out = Value(all_chars(s, is_alnum));
    } else if (name == "isalpha") {
      out = Value(all_chars(s, is_alpha));
    } else if (name == "isdigit" || name == "isdecimal") {
      out = Value(all_chars(s, is_decimal));
    } else if (name == "isnumeric") {
      out = Value(all_chars(s, is_numeric));
    } else if (name == "isspace") {
      out = Value(all_chars(s, is_space_char));
    } else if (name == "islower") {
      out = Value(has_cased_all(s, false));
    } else {
      out = Value(has_cased_all(s, true));
    }
  }
  return true;
}

// Python's printf-style formatting: %[(name)][flags][width][.precision]type.
std::string percent_format(std::string_view fmt, const Value& args) {
  std::vector<Value> positional;
  const Dict* mapping = args.is_dict() ? &args.as_dict() : nullptr;
  if (args.is_tuple()) {
    positional = args.items();
  } else if (!mapping) {
    positional.push_back(args);
  }
  size_t next = 0;
  std::string out;
  char buf[512];
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) eval_fail("incomplete format");
    if (fmt[i] == '%') {
      out += '%';
      continue;
    }
    Value v;
    bool have = false;
    if (fmt[i] == '(') {
      const size_t close = fmt.find(')', i);
      if (close == std::string_view::npos) eval_fail("incomplete format key");
      if (!mapping) eval_fail("format requires a mapping");
      const Value* found = mapping->find(fmt.substr(i + 1, close - i - 1));
      if (!found) eval_fail("KeyError: '", fmt.substr(i + 1, close - i - 1), "'");
      v = *found;
      have = true;
      i = close + 1;
    }
    std::string spec = "%";
    while (i < fmt.size() && std::string_view("-+ #0").find(fmt[i]) != std::string_view::npos) spec += fmt[i++];
    // Width and precision are capped so a template cannot ask for gigabytes.
    auto number = [&] {
      size_t digits = 0;
      while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) {
        spec += fmt[i++];
        if (++digits > 3) eval_fail("format width or precision too large");
      }
    };
    number();
    if (i < fmt.size() && fmt[i] == '.') {
      spec += fmt[i++];
      number();
    }
    if (i >= fmt.size()) eval_fail("incomplete format");
    const char type = fmt[i];
    if (!have) {
      if (next >= positional.size()) eval_fail("not enough arguments for format string");
      v = positional[next++];
    }
    switch (type) {
      case 's':
      case 'r': {
        const std::string s = type == 's' ? v.str() : v.repr();
        spec += 's';
        if (spec == "%s") {
          out += s;
        } else {
          // width/precision apply to code points; good enough for ASCII.
          std::string padded(static_cast<size_t>(std::snprintf(nullptr, 0, spec.c_str(), s.c_str())), '\0');
          std::snprintf(padded.data(), padded.size() + 1, spec.c_str(), s.c_str());
          out += padded;
        }
        break;
      }
      case 'd':
      case 'i':
      case 'x':
      case 'X':
      case 'o': {
        if (!v.is_number()) eval_fail("%", type, " format: a real number is required, not ", v.type_name());
        const long long n = v.is_float() ? static_cast<long long>(std::trunc(v.as_float())) : v.to_int();
        spec += "ll";
        spec += type == 'i' ? 'd' : type;
        std::snprintf(buf, sizeof buf, spec.c_str(), n);
        out += buf;
        break;
      }
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G': {
        if (!v.is_number()) eval_fail("must be real number, not ", v.type_name());
        spec += type;
        std::snprintf(buf, sizeof buf, spec.c_str(), v.to_double());
        out += buf;
        break;
      }
      default:
        eval_fail("unsupported format character '", type, "'");
    }
  }
  if (!mapping && next < positional.size()) eval_fail("not all arguments converted during string formatting");
  return out;
}

}  // namespace augur::jinja
