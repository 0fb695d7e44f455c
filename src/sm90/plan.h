// The launch plan of the sm_90a forward: how the chunk slots are cut into windows (bounded
// workspace) and whether sequences are cut into segments (segment-parallel mode), decided from
// the problem's shape alone, because forward_workspace_size must be. launch.cu carries it out.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flash_kda/forward.h"

namespace flash_kda::sm90 {

/// Windows and segments of one forward call (all counts in 16-token chunk slots).
/// total_slots: N + ceil(T_total / 16) (params.h SeqIndex); window_slots: slots per window;
/// num_windows: ceil(total_slots / window_slots); records_bytes: the chunk records of one window,
/// or of two with several windows (stage 1 of window w + 1 fills one buffer while the
/// recurrence of window w reads the other: launch.cu); carry_bytes: the two fp32 carry buffers
/// and done_bytes: one uint32 completion count per window, both 0 with one window.
/// Segment mode (seg_len > 0, one window only): seg_len chunks per segment, max_segs segments
/// per sequence at most, seg_maps_bytes (P and Q of every segment but the last) and
/// seg_states_bytes (every segment's start state), both fp32 [V][K] per (sequence, segment, head).
struct Plan {
  int64_t total_slots, window_slots, num_windows;
  size_t records_bytes, carry_bytes, done_bytes = 0;
  int64_t seg_len = 0, max_segs = 1;  // segment-parallel mode when seg_len > 0
  size_t seg_maps_bytes = 0, seg_states_bytes = 0;
};

/// The plan for a validated problem. Knobs (tests and tuning): FLASH_KDA_SM90_WINDOW_SLOTS=n
/// forces windows of n slots; FLASH_KDA_SM90_SEGMENTS=S forces S segments per sequence (capped
/// at the chunk count; 1 turns segments off).
Plan make_plan(const ProblemShape& p);

/// Warps per recurrence block for `seq_heads` (sequence, value head) pairs on `num_sms` SMs:
/// 16 value columns a warp, whole warpgroups. A chunk step costs about the same for one or two
/// warpgroups, so the block count is what matters: 8 warps (one block per pair, sharing one
/// record load) unless that leaves most SMs idle, then 4, so that the 2 x seq_heads blocks
/// still fit the SMs in one wave. launch.cu launches with it (FLASH_KDA_SM90_WARPS=4|8
/// overrides it there); make_plan counts the blocks with it.
int recurrence_warps(int64_t seq_heads, int64_t num_sms);

}  // namespace flash_kda::sm90
