// cuBLASLt, opened with dlopen on first use instead of linked.
//
// Loading libcublasLt (a 540 MB object: its relocations and static
// constructors) cost every process about 0.35 s and 25,000 page faults at
// start, CPU-only ones included (`augur --version`: 0.37 s -> 0.01 s).
// Only Context and gemm_lt.cu call it, through lt_api(); calling a cublasLt
// function directly fails to link, as nothing links the library.
#pragma once

#include <cublasLt.h>

namespace augur::cuda {

// Each entry point once: LtApi's member, and the symbol it is bound to.
#define AUGUR_LT_ENTRY_POINTS(X)                                    \
  X(create, cublasLtCreate)                                         \
  X(destroy, cublasLtDestroy)                                       \
  X(matmul, cublasLtMatmul)                                         \
  X(algo_get_heuristic, cublasLtMatmulAlgoGetHeuristic)             \
  X(algo_check, cublasLtMatmulAlgoCheck)                            \
  X(desc_create, cublasLtMatmulDescCreate)                          \
  X(desc_destroy, cublasLtMatmulDescDestroy)                        \
  X(desc_set_attribute, cublasLtMatmulDescSetAttribute)             \
  X(layout_create, cublasLtMatrixLayoutCreate)                      \
  X(layout_destroy, cublasLtMatrixLayoutDestroy)                    \
  X(preference_create, cublasLtMatmulPreferenceCreate)              \
  X(preference_destroy, cublasLtMatmulPreferenceDestroy)            \
  X(preference_set_attribute, cublasLtMatmulPreferenceSetAttribute)

struct LtApi {
#define AUGUR_LT_MEMBER(member, symbol) decltype(&symbol) member;
  AUGUR_LT_ENTRY_POINTS(AUGUR_LT_MEMBER)
#undef AUGUR_LT_MEMBER
};

// The library's entry points, loaded on the first call (thread-safe). Fails
// with the library's name and the loader's message when it cannot be opened
// or lacks one of them.
const LtApi& lt_api();

}  // namespace augur::cuda
