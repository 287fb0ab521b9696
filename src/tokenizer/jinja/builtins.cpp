// The builtins' shared argument helpers and argument binding, and
// transformers' globals (utils/chat_template_utils.py). The filters, tests and
// str/dict/list methods are in builtins_filters.cpp, builtins_tests.cpp and
// builtins_methods.cpp.
#include "tokenizer/jinja/builtins.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <ctime>
#include <optional>
#include <string>
#include <utility>

#include "tokenizer/jinja/builtins_impl.h"
#include "tokenizer/jinja/errors.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/pystr.h"

namespace augur::jinja {

namespace detail {

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

bool has_cased_all(const std::string& s, bool upper) {
  bool cased = false;
  for (char32_t c : pystr::decode(s)) {
    if (!pystr::is_cased(c)) continue;
    cased = true;
    if ((upper ? pystr::to_upper(c) : pystr::to_lower(c)) != c) return false;
  }
  return cased;
}

}  // namespace detail

using detail::fail_undefined;
using detail::string_arg;

namespace {

// ---- globals ----

// jinja2.sandbox.MAX_RANGE
constexpr int64_t kMaxRange = 100000;

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

}  // namespace

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

}  // namespace augur::jinja
