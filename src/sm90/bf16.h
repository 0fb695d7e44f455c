// bf16 packing shared by the sm_90a kernels.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

namespace flash_kda::sm90 {

/// Two fp32 values rounded to nearest bf16 and packed as one 32-bit register (lo in the low
/// half): the operand and store format of the mma/wgmma fragments.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

}  // namespace flash_kda::sm90
