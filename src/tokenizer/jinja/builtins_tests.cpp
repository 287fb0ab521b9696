// jinja2's builtin tests (jinja2/tests.py).
#include "tokenizer/jinja/builtins.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "tokenizer/jinja/builtins_impl.h"
#include "tokenizer/jinja/errors.h"

namespace augur::jinja {

using detail::fail_undefined;
using detail::given;
using detail::has_cased_all;
using detail::Named;

namespace {

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

}  // namespace

TestFn find_test(std::string_view name) {
  for (const auto& t : kTests)
    if (t.name == name) return t.fn;
  return nullptr;
}

}  // namespace augur::jinja
