// The decode kernel's launch plan (src/sm90/decode/plan.h), host code: grid, block and shared
// memory for small and large batches, fixed length and varlen, both pool dtypes and layouts.
#include <gtest/gtest.h>

#include <tuple>
#include <utility>

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

TEST(DecodePlan, OnlyTheDirectKernelIsAProgrammaticDependent) {
  // Both direct forms wait for the kernel before them as their first step
  // (griddepcontrol.wait); the persistent kernel does not, so a dependent launch of it could
  // read inputs still being written.
  for (StateLayout layout : {StateLayout::VFirst, StateLayout::KFirst})
    for (int bytes : {4, 2})
      for (const auto& s : {shape(1, 32, 1, false), shape(1024, 96, 2, false), shape(7, 8, 3, true)}) {
        EXPECT_TRUE(make_decode_plan(s, h200(), bytes, layout, DecodeKernel::Direct).launch.dependent);
        EXPECT_TRUE(make_decode_plan(s, h200(), bytes, layout, DecodeKernel::Auto).launch.dependent);
        EXPECT_TRUE(make_decode_plan(s, h200(), bytes, layout, DecodeKernel::DirectColumns).launch.dependent);
        EXPECT_TRUE(make_decode_plan(s, h200(), bytes, layout, DecodeKernel::DirectRows).launch.dependent);
        EXPECT_FALSE(make_decode_plan(s, h200(), bytes, layout, DecodeKernel::Persistent).launch.dependent);
      }
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

TEST(DecodePlan, AutoTakesTheDirectKernelAndForcedKernelsAreKept) {
  for (StateLayout layout : {StateLayout::VFirst, StateLayout::KFirst})
    for (int bytes : {2, 4}) {
      auto kernel = [&](int64_t n, int64_t hv, int64_t t, bool varlen, DecodeKernel k = DecodeKernel::Auto) {
        return make_decode_plan(shape(n, hv, t, varlen), h200(), bytes, layout, k).kernel;
      };
      for (int64_t n : {1, 64, 1024})
        for (int64_t t : {1, 2, 16}) EXPECT_EQ(kernel(n, 96, t, false), DecodeKernel::Direct) << n << " " << t;
      EXPECT_EQ(kernel(1024, 96, 300, true), DecodeKernel::Direct);  // varlen
      EXPECT_EQ(kernel(1024, 96, 1, false, DecodeKernel::Direct), DecodeKernel::Direct);
      EXPECT_EQ(kernel(1024, 96, 1, false, DecodeKernel::DirectColumns), DecodeKernel::Direct);  // a form of it
      EXPECT_EQ(kernel(1024, 96, 2, false, DecodeKernel::DirectRows), DecodeKernel::Direct);     // another
      EXPECT_EQ(kernel(1, 32, 1, false, DecodeKernel::Persistent), DecodeKernel::Persistent);
      EXPECT_EQ(kernel(1024, 96, 1, false, DecodeKernel::Persistent), DecodeKernel::Persistent);
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
  // 8 rows a warp, 16 1-warp items a head: 33 heads (528 = 4 x 132 of them), 2-warp blocks;
  // 66 heads (8 x 132), 4-warp blocks.
  const auto two = make_decode_plan(shape(1, 33, 1, false), h200(), 4, StateLayout::VFirst, DecodeKernel::Direct);
  EXPECT_EQ(two.warps, 2);
  EXPECT_EQ(two.slices, 8);
  const auto four = make_decode_plan(shape(2, 33, 1, false), h200(), 4, StateLayout::VFirst, DecodeKernel::Direct);
  EXPECT_EQ(four.warps, 4);
  EXPECT_EQ(four.slices, 4);
  // A bf16 pool's 8-row tiles split as fp32's; its wide tiles (16 rows, 8 items a head) start
  // where their 1-warp items reach 8 x 132, so they always fill 4-warp blocks.
  EXPECT_EQ(make_decode_plan(shape(1, 33, 1, false), h200(), 2, StateLayout::VFirst, DecodeKernel::Direct).warps, 2);
  const auto wide4 = make_decode_plan(shape(4, 33, 1, false), h200(), 2, StateLayout::VFirst, DecodeKernel::Direct);
  EXPECT_TRUE(wide4.wide);
  EXPECT_EQ(wide4.warps, 4);
  // Large batches: one block per item (no persistent loop); the one-token fp32 form's registers
  // are built for 6 blocks of 128 threads a SM, the multi-token forms' for 4.
  const auto big = make_decode_plan(shape(256, 32, 1, false), h200(), 4, StateLayout::VFirst, DecodeKernel::Direct);
  EXPECT_EQ(big.items, 256 * 32 * 4);
  EXPECT_EQ(big.launch.grid_x, uint32_t(256 * 32 * 4));
  EXPECT_EQ(big.blocks_per_sm, 6);
  EXPECT_EQ(make_decode_plan(shape(256, 32, 2, false), h200(), 4, StateLayout::VFirst, DecodeKernel::Direct).blocks_per_sm,
            flash_kda::sm90::kDirectMinBlocks);
  EXPECT_TRUE(big.one_token);
  EXPECT_EQ(big.warp_tile, 8);
  // A bf16 pool takes wide tiles (16 rows a warp) from 8 of them a SM (N * HV * 8 >= 8 * 132:
  // 132 heads), else 8 rows. One token a sequence: the packed form, 2 items a head at 4 warps.
  const auto packed = make_decode_plan(shape(256, 32, 1, false), h200(), 2, StateLayout::VFirst, DecodeKernel::Direct);
  EXPECT_TRUE(packed.wide);
  EXPECT_EQ(packed.warp_tile, 16);
  EXPECT_EQ(packed.warps, 4);
  EXPECT_EQ(packed.block_cols, 64);
  EXPECT_EQ(packed.slices, 2);
  EXPECT_EQ(packed.launch.smem_bytes, 0);
  // 1 x 32 heads: 8 rows a warp, as fp32 (512 one-warp blocks).
  const auto narrow_one = make_decode_plan(shape(1, 32, 1, false), h200(), 2, StateLayout::VFirst, DecodeKernel::Direct);
  EXPECT_FALSE(narrow_one.wide);
  EXPECT_EQ(narrow_one.warps, 1);
  EXPECT_EQ(narrow_one.slices, 16);
  EXPECT_EQ(narrow_one.launch.grid_x, 512u);
  // More tokens, or varlen: the split form (half of the rows in 4 KB of shared memory a warp).
  for (auto [t, varlen] : {std::pair<int64_t, bool>{1, false}, {2, false}, {1, true}}) {
    const bool one = t == 1 && !varlen;
    const auto general = make_decode_plan(shape(256, 32, t, varlen), h200(), 2, StateLayout::VFirst, DecodeKernel::Direct);
    EXPECT_EQ(general.one_token, one);
    EXPECT_TRUE(general.wide);
    EXPECT_EQ(general.warp_tile, 16);
    EXPECT_EQ(general.slices, 2);
    EXPECT_EQ(general.launch.smem_bytes, one ? 0 : 4 * 4096);
    for (int64_t heads : {131, 132}) {
      const auto edge = make_decode_plan(shape(1, heads, t, varlen), h200(), 2, StateLayout::VFirst, DecodeKernel::Direct);
      EXPECT_EQ(edge.wide, heads == 132);
      EXPECT_EQ(edge.warp_tile, heads == 132 ? 16 : 8);
      EXPECT_EQ(edge.launch.smem_bytes, heads == 132 && !one ? edge.warps * 4096 : 0);
    }
    // fp32 pools: always 8 rows.
    EXPECT_FALSE(make_decode_plan(shape(256, 32, t, varlen), h200(), 4, StateLayout::VFirst, DecodeKernel::Direct).wide);
  }
  // Each v-first warp runs all of its tokens alone: the token count does not change the split.
  for (int64_t t : {2, 3, 16})
    EXPECT_EQ(make_decode_plan(shape(1, 32, t, false), h200(), 4, StateLayout::VFirst, DecodeKernel::Direct).warps, 1);
  EXPECT_EQ(make_decode_plan(shape(1, 32, 5, true), h200(), 4, StateLayout::VFirst, DecodeKernel::Direct).warps, 1);
  // k-first's warp-column form splits as v-first: its warps own value columns as v-first's own
  // rows.
  for (int bytes : {2, 4})
    for (int64_t n : {1, 9, 256}) {
      const auto k = make_decode_plan(shape(n, 32, 1, false), h200(), bytes, StateLayout::KFirst, DecodeKernel::DirectColumns);
      const auto v = make_decode_plan(shape(n, 32, 1, false), h200(), bytes, StateLayout::VFirst, DecodeKernel::Direct);
      EXPECT_EQ(k.warps, v.warps);
      EXPECT_EQ(k.warp_tile, v.warp_tile);
      EXPECT_EQ(k.launch.grid_x, v.launch.grid_x);
    }
}

TEST(DecodePlan, KFirstBf16PoolsOfMoreTokensTakeTheSplitRowsFromHalfAGrid) {
  // Auto and Direct: a k-first bf16 pool with more than one token (or varlen) takes the row
  // blocks' split form once its 2 blocks a head fill half the SMs (4 N HV >= SMs), the warp
  // columns below; the split plan is DirectRows' plan.
  for (DecodeKernel kernel : {DecodeKernel::Auto, DecodeKernel::Direct})
    for (auto [t, varlen] : {std::pair<int64_t, bool>{2, false}, {4, false}, {1, true}}) {
      for (auto [n, hv, sms, rows] : {std::tuple<int64_t, int64_t, int, bool>{4, 8, 132, false}, {1, 32, 132, false},
                                      {33, 1, 132, true}, {1, 96, 132, true}, {8, 8, 132, true},
                                      {1, 1, 8, false}, {1, 2, 8, true}}) {
        flash_kda::sm90::DeviceProps d = h200();
        d.num_sms = sms;
        const auto plan = make_decode_plan(shape(n, hv, t, varlen), d, 2, StateLayout::KFirst, kernel);
        EXPECT_EQ(plan.kfirst_rows, rows) << n << " x " << hv << " heads on " << sms << " SMs, T = " << t;
        EXPECT_EQ(plan.kernel, DecodeKernel::Direct);
        const auto forced = make_decode_plan(shape(n, hv, t, varlen), d, 2, StateLayout::KFirst,
                                             rows ? DecodeKernel::DirectRows : DecodeKernel::DirectColumns);
        EXPECT_EQ(plan.kfirst_rows, forced.kfirst_rows);
        EXPECT_EQ(plan.block_cols, forced.block_cols);
        EXPECT_EQ(plan.warps, forced.warps);
        EXPECT_EQ(plan.launch.smem_bytes, forced.launch.smem_bytes);
        EXPECT_EQ(plan.launch.grid_x, forced.launch.grid_x);
      }
    }
}

TEST(DecodePlan, DirectKFirstTakesRowBlocks) {
  // Auto and Direct: k-first fp32 pools and one-token bf16 ones in row blocks of one 128-byte
  // line of columns (32 fp32, 64 bf16), 4 key warps; a bf16 pool with more than one token over
  // few heads (here 8) in the warp-column form (kfirst_rows_serves).
  for (DecodeKernel kernel : {DecodeKernel::Auto, DecodeKernel::Direct}) {
    const auto f32 = make_decode_plan(shape(64, 32, 2, false), h200(), 4, StateLayout::KFirst, kernel);
    EXPECT_EQ(f32.kernel, DecodeKernel::Direct);
    EXPECT_TRUE(f32.kfirst_rows);
    EXPECT_FALSE(f32.wide);
    EXPECT_EQ(f32.warps, 4);
    EXPECT_EQ(f32.block_cols, 32);
    EXPECT_EQ(f32.warp_tile, 32);
    EXPECT_EQ(f32.slices, 4);
    EXPECT_EQ(f32.items, 64 * 32 * 4);
    EXPECT_EQ(f32.launch.grid_x, uint32_t(64 * 32 * 4));
    EXPECT_EQ(f32.launch.block, 128u);
    EXPECT_EQ(f32.launch.smem_bytes, 2 * 4 * (32 * 8 + 16));
    EXPECT_EQ(f32.blocks_per_sm, 4);
    const auto packed = make_decode_plan(shape(64, 32, 1, false), h200(), 2, StateLayout::KFirst, kernel);
    EXPECT_TRUE(packed.kfirst_rows);
    EXPECT_TRUE(packed.one_token);
    EXPECT_EQ(packed.warps, 4);
    EXPECT_EQ(packed.block_cols, 64);
    EXPECT_EQ(packed.slices, 2);
    EXPECT_EQ(packed.launch.smem_bytes, 2 * 4 * (64 * 8 + 16));
    for (auto [t, varlen] : {std::pair<int64_t, bool>{2, false}, {16, false}, {1, true}}) {
      const auto bf16 = make_decode_plan(shape(1, 8, t, varlen), h200(), 2, StateLayout::KFirst, kernel);
      EXPECT_FALSE(bf16.kfirst_rows);
      const auto columns = make_decode_plan(shape(1, 8, t, varlen), h200(), 2, StateLayout::KFirst, DecodeKernel::DirectColumns);
      EXPECT_EQ(bf16.warps, columns.warps);
      EXPECT_EQ(bf16.warp_tile, columns.warp_tile);
      EXPECT_EQ(bf16.wide, columns.wide);
      EXPECT_EQ(bf16.launch.smem_bytes, columns.launch.smem_bytes);
    }
  }
  // DirectRows: every k-first pool in row blocks, a bf16 pool with more tokens in the split
  // form (its exchange buffers and 128 bytes a lane of fp32 state: 16 KB more), the others as
  // Direct plans them.
  for (auto [t, varlen] : {std::pair<int64_t, bool>{2, false}, {3, false}, {16, false}, {1, true}, {0, false}}) {
    const auto split = make_decode_plan(shape(1, 8, t, varlen), h200(), 2, StateLayout::KFirst, DecodeKernel::DirectRows);
    EXPECT_EQ(split.kernel, DecodeKernel::Direct);
    EXPECT_TRUE(split.kfirst_rows);
    EXPECT_FALSE(split.one_token);
    EXPECT_FALSE(split.wide);
    EXPECT_EQ(split.warps, 4);
    EXPECT_EQ(split.block_cols, 64);
    EXPECT_EQ(split.slices, 2);
    EXPECT_EQ(split.items, 8 * 2);
    EXPECT_EQ(split.launch.block, 128u);
    EXPECT_EQ(split.launch.smem_bytes, 2 * 4 * (64 * 8 + 16) + 128 * 128);
    EXPECT_EQ(split.blocks_per_sm, 4);
  }
  for (int bytes : {2, 4})
    for (int64_t t : {1, 2}) {
      if (bytes == 2 && t == 2) continue;  // the split form above
      const auto r = make_decode_plan(shape(64, 32, t, false), h200(), bytes, StateLayout::KFirst, DecodeKernel::DirectRows);
      const auto d = make_decode_plan(shape(64, 32, t, false), h200(), bytes, StateLayout::KFirst, DecodeKernel::Direct);
      EXPECT_TRUE(r.kfirst_rows);
      EXPECT_EQ(r.block_cols, d.block_cols);
      EXPECT_EQ(r.launch.smem_bytes, d.launch.smem_bytes);
    }
  // The persistent kernel and v-first pools never take it; DirectColumns and DirectRows on
  // v-first are Direct.
  EXPECT_FALSE(make_decode_plan(shape(64, 32, 1, false), h200(), 4, StateLayout::KFirst, DecodeKernel::Persistent).kfirst_rows);
  EXPECT_FALSE(make_decode_plan(shape(64, 32, 1, false), h200(), 4, StateLayout::KFirst, DecodeKernel::DirectColumns).kfirst_rows);
  for (int bytes : {2, 4})
    for (DecodeKernel kernel : {DecodeKernel::DirectColumns, DecodeKernel::DirectRows}) {
      const auto d = make_decode_plan(shape(9, 32, 2, false), h200(), bytes, StateLayout::VFirst, DecodeKernel::Direct);
      const auto c = make_decode_plan(shape(9, 32, 2, false), h200(), bytes, StateLayout::VFirst, kernel);
      EXPECT_FALSE(d.kfirst_rows);
      EXPECT_EQ(c.kernel, d.kernel);
      EXPECT_EQ(c.kfirst_rows, d.kfirst_rows);
      EXPECT_EQ(c.warps, d.warps);
      EXPECT_EQ(c.warp_tile, d.warp_tile);
      EXPECT_EQ(c.wide, d.wide);
      EXPECT_EQ(c.launch.grid_x, d.launch.grid_x);
      EXPECT_EQ(c.launch.smem_bytes, d.launch.smem_bytes);
    }
}

TEST(DecodePlan, DirectItemsTileEveryHeadExactly) {
  // What the direct kernels rely on, over shapes, dtypes, layouts, token counts and forms: a
  // block's columns are its warps' rows, the slices of a head cover its 128 value rows or
  // columns once, and the rows (columns) a warp match direct_warp_tile; shared memory only in
  // the split form (wide, more than one token). The k-first row blocks: a form of
  // kKFirstRowsKeyWarps warps over kfirst_rows_cols columns, its exchange buffers in shared
  // memory, for fp32 pools and one-token bf16 ones; bf16 with more tokens in the split form (its
  // fp32 half of the state in shared memory too) from 33 sequence-heads on 132 SMs or under
  // DirectRows, else the warp columns.
  for (StateLayout layout : {StateLayout::VFirst, StateLayout::KFirst})
    for (DecodeKernel kernel : {DecodeKernel::Direct, DecodeKernel::DirectColumns, DecodeKernel::DirectRows})
      for (int bytes : {2, 4})
        for (int64_t n : {1, 3, 9, 64, 1024})
          for (int64_t hv : {1, 8, 33, 96})
            for (auto [t, varlen] : {std::pair<int64_t, bool>{0, false}, {1, false}, {2, false}, {16, false}, {1, true}}) {
              const auto plan = make_decode_plan(shape(n, hv, t, varlen), h200(), bytes, layout, kernel);
              SCOPED_TRACE(testing::Message() << int(layout) << " " << int(kernel) << " " << bytes << " " << n << "x" << hv
                                              << " T " << t << (varlen ? " varlen" : ""));
              EXPECT_EQ(plan.kernel, DecodeKernel::Direct);
              EXPECT_EQ(plan.one_token, !varlen && t == 1);
              const bool rows = layout == StateLayout::KFirst && kernel != DecodeKernel::DirectColumns &&
                                (bytes == 4 || plan.one_token || kernel == DecodeKernel::DirectRows ||
                                 4 * n * hv >= 132);
              EXPECT_EQ(plan.kfirst_rows, rows);
              if (rows) {
                EXPECT_FALSE(plan.wide);
                EXPECT_EQ(plan.warps, flash_kda::sm90::kKFirstRowsKeyWarps);
                EXPECT_EQ(plan.block_cols, flash_kda::sm90::kfirst_rows_cols(bytes));
                EXPECT_EQ(plan.warp_tile, plan.block_cols);
                EXPECT_EQ(plan.launch.smem_bytes,
                          flash_kda::sm90::kfirst_rows_smem_bytes(plan.warps, plan.block_cols, bytes == 2 && !plan.one_token));
                EXPECT_LE(plan.launch.smem_bytes, 48 * 1024);  // no attribute to set
                EXPECT_EQ(plan.launch.smem_attr, 0);
                EXPECT_EQ(plan.slices * plan.block_cols, 128);
                EXPECT_EQ(plan.items, n * hv * plan.slices);
                EXPECT_EQ(plan.launch.block, uint32_t(plan.warps * 32));
                EXPECT_EQ(plan.blocks_per_sm * plan.warps,
                          4 * flash_kda::sm90::direct_min_blocks(plan.one_token, bytes, StateLayout::KFirst, true));
                EXPECT_GE(plan.launch.grid_x, 1u);
                continue;
              }
              EXPECT_EQ(plan.wide, bytes == 2 && n * hv * 8 >= 8 * 132);
              if (plan.wide) EXPECT_EQ(plan.warps, 4);
              EXPECT_EQ(plan.warp_tile, flash_kda::sm90::direct_warp_tile(bytes, plan.wide));
              EXPECT_EQ(plan.block_cols, plan.warps * plan.warp_tile);
              EXPECT_EQ(plan.launch.smem_bytes, plan.wide && !plan.one_token ? plan.warps * 4096 : 0);
              EXPECT_LE(plan.launch.smem_bytes, 48 * 1024);  // no attribute to set
              EXPECT_EQ(plan.launch.smem_attr, 0);
              EXPECT_EQ(plan.slices * plan.block_cols, 128);
              EXPECT_EQ(plan.items, n * hv * plan.slices);
              EXPECT_EQ(plan.launch.block, uint32_t(plan.warps * 32));
              EXPECT_GE(plan.launch.grid_x, 1u);
            }
}

TEST(DecodePlan, DirectTokenGroup) {
  for (StateLayout layout : {StateLayout::VFirst, StateLayout::KFirst})
    for (int64_t t : {1, 2, 16})
      EXPECT_EQ(make_decode_plan(shape(512, 32, t, false), h200(), 4, layout, DecodeKernel::Direct).token_group, int(t));
  EXPECT_EQ(make_decode_plan(shape(8, 8, 300, true), h200(), 4, StateLayout::VFirst, DecodeKernel::Direct).token_group,
            flash_kda::sm90::kDecodeVarlenGroup);
}

}  // namespace
#endif  // FLASH_KDA_WITH_CUDA
