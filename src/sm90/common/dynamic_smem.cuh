// The block's dynamic shared memory as one pointer, for kernels whose launch sizes it (device
// code; tests/emu/shadow has the CPU model's form).
#pragma once

namespace flash_kda::sm90 {

/// The block's dynamic shared memory (16-byte aligned), as the launch's smem_bytes sized it.
__device__ __forceinline__ char* dynamic_smem() {
  extern __shared__ __align__(16) char smem[];
  return smem;
}

}  // namespace flash_kda::sm90
