// forward_workspace_size(): what a caller must allocate. Needs no GPU: validation and the size
// query read no device memory, so the calls use fake CUDA addresses (test_validate_helpers.h).
#include <gtest/gtest.h>

#include "test_validate_helpers.h"

#if FLASH_KDA_WITH_CUDA
#include <cuda_runtime.h>

namespace {

using kda_test::Call;
using kda_test::Spec;

Spec cuda_spec(int64_t B, int64_t T, int64_t H) {
  Spec s;
  s.B = B;
  s.T = T;
  s.H = s.HV = H;
  s.device = flash_kda::DeviceType::CUDA;
  return s;
}

TEST(Workspace, AlignedAndGrowsWithTheProblem) {
  Call small(cuda_spec(1, 1024, 4)), large(cuda_spec(1, 8192, 96));
  const size_t a = flash_kda::forward_workspace_size(small.args);
  const size_t b = flash_kda::forward_workspace_size(large.args);
  EXPECT_GT(a, 0u);
  EXPECT_EQ(a % 256, 0u);
  EXPECT_EQ(b % 256, 0u);
  EXPECT_GT(b, a);
}

// Very long inputs are processed in windows: the workspace stays bounded (a few GiB) instead of
// growing with T (1M tokens x 96 heads would otherwise need ~130 GiB of chunk records).
TEST(Workspace, BoundedForMillionTokens) {
  Call huge(cuda_spec(1, int64_t(1) << 20, 96));
  const size_t bytes = flash_kda::forward_workspace_size(huge.args);
  EXPECT_LE(bytes, size_t(3) << 30);
  EXPECT_GT(bytes, size_t(1) << 30);  // a window still holds many chunks: launches stay few
}

TEST(Workspace, TooSmallWorkspaceIsANamedError) {
  Call c(cuda_spec(1, 64, 4));
  const size_t need = flash_kda::forward_workspace_size(c.args);
  try {
    flash_kda::forward(c.args, reinterpret_cast<void*>(uintptr_t(1) << 40), need - 256, nullptr);
    FAIL() << "expected flash_kda::Error";
  } catch (const flash_kda::Error& e) {
    EXPECT_EQ(e.argument(), "workspace");
    EXPECT_NE(std::string(e.what()).find(std::to_string(need)), std::string::npos) << e.what();
  }
}

// LaunchOptions out of range: a named error before any device call (the pointers here are fake).
TEST(Workspace, BadLaunchOptionsAreNamedErrors) {
  Call c(cuda_spec(1, 64, 4));
  auto expect = [&](flash_kda::LaunchOptions o, const std::string& field) {
    for (int entry = 0; entry < 4; ++entry) {
      try {
        if (entry == 0) flash_kda::forward_workspace_size(c.args, o);
        if (entry == 1) flash_kda::forward(c.args, reinterpret_cast<void*>(uintptr_t(1) << 40), size_t(1) << 30, nullptr, o);
        if (entry == 2) flash_kda::forward(c.args, [](size_t) -> void* { return nullptr; }, nullptr, o);
        if (entry == 3) flash_kda::validate_forward(c.args, o);
        ADD_FAILURE() << "expected flash_kda::Error for " << field << " (entry point " << entry << ")";
      } catch (const flash_kda::Error& e) {
        EXPECT_EQ(e.argument(), field);
      }
    }
  };
  flash_kda::LaunchOptions o;
  o.num_sms = -1;
  expect(o, "launch_options.num_sms");
  o = {};
  o.window_slots = -1;
  expect(o, "launch_options.window_slots");
  o = {};
  o.segments = -3;
  expect(o, "launch_options.segments");
  o = {};
  o.recurrence_warps = 6;
  expect(o, "launch_options.recurrence_warps");
}

// validate_forward: forward()'s checks without the device: the sizes validate() derives for a
// good call, the argument errors of validate(args, Sm90) for a bad one (the pointers are fake).
TEST(Workspace, ValidateForwardChecksWhatForwardChecks) {
  Call c(cuda_spec(2, 64, 4));
  const flash_kda::ProblemShape p = flash_kda::validate_forward(c.args);
  const flash_kda::ProblemShape v = flash_kda::validate(c.args, flash_kda::Target::Sm90);
  EXPECT_EQ(p.batch, 2);
  EXPECT_EQ(p.seqlen, 64);
  EXPECT_EQ(p.value_heads, v.value_heads);
  EXPECT_EQ(p.scale, v.scale);
  c.args.lower_bound = -6.0;
  try {
    flash_kda::validate_forward(c.args);
    FAIL() << "expected flash_kda::Error";
  } catch (const flash_kda::Error& e) {
    EXPECT_EQ(e.argument(), "lower_bound");
  }
}

// LaunchOptions::num_sms above the SMs of the stream's context: a named error raised with the
// device's properties, before the allocator is called or any kernel launched (so the fake
// tensor addresses are never touched). Needs a visible sm_90 device.
TEST(Workspace, MoreSmsThanTheDeviceIsANamedError) {
  int n = 0, major = 0, sms = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    GTEST_SKIP() << "no CUDA device visible";
  }
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  if (major != 9) GTEST_SKIP() << "device 0 is not sm_90 (Hopper)";
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  Call c(cuda_spec(1, 64, 4));
  flash_kda::LaunchOptions o;
  o.num_sms = sms + 1;
  bool allocated = false;
  try {
    flash_kda::forward(c.args, [&](size_t) -> void* { allocated = true; return nullptr; }, nullptr, o);
    FAIL() << "expected flash_kda::Error";
  } catch (const flash_kda::Error& e) {
    EXPECT_EQ(e.argument(), "launch_options.num_sms");
  }
  EXPECT_FALSE(allocated);
}

// The size depends on the shape and the forced options, never on options.num_sms: callers size
// the workspace before they pick a device or a partition of one.
TEST(Workspace, IndependentOfTheSmCount) {
  Call c(cuda_spec(1, 8192, 16));
  const size_t base = flash_kda::forward_workspace_size(c.args);
  for (int sms : {1, 78, 114, 132, 1000}) {
    flash_kda::LaunchOptions o;
    o.num_sms = sms;
    EXPECT_EQ(flash_kda::forward_workspace_size(c.args, o), base) << sms;
  }
}

}  // namespace
#endif  // FLASH_KDA_WITH_CUDA
