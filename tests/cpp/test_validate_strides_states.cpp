// Validation of strided activations (any batch, token and head strides, unit last stride,
// 16-byte rows on Sm90), of the state rules (k-first on Sm90, independent dtypes, in place) and
// of the ssm_state_indices state pool (include/flash_kda/forward.h).
#include "test_validate_helpers.h"

namespace kda_test {
namespace {

// q and k as slices 0 and 1 of a fused [B, T, 3, H, K] projection (token stride 3 * H * K),
// v as slice 2 when HV = H: strides of a view, no copy.
void fuse_qkv(ForwardArgs& a, int64_t H, int64_t K) {
  for (TensorView* t : {&a.q, &a.k, &a.v}) {
    t->strides[2] = K;
    t->strides[1] = 3 * H * K;
    t->strides[0] = t->shape[1] * 3 * H * K;
  }
  a.k.data = static_cast<char*>(a.q.data) + H * K * 2;
  a.v.data = static_cast<char*>(a.q.data) + 2 * H * K * 2;
}

TEST(ValidateStrides, FusedProjectionViewsAccepted) {
  for (Target target : {Target::CpuReference, Target::Sm90}) {
    Spec s = target == Target::Sm90 ? sm90_spec() : Spec{};
    s.HV = s.H;
    Call c(s);
    fuse_qkv(c.args, s.H, s.K);
    // out: rows of a longer buffer [B, T + 7, HV, V] (out = buf[:, :T]).
    c.args.out = c.make(DType::BF16, {s.B, s.T + 7, s.HV, s.V});
    c.args.out.shape[1] = s.T;
    EXPECT_NO_THROW(flash_kda::validate(c.args, target));
  }
}

TEST(ValidateStrides, BetaNeedsElementAlignmentOnly) {
  Call c(sm90_spec());
  c.args.beta.strides[1] = 8 + 1;  // beta[..., :HV] of a [B, T, HV + 1] buffer: 18-byte rows
  c.args.beta.strides[0] = 64 * 9;
  EXPECT_NO_THROW(flash_kda::validate(c.args, Target::Sm90));
  c.args.beta.data = static_cast<char*>(c.args.beta.data) + 1;
  expect_invalid(c.args, Target::Sm90, "beta", {"data pointer must be element aligned"});
}

TEST(ValidateStrides, Sm90RowsMustBe16ByteAligned) {
  struct Bad { const char* name; int dim; int64_t stride; const char* what; };
  // bf16 rows: 8 elements = 16 bytes. K = V = 128, HV = 8, H = 4.
  const Bad cases[] = {{"q", 2, 132, "head stride 132 (264 bytes of bf16)"},
                       {"k", 1, 4 * 128 + 4, "token stride 516"},
                       {"v", 0, 64 * 8 * 128 + 4, "batch stride"},
                       {"g", 1, 8 * 128 + 2, "token stride 1026"},
                       {"out", 2, 136 - 4, "head stride 132"}};
  for (const Bad& b : cases) {
    Call c(sm90_spec());
    TensorView* t = b.name[0] == 'q' ? &c.args.q : b.name[0] == 'k' ? &c.args.k : b.name[0] == 'v' ? &c.args.v
                    : b.name[0] == 'g' ? &c.args.g : &c.args.out;
    // Scale the outer strides so that the view stays non-overlapping.
    t->strides[b.dim] = b.stride;
    for (int d = b.dim - 1; d >= 0; --d) t->strides[d] = t->strides[d + 1] * t->shape[d + 1] * 2;
    expect_invalid(c.args, Target::Sm90, b.name, {b.what, "multiple of 16 bytes"});
  }
}

TEST(ValidateStrides, Sm90DataPointerOfAStridedView) {
  Call c(sm90_spec());
  c.args.v.data = static_cast<char*>(c.args.v.data) + 8;
  expect_invalid(c.args, Target::Sm90, "v", {"data pointer must be 16-byte aligned"});
}

TEST(ValidateStrides, NegativeStrideRejected) {
  Call c{Spec{}};
  c.args.k.strides[1] = -512;
  expect_invalid(c.args, Target::CpuReference, "k", {"strides must be >= 0", "got strides [32768, -512, 128, 1]"});
}

TEST(ValidateStrides, OutElementsMustNotShareMemory) {
  Call c{Spec{}};
  c.args.out.strides[1] = 0;  // every token on the same row
  expect_invalid(c.args, Target::CpuReference, "out", {"make elements share memory"});
  Call c2{Spec{}};
  c2.args.out.strides[2] = 64;  // heads of 128 values 64 apart
  expect_invalid(c2.args, Target::CpuReference, "out", {"share memory"});
}

TEST(ValidateStrides, InputsMayRepeatRows) {
  Call c{Spec{}};
  c.args.q.strides[1] = 0;  // a broadcast q: read-only, harmless
  EXPECT_NO_THROW(flash_kda::validate(c.args, Target::CpuReference));
}

TEST(ValidateStrides, StatesAndParametersStayContiguous) {
  Call c(sm90_spec());
  c.args.initial_state.strides[0] *= 2;  // slots of a larger pool
  expect_invalid(c.args, Target::Sm90, "initial_state", {"must be contiguous (row-major)"});
  Call c2(sm90_spec());
  c2.args.final_state.strides[2] = 1;
  c2.args.final_state.strides[3] = 128;
  expect_invalid(c2.args, Target::Sm90, "final_state", {"must be contiguous"});
}

TEST(ValidateStrides, OutMayNotInterleaveWithAnInput) {
  Call c{Spec{}};
  // out's span covers v's (a fused [.., 2, HV, V] buffer of v and out): conservatively rejected.
  c.args.out.strides[1] = 2 * 8 * 128;
  c.args.out.strides[0] = 64 * 2 * 8 * 128;
  c.args.v.strides[1] = 2 * 8 * 128;
  c.args.v.strides[0] = 64 * 2 * 8 * 128;
  c.args.v.data = static_cast<char*>(c.args.out.data) + 8 * 128 * 2;
  expect_invalid(c.args, Target::CpuReference, "out", {"overlaps input v"});
}

TEST(ValidateStates, InPlaceNeedsTheSameDtype) {
  Call c(sm90_spec());
  c.args.final_state = c.args.initial_state;
  c.args.final_state.dtype = DType::BF16;  // same pointer, other dtype: not the same tensor
  expect_invalid(c.args, Target::Sm90, "final_state", {"overlaps initial_state partially", "same pointer, shape and dtype"});
}

TEST(ValidateStates, KFirstShapes) {
  Spec s = sm90_spec();
  s.K = 128;
  s.V = 128;
  Call c(s);
  c.args.state_layout = StateLayout::KFirst;
  c.args.initial_state = c.make(DType::F32, {2, 8, 128, 64});
  expect_invalid(c.args, Target::Sm90, "initial_state", {"[N, HV, K, V] (k-first state layout)"});
}

// A pool call: N = B = 2 sequences, P = 5 slots, indices `dtype`.
Call pool_call(Target target, DType dtype = DType::I64, int64_t P = 5) {
  Spec s = target == Target::Sm90 ? sm90_spec() : Spec{};
  s.with_states = false;
  Call c(s);
  c.args.initial_state = c.make(DType::BF16, {P, 8, 128, 128});
  c.args.final_state = c.args.initial_state;  // in place
  c.args.ssm_state_indices = c.make(dtype, {2});
  if (target == Target::CpuReference) {
    if (dtype == DType::I64) {
      static_cast<int64_t*>(c.args.ssm_state_indices.data)[0] = 3;
      static_cast<int64_t*>(c.args.ssm_state_indices.data)[1] = -1;
    } else if (dtype == DType::I32) {
      static_cast<int32_t*>(c.args.ssm_state_indices.data)[0] = 3;
      static_cast<int32_t*>(c.args.ssm_state_indices.data)[1] = -1;
    }
  }
  return c;
}

TEST(ValidatePool, AcceptedOnBothTargets) {
  for (Target target : {Target::CpuReference, Target::Sm90})
    for (DType d : {DType::I32, DType::I64}) {
      Call c = pool_call(target, d);
      const auto p = flash_kda::validate(c.args, target);
      EXPECT_EQ(p.num_seqs, 2);
    }
}

TEST(ValidatePool, SeparatePoolsOfOneSize) {
  Call c = pool_call(Target::Sm90);
  c.args.final_state = c.make(DType::F32, {5, 8, 128, 128});  // another pool, another dtype
  EXPECT_NO_THROW(flash_kda::validate(c.args, Target::Sm90));
  c.args.final_state = c.make(DType::F32, {4, 8, 128, 128});
  expect_invalid(c.args, Target::Sm90, "final_state", {"expected shape [5, 8, 128, 128] [P, HV, V, K]", "got [4, 8, 128, 128]"});
  c.args.initial_state = TensorView{};  // final pool alone: zero start states
  EXPECT_NO_THROW(flash_kda::validate(c.args, Target::Sm90));
}

TEST(ValidatePool, IndexTensorRules) {
  Call c = pool_call(Target::Sm90);
  c.args.ssm_state_indices = c.make(DType::F32, {2});
  expect_invalid(c.args, Target::Sm90, "ssm_state_indices", {"expected dtype int32 or int64", "got fp32"});
  Call c2 = pool_call(Target::Sm90);
  c2.args.ssm_state_indices = c2.make(DType::I64, {3});
  expect_invalid(c2.args, Target::Sm90, "ssm_state_indices", {"expected shape [2] [N]", "got [3]"});
  Call c3 = pool_call(Target::Sm90);
  c3.args.ssm_state_indices = c3.make(DType::I64, {2, 1});
  expect_invalid(c3.args, Target::Sm90, "ssm_state_indices", {"expected shape [2] [N]", "got [2, 1]"});
  Call c4 = pool_call(Target::Sm90);
  c4.args.ssm_state_indices.data = static_cast<char*>(c4.args.ssm_state_indices.data) + 4;
  expect_invalid(c4.args, Target::Sm90, "ssm_state_indices", {"data pointer must be element aligned"});
  Call c5 = pool_call(Target::Sm90);
  c5.args.ssm_state_indices.device = DeviceType::CPU;
  expect_invalid(c5.args, Target::Sm90, "ssm_state_indices", {"is on the host, a CUDA tensor is needed"});
  Call c6 = pool_call(Target::Sm90, DType::I32);
  c6.args.ssm_state_indices.data = static_cast<char*>(c6.args.ssm_state_indices.data) + 4;  // int32: 4-byte aligned
  EXPECT_NO_THROW(flash_kda::validate(c6.args, Target::Sm90));
}

TEST(ValidatePool, NeedsAPool) {
  Call c = pool_call(Target::Sm90);
  c.args.initial_state = TensorView{};
  c.args.final_state = TensorView{};
  expect_invalid(c.args, Target::Sm90, "ssm_state_indices", {"without initial_state or final_state"});
  Call c2 = pool_call(Target::Sm90, DType::I64, 0);
  expect_invalid(c2.args, Target::Sm90, "initial_state", {"needs P = initial_state.shape[0] >= 1 slots"});
}

TEST(ValidatePool, ReferenceChecksIndexValues) {
  Call c = pool_call(Target::CpuReference);
  static_cast<int64_t*>(c.args.ssm_state_indices.data)[1] = 5;  // P = 5
  expect_invalid(c.args, Target::CpuReference, "ssm_state_indices",
                 {"entry [1] = 5 is outside the pool of P = 5 slots", "negative entries mark padded"});
  static_cast<int64_t*>(c.args.ssm_state_indices.data)[1] = -7;  // any negative: padded
  EXPECT_NO_THROW(flash_kda::validate(c.args, Target::CpuReference));
}

}  // namespace
}  // namespace kda_test
