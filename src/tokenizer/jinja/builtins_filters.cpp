// jinja2's builtin filters (jinja2/filters.py) and transformers' `tojson`
// (utils/chat_template_utils.py).
#include "tokenizer/jinja/builtins.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "tokenizer/jinja/builtins_impl.h"
#include "tokenizer/jinja/errors.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/pystr.h"

namespace augur::jinja {

using detail::bool_arg;
using detail::fail_undefined;
using detail::given;
using detail::int_arg;
using detail::Named;
using detail::opt_string;
using detail::parse_index;
using detail::string_arg;

namespace {

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

// jinja2's map, select, reject, selectattr and rejectattr yield nothing for
// a false value (none, 0, an empty string), before they look at their
// arguments: templates map a field that may be null (tool_calls).
Value f_map(Interpreter& in, const Value& v, CallArgs& args) {
  if (!v.truthy()) return Value::generator({});
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
  if (!v.truthy()) return Value::generator({});
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

}  // namespace

FilterFn find_filter(std::string_view name) {
  for (const auto& f : kFilters)
    if (f.name == name) return f.fn;
  return nullptr;
}

}  // namespace augur::jinja
