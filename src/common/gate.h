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
/// Device fp32 safe gate with the fast exp and reciprocal (rel. error ~1e-6, far below bf16).
__device__ __forceinline__ float safe_gate_fast(float x, float decay_rate, float lower_bound) {
  return lower_bound * __frcp_rn(1.f + __expf(-decay_rate * x));
}
/// Device fp32 beta sigmoid, as safe_gate_fast.
__device__ __forceinline__ float beta_sigmoid_fast(float beta) { return __frcp_rn(1.f + __expf(-beta)); }
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
