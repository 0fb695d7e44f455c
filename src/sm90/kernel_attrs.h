// Kernel attributes set once per kernel and device, and the launch configuration the kernels
// share. cudaFuncSetAttribute is a driver call, and the forward runs once per layer and step: on
// small problems the host time per call is what the caller waits for (docs/perf-notes.md, v6:
// ~50-70 us a call).
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime.h>

namespace flash_kda::sm90 {

/// Lets `Kernel` use `bytes` of dynamic shared memory on the current device (above the 48 KB
/// default), calling cudaFuncSetAttribute the first time per device only (devices 0-63; any
/// other is set on every call), so the first `bytes` sticks: pass the kernel's largest size,
/// the same on every call. Returns the CUDA error of the query or the attribute call.
template <auto Kernel>
cudaError_t allow_dynamic_smem(int bytes) {
  static std::atomic<uint64_t> done{0};  // one bit per device; a race only sets it twice
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  const uint64_t bit = device >= 0 && device < 64 ? uint64_t(1) << device : 0;
  if (bit != 0 && (done.load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  e = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess && bit != 0) done.fetch_or(bit, std::memory_order_release);
  return e;
}

/// A cudaLaunchKernelEx configuration, with the programmatic-dependent-launch attribute when
/// `dependent`: the kernel may then start before the previous kernel on the stream completes
/// (once all its blocks have called cudaTriggerProgrammaticLaunchCompletion or exited), and
/// waits for that completion in cudaGridDependencySynchronize. Holds a pointer to its own
/// attribute, so it is neither copied nor moved.
struct LaunchConfig {
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute pdl{};
  LaunchConfig(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, bool dependent) {
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    pdl.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &pdl;
    config.numAttrs = dependent ? 1 : 0;
  }
  LaunchConfig(const LaunchConfig&) = delete;
  LaunchConfig& operator=(const LaunchConfig&) = delete;
};

}  // namespace flash_kda::sm90
