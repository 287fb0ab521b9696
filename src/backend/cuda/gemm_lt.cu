// Tensor-core matmul for M > 8 through cuBLASLt, and matmul_half's dispatch.
//
// y = x·wᵀ with x [M, K] and y [M, N] row-major, w [N, K] row-major. cuBLASLt
// is column-major: a row-major [R, C] matrix is a column-major [C, R] one, so
// yᵀ (column-major N x M, ld ldy) = op(A) · B with A = w seen as column-major
// K x N (ld K) under CUBLAS_OP_T, and B = xb seen as column-major K x M (ld K).
// bf16 x bf16 or f16 x f16 (x rounded to the weights' type) -> f32 output,
// f32 accumulation (CUBLAS_COMPUTE_32F).
#include <cuda_bf16.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/detail.h"

namespace augur::cuda {
namespace {

// x [M, K] (row stride ldx) -> xb [M, K] contiguous bf16 or f16, rounded to nearest even.
template <bool F16>
__global__ void to_half_kernel(const float* __restrict__ x, int64_t M, int64_t K, int64_t ldx,
                               uint16_t* __restrict__ xb) {
  const int64_t m = blockIdx.y;
  const float* xr = x + m * ldx;
  uint16_t* yr = xb + m * K;
  const int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (i + 4 <= K && ((reinterpret_cast<uintptr_t>(xr) | reinterpret_cast<uintptr_t>(yr)) & 7) == 0 &&
      (reinterpret_cast<uintptr_t>(xr + i) & 15) == 0) {
    const float4 v = *reinterpret_cast<const float4*>(xr + i);
    uint2 o;
    o.x = pack_half2<F16>(v.x, v.y);
    o.y = pack_half2<F16>(v.z, v.w);
    *reinterpret_cast<uint2*>(yr + i) = o;
  } else {
    for (int64_t j = i; j < i + 4 && j < K; ++j) yr[j] = f32_to_half<F16>(xr[j]);
  }
}

int alignment_of(const void* p, int64_t ld_bytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p) | uintptr_t(ld_bytes) | 256;
  return int(a & (~a + 1));  // lowest set bit, at most 256
}

template <typename T, auto LtApi::*Destroy>
struct LtHandle {
  T h = nullptr;
  LtHandle() = default;
  LtHandle(const LtHandle&) = delete;
  LtHandle& operator=(const LtHandle&) = delete;
  ~LtHandle() {
    if (h != nullptr) (lt_api().*Destroy)(h);
  }
};
using MatmulDesc = LtHandle<cublasLtMatmulDesc_t, &LtApi::desc_destroy>;
using Layout = LtHandle<cublasLtMatrixLayout_t, &LtApi::layout_destroy>;
using Preference = LtHandle<cublasLtMatmulPreference_t, &LtApi::preference_destroy>;

struct LtProblem {
  MatmulDesc op;
  Layout a, b, c;
  Preference pref;
};

void make_problem(LtProblem& p, int64_t M, int64_t K, int64_t N, int64_t ldy, int align_a, int align_b,
                  int align_c, cudaDataType_t in_type) {
  const LtApi& api = lt_api();
  AUGUR_CUBLAS(api.desc_create(&p.op.h, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  AUGUR_CUBLAS(api.desc_set_attribute(p.op.h, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  AUGUR_CUBLAS(api.desc_set_attribute(p.op.h, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  AUGUR_CUBLAS(api.layout_create(&p.a.h, in_type, uint64_t(K), uint64_t(N), K));
  AUGUR_CUBLAS(api.layout_create(&p.b.h, in_type, uint64_t(K), uint64_t(M), K));
  AUGUR_CUBLAS(api.layout_create(&p.c.h, CUDA_R_32F, uint64_t(N), uint64_t(M), ldy));
  AUGUR_CUBLAS(api.preference_create(&p.pref.h));
  const uint64_t ws = Context::kLtWorkspaceBytes;
  AUGUR_CUBLAS(api.preference_set_attribute(p.pref.h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                    sizeof(ws)));
  const uint32_t aa = uint32_t(align_a), ab = uint32_t(align_b), ac = uint32_t(align_c);
  AUGUR_CUBLAS(api.preference_set_attribute(p.pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa,
                                                    sizeof(aa)));
  AUGUR_CUBLAS(api.preference_set_attribute(p.pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab,
                                                    sizeof(ab)));
  AUGUR_CUBLAS(api.preference_set_attribute(p.pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac,
                                                    sizeof(ac)));
  AUGUR_CUBLAS(api.preference_set_attribute(p.pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac,
                                                    sizeof(ac)));
}

// The length whose heuristic algorithm a matmul of M rows runs: M rounded up
// to a power of two, at least 16. One algorithm, so one kernel, then serves a
// range of lengths, and the kernels that Runner::warm_up's forwards of 16, 32,
// ... tokens load are the ones a prompt of any length uses. A cuBLASLt
// kernel's first launch in a process loads it: 2-5 ms each on the H200, and
// about 60 ms for the first of all (a fresh process's 2048-token prefill of a
// 4B dense model spent 80 of its 127 ms on them).
int64_t algo_bucket(int64_t M) {
  int64_t b = 16;
  while (b < M) b *= 2;
  return b;
}

// cuBLASLt's algorithm for problem p (key: its shape, alignments and type):
// the cached one, else the length's bucket's where it runs p, else the
// heuristic's `algo`-th (algo < 0: its first, cached).
bool choose_algo(Context& c, const LtProblem& p, const LtAlgoKey& key, int64_t M, int64_t K, int64_t N, int64_t ldy,
                 int align_a, int align_b, int align_c, bool f16, int algo, cublasLtMatmulAlgo_t& chosen) {
  if (algo < 0) {
    std::lock_guard<std::mutex> lock(c.lt_mutex);
    auto it = c.lt_algos.find(key);
    if (it != c.lt_algos.end()) {
      chosen = it->second;
      return true;
    }
  }
  if (algo < 0) {
    // The length's bucket's algorithm, where it runs this problem.
    const int64_t Mb = algo_bucket(M);
    if (Mb != M) {
      LtProblem pb;
      make_problem(pb, Mb, K, N, ldy, align_a, align_b, align_c, f16 ? CUDA_R_16F : CUDA_R_16BF);
      cublasLtMatmulHeuristicResult_t r = {}, check = {};
      int n = 0;
      const bool found =
          lt_api().algo_get_heuristic(c.lt, pb.op.h, pb.a.h, pb.b.h, pb.c.h, pb.c.h, pb.pref.h, 1, &r, &n) ==
              CUBLAS_STATUS_SUCCESS &&
          n > 0 &&
          lt_api().algo_check(c.lt, p.op.h, p.a.h, p.b.h, p.c.h, p.c.h, &r.algo, &check) == CUBLAS_STATUS_SUCCESS &&
          check.workspaceSize <= Context::kLtWorkspaceBytes;
      if (found) {
        chosen = r.algo;
        std::lock_guard<std::mutex> lock(c.lt_mutex);
        c.lt_algos.emplace(key, chosen);
        return true;
      }
    }
  }
  constexpr int kMaxResults = 16;
  if (algo >= kMaxResults) return false;
  const int want = algo < 0 ? 1 : algo + 1;
  cublasLtMatmulHeuristicResult_t results[kMaxResults] = {};
  int n = 0;
  cublasStatus_t st =
      lt_api().algo_get_heuristic(c.lt, p.op.h, p.a.h, p.b.h, p.c.h, p.c.h, p.pref.h, want, results, &n);
  if (st != CUBLAS_STATUS_SUCCESS || n <= (algo < 0 ? 0 : algo)) return false;
  chosen = results[algo < 0 ? 0 : algo].algo;
  if (algo < 0) {
    std::lock_guard<std::mutex> lock(c.lt_mutex);
    c.lt_algos.emplace(key, chosen);
  }
  return true;
}

// A matmul's problem and algorithm, settled before anything is launched.
struct LtCall {
  LtProblem p;
  cublasLtMatmulAlgo_t algo;
  bool ready = false;
  LtCall(const half_bits* xb, int64_t M, int64_t K, const half_bits* w, int64_t N, const float* y, int64_t ldy,
         int algo_index, Half t) {
    const int align_a = alignment_of(w, K * 2), align_b = alignment_of(xb, K * 2);
    const int align_c = alignment_of(y, ldy * 4);
    const bool f16 = t == Half::F16;
    make_problem(p, M, K, N, ldy, align_a, align_b, align_c, f16 ? CUDA_R_16F : CUDA_R_16BF);
    const LtAlgoKey key{M, N, K, ldy, align_a * 1024 * 1024 + align_b * 1024 + align_c, f16 ? 1 : 0};
    ready = choose_algo(context(), p, key, M, K, N, ldy, align_a, align_b, align_c, f16, algo_index, algo);
  }
  void run(const half_bits* xb, const half_bits* w, float* y, Stream s) const {
    Context& c = context();
    const float alpha = 1.0f, beta = 0.0f;
    AUGUR_CUBLAS(lt_api().matmul(c.lt, p.op.h, &alpha, w, p.a.h, xb, p.b.h, &beta, y, p.c.h, y, p.c.h, &algo,
                                c.lt_workspace.get(), Context::kLtWorkspaceBytes, s));
  }
};

}  // namespace

namespace detail {

Precision& precision() {
  static Precision p;
  return p;
}

bool lt_matmul(const half_bits* xb, int64_t M, int64_t K, const half_bits* w, int64_t N, float* y, int64_t ldy,
               Stream s, int algo, Half t) {
  const LtCall call(xb, M, K, w, N, y, ldy, algo, t);
  if (!call.ready) return false;
  call.run(xb, w, y, s);
  return true;
}

}  // namespace detail

void to_half(const float* x, int64_t M, int64_t K, int64_t ldx, Half t, half_bits* xh, Stream s) {
  if (M <= 0 || K <= 0) return;
  if (M > 65535) fail("[cuda] to_half: M = ", M, " exceeds 65535 rows");
  const dim3 grid(unsigned(ceil_div(ceil_div(K, 4), 256)), unsigned(M));
  if (t == Half::F16)
    to_half_kernel<true><<<grid, 256, 0, s>>>(x, M, K, ldx, xh);
  else
    to_half_kernel<false><<<grid, 256, 0, s>>>(x, M, K, ldx, xh);
  AUGUR_LAUNCHED("to_half_kernel");
}

void to_bf16(const float* x, int64_t M, int64_t K, int64_t ldx, bf16_bits* xb, Stream s) {
  to_half(x, M, K, ldx, Half::BF16, xb, s);
}

namespace {
thread_local int64_t t_stream_rows = detail::kSkinnyMaxM;
}  // namespace

int64_t stream_rows() { return t_stream_rows; }

int64_t set_stream_rows(int64_t rows) {
  if (rows < 1 || rows > detail::kSkinnyMaxM)
    fail("[cuda] set_stream_rows: ", rows, " rows, the stream GEMV takes 1 to ", detail::kSkinnyMaxM);
  const int64_t was = t_stream_rows;
  t_stream_rows = rows;
  return was;
}

void matmul_bf16_xb(const bf16_bits* xb, int64_t M, int64_t K, const bf16_bits* w, int64_t N, float* y,
                    int64_t ldy, Stream s) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0 || ldy < N) fail("[cuda] matmul: bad shape M=", M, " K=", K, " N=", N, " ldy=", ldy);
  if (!detail::lt_matmul(xb, M, K, w, N, y, ldy, s))
    fail("[cuda] matmul: cuBLASLt has no algorithm for bf16 M=", M, " K=", K, " N=", N);
}

void matmul_bf16(const float* x, int64_t M, int64_t K, int64_t ldx, const bf16_bits* w, int64_t N, float* y,
                 int64_t ldy, Stream s) {
  matmul_half(x, M, K, ldx, w, Half::BF16, N, y, ldy, s);
}

void matmul_half(const float* x, int64_t M, int64_t K, int64_t ldx, const half_bits* w, Half wt, int64_t N,
                 float* y, int64_t ldy, Stream s) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0 || ldx < K || ldy < N)
    fail("[cuda] matmul: bad shape M=", M, " K=", K, " N=", N, " ldx=", ldx, " ldy=", ldy);
  if (M <= stream_rows()) {
    detail::skinny_matmul(x, M, K, ldx, w, N, y, ldy, s, 0, wt);
    return;
  }
  if (detail::precision().exact_matmul) {
    detail::generic_matmul(x, M, K, ldx, w, N, y, ldy, s, wt);
    return;
  }
  Context& c = context();
  if (M <= 65535) {
    auto* xh = static_cast<half_bits*>(c.bf16_scratch(size_t(M * K) * 2, s));
    to_half(x, M, K, ldx, wt, xh, s);
    if (detail::lt_matmul(xh, M, K, w, N, y, ldy, s, -1, wt)) return;
  }
  detail::generic_matmul(x, M, K, ldx, w, N, y, ldy, s, wt);
}

namespace {

// Whether matmul_half takes M rows to cuBLASLt (through to_half).
bool lt_rows(int64_t M) { return M > stream_rows() && M <= 65535 && !detail::precision().exact_matmul; }

}  // namespace

bool norm_matmul_tc(const float* x, int64_t M, int64_t K, const float* g, float eps, const half_bits* w, Half wt,
                    int64_t N, float* y, Stream s) {
  if (N <= 0 || K <= 0 || !lt_rows(M)) return false;
  auto* xh = static_cast<half_bits*>(context().bf16_scratch(size_t(M * K) * 2, s));
  const LtCall call(xh, M, K, w, N, y, N, -1, wt);
  if (!call.ready) return false;
  rms_norm_half(x, g, eps, M, K, wt, xh, s);
  call.run(xh, w, y, s);
  return true;
}

bool add_norm_matmul_tc(float* x, const float* o, const float* g, float eps, int64_t M, int64_t K, const half_bits* w,
                        Half wt, int64_t N, float* y, Stream s) {
  if (N <= 0 || K <= 0 || !lt_rows(M)) return false;
  auto* xh = static_cast<half_bits*>(context().bf16_scratch(size_t(M * K) * 2, s));
  const LtCall call(xh, M, K, w, N, y, N, -1, wt);
  if (!call.ready) return false;  // before x += o: the caller's path adds it
  add_rms_norm_half(x, o, g, eps, M, K, wt, xh, s);
  call.run(xh, w, y, s);
  return true;
}

void swiglu_matmul(const float* gate_up, int64_t M, int64_t D, const half_bits* w, Half wt, int64_t N, float* act,
                   float* y, Stream s) {
  if (M <= 0 || N <= 0) return;
  // Two passes: a skinny GEMM making the SwiGLU as it reads its input is
  // slower (every warp re-reads gate and up and recomputes silu). On
  // cuBLASLt's path the SwiGLU writes its 16-bit input directly.
  if (D > 0 && lt_rows(M)) {
    auto* xh = static_cast<half_bits*>(context().bf16_scratch(size_t(M * D) * 2, s));
    const LtCall call(xh, M, D, w, N, y, N, -1, wt);
    if (call.ready) {
      swiglu_packed_half(gate_up, M, D, wt, xh, s);
      call.run(xh, w, y, s);
      return;
    }
  }
  swiglu_packed(gate_up, M, D, act, s);
  matmul_half(act, M, D, D, w, wt, N, y, N, s);
}

}  // namespace augur::cuda
