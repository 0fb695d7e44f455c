// Validation: element types per target.
#include "test_validate_helpers.h"

namespace kda_test {
namespace {

TEST(ValidateDtype, ReferenceAcceptsFp32InputsAndFp64Outputs) {
  Spec s;
  s.in = DType::F32;
  s.out = DType::F64;
  s.state = DType::F64;
  Call c(s);
  EXPECT_NO_THROW(flash_kda::validate(c.args, Target::CpuReference));
}

TEST(ValidateDtype, ReferenceAcceptsMixedInputDtypes) {
  Call c{Spec{}};
  c.args.g = c.make(DType::F32, {2, 64, 8, 128});
  c.args.beta = c.make(DType::F32, {2, 64, 8});
  c.args.out = c.make(DType::F32, {2, 64, 8, 128}, true);
  EXPECT_NO_THROW(flash_kda::validate(c.args, Target::CpuReference));
}

TEST(ValidateDtype, Fp16RejectedEverywhere) {
  Spec s;
  s.in = DType::F16;
  Call c(s);
  expect_invalid(c.args, Target::CpuReference, "q", {"expected dtype bf16 or fp32", "got fp16"});
  Spec g = sm90_spec();
  g.in = DType::F16;
  Call cg(g);
  expect_invalid(cg.args, Target::Sm90, "q", {"expected dtype bf16", "got fp16"});
}

TEST(ValidateDtype, Sm90NeedsBf16QKV) {
  Call c(sm90_spec());
  c.args.k = c.make(DType::F32, {2, 64, 4, 128});
  expect_invalid(c.args, Target::Sm90, "k", {"expected dtype bf16 (the Sm90 kernels read bf16", "got fp32"});
  Call c2(sm90_spec());
  c2.args.v = c2.make(DType::F32, {2, 64, 8, 128});
  expect_invalid(c2.args, Target::Sm90, "v", {"expected dtype bf16", "got fp32"});
}

TEST(ValidateDtype, Sm90AcceptsFp32GateAndBeta) {
  Call c(sm90_spec());
  c.args.g = c.make(DType::F32, {2, 64, 8, 128});
  c.args.beta = c.make(DType::F32, {2, 64, 8});
  EXPECT_NO_THROW(flash_kda::validate(c.args, Target::Sm90));
}

TEST(ValidateDtype, GAndBetaMustBeFloat) {
  Call c{Spec{}};
  c.args.g = c.make(DType::I32, {2, 64, 8, 128});
  expect_invalid(c.args, Target::CpuReference, "g", {"expected dtype bf16 or fp32", "got int32"});
  Call c2{Spec{}};
  c2.args.beta = c2.make(DType::F64, {2, 64, 8});
  expect_invalid(c2.args, Target::CpuReference, "beta", {"expected dtype bf16 or fp32", "got fp64"});
}

TEST(ValidateDtype, OutPerTarget) {
  Call c(sm90_spec());
  c.args.out = c.make(DType::F32, {2, 64, 8, 128});
  expect_invalid(c.args, Target::Sm90, "out", {"expected dtype bf16", "got fp32"});
  Call c2{Spec{}};
  c2.args.out = c2.make(DType::F16, {2, 64, 8, 128}, true);
  expect_invalid(c2.args, Target::CpuReference, "out", {"expected dtype bf16, fp32 or fp64", "got fp16"});
}

TEST(ValidateDtype, ALogAndDtBias) {
  Call c{Spec{}};
  c.args.A_log = c.make(DType::BF16, {8});
  expect_invalid(c.args, Target::CpuReference, "A_log", {"expected dtype fp32", "got bf16"});
  Call c2{Spec{}};
  c2.args.dt_bias = c2.make(DType::F64, {8, 128});
  expect_invalid(c2.args, Target::CpuReference, "dt_bias", {"expected dtype fp32", "got fp64"});
}

TEST(ValidateDtype, StatesPerTarget) {
  Call c{Spec{}};
  c.args.initial_state = c.make(DType::F16, {2, 8, 128, 128});
  expect_invalid(c.args, Target::CpuReference, "initial_state", {"expected dtype bf16, fp32 or fp64", "got fp16"});
  Spec s = sm90_spec();
  s.state = DType::F64;
  Call cg(s);
  expect_invalid(cg.args, Target::Sm90, "initial_state", {"expected dtype bf16 or fp32", "got fp64"});
  Spec b = sm90_spec();
  b.state = DType::BF16;
  Call cb(b);
  EXPECT_NO_THROW(flash_kda::validate(cb.args, Target::Sm90));
}

TEST(ValidateDtype, InitialAndFinalStateDtypesAreIndependent) {
  for (Target target : {Target::CpuReference, Target::Sm90}) {
    for (DType in : {DType::BF16, DType::F32})
      for (DType out : {DType::BF16, DType::F32}) {
        Spec s = target == Target::Sm90 ? sm90_spec() : Spec{};
        s.state = in;
        Call c(s);
        c.args.final_state = c.make(out, {2, 8, 128, 128}, true);
        EXPECT_NO_THROW(flash_kda::validate(c.args, target)) << flash_kda::dtype_name(in) << " -> " << flash_kda::dtype_name(out);
      }
  }
}

TEST(ValidateDtype, OnlyOneStateMayHaveAnyAcceptedDtype) {
  Call c{Spec{}};
  c.args.initial_state = TensorView{};
  c.args.final_state = c.make(DType::BF16, {2, 8, 128, 128}, true);
  EXPECT_NO_THROW(flash_kda::validate(c.args, Target::CpuReference));
}

}  // namespace
}  // namespace kda_test
