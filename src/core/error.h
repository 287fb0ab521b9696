// Errors: bad input from a user or a file is an augur::Error whose message
// says what and where ("[safetensors] model.safetensors: ..."); a broken
// invariant aborts through AUGUR_ASSERT.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace augur {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Builds a message from streamable parts: fail("[io] ", path, ": bad").
template <typename... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  throw Error(os.str());
}

[[noreturn]] void assert_failed(const char* expr, const char* file, int line, const char* msg);

}  // namespace augur

#define AUGUR_ASSERT(cond, msg)                                            \
  do {                                                                     \
    if (!(cond)) ::augur::assert_failed(#cond, __FILE__, __LINE__, (msg)); \
  } while (0)
