// The derivatives of the gate, the beta activation and the L2 norm in src/common/gate.h
// against central finite differences of the fp64 forms they differentiate.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/gate.h"

namespace {

namespace math = flash_kda::math;

// Central difference of f at x with step h.
template <class F>
double fd(F f, double x, double h = 1e-6) {
  return (f(x + h) - f(x - h)) / (2 * h);
}

TEST(GateGrad, SafeGateMatchesFiniteDifferences) {
  for (double a_log : {-2.0, 0.0, 1.0, 2.7})
    for (double lb : {-5.0, -1.0, -0.01})
      for (double x = -12.0; x <= 12.0; x += 0.61) {
        const double r = std::exp(a_log);
        const math::GateGrad<double> g = math::safe_gate_grad<double>(x, r, lb);
        const double dx = fd([&](double y) { return math::safe_gate<double>(y, r, lb); }, x);
        const double dal = fd([&](double al) { return math::safe_gate<double>(x, std::exp(al), lb); }, a_log);
        EXPECT_NEAR(g.dx, dx, 1e-7 * (1 + std::abs(dx))) << a_log << " " << lb << " " << x;
        EXPECT_NEAR(g.dA_log, dal, 1e-7 * (1 + std::abs(dal))) << a_log << " " << lb << " " << x;
      }
}

TEST(GateGrad, SoftplusGateMatchesFiniteDifferences) {
  for (double a_log : {-2.0, 0.0, 1.5})
    for (double x = -30.0; x <= 30.0; x += 0.77) {
      const double r = std::exp(a_log);
      const math::GateGrad<double> g = math::softplus_gate_grad<double>(x, r);
      const double dx = fd([&](double y) { return math::softplus_gate<double>(y, r); }, x);
      const double dal = fd([&](double al) { return math::softplus_gate<double>(x, std::exp(al)); }, a_log);
      EXPECT_NEAR(g.dx, dx, 1e-7 * (1 + std::abs(dx))) << a_log << " " << x;
      EXPECT_NEAR(g.dA_log, dal, 1e-6 * (1 + std::abs(dal))) << a_log << " " << x;
    }
}

TEST(GateGrad, BetaSigmoidMatchesFiniteDifferences) {
  for (bool neg : {false, true})
    for (double b = -20.0; b <= 20.0; b += 0.43) {
      const double ref = fd([&](double y) { return math::beta_sigmoid<double>(y, neg); }, b);
      EXPECT_NEAR(math::beta_sigmoid_grad<double>(b, neg), ref, 1e-8) << b;
    }
}

TEST(GateGrad, FiniteForExtremeInputs) {
  // Large |x| saturate to 0 instead of inf * 0.
  for (double x : {-1e30, -1e4, 1e4, 1e30}) {
    EXPECT_TRUE(std::isfinite(math::safe_gate_grad<double>(x, 16.0, -5.0).dx));
    EXPECT_TRUE(std::isfinite(math::softplus_gate_grad<double>(x, 16.0).dx));
    EXPECT_TRUE(std::isfinite(math::beta_sigmoid_grad<double>(x, true)));
    EXPECT_TRUE(std::isfinite(math::safe_gate_grad<float>(float(x), 16.f, -5.f).dx));
    EXPECT_TRUE(std::isfinite(math::softplus_gate_grad<float>(float(x), 16.f).dx));
  }
}

TEST(GateGrad, L2NormBackwardMatchesFiniteDifferences) {
  const std::vector<double> x = {0.3, -1.2, 0.7, 2.0, -0.05};
  const std::vector<double> w = {1.0, -0.5, 0.25, 0.8, -1.3};  // loss = w . x_hat
  auto loss = [&](const std::vector<double>& y) {
    double ss = 0;
    for (double e : y) ss += e * e;
    const double inv = 1 / std::sqrt(ss + math::kL2NormEps);
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += w[i] * y[i] * inv;
    return l;
  };
  double ss = 0;
  for (double e : x) ss += e * e;
  const double inv = 1 / std::sqrt(ss + math::kL2NormEps);
  double dot = 0;
  for (size_t i = 0; i < x.size(); ++i) dot += x[i] * inv * w[i];
  for (size_t i = 0; i < x.size(); ++i) {
    std::vector<double> hi = x, lo = x;
    hi[i] += 1e-6;
    lo[i] -= 1e-6;
    const double ref = (loss(hi) - loss(lo)) / 2e-6;
    EXPECT_NEAR(math::l2norm_grad(w[i], x[i] * inv, dot, inv), ref, 1e-8) << i;
  }
}

}  // namespace
