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

/// cp.async as a copy that lands at once (16-byte aligned at both ends, as the GPU requires).
inline void cp_async_16(void* smem, const void* gmem) {
  ::flash_kda::emu::check_aligned(smem, 16, "cp_async_16 (shared)");
  ::flash_kda::emu::check_aligned(gmem, 16, "cp_async_16 (global)");
  std::memcpy(smem, gmem, 16);
}
inline void cp_async_commit() {}
template <int N>
void cp_async_wait() {}

/// tf32 rounding (to nearest even, 10 mantissa bits), as the bits of an fp32 number.
inline uint32_t tf32(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
  return u;
}

/// The warp's m16n8k8 tf32 mma: the lanes' fragments gathered in one warp-wide step of the
/// model, then each lane computes its four results from the 16 x 8 A and 8 x 8 B (fp32 sums in
/// k order). Each operand is read as its top 19 bits (a tf32 number), as the tensor core reads
/// it, so that an operand the kernel failed to round or split costs here what it costs there.
inline void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const char* file = __builtin_FILE(),
                     int line = __builtin_LINE()) {
  struct Frags {
    uint32_t a[4], b[2];
  };
  const Frags mine{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}};
  Frags all[32];
  ::flash_kda::emu::gather(&mine, sizeof mine, all, {file, line});
  float A[16][8], B[8][8];
  for (int src = 0; src < 32; ++src) {
    const int g = src / 4, t = src % 4;
    uint32_t bits[6] = {all[src].a[0], all[src].a[1], all[src].a[2], all[src].a[3], all[src].b[0], all[src].b[1]};
    float f[6];
    for (int i = 0; i < 6; ++i) {
      bits[i] &= 0xffffe000u;
      std::memcpy(f + i, bits + i, 4);
    }
    A[g][t] = f[0];
    A[g + 8][t] = f[1];
    A[g][t + 4] = f[2];
    A[g + 8][t + 4] = f[3];
    B[t][g] = f[4];
    B[t + 4][g] = f[5];
  }
  const int lane = int(::flash_kda::emu::coord().thread.x) % 32, g = lane / 4, t = lane % 4;
  for (int r = 0; r < 4; ++r) {
    const int row = g + 8 * (r / 2), col = 2 * t + r % 2;
    float acc = d[r];
    for (int k = 0; k < 8; ++k) acc += A[row][k] * B[k][col];
    d[r] = acc;
  }
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
