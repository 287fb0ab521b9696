// How a device keeps the weights loaded onto it: which dtype each matrix is
// stored in and where. The loader reads tensors as stored on the host and
// hands them through a Placement; the model layer passes one along and never
// looks inside it.
#pragma once

#include <string>

#include "backend/device.h"
#include "core/tensor.h"

namespace augur {

class Placement {
 public:
  Placement(Device device = Device::CPU) : device_(device) {}  // implicit: load_model(dir, Device::CUDA)
  Device device() const { return device_; }
  std::string name() const { return std::string(device_name(device_)); }
  // An error naming the device when this process cannot use it.
  void require_available() const;

  // A matmul/embedding operand from its stored tensor (f32, bf16, f16 or
  // QAFFINE). The CPU keeps bf16, f32 and quantized matrices as stored
  // (zero-copy for a float checkpoint) and widens f16 to f32. CUDA
  // dequantizes a quantized matrix (its kernels read 16-bit weights), then
  // places it as a float one. CUDA kernels read 16-bit weights and the tensor-core
  // path rounds its input to the weight's type: f16 keeps 3 more mantissa
  // bits than bf16 at the same rate, so a matrix whose values fit f16's range
  // (every one seen in practice) becomes f16 (cuda_settings().half permitting),
  // the rest bf16.
  Tensor matrix(const Tensor& stored) const;
  // An f32 vector or small tensor (gains, biases, conv kernels, tables).
  Tensor vector(const Tensor& f32) const;

 private:
  Device device_;
};

}  // namespace augur
