// Every inline-PTX wrapper of the sm_90a kernels, each defined here once. CuTe and libcu++
// (cuda::ptx) cover the data movement, wgmma and mbarriers; these are the few instructions they
// do not wrap, each a single SASS instruction the kernels rely on.
#pragma once

#include <cstdint>

namespace flash_kda::sm90::ptx {

/// 2^x as one MUFU.EX2 (flush-to-zero; rel. error ~2^-22, far below tf32 and bf16). The kernels
/// compute the gate and the decays in log2 units so that no exp needs a scaling FMUL;
/// __expf and exp2f add range handling that keeps results below FLT_MIN denormal.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// 1 / x as one MUFU.RCP (flush-to-zero): without __frcp_rn's IEEE range checks and slow path
/// (~20 instructions a call). rcp(inf) = 0.
__device__ __forceinline__ float rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// 1 / sqrt(x) for x >= eps (a normal number): rsqrtf's denormal scaling is not needed.
__device__ __forceinline__ float rsqrt(float x) {
  float y;
  asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// log2(x) as one MUFU.LG2 (flush-to-zero; abs. error ~2^-22 for x in [0.5, 2], the softplus
/// gate's range): without log2f's range reduction.
__device__ __forceinline__ float lg2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/// fp32 -> tf32 for an mma operand, round to nearest, ties to even (one instruction on sm_90).
/// PTX does not promise that the low 13 bits of the result are zero, so the result only goes
/// into mma operands, which read tf32's 19 bits.
__device__ __forceinline__ uint32_t tf32(float x) {
  uint32_t y;
  asm("cvt.rn.tf32.f32 %0, %1;" : "=r"(y) : "f"(x));
  return y;
}

/// The 8x8 bf16 matrix whose row g, columns 2 t4 and 2 t4 + 1, this lane holds (g = lane / 4,
/// t4 = lane % 4: the m16n8 fragment layout), transposed: the lane then holds row g of the
/// transpose (movmatrix).
__device__ __forceinline__ uint32_t transpose8x8(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

/// A 16-byte global store as one instruction (st.global.v4.b32). ptxas splits a plain uint4
/// store into four 4-byte stores when the four values do not already sit in four consecutive
/// registers (the decode kernels' state stores compiled so), and a warp's 4-byte stores 16 bytes
/// apart each touch twice the sectors for a quarter of the bytes.
__device__ __forceinline__ void st_global_v4(void* p, const uint4& v) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

/// Programmatic dependent launch, the dependent's side: waits until the grid before it on the
/// stream has completed and its memory is visible (griddepcontrol.wait; returns at once for a
/// kernel not launched as a programmatic dependent). Nothing a kernel reads may be read before.
__device__ __forceinline__ void wait_prior_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

/// Programmatic dependent launch, the primary's side: lets the next kernel on the stream, if it
/// is launched as a programmatic dependent, start once every block of this grid has executed
/// this or exited (griddepcontrol.launch_dependents). It orders nothing: the dependent still
/// reads this grid's results only after its own wait_prior_grid.
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;"); }

/// The operations of the gate's log2 form (src/common/gate.h) as the kernels evaluate them.
struct FastMath {
  __device__ __forceinline__ float exp2(float x) const { return ex2(x); }
  __device__ __forceinline__ float recip(float x) const { return rcp(x); }
  /// a / b with the approximate divide (rel. error ~1e-6, far below bf16).
  __device__ __forceinline__ float div(float a, float b) const { return __fdividef(a, b); }
  /// exp(x), for the gate's decay rate exp(A_log) (computed once per block).
  __device__ __forceinline__ float exp(float x) const { return __expf(x); }
  __device__ __forceinline__ float fma(float a, float b, float c) const { return fmaf(a, b, c); }
  /// log2(x), for the softplus gate's log2(1 + 2^-|x2|).
  __device__ __forceinline__ float log2(float x) const { return lg2(x); }
};

}  // namespace flash_kda::sm90::ptx
