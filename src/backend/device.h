// Devices as model code sees them: where a tensor lives, and moving tensors
// between host and accelerator. Model code asks for tensors on "its" device
// and never includes a CUDA header.
#pragma once

#include <functional>
#include <span>
#include <initializer_list>
#include <memory>
#include <string_view>

#include "core/tensor.h"

namespace augur {

// "cpu" | "cuda"; anything else is an error listing the choices.
Device parse_device(std::string_view name);
std::string_view device_name(Device d);
// True when this build and this machine can run on `d` (never throws).
bool device_available(Device d);
// CUDA where a GPU is present, else the CPU.
Device default_device();

// Memory `d` could still hand out, in bytes (the host: its available RAM).
size_t free_memory(Device d);

// A zero-filled contiguous tensor on `d`.
Tensor empty_on(Device d, DType dtype, std::initializer_list<int64_t> shape);
Tensor empty_on(Device d, DType dtype, const int64_t* shape, int ndim);
// A contiguous tensor on `d` whose contents are undefined, for scratch that
// is written before it is read (host: Fill::None).
Tensor scratch_on(Device d, DType dtype, std::initializer_list<int64_t> shape);
// A contiguous copy of `t` on `d` (`t` itself when it is already there).
Tensor to_device(const Tensor& t, Device d);
// dst = src: same dtype and element count, both contiguous, any devices.
void copy_tensor(const Tensor& src, const Tensor& dst);
// The CUDA backend's user settings, read once from the environment:
//   AUGUR_CUDA_GRAPHS=0|1  replay each decode step as a CUDA graph (default 1;
//                          0 runs it eagerly, launch by launch)
//   AUGUR_CUDA_PDL=0|1     programmatic dependent launch: a kernel's blocks may
//                          start while the previous kernel drains (default 1)
//   AUGUR_CUDA_HALF=f16|bf16  the 16-bit float weights and K/V are stored in
//                          (default f16; bf16 for checkpoints whose activations
//                          exceed f16's range)
struct CudaSettings {
  bool graphs = true;
  bool pdl = true;
  DType half = DType::F16;
};
// A bad value is an augur::Error naming the variable and the accepted values.
const CudaSettings& cuda_settings();
// Replaces the settings (tests: eager against graphed decode in one process).
// Work already set up keeps what it read; not thread-safe.
void set_cuda_settings(const CudaSettings& settings);

// The 16-bit float an accelerator stores weights (where they fit) and K/V
// in: cuda_settings().half. The CPU keeps K/V in F32.
DType device_half(Device d);

// A copy of a BF16 or F16 tensor as `to` (BF16 | F16) on its device; values
// beyond f16's range saturate at +-65504.
Tensor convert_half(const Tensor& t, DType to);
// The rows of `parts` ([N_i, K] each, one device) stacked into one new
// matrix [sum N_i, K]: projections that share an input, fused at load time so
// that they run as one matmul. Parts of one dtype keep it; 16-bit parts of
// both kinds become BF16 (the one that holds them all); f32 with 16-bit parts
// widen to F32 (on the host).
Tensor stack_rows(std::span<const Tensor> parts);
// A new matrix of rows `rows` of the 2-D `w`, in that order, in w's dtype and
// on w's device (regrouping fused checkpoint projections at load time).
Tensor select_rows(const Tensor& w, std::span<const int64_t> rows);
// A new matrix of columns [begin, end) of the 2-D `w`, in w's dtype and on
// w's device (splitting a projection over a concatenation at load time).
Tensor select_cols(const Tensor& w, int64_t begin, int64_t end);
// The largest |value| of a BF16 or F16 tensor (NaN ignored); waits for it.
float max_abs(const Tensor& t);
// Waits until all work queued on `d` is done (no-op on the CPU).
void synchronize(Device d);
// Changes whenever `d` reallocates a scratch buffer its ops share (0 on the
// CPU): work recorded before the change must be recorded again.
uint64_t scratch_generation(Device d);

// Device work recorded once and replayed with one launch (a CUDA graph): the
// replay reads and writes the same memory as the recording, so everything it
// touches must stay allocated and at the same address.
class CapturedWork {
 public:
  virtual ~CapturedWork() = default;
  virtual void replay() = 0;
};
// Records what `work` queues on `d` without running it. An exception from
// `work` abandons the recording and propagates.
std::unique_ptr<CapturedWork> capture(Device d, const std::function<void()>& work);

}  // namespace augur
