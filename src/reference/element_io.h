// Reading and writing single tensor elements as fp64, for the CPU reference. The reference
// reads every input exactly (bf16 and fp32 widen to fp64 without rounding) and rounds only
// once, when it stores a result in a narrower dtype.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "flash_kda/tensor.h"

namespace flash_kda::reference_detail {

/// bf16 bit pattern -> value. bf16 is the upper half of an fp32, so this is exact.
inline float bf16_bits_to_float(uint16_t bits) {
  const uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// fp64 -> bf16 bit pattern, rounded to nearest, ties to even, in one rounding.
///
/// Going through fp32 with ordinary rounding would round twice and can land on the wrong bf16
/// at near-ties; rounding to fp32 "to odd" first keeps the information a single rounding needs
/// (fp32 has 16 more mantissa bits than bf16, far more than the 2 that round-to-odd requires).
inline uint16_t double_to_bf16_bits(double x) {
  if (std::isnan(x)) return uint16_t(std::signbit(x) ? 0xFFC0 : 0x7FC0);
  float f = static_cast<float>(x);
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if (static_cast<double>(f) != x) {
    // Step back to the fp32 truncation toward zero when rounding went away from zero (this
    // also turns an overflow to inf into FLT_MAX), then set the sticky lowest bit.
    if (std::fabs(static_cast<double>(f)) > std::fabs(x)) u -= 1;
    u |= 1u;
  }
  const uint32_t rounding_bias = 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t((u + rounding_bias) >> 16);
}

/// Element `i` (linear index into a contiguous tensor) of `t`, widened to fp64.
/// Integer dtypes are returned as their value (cu_seqlens); U8 and F16 are never passed here.
inline double load_element(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::BF16: return bf16_bits_to_float(static_cast<const uint16_t*>(t.data)[i]);
    case DType::F32: return static_cast<const float*>(t.data)[i];
    case DType::F64: return static_cast<const double*>(t.data)[i];
    case DType::I32: return static_cast<const int32_t*>(t.data)[i];
    case DType::I64: return static_cast<double>(static_cast<const int64_t*>(t.data)[i]);
    default: return std::nan("");
  }
}

/// Stores `x` into element `i` of `t`, rounding to nearest even for bf16 and fp32.
inline void store_element(const TensorView& t, int64_t i, double x) {
  switch (t.dtype) {
    case DType::BF16: static_cast<uint16_t*>(t.data)[i] = double_to_bf16_bits(x); break;
    case DType::F32: static_cast<float*>(t.data)[i] = static_cast<float>(x); break;
    case DType::F64: static_cast<double*>(t.data)[i] = x; break;
    default: break;
  }
}

}  // namespace flash_kda::reference_detail
