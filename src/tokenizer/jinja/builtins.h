// The builtins a chat template can reach: jinja2's filters and tests, the
// globals transformers provides, and the Python str/dict/list methods the
// sandbox lets a template call.
#pragma once

#include <initializer_list>
#include <string_view>
#include <vector>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/value.h"

namespace augur::jinja {

FilterFn find_filter(std::string_view name);  // nullptr when unknown
TestFn find_test(std::string_view name);      // nullptr when unknown

// range, namespace, dict, raise_exception, strftime_now.
std::vector<std::pair<std::string, Value>> make_globals();

// A method of a str, dict or list (`s.startswith`, `d.items`): true and
// the result in `out` when obj has it.
bool call_method(Interpreter& in, const Value& obj, std::string_view name, CallArgs& args,
                 Value& out);
bool has_method(const Value& obj, std::string_view name);

// Python's printf-style `fmt % args` (and the `format` filter).
std::string percent_format(std::string_view fmt, const Value& args);

// Binds positional then keyword arguments to parameter names as a Python
// call does; a parameter not passed stays Undefined (with an empty hint).
std::vector<Value> bind_args(std::string_view function, CallArgs& args,
                             std::initializer_list<std::string_view> params);

}  // namespace augur::jinja
