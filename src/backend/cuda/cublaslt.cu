#include "backend/cuda/cublaslt.h"

#include <dlfcn.h>

#include <string>

#include "core/error.h"

namespace augur::cuda {
namespace {

// The soname of the major version we were compiled against; the loader's
// search path first (LD_LIBRARY_PATH, ldconfig), then the toolkit's folder
// found at configure time.
void* open_library(std::string& why) {
  const std::string name = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
  if (void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  why = dlerror();
#ifdef AUGUR_CUDA_LIBRARY_DIR
  const std::string path = std::string(AUGUR_CUDA_LIBRARY_DIR) + "/" + name;
  if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  why += std::string("; ") + dlerror();
#endif
  return nullptr;
}

template <typename F>
void bind(void* lib, F& f, const char* symbol) {
  f = reinterpret_cast<F>(dlsym(lib, symbol));
  if (f == nullptr) fail("[cuda] libcublasLt has no ", symbol, ": ", dlerror());
}

LtApi load() {
  std::string why;
  void* lib = open_library(why);  // never closed: handles live until exit
  if (lib == nullptr) fail("[cuda] cannot load cuBLASLt: ", why);
  LtApi api{};
#define AUGUR_LT_BIND(member, symbol) bind(lib, api.member, #symbol);
  AUGUR_LT_ENTRY_POINTS(AUGUR_LT_BIND)
#undef AUGUR_LT_BIND
  return api;
}

}  // namespace

const LtApi& lt_api() {
  static const LtApi api = load();
  return api;
}

}  // namespace augur::cuda
