// The launch plan of the sm_90a forward (plan.h): windows over chunk slots and the segment
// split, from the problem's shape alone. Host code: unit-tested without a GPU
// (tests/cpp/test_sm90_plan.cpp).
#include "sm90/plan.h"

#include <algorithm>
#include <cstdlib>

#include "sm90/params.h"

namespace flash_kda::sm90 {
namespace {

// Chunk records take ~5x the bytes of q, so very long inputs are processed in windows of
// chunk slots with a bounded workspace; the state of the one sequence that crosses a window
// boundary is carried in fp32 (two buffers, alternating, so a window never reads the carry
// it is writing). With several windows the records are double-buffered (launch.cu: stage 1 of
// the next window runs beside the recurrence of this one), both buffers within the budget. A
// window of 16 slots still has 16 x HV blocks of stage 1, so the minimum only matters above
// HV = 3,000, where the budget yields to it.
constexpr size_t kRecordBudget = size_t(2) << 30;
constexpr int64_t kMinWindowSlots = 16;

// Pipelined windows for problems that fit in one: while the recurrence of window w runs on one
// block per (sequence, head, column block), stage 1 of window w + 1 takes the SMs it leaves idle
// instead of waiting for it. Worth it when each chain is long (per-window costs: a carried
// state, a pipeline fill) and the recurrence, in one wave, leaves at least kPipelineIdleSMs SMs
// idle: launch.cu gives a (sequence, head) pair two single-warpgroup blocks when twice the pairs
// fit the SMs, else one block of two warpgroups (recurrence_warps). Measured on the H200 (eager
// us): one window -> four (session 10): h32_fixed_8192 (64 blocks) 360-384 -> 298-306,
// h96_fixed_8192 (96) 729-746 -> 705-710, h64_fixed_8192 (128 blocks, 4 SMs idle) 486 -> 517-519:
// not taken; four -> three (session 11, two A/B pairs in one call): h96_fixed_8192 692-700 ->
// 682-683, h32_fixed_8192 303-305 -> 298-311 (level).
constexpr int64_t kPipelineMinChunks = 256;
constexpr int64_t kPipelineWindows = 3;
constexpr int64_t kPipelineIdleSMs = 32;

// Segment-parallel mode (RecurrenceParams): few (sequence, head) pairs with long sequences
// leave most SMs idle on one long chain. Cutting each sequence into S segments costs 3x the
// state-passing work (P and Q of each segment, then the segments again from their true start
// states) plus an S-step scan, but the chain shrinks from C chunks to ~2C/S + S scan steps.
// S is chosen so that (sequences x heads x S) blocks fill one wave of an H100/H200's 132 SMs,
// with segments of at least 32 chunks, at most 16 of them (the scan is S sequential steps: on
// the H200 h4_fixed_65536 took 0.927 ms with 16 segments, 0.952 with 33, 1.327 with 64), and
// only when that gives S >= 8. The plan depends on the shape alone (the workspace size must),
// hence the fixed SM count.
// FLASH_KDA_SM90_SEGMENTS=S (S >= 1) forces S segments per sequence (1: off); tests use it.
constexpr int64_t kWaveSMs = 132;
constexpr int64_t kMinSegChunks = 32;
constexpr int64_t kMinSegments = 8;
constexpr int64_t kMaxSegments = 16;

// A knob's value when the variable is set to a positive integer, else 0 (unset: the plan decides).
int64_t positive_env(const char* name) {
  const char* env = std::getenv(name);
  const long long v = env ? std::atoll(env) : 0;
  return v > 0 ? v : 0;
}

}  // namespace

Plan make_plan(const ProblemShape& p) {
  Plan plan;
  plan.total_slots = p.num_seqs + (p.batch * p.seqlen + kChunk - 1) / kChunk;
  const int64_t per_slot = p.value_heads * int64_t(kRecordBytes);

  // Chunks of the longest sequence: exact for fixed length, an upper bound for varlen (where
  // the mean length decides whether segments pay: many short sequences must not take them).
  const int64_t max_chunks = (p.seqlen + kChunk - 1) / kChunk;
  const int64_t mean_chunks =
      p.varlen ? (p.batch * p.seqlen + kChunk - 1) / kChunk / std::max<int64_t>(p.num_seqs, 1) : max_chunks;
  const int64_t pairs = std::max<int64_t>(p.num_seqs * p.value_heads, 1);
  int64_t segs = std::min(positive_env("FLASH_KDA_SM90_SEGMENTS"), max_chunks);  // a forced count, capped
  if (segs <= 0) {
    segs = std::min({kWaveSMs / pairs, mean_chunks / kMinSegChunks, kMaxSegments});
    if (segs < kMinSegments) segs = 1;
  }

  // FLASH_KDA_SM90_WINDOW_SLOTS=n forces the window size: a test knob that makes small problems
  // cross several windows (tests/python/test_fwd_windows.py).
  const int64_t forced = positive_env("FLASH_KDA_SM90_WINDOW_SLOTS");
  auto set_windows = [&](int64_t slots) {
    plan.window_slots = std::max<int64_t>(std::min(slots, plan.total_slots), 1);
    plan.num_windows = (plan.total_slots + plan.window_slots - 1) / plan.window_slots;
  };
  set_windows(forced > 0 ? forced : std::max<int64_t>(kMinWindowSlots, int64_t(kRecordBudget) / per_slot));
  const bool segments = plan.num_windows == 1 && segs > 1 && max_chunks > 1;
  if (forced == 0 && !segments) {
    if (plan.num_windows > 1)  // two buffers within the budget
      set_windows(std::max<int64_t>(kMinWindowSlots, int64_t(kRecordBudget / 2) / per_slot));
    else if (max_chunks >= kPipelineMinChunks &&
             pairs * recurrence_column_blocks(recurrence_warps(pairs, kWaveSMs)) <= kWaveSMs - kPipelineIdleSMs)
      set_windows((plan.total_slots + kPipelineWindows - 1) / kPipelineWindows);
  }
  const bool windows = plan.num_windows > 1;
  plan.records_bytes = size_t(plan.window_slots) * size_t(per_slot) * (windows ? 2 : 1);
  plan.carry_bytes = windows ? 2 * size_t(p.value_heads) * kHeadDim * kHeadDim * sizeof(float) : 0;
  plan.done_bytes = windows ? size_t(plan.num_windows) * sizeof(uint32_t) : 0;

  if (segments) {
    plan.seg_len = (max_chunks + segs - 1) / segs;
    plan.max_segs = (max_chunks + plan.seg_len - 1) / plan.seg_len;
    const size_t per_seg = size_t(p.num_seqs) * size_t(p.value_heads) * size_t(kStateBytes);
    plan.seg_maps_bytes = 2 * per_seg * size_t(plan.max_segs - 1);
    plan.seg_states_bytes = per_seg * size_t(plan.max_segs);
  }
  return plan;
}

int recurrence_warps(int64_t seq_heads, int64_t num_sms) { return seq_heads * 2 <= num_sms ? 4 : 8; }

}  // namespace flash_kda::sm90
