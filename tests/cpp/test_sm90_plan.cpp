// The sm_90a launch plan (src/sm90/plan.h) on the host: windows, segments and workspace parts
// for the benchmark's shapes and the edge cases, and the test knobs. No GPU needed.
#if defined(FLASH_KDA_WITH_CUDA)
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "sm90/params.h"
#include "sm90/plan.h"

namespace {

using flash_kda::ProblemShape;
using flash_kda::sm90::kStateBytes;
using flash_kda::sm90::make_plan;
using flash_kda::sm90::Plan;

ProblemShape shape(int64_t batch, int64_t T, int64_t heads, int64_t num_seqs = -1) {
  ProblemShape p;
  p.batch = batch;
  p.seqlen = T;
  p.num_seqs = num_seqs < 0 ? batch : num_seqs;
  p.varlen = num_seqs >= 0;
  p.heads = p.value_heads = heads;
  p.head_dim_k = p.head_dim_v = 128;
  p.scale = 0.088;
  return p;
}

// Each test starts without the knobs and leaves them as it found them (the GPU tests of the
// same executable read them).
struct Sm90Plan : ::testing::Test {
  static constexpr const char* kKnobs[] = {"FLASH_KDA_SM90_SEGMENTS", "FLASH_KDA_SM90_WINDOW_SLOTS"};
  std::string saved[2];
  bool was_set[2] = {false, false};
  void SetUp() override {
    for (int i = 0; i < 2; ++i) {
      if (const char* v = std::getenv(kKnobs[i])) { saved[i] = v; was_set[i] = true; }
      unsetenv(kKnobs[i]);
    }
  }
  void TearDown() override {
    for (int i = 0; i < 2; ++i) {
      if (was_set[i]) setenv(kKnobs[i], saved[i].c_str(), 1); else unsetenv(kKnobs[i]);
    }
  }
};

TEST_F(Sm90Plan, FewHeadsLongSequencesTakeSegments) {
  const Plan h4 = make_plan(shape(1, 65536, 4));
  EXPECT_EQ(h4.num_windows, 1);
  EXPECT_EQ(h4.max_segs, 16);  // 132 SMs / 4 (sequence, head) pairs = 33, capped at 16
  EXPECT_EQ(h4.seg_len, 256);  // 4096 chunks / 16
  EXPECT_EQ(h4.seg_maps_bytes, size_t(2) * 15 * 4 * kStateBytes);
  EXPECT_EQ(h4.seg_states_bytes, size_t(16) * 4 * kStateBytes);
  const Plan h8 = make_plan(shape(1, 32768, 8));
  EXPECT_EQ(h8.max_segs, 16);
  EXPECT_EQ(h8.seg_len, 128);
  const Plan h16 = make_plan(shape(1, 8192, 16));
  EXPECT_EQ(h16.max_segs, 8);
  EXPECT_EQ(h16.seg_len, 64);
  // Fixed length: every sequence has ceil(T / 16) chunks (4081 tokens: 256), not
  // ceil(B * T / 16) / B (511 / 2 = 255, which would fall below 8 segments of 32).
  const Plan b2 = make_plan(shape(2, 4081, 4));
  EXPECT_EQ(b2.max_segs, 8);
  EXPECT_EQ(b2.seg_len, 32);
}

TEST_F(Sm90Plan, WideOrShortProblemsDoNot) {
  for (const ProblemShape& p : {shape(1, 8192, 32), shape(1, 8192, 96), shape(1, 1024, 4), shape(1, 512, 96),
                                shape(16, 2048, 32), shape(1, 8192, 96, 6)}) {
    const Plan plan = make_plan(p);
    EXPECT_EQ(plan.seg_len, 0) << p.num_seqs << " x " << p.seqlen << " x " << p.value_heads;
    EXPECT_EQ(plan.seg_maps_bytes + plan.seg_states_bytes, 0u);
  }
  // Varlen: 16 sequences of 512 tokens with one head are short on average, whatever T_total.
  EXPECT_EQ(make_plan(shape(1, 16 * 512, 1, 16)).seg_len, 0);
}

TEST_F(Sm90Plan, VarlenSegmentsBoundTheLongestSequence) {
  // 2 sequences (30000 + 2000 tokens) x 4 heads: T_total bounds every sequence's chunks.
  const Plan plan = make_plan(shape(1, 32000, 4, 2));
  ASSERT_GT(plan.seg_len, 0);
  EXPECT_GE(plan.seg_len * plan.max_segs, (32000 + 15) / 16);
}

TEST_F(Sm90Plan, ForcedSegmentsAreCappedAndOneTurnsThemOff) {
  setenv("FLASH_KDA_SM90_SEGMENTS", "1000000", 1);
  const Plan capped = make_plan(shape(1, 100, 2));  // 7 chunks
  EXPECT_EQ(capped.seg_len, 1);
  EXPECT_EQ(capped.max_segs, 7);
  setenv("FLASH_KDA_SM90_SEGMENTS", "1", 1);
  EXPECT_EQ(make_plan(shape(1, 65536, 4)).seg_len, 0);
  setenv("FLASH_KDA_SM90_SEGMENTS", "3", 1);
  const Plan three = make_plan(shape(2, 1000, 2));  // 63 chunks per sequence
  EXPECT_EQ(three.seg_len, 21);
  EXPECT_EQ(three.max_segs, 3);
  EXPECT_EQ(make_plan(shape(2, 0, 2)).seg_len, 0);  // nothing to cut
}

TEST_F(Sm90Plan, SegmentsNeedOneWindow) {
  setenv("FLASH_KDA_SM90_WINDOW_SLOTS", "3", 1);
  setenv("FLASH_KDA_SM90_SEGMENTS", "4", 1);
  const Plan plan = make_plan(shape(1, 1000, 2));
  EXPECT_GT(plan.num_windows, 1);
  EXPECT_EQ(plan.seg_len, 0);
  EXPECT_GT(plan.carry_bytes, 0u);
}

TEST_F(Sm90Plan, WindowsCoverEverySlot) {
  for (int64_t forced : {1, 3, 7, 64}) {
    setenv("FLASH_KDA_SM90_WINDOW_SLOTS", std::to_string(forced).c_str(), 1);
    const ProblemShape p = shape(1, 5000, 3, 7);
    const Plan plan = make_plan(p);
    EXPECT_EQ(plan.total_slots, 7 + (5000 + 15) / 16);
    EXPECT_EQ(plan.window_slots, forced);
    EXPECT_GE(plan.window_slots * plan.num_windows, plan.total_slots);
    EXPECT_LT(plan.window_slots * (plan.num_windows - 1), plan.total_slots);
    // Several windows: two record buffers, stage 1 of one window filling one while the
    // recurrence of the window before reads the other.
    const size_t buffers = plan.num_windows > 1 ? 2 : 1;
    EXPECT_EQ(plan.records_bytes, buffers * size_t(forced) * 3 * flash_kda::sm90::kRecordBytes);
    EXPECT_EQ(plan.done_bytes, plan.num_windows > 1 ? size_t(plan.num_windows) * 4 : 0u);
  }
}

TEST_F(Sm90Plan, LongChainsThatLeaveSMsIdleArePipelined) {
  // 256+ chunks a chain and a recurrence grid that leaves 32+ of 132 SMs idle (96 blocks of two
  // warpgroups, 64 of one): three windows, so that stage 1 of each runs beside the recurrence of
  // the one before.
  for (const ProblemShape& p : {shape(1, 8192, 96), shape(1, 8192, 32), shape(1, 4096, 100)}) {
    const Plan plan = make_plan(p);
    const int64_t slots = 1 + p.seqlen / 16;
    EXPECT_EQ(plan.num_windows, 3) << p.value_heads;
    EXPECT_EQ(plan.window_slots, (slots + 2) / 3);
    EXPECT_EQ(plan.records_bytes, 2 * size_t(plan.window_slots) * size_t(p.value_heads) * flash_kda::sm90::kRecordBytes);
    EXPECT_GT(plan.carry_bytes, 0u);
    EXPECT_EQ(plan.done_bytes, 3 * sizeof(uint32_t));
    EXPECT_EQ(plan.seg_len, 0);
  }
  // Short chains, chains that take segments, more chains than SMs, and grids that leave too few
  // SMs idle (64 pairs: 128 single-warpgroup blocks; 101 pairs: 101 blocks) keep one window.
  for (const ProblemShape& p : {shape(1, 512, 96), shape(1, 1024, 4), shape(16, 2048, 32), shape(1, 8192, 96, 6),
                                shape(1, 8192, 96, 8), shape(1, 65536, 4), shape(1, 8192, 16), shape(1, 8192, 64),
                                shape(1, 8192, 101), shape(1, 4000, 96)}) {
    const Plan plan = make_plan(p);
    EXPECT_EQ(plan.num_windows, 1) << p.num_seqs << " x " << p.seqlen << " x " << p.value_heads;
    EXPECT_EQ(plan.carry_bytes + plan.done_bytes, 0u);
  }
}

TEST_F(Sm90Plan, RecordBudgetHoldsForManyHeads) {
  // 1M tokens x 96 heads: windows keep the records near 2 GiB.
  const Plan plan = make_plan(shape(1, (int64_t(1) << 20) + 3, 96, 64));
  EXPECT_GT(plan.num_windows, 1);
  EXPECT_LE(plan.records_bytes, size_t(2) << 30);
}

}  // namespace
#endif  // FLASH_KDA_WITH_CUDA
