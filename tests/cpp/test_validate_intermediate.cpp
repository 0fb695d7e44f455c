// Validation of the intermediate (prefix-cache) states of a forward call: intermediate_states,
// intermediate_offsets, intermediate_every (include/flash_kda/forward.h), on both targets.
#include <cstring>

#include "test_validate_helpers.h"

namespace kda_test {
namespace {

// Adds intermediate states of S rows (layout per the call's state_layout) and offsets [N + 1]
// of `offsets` (host calls: written; CUDA calls: fake, never read).
void add_inter(Call& c, const Spec& s, int64_t S, const std::vector<int64_t>& offsets, DType dtype = DType::F32,
               DType offsets_dtype = DType::I64) {
  const bool v_first = c.args.state_layout == StateLayout::VFirst;
  c.args.intermediate_states = v_first ? c.make(dtype, {S, s.HV, s.V, s.K}, true) : c.make(dtype, {S, s.HV, s.K, s.V}, true);
  c.args.intermediate_offsets = c.make(offsets_dtype, {static_cast<int64_t>(offsets.size())});
  c.args.intermediate_every = 64;
  if (s.device == DeviceType::CUDA) return;
  for (size_t i = 0; i < offsets.size(); ++i) {
    if (offsets_dtype == DType::I32)
      static_cast<int32_t*>(c.args.intermediate_offsets.data)[i] = static_cast<int32_t>(offsets[i]);
    else
      static_cast<int64_t*>(c.args.intermediate_offsets.data)[i] = offsets[i];
  }
}

Spec spec_for(Target target) { return target == Target::Sm90 ? sm90_spec() : Spec{}; }

TEST(ValidateIntermediate, AcceptedOnBothTargetsAndLayouts) {
  for (Target target : {Target::CpuReference, Target::Sm90})
    for (StateLayout layout : {StateLayout::VFirst, StateLayout::KFirst})
      for (DType dtype : {DType::BF16, DType::F32})
        for (DType od : {DType::I32, DType::I64}) {
          const Spec s = spec_for(target);
          Call c(s);
          c.args.state_layout = layout;  // K = V: the call's [N, HV, V, K] states read as k-first too
          add_inter(c, s, 3, {0, 1, 3}, dtype, od);
          EXPECT_NO_THROW(flash_kda::validate(c.args, target)) << int(target) << " " << int(layout);
          c.args.intermediate_include_initial = false;
          c.args.intermediate_every = 16;
          EXPECT_NO_THROW(flash_kda::validate(c.args, target));
        }
}

TEST(ValidateIntermediate, StatesAndOffsetsGoTogether) {
  for (Target target : {Target::CpuReference, Target::Sm90}) {
    const Spec s = spec_for(target);
    Call c(s);
    add_inter(c, s, 2, {0, 1, 2});
    const TensorView states = c.args.intermediate_states;
    c.args.intermediate_states = TensorView{};
    expect_invalid(c.args, target, "intermediate_offsets", {"without intermediate_states"});
    c.args.intermediate_states = states;
    c.args.intermediate_offsets = TensorView{};
    expect_invalid(c.args, target, "intermediate_offsets", {"is required with intermediate_states", "[N + 1]"});
  }
}

TEST(ValidateIntermediate, EveryIsAPositiveMultipleOf16) {
  for (Target target : {Target::CpuReference, Target::Sm90})
    for (int64_t every : {0, -16, 8, 24, 65}) {
      const Spec s = spec_for(target);
      Call c(s);
      add_inter(c, s, 2, {0, 1, 2});
      c.args.intermediate_every = every;
      expect_invalid(c.args, target, "intermediate_every", {"positive multiple of 16", std::to_string(every)});
    }
  const Spec s = sm90_spec();
  Call c(s);
  add_inter(c, s, 2, {0, 1, 2});
  c.args.intermediate_every = int64_t{16} << 31;
  expect_invalid(c.args, Target::Sm90, "intermediate_every", {"< 2^35"});
}

TEST(ValidateIntermediate, ShapesAndDtypes) {
  for (Target target : {Target::CpuReference, Target::Sm90}) {
    const Spec s = spec_for(target);
    {
      Call c(s);
      add_inter(c, s, 2, {0, 1, 2});
      c.args.intermediate_states = c.make(DType::F32, {2, s.HV + 1, s.V, s.K});
      expect_invalid(c.args, target, "intermediate_states", {"[S, HV, V, K]", "v-first"});
      c.args.intermediate_states = c.make(DType::F32, {2, s.HV, s.V});
      expect_invalid(c.args, target, "intermediate_states", {"rank 4"});
    }
    {
      Call c(s);
      add_inter(c, s, 2, {0, 1});  // N + 1 = 3 entries expected
      expect_invalid(c.args, target, "intermediate_offsets", {"[N + 1]", "[3]"});
    }
    {
      Call c(s);
      add_inter(c, s, 2, {0, 1, 2}, DType::F32, DType::F32);
      expect_invalid(c.args, target, "intermediate_offsets", {"expected dtype int32 or int64"});
    }
    {
      Call c(s);
      add_inter(c, s, 2, {0, 1, 2}, DType::I32);
      expect_invalid(c.args, target, "intermediate_states", {"expected dtype"});
    }
  }
  const Spec s = sm90_spec();
  Call c(s);
  add_inter(c, s, 2, {0, 1, 2}, DType::F64);
  expect_invalid(c.args, Target::Sm90, "intermediate_states", {"bf16 or fp32", "the Sm90 kernels keep"});
  Call r{Spec{}};
  add_inter(r, Spec{}, 2, {0, 1, 2}, DType::F64);
  EXPECT_NO_THROW(flash_kda::validate(r.args, Target::CpuReference));
}

TEST(ValidateIntermediate, HostOffsetValuesChecked) {
  const Spec s;
  struct Bad {
    std::vector<int64_t> offsets;
    const char* what;
  };
  const Bad bad[] = {{{0, 2, 1}, "entry [2] = 1 is below the entry before it (2)"},
                     {{-1, 0, 1}, "entry [0] = -1 is below"},
                     {{0, 1, 4}, "entry [2] = 4 is past S = intermediate_states.shape[0] = 3"}};
  for (const Bad& b : bad) {
    Call c(s);
    add_inter(c, s, 3, b.offsets);
    expect_invalid(c.args, Target::CpuReference, "intermediate_offsets", {b.what});
  }
  Call c(s);
  add_inter(c, s, 3, {1, 1, 3});  // offsets[0] > 0 and an empty range are fine
  EXPECT_NO_THROW(flash_kda::validate(c.args, Target::CpuReference));
}

TEST(ValidateIntermediate, Sm90OffsetsNeedElementAlignmentOnly) {
  const Spec s = sm90_spec();
  Call c(s);
  add_inter(c, s, 2, {0, 1, 2}, DType::F32, DType::I32);
  c.args.intermediate_offsets.data = static_cast<char*>(c.args.intermediate_offsets.data) + 4;
  EXPECT_NO_THROW(flash_kda::validate(c.args, Target::Sm90));
  c.args.intermediate_offsets.data = static_cast<char*>(c.args.intermediate_offsets.data) + 1;
  expect_invalid(c.args, Target::Sm90, "intermediate_offsets", {"element aligned"});
  c.args.intermediate_offsets.data = static_cast<char*>(c.args.intermediate_offsets.data) - 5;
  c.args.intermediate_states.data = static_cast<char*>(c.args.intermediate_states.data) + 8;
  expect_invalid(c.args, Target::Sm90, "intermediate_states", {"16-byte"});
}

TEST(ValidateIntermediate, MustNotOverlapOtherTensors) {
  const Spec s;
  for (const char* other : {"out", "final_state", "initial_state", "q"}) {
    Call c(s);
    add_inter(c, s, 4, {0, 1, 1});  // 2 MiB: larger than any other tensor of the call
    const std::string o = other;
    TensorView& t = o == "out" ? c.args.out : o == "final_state" ? c.args.final_state
                    : o == "initial_state" ? c.args.initial_state : c.args.q;
    t.data = c.args.intermediate_states.data;  // t lies inside intermediate_states
    expect_invalid(c.args, Target::CpuReference, "intermediate_states", {"overlaps", other});
  }
}

TEST(ValidateIntermediate, NotContiguousRejected) {
  const Spec s;
  Call c(s);
  add_inter(c, s, 2, {0, 1, 2});
  c.args.intermediate_states.strides[0] *= 2;
  expect_invalid(c.args, Target::CpuReference, "intermediate_states", {"contiguous"});
}

}  // namespace
}  // namespace kda_test
