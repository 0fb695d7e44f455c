// CUDA runtime errors as flash_kda::CudaError, and the device guard every launch uses.
#pragma once

#include <string>

#include <cuda_runtime.h>

#include "flash_kda/error.h"
#include "sm90/common/device_props.h"

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

/// DeviceProps of the context of `stream` on `device` (made current by the caller), after
/// checking that it is an sm_90 part: Error("q") otherwise, before anything is launched.
inline DeviceProps sm90_stream_props(int device, CUstream_st* stream, uint64_t* context_key) {
  const uint64_t ctx = stream_context_key(device, stream);
  const DeviceProps props = stream_device_props(device, ctx, stream);
  if (props.major != 9 || props.minor != 0)
    throw Error("q", "tensors on an sm_90 (Hopper) GPU; device " + std::to_string(device) + " is sm_" +
                         std::to_string(props.major) + std::to_string(props.minor));
  *context_key = ctx;
  return props;
}

}  // namespace flash_kda::sm90
