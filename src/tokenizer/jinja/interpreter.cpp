#include "tokenizer/jinja/interpreter.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/errors.h"
#include "tokenizer/jinja/pystr.h"

namespace augur::jinja {

namespace {

// Python manages ~1000 frames and jinja2 spends several per macro call.
constexpr int kMaxCallDepth = 200;
// Bounds what a template can allocate through `'x' * n` or `[x] * n`.
constexpr int64_t kMaxRepeatSize = int64_t{1} << 28;

[[noreturn]] void fail_undefined(const Value& v) {
  eval_fail(v.undefined_hint().empty() ? std::string("value is undefined") : v.undefined_hint());
}

std::string object_name(const Value& v) {
  std::string name = "'";  // built by appends: GCC 12 misreports "lit" + string&& (-Wrestrict)
  name += v.type_name();
  name += " object'";
  return name;
}

[[noreturn]] void unsupported(const char* op, const Value& a, const Value& b) {
  eval_fail("unsupported operand type(s) for ", op, ": '", a.type_name(), "' and '", b.type_name(),
            "'");
}

int64_t add_checked(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) eval_fail("integer overflow");
  return r;
}

int64_t sub_checked(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) eval_fail("integer overflow");
  return r;
}

int64_t mul_checked(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) eval_fail("integer overflow");
  return r;
}

