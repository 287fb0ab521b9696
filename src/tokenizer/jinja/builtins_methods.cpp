// The Python str/dict/list methods ImmutableSandboxedEnvironment allows, and
// printf-style `fmt % args`.
#include "tokenizer/jinja/builtins.h"

#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <string>

#include "tokenizer/jinja/builtins_impl.h"
#include "tokenizer/jinja/errors.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/pystr.h"

namespace augur::jinja {

using detail::bool_arg;
using detail::given;
using detail::has_cased_all;
using detail::int_arg;
using detail::opt_string;
using detail::parse_index;
using detail::string_arg;

namespace {

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
