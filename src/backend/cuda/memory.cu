#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/memory.h"
#include "core/error.h"

namespace augur::cuda {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("[cuda] ", what, ": ", cudaGetErrorString(e));
}

// Size classes: small requests round to 512 B, large ones to 2 MiB, so that
// buffers of a decode step find their predecessors' blocks again.
size_t round_size(size_t bytes) {
  constexpr size_t kSmall = 512, kLarge = size_t(2) << 20;
  if (bytes == 0) bytes = 1;
  return bytes < kLarge ? (bytes + kSmall - 1) / kSmall * kSmall : (bytes + kLarge - 1) / kLarge * kLarge;
}

class CachingAllocator {
 public:
  void* take(size_t size) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        stats_.cached -= size;
        note_use(size);
        return p;
      }
    }
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      release_cached();
      e = cudaMalloc(&p, size);
    }
    if (e == cudaErrorMemoryAllocation)
      fail("[cuda] out of GPU memory allocating ", size, " bytes (", stats_.in_use,
           " bytes in use by augur); a smaller --ctx, --memory-fraction, --max-batch or --prefill-chunk needs less");
    if (e != cudaSuccess)
      fail("[cuda] cudaMalloc of ", size, " bytes: ", cudaGetErrorString(e), " (", stats_.in_use,
           " bytes in use)");
    std::lock_guard<std::mutex> lock(mu_);
    note_use(size);
    return p;
  }

  void give_back(void* p, size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    free_[size].push_back(p);
    stats_.in_use -= size;
    stats_.cached += size;
  }

  void release_cached() {
    std::lock_guard<std::mutex> lock(mu_);
    cudaStreamSynchronize(stream());
    for (auto& [size, ptrs] : free_)
      for (void* p : ptrs) cudaFree(p);
    free_.clear();
    stats_.cached = 0;
  }

  MemoryStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  void note_use(size_t size) {
    stats_.in_use += size;
    stats_.peak = std::max(stats_.peak, stats_.in_use);
  }
  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;
  MemoryStats stats_;
};

CachingAllocator& allocator() {
  static CachingAllocator* a = new CachingAllocator();  // lives until exit: buffers may outlive statics
  return *a;
}

class DeviceBuffer final : public Buffer {
 public:
  explicit DeviceBuffer(size_t bytes) : size_(bytes), rounded_(round_size(bytes)) {
    ptr_ = allocator().take(rounded_);
    check(cudaMemsetAsync(ptr_, 0, rounded_, stream()), "cudaMemsetAsync");
  }
  ~DeviceBuffer() override { allocator().give_back(ptr_, rounded_); }
  void* data() override { return ptr_; }
  size_t size() const override { return size_; }
  Device device() const override { return Device::CUDA; }

 private:
  void* ptr_ = nullptr;
  size_t size_;
  size_t rounded_;
};

}  // namespace

std::shared_ptr<Buffer> allocate(size_t bytes) {
  context();  // selects the device on first use
  return std::make_shared<DeviceBuffer>(bytes);
}

struct HostLanding::Slot {
  void* host = nullptr;  // page-locked, `capacity` bytes
  size_t capacity = 0;
  cudaEvent_t landed = nullptr;
};

namespace {

// Page-locked buffers with the event of their last copy: one is handed out
// again only once that copy has landed.
class SlotPool {
 public:
  HostLanding::Slot* take(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < free_.size(); ++i)
        if (free_[i]->capacity >= bytes && cudaEventQuery(free_[i]->landed) == cudaSuccess) {
          HostLanding::Slot* s = free_[i];
          free_.erase(free_.begin() + std::ptrdiff_t(i));
          return s;
        }
    }
    auto* s = new HostLanding::Slot;
    s->capacity = std::max<size_t>(std::bit_ceil(bytes), 64 << 10);
    // Mapped: kernels write it through the same address (unified addressing).
    check(cudaHostAlloc(&s->host, s->capacity, cudaHostAllocMapped | cudaHostAllocPortable), "page-locked host buffer");
    void* on_device = nullptr;
    check(cudaHostGetDevicePointer(&on_device, s->host, 0), "page-locked host buffer");
    if (on_device != s->host) fail("[cuda] page-locked host memory is not at its host address on the device");
    check(cudaEventCreateWithFlags(&s->landed, cudaEventDisableTiming), "event");
    return s;
  }
  void give_back(HostLanding::Slot* s) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(s);
  }

 private:
  std::mutex mu_;
  std::vector<HostLanding::Slot*> free_;  // kept for the process's life
};

SlotPool& host_slots() {
  static auto* pool = new SlotPool;  // never destroyed: slots may return during static destruction
  return *pool;
}

}  // namespace

void copy_to_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  // From pageable memory the driver may first wait for the stream to drain
  // (the host then cannot queue a decode step while the last one runs); small
  // copies go through a page-locked buffer instead.
  constexpr size_t kStaged = size_t(1) << 20;
  if (bytes > kStaged) {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()), "copy to device");
    return;
  }
  // A recording would keep reading the slot after it is reused (from pageable
  // memory, CUDA refuses the copy while recording): refuse it too.
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream(), &capturing), "copy to device");
  if (capturing != cudaStreamCaptureStatusNone) fail("[cuda] copy to device: not allowed inside a recorded graph");
  HostLanding::Slot* slot = host_slots().take(bytes);
  std::memcpy(slot->host, src, bytes);
  check(cudaMemcpyAsync(dst, slot->host, bytes, cudaMemcpyHostToDevice, stream()), "copy to device");
  check(cudaEventRecord(slot->landed, stream()), "event record");
  host_slots().give_back(slot);
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream()), "copy to host");
  check(cudaStreamSynchronize(stream()), "copy to host (synchronize)");
}

void copy_on_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()), "copy on device");
}

HostLanding::HostLanding(size_t bytes) : slot_(host_slots().take(bytes)) {}

HostLanding::~HostLanding() {
  // Work may still be writing: the slot is reused only after it has.
  (void)cudaEventSynchronize(slot_->landed);
  host_slots().give_back(slot_);
}

void* HostLanding::data() { return slot_->host; }

void HostLanding::mark() { check(cudaEventRecord(slot_->landed, stream()), "event record"); }

const void* HostLanding::wait() {
  check(cudaEventSynchronize(slot_->landed), "wait for the device");
  return slot_->host;
}

MemoryStats memory_stats() { return allocator().stats(); }

void release_cached() { allocator().release_cached(); }

size_t free_bytes() {
  context();
  size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free + allocator().stats().cached;
}

}  // namespace augur::cuda
