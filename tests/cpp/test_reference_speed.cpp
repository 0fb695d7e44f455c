// The reference must check a realistic long sequence in seconds: T = 8192, H = 4,
// K = V = 128, the FlashKDA configuration, bf16 in and out. The time is recorded as a test
// property (see --gtest_output=xml); the bound is loose because CI machines are shared.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "reference_test_util.h"

namespace {

using flash_kda::DType;
using flash_kda::testing::KdaConfig;
using flash_kda::testing::KdaProblem;
using flash_kda::testing::make_random_problem;

TEST(ReferenceSpeed, LongSequenceFlashKdaShapeRunsInSeconds) {
  KdaConfig cfg;
  cfg.batch = 1;
  cfg.seqlen = 8192;
  cfg.heads = 4;
  cfg.value_heads = 4;
  cfg.head_dim_k = 128;
  cfg.head_dim_v = 128;
  cfg.out_dtype = DType::BF16;
  cfg.seed = 21;
  KdaProblem p = make_random_problem(cfg);

  const auto t0 = std::chrono::steady_clock::now();
  flash_kda::reference_forward(p.args(), 0);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  char note[64];
  std::snprintf(note, sizeof note, "%.3f", seconds);
  RecordProperty("reference_seconds", note);
  std::printf("reference_forward T=8192 H=4 K=V=128: %.3f s\n", seconds);

  // Results must be finite and not all zero, and the time within a loose bound.
  double sum_sq = 0.0;
  for (double x : p.out.values()) {
    ASSERT_TRUE(std::isfinite(x));
    sum_sq += x * x;
  }
  for (double x : p.final_state.values()) ASSERT_TRUE(std::isfinite(x));
  EXPECT_GT(sum_sq, 0.0);
  EXPECT_LT(seconds, 60.0);
}

}  // namespace
