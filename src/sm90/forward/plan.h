// The launch plan of the sm_90a forward: every launch decision of a call in one value, made by
// one host function (make_plan) from the problem, the device's properties and the caller's
// LaunchOptions. launch.cu only executes it. Host code: unit-tested without a GPU
// (tests/cpp/test_sm90_plan.cpp).
//
// Why the workspace depends on the shape alone. forward_workspace_size is called before the
// caller picks a device or a partition of one (a green context, an MPS limit), but the plan's
// choices depend on the SM count: segments are taken only when num_sms / pairs >= 8, pipelined
// windows only when the state pass leaves >= 32 SMs idle. So the workspace is sized by the plan
// of the largest sm_90 part (kMaxSms = 132 SMs, the H100/H200 SXM), at offsets that do not move
// (workspace_layout), and a plan for fewer SMs keeps its buffers within it (fits_in; tested for
// every SM count): it takes its own choice when that fits, else the same without pipelining,
// else the largest part's windows and segments with its own grids. Fewer SMs never need more
// segments (the count grows with the SMs), and never pipeline where 132 SMs do not (pipelining
// needs idle SMs), so the fallback only arises where 132 SMs pipeline or take segments and the
// smaller part would not: it then runs the three pipelined windows or the segments of the
// larger part (correct on any count; the waves are the smaller part's). A device reporting more
// than kMaxSms SMs is planned for kMaxSms: its extra SMs stay idle in the one-wave decisions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flash_kda/forward.h"
#include "sm90/common/device_props.h"
#include "sm90/common/kernel_launch.h"
#include "sm90/common/row_layout.h"

namespace flash_kda::sm90 {

/// The most SMs of any sm_90 part; the plan never plans for more (see above).
inline constexpr int kMaxSms = 132;

/// Bytes of each workspace buffer: a plan's use, or the workspace's capacity.
struct WorkspaceBuffers {
  size_t records = 0;     // chunk records of one window, or of two with several windows
  size_t carry = 0;       // two fp32 [HV, V, K] states: the sequence crossing a window boundary
  size_t done = 0;        // one uint32 completion count per window
  size_t seg_maps = 0;    // P and Q of every segment but the last, fp32 [V, K] each
  size_t seg_states = 0;  // every segment's start state, fp32 [V, K]
  bool fits_in(const WorkspaceBuffers& cap) const {
    return records <= cap.records && carry <= cap.carry && done <= cap.done && seg_maps <= cap.seg_maps &&
           seg_states <= cap.seg_states;
  }
};

/// What a plan is made from. device.num_sms is the count of the stream's context; options.num_sms,
/// when set, replaces it (after validate_device_options).
struct PlanInput {
  ProblemShape shape;
  DeviceProps device;
  LaunchOptions options;
};

/// Every launch decision of one forward call (counts of chunk slots are 16-token slots).
///
/// Windows: total_slots = N + ceil(T_total / 16) (common/seq_index.h) cut into num_windows
/// windows of window_slots; with several windows ("pipelined"), stage 1 of window w + 1 fills one
/// of two record buffers while the state pass of window w reads the other, the state of the
/// sequence crossing a window boundary goes through two fp32 carry buffers, and one uint32
/// completion count per window orders them (WindowParams::done_in/done_out).
/// Segments (seg_len > 0, one window only): seg_len chunks per segment, at most max_segs
/// segments per sequence, the maps and the start state of every segment in fp32.
struct Plan {
  int num_sms = 0;  // SMs planned for: options.num_sms or the device's, at most kMaxSms
  int64_t total_slots = 0, window_slots = 0, num_windows = 0;
  int64_t seg_len = 0, max_segs = 1;
  int window_warps = 8;  // warps per block of the window pass (4 or 8)

  WorkspaceBuffers bytes;  // what this plan uses of the workspace (within its capacity)

  // Launches. prepare is window 0's (prepare_launch(w) gives every window's); window_pass is the
  // same for every window; the segment launches are set only when seg_len > 0.
  KernelLaunch prepare, window_pass;
  unsigned window_pass_warps = 0;  // consumer warps of window_pass's grid: what done_out reaches
  KernelLaunch segment_maps, segment_scan, segment_finish;

  bool segments() const { return seg_len > 0; }
  bool pipelined() const { return num_windows > 1; }
  int64_t window_begin(int64_t w) const { return w * window_slots; }
  int64_t window_end(int64_t w) const {
    const int64_t e = window_begin(w) + window_slots;
    return e < total_slots ? e : total_slots;
  }
  /// Stage 1 of window w: one block per slot of the window; window w > 0 of a pipelined call is
  /// the programmatic dependent of window w - 1's state pass, so that it runs beside it.
  KernelLaunch prepare_launch(int64_t w) const;
};

/// Checks the options that need no device: num_sms >= 0, window_slots >= 0, segments >= 0,
/// recurrence_warps in {0, 4, 8}. Throws Error("launch_options.<field>", ...).
void validate_options(const LaunchOptions& options);
/// Checks options.num_sms <= device.num_sms (the SMs of the stream's context). Throws
/// Error("launch_options.num_sms", ...).
void validate_device_options(const LaunchOptions& options, const DeviceProps& device);

/// The launch `k` of a state pass with `warps` warps a block (WindowPass or SegmentFinishPass)
/// for a call that stores intermediate states: its dynamic shared memory (and the kernel's
/// attribute) grown to hold the staging buffer of the staged store (kernel_shapes.h,
/// InterStaging), all else as planned.
KernelLaunch inter_states_launch(const KernelLaunch& k, int warps);

/// The segment scan's launch (segment_scan.cu) for `num_seqs` sequences of `value_heads` heads:
/// one block per (sequence, value head, kScanRows rows of the state). The forward's segments
/// and the backward's chain segments both take it.
KernelLaunch segment_scan_launch(int64_t num_seqs, int64_t value_heads);

struct PrepareParams;
/// Whether a call whose parameter block `p` is filled (but for flashkda_flags and row_form)
/// has FlashKDA's flags: the safe gate with A_log and dt_bias, the L2 norm, b = sigmoid(beta)
/// without allow_neg_eigval. The prepare kernel then has them fixed at compile time in its Dense
/// and Flat forms (the General form reads them at run time).
bool prepare_flashkda_flags(const PrepareParams& p);
/// The prepare kernel's row form for a call whose parameter block `p` is filled but for
/// flashkda_flags and row_form: Dense for FlashKDA's own call (prepare_flashkda_flags and every
/// input dense), else Flat when every input is flat() (row_layout.h: varlen, contiguous
/// tensors, views of a fused projection), else General.
RowForm prepare_row_form(const PrepareParams& p);

struct WorkspaceLayout;
/// The plan for a validated problem and validated options, within the workspace `at`
/// (workspace_layout(in.shape, in.options)).
Plan make_plan(const PlanInput& in, const WorkspaceLayout& at);

/// Shared-memory properties of every sm_90 part (228 KB per SM, 227 KB per block, 1 KB reserved
/// per block) with `num_sms` SMs: the device the tests and the capacity plan for.
DeviceProps sm90_device(int num_sms);

/// The workspace: byte offset and capacity of each buffer (256-byte aligned, records at 0), and
/// the total, from the shape and the forced options alone (see the file comment).
struct WorkspaceLayout {
  WorkspaceBuffers cap;  // the 132-SM plan's buffers
  size_t carry = 0, seg_maps = 0, seg_states = 0, done = 0, total = 0;  // offsets; total bytes
};
WorkspaceLayout workspace_layout(const ProblemShape& shape, const LaunchOptions& options);

}  // namespace flash_kda::sm90
