// Validation: gate mode, its parameters, lower_bound, beta flags and scale.
#include <cmath>
#include <limits>

#include "test_validate_helpers.h"

namespace kda_test {
namespace {

TEST(ValidateGate, LowerBoundRangeForSafeGate) {
  for (double lb : {-5.5, 0.0, 0.5, std::nan("")}) {
    Call c{Spec{}};
    c.args.lower_bound = lb;
    expect_invalid(c.args, Target::CpuReference, "lower_bound", {"must be in [-5, 0) for the safe gate"});
  }
  for (double lb : {-5.0, -1.0, -1e-3}) {
    Call c{Spec{}};
    c.args.lower_bound = lb;
    EXPECT_NO_THROW(flash_kda::validate(c.args, Target::CpuReference)) << lb;
  }
}

TEST(ValidateGate, LowerBoundIgnoredByOtherGates) {
  Call c{Spec{}};
  c.args.lower_bound = 3.0;
  c.args.gate = GateMode::Softplus;
  EXPECT_NO_THROW(flash_kda::validate(c.args, Target::CpuReference));
}

TEST(ValidateGate, PreGatedRejectsGateParameters) {
  Call c{Spec{}};
  c.args.gate = GateMode::PreGated;
  expect_invalid(c.args, Target::CpuReference, "A_log", {"unused when the gate is pre-computed", "pass none"});
  c.args.A_log = TensorView{};
  expect_invalid(c.args, Target::CpuReference, "dt_bias", {"unused when the gate is pre-computed"});
  c.args.dt_bias = TensorView{};
  EXPECT_NO_THROW(flash_kda::validate(c.args, Target::CpuReference));
}

TEST(ValidateGate, ReferenceTreatsGateParametersAsOptional) {
  for (GateMode mode : {GateMode::SafeSigmoid, GateMode::Softplus}) {
    Spec s;
    s.with_gate_params = false;
    Call c(s);
    c.args.gate = mode;
    EXPECT_NO_THROW(flash_kda::validate(c.args, Target::CpuReference));
  }
}

TEST(ValidateGate, Sm90SafeGateTreatsGateParametersAsOptional) {
  // Absent A_log: decay rate 1; absent dt_bias: zero bias (the reference's meaning).
  Call c(sm90_spec());
  c.args.A_log = TensorView{};
  EXPECT_NO_THROW(flash_kda::validate(c.args, Target::Sm90));
  Call c2(sm90_spec());
  c2.args.dt_bias = TensorView{};
  EXPECT_NO_THROW(flash_kda::validate(c2.args, Target::Sm90));
}

TEST(ValidateGate, Sm90SoftplusNeedsALogNotDtBias) {
  Call c(sm90_spec());
  c.args.gate = GateMode::Softplus;
  c.args.A_log = TensorView{};
  expect_invalid(c.args, Target::Sm90, "A_log", {"required by the Sm90 softplus gate", "[HV]"});
  Call c2(sm90_spec());
  c2.args.gate = GateMode::Softplus;
  c2.args.dt_bias = TensorView{};
  EXPECT_NO_THROW(flash_kda::validate(c2.args, Target::Sm90));
}

TEST(ValidateGate, ALogShape) {
  Call c{Spec{}};
  c.args.A_log = c.make(DType::F32, {4});
  expect_invalid(c.args, Target::CpuReference, "A_log", {"expected shape [8] [HV]", "got [4]"});
}

TEST(ValidateGate, DtBiasShapes) {
  Call c{Spec{}};
  c.args.dt_bias = c.make(DType::F32, {8 * 128});
  EXPECT_NO_THROW(flash_kda::validate(c.args, Target::CpuReference));
  c.args.dt_bias = c.make(DType::F32, {8, 64});
  expect_invalid(c.args, Target::CpuReference, "dt_bias",
                 {"expected shape [8, 128] [HV, K] or [1024] [HV*K]", "got [8, 64]"});
}

TEST(ValidateGate, UnknownGateValue) {
  Call c{Spec{}};
  c.args.gate = static_cast<GateMode>(7);
  expect_invalid(c.args, Target::CpuReference, "gate", {"SafeSigmoid, Softplus or PreGated", "got value 7"});
}

TEST(ValidateFlags, NegEigvalNeedsBetaSigmoid) {
  Call c{Spec{}};
  c.args.use_beta_sigmoid = false;
  c.args.allow_neg_eigval = true;
  expect_invalid(c.args, Target::CpuReference, "allow_neg_eigval", {"needs use_beta_sigmoid"});
  c.args.use_beta_sigmoid = true;
  EXPECT_NO_THROW(flash_kda::validate(c.args, Target::CpuReference));
}

TEST(ValidateFlags, UnknownStateLayout) {
  Call c{Spec{}};
  c.args.state_layout = static_cast<StateLayout>(2);
  expect_invalid(c.args, Target::CpuReference, "state_layout", {"VFirst or KFirst", "got value 2"});
}

TEST(ValidateFlags, ScaleFiniteAndPositive) {
  for (double s : {0.0, -0.1, std::numeric_limits<double>::infinity(), std::nan("")}) {
    Call c{Spec{}};
    c.args.scale = s;
    expect_invalid(c.args, Target::CpuReference, "scale", {"must be finite and > 0"});
  }
}

}  // namespace
}  // namespace kda_test
