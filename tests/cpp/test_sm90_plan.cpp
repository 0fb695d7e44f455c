// The sm_90a launch plan (src/sm90/forward/plan.h) on the host: windows, segments, pipelining,
// block widths, grids and shared-memory reservations for the benchmark's shapes at 132, 114 and
// 78 SMs (H100/H200 SXM, H100 PCIe, H20), the forced options, and the workspace capacity against
// every plan for every SM count 1..132. No GPU needed.
#if defined(FLASH_KDA_WITH_CUDA)
#include <algorithm>

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sm90/backward/layout.h"
#include "sm90/common/record.h"
#include "sm90/forward/kernel_shapes.h"
#include "sm90/forward/params.h"
#include "sm90/forward/plan.h"

namespace {

using flash_kda::LaunchOptions;
using flash_kda::ProblemShape;
using flash_kda::sm90::kRecordBytes;
using flash_kda::sm90::kStateBytes;
using flash_kda::sm90::Plan;
using flash_kda::sm90::WorkspaceLayout;

ProblemShape shape(int64_t batch, int64_t T, int64_t heads, int64_t num_seqs = -1, int64_t value_heads = -1) {
  ProblemShape p;
  p.batch = batch;
  p.seqlen = T;
  p.num_seqs = num_seqs < 0 ? batch : num_seqs;
  p.varlen = num_seqs >= 0;
  p.heads = heads;
  p.value_heads = value_heads < 0 ? heads : value_heads;
  p.head_dim_k = p.head_dim_v = 128;
  p.scale = 0.088;
  return p;
}

Plan plan_for(const ProblemShape& p, int sms = 132, LaunchOptions o = {}) {
  return flash_kda::sm90::make_plan({p, flash_kda::sm90::sm90_device(sms), o}, flash_kda::sm90::workspace_layout(p, o));
}
LaunchOptions with_segments(int s) { LaunchOptions o; o.segments = s; return o; }
LaunchOptions with_windows(int64_t w) { LaunchOptions o; o.window_slots = w; return o; }
std::string name(const ProblemShape& p) {
  return std::to_string(p.num_seqs) + " seqs x " + std::to_string(p.seqlen) + " x " + std::to_string(p.value_heads);
}

TEST(Sm90Plan, FewHeadsLongSequencesTakeSegments) {
  const Plan h4 = plan_for(shape(1, 65536, 4));
  EXPECT_EQ(h4.num_windows, 1);
  EXPECT_EQ(h4.max_segs, 16);  // 132 SMs / 4 (sequence, head) pairs = 33, capped at 16
  EXPECT_EQ(h4.seg_len, 256);  // 4096 chunks / 16
  EXPECT_EQ(h4.bytes.seg_maps, size_t(2) * 15 * 4 * kStateBytes);
  EXPECT_EQ(h4.bytes.seg_states, size_t(16) * 4 * kStateBytes);
  const Plan h8 = plan_for(shape(1, 32768, 8));
  EXPECT_EQ(h8.max_segs, 16);
  EXPECT_EQ(h8.seg_len, 128);
  const Plan h16 = plan_for(shape(1, 8192, 16));
  EXPECT_EQ(h16.max_segs, 8);
  EXPECT_EQ(h16.seg_len, 64);
  // Fixed length: every sequence has ceil(T / 16) chunks (4081 tokens: 256), not
  // ceil(B * T / 16) / B (511 / 2 = 255, which would fall below 8 segments of 32).
  const Plan b2 = plan_for(shape(2, 4081, 4));
  EXPECT_EQ(b2.max_segs, 8);
  EXPECT_EQ(b2.seg_len, 32);
}

TEST(Sm90Plan, WideOrShortProblemsDoNot) {
  for (const ProblemShape& p : {shape(1, 8192, 32), shape(1, 8192, 96), shape(1, 1024, 4), shape(1, 512, 96),
                                shape(16, 2048, 32), shape(1, 8192, 96, 6)}) {
    const Plan plan = plan_for(p);
    EXPECT_EQ(plan.seg_len, 0) << name(p);
    EXPECT_EQ(plan.bytes.seg_maps + plan.bytes.seg_states, 0u);
  }
  // Varlen: 16 sequences of 512 tokens with one head are short on average, whatever T_total.
  EXPECT_EQ(plan_for(shape(1, 16 * 512, 1, 16)).seg_len, 0);
}

// The backward's recompute (fp32 states every 16 tokens, store-bound per SM) takes segments
// from 4 per sequence where the forward alone takes them from 8 (backward/layout.h).
TEST(Sm90Plan, TheBackwardsRecomputeTakesSegmentsFromFour) {
  using flash_kda::sm90::bwd::recompute_options;
  const ProblemShape h32 = shape(1, 8192, 32);
  EXPECT_EQ(recompute_options(h32).segments, 4);  // 132 / 32 pairs
  EXPECT_EQ(plan_for(h32, 132, recompute_options(h32)).max_segs, 4);
  EXPECT_EQ(recompute_options(shape(1, 1024, 4)).segments, 8);      // 64 chunks / 8
  EXPECT_EQ(recompute_options(shape(1, 65536, 4)).segments, 16);    // capped
  EXPECT_EQ(recompute_options(shape(1, 8192, 16)).segments, 8);     // the forward's own choice
  EXPECT_EQ(recompute_options(shape(2, 8192, 16)).segments, 4);     // 32 pairs, each 512 chunks
  EXPECT_EQ(recompute_options(shape(1, 8192, 32, 1)).segments, 4);  // varlen, one sequence
  // Varlen with several sequences: the plan cuts each by T_total, so none are forced.
  EXPECT_EQ(recompute_options(shape(1, 8192, 8, 4)).segments, 0);
  for (const ProblemShape& p : {shape(1, 8192, 64), shape(1, 8192, 96), shape(1, 512, 96), shape(16, 2048, 32),
                                shape(1, 8192, 32, 6), shape(1, 100, 4), shape(2, 0, 2)}) {
    EXPECT_EQ(recompute_options(p).segments, 0) << name(p);  // fewer than 4: the plan decides
    EXPECT_EQ(plan_for(p, 132, recompute_options(p)).seg_len, 0) << name(p);
  }
}

TEST(Sm90Plan, TheBackwardsChainTakesSegmentsWhereItsBlocksLeaveSMsIdle) {
  using flash_kda::sm90::bwd::backward_layout;
  using flash_kda::sm90::bwd::chain_segments;
  // blocks = pairs x 4 slices; S = min(264 / blocks, chunks / 32, 16) when >= 8.
  EXPECT_EQ(chain_segments(shape(1, 65536, 4)).seg_len, 256);   // 16 segments of 256 chunks
  EXPECT_EQ(chain_segments(shape(1, 65536, 4)).max_segs, 16);
  EXPECT_EQ(chain_segments(shape(1, 32768, 8)).max_segs, 8);    // 264 / 32 blocks
  EXPECT_EQ(chain_segments(shape(1, 8192, 1, 1)).max_segs, 16); // varlen, one sequence
  EXPECT_EQ(chain_segments(shape(1, 300 * 16, 1)).seg_len, 34);  // 300 chunks / 9: eight of 34, one of 28
  EXPECT_EQ(chain_segments(shape(1, 300 * 16, 1)).max_segs, 9);
  EXPECT_EQ(chain_segments(shape(1, 4095, 2)).max_segs, 8);     // 256 chunks / 32
  for (const ProblemShape& p : {shape(1, 8192, 16), shape(1, 8192, 32), shape(1, 8192, 96), shape(1, 1024, 4),
                                shape(1, 4080, 2), shape(16, 2048, 32), shape(1, 65536, 4, 2), shape(2, 0, 2)}) {
    EXPECT_EQ(chain_segments(p).seg_len, 0) << name(p);
    EXPECT_EQ(backward_layout(p, 0).chain_maps, 0u) << name(p);  // no buffers without segments
  }
  // With segments, the maps and the segments' ends get their buffers.
  const ProblemShape h4 = shape(1, 65536, 4);
  const auto l = backward_layout(h4, 0);
  EXPECT_GE(l.chain_ends - l.chain_maps, size_t(15) * 4 * 2 * kStateBytes);
  EXPECT_GE(l.total - l.chain_ends, size_t(16) * 4 * kStateBytes);
}

TEST(Sm90Plan, VarlenSegmentsBoundTheLongestSequence) {
  // 2 sequences (30000 + 2000 tokens) x 4 heads: T_total bounds every sequence's chunks.
  const Plan plan = plan_for(shape(1, 32000, 4, 2));
  ASSERT_GT(plan.seg_len, 0);
  EXPECT_GE(plan.seg_len * plan.max_segs, (32000 + 15) / 16);
}

TEST(Sm90Plan, ForcedSegmentsAreCappedAndOneTurnsThemOff) {
  const Plan capped = plan_for(shape(1, 100, 2), 132, with_segments(1000000));  // 7 chunks
  EXPECT_EQ(capped.seg_len, 1);
  EXPECT_EQ(capped.max_segs, 7);
  EXPECT_EQ(plan_for(shape(1, 65536, 4), 132, with_segments(1)).seg_len, 0);
  const Plan three = plan_for(shape(2, 1000, 2), 132, with_segments(3));  // 63 chunks per sequence
  EXPECT_EQ(three.seg_len, 21);
  EXPECT_EQ(three.max_segs, 3);
  EXPECT_EQ(plan_for(shape(2, 0, 2), 132, with_segments(3)).seg_len, 0);  // nothing to cut
}

TEST(Sm90Plan, SegmentsNeedOneWindow) {
  LaunchOptions o;
  o.window_slots = 3;
  o.segments = 4;
  const Plan plan = plan_for(shape(1, 1000, 2), 132, o);
  EXPECT_GT(plan.num_windows, 1);
  EXPECT_EQ(plan.seg_len, 0);
  EXPECT_GT(plan.bytes.carry, 0u);
}

TEST(Sm90Plan, WindowsCoverEverySlot) {
  for (int64_t forced : {1, 3, 7, 64}) {
    const ProblemShape p = shape(1, 5000, 3, 7);
    const Plan plan = plan_for(p, 132, with_windows(forced));
    EXPECT_EQ(plan.total_slots, 7 + (5000 + 15) / 16);
    EXPECT_EQ(plan.window_slots, forced);
    EXPECT_GE(plan.window_slots * plan.num_windows, plan.total_slots);
    EXPECT_LT(plan.window_slots * (plan.num_windows - 1), plan.total_slots);
    EXPECT_EQ(plan.window_end(plan.num_windows - 1), plan.total_slots);
    // Several windows: two record buffers, stage 1 of one window filling one while the
    // state pass of the window before reads the other.
    const size_t buffers = plan.num_windows > 1 ? 2 : 1;
    EXPECT_EQ(plan.bytes.records, buffers * size_t(forced) * 3 * kRecordBytes);
    EXPECT_EQ(plan.bytes.done, plan.num_windows > 1 ? size_t(plan.num_windows) * 4 : 0u);
    // Stage 1: one block per slot of each window; windows after the first are the programmatic
    // dependents of the pass before.
    int64_t blocks = 0;
    for (int64_t w = 0; w < plan.num_windows; ++w) {
      const auto k = plan.prepare_launch(w);
      blocks += k.grid_x;
      EXPECT_EQ(k.grid_y, 3u);
      EXPECT_EQ(k.dependent, w > 0);
    }
    EXPECT_EQ(blocks, plan.total_slots);
  }
}

TEST(Sm90Plan, LongChainsThatLeaveSMsIdleArePipelined) {
  // 256+ chunks a chain and a state pass that leaves 32+ of 132 SMs idle (96 blocks of two
  // warpgroups, 64 of one): three windows, so that stage 1 of each runs beside the pass of the
  // one before.
  for (const ProblemShape& p : {shape(1, 8192, 96), shape(1, 8192, 32), shape(1, 4096, 100)}) {
    const Plan plan = plan_for(p);
    const int64_t slots = 1 + p.seqlen / 16;
    EXPECT_EQ(plan.num_windows, 3) << p.value_heads;
    EXPECT_EQ(plan.window_slots, (slots + 2) / 3);
    EXPECT_EQ(plan.bytes.records, 2 * size_t(plan.window_slots) * size_t(p.value_heads) * kRecordBytes);
    EXPECT_GT(plan.bytes.carry, 0u);
    EXPECT_EQ(plan.bytes.done, 3 * sizeof(uint32_t));
    EXPECT_EQ(plan.seg_len, 0);
    // A pipelined window keeps its SMs: the exclusive reservation.
    EXPECT_EQ(plan.window_pass.smem_bytes, 200 * 1024);
    EXPECT_TRUE(plan.window_pass.dependent);
    EXPECT_EQ(plan.window_pass_warps, plan.window_pass.blocks() * unsigned(plan.window_warps));
  }
  // Short chains, chains that take segments, more chains than SMs, and grids that leave too few
  // SMs idle (64 pairs: 128 single-warpgroup blocks; 101 pairs: 101 blocks) keep one window.
  for (const ProblemShape& p : {shape(1, 512, 96), shape(1, 1024, 4), shape(16, 2048, 32), shape(1, 8192, 96, 6),
                                shape(1, 8192, 96, 8), shape(1, 65536, 4), shape(1, 8192, 16), shape(1, 8192, 64),
                                shape(1, 8192, 101), shape(1, 4000, 96)}) {
    const Plan plan = plan_for(p);
    EXPECT_EQ(plan.num_windows, 1) << name(p);
    EXPECT_EQ(plan.bytes.carry + plan.bytes.done, 0u);
  }
}

TEST(Sm90Plan, BlockWidthAndReservations) {
  // 32 pairs on 132 SMs: 64 single-warpgroup blocks (with the producer warp: 160 threads).
  const Plan h32 = plan_for(shape(1, 1024, 32));
  EXPECT_EQ(h32.window_warps, 4);
  EXPECT_EQ(h32.window_pass.grid_x, 1u);
  EXPECT_EQ(h32.window_pass.grid_y, 32u);
  EXPECT_EQ(h32.window_pass.grid_z, 2u);
  EXPECT_EQ(h32.window_pass.block, 160u);
  EXPECT_EQ(h32.window_pass.smem_bytes, 116 * 1024);  // one wave, not pipelined: one block per SM
  EXPECT_EQ(h32.window_pass.smem_attr, 200 * 1024);
  // 96 pairs: one block of two warpgroups each.
  const Plan h96 = plan_for(shape(1, 512, 96));
  EXPECT_EQ(h96.window_warps, 8);
  EXPECT_EQ(h96.window_pass.block, 256u);
  EXPECT_EQ(h96.window_pass.grid_z, 1u);
  // More blocks than SMs: only what the layout needs.
  const Plan wide = plan_for(shape(16, 2048, 32));
  EXPECT_GT(wide.window_pass.blocks(), 132u);
  EXPECT_EQ(wide.window_pass.smem_bytes, flash_kda::sm90::RecurrenceSmem<8>::kBytes);
  // Forced block width.
  LaunchOptions o;
  o.recurrence_warps = 8;
  EXPECT_EQ(plan_for(shape(1, 1024, 32), 132, o).window_warps, 8);
  // Segments: 8-warp blocks; maps twice the column blocks (P and Q), the first launch a
  // programmatic dependent of stage 1, the scan one block per 16 rows.
  const Plan seg = plan_for(shape(1, 65536, 4));
  ASSERT_TRUE(seg.segments());
  EXPECT_EQ(seg.segment_maps.grid_x, 16u);
  EXPECT_EQ(seg.segment_maps.grid_z, 2u);
  EXPECT_EQ(seg.segment_finish.grid_z, 1u);
  EXPECT_TRUE(seg.segment_maps.dependent);
  EXPECT_FALSE(seg.segment_finish.dependent);
  EXPECT_FALSE(seg.segment_scan.dependent);
  EXPECT_EQ(seg.segment_scan.grid_z, 8u);
  EXPECT_EQ(seg.segment_scan.block, 256u);
  // The backward's chain segments launch the same scan shape (segment_scan_launch).
  const flash_kda::sm90::KernelLaunch scan = flash_kda::sm90::segment_scan_launch(1, 4);
  EXPECT_EQ(scan.grid_x, seg.segment_scan.grid_x);
  EXPECT_EQ(scan.grid_y, seg.segment_scan.grid_y);
  EXPECT_EQ(scan.grid_z, seg.segment_scan.grid_z);
  EXPECT_EQ(scan.block, seg.segment_scan.block);
  EXPECT_EQ(scan.smem_bytes, seg.segment_scan.smem_bytes);
  EXPECT_EQ(scan.smem_attr, seg.segment_scan.smem_attr);
  EXPECT_EQ(scan.grid_y, 4u);
  EXPECT_EQ(seg.segment_finish.smem_bytes, 116 * 1024);  // 64 blocks: one wave
  EXPECT_EQ(seg.segment_maps.smem_bytes, 116 * 1024);    // 128 blocks: one wave on 132
  EXPECT_EQ(plan_for(shape(1, 65536, 4), 114).segment_maps.smem_bytes,
            flash_kda::sm90::RecurrenceSmem<8>::kBytes);  // 128 blocks on 114 SMs: two waves
  // Shared memory unlike every sm_90 part's: no reservations.
  flash_kda::sm90::DeviceProps odd = flash_kda::sm90::sm90_device(132);
  odd.smem_per_block_optin = 160 * 1024;
  const Plan small = flash_kda::sm90::make_plan({shape(1, 1024, 32), odd, {}}, flash_kda::sm90::workspace_layout(shape(1, 1024, 32), {}));
  EXPECT_EQ(small.window_pass.smem_bytes, flash_kda::sm90::RecurrenceSmem<4>::kBytes);
  EXPECT_EQ(small.window_pass.smem_attr, flash_kda::sm90::RecurrenceSmem<4>::kBytes);
}

// The staged store's geometry (inter_store.cuh): the consumer lanes write element (v, k) of the
// block's columns where InterStaging's layout puts it (v-first: row v - v_block, byte k * esize;
// k-first: row k, byte (v - v_block) * esize), and row r's bulk copy moves row_bytes from
// r * pitch to row_destination. Over every block of a head, each byte of the head's state must be
// written once, from the staging byte that holds that element, and no copy may read past its row
// or the buffer.
template <int NW>
void expect_staged_copies_cover_the_state_once() {
  using St = flash_kda::sm90::InterStaging<NW>;
  constexpr int kD = flash_kda::sm90::kHeadDim;
  for (const bool k_first : {false, true}) {
    for (const int esize : {2, 4}) {
      SCOPED_TRACE(testing::Message() << "NW " << NW << (k_first ? " k-first" : " v-first") << " esize " << esize);
      const int pitch = St::pitch(k_first, esize), bytes = St::row_bytes(k_first, esize);
      ASSERT_GE(pitch, bytes);
      ASSERT_EQ(bytes % 16, 0);
      ASSERT_LE(St::rows(k_first) * pitch, St::kBytes);
      // writer[b]: the staging byte (block * kBytes + offset) whose copy lands on byte b.
      std::vector<int64_t> writer(int64_t(kD) * kD * esize, -1);
      int twice = 0, outside = 0;
      for (int v_block = 0; v_block < kD; v_block += NW * 16) {
        for (int r = 0; r < St::rows(k_first); ++r) {
          const int64_t dst = St::row_destination(k_first, r, v_block) * esize;
          for (int b = 0; b < bytes; ++b) {
            if (dst + b < 0 || dst + b >= int64_t(writer.size())) { ++outside; continue; }
            if (writer[dst + b] >= 0) ++twice;
            writer[dst + b] = int64_t(v_block) * St::kBytes + int64_t(r) * pitch + b;
          }
        }
      }
      EXPECT_EQ(outside, 0);
      EXPECT_EQ(twice, 0);
      int wrong = 0;
      for (int v = 0; v < kD; ++v) {
        for (int k = 0; k < kD; ++k) {
          const int v_block = v / (NW * 16) * (NW * 16);
          const int64_t staged = k_first ? int64_t(k) * pitch + (v - v_block) * esize
                                         : int64_t(v - v_block) * pitch + int64_t(k) * esize;
          const int64_t dst = (k_first ? int64_t(k) * kD + v : int64_t(v) * kD + k) * esize;
          for (int b = 0; b < esize; ++b)
            if (writer[dst + b] != int64_t(v_block) * St::kBytes + staged + b) ++wrong;
        }
      }
      EXPECT_EQ(wrong, 0);
    }
  }
}

TEST(Sm90Plan, StagedStateCopiesWriteEachElementOnceFromItsStagedPlace) {
  expect_staged_copies_cover_the_state_once<4>();
  expect_staged_copies_cover_the_state_once<8>();
}

TEST(Sm90Plan, IntermediateStatesGrowOnlyTheStatePassesSharedMemory) {
  using flash_kda::sm90::InterStaging;
  using flash_kda::sm90::RecurrenceSmem;
  // The staging buffer holds a whole fp32 state of the block's columns in either layout, row
  // pitches padded by 16 bytes, after the ring's buffers.
  EXPECT_EQ(InterStaging<8>::kBytes, 128 * (128 * 4 + 16));
  EXPECT_EQ(InterStaging<4>::kBytes, 128 * (64 * 4 + 16));
  EXPECT_GE(InterStaging<8>::kOffset, RecurrenceSmem<8>::kBytes);
  EXPECT_EQ(InterStaging<8>::kOffset % 128, 0);
  for (const Plan& plan : {plan_for(shape(1, 1024, 32)), plan_for(shape(16, 2048, 32)), plan_for(shape(1, 512, 96))}) {
    const flash_kda::sm90::KernelLaunch k = flash_kda::sm90::inter_states_launch(plan.window_pass, plan.window_warps);
    const int need = plan.window_warps == 4 ? InterStaging<4>::kSmemBytes : InterStaging<8>::kSmemBytes;
    EXPECT_EQ(k.smem_bytes, std::max(plan.window_pass.smem_bytes, need));
    EXPECT_EQ(k.smem_attr, 200 * 1024);  // the reservation's attribute, the same on every call
    EXPECT_GE(k.smem_attr, k.smem_bytes);
    EXPECT_EQ(k.grid_x, plan.window_pass.grid_x);
    EXPECT_EQ(k.grid_y, plan.window_pass.grid_y);
    EXPECT_EQ(k.grid_z, plan.window_pass.grid_z);
    EXPECT_EQ(k.block, plan.window_pass.block);
    EXPECT_EQ(k.dependent, plan.window_pass.dependent);
  }
  const Plan seg = plan_for(shape(1, 65536, 4));
  ASSERT_TRUE(seg.segments());
  const flash_kda::sm90::KernelLaunch f = flash_kda::sm90::inter_states_launch(seg.segment_finish, 8);
  EXPECT_EQ(f.smem_bytes, InterStaging<8>::kSmemBytes);
  EXPECT_EQ(f.smem_attr, 200 * 1024);
  EXPECT_EQ(f.blocks(), seg.segment_finish.blocks());
}

// The same shapes on the H100 PCIe (114 SMs) and the H20 (78): the decisions follow the SM count.
TEST(Sm90Plan, DecisionsFollowTheSmCount) {
  // 16 heads x 8192: 132 / 16 = 8 segments; 114 / 16 = 7 and 78 / 16 = 4 are too few. Pipelined
  // windows would need a carry the workspace (sized for 132 SMs' segments) does not hold: one
  // window of single-warpgroup blocks.
  const ProblemShape h16 = shape(1, 8192, 16);
  EXPECT_TRUE(plan_for(h16, 132).segments());
  for (int sms : {114, 78}) {
    const Plan plan = plan_for(h16, sms);
    EXPECT_FALSE(plan.segments()) << sms;
    EXPECT_EQ(plan.num_windows, 1) << sms;
    EXPECT_EQ(plan.window_warps, 4) << sms;
  }
  // 4 heads x 65536: segments everywhere, fewer where there are fewer SMs.
  EXPECT_EQ(plan_for(shape(1, 65536, 4), 114).max_segs, 16);  // 114 / 4 = 28 -> 16
  EXPECT_EQ(plan_for(shape(1, 65536, 4), 78).max_segs, 16);   // 78 / 4 = 19 -> 16
  EXPECT_EQ(plan_for(shape(1, 65536, 8), 78).max_segs, 9);    // 78 / 8 = 9
  EXPECT_EQ(plan_for(shape(1, 65536, 8), 132).max_segs, 16);
  // 32 heads x 8192: 64 single-warpgroup blocks, pipelined on 132 and 114 SMs (68 / 50 left
  // idle); on 78 they leave 14 idle, but one window's records would outgrow the workspace of
  // 132 SMs' three windows: the three windows, on 78 SMs.
  EXPECT_EQ(plan_for(shape(1, 8192, 32), 132).num_windows, 3);
  EXPECT_EQ(plan_for(shape(1, 8192, 32), 114).num_windows, 3);
  EXPECT_EQ(plan_for(shape(1, 8192, 32), 78).num_windows, 3);
  EXPECT_EQ(plan_for(shape(1, 8192, 32), 78).window_warps, 4);
  // 96 heads x 8192: 8-warp blocks everywhere; 132 SMs pipeline (96 blocks leave 36 idle), and
  // the smaller parts keep those windows within the same workspace.
  EXPECT_EQ(plan_for(shape(1, 8192, 96), 132).num_windows, 3);
  EXPECT_EQ(plan_for(shape(1, 8192, 96), 114).num_windows, 3);
  EXPECT_EQ(plan_for(shape(1, 8192, 96), 78).num_windows, 3);
  // A shape 132 SMs run in one window, 78 SMs run in one window too.
  EXPECT_EQ(plan_for(shape(1, 8192, 64), 132).num_windows, 1);
  EXPECT_EQ(plan_for(shape(1, 8192, 64), 78).num_windows, 1);
  // Block width: 4 warps while twice the pairs fit the SMs.
  EXPECT_EQ(plan_for(shape(1, 1024, 48), 132).window_warps, 4);
  EXPECT_EQ(plan_for(shape(1, 1024, 48), 78).window_warps, 8);
  EXPECT_EQ(plan_for(shape(1, 1024, 39), 78).window_warps, 4);
  // One wave or not, by the planned SM count.
  EXPECT_EQ(plan_for(shape(1, 512, 96), 132).window_pass.smem_bytes, 116 * 1024);
  EXPECT_EQ(plan_for(shape(1, 512, 96), 78).window_pass.smem_bytes, flash_kda::sm90::RecurrenceSmem<8>::kBytes);
  // More SMs than any sm_90 part: planned as 132.
  EXPECT_EQ(plan_for(h16, 1000).num_sms, 132);
  EXPECT_TRUE(plan_for(h16, 1000).segments());
  // LaunchOptions::num_sms replaces the device's count.
  LaunchOptions o;
  o.num_sms = 78;
  EXPECT_EQ(plan_for(h16, 132, o).num_sms, 78);
  EXPECT_FALSE(plan_for(h16, 132, o).segments());
}

TEST(Sm90Plan, RecordBudgetHoldsForManyHeads) {
  // 1M tokens x 96 heads: windows keep the records near 2 GiB.
  const Plan plan = plan_for(shape(1, (int64_t(1) << 20) + 3, 96, 64));
  EXPECT_GT(plan.num_windows, 1);
  EXPECT_LE(plan.bytes.records, size_t(2) << 30);
}

// The workspace is sized from the shape alone: every plan for every SM count an sm_90 part can
// have (and beyond, clamped) fits it, across fixed / varlen, 1..128 heads, GVA, 0..1M tokens and
// the forced options.
TEST(Sm90Plan, WorkspaceCapacityCoversEverySmCount) {
  std::vector<ProblemShape> shapes;
  for (int64_t heads : {1, 2, 3, 4, 5, 8, 12, 16, 20, 24, 32, 40, 48, 50, 51, 64, 66, 96, 100, 101, 128})
    for (int64_t T : {int64_t(0), int64_t(1), int64_t(17), int64_t(512), int64_t(1024), int64_t(4081), int64_t(4096),
                      int64_t(8192), int64_t(32768), int64_t(65536), int64_t(1) << 20}) {
      shapes.push_back(shape(1, T, heads));
      if (T <= 65536) shapes.push_back(shape(2, T, heads));
      if (T >= 17) shapes.push_back(shape(1, T, heads, 7));                 // varlen, 7 sequences
      if (heads <= 32) shapes.push_back(shape(1, T, heads, -1, 4 * heads));  // GVA
    }
  std::vector<LaunchOptions> options(1);
  for (int w : {4, 8}) { LaunchOptions o; o.recurrence_warps = w; options.push_back(o); }
  options.push_back(with_segments(1));
  options.push_back(with_segments(5));
  options.push_back(with_windows(3));
  { LaunchOptions o; o.window_slots = 100000; o.segments = 16; options.push_back(o); }
  int64_t checked = 0;
  for (const ProblemShape& p : shapes)
    for (const LaunchOptions& o : options) {
      const WorkspaceLayout at = flash_kda::sm90::workspace_layout(p, o);
      EXPECT_EQ(at.total % 256, 0u);
      bool any_segments = false;
      for (int sms = 1; sms <= 140; ++sms) {
        const Plan plan = plan_for(p, sms, o);
        any_segments |= plan.segments();
        ASSERT_TRUE(plan.bytes.fits_in(at.cap))
            << name(p) << " on " << sms << " SMs (warps " << o.recurrence_warps << ", segments " << o.segments
            << ", windows " << o.window_slots << "): records " << plan.bytes.records << " / " << at.cap.records
            << ", carry " << plan.bytes.carry << " / " << at.cap.carry << ", maps " << plan.bytes.seg_maps << " / "
            << at.cap.seg_maps << ", states " << plan.bytes.seg_states << " / " << at.cap.seg_states << ", done "
            << plan.bytes.done << " / " << at.cap.done;
        ++checked;
      }
      // The capacity holds segment buffers only where some SM count takes segments.
      if (!any_segments) EXPECT_EQ(at.cap.seg_maps + at.cap.seg_states, 0u) << name(p);
    }
  EXPECT_GT(checked, 100000);
}

// The workspace is the 132-SM plan's buffers, byte for byte: a smaller part adds nothing to it.
TEST(Sm90Plan, WorkspaceIsTheLargestPartsPlan) {
  for (const ProblemShape& p : {shape(1, 8192, 16), shape(1, 8192, 32), shape(1, 8192, 96), shape(1, 65536, 4),
                                shape(1, 1024, 4), shape(8, 1024, 96)}) {
    const WorkspaceLayout at = flash_kda::sm90::workspace_layout(p, {});
    const Plan full = plan_for(p, 132);
    EXPECT_EQ(at.cap.records, full.bytes.records) << name(p);
    EXPECT_EQ(at.cap.carry, full.bytes.carry) << name(p);
    EXPECT_EQ(at.cap.done, full.bytes.done) << name(p);
    EXPECT_EQ(at.cap.seg_maps, full.bytes.seg_maps) << name(p);
    EXPECT_EQ(at.cap.seg_states, full.bytes.seg_states) << name(p);
    for (int sms : {78, 114}) EXPECT_TRUE(plan_for(p, sms).bytes.fits_in(at.cap)) << name(p) << sms;
  }
}

TEST(Sm90Plan, BadOptionsAreNamed) {
  auto expect = [](LaunchOptions o, const char* field) {
    try {
      flash_kda::sm90::validate_options(o);
      ADD_FAILURE() << "expected an Error for " << field;
    } catch (const flash_kda::Error& e) {
      EXPECT_EQ(e.argument(), field);
    }
  };
  LaunchOptions o;
  o.num_sms = -1;
  expect(o, "launch_options.num_sms");
  o = {};
  o.window_slots = -2;
  expect(o, "launch_options.window_slots");
  o = {};
  o.segments = -1;
  expect(o, "launch_options.segments");
  for (int w : {-4, 1, 2, 6, 16}) {
    o = {};
    o.recurrence_warps = w;
    expect(o, "launch_options.recurrence_warps");
  }
  o = {};
  o.num_sms = 133;
  EXPECT_NO_THROW(flash_kda::sm90::validate_options(o));  // checked against the device at launch
  try {
    flash_kda::sm90::validate_device_options(o, flash_kda::sm90::sm90_device(132));
    ADD_FAILURE() << "expected an Error";
  } catch (const flash_kda::Error& e) {
    EXPECT_EQ(e.argument(), "launch_options.num_sms");
  }
  o.num_sms = 78;
  EXPECT_NO_THROW(flash_kda::sm90::validate_device_options(o, flash_kda::sm90::sm90_device(132)));
}

}  // namespace
#endif  // FLASH_KDA_WITH_CUDA
