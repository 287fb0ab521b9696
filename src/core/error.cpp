#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace augur {

void assert_failed(const char* expr, const char* file, int line, const char* msg) {
  std::fprintf(stderr, "augur: internal error at %s:%d: %s (%s)\n", file, line, msg, expr);
  std::abort();
}

}  // namespace augur
