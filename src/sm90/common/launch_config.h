// Kernel attributes set once per kernel and CUDA context, and the launch configuration the
// kernels share. cudaFuncSetAttribute is a driver call, and the forward runs once per layer and
// step: on small problems the host time per call (~50-70 us, docs/performance.md) is what the
// caller waits for.
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime.h>

#include "sm90/common/device_props.h"
#include "sm90/common/kernel_launch.h"

namespace flash_kda::sm90 {

/// Lets `Kernel` use `bytes` of dynamic shared memory (above the 48 KB default) in the context
/// `context_key` (stream_context_key(): the context of the call's stream, a green context
/// included). The attribute is set the first time per context, for up to kSlots contexts, and on
/// every call beyond them: a green context shares its device's primary context's modules, but a
/// separate context (one made by cuCtxCreate) loads modules of its own, so once per context is
/// right for both. The first
/// `bytes` sticks: pass the kernel's largest size, the same on every call. Returns the CUDA error
/// of the attribute call.
template <auto Kernel>
cudaError_t allow_dynamic_smem(uint64_t context_key, int bytes) {
  constexpr int kSlots = 16;
  static std::atomic<uint64_t> done[kSlots] = {};  // context keys, 0 = free; a race only sets twice
  for (int i = 0; i < kSlots; ++i) {
    const uint64_t k = done[i].load(std::memory_order_acquire);
    if (k == context_key) return cudaSuccess;
    if (k == 0) break;
  }
  const cudaError_t e = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) return e;
  for (int i = 0; i < kSlots; ++i) {
    uint64_t expected = 0;
    if (done[i].compare_exchange_strong(expected, context_key, std::memory_order_acq_rel) ||
        expected == context_key)
      break;
  }
  return cudaSuccess;
}

/// A cudaLaunchKernelEx configuration of one planned launch (KernelLaunch), with the
/// programmatic-dependent-launch attribute when it is a dependent. Holds a pointer to its own
/// attribute, so it is neither copied nor moved.
struct LaunchConfig {
  cudaLaunchConfig_t config{};
  cudaLaunchAttribute pdl{};
  LaunchConfig(const KernelLaunch& k, cudaStream_t stream) {
    config.gridDim = dim3(k.grid_x, k.grid_y, k.grid_z);
    config.blockDim = dim3(k.block);
    config.dynamicSmemBytes = static_cast<size_t>(k.smem_bytes);
    config.stream = stream;
    pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    pdl.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &pdl;
    config.numAttrs = k.dependent ? 1 : 0;
  }
  LaunchConfig(const LaunchConfig&) = delete;
  LaunchConfig& operator=(const LaunchConfig&) = delete;
};

/// Launches `Kernel` as planned: sets its shared-memory attribute (first time per context) when
/// it needs more than the default, then cudaLaunchKernelEx. Returns the CUDA error.
template <auto Kernel, class Params>
cudaError_t launch_planned(const KernelLaunch& k, uint64_t context_key, const Params& p, cudaStream_t stream) {
  if (k.smem_attr > 48 * 1024) {
    const cudaError_t e = allow_dynamic_smem<Kernel>(context_key, k.smem_attr);
    if (e != cudaSuccess) return e;  // a failure is reported, not launched over
  }
  const LaunchConfig launch(k, stream);
  return cudaLaunchKernelEx(&launch.config, Kernel, p);
}

}  // namespace flash_kda::sm90
