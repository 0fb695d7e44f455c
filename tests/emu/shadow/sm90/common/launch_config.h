// tests/emu's stand-in for src/sm90/common/launch_config.h: launch_planned runs the kernel on
// the CPU model of warp_emu.h (grid, block and dynamic shared memory as planned) and returns
// when every block has run.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "sm90/common/kernel_launch.h"
#include "warp_emu.h"

namespace flash_kda::sm90 {

template <auto Kernel, class Params>
cudaError_t launch_planned(const KernelLaunch& k, uint64_t, const Params& p, cudaStream_t) {
  emu::run_grid(dim3(k.grid_x, k.grid_y, k.grid_z), dim3(k.block), size_t(k.smem_bytes), [&] { Kernel(p); });
  return cudaSuccess;
}

}  // namespace flash_kda::sm90
