// The decode kernel's launch plan (src/sm90/decode/plan.h), host code: grid, block and shared
// memory for small and large batches, fixed length and varlen, both pool dtypes and layouts.
#include <gtest/gtest.h>

#if FLASH_KDA_WITH_CUDA
#include "sm90/decode/plan.h"

namespace {

using flash_kda::StateLayout;
using flash_kda::DecodeKernel;
using flash_kda::sm90::make_decode_plan;

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

TEST(DecodePlan, SmallBatchesTakeTwoWarpBlocksOneItemEach) {
  const auto plan = make_decode_plan(shape(1, 32, 1, false), h200(), 4, StateLayout::VFirst, DecodeKernel::Persistent);
  EXPECT_EQ(plan.warps, 2);
  EXPECT_EQ(plan.slices, 8);
  EXPECT_EQ(plan.launch.block, 64u);
  EXPECT_EQ(plan.items, 32 * 8);
  EXPECT_EQ(plan.launch.grid_x, 32u * 8u);  // fewer items than resident blocks: one each
}

TEST(DecodePlan, LargeBatchesTakeAPersistentGrid) {
  // v-first: 3 blocks of 4 warps per SM (registers); k-first: 4.
  const auto v = make_decode_plan(shape(1024, 96, 4, false), h200(), 4, StateLayout::VFirst, DecodeKernel::Persistent);
  EXPECT_EQ(v.warps, 4);
  EXPECT_EQ(v.slices, 4);
  EXPECT_EQ(v.items, 1024 * 96 * 4);
  EXPECT_EQ(v.token_group, 4);
  EXPECT_EQ(v.blocks_per_sm, 3);
  EXPECT_EQ(v.launch.grid_x, 132u * 3u);
  const auto k = make_decode_plan(shape(1024, 96, 1, false), h200(), 2, StateLayout::KFirst, DecodeKernel::Persistent);
  EXPECT_EQ(k.blocks_per_sm, 4);
  EXPECT_EQ(k.launch.grid_x, 132u * 4u);
  // A grid never exceeds the items, and a restricted SM count shrinks it.
  flash_kda::sm90::DeviceProps small = h200();
  small.num_sms = 16;
  EXPECT_EQ(make_decode_plan(shape(1024, 96, 1, false), small, 4, StateLayout::VFirst, DecodeKernel::Persistent).launch.grid_x, 16u * 3u);
}

TEST(DecodePlan, SharedMemoryFitsTheResidentBlocks) {
  for (int bytes : {2, 4})
    for (StateLayout layout : {StateLayout::VFirst, StateLayout::KFirst})
      for (int64_t t : {1, 2, 4, 16}) {
        const auto plan = make_decode_plan(shape(512, 32, t, false), h200(), bytes, layout, DecodeKernel::Persistent);
        const int per_block = plan.launch.smem_bytes + flash_kda::sm90::kSm90SmemReservedPerBlock;
        EXPECT_LE(plan.blocks_per_sm * per_block, flash_kda::sm90::kSm90SmemPerSm) << bytes << " " << t;
        EXPECT_GE(plan.blocks_per_sm, 1);
        // The attribute is the kernel's largest request, the same on every call.
        EXPECT_GE(plan.launch.smem_attr, plan.launch.smem_bytes);
        EXPECT_EQ(plan.launch.smem_attr, flash_kda::sm90::decode_smem_bytes(4, 16, bytes));
        EXPECT_LE(plan.launch.smem_attr, 227 * 1024);
      }
  // The layout of the slots: bf16 pools keep two items in flight, fp32 one.
  EXPECT_EQ(flash_kda::sm90::decode_stages(2), 2);
  EXPECT_EQ(flash_kda::sm90::decode_stages(4), 1);
  EXPECT_EQ(flash_kda::sm90::decode_smem_bytes(4, 1, 4),
            flash_kda::sm90::decode_state_slot_bytes(4, 4) + 2 * flash_kda::sm90::decode_slot_bytes(4, 1));
  EXPECT_EQ(flash_kda::sm90::decode_state_slot_bytes(4, 4), 16 * 1024);
  EXPECT_EQ(flash_kda::sm90::decode_state_slot_bytes(4, 2), 8 * 1024);
  EXPECT_EQ(flash_kda::sm90::decode_slot_bytes(4, 1) % 16, 0);
}

TEST(DecodePlan, TokenGroups) {
  EXPECT_EQ(make_decode_plan(shape(8, 8, 16, false), h200(), 4, StateLayout::VFirst, DecodeKernel::Persistent).token_group, 16);
  EXPECT_EQ(make_decode_plan(shape(8, 8, 0, false), h200(), 4, StateLayout::VFirst, DecodeKernel::Persistent).token_group, 1);
  EXPECT_EQ(make_decode_plan(shape(8, 8, 300, true), h200(), 4, StateLayout::VFirst, DecodeKernel::Persistent).token_group,
            flash_kda::sm90::kDecodeVarlenGroup);
}

TEST(DecodePlan, AutoTakesThePersistentKernelForManyOneTokenSequencesAndForcedKernelsAreKept) {
  const int64_t edge = flash_kda::sm90::kDecodePersistentHeads;
  for (StateLayout layout : {StateLayout::VFirst, StateLayout::KFirst})
    for (int bytes : {2, 4}) {
      auto kernel = [&](int64_t n, int64_t hv, int64_t t, bool varlen, DecodeKernel k = DecodeKernel::Auto) {
        return make_decode_plan(shape(n, hv, t, varlen), h200(), bytes, layout, k).kernel;
      };
      EXPECT_EQ(kernel(1, 32, 1, false), DecodeKernel::Direct);
      EXPECT_EQ(kernel(edge / 32 - 1, 32, 1, false), DecodeKernel::Direct);
      EXPECT_EQ(kernel(edge / 32, 32, 1, false), DecodeKernel::Persistent);
      EXPECT_EQ(kernel(1024, 96, 1, false), DecodeKernel::Persistent);
      EXPECT_EQ(kernel(1024, 96, 2, false), DecodeKernel::Direct);  // T >= 2: direct
      EXPECT_EQ(kernel(1024, 96, 300, true), DecodeKernel::Direct);  // varlen: direct
      EXPECT_EQ(kernel(1024, 96, 1, false, DecodeKernel::Direct), DecodeKernel::Direct);
      EXPECT_EQ(kernel(1, 32, 1, false, DecodeKernel::Persistent), DecodeKernel::Persistent);
    }
}

TEST(DecodePlan, DirectSplitsVFirstHeadsSoThatTheGridCoversTheSms) {
  // 1 x 32 heads: 1-warp blocks of 8 value rows, 16 per head: 512 blocks.
  const auto one = make_decode_plan(shape(1, 32, 1, false), h200(), 4, StateLayout::VFirst, DecodeKernel::Direct);
  EXPECT_EQ(one.warps, 1);
  EXPECT_EQ(one.block_cols, 8);
  EXPECT_EQ(one.slices, 16);
  EXPECT_EQ(one.items, 32 * 16);
  EXPECT_EQ(one.launch.grid_x, 512u);
  EXPECT_EQ(one.launch.block, 32u);
  // 33 heads: 33 * 8 >= 264, 2-warp blocks; 66 heads: 4-warp blocks.
  const auto two = make_decode_plan(shape(1, 33, 1, false), h200(), 2, StateLayout::VFirst, DecodeKernel::Direct);
  EXPECT_EQ(two.warps, 2);
  EXPECT_EQ(two.slices, 8);
  const auto four = make_decode_plan(shape(2, 33, 1, false), h200(), 2, StateLayout::VFirst, DecodeKernel::Direct);
  EXPECT_EQ(four.warps, 4);
  EXPECT_EQ(four.slices, 4);
  // Large batches: one block per item (no persistent loop), 4 blocks of 128 threads a SM.
  const auto big = make_decode_plan(shape(256, 32, 1, false), h200(), 4, StateLayout::VFirst, DecodeKernel::Direct);
  EXPECT_EQ(big.items, 256 * 32 * 4);
  EXPECT_EQ(big.launch.grid_x, uint32_t(256 * 32 * 4));
  EXPECT_EQ(big.blocks_per_sm, flash_kda::sm90::kDirectMinBlocks);
  // Each warp stages one token at a time: T = 2 takes at least 2 warps, T >= 3 and varlen 4.
  EXPECT_EQ(make_decode_plan(shape(1, 32, 2, false), h200(), 4, StateLayout::VFirst, DecodeKernel::Direct).warps, 2);
  EXPECT_EQ(make_decode_plan(shape(1, 32, 3, false), h200(), 4, StateLayout::VFirst, DecodeKernel::Direct).warps, 4);
  EXPECT_EQ(make_decode_plan(shape(1, 32, 5, true), h200(), 4, StateLayout::VFirst, DecodeKernel::Direct).warps, 4);
  // k-first: always 4 warps x 32 columns.
  const auto k = make_decode_plan(shape(1, 32, 1, false), h200(), 4, StateLayout::KFirst, DecodeKernel::Direct);
  EXPECT_EQ(k.warps, 4);
  EXPECT_EQ(k.block_cols, 32);
  EXPECT_EQ(k.slices, 4);
  EXPECT_EQ(k.launch.grid_x, 128u);
}

TEST(DecodePlan, DirectSharedMemory) {
  for (StateLayout layout : {StateLayout::VFirst, StateLayout::KFirst})
    for (int64_t t : {1, 2, 16}) {
      const auto plan = make_decode_plan(shape(512, 32, t, false), h200(), 4, layout, DecodeKernel::Direct);
      EXPECT_EQ(plan.token_group, int(t));
      EXPECT_EQ(plan.launch.smem_bytes, flash_kda::sm90::direct_smem_bytes(32, int(t), layout == StateLayout::KFirst));
      EXPECT_EQ(plan.launch.smem_bytes % 16, 0);
      EXPECT_GE(plan.launch.smem_attr, plan.launch.smem_bytes);
      EXPECT_LE(plan.blocks_per_sm * (plan.launch.smem_bytes + flash_kda::sm90::kSm90SmemReservedPerBlock),
                flash_kda::sm90::kSm90SmemPerSm);
    }
  // T = 1, v-first, 4 warps: q, k, decay (1536 bytes), 32 v floats, b and k.q, one slot.
  EXPECT_EQ(flash_kda::sm90::direct_smem_bytes(32, 1, false), 1536 + 128 + 8 + 8);
  EXPECT_EQ(flash_kda::sm90::direct_smem_bytes(32, 1, true), 2048 + 1536 + 128 + 8 + 8);
  EXPECT_EQ(make_decode_plan(shape(8, 8, 300, true), h200(), 4, StateLayout::VFirst, DecodeKernel::Direct).token_group,
            flash_kda::sm90::kDecodeVarlenGroup);
}

}  // namespace
#endif  // FLASH_KDA_WITH_CUDA
