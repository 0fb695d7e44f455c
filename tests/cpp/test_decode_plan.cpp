// The decode kernel's launch plan (src/sm90/decode/plan.h), host code: grid, block and shared
// memory for small and large batches, fixed length and varlen.
#include <gtest/gtest.h>

#if FLASH_KDA_WITH_CUDA
#include "sm90/decode/plan.h"

namespace {

flash_kda::ProblemShape shape(int64_t n, int64_t hv, int64_t t, bool varlen) {
  flash_kda::ProblemShape p;
  p.batch = varlen ? 1 : n;
  p.seqlen = t;
  p.num_seqs = n;
  p.heads = hv;
  p.value_heads = hv;
  p.head_dim_k = p.head_dim_v = 128;
  p.varlen = varlen;
  return p;
}

flash_kda::sm90::DeviceProps h200() {
  flash_kda::sm90::DeviceProps d;
  d.major = 9;
  d.num_sms = 132;
  return d;
}

TEST(DecodePlan, SmallBatchesTakeTwoWarpBlocks) {
  const auto plan = flash_kda::sm90::make_decode_plan(shape(1, 32, 1, false), h200());
  EXPECT_EQ(plan.warps, 2);
  EXPECT_EQ(plan.slices, 8);
  EXPECT_EQ(plan.launch.block, 64u);
  EXPECT_EQ(plan.launch.grid_x, 32u * 8u);
}

TEST(DecodePlan, LargeBatchesTakeFourWarpBlocks) {
  const auto plan = flash_kda::sm90::make_decode_plan(shape(1024, 96, 4, false), h200());
  EXPECT_EQ(plan.warps, 4);
  EXPECT_EQ(plan.slices, 4);
  EXPECT_EQ(plan.launch.grid_x, 1024u * 96u * 4u);
  EXPECT_EQ(plan.token_group, 4);
  EXPECT_LE(plan.launch.smem_bytes, 48 * 1024);
}

TEST(DecodePlan, TokenGroups) {
  EXPECT_EQ(flash_kda::sm90::make_decode_plan(shape(8, 8, 16, false), h200()).token_group, 16);
  EXPECT_EQ(flash_kda::sm90::make_decode_plan(shape(8, 8, 0, false), h200()).token_group, 1);
  EXPECT_EQ(flash_kda::sm90::make_decode_plan(shape(8, 8, 300, true), h200()).token_group,
            flash_kda::sm90::kDecodeVarlenGroup);
  // The most shared memory any call takes stays under the 48 KB default (no attribute needed).
  EXPECT_LE(flash_kda::sm90::make_decode_plan(shape(1, 1, 16, false), h200()).launch.smem_bytes, 48 * 1024);
}

}  // namespace
#endif  // FLASH_KDA_WITH_CUDA
