// The process's CUDA state: device 0, one non-blocking stream, the cuBLASLt
// handle and the scratch buffers the kernels share.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backend/cuda/common.cuh"
#include "backend/cuda/memory.h"
#include "backend/device.h"

namespace augur::cuda {

void throw_cuda(cudaError_t err, const char* call, const char* file, int line) {
  fail("[cuda] ", call, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ") at ", file, ":",
       line);
}

void throw_cublas(cublasStatus_t st, const char* call, const char* file, int line) {
  fail("[cuda] ", call, ": cuBLAS status ", int(st), " at ", file, ":", line);
}

namespace {

// The kernels use Hopper's bulk copies and mbarriers (built for sm_90a):
// another GPU has no image of them.
constexpr int kComputeMajor = 9;

int compute_major(int device) {
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return major;
}

}  // namespace

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  const cudaError_t e = cudaMalloc(&ptr_, bytes);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    ptr_ = nullptr;
    fail("[cuda] out of GPU memory allocating a scratch buffer of ", bytes,
         " bytes; a smaller --ctx, --memory-fraction, --max-batch or --prefill-chunk needs less");
  }
  AUGUR_CUDA(e);
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
#ifdef AUGUR_CUDA_PROFILE
  timeline_start();  // before the context exists
#endif
  int n = 0;
  AUGUR_CUDA(cudaGetDeviceCount(&n));
  if (n == 0) fail("[cuda] no CUDA device found");
  AUGUR_CUDA(cudaSetDevice(device));
  if (compute_major(device) != kComputeMajor) {
    cudaDeviceProp p{};
    (void)cudaGetDeviceProperties(&p, device);
    fail("[cuda] augur's CUDA kernels are built for Hopper (sm_90: H100, H200); this GPU, ", p.name, ", is sm_",
         p.major, p.minor, ": run with --device cpu");
  }
  AUGUR_CUDA(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  AUGUR_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  AUGUR_CUBLAS(lt_api().create(&lt));
  lt_workspace = DeviceBuffer(kLtWorkspaceBytes);
  splitk_partials = DeviceBuffer(kSplitKPartialBytes);
  splitk_counters = DeviceBuffer(size_t(kSplitKCounters) * sizeof(int32_t));
  AUGUR_CUDA(cudaMemsetAsync(splitk_counters.get(), 0, splitk_counters.bytes(), stream));
  attn_counters = DeviceBuffer(size_t(kAttnCounters) * sizeof(int32_t));
  AUGUR_CUDA(cudaMemsetAsync(attn_counters.get(), 0, attn_counters.bytes(), stream));
  AUGUR_CUDA(cudaStreamSynchronize(stream));
}

Context::~Context() {
  // Buffers free themselves; the handle and stream go last, errors ignored
  // (destructors never throw, and at exit the driver may be gone).
  if (lt != nullptr) lt_api().destroy(lt);
  if (stream != nullptr) cudaStreamDestroy(stream);
}

namespace {

// A scratch buffer that grows (by a quarter more than asked) and never while
// `s` is being captured: the old buffer may still be read by queued work, so
// growing waits for the stream, which a capture cannot.
void* grow(DeviceBuffer& b, size_t bytes, Stream s, const char* what, std::atomic<uint64_t>& generation) {
  if (b.bytes() < bytes) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    AUGUR_CUDA(cudaStreamIsCapturing(s, &status));
    if (status != cudaStreamCaptureStatusNone)
      fail("[cuda] ", what, " scratch of ", b.bytes(), " bytes must grow to ", bytes,
           " during graph capture; run the step once before capturing it");
    AUGUR_CUDA(cudaStreamSynchronize(s));
    b = DeviceBuffer();
    try {
      b = DeviceBuffer(bytes + bytes / 4);
    } catch (const Error&) {  // what the caching allocator holds unused goes back, then once more
      release_cached();
      b = DeviceBuffer(bytes + bytes / 4);
    }
    ++generation;
  }
  return b.get();
}

}  // namespace

void* Context::bf16_scratch(size_t bytes, Stream s) {
  return grow(x_bf16, bytes, s, "matmul: bf16", scratch_generation);
}

void* Context::delta_rule_scratch(size_t bytes, Stream s) {
  return grow(delta_rule, bytes, s, "gated_delta_rule_chunked", scratch_generation);
}

uint64_t scratch_generation() { return context().scratch_generation.load(); }

size_t bf16_scratch_bytes() { return context().x_bf16.bytes(); }

Context& context() {
  static Context ctx;
  return ctx;
}

Stream stream() { return context().stream; }

bool pdl_enabled() { return cuda_settings().pdl; }

#ifdef AUGUR_CUDA_PROFILE
// AUGUR_CUDA_SKIP=name,name,...: those kernels are not launched, for
// measuring what a kernel costs inside the whole decode step (the step's time
// with and without it). Outputs are wrong while it is set; a warning says so.
// Profile builds only.
bool skip_kernel(const char* name) {
  static const std::string skip = [] {
    const char* e = std::getenv("AUGUR_CUDA_SKIP");
    if (e == nullptr || *e == 0) return std::string();
    std::fprintf(stderr, "[cuda] warning: AUGUR_CUDA_SKIP=%s: these kernels are not launched, outputs are wrong\n", e);
    std::string list(",");  // appends: g++ 12 warns (-Wrestrict) on "," + string
    list.append(e).append(",");
    return list;
  }();
  if (skip.empty()) return false;
  std::string key(",");
  key.append(name).append(",");
  return skip.find(key) != std::string::npos;
}
#endif

bool available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return false;
  }
  return n > 0 && compute_major(0) == kComputeMajor;
}

void synchronize() {
  AUGUR_CUDA(cudaStreamSynchronize(context().stream));
  AUGUR_CUDA(cudaGetLastError());
}

}  // namespace augur::cuda
