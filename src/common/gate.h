// The gate and beta activations of KDA, in one place for the CPU reference and the kernels:
// the fp64 forms the reference evaluates, and beside them the log2 forms the sm_90a kernels
// evaluate, derived from them here and checked against them by tests/cpp/test_gate.cpp.
// Math: docs/kda-spec.md "Pre-processing".
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define FKDA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FKDA_HOST_DEVICE inline
#endif

namespace flash_kda::math {

/// log2(e): a natural-log quantity times it is the same quantity in log2 units.
inline constexpr double kLog2e = 1.4426950408889634;

/// Safe gate: log decay a = lower_bound * sigmoid(exp(A_log) * (g + dt_bias)), in (lower_bound, 0).
/// `decay_rate` is exp(A_log) (1 without A_log), `x` is g + dt_bias.
template <typename T>
FKDA_HOST_DEVICE T safe_gate(T x, T decay_rate, T lower_bound) {
  return lower_bound / (T(1) + exp(-decay_rate * x));
}

// ---- The log2 form of the safe gate (what the kernels evaluate).
//
// The kernels keep every decay in log2 units, a2 = a log2(e), so that each exp(.) is one 2^(.)
// instruction with no scaling multiply. From safe_gate, with x = g + dt_bias and
// e^(-r x) = 2^(-r log2(e) x):
//
//   a2 = lower_bound log2(e) / (1 + e^(-r (g + dt_bias)))
//      = lb2 / (1 + 2^(rate2 g + rate2 dt_bias)),   rate2 = -exp(A_log) log2(e), lb2 = lower_bound log2(e)
//
// so a block computes rate2 and lb2 once per head, bias2 = rate2 dt_bias once per channel, and
// each token one FMA, one 2^(.), one add, one reciprocal and one multiply. 2^y overflowing to
// +inf gives recip(inf) = 0, the sigmoid's limit. `Math` supplies the operations: exp2, recip,
// exp, fma, div and log2 (ptx::FastMath on the device: single MUFU instructions; StdMath on the host).

/// Per-head constants of the log2 safe gate.
template <typename T>
struct SafeGateLog2 {
  T rate2;  // -exp(A_log) log2(e)
  T lb2;    // lower_bound log2(e)
};

template <typename T, class Math>
FKDA_HOST_DEVICE SafeGateLog2<T> safe_gate_log2_head(T a_log, T lower_bound, const Math& m) {
  return {-m.exp(a_log) * T(kLog2e), lower_bound * T(kLog2e)};
}

/// a log2(e) for the gate input g of a channel whose bias2 = rate2 * dt_bias.
template <typename T, class Math>
FKDA_HOST_DEVICE T safe_gate_log2(T g, T bias2, const SafeGateLog2<T>& c, const Math& m) {
  return c.lb2 * m.recip(T(1) + m.exp2(m.fma(g, c.rate2, bias2)));
}

/// sigmoid(beta) by the same 2^(.): 1 / (1 + e^-beta) = 1 / (1 + 2^(-beta log2(e))).
template <typename T, class Math>
FKDA_HOST_DEVICE T beta_sigmoid_log2(T beta, const Math& m) {
  return m.div(T(1), T(1) + m.exp2(-beta * T(kLog2e)));
}

/// softplus(x) in log2 units from x2 = x log2(e): softplus(x) log2(e) = max(x2, 0) +
/// log2(1 + 2^-|x2|) (the log2 form of the fp64 softplus below). 2^-|x2| <= 1, so nothing
/// overflows, and for large |x| the result is max(x2, 0) exactly (the log term is below fp32's
/// resolution of it, or 0). For x2 below about -24 the 1 + 2^x2 rounds to 1 in fp32 and the
/// result becomes 0 where the exact value is 2^x2 / ln 2: an absolute error below 2^-24, far
/// below the decay's bf16 and fp32 resolution. Two MUFU operations (2^(.), log2) and three ALU.
template <typename T, class Math>
FKDA_HOST_DEVICE T softplus_log2(T x2, const Math& m) {
  const T pos = x2 > T(0) ? x2 : T(0);
  const T neg_abs = x2 > T(0) ? -x2 : x2;
  return pos + m.log2(T(1) + m.exp2(neg_abs));
}

/// The log2 form of the softplus gate (what the decode kernel evaluates). With x2 = x log2(e):
///
///   a2 = a log2(e) = -exp(A_log) softplus(x) log2(e) = neg_rate softplus_log2(x2)
///
/// with neg_rate = -exp(A_log), one per head.
template <typename T, class Math>
FKDA_HOST_DEVICE T softplus_gate_log2(T x, T neg_rate, const Math& m) {
  return neg_rate * softplus_log2(x * T(kLog2e), m);
}

/// The same gate from g and bias2 = dt_bias log2(e) (once per channel): x2 = g log2(e) + bias2
/// is one FMA (what the forward's prepare kernel evaluates).
template <typename T, class Math>
FKDA_HOST_DEVICE T softplus_gate_log2_biased(T g, T bias2, T neg_rate, const Math& m) {
  return neg_rate * softplus_log2(m.fma(g, T(kLog2e), bias2), m);
}

/// The pre-gated mode's log2 form: the caller's natural-log decay a = g, times log2(e).
template <typename T>
FKDA_HOST_DEVICE T pre_gate_log2(T g) {
  return g * T(kLog2e);
}

/// The operations of the log2 forms in the C++ library's exact (correctly rounded where the
/// library is) versions: the host side of the check of the kernels' forms.
struct StdMath {
  template <typename T> T exp2(T x) const { return std::exp2(x); }
  template <typename T> T exp(T x) const { return std::exp(x); }
  template <typename T> T log2(T x) const { return std::log2(x); }
  template <typename T> T recip(T x) const { return T(1) / x; }
  template <typename T> T div(T a, T b) const { return a / b; }
  template <typename T> T fma(T a, T b, T c) const { return std::fma(a, b, c); }
};

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

// ---- Derivatives of the fp64 forms above (the backward; include/flash_kda/backward.h).
//
// Written for any floating T so that the reference (double) and the kernels (float) evaluate
// the same expressions; tests/cpp/test_gate_grad.cpp checks them against finite differences
// of the forms above. `decay_rate` is r = exp(A_log) (1 without A_log), so d r / d A_log = r.

/// The partial derivatives of one gate value a with respect to its inputs.
template <typename T>
struct GateGrad {
  T dx;      ///< d a / d x, x = g + dt_bias: also d a / d g and d a / d dt_bias
  T dA_log;  ///< d a / d A_log (meaningful only when the gate has an A_log)
};

/// Safe gate a = lb * s, s = sigmoid(r x): d a / d x = lb r s (1 - s) and
/// d a / d A_log = d a / d r * r = lb x s (1 - s) r. s(1 - s) = e / (1 + e)^2 with
/// e = exp(-|r x|) <= 1, so nothing overflows for any x.
template <typename T>
FKDA_HOST_DEVICE GateGrad<T> safe_gate_grad(T x, T decay_rate, T lower_bound) {
  const T z = decay_rate * x;
  const T e = exp(z > T(0) ? -z : z);
  const T ds = e / ((T(1) + e) * (T(1) + e));  // sigmoid'(z) = s (1 - s)
  return {lower_bound * decay_rate * ds, lower_bound * x * decay_rate * ds};
}

/// Softplus gate a = -r softplus(x): d a / d x = -r sigmoid(x) and d a / d A_log = -r softplus(x) = a.
template <typename T>
FKDA_HOST_DEVICE GateGrad<T> softplus_gate_grad(T x, T decay_rate) {
  const T sig = x >= T(0) ? T(1) / (T(1) + exp(-x)) : exp(x) / (T(1) + exp(x));
  return {-decay_rate * sig, softplus_gate(x, decay_rate)};
}

/// d b / d beta of beta_sigmoid: s (1 - s), doubled when negative eigenvalues are allowed.
template <typename T>
FKDA_HOST_DEVICE T beta_sigmoid_grad(T beta, bool allow_neg_eigval) {
  const T e = exp(beta > T(0) ? -beta : beta);
  const T ds = e / ((T(1) + e) * (T(1) + e));
  return allow_neg_eigval ? T(2) * ds : ds;
}

/// L2 normalisation epsilon, added inside the square root: x / sqrt(sum(x^2) + eps).
inline constexpr double kL2NormEps = 1e-6;

/// The L2 normalisation's backward: x_hat = x / n with n = sqrt(|x|^2 + eps) gives
/// d x = (d x_hat - x_hat (x_hat . d x_hat)) / n. `x_hat_dot_dx_hat` is x_hat . d x_hat and
/// `inv_norm` is 1 / n; one element at a time.
template <typename T>
FKDA_HOST_DEVICE T l2norm_grad(T dx_hat, T x_hat, T x_hat_dot_dx_hat, T inv_norm) {
  return (dx_hat - x_hat * x_hat_dot_dx_hat) * inv_norm;
}

}  // namespace flash_kda::math
