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

// Copies on the backend stream; a copy to the host waits for it to finish.
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
void copy_on_device(void* dst, const void* src, size_t bytes);

struct MemoryStats {
  size_t in_use = 0;   // bytes handed out
  size_t cached = 0;   // bytes held for reuse
  size_t peak = 0;     // highest in_use so far
};
MemoryStats memory_stats();
// Gives cached blocks back to the driver.
void release_cached();

}  // namespace augur::cuda
