// Validation for Target::Sm90: the kernels' supported subset and 32-bit index limits; and the
// GPU entry points refusing host tensors (no GPU needed).
#include "test_validate_helpers.h"

namespace kda_test {
namespace {

const char* kSubset = "the Sm90 kernels support K = V = 128;";

TEST(ValidateSm90, HeadDims) {
  Spec s = sm90_spec();
  s.K = 64;
  Call c(s);
  expect_invalid(c.args, Target::Sm90, "q", {"head dim K = 64 unsupported", kSubset, "reference_forward"});
  Spec sv = sm90_spec();
  sv.V = 256;
  Call cv(sv);
  expect_invalid(cv.args, Target::Sm90, "v", {"head dim V = 256 unsupported", kSubset});
}

TEST(ValidateSm90, EveryGateModeAccepted) {
  // SafeSigmoid with and without A_log / dt_bias, Softplus with them, PreGated without (it
  // rejects them; Softplus without A_log: test_validate_gate.cpp).
  for (GateMode mode : {GateMode::SafeSigmoid, GateMode::Softplus, GateMode::PreGated})
    for (bool with_params : {true, false}) {
      if ((mode == GateMode::PreGated) == with_params || (mode == GateMode::Softplus && !with_params)) continue;
      Spec s = sm90_spec();
      s.with_gate_params = with_params;
      Call c(s);
      c.args.gate = mode;
      EXPECT_NO_THROW(flash_kda::validate(c.args, Target::Sm90)) << static_cast<int>(mode) << " " << with_params;
    }
}

TEST(ValidateSm90, EveryFlagAccepted) {
  for (int bits = 0; bits < 8; ++bits) {
    Call c(sm90_spec());
    c.args.use_qk_l2norm = bits & 1;
    c.args.use_beta_sigmoid = bits & 2;
    c.args.allow_neg_eigval = bits & 4;
    if (c.args.allow_neg_eigval && !c.args.use_beta_sigmoid) {  // the one invalid pair, on every target
      expect_invalid(c.args, Target::Sm90, "allow_neg_eigval", {"needs use_beta_sigmoid"});
      continue;
    }
    EXPECT_NO_THROW(flash_kda::validate(c.args, Target::Sm90)) << bits;
  }
}

TEST(ValidateSm90, KFirstStatesAccepted) {
  Call c(sm90_spec());
  c.args.state_layout = StateLayout::KFirst;  // K = V, so the shapes still match
  EXPECT_NO_THROW(flash_kda::validate(c.args, Target::Sm90));
}

TEST(ValidateSm90, GvaAndVarlenAccepted) {
  Spec s = sm90_spec();
  s.H = 2;
  s.HV = 16;
  s.cu = {0, 0, 1, 17, 300};
  Call c(s);
  const auto p = flash_kda::validate(c.args, Target::Sm90);
  EXPECT_EQ(p.num_seqs, 4);
  EXPECT_EQ(p.seqlen, 300);
}

TEST(ValidateSm90, TooManyValueHeadsForGrid) {
  Spec s = sm90_spec();
  s.B = 1;
  s.T = 1;
  s.H = 1;
  s.HV = 65536;
  s.with_states = false;
  Call c(s);
  expect_invalid(c.args, Target::Sm90, "v", {"HV = 65536 must be <= 65535"});
  Spec ok = s;
  ok.HV = 65535;
  Call c2(ok);
  EXPECT_NO_THROW(flash_kda::validate(c2.args, Target::Sm90));
}

TEST(ValidateSm90, ChunkSlotsOverflow) {
  // (N + ceil(T_total / 16)) * HV < 2^31: with N = 1, HV = 64 the most is T = 16 * (2^25 - 2).
  Spec s = sm90_spec();
  s.B = 1;
  s.H = 64;
  s.HV = 64;
  s.with_states = false;
  s.T = 16 * ((int64_t{1} << 25) - 2);
  Call c(s);
  EXPECT_NO_THROW(flash_kda::validate(c.args, Target::Sm90));
  s.T += 16;
  Call c2(s);
  expect_invalid(c2.args, Target::Sm90, "q", {"(N + ceil(T_total / 16)) * HV = 33554432 * 64", "< 2^31"});
}

TEST(ValidateSm90, TooManySequences) {
  Spec s = sm90_spec();
  s.H = 1;
  s.HV = 1;
  s.with_states = false;
  s.cu = {0, 16};
  Call c(s);
  c.args.cu_seqlens.shape[0] = (int64_t{1} << 31) + 1;  // fake address: never read
  expect_invalid(c.args, Target::Sm90, "cu_seqlens", {"N = 2147483648 sequences must be < 2^31"});
}

TEST(GpuEntryPoints, RejectHostTensors) {
  Call c{Spec{}};
  expect_error([&] { flash_kda::forward_workspace_size(c.args); }, "q", {"is on the host, a CUDA tensor is needed"});
  const auto before = c.snapshot();
  expect_error([&] { flash_kda::forward(c.args, nullptr, 0, nullptr); }, "q", {"is on the host"});
  EXPECT_TRUE(before == c.snapshot());
}

}  // namespace
}  // namespace kda_test
