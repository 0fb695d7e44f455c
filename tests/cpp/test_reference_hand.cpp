// The reference on one- and two-token problems small enough to work out by hand. With the
// pre-gated gate, no L2 norm and raw beta the arithmetic is exact in binary, so the expected
// values are exact; the pre-processing cases use closed forms of the spec's formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/gate.h"
#include "reference_test_util.h"

namespace {

using flash_kda::DType;
using flash_kda::ForwardArgs;
using flash_kda::GateMode;
using flash_kda::StateLayout;
using flash_kda::testing::HostTensor;

// B = 1, H = HV = 1: a single sequence of T tokens, inputs in fp32, results in fp64.
struct TinyCall {
  HostTensor q, k, v, g, beta, A_log, dt_bias, cu_seqlens, initial_state, final_state, out;  // cu_seqlens stays absent: one sequence

  TinyCall(int64_t T, int64_t K, int64_t V, const std::vector<double>& q_, const std::vector<double>& k_,
           const std::vector<double>& v_, const std::vector<double>& g_, const std::vector<double>& beta_,
           StateLayout layout = StateLayout::KFirst) {
    q = HostTensor::from_values(q_, DType::F32, {1, T, 1, K});
    k = HostTensor::from_values(k_, DType::F32, {1, T, 1, K});
    v = HostTensor::from_values(v_, DType::F32, {1, T, 1, V});
    g = HostTensor::from_values(g_, DType::F32, {1, T, 1, K});
    beta = HostTensor::from_values(beta_, DType::F32, {1, T, 1});
    out = HostTensor(DType::F64, {1, T, 1, V});
    const std::vector<int64_t> state_shape =
        layout == StateLayout::VFirst ? std::vector<int64_t>{1, 1, V, K} : std::vector<int64_t>{1, 1, K, V};
    final_state = HostTensor(DType::F64, state_shape);
    layout_ = layout;
  }

  void set_initial_state(const std::vector<double>& s) {
    initial_state = HostTensor::from_values(s, DType::F64, final_state.shape());
  }

  // Pre-gated, no L2 norm, raw beta: the delta rule with nothing in front of it.
  ForwardArgs plain_args(double scale) {
    ForwardArgs a;
    flash_kda::testing::set_views(a, q, k, v, g, beta, out, A_log, dt_bias, cu_seqlens, initial_state, final_state);
    a.gate = GateMode::PreGated;
    a.state_layout = layout_;
    a.use_qk_l2norm = false;
    a.use_beta_sigmoid = false;
    a.scale = scale;
    return a;
  }

 private:
  StateLayout layout_;
};

// One token from a zero state: S = b k v^T, o = scale * b (k . q) v.
TEST(ReferenceByHand, OneTokenFromZeroState) {
  TinyCall c(1, 2, 2, /*q*/ {0.5, 1}, /*k*/ {1, 2}, /*v*/ {3, -1}, /*g*/ {0, 0}, /*beta*/ {0.5}, StateLayout::VFirst);
  flash_kda::reference_forward(c.plain_args(0.25), 1);
  // o = 0.25 * 0.5 * 2.5 * (3, -1)
  EXPECT_EQ(c.out.values(), (std::vector<double>{0.9375, -0.3125}));
  // S = 0.5 * (1, 2)^T (3, -1) = [[1.5, -0.5], [3, -1]]; v-first stores S^T.
  EXPECT_EQ(c.final_state.values(), (std::vector<double>{1.5, 3, -0.5, -1}));
}

// Two tokens, no decay: the second token's write is the error of the first token's state.
TEST(ReferenceByHand, TwoTokensDeltaRule) {
  TinyCall c(2, 2, 2, /*q*/ {1, 1, 2, -1}, /*k*/ {1, 0, 1, 1}, /*v*/ {2, 3, 1, 1}, /*g*/ {0, 0, 0, 0},
             /*beta*/ {1, 0.5});
  flash_kda::reference_forward(c.plain_args(1.0), 1);
  // t1: S1 = (1,0)^T (2,3) = [[2,3],[0,0]], o1 = S1^T (1,1) = (2,3).
  // t2: S1^T k2 = (2,3), w = 0.5 ((1,1) - (2,3)) = (-0.5,-1), S2 = S1 + (1,1)^T w = [[1.5,2],[-0.5,-1]],
  //     o2 = S2^T (2,-1) = (3.5, 5).
  EXPECT_EQ(c.out.values(), (std::vector<double>{2, 3, 3.5, 5}));
  EXPECT_EQ(c.final_state.values(), (std::vector<double>{1.5, 2, -0.5, -1}));
}

// Two tokens, the second starting from a state the first one decayed: checks the order
// "decay, then write, then read" of the spec.
TEST(ReferenceByHand, TwoTokensDecayThenWriteThenRead) {
  // g = log decay; -0.5 is exact in fp32, d = exp(-0.5) is the only inexact number.
  TinyCall c(2, 2, 2, /*q*/ {1, 0, 0, 1}, /*k*/ {1, 1, 0, 1}, /*v*/ {2, 2, 4, 0}, /*g*/ {0, -0.5, 0, 0},
             /*beta*/ {0.5, 1});
  c.set_initial_state({1, 0, 0, 1});  // S0 = I
  flash_kda::reference_forward(c.plain_args(1.0), 1);
  const double d = std::exp(-0.5);
  // t1: S = diag(1, d) I; S^T k = (1, d); w = 0.5 ((2,2) - (1,d)) = (0.5, 1 - d/2);
  //     S1 = [[1.5, 1 - d/2], [0.5, 1 + d/2]]; o1 = row 0 of S1.
  // t2: no decay; k = (0,1): S1^T k = (0.5, 1 + d/2); w = (4,0) - (0.5, 1 + d/2) = (3.5, -1 - d/2);
  //     S2 = [[1.5, 1 - d/2], [4, 0]]; o2 = row 1 of S2 = (4, 0).
  const std::vector<double> out = c.out.values(), fin = c.final_state.values();
  const std::vector<double> out_expect{1.5, 1 - d / 2, 4, 0}, fin_expect{1.5, 1 - d / 2, 4, 0};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_DOUBLE_EQ(out[i], out_expect[i]) << "out element " << i;
    EXPECT_DOUBLE_EQ(fin[i], fin_expect[i]) << "final_state element " << i;
  }
}

