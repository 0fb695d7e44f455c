// The gate and beta activations of KDA, in one place for the CPU reference and the kernels.
// Math: docs/kda-spec.md "Pre-processing" (fla naive_kda_gate, naive_kda_lowerbound_gate).
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define FKDA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FKDA_HOST_DEVICE inline
#endif

namespace flash_kda::math {

/// Safe gate: log decay a = lower_bound * sigmoid(exp(A_log) * (g + dt_bias)), in (lower_bound, 0).
/// `decay_rate` is exp(A_log) (1 without A_log), `x` is g + dt_bias.
template <typename T>
FKDA_HOST_DEVICE T safe_gate(T x, T decay_rate, T lower_bound) {
  return lower_bound / (T(1) + exp(-decay_rate * x));
}

#if defined(__CUDACC__)
/// exp(x) as one ex2.approx.ftz (rel. error ~2^-22): __expf adds range checks so that results
/// below FLT_MIN stay denormal; here those flush to 0, which every caller tolerates (a gate or
/// decay that small is 0 at bf16 precision).
__device__ __forceinline__ float exp_fast(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
  return y;
}
/// Device fp32 safe gate with the fast exp and the approximate divide (rel. error ~1e-6, far
/// below bf16; __frcp_rn's IEEE range checks and slow path cost ~20 instructions per call).
/// exp overflowing to +inf gives 0, the sigmoid's limit.
__device__ __forceinline__ float safe_gate_fast(float x, float decay_rate, float lower_bound) {
  return __fdividef(lower_bound, 1.f + exp_fast(-decay_rate * x));
}
/// Device fp32 beta sigmoid, as safe_gate_fast.
__device__ __forceinline__ float beta_sigmoid_fast(float beta) { return __fdividef(1.f, 1.f + exp_fast(-beta)); }
#endif

/// Softplus gate: a = -exp(A_log) * softplus(g + dt_bias). softplus(x) = max(x, 0) +
/// log1p(exp(-|x|)) never overflows and is exact to rounding for every x.
template <typename T>
FKDA_HOST_DEVICE T softplus_gate(T x, T decay_rate) {
  const T sp = x > T(0) ? x + log1p(exp(-x)) : log1p(exp(x));
  return -decay_rate * sp;
}

/// Beta activation: sigmoid(beta), doubled when negative eigenvalues are allowed.
template <typename T>
FKDA_HOST_DEVICE T beta_sigmoid(T beta, bool allow_neg_eigval) {
  T s = T(1) / (T(1) + exp(-beta));
  return allow_neg_eigval ? T(2) * s : s;
}

/// L2 normalisation epsilon, added inside the square root: x / sqrt(sum(x^2) + eps).
inline constexpr double kL2NormEps = 1e-6;

}  // namespace flash_kda::math
