// The process's CUDA state: device 0, one non-blocking stream, the cuBLASLt
// handle and the scratch buffers the kernels share.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backend/cuda/common.cuh"

namespace augur::cuda {

void throw_cuda(cudaError_t err, const char* call, const char* file, int line) {
  fail("[cuda] ", call, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ") at ", file, ":",
       line);
}

void throw_cublas(cublasStatus_t st, const char* call, const char* file, int line) {
  fail("[cuda] ", call, ": cuBLAS status ", int(st), " at ", file, ":", line);
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) AUGUR_CUDA(cudaMalloc(&ptr_, bytes));
}

DeviceBuffer::~DeviceBuffer() {
  // Never throws; at process exit the runtime may already be unloading.
  if (ptr_ != nullptr) {
    cudaError_t err = cudaFree(ptr_);
    if (err != cudaSuccess && err != cudaErrorCudartUnloading)
      std::fprintf(stderr, "[cuda] cudaFree: %s\n", cudaGetErrorString(err));
  }
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    DeviceBuffer old(std::move(*this));
    ptr_ = o.ptr_, bytes_ = o.bytes_;
    o.ptr_ = nullptr, o.bytes_ = 0;
  }
  return *this;
}

Context::Context() {
  timeline_start();  // before the context exists
  int n = 0;
  AUGUR_CUDA(cudaGetDeviceCount(&n));
  if (n == 0) fail("[cuda] no CUDA device found");
  AUGUR_CUDA(cudaSetDevice(device));
  AUGUR_CUDA(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  AUGUR_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  AUGUR_CUBLAS(cublasLtCreate(&lt));
  lt_workspace = DeviceBuffer(kLtWorkspaceBytes);
  splitk_partials = DeviceBuffer(kSplitKPartialBytes);
  splitk_counters = DeviceBuffer(size_t(kSplitKCounters) * sizeof(int32_t));
  AUGUR_CUDA(cudaMemsetAsync(splitk_counters.get(), 0, splitk_counters.bytes(), stream));
  attn_counters = DeviceBuffer(size_t(kAttnCounters) * sizeof(int32_t));
  AUGUR_CUDA(cudaMemsetAsync(attn_counters.get(), 0, attn_counters.bytes(), stream));
  tail_barrier = DeviceBuffer(4 * sizeof(uint32_t));
  AUGUR_CUDA(cudaMemsetAsync(tail_barrier.get(), 0, tail_barrier.bytes(), stream));
  tail_counters = DeviceBuffer(size_t(kTailCounters) * sizeof(int32_t));
  AUGUR_CUDA(cudaMemsetAsync(tail_counters.get(), 0, tail_counters.bytes(), stream));
  tail_partials = DeviceBuffer(size_t(sm_count) * 8 * 2 * 8 * sizeof(float));
  AUGUR_CUDA(cudaStreamSynchronize(stream));
}

Context::~Context() {
  // Buffers free themselves; the handle and stream go last, errors ignored
  // (destructors never throw, and at exit the driver may be gone).
  if (lt != nullptr) cublasLtDestroy(lt);
  if (stream != nullptr) cudaStreamDestroy(stream);
}

void* Context::bf16_scratch(size_t bytes, Stream s) {
  if (x_bf16.bytes() < bytes) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    AUGUR_CUDA(cudaStreamIsCapturing(s, &status));
    if (status != cudaStreamCaptureStatusNone)
      fail("[cuda] matmul: bf16 scratch of ", x_bf16.bytes(), " bytes must grow to ", bytes,
           " during graph capture; run the step once before capturing it");
    // The old buffer may still be read by queued work.
    AUGUR_CUDA(cudaStreamSynchronize(s));
    x_bf16 = DeviceBuffer();
    x_bf16 = DeviceBuffer(bytes + bytes / 4);
  }
  return x_bf16.get();
}

Context& context() {
  static Context ctx;
  return ctx;
}

Stream stream() { return context().stream; }

bool pdl_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("AUGUR_CUDA_PDL");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

namespace {

// ",a,b," from the environment variable's "a,b" ("" when unset).
std::string name_list(const char* var) {
  const char* e = std::getenv(var);
  if (e == nullptr || *e == 0) return std::string();
  std::string list(",");  // appends: g++ 12 warns (-Wrestrict) on "," + string
  list.append(e).append(",");
  return list;
}

bool listed(const std::string& list, const char* name) {
  if (list.empty()) return false;
  std::string key(",");
  key.append(name).append(",");
  return list.find(key) != std::string::npos;
}

}  // namespace

// AUGUR_CUDA_NOPDL=name,...: those kernels launch without PDL, so they start
// only once the previous kernel has finished (an experiment: does a kernel's
// early start help the step or crowd the one before it?).
bool pdl_for(const char* name) {
  static const std::string nopdl = name_list("AUGUR_CUDA_NOPDL");
  return pdl_enabled() && !listed(nopdl, name);
}

// AUGUR_CUDA_CARVEOUT=percent: each launch's preferred shared-memory
// carveout (a launch attribute, so captured graphs keep it); default 100, -1
// the driver's choice. An SM's shared memory is sized when its first block
// starts, so a block of the next kernel that PDL lets in fits beside a
// stream GEMV's only if the GEMV's launch asked for room (fifteenth session:
// 100 alone, with the 160 KB ring, changed nothing; sixteenth and
// seventeenth: with the q/k/v GEMV's 144 KB ring, the fused RoPE attention's
// blocks start beside it, 50 us a step faster at context 128).
int carveout_percent() {
  static const int pct = [] {
    const char* e = std::getenv("AUGUR_CUDA_CARVEOUT");
    return e == nullptr ? 100 : std::max(-1, std::min(100, std::atoi(e)));
  }();
  return pct;
}

// AUGUR_CUDA_SKIP=name,name,...: those kernels are not launched, for
// measuring what a kernel costs inside the whole decode step (the step's time
// with and without it). Outputs are wrong while it is set; a warning says so.
bool skip_kernel(const char* name) {
  static const std::string skip = [] {
    std::string list = name_list("AUGUR_CUDA_SKIP");
    if (!list.empty())
      std::fprintf(stderr, "[cuda] warning: AUGUR_CUDA_SKIP=%s: these kernels are not launched, outputs are wrong\n",
                   std::getenv("AUGUR_CUDA_SKIP"));
    return list;
  }();
  return listed(skip, name);
}

bool available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return false;
  }
  return n > 0;
}

void synchronize() {
  AUGUR_CUDA(cudaStreamSynchronize(context().stream));
  AUGUR_CUDA(cudaGetLastError());
}

}  // namespace augur::cuda
