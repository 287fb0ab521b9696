// Device memory for the CUDA backend: one caching allocator over plain
// cudaMalloc (never managed memory), and copies ordered on the backend stream.
// No CUDA headers here.
#pragma once

#include <cstddef>
#include <memory>

#include "core/tensor.h"

namespace augur::cuda {

// A device buffer from the caching allocator; returned to the cache when the
// last reference goes. Contents are zero on allocation.
std::shared_ptr<Buffer> allocate(size_t bytes);
// Bytes the device could still hand out: its free memory plus what the
// caching allocator holds unused.
size_t free_bytes();

// Copies on the backend stream; a copy to the host waits for it to finish.
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
void copy_on_device(void* dst, const void* src, size_t bytes);

// Page-locked host bytes that work queued on the backend stream writes (a
// kernel through the unified address space, or a copy), read without
// blocking the host in between: mark() records that everything queued so
// far has written them, wait() blocks until it has (a decode step's ids,
// read while the next step runs). The buffers and their events are pooled:
// allocating them costs more than a step.
class HostLanding {
 public:
  explicit HostLanding(size_t bytes);
  ~HostLanding();
  HostLanding(const HostLanding&) = delete;
  HostLanding& operator=(const HostLanding&) = delete;
  void* data();  // host address, the same on the device
  void mark();
  const void* wait();
  struct Slot;  // a page-locked buffer and its event (memory.cu)

 private:
  Slot* slot_;
};

struct MemoryStats {
  size_t in_use = 0;   // bytes handed out
  size_t cached = 0;   // bytes held for reuse
  size_t peak = 0;     // highest in_use so far
};
MemoryStats memory_stats();
// Gives cached blocks back to the driver.
void release_cached();

}  // namespace augur::cuda
