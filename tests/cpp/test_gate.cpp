// The gate's two forms in src/common/gate.h: the log2 form the kernels evaluate
// (safe_gate_log2, beta_sigmoid_log2), here in fp32 with the C++ library's exp2, against the
// fp64 form the reference evaluates. No GPU needed; the kernels run the same expressions with
// single MUFU instructions (rel. error ~2^-22 more).
#include <gtest/gtest.h>

#include <cmath>

#include "common/gate.h"

namespace {

namespace math = flash_kda::math;

TEST(Gate, Log2FormMatchesTheFp64SafeGate) {
  const math::StdMath m;
  double worst = 0;
  for (double a_log : {-3.0, -1.0, 0.0, 0.5, 1.5, 2.5})
    for (double lower_bound : {-5.0, -2.0, -0.5, -1e-3})
      for (double bias : {-4.0, 0.0, 1.25})
        for (double g = -30.0; g <= 30.0; g += 0.37) {
          const double ref = math::safe_gate<double>(g + bias, std::exp(a_log), lower_bound);
          const math::SafeGateLog2<float> c = math::safe_gate_log2_head(float(a_log), float(lower_bound), m);
          const float bias2 = float(bias) * c.rate2;
          const double got = double(math::safe_gate_log2(float(g), bias2, c, m)) / math::kLog2e;
          ASSERT_LE(got, 0.0);
          ASSERT_GE(got, lower_bound * (1 + 1e-6));
          const double err = std::abs(got - ref) / std::abs(lower_bound);
          worst = std::max(worst, err);
          ASSERT_LE(err, 2e-5) << "a_log " << a_log << " lb " << lower_bound << " g " << g << " bias " << bias;
        }
  EXPECT_GT(worst, 0.0);  // fp32 against fp64: some rounding, all of it tiny
}

TEST(Gate, Log2FormIsExactInFp64) {
  const math::StdMath m;
  for (double a_log : {-2.0, 0.0, 1.0})
    for (double g = -20.0; g <= 20.0; g += 1.3) {
      const double ref = math::safe_gate<double>(g + 0.3, std::exp(a_log), -5.0);
      const math::SafeGateLog2<double> c = math::safe_gate_log2_head(a_log, -5.0, m);
      EXPECT_NEAR(math::safe_gate_log2(g, 0.3 * c.rate2, c, m) / math::kLog2e, ref, 1e-12);
    }
}

TEST(Gate, Log2FormSaturates) {
  // 2^y overflowing to inf gives recip(inf) = 0 (the sigmoid's limit), never NaN.
  const math::StdMath m;
  const math::SafeGateLog2<float> c = math::safe_gate_log2_head(3.0f, -5.0f, m);
  EXPECT_EQ(math::safe_gate_log2(-1e30f, 0.0f, c, m), -0.0f);
  EXPECT_FLOAT_EQ(math::safe_gate_log2(1e30f, 0.0f, c, m), float(-5.0 * math::kLog2e));
}

TEST(Gate, BetaLog2FormMatchesTheSigmoid) {
  const math::StdMath m;
  for (double b = -40.0; b <= 40.0; b += 0.173) {
    const double ref = math::beta_sigmoid<double>(b, false);
    EXPECT_NEAR(double(math::beta_sigmoid_log2(float(b), m)), ref, 2e-7 + 1e-6 * ref) << b;
  }
}

}  // namespace

