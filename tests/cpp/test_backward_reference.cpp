// reference_backward against central finite differences of reference_forward, in fp64 on the
// CPU: the loss is sum(W_out * out) + sum(W_s * final_state) for random weights, which are then
// d_out and d_final_state. Inputs are fp32 and fp64 (states), each perturbation is the exact
// difference of the two stored values, so the comparison is limited only by the difference
// quotient's own error (~1e-7 relative).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "flash_kda/flash_kda.h"
#include "reference_test_util.h"

namespace {

using flash_kda::BackwardArgs;
using flash_kda::DType;
using flash_kda::GateMode;
using flash_kda::StateLayout;
using flash_kda::testing::Fp64Gradients;
using flash_kda::testing::HostTensor;
using flash_kda::testing::KdaConfig;
using flash_kda::testing::KdaProblem;

struct FdCase {
  std::string name;
  KdaConfig config;
  bool l2norm = true;
  bool neg_eigval = false;
};

void PrintTo(const FdCase& c, std::ostream* os) { *os << c.name; }

HostTensor random_like(const HostTensor& t, std::mt19937_64& rng) {
  std::normal_distribution<double> n(0.0, 1.0);
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (auto& e : v) e = n(rng);
  return HostTensor::from_values(v, DType::F64, t.shape());
}

class BackwardReference : public ::testing::TestWithParam<FdCase> {};

TEST_P(BackwardReference, MatchesFiniteDifferences) {
  KdaConfig cfg = GetParam().config;
  cfg.input_dtype = DType::F32;
  cfg.out_dtype = DType::F64;
  cfg.state_dtype = DType::F64;
  KdaProblem prob = flash_kda::testing::make_random_problem(cfg);
  std::mt19937_64 rng(7);
  HostTensor w_out = random_like(prob.out, rng);
  HostTensor w_fin = prob.final_state.defined() ? random_like(prob.final_state, rng) : HostTensor{};

  auto forward_args = [&] {
    flash_kda::ForwardArgs a = prob.args();
    a.use_qk_l2norm = GetParam().l2norm;
    a.allow_neg_eigval = GetParam().neg_eigval;
    return a;
  };
  auto loss = [&] {
    flash_kda::ForwardArgs a = forward_args();
    flash_kda::reference_forward(a, 1);
    double l = 0;
    const std::vector<double> o = prob.out.values(), wo = w_out.values();
    for (size_t i = 0; i < o.size(); ++i) l += o[i] * wo[i];
    if (prob.final_state.defined()) {
      const std::vector<double> s = prob.final_state.values(), ws = w_fin.values();
      for (size_t i = 0; i < s.size(); ++i) l += s[i] * ws[i];
    }
    return l;
  };

  // The analytic gradients, fp64.
  Fp64Gradients grads(prob);
  flash_kda::reference_backward(grads.args(forward_args(), w_out, w_fin), 2);

  struct Pair {
    const char* name;
    HostTensor* input;
    HostTensor* grad;
  };
  const Pair pairs[] = {{"q", &prob.q, &grads.dq},
                        {"k", &prob.k, &grads.dk},
                        {"v", &prob.v, &grads.dv},
                        {"g", &prob.g, &grads.dg},
                        {"beta", &prob.beta, &grads.dbeta},
                        {"A_log", &prob.A_log, &grads.dA_log},
                        {"dt_bias", &prob.dt_bias, &grads.ddt_bias},
                        {"initial_state", &prob.initial_state, &grads.d_initial_state}};
  for (const Pair& pr : pairs) {
    if (!pr.input->defined()) continue;
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < pr.input->numel(); ++i) {
      const double x = pr.input->get(i);
      const double h = 1e-3 * (1 + std::abs(x));
      pr.input->set(i, x + h);
      const double xp = pr.input->get(i);
      const double lp = loss();
      pr.input->set(i, x - h);
      const double xm = pr.input->get(i);
      const double lm = loss();
      pr.input->set(i, x);
      const double ref = (lp - lm) / (xp - xm);
      worst = std::max(worst, std::abs(pr.grad->get(i) - ref));
      scale = std::max(scale, std::abs(ref));
    }
    EXPECT_LE(worst, 2e-5 * (1 + scale)) << pr.name << ": worst |analytic - fd| " << worst << ", max |fd| " << scale;
  }
}

KdaConfig small(GateMode gate) {
  KdaConfig c;
  c.batch = 2;
  c.seqlen = 7;
  c.heads = 1;
  c.value_heads = 2;
  c.head_dim_k = 4;
  c.head_dim_v = 3;
  c.gate = gate;
  return c;
}

std::vector<FdCase> cases() {
  std::vector<FdCase> v;
  v.push_back({"safe_gate_vfirst", small(GateMode::SafeSigmoid)});
  KdaConfig c = small(GateMode::Softplus);
  c.state_layout = StateLayout::KFirst;
  v.push_back({"softplus_kfirst", c});
  c = small(GateMode::PreGated);
  c.qk_std = 0.5;
  v.push_back({"pregated_no_norm", c, false});
  c = small(GateMode::SafeSigmoid);
  c.seqlens = {5, 0, 6};
  c.with_A_log = false;
  v.push_back({"varlen_empty_no_A_log_neg_eigval", c, true, true});
  c = small(GateMode::SafeSigmoid);
  c.beta_logits = false;  // b = beta
  c.with_final_state = false;
  c.with_dt_bias = false;
  v.push_back({"beta_given_no_final_state", c});
  c = small(GateMode::Softplus);
  c.heads = 2;
  c.value_heads = 2;
  c.with_initial_state = false;
  v.push_back({"softplus_no_initial_state", c});
  c = small(GateMode::Softplus);
  c.g_mean = 4.0;  // a ~ -4 to -64 a token: every factor of a chunk but the nearest underflows
  v.push_back({"softplus_strong_decay", c});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, BackwardReference, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<FdCase>& i) { return i.param.name; });

TEST(BackwardReferenceErrors, BadCallsAreNamed) {
  KdaConfig cfg = small(GateMode::SafeSigmoid);
  KdaProblem prob = flash_kda::testing::make_random_problem(cfg);
  HostTensor d_out(DType::F64, prob.out.shape()), no_d_final;
  Fp64Gradients grads(prob);
  BackwardArgs b = grads.args(prob.args(), d_out, no_d_final);
  b.dA_log = b.ddt_bias = b.d_initial_state = {};  // the optional gradients not asked for
  EXPECT_NO_THROW(flash_kda::reference_backward(b));
  BackwardArgs bad = b;
  bad.dq = {};
  try {
    flash_kda::reference_backward(bad);
    FAIL();
  } catch (const flash_kda::Error& e) {
    EXPECT_EQ(e.argument(), "dq");
  }
  EXPECT_THROW(flash_kda::reference_backward(b, -1), flash_kda::Error);
}

}  // namespace