Value repeat(const Value& seq, int64_t n) {
  n = std::max<int64_t>(n, 0);
  if (seq.is_string()) {
    const auto& s = seq.as_string();
    if (!s.empty() && n > kMaxRepeatSize / static_cast<int64_t>(s.size()))
      eval_fail("string repetition too large");
    std::string out;
    out.reserve(s.size() * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out += s;
    return Value(std::move(out));
  }
  const auto& items = seq.items();
  if (!items.empty() && n > kMaxRepeatSize / static_cast<int64_t>(items.size()))
    eval_fail("list repetition too large");
  std::vector<Value> out;
  out.reserve(items.size() * static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
  return seq.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

// Python's % on numbers: the result takes the sign of the divisor.
Value modulo(const Value& a, const Value& b) {
  if (a.is_float() || b.is_float()) {
    const double x = a.to_double(), y = b.to_double();
    if (y == 0.0) eval_fail("float modulo");
    double r = std::fmod(x, y);
    if (r != 0.0 && ((r < 0) != (y < 0))) r += y;
    if (r == 0.0) r = std::copysign(0.0, y);
    return Value(r);
  }
  const int64_t x = a.to_int(), y = b.to_int();
  if (y == 0) eval_fail("integer division or modulo by zero");
  if (y == -1) return Value(int64_t{0});
  int64_t r = x % y;
  if (r != 0 && ((r < 0) != (y < 0))) r += y;
  return Value(r);
}

Value floor_divide(const Value& a, const Value& b) {
  if (a.is_float() || b.is_float()) {
    const double x = a.to_double(), y = b.to_double();
    if (y == 0.0) eval_fail("float floor division by zero");
    return Value(std::floor(x / y));
  }
  const int64_t x = a.to_int(), y = b.to_int();
  if (y == 0) eval_fail("integer division or modulo by zero");
  if (x == std::numeric_limits<int64_t>::min() && y == -1) eval_fail("integer overflow");
  int64_t q = x / y;
  if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
  return Value(q);
}

Value power(const Value& a, const Value& b) {
  if (!a.is_float() && !b.is_float() && b.to_int() >= 0) {
    int64_t base = a.to_int(), exp = b.to_int(), result = 1;
    while (exp > 0) {
      if (exp & 1) result = mul_checked(result, base);
      exp >>= 1;
      if (exp > 0) base = mul_checked(base, base);
    }
    return Value(result);
  }
  const double x = a.to_double(), y = b.to_double();
  if (x == 0.0 && y < 0) eval_fail("0.0 cannot be raised to a negative power");
  return Value(std::pow(x, y));
}

}  // namespace


Value* Interpreter::Scope::find(std::string_view name) {
  for (auto& kv : vars)
    if (kv.first == name) return &kv.second;
  return nullptr;
}

void Interpreter::Scope::set(const std::string& name, Value v) {
  if (Value* slot = find(name)) {
    *slot = std::move(v);
  } else {
    vars.emplace_back(name, std::move(v));
  }
}

Interpreter::Interpreter(const Dict& context) {
  auto globals = std::make_shared<Scope>();
  globals->vars = make_globals();
  auto ctx = std::make_shared<Scope>();
  ctx->parent = globals;
  for (const auto& [key, value] : context.items) {
    if (!key.is_string()) continue;
    ctx->set(key.as_string(), value);
  }
  root_ = std::make_shared<Scope>();
  root_->parent = ctx;
  scope_ = root_;
}

Interpreter::~Interpreter() {
  for (auto& ns : namespaces_) ns->attrs.clear();
}

std::string Interpreter::render(const Body& body) {
  std::string out;
  render_body(body, out);
  return out;
}

Interpreter::Flow Interpreter::render_body(const Body& body, std::string& out) {
  for (const auto& s : body) {
    const Flow f = render_stmt(*s, out);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::render_stmt(const Stmt& s, std::string& out) {
  try {
    switch (s.kind) {
      case Stmt::Kind::Text:
        out += static_cast<const TextStmt&>(s).text;
        return Flow::Normal;
      case Stmt::Kind::Print:
        out += eval(*static_cast<const PrintStmt&>(s).expr).str();
        return Flow::Normal;
      case Stmt::Kind::If: {
        const auto& n = static_cast<const IfStmt&>(s);
        for (const auto& [cond, body] : n.branches)
          if (eval(*cond).truthy()) return render_body(body, out);
        return render_body(n.otherwise, out);
      }
      case Stmt::Kind::For:
        return render_for(static_cast<const ForStmt&>(s), out);
      case Stmt::Kind::Set: {
        const auto& n = static_cast<const SetStmt&>(s);
        assign(n.target, eval(*n.value));
        return Flow::Normal;
      }
      case Stmt::Kind::SetBlock: {
        const auto& n = static_cast<const SetBlockStmt&>(s);
        std::string text;
        auto saved = scope_;
        scope_ = std::make_shared<Scope>();
        scope_->parent = saved;
        render_body(n.body, text);
        scope_ = saved;
        Value v(std::move(text));
        if (n.filter) v = apply_filter_chain(*n.filter, std::move(v));
        assign(n.target, std::move(v));
        return Flow::Normal;
      }
      case Stmt::Kind::Macro: {
        const auto& m = static_cast<const MacroStmt&>(s);
        // A weak reference: the defining scope holds the macro, so a strong
        // one would be a cycle. A macro called after its scope ended (it was
        // smuggled out through a namespace) falls back to the root scope.
        std::weak_ptr<Scope> closure = scope_;
        const MacroStmt* def = &m;
        std::weak_ptr<Scope> root = root_;
        scope_->set(m.name, Value::function(m.name, [def, closure, root](Interpreter& in, CallArgs& args) {
                      auto scope = closure.lock();
                      if (!scope) scope = root.lock();
                      return in.call_macro(*def, scope, args);
                    }));
        return Flow::Normal;
      }
      case Stmt::Kind::Generation:
        return render_body(static_cast<const BodyStmt&>(s).body, out);
      case Stmt::Kind::FilterBlock: {
        const auto& n = static_cast<const FilterBlockStmt&>(s);
        std::string text;
        const Flow f = render_body(n.body, text);
        out += apply_filter_chain(*n.filter, Value(std::move(text))).str();
        return f;
      }
      case Stmt::Kind::Break:
        return Flow::Break;
      case Stmt::Kind::Continue:
        return Flow::Continue;
    }
  } catch (const EvalError& e) {
    throw LocatedError(s.line, e.what());
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::render_for(const ForStmt& s, std::string& out) {
  std::vector<Value> items = iterate(eval(*s.iterable));
  auto saved = scope_;
  if (s.filter) {
    // `for x in xs if cond`: filtered before the loop, so loop.* counts
    // only the items kept.
    std::vector<Value> kept;
    for (auto& item : items) {
      scope_ = std::make_shared<Scope>();
      scope_->parent = saved;
      assign(s.target, item);
      const bool keep = eval(*s.filter).truthy();
      scope_ = saved;
      if (keep) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) return render_body(s.otherwise, out);
  const auto n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    scope_ = std::make_shared<Scope>();
    scope_->parent = saved;
    Dict loop;
    loop.items.reserve(12);
    auto put = [&loop](const char* key, Value v) { loop.items.emplace_back(Value(key), std::move(v)); };
    put("index", Value(i + 1));
    put("index0", Value(i));
    put("revindex", Value(n - i));
    put("revindex0", Value(n - i - 1));
    put("first", Value(i == 0));
    put("last", Value(i == n - 1));
    put("length", Value(n));
    put("depth", Value(1));
    put("depth0", Value(0));
    put("previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
    put("nextitem", i + 1 < n ? items[i + 1] : Value::undefined("there is no next item"));
    put("cycle", Value::function("cycle", [i](Interpreter&, CallArgs& args) {
          if (args.positional.empty()) eval_fail("no items for cycling given");
          return args.positional[static_cast<size_t>(i) % args.positional.size()];
        }));
    scope_->set("loop", Value::dict(std::move(loop)));
    Flow f;
    try {
      assign(s.target, items[i]);
      f = render_body(s.body, out);
    } catch (...) {
      scope_ = saved;
      throw;
    }
    scope_ = saved;
    if (f == Flow::Break) break;
  }
  return Flow::Normal;
}

void Interpreter::assign(const Target& target, Value v) {
  if (!target.attribute.empty()) {
    const Value ns = lookup(target.names[0]);
    if (!ns.is_namespace()) eval_fail("cannot assign attribute on non-namespace object");
    ns.as_namespace().set(target.attribute, std::move(v));
    return;
  }
  if (!target.unpack) {
    scope_->set(target.names[0], std::move(v));
    return;
  }
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_list() && !v.is_string() && !v.is_dict())
    eval_fail("cannot unpack non-iterable ", v.type_name(), " object");
  std::vector<Value> parts = iterate(v);
  const size_t want = target.names.size();
  if (parts.size() < want)
    eval_fail("not enough values to unpack (expected ", want, ", got ", parts.size(), ")");
  if (parts.size() > want) eval_fail("too many values to unpack (expected ", want, ")");
  for (size_t i = 0; i < want; ++i) scope_->set(target.names[i], std::move(parts[i]));
}

Value Interpreter::apply_filter_chain(const Expr& filter, Value input) {
  const auto& f = static_cast<const FilterExpr&>(filter);
  Value operand = f.operand ? apply_filter_chain(*f.operand, std::move(input)) : std::move(input);
  CallArgs args = eval_args(f.args);
  try {
    if (!f.fn) eval_fail("unknown filter '", f.name, "'");
    return f.fn(*this, operand, args);
  } catch (const EvalError& e) {
    throw LocatedError(f.line, e.what());
  }
}

Value Interpreter::call_macro(const MacroStmt& m, const std::shared_ptr<Scope>& closure,
                              CallArgs& args) {
  if (call_depth_ >= kMaxCallDepth) eval_fail("maximum recursion depth exceeded in macro '", m.name, "'");
  if (args.positional.size() > m.params.size())
    eval_fail("macro '", m.name, "' takes not more than ", m.params.size(), " argument(s)");
  auto scope = std::make_shared<Scope>();
  scope->parent = closure;
  std::vector<bool> given(m.params.size(), false);
  for (size_t i = 0; i < args.positional.size(); ++i) {
    scope->set(m.params[i].first, std::move(args.positional[i]));
    given[i] = true;
  }
  for (auto& [name, value] : args.keyword) {
    size_t k = 0;
    while (k < m.params.size() && m.params[k].first != name) ++k;
    if (k == m.params.size()) eval_fail("macro '", m.name, "' takes no keyword argument '", name, "'");
    if (given[k]) eval_fail("macro '", m.name, "' got multiple values for argument '", name, "'");
    scope->set(name, std::move(value));
    given[k] = true;
  }
  auto saved = scope_;
  scope_ = scope;
  ++call_depth_;
  std::string out;
  try {
    for (size_t k = 0; k < m.params.size(); ++k) {
      if (given[k]) continue;
      const auto& [name, def] = m.params[k];
      scope->set(name, def ? eval(*def)
                           : Value::undefined("parameter '" + name + "' was not provided"));
    }
    render_body(m.body, out);
  } catch (...) {
    scope_ = saved;
    --call_depth_;
    throw;
  }
  scope_ = saved;
  --call_depth_;
  return Value(std::move(out));
}

Value Interpreter::lookup(const std::string& name) {
  for (Scope* s = scope_.get(); s; s = s->parent.get())
    if (const Value* v = s->find(name)) return *v;
  return Value::undefined("'" + name + "' is undefined");
}

CallArgs Interpreter::eval_args(const Arguments& a) {
  CallArgs args;
  args.positional.reserve(a.positional.size());
  for (const auto& e : a.positional) args.positional.push_back(eval(*e));
  for (const auto& [name, e] : a.keyword) args.keyword.emplace_back(name, eval(*e));
  return args;
}

Value Interpreter::eval(const Expr& e) {
  try {
    return eval_inner(e);
  } catch (const EvalError& err) {
    throw LocatedError(e.line, err.what());
  }
}

Value Interpreter::eval_args_call(const CallExpr& c) {
  if (c.callee->kind == Expr::Kind::GetAttr) {
    // obj.method(...) without materialising a bound method.
    const auto& ga = static_cast<const GetAttrExpr&>(*c.callee);
    const Value obj = eval(*ga.object);
    CallArgs args = eval_args(c.args);
    Value out;
    if (call_method(*this, obj, ga.name, args, out)) return out;
    return call(getattr(obj, ga.name), args);
  }
  const Value callee = eval(*c.callee);
  CallArgs args = eval_args(c.args);
  return call(callee, args);
}

Value Interpreter::eval_inner(const Expr& e) {
  using K = Expr::Kind;
  switch (e.kind) {
    case K::Literal:
      return static_cast<const LiteralExpr&>(e).value;
    case K::Name:
      return lookup(static_cast<const NameExpr&>(e).name);
    case K::List: {
      const auto& n = static_cast<const ListExpr&>(e);
      std::vector<Value> items;
      items.reserve(n.items.size());
      for (const auto& item : n.items) items.push_back(eval(*item));
      return n.tuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
    }
    case K::Dict: {
      const auto& n = static_cast<const DictExpr&>(e);
      Dict d;
      for (const auto& [k, v] : n.items) {
        Value key = eval(*k);
        if (key.is_list() && !key.is_tuple()) eval_fail("unhashable type: 'list'");
        if (key.is_dict()) eval_fail("unhashable type: 'dict'");
        d.set(std::move(key), eval(*v));
      }
      return Value::dict(std::move(d));
    }
    case K::GetAttr: {
      const auto& n = static_cast<const GetAttrExpr&>(e);
      return getattr(eval(*n.object), n.name);
    }
    case K::GetItem: {
      const auto& n = static_cast<const GetItemExpr&>(e);
      const Value obj = eval(*n.object);
      return getitem(obj, eval(*n.index));
    }
    case K::Slice: {
      // jinja2 compiles slices to a plain Python subscript (no sandbox
      // getitem), so slicing a non-sequence is an error, not Undefined.
      const auto& n = static_cast<const SliceExpr&>(e);
      const Value obj = eval(*n.object);
      auto part = [&](const ExprPtr& p) -> std::optional<int64_t> {
        if (!p) return std::nullopt;
        const Value v = eval(*p);
        if (v.is_none()) return std::nullopt;
        if (!v.is_int() && !v.is_bool())
          eval_fail("slice indices must be integers or None or have an __index__ method");
        return v.to_int();
      };
      if (obj.is_undefined()) fail_undefined(obj);
      if ((!obj.is_list() && !obj.is_string()) || obj.is_generator())
        eval_fail("'", obj.type_name(), "' object is not subscriptable");
      const auto start = part(n.start), stop = part(n.stop), step_opt = part(n.step);
      const int64_t step = step_opt.value_or(1);
      if (step == 0) eval_fail("slice step cannot be zero");
      std::u32string chars;
      const bool ascii = obj.is_string() && pystr::is_ascii(obj.as_string());
      if (obj.is_string() && !ascii) chars = pystr::decode(obj.as_string());
      const int64_t len = obj.is_list() ? static_cast<int64_t>(obj.items().size())
                          : ascii        ? static_cast<int64_t>(obj.as_string().size())
                                         : static_cast<int64_t>(chars.size());
      // slice.indices()
      const int64_t lower = step < 0 ? -1 : 0, upper = step < 0 ? len - 1 : len;
      auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
        if (!v) return dflt;
        int64_t x = *v;
        if (x < 0) return std::max(x + len, lower);
        return std::min(x, upper);
      };
      const int64_t b = clamp(start, step < 0 ? upper : lower);
      const int64_t end = clamp(stop, step < 0 ? lower : upper);
      if (obj.is_list()) {
        std::vector<Value> out;
        for (int64_t i = b; step > 0 ? i < end : i > end; i += step) out.push_back(obj.items()[i]);
        return obj.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
      }
      if (ascii) {
        std::string out;
        for (int64_t i = b; step > 0 ? i < end : i > end; i += step) out += obj.as_string()[i];
        return Value(std::move(out));
      }
      std::u32string out;
      for (int64_t i = b; step > 0 ? i < end : i > end; i += step) out += chars[i];
      return Value(pystr::encode(out));
    }
    case K::Call:
      return eval_args_call(static_cast<const CallExpr&>(e));
    case K::Filter: {
      const auto& n = static_cast<const FilterExpr&>(e);
      const Value input = eval(*n.operand);
      CallArgs args = eval_args(n.args);
      if (!n.fn) eval_fail("unknown filter '", n.name, "'");
      return n.fn(*this, input, args);
    }
    case K::Test: {
      const auto& n = static_cast<const TestExpr&>(e);
      const Value input = eval(*n.operand);
      CallArgs args = eval_args(n.args);
      if (!n.fn) eval_fail("unknown test '", n.name, "'");
      return Value(n.fn(*this, input, args) != n.negated);
    }
    case K::Not:
      return Value(!eval(*static_cast<const UnaryExpr&>(e).operand).truthy());
    case K::Neg:
    case K::Pos: {
      const Value v = eval(*static_cast<const UnaryExpr&>(e).operand);
      const bool neg = e.kind == K::Neg;
      if (v.is_undefined()) fail_undefined(v);
      if (v.is_float()) return Value(neg ? -v.as_float() : v.as_float());
      if (v.is_int() || v.is_bool()) {
        const int64_t i = v.to_int();
        if (neg && i == std::numeric_limits<int64_t>::min()) eval_fail("integer overflow");
        return Value(neg ? -i : i);
      }
      eval_fail("bad operand type for unary ", neg ? "-" : "+", ": '", v.type_name(), "'");
    }
    case K::Binary: {
      const auto& n = static_cast<const BinaryExpr&>(e);
      if (n.op == BinaryOp::And || n.op == BinaryOp::Or) {
        Value left = eval(*n.left);
        if (left.truthy() == (n.op == BinaryOp::Or)) return left;
        return eval(*n.right);
      }
      const Value a = eval(*n.left);
      const Value b = eval(*n.right);
      if (n.op == BinaryOp::Concat) return Value(a.str() + b.str());
      if (a.is_undefined()) fail_undefined(a);
      if (b.is_undefined()) fail_undefined(b);
      const bool numbers = a.is_number() && b.is_number();
      const bool floats = numbers && (a.is_float() || b.is_float());
      switch (n.op) {
        case BinaryOp::Add:
          if (floats) return Value(a.to_double() + b.to_double());
          if (numbers) return Value(add_checked(a.to_int(), b.to_int()));
          if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
          if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple() && !a.is_generator() &&
              !b.is_generator()) {
            std::vector<Value> out = a.items();
            out.insert(out.end(), b.items().begin(), b.items().end());
            return a.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
          }
          if (a.is_string()) eval_fail("can only concatenate str (not \"", b.type_name(), "\") to str");
          if (a.is_list() && !a.is_tuple())
            eval_fail("can only concatenate list (not \"", b.type_name(), "\") to list");
          unsupported("+", a, b);
        case BinaryOp::Sub:
          if (floats) return Value(a.to_double() - b.to_double());
          if (numbers) return Value(sub_checked(a.to_int(), b.to_int()));
          unsupported("-", a, b);
        case BinaryOp::Mul:
          if (floats) return Value(a.to_double() * b.to_double());
          if (numbers) return Value(mul_checked(a.to_int(), b.to_int()));
          if ((a.is_string() || (a.is_list() && !a.is_generator())) && (b.is_int() || b.is_bool()))
            return repeat(a, b.to_int());
          if ((b.is_string() || (b.is_list() && !b.is_generator())) && (a.is_int() || a.is_bool()))
            return repeat(b, a.to_int());
          unsupported("*", a, b);
        case BinaryOp::Div:
          if (!numbers) unsupported("/", a, b);
          if (b.to_double() == 0.0) eval_fail("division by zero");
          return Value(a.to_double() / b.to_double());
        case BinaryOp::FloorDiv:
          if (!numbers) unsupported("//", a, b);
          return floor_divide(a, b);
        case BinaryOp::Mod:
          if (a.is_string()) return Value(percent_format(a.as_string(), b));
          if (!numbers) unsupported("%", a, b);
          return modulo(a, b);
        case BinaryOp::Pow:
          if (!numbers) unsupported("** or pow()", a, b);
          return power(a, b);
        default:
          break;
      }
      eval_fail("bad binary operator");
    }
    case K::Compare: {
      const auto& n = static_cast<const CompareExpr&>(e);
      Value left = eval(*n.first);
      for (const auto& [op, expr] : n.rest) {
        Value right = eval(*expr);
        bool ok = false;
        switch (op) {
          case CompareOp::Eq: ok = equals(left, right); break;
          case CompareOp::Ne: ok = !equals(left, right); break;
          case CompareOp::Lt: ok = less(left, right); break;
          case CompareOp::Gt: ok = less(right, left); break;
          case CompareOp::Le: ok = less(left, right) || equals(left, right); break;
          case CompareOp::Ge: ok = less(right, left) || equals(left, right); break;
          case CompareOp::In:
          case CompareOp::NotIn: {
            CallArgs args;
            args.positional.push_back(right);
            ok = apply_test("in", left, args) == (op == CompareOp::In);
            break;
          }
        }
        if (!ok) return Value(false);
        left = std::move(right);
      }
      return Value(true);
    }
    case K::Conditional: {
      const auto& n = static_cast<const ConditionalExpr&>(e);
      if (eval(*n.cond).truthy()) return eval(*n.then);
      if (n.otherwise) return eval(*n.otherwise);
      return Value::undefined("the inline if-expression evaluated to false and no else section was defined");
    }
  }
  eval_fail("bad expression");
}

Value Interpreter::call(const Value& callee, CallArgs& args) {
  if (callee.is_function()) return callee.as_function().fn(*this, args);
  if (callee.is_undefined()) fail_undefined(callee);
  eval_fail("'", callee.type_name(), "' object is not callable");
}

Value Interpreter::getattr(const Value& obj, std::string_view name) {
  switch (obj.kind()) {
    case Value::Kind::Undefined:
      fail_undefined(obj);
    case Value::Kind::Dict:
      // Python's getattr comes first: `d.items` is the method.
      if (has_method(obj, name)) break;
      if (const Value* v = obj.as_dict().find(name)) return *v;
      return Value::undefined(object_name(obj) + " has no attribute '" + std::string(name) + "'");
    case Value::Kind::Namespace:
      if (const Value* v = obj.as_namespace().find(name)) return *v;
      return Value::undefined("'Namespace' object has no attribute '" + std::string(name) + "'");
    default:
      if (has_method(obj, name)) break;
      return Value::undefined(object_name(obj) + " has no attribute '" + std::string(name) + "'");
  }
  std::string method(name);
  Value self = obj;
  return Value::function(method, [self, method](Interpreter& in, CallArgs& args) {
    Value out;
    call_method(in, self, method, args, out);
    return out;
  });
}

Value Interpreter::getitem(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Value::Kind::Undefined:
      fail_undefined(obj);
    case Value::Kind::Dict:
      if (const Value* v = obj.as_dict().find(key)) return *v;
      break;
    case Value::Kind::List:
      if ((key.is_int() || key.is_bool()) && !obj.is_generator()) {
        const auto& items = obj.items();
        int64_t i = key.to_int();
        const auto n = static_cast<int64_t>(items.size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return items[static_cast<size_t>(i)];
        return Value::undefined(obj.type_name() + " object has no element " + std::to_string(key.to_int()));
      }
      break;
    case Value::Kind::String:
      if (key.is_int() || key.is_bool()) {
        const std::string& s = obj.as_string();
        int64_t i = key.to_int();
        if (pystr::is_ascii(s)) {
          const auto n = static_cast<int64_t>(s.size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) return Value(std::string(1, s[static_cast<size_t>(i)]));
        } else {
          const std::u32string u = pystr::decode(s);
          const auto n = static_cast<int64_t>(u.size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) return Value(pystr::encode(u.substr(static_cast<size_t>(i), 1)));
        }
        return Value::undefined("str object has no element " + std::to_string(key.to_int()));
      }
      break;
    default:
      break;
  }
  // jinja2's getitem falls back to an attribute for a string key.
  if (key.is_string() && (obj.is_namespace() || has_method(obj, key.as_string())))
    return getattr(obj, key.as_string());
  return Value::undefined(object_name(obj) + " has no attribute " + key.repr());
}

std::vector<Value> Interpreter::iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
      return {};
    case Value::Kind::List:
      return v.items();
    case Value::Kind::Dict: {
      std::vector<Value> keys;
      keys.reserve(v.as_dict().items.size());
      for (const auto& kv : v.as_dict().items) keys.push_back(kv.first);
      return keys;
    }
    case Value::Kind::String: {
      std::vector<Value> chars;
      std::string one;
      for (char32_t c : pystr::decode(v.as_string())) {
        one.clear();
        pystr::append_utf8(one, c);
        chars.emplace_back(one);
      }
      return chars;
    }
    default:
      eval_fail("'", v.type_name(), "' object is not iterable");
  }
}

Value Interpreter::apply_filter(std::string_view name, const Value& input, CallArgs& args) {
  const FilterFn fn = find_filter(name);
  if (!fn) eval_fail("unknown filter '", name, "'");
  return fn(*this, input, args);
}

bool Interpreter::apply_test(std::string_view name, const Value& input, CallArgs& args) {
  const TestFn fn = find_test(name);
  if (!fn) eval_fail("unknown test '", name, "'");
  return fn(*this, input, args);
}

}  // namespace augur::jinja
