// tests/emu's stand-in for src/sm90/common/ptx.cuh: each wrapper of a single SASS instruction
// as the libm function it approximates (the emulated kernels then differ from the GPU's only
// by the approximations' last bits, far inside the tests' bounds), the 16-byte store as a copy
// that fails the grid at an address the GPU would fault on. Only what the emulated kernels
// call is here; a kernel that needs more fails to compile, which names what to add.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "warp_emu.h"

namespace flash_kda::sm90::ptx {

inline float ex2(float x) { return std::exp2(x); }
inline float rcp(float x) { return 1.f / x; }
inline float rsqrt(float x) { return 1.f / std::sqrt(x); }
inline float lg2(float x) { return std::log2(x); }
/// st.global.v4.b32 needs a 16-byte aligned address (a misaligned one faults on the GPU).
inline void st_global_v4(void* p, const uint4& v) {
  ::flash_kda::emu::check_aligned(p, 16, "st_global_v4");
  std::memcpy(p, &v, sizeof v);
}

/// The model runs one grid at a time: no earlier grid to wait for, no later one to start.
inline void wait_prior_grid() {}
inline void launch_dependents() {}

struct FastMath {
  float exp2(float x) const { return ex2(x); }
  float recip(float x) const { return rcp(x); }
  float div(float a, float b) const { return a / b; }
  float exp(float x) const { return std::exp(x); }
  float fma(float a, float b, float c) const { return std::fma(a, b, c); }
  float log2(float x) const { return lg2(x); }
};

}  // namespace flash_kda::sm90::ptx
