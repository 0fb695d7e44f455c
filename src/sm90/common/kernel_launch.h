// One kernel launch as the plan decides it: plain numbers, host-visible, so that the plan is
// host code (unit-tested without a GPU) and the launch only executes it.
#pragma once

#include <cstdint>

namespace flash_kda::sm90 {

/// Grid, block, dynamic shared memory and launch attributes of one kernel launch.
struct KernelLaunch {
  uint32_t grid_x = 1, grid_y = 1, grid_z = 1;
  uint32_t block = 0;      // threads per block
  int smem_bytes = 0;      // dynamic shared memory of this launch
  /// The kernel's cudaFuncAttributeMaxDynamicSharedMemorySize: the largest smem_bytes any launch
  /// of this kernel requests, the same on every call (allow_dynamic_smem sets it once).
  int smem_attr = 0;
  /// Launched as the programmatic dependent of the kernel before it on the stream (programmatic
  /// dependent launch): it may start once every block of that kernel has triggered or exited,
  /// and waits for its completion in cudaGridDependencySynchronize.
  bool dependent = false;

  uint64_t blocks() const { return uint64_t(grid_x) * grid_y * grid_z; }
};

}  // namespace flash_kda::sm90
