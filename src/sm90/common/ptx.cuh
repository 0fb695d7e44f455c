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

/// Starts a 16-byte copy from global to shared memory (cp.async.cg: through L2 only); both
/// addresses 16-byte aligned. cp_async_commit closes the group of copies started since the last
/// one; cp_async_wait<N> waits until at most N of this thread's groups are in flight (the
/// oldest complete first) and cp_async_wait_all for every group (a barrier then shows the data
/// to the block).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { cp_async_wait<0>(); }

/// d += a b on tensor cores, one warp: m16n8k8, tf32 operands (tf32() above), fp32 accumulators,
/// in the fragment layout of the PTX ISA (g = lane / 4, t = lane % 4): a = A[g][t], A[g+8][t],
/// A[g][t+4], A[g+8][t+4] of the 16 x 8 A; b = B[t][g], B[t+4][g] of the 8 x 8 B (k x n);
/// d = D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1] of the 16 x 8 D.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
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
