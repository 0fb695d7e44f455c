// bf16 conversions shared by the sm_90a kernels.
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

/// The two bf16 of a packed pair (lo in the low half) as fp32: a bf16 is the top half of its
/// fp32, so one shift and one mask (cvt.f32.bf16 of each half costs a PRMT more per pair).
__device__ __forceinline__ float2 unpack_bf16(uint32_t x) {
  return make_float2(__uint_as_float(x << 16), __uint_as_float(x & 0xffff0000u));
}

/// x0, x1 as bf16 hi + lo pairs (x = hi + lo to ~2^-16 relative): two bf16 products then give
/// an fp32-accurate one.
__device__ __forceinline__ void split_bf16(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  hi = pack_bf16(x0, x1);
  const float2 h = unpack_bf16(hi);
  lo = pack_bf16(x0 - h.x, x1 - h.y);
}

/// Element i of a tensor that is fp32 or bf16 (`is_f32`), as fp32: the inputs (beta) and states
/// whose dtype the caller picks.
__device__ __forceinline__ float load_f(const void* base, int64_t i, bool is_f32) {
  return is_f32 ? static_cast<const float*>(base)[i]
                : __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
}

/// Stores x as element i of a tensor that is fp32 or bf16 (`is_f32`), rounding to nearest for
/// bf16: the outputs and states whose dtype the caller picks.
__device__ __forceinline__ void store_f(void* base, int64_t i, float x, bool is_f32) {
  if (is_f32)
    static_cast<float*>(base)[i] = x;
  else
    static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(x);
}

/// The fp32-or-bf16 element (`is_f32`) at `byte_offset` bytes from `base`, as fp32: inputs
/// addressed through a RowLayout (beta).
__device__ __forceinline__ float load_f_at(const void* base, int64_t byte_offset, bool is_f32) {
  const char* p = static_cast<const char*>(base) + byte_offset;
  return is_f32 ? *reinterpret_cast<const float*>(p) : __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(p));
}

}  // namespace flash_kda::sm90
