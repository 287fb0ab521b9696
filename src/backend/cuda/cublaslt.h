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

struct LtApi {
  decltype(&cublasLtCreate) create;
  decltype(&cublasLtDestroy) destroy;
  decltype(&cublasLtMatmul) matmul;
  decltype(&cublasLtMatmulAlgoGetHeuristic) algo_get_heuristic;
  decltype(&cublasLtMatmulDescCreate) desc_create;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set_attribute;
  decltype(&cublasLtMatrixLayoutCreate) layout_create;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
  decltype(&cublasLtMatmulPreferenceCreate) preference_create;
  decltype(&cublasLtMatmulPreferenceDestroy) preference_destroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) preference_set_attribute;
};

// The library's entry points, loaded on the first call (thread-safe). Fails
// with the library's name and the loader's message when it cannot be opened
// or lacks one of them.
const LtApi& lt_api();

}  // namespace augur::cuda
