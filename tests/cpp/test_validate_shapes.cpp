// Validation: accepted calls fill ProblemShape; ranks and shapes that disagree name the tensor.
#include <cmath>

#include "test_validate_helpers.h"

namespace kda_test {
namespace {

TEST(ValidateShape, AcceptedCallFillsProblemShape) {
  for (Target target : {Target::CpuReference, Target::Sm90}) {
    Spec s = target == Target::Sm90 ? sm90_spec() : Spec{};
    Call c(s);
    const flash_kda::ProblemShape p = flash_kda::validate(c.args, target);
    EXPECT_EQ(p.batch, 2);
    EXPECT_EQ(p.seqlen, 64);
    EXPECT_EQ(p.num_seqs, 2);
    EXPECT_EQ(p.heads, 4);
    EXPECT_EQ(p.value_heads, 8);
    EXPECT_EQ(p.head_dim_k, 128);
    EXPECT_EQ(p.head_dim_v, 128);
    EXPECT_FALSE(p.varlen);
    EXPECT_DOUBLE_EQ(p.scale, 1.0 / std::sqrt(128.0));
  }
}

TEST(ValidateShape, ExplicitScaleIsReturned) {
  Call c{Spec{}};
  c.args.scale = 0.25;
  EXPECT_DOUBLE_EQ(flash_kda::validate(c.args, Target::CpuReference).scale, 0.25);
}

TEST(ValidateShape, ReferenceAcceptsAnyKVAndGva) {
  Spec s;
  s.K = 24;
  s.V = 40;
  s.H = 3;
  s.HV = 9;
  Call c(s);
  const auto p = flash_kda::validate(c.args, Target::CpuReference);
  EXPECT_EQ(p.head_dim_k, 24);
  EXPECT_EQ(p.head_dim_v, 40);
  EXPECT_DOUBLE_EQ(p.scale, 1.0 / std::sqrt(24.0));
}

// T = 0 is accepted on both targets: no token to compute, final_state = initial_state.
TEST(ValidateShape, ZeroTokensAccepted) {
  Spec s;
  s.T = 0;
  Call c(s);
  EXPECT_EQ(flash_kda::validate(c.args, Target::CpuReference).seqlen, 0);
  Spec g = sm90_spec();
  g.T = 0;
  Call cg(g);
  EXPECT_EQ(flash_kda::validate(cg.args, Target::Sm90).num_seqs, 2);
}

TEST(ValidateShape, MissingRequiredTensor) {
  for (const char* name : {"q", "k", "v", "g", "beta", "out"}) {
    Call c{Spec{}};
    ForwardArgs& a = c.args;
    TensorView* t = std::string(name) == "q" ? &a.q : std::string(name) == "k" ? &a.k
                  : std::string(name) == "v" ? &a.v : std::string(name) == "g" ? &a.g
                  : std::string(name) == "beta" ? &a.beta : &a.out;
    *t = TensorView{};
    expect_invalid(a, Target::CpuReference, name, {"is required", "absent"});
  }
}

TEST(ValidateShape, QWrongRank) {
  Call c{Spec{}};
  c.args.q = c.make(DType::BF16, {2, 64, 4});
  expect_invalid(c.args, Target::CpuReference, "q", {"expected rank 4 [B, T, H, K]", "got rank 3 [2, 64, 4]"});
}

TEST(ValidateShape, RankAboveMaxDims) {
  Call c{Spec{}};
  c.args.v.ndim = 5;
  expect_invalid(c.args, Target::CpuReference, "v", {"rank must be in [0, 4]", "got 5"});
}

TEST(ValidateShape, NegativeExtent) {
  Call c{Spec{}};
  c.args.g.shape[1] = -1;
  expect_invalid(c.args, Target::CpuReference, "g", {"extents must be >= 0", "[2, -1, 8, 128]"});
}

TEST(ValidateShape, NullDataPointer) {
  Call c{Spec{}};
  c.args.beta.data = nullptr;
  expect_invalid(c.args, Target::CpuReference, "beta", {"data pointer is null", "[2, 64, 8]"});
}

TEST(ValidateShape, KDisagreesWithQ) {
  Call c{Spec{}};
  c.args.k = c.make(DType::BF16, {2, 64, 4, 64});
  expect_invalid(c.args, Target::CpuReference, "k",
                 {"expected shape [2, 64, 4, 128] [B, T, H, K] like q", "got [2, 64, 4, 64]"});
}

TEST(ValidateShape, VBatchOrTimeDisagreesWithQ) {
  Call c{Spec{}};
  c.args.v = c.make(DType::BF16, {2, 63, 8, 128});
  expect_invalid(c.args, Target::CpuReference, "v", {"expected shape [2, 64, HV, V]", "got [2, 63, 8, 128]"});
}

TEST(ValidateShape, VWrongRank) {
  Call c{Spec{}};
  c.args.v = c.make(DType::BF16, {2, 64, 1024});
  expect_invalid(c.args, Target::CpuReference, "v", {"expected rank 4 [B, T, HV, V]", "got rank 3"});
}

TEST(ValidateShape, ValueHeadsNotMultipleOfHeads) {
  Spec s;
  s.HV = 6;
  Call c(s);
  expect_invalid(c.args, Target::CpuReference, "v", {"HV = 6", "multiple of q/k heads H = 4", "GVA"});
}

TEST(ValidateShape, ZeroSizes) {
  struct ZeroCase {
    int64_t Spec::*size;
    const char* argument;
    const char* message;
  };
  for (const ZeroCase& z : {ZeroCase{&Spec::B, "q", "batch B = q.shape[0] must be > 0"},
                            ZeroCase{&Spec::H, "q", "heads H = q.shape[2] must be > 0"},
                            ZeroCase{&Spec::K, "q", "head dim K = q.shape[3] must be > 0"},
                            ZeroCase{&Spec::HV, "v", "value heads HV = v.shape[2] must be > 0"},
                            ZeroCase{&Spec::V, "v", "head dim V = v.shape[3] must be > 0"}}) {
    Spec s;
    s.*z.size = 0;
    Call c(s);
    expect_invalid(c.args, Target::CpuReference, z.argument, {z.message});
  }
}

TEST(ValidateShape, GDisagrees) {
  Call c{Spec{}};
  c.args.g = c.make(DType::BF16, {2, 64, 4, 128});  // H instead of HV heads
  expect_invalid(c.args, Target::CpuReference, "g", {"expected shape [2, 64, 8, 128] [B, T, HV, K]", "got [2, 64, 4, 128]"});
}

TEST(ValidateShape, BetaDisagrees) {
  Call c{Spec{}};
  c.args.beta = c.make(DType::BF16, {2, 64, 8, 1});
  expect_invalid(c.args, Target::CpuReference, "beta", {"expected shape [2, 64, 8] [B, T, HV]", "got [2, 64, 8, 1]"});
}

TEST(ValidateShape, OutDisagreesWithV) {
  Call c{Spec{}};
  c.args.out = c.make(DType::BF16, {2, 64, 8, 64}, true);
  expect_invalid(c.args, Target::CpuReference, "out", {"expected shape [2, 64, 8, 128] [B, T, HV, V] like v", "got [2, 64, 8, 64]"});
}

}  // namespace
}  // namespace kda_test
