// Validation edge cases found in review: empty tensors' strides, corrupt ranks, fp32 range.
#include "test_validate_helpers.h"

namespace {

using namespace kda_test;

// numpy reports strides (0, 0, 0, 0) for an empty [2, 0, 4, 128] array and PyTorch
// (512, 512, 128, 1): both describe a tensor with no elements, which is contiguous.
TEST(ValidateEdges, EmptyTensorsAreContiguousWhateverTheirStrides) {
  Spec s;
  s.T = 0;
  Call c(s);
  for (TensorView* t : {&c.args.q, &c.args.k, &c.args.v, &c.args.g, &c.args.out}) {
    for (int d = 0; d < 4; ++d) t->strides[d] = 0;  // numpy style
  }
  c.args.beta.strides[0] = c.args.beta.strides[1] = c.args.beta.strides[2] = 0;
  EXPECT_NO_THROW(flash_kda::validate(c.args, Target::CpuReference));
  Call t(s);
  t.args.q.strides[0] = t.args.q.strides[1] = 4 * 128;  // PyTorch style
  t.args.q.strides[2] = 128;
  t.args.q.strides[3] = 1;
  EXPECT_NO_THROW(flash_kda::validate(t.args, Target::CpuReference));
}

TEST(ValidateEdges, NegativeRankIsAnErrorNotAnAbsentTensor) {
  Call c{Spec{}};
  c.args.initial_state.ndim = -1;
  expect_invalid(c.args, Target::CpuReference, "initial_state", {"rank must be in [0, 4]", "got -1"});
}

TEST(ValidateEdges, Sm90ScaleMustFitFp32) {
  Call c(sm90_spec());
  c.args.scale = 1e39;
  expect_invalid(c.args, Target::Sm90, "scale", {"must fit fp32"});
  Call r{Spec{}};
  r.args.scale = 1e39;  // the fp64 reference has no such limit
  EXPECT_NO_THROW(flash_kda::validate(r.args, Target::CpuReference));
}

}  // namespace