namespace {

TEST(Gate, SoftplusLog2FormMatchesTheFp64SoftplusGate) {
  const math::StdMath m;
  for (double a_log : {-3.0, -1.0, 0.0, 1.0, 2.5})
    for (double x = -60.0; x <= 60.0; x += 0.173) {
      const double rate = std::exp(a_log);
      const double ref = math::softplus_gate<double>(x, rate);
      const double got = double(math::softplus_gate_log2(float(x), float(-rate), m)) / math::kLog2e;
      ASSERT_LE(got, 0.0) << x;
      // Relative to the value, plus the absolute floor where 1 + 2^x2 rounds to 1 in fp32.
      ASSERT_NEAR(got, ref, 2e-6 * std::abs(ref) + 2e-7 * rate) << "a_log " << a_log << " x " << x;
    }
}

TEST(Gate, SoftplusLog2FormIsExactInFp64) {
  const math::StdMath m;
  for (double x = -30.0; x <= 30.0; x += 0.7) {
    const double ref = math::softplus_gate<double>(x, 2.0);
    EXPECT_NEAR(math::softplus_gate_log2(x, -2.0, m) / math::kLog2e, ref, 1e-12 * (1 + std::abs(ref))) << x;
  }
}

TEST(Gate, SoftplusLog2FormNeverOverflows) {
  const math::StdMath m;
  EXPECT_EQ(math::softplus_gate_log2(-1e30f, -1.0f, m), -0.0f);
  EXPECT_FLOAT_EQ(math::softplus_gate_log2(1e30f, -1.0f, m), float(-1e30 * math::kLog2e));
}

}  // namespace

namespace {

// The forward's form (g and bias2 = dt_bias log2(e)) over the extremes the kernels serve: x
// from -100 to +100 and decay rates exp(A_log) up to 16 (A_log = log 16). Per token the error
// is relative to the value plus an absolute floor of rate 2^-22 (fp32's 1 + 2^-|x2| near 1).
TEST(Gate, SoftplusBiasedLog2FormMatchesTheFp64SoftplusGateAtTheExtremes) {
  const math::StdMath m;
  double worst = 0;
  for (double a_log : {-2.0, 0.0, 1.0, std::log(16.0)})
    for (double bias : {-1.0, 0.0, 0.7})
      for (double g = -100.0; g <= 100.0; g += 0.1237) {
        const double rate = std::exp(a_log);
        const double ref = math::softplus_gate<double>(g + bias, rate);
        const float bias2 = float(bias * math::kLog2e);
        const double got = double(math::softplus_gate_log2_biased(float(g), bias2, float(-rate), m)) / math::kLog2e;
        ASSERT_TRUE(std::isfinite(got));
        ASSERT_LE(got, 0.0) << g;
        const double err = std::abs(got - ref);
        worst = std::max(worst, err / (std::abs(ref) + rate * 1e-6));
        ASSERT_LE(err, 2e-6 * std::abs(ref) + 3e-7 * rate) << "a_log " << a_log << " g " << g << " bias " << bias;
      }
  EXPECT_GT(worst, 0.0);
}

TEST(Gate, SoftplusBiasedLog2FormIsLinearForLargeX) {
  // softplus(x) = x to fp32 rounding for large x: a = -rate x, with no log1p term left over.
  const math::StdMath m;
  for (float g : {30.f, 100.f, 1e4f, 1e30f}) {
    const float got = math::softplus_gate_log2_biased(g, 0.f, -16.f, m);
    EXPECT_FLOAT_EQ(got, -16.f * float(g * math::kLog2e)) << g;
  }
  // ... and goes to 0 from below for very negative x.
  for (float g : {-30.f, -100.f, -1e30f}) {
    const float got = math::softplus_gate_log2_biased(g, 0.f, -16.f, m);
    EXPECT_LE(got, 0.f);
    EXPECT_GE(got, -1e-11f) << g;  // the exact value is -16 e^g log2(e) >= -3e-12
  }
}

TEST(Gate, SoftplusBiasedFormEqualsTheNaturalForm) {
  // The decode's form (x = g + dt_bias) and the forward's (g, bias2) agree to fp32 rounding.
  const math::StdMath m;
  for (double g = -40.0; g <= 40.0; g += 0.29) {
    const float a = math::softplus_gate_log2(float(g + 0.5), -3.f, m);
    const float b = math::softplus_gate_log2_biased(float(g), float(0.5 * math::kLog2e), -3.f, m);
    EXPECT_NEAR(a, b, 1e-6f * (1.f + std::abs(a))) << g;
  }
}

TEST(Gate, PreGateLog2IsTheDecayInLog2Units) {
  for (double g : {-1e4, -50.0, -1.0, 0.0})
    EXPECT_NEAR(double(math::pre_gate_log2(float(g))), g * math::kLog2e, 1e-6 * std::abs(g * math::kLog2e)) << g;
}

}  // namespace