// K = V = 1, S0 = 1, k = q = 1, b = 0: one token gives o = scale * exp(a), so each gate's
// formula (with A_log and dt_bias) is read off directly.
TEST(ReferenceByHand, GateFormulas) {
  const double g = 0.5, dt_bias = 0.25, A_log = std::log(2.0f), rate = std::exp(double(std::log(2.0f)));
  struct Case {
    GateMode gate;
    double expected_log_decay;
  };
  const double lower_bound = -3.0;
  const Case cases[] = {
      {GateMode::SafeSigmoid, lower_bound / (1.0 + std::exp(-rate * (g + dt_bias)))},
      {GateMode::Softplus, -rate * std::log(1.0 + std::exp(g + dt_bias))},
      {GateMode::PreGated, g},
  };
  for (const Case& cs : cases) {
    SCOPED_TRACE(int(cs.gate));
    TinyCall c(1, 1, 1, {1}, {1}, {5}, {g}, {0});
    c.set_initial_state({1});
    if (cs.gate != GateMode::PreGated) {
      c.A_log = HostTensor::from_values({A_log}, DType::F32, {1});
      c.dt_bias = HostTensor::from_values({dt_bias}, DType::F32, {1});
    }
    ForwardArgs a = c.plain_args(0.75);
    a.gate = cs.gate;
    a.lower_bound = lower_bound;
    flash_kda::reference_forward(a, 1);
    EXPECT_NEAR(c.out.values()[0], 0.75 * std::exp(cs.expected_log_decay), 1e-15);
    EXPECT_NEAR(c.final_state.values()[0], std::exp(cs.expected_log_decay), 1e-15);
  }
}

// L2 norm (eps 1e-6 inside the sqrt), beta = 2 sigmoid(0) = 1, default scale K^-0.5:
// from a zero state o = scale * b (k_hat . q_hat) v with k = q = (3, 4), so k_hat . q_hat = 25 / (25 + 1e-6).
TEST(ReferenceByHand, L2NormNegEigvalBetaDefaultScale) {
  TinyCall c(1, 2, 1, /*q*/ {3, 4}, /*k*/ {3, 4}, /*v*/ {2}, /*g*/ {0, 0}, /*beta*/ {0});
  ForwardArgs a = c.plain_args(1.0);
  a.scale.reset();
  a.use_qk_l2norm = true;
  a.use_beta_sigmoid = true;
  a.allow_neg_eigval = true;
  flash_kda::reference_forward(a, 1);
  const double cos = 25.0 / (25.0 + 1e-6);
  EXPECT_NEAR(c.out.values()[0], (1.0 / std::sqrt(2.0)) * 1.0 * cos * 2.0, 1e-15);
  // S = b k_hat v^T = (3, 4) / sqrt(25 + 1e-6) * 2.
  const std::vector<double> fin = c.final_state.values();
  EXPECT_NEAR(fin[0], 6.0 / std::sqrt(25.0 + 1e-6), 1e-15);
  EXPECT_NEAR(fin[1], 8.0 / std::sqrt(25.0 + 1e-6), 1e-15);
}

}  // namespace

// softplus(x) = x + log1p(exp(-x)) for large x: the gate must keep the exp(-x) term
// (a cut-off at x > 20 would be off by ~2e-9 there).
TEST(ReferenceByHand, SoftplusGateKeepsItsTailForLargeInputs) {
  const double x = 25.0, rate = 1.0;
  const double exact = x + std::log1p(std::exp(-x));
  EXPECT_EQ(flash_kda::math::softplus_gate<double>(x, rate), -exact);
  EXPECT_NE(exact, x);  // the tail is visible in fp64 at x = 25
  EXPECT_EQ(flash_kda::math::softplus_gate<double>(-30.0, rate), -std::log1p(std::exp(-30.0)));
}
