// Helpers shared by the builtins' files: builtins.cpp (argument helpers,
// globals), builtins_filters.cpp, builtins_tests.cpp and builtins_methods.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "tokenizer/jinja/value.h"

namespace augur::jinja::detail {

[[noreturn]] void fail_undefined(const Value& v);

// A non-negative decimal index ("0", "12"), or nullopt.
std::optional<int64_t> parse_index(const std::string& s);

// False for an argument that was not passed (Undefined with an empty hint).
bool given(const Value& v);
std::optional<std::string> opt_string(const Value& v, std::string_view what);
int64_t int_arg(const Value& v, int64_t dflt, std::string_view what);
bool bool_arg(const Value& v, bool dflt);
const std::string& string_arg(const Value& v, std::string_view what);

// Python's str.isupper() (upper) / str.islower().
bool has_cased_all(const std::string& s, bool upper);

// A row of the filter and test tables.
template <typename Fn>
struct Named {
  std::string_view name;
  Fn fn;
};

}  // namespace augur::jinja::detail
