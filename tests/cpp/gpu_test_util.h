// What the C++ GPU tests share: whether they can run here.
#pragma once

#include <string>

#if FLASH_KDA_WITH_CUDA
#include <cuda_runtime.h>

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

}  // namespace flash_kda::testing
#endif
