// A rejected call writes nothing: out and final_state keep their poison, inputs are unchanged.
#include <functional>

#include "test_validate_helpers.h"

namespace kda_test {
namespace {

struct BadCase {
  const char* what;
  std::function<void(Call&)> spoil;
};

bool all_poison(const TensorView& t) {
  const auto* p = static_cast<const unsigned char*>(t.data);
  const int64_t n = t.numel() * flash_kda::dtype_size(t.dtype);
  for (int64_t i = 0; i < n; ++i)
    if (p[i] != 0xA5) return false;
  return n > 0;
}

TEST(ValidateNoWrite, ReferenceForwardLeavesBuffersUntouched) {
  const std::vector<BadCase> cases = {
      {"lower_bound", [](Call& c) { c.args.lower_bound = 0.5; }},
      {"k shape", [](Call& c) { c.args.k = c.make(DType::F32, {1, 12, 2, 8}); }},
      {"cu_seqlens last", [](Call& c) { c.set_cu({0, 3, 5, 7}); }},
      {"state dtype", [](Call& c) { c.args.final_state.dtype = DType::F16; }},
      {"out aliases v", [](Call& c) { c.args.out.data = c.args.v.data; }},
      {"scale", [](Call& c) { c.args.scale = -1.0; }},
  };
  for (const BadCase& bad : cases) {
    Spec s;
    s.K = 16;
    s.V = 8;
    s.H = 2;
    s.HV = 4;
    s.in = DType::F32;
    s.out = DType::F32;
    s.cu = {0, 3, 5, 12};
    Call c(s);
    ASSERT_NO_THROW(flash_kda::validate(c.args, Target::CpuReference)) << bad.what;
    const TensorView out0 = c.args.out, final0 = c.args.final_state;  // the poisoned buffers
    bad.spoil(c);
    const auto before = c.snapshot();
    EXPECT_THROW(flash_kda::reference_forward(c.args, 1), flash_kda::Error) << bad.what;
    EXPECT_TRUE(before == c.snapshot()) << bad.what << ": a rejected call wrote to a buffer";
    // The poison itself must still be there, even where the spoiled call points out elsewhere.
    EXPECT_TRUE(all_poison(out0)) << bad.what;
    EXPECT_TRUE(all_poison(final0)) << bad.what;
  }
}

}  // namespace
}  // namespace kda_test
