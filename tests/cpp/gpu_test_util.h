// What the C++ GPU tests share: whether they can run here, and device copies of host tensors.
#pragma once

#include <string>
#include <vector>

#if FLASH_KDA_WITH_CUDA
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "reference_test_util.h"

namespace flash_kda::testing {

/// Why the GPU tests cannot run here, or "" when they can (device 0 is an sm_90 GPU).
inline std::string gpu_skip_reason() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return "no CUDA device visible";
  }
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  if (major != 9 || minor != 0) return "device 0 is not sm_90 (Hopper)";
  return "";
}

/// A device copy of a host tensor that frees itself; view() describes it as a CUDA tensor.
class DeviceTensor {
 public:
  explicit DeviceTensor(HostTensor& h) : host_(&h) {
    if (!h.defined()) return;
    bytes_ = h.bytes().size();
    EXPECT_EQ(cudaMalloc(&ptr_, bytes_ ? bytes_ : 1), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr_, h.data(), bytes_, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceTensor() { cudaFree(ptr_); }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;

  TensorView view() {
    TensorView t = host_->view();
    if (!t.defined()) return t;
    t.data = ptr_;
    t.device = DeviceType::CUDA;
    t.device_id = 0;
    return t;
  }
  /// `t` (a view of the host tensor's memory, any strides) re-pointed at the same bytes of the
  /// device copy.
  TensorView on_device(TensorView t) const {
    if (!t.defined()) return t;
    t.data = static_cast<char*>(ptr_) + (static_cast<char*>(t.data) - static_cast<char*>(host_->data()));
    t.device = DeviceType::CUDA;
    t.device_id = 0;
    return t;
  }
  // Device contents copied into the host tensor, returned widened to fp64.
  std::vector<double> download() {
    EXPECT_EQ(cudaMemcpy(host_->data(), ptr_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    return host_->values();
  }

 private:
  HostTensor* host_;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace flash_kda::testing
#endif
