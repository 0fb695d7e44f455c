// Validation: contiguity, devices, alignment and aliasing between tensors.
#include "test_validate_helpers.h"

namespace kda_test {
namespace {

TEST(ValidateLayout, TransposedLastDimNamesStrides) {
  Call c{Spec{}};
  // q viewed as [B, T, H, K] over a [B, T, K, H] buffer: the last dimension is not unit-stride.
  c.args.q.strides[2] = 1;
  c.args.q.strides[3] = 4;
  expect_invalid(c.args, Target::CpuReference, "q", {"last dimension must have unit stride", "got strides [32768, 512, 1, 4]"});
}

TEST(ValidateLayout, PaddedRowsAccepted) {
  Call c(sm90_spec());  // v's rows in a buffer of 256-element rows: a strided view, 16-byte aligned rows
  c.args.v.strides[0] = 64 * 8 * 256;
  c.args.v.strides[1] = 8 * 256;
  c.args.v.strides[2] = 256;
  EXPECT_NO_THROW(flash_kda::validate(c.args, Target::Sm90));
}

TEST(ValidateLayout, SizeOneDimsMayHaveAnyStride) {
  Spec s;
  s.B = 1;
  Call c(s);
  c.args.q.strides[0] = 7;
  EXPECT_NO_THROW(flash_kda::validate(c.args, Target::CpuReference));
}

TEST(ValidateLayout, OptionalTensorsMustBeContiguousToo) {
  Call c{Spec{}};
  c.args.dt_bias.strides[0] = 1;
  c.args.dt_bias.strides[1] = 8;
  expect_invalid(c.args, Target::CpuReference, "dt_bias", {"must be contiguous", "got strides [1, 8]"});
}

TEST(ValidateLayout, ReferenceNeedsHostTensors) {
  Call c{Spec{}};
  c.args.k.device = DeviceType::CUDA;
  expect_invalid(c.args, Target::CpuReference, "k", {"is on cuda:0", "needs host tensors"});
  Call c2{Spec{}};
  c2.args.final_state.device = DeviceType::CUDA;
  c2.args.final_state.device_id = 3;
  expect_invalid(c2.args, Target::CpuReference, "final_state", {"is on cuda:3"});
}

TEST(ValidateLayout, Sm90NeedsCudaTensors) {
  Call c{Spec{}};  // every tensor on the host
  expect_invalid(c.args, Target::Sm90, "q", {"is on the host, a CUDA tensor is needed"});
  Call c2(sm90_spec());
  c2.args.A_log.device = DeviceType::CPU;
  expect_invalid(c2.args, Target::Sm90, "A_log", {"is on the host, a CUDA tensor is needed"});
}

TEST(ValidateLayout, Sm90NeedsOneDevice) {
  Call c(sm90_spec());
  c.args.k.device_id = 1;
  expect_invalid(c.args, Target::Sm90, "k", {"q is on cuda:0 but k on cuda:1", "one device"});
  Call c2(sm90_spec());
  c2.args.initial_state.device_id = 2;
  expect_invalid(c2.args, Target::Sm90, "initial_state", {"q is on cuda:0 but initial_state on cuda:2"});
}

TEST(ValidateLayout, Sm90NeedsAlignedData) {
  Call c(sm90_spec());
  c.args.g.data = static_cast<char*>(c.args.g.data) + 2;
  expect_invalid(c.args, Target::Sm90, "g", {"16-byte aligned"});
}

TEST(ValidateAlias, OutIsAnInput) {
  Call c{Spec{}};
  c.args.out.data = c.args.v.data;  // same shape and dtype as v
  expect_invalid(c.args, Target::CpuReference, "out", {"overlaps input v", "separate buffer"});
}

TEST(ValidateAlias, OutPartiallyOverlapsInput) {
  Call c{Spec{}};
  c.args.out.data = static_cast<char*>(c.args.q.data) + 1000;
  expect_invalid(c.args, Target::CpuReference, "out", {"overlaps input q"});
}

TEST(ValidateAlias, OutOverlapsSmallInputs) {
  Call c(sm90_spec());  // fake addresses: the overlap is arithmetic only
  c.args.out.data = static_cast<char*>(c.args.A_log.data) - 16;
  expect_invalid(c.args, Target::Sm90, "out", {"overlaps input A_log"});
  Spec s = sm90_spec();
  s.cu = {0, 10, 30};
  Call cv(s);
  cv.args.out.data = cv.args.cu_seqlens.data;
  expect_invalid(cv.args, Target::Sm90, "out", {"overlaps input cu_seqlens"});
}

TEST(ValidateAlias, OutOverlapsInitialState) {
  Call c(sm90_spec());
  c.args.out.data = c.args.initial_state.data;
  expect_invalid(c.args, Target::Sm90, "out", {"overlaps input initial_state"});
}

TEST(ValidateAlias, OutOverlapsFinalState) {
  Call c(sm90_spec());
  c.args.out.data = static_cast<char*>(c.args.final_state.data) + 256;
  expect_invalid(c.args, Target::Sm90, "out", {"overlaps final_state"});
}

TEST(ValidateAlias, InPlaceStateUpdateAllowed) {
  Call c{Spec{}};
  c.args.final_state = c.args.initial_state;
  EXPECT_NO_THROW(flash_kda::validate(c.args, Target::CpuReference));
  Call cg(sm90_spec());
  cg.args.final_state = cg.args.initial_state;
  EXPECT_NO_THROW(flash_kda::validate(cg.args, Target::Sm90));
}

TEST(ValidateAlias, FinalStatePartiallyOverlapsInitialState) {
  Call c(sm90_spec());
  c.args.final_state.data = static_cast<char*>(c.args.initial_state.data) + 256;
  expect_invalid(c.args, Target::Sm90, "final_state", {"overlaps initial_state partially", "exactly initial_state"});
}

TEST(ValidateAlias, FinalStateOverlapsInput) {
  Call c(sm90_spec());
  // Ends 256 bytes into q and starts before every other tensor, so q is its only overlap.
  const size_t bytes = static_cast<size_t>(c.args.final_state.numel()) * 4;
  c.args.final_state.data = static_cast<char*>(c.args.q.data) - bytes + 256;
  expect_invalid(c.args, Target::Sm90, "final_state", {"overlaps input q"});
}

TEST(ValidateAlias, InputsMayShareStorage) {
  Call c{Spec{}};
  c.args.k = c.args.q;  // reading one buffer twice is harmless
  EXPECT_NO_THROW(flash_kda::validate(c.args, Target::CpuReference));
}

}  // namespace
}  // namespace kda_test
