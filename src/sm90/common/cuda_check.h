// CUDA runtime errors as flash_kda::CudaError, and the device guard every launch uses.
#pragma once

#include <string>

#include <cuda_runtime.h>

#include "flash_kda/error.h"

namespace flash_kda::sm90 {

/// Throws CudaError("flash_kda: <what>: <CUDA's message>") unless `e` is cudaSuccess.
inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CudaError(std::string("flash_kda: ") + what + ": " + cudaGetErrorString(e));
}

/// Makes `device` current for the launches and restores the caller's device afterwards. A
/// current context of `device` (its primary context or a green context of it) is left current.
struct DeviceGuard {
  int previous = -1;
  explicit DeviceGuard(int device) {
    check_cuda(cudaGetDevice(&previous), "cudaGetDevice");
    if (previous != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous) cudaSetDevice(previous);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
};

}  // namespace flash_kda::sm90
