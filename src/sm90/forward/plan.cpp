// The launch plan of the sm_90a forward (plan.h): windows over chunk slots, pipelining, the
// segment split, block widths, grids, shared-memory reservations and programmatic dependent
// launches, and the workspace capacity that covers every plan.
#include "sm90/forward/plan.h"

#include <algorithm>
#include <string>

#include "sm90/common/record.h"
#include "sm90/forward/kernel_shapes.h"
#include "sm90/forward/kernels.h"
#include "sm90/forward/params.h"

namespace flash_kda::sm90 {
namespace {

// Chunk records take ~5x the bytes of q, so very long inputs are processed in windows of
// chunk slots with a bounded workspace; the state of the one sequence that crosses a window
// boundary is carried in fp32 (two buffers, alternating, so a window never reads the carry
// it is writing). With several windows the records are double-buffered (stage 1 of the next
// window runs beside the state pass of this one), both buffers within the budget. A window of
// 16 slots still has 16 x HV blocks of stage 1, so the minimum only matters above HV = 3,000,
// where the budget yields to it.
constexpr size_t kRecordBudget = size_t(2) << 30;
constexpr int64_t kMinWindowSlots = 16;

// Pipelined windows for problems that fit in one: while the state pass of window w runs on one
// block per (sequence, head, column block), stage 1 of window w + 1 takes the SMs it leaves idle
// instead of waiting for it. Worth it when each chain is long (per-window costs: a carried
// state, a pipeline fill) and the state pass, in one wave, leaves at least kPipelineIdleSMs SMs
// idle. Measured on the H200 (docs/performance.md, eager us): one window -> four:
// h32_fixed_8192 (64 blocks) 360-384 -> 298-306, h96_fixed_8192 (96) 729-746 -> 705-710,
// h64_fixed_8192 (128 blocks, 4 SMs idle) 486 -> 517-519: not taken; four -> three:
// h96_fixed_8192 692-700 -> 682-683, h32_fixed_8192 303-305 -> 298-311 (level).
constexpr int64_t kPipelineMinChunks = 256;
constexpr int64_t kPipelineWindows = 3;
constexpr int64_t kPipelineIdleSMs = 32;

// Segment-parallel mode (params.h): few (sequence, head) pairs with long sequences leave most
// SMs idle on one long chain. Cutting each sequence into S segments costs 3x the state-passing
// work (P and Q of each segment, then the segments again from their true start states) plus an
// S-step scan, but the chain shrinks from C chunks to ~2C/S + S scan steps. S is chosen so that
// (sequences x heads x S) blocks fill one wave of the SMs, with segments of at least 32 chunks,
// at most 16 of them (the scan is S sequential steps: on the H200 h4_fixed_65536 takes 0.927 ms
// with 16 segments, 0.952 with 33, 1.327 with 64), and only when that gives S >= 8.
constexpr int64_t kMinSegChunks = 32;
constexpr int64_t kMinSegments = 8;
constexpr int64_t kMaxSegments = 16;

// Dynamic shared memory of a one-wave state pass that keeps a second block off the SM (228 KB
// per SM, 1 KB of it reserved per block). A one-wave grid wants one block per SM: with the
// programmatic launch its blocks are placed while stage 1's last wave still runs, and two of
// them on one SM (each fits twice) would run their chains at half pace while other SMs idle.
constexpr int kOnePerSmBytes = 116 * 1024;
// With pipelined windows the next window's stage 1 runs beside the state pass. A stage-1 block
// (~27 KB with its reserve) on the SM of a single-warpgroup block, whose every warp is on the
// chain, slows the chain more than the overlap gains (h32_fixed_8192 298-301 us with the SMs
// kept to the state pass, 306-313 us shared; docs/performance.md); so such a grid takes shared
// memory that leaves no room for one. (Two warpgroups take the register file anyway.)
constexpr int kExclusiveBytes = 200 * 1024;
static_assert(RecurrenceSmem<8>::kBytes <= kOnePerSmBytes && RecurrenceSmem<4>::kBytes <= kOnePerSmBytes &&
                  kOnePerSmBytes < kExclusiveBytes,
              "the reservations are in order");

size_t round_up(size_t x) { return (x + 255) / 256 * 256; }

// Warps per window-pass block for `pairs` (sequence, value head) pairs on `num_sms` SMs: 16 value
// columns a warp, whole warpgroups. A chunk step costs about the same for one or two warpgroups,
// so the block count is what matters: 8 warps (one block per pair, sharing one record load)
// unless that leaves most SMs idle, then 4, so that the 2 x pairs blocks still fit the SMs in
// one wave.
int window_warps_for(int64_t pairs, int64_t num_sms, int forced) {
  if (forced != 0) return forced;
  return pairs * 2 <= num_sms ? 4 : 8;
}

// The decisions that size buffers, for one SM count.
struct Shape {
  int64_t total_slots, per_slot, max_chunks, mean_chunks, pairs;
  explicit Shape(const ProblemShape& p)
      : total_slots(p.num_seqs + (p.batch * p.seqlen + kChunk - 1) / kChunk),
        per_slot(p.value_heads * int64_t(kRecordBytes)),
        // Chunks of the longest sequence: exact for fixed length, an upper bound for varlen
        // (where the mean length decides whether segments pay: many short sequences must not
        // take them).
        max_chunks((p.seqlen + kChunk - 1) / kChunk),
        mean_chunks(p.varlen ? (p.batch * p.seqlen + kChunk - 1) / kChunk / std::max<int64_t>(p.num_seqs, 1)
                             : max_chunks),
        pairs(std::max<int64_t>(p.num_seqs * p.value_heads, 1)) {}
  // Windows of `slots` slots: {window_slots, num_windows}.
  void windows(int64_t slots, int64_t& window_slots, int64_t& num_windows) const {
    window_slots = std::max<int64_t>(std::min(slots, total_slots), 1);
    num_windows = (total_slots + window_slots - 1) / window_slots;
  }
  // The windows the record budget (or the forced size) gives, before pipelining.
  void budget_windows(const LaunchOptions& o, int64_t& window_slots, int64_t& num_windows) const {
    windows(o.window_slots > 0 ? o.window_slots : std::max<int64_t>(kMinWindowSlots, int64_t(kRecordBudget) / per_slot),
            window_slots, num_windows);
  }
  // Segments per sequence on `num_sms` SMs (1: none).
  int64_t segments(const LaunchOptions& o, int64_t num_sms) const {
    int64_t segs = std::min<int64_t>(o.segments, max_chunks);  // a forced count, capped
    if (segs <= 0) {
      segs = std::min({num_sms / pairs, mean_chunks / kMinSegChunks, kMaxSegments});
      if (segs < kMinSegments) segs = 1;
    }
    return segs;
  }
  void segment_split(int64_t segs, int64_t& seg_len, int64_t& max_segs) const {
    seg_len = (max_chunks + segs - 1) / segs;
    max_segs = (max_chunks + seg_len - 1) / seg_len;
  }
  size_t per_seg(const ProblemShape& p) const {
    return size_t(p.num_seqs) * size_t(p.value_heads) * size_t(kStateBytes);
  }
};

KernelLaunch recurrence_launch(uint64_t gx, uint64_t gy, uint64_t gz, int warps, bool keep_sms, bool dependent,
                               const Plan& plan, bool reservations) {
  KernelLaunch k;
  k.grid_x = static_cast<uint32_t>(gx);
  k.grid_y = static_cast<uint32_t>(gy);
  k.grid_z = static_cast<uint32_t>(gz);
  k.block = static_cast<uint32_t>(recurrence_block_threads(warps));
  const int bytes = warps == 4 ? RecurrenceSmem<4>::kBytes : RecurrenceSmem<8>::kBytes;
  const bool one_wave = k.blocks() <= uint64_t(plan.num_sms);
  k.smem_bytes = !reservations || !one_wave ? bytes : keep_sms ? kExclusiveBytes : kOnePerSmBytes;
  k.smem_attr = reservations ? kExclusiveBytes : bytes;
  k.dependent = dependent;
  return k;
}

}  // namespace

void validate_options(const LaunchOptions& o) {
  if (o.num_sms < 0)
    throw Error("launch_options.num_sms", ">= 0 (0: the device's SM count), got " + std::to_string(o.num_sms));
  if (o.window_slots < 0)
    throw Error("launch_options.window_slots", ">= 0 (0: the plan decides), got " + std::to_string(o.window_slots));
  if (o.segments < 0)
    throw Error("launch_options.segments", ">= 0 (0: the plan decides), got " + std::to_string(o.segments));
  if (o.recurrence_warps != 0 && o.recurrence_warps != 4 && o.recurrence_warps != 8)
    throw Error("launch_options.recurrence_warps", "0, 4 or 8, got " + std::to_string(o.recurrence_warps));
}

void validate_device_options(const LaunchOptions& o, const DeviceProps& d) {
  if (o.num_sms > d.num_sms)
    throw Error("launch_options.num_sms", "at most the " + std::to_string(d.num_sms) +
                                              " SMs of the stream's context on device " + std::to_string(d.device) +
                                              ", got " + std::to_string(o.num_sms));
}

DeviceProps sm90_device(int num_sms) {
  DeviceProps d;
  d.major = 9;
  d.minor = 0;
  d.num_sms = num_sms;
  d.smem_per_sm = 228 * 1024;
  d.smem_per_block_optin = 227 * 1024;
  d.smem_reserved_per_block = 1024;
  return d;
}

KernelLaunch Plan::prepare_launch(int64_t w) const {
  KernelLaunch k = prepare;
  k.grid_x = static_cast<uint32_t>(window_end(w) - window_begin(w));
  k.dependent = pipelined() && w > 0;
  return k;
}

namespace {

// The decisions that size the workspace: windows, pipelining, segments, and the buffers they
// need, on `sms` SMs (pipelining only when `pipelining`).
struct Memory {
  int64_t window_slots = 0, num_windows = 0, seg_len = 0, max_segs = 1;
  WorkspaceBuffers bytes;
};

Memory decide_memory(const ProblemShape& p, const Shape& s, const LaunchOptions& o, int64_t sms, bool pipelining) {
  Memory m;
  const int64_t segs = s.segments(o, sms);
  s.budget_windows(o, m.window_slots, m.num_windows);
  const bool segments = m.num_windows == 1 && segs > 1 && s.max_chunks > 1;
  if (o.window_slots == 0 && !segments) {
    if (m.num_windows > 1)  // two buffers within the budget
      s.windows(std::max<int64_t>(kMinWindowSlots, int64_t(kRecordBudget / 2) / s.per_slot), m.window_slots,
                m.num_windows);
    else if (pipelining && s.max_chunks >= kPipelineMinChunks &&
             s.pairs * recurrence_column_blocks(window_warps_for(s.pairs, sms, o.recurrence_warps)) <=
                 sms - kPipelineIdleSMs)
      s.windows((s.total_slots + kPipelineWindows - 1) / kPipelineWindows, m.window_slots, m.num_windows);
  }
  const bool windows = m.num_windows > 1;
  m.bytes.records = size_t(m.window_slots) * size_t(s.per_slot) * (windows ? 2 : 1);
  m.bytes.carry = windows ? 2 * size_t(p.value_heads) * kHeadDim * kHeadDim * sizeof(float) : 0;
  m.bytes.done = windows ? size_t(m.num_windows) * sizeof(uint32_t) : 0;
  if (segments) {
    s.segment_split(segs, m.seg_len, m.max_segs);
    const size_t per_seg = s.per_seg(p);
    m.bytes.seg_maps = 2 * per_seg * size_t(m.max_segs - 1);
    m.bytes.seg_states = per_seg * size_t(m.max_segs);
  }
  return m;
}

// The decisions for `sms` SMs within `cap`, the workspace of the largest part (plan.h): the
// part's own choice when its buffers fit, else the same without pipelining, else the largest
// part's (whose buffers are `cap`).
Memory memory_within_capacity(const ProblemShape& p, const Shape& s, const LaunchOptions& o, int64_t sms,
                              const WorkspaceBuffers& cap) {
  const Memory own = decide_memory(p, s, o, sms, true);
  if (sms >= kMaxSms || own.bytes.fits_in(cap)) return own;
  const Memory plain = decide_memory(p, s, o, sms, false);
  return plain.bytes.fits_in(cap) ? plain : decide_memory(p, s, o, kMaxSms, true);
}

}  // namespace

Plan make_plan(const PlanInput& in, const WorkspaceLayout& at) {
  const ProblemShape& p = in.shape;
  const LaunchOptions& o = in.options;
  const Shape s(p);
  Plan plan;
  plan.num_sms = std::min(o.num_sms > 0 ? o.num_sms : in.device.num_sms, kMaxSms);
  plan.total_slots = s.total_slots;
  const int64_t sms = plan.num_sms;

  // The one-per-SM reservations need every sm_90 part's shared memory (228 KB an SM, 227 KB a
  // block): two reserved blocks must not fit an SM, one must, and an exclusive one must leave
  // no room for a stage-1 block. Elsewhere the state passes take what their layout needs.
  const DeviceProps& d = in.device;
  const bool reservations = d.smem_per_block_optin >= kExclusiveBytes &&
                            2 * (kOnePerSmBytes + d.smem_reserved_per_block) > d.smem_per_sm &&
                            kExclusiveBytes + kPrepareSmemBytes + 2 * d.smem_reserved_per_block > d.smem_per_sm;

  plan.window_warps = window_warps_for(s.pairs, sms, o.recurrence_warps);
  const Memory m = memory_within_capacity(p, s, o, sms, at.cap);
  plan.window_slots = m.window_slots;
  plan.num_windows = m.num_windows;
  plan.bytes = m.bytes;
  const bool windows = plan.num_windows > 1;

  const uint64_t HV = static_cast<uint64_t>(p.value_heads);
  plan.prepare.grid_x = static_cast<uint32_t>(plan.window_end(0) - plan.window_begin(0));
  plan.prepare.grid_y = static_cast<uint32_t>(HV);
  plan.prepare.block = kPrepareThreads;
  plan.prepare.dependent = false;

  if (m.seg_len > 0) {
    plan.seg_len = m.seg_len;
    plan.max_segs = m.max_segs;
    // Block x: segment x % max_segs of sequence x / max_segs; z: column blocks (x P and Q).
    const uint64_t gx = uint64_t(p.num_seqs) * uint64_t(plan.max_segs);
    const uint64_t cb = recurrence_column_blocks(kSegmentWarps);
    plan.segment_maps = recurrence_launch(gx, HV, 2 * cb, kSegmentWarps, false, true, plan, reservations);
    plan.segment_finish = recurrence_launch(gx, HV, cb, kSegmentWarps, false, false, plan, reservations);
    plan.segment_scan = segment_scan_launch(p.num_seqs, p.value_heads);
    return plan;
  }
  // Window pass: block x takes the x-th sequence overlapping the window (each owns >= 1 slot,
  // so at most window_slots of them), y the value head, z the column block. A pipelined window
  // keeps its SMs (kExclusiveBytes).
  const uint64_t seqs = uint64_t(std::min<int64_t>(plan.window_slots, p.num_seqs));
  plan.window_pass = recurrence_launch(seqs, HV, recurrence_column_blocks(plan.window_warps), plan.window_warps,
                                       windows, true, plan, reservations);
  plan.window_pass_warps = static_cast<unsigned>(plan.window_pass.blocks() * unsigned(plan.window_warps));
  return plan;
}

// The staging buffer fits the exclusive reservation, so that a kernel's attribute stays the
// plan's on every call (allow_dynamic_smem keeps the first).
static_assert(InterStaging<8>::kSmemBytes <= kExclusiveBytes && InterStaging<4>::kSmemBytes <= kExclusiveBytes,
              "the staged intermediate-state store fits the state passes' reservation");

KernelLaunch segment_scan_launch(int64_t num_seqs, int64_t value_heads) {
  KernelLaunch scan;
  scan.grid_x = static_cast<uint32_t>(num_seqs);
  scan.grid_y = static_cast<uint32_t>(value_heads);
  scan.grid_z = kHeadDim / kScanRows;
  scan.block = kScanThreads;
  scan.smem_bytes = scan.smem_attr = kScanSmemBytes;
  return scan;
}

KernelLaunch inter_states_launch(const KernelLaunch& k, int warps) {
  const int bytes = warps == 4 ? InterStaging<4>::kSmemBytes : InterStaging<8>::kSmemBytes;
  KernelLaunch out = k;
  out.smem_bytes = std::max(k.smem_bytes, bytes);
  out.smem_attr = std::max(k.smem_attr, bytes);
  return out;
}

bool prepare_flashkda_flags(const PrepareParams& p) {
  // beta_mul 1: without allow_neg_eigval (params.h).
  return p.gate == GateMode::SafeSigmoid && p.A_log != nullptr && p.dt_bias != nullptr && p.l2norm &&
         p.beta_sigmoid && p.beta_mul == 1.f;
}

RowForm prepare_row_form(const PrepareParams& p) {
  const bool dense = p.q_rows.dense(p.heads, 2 * kHeadDim) && p.k_rows.dense(p.heads, 2 * kHeadDim) &&
                     p.g_rows.dense(p.value_heads, (p.g_is_f32 ? 4 : 2) * kHeadDim) &&
                     p.beta_rows.dense(p.value_heads, p.beta_is_f32 ? 4 : 2);
  if (dense && prepare_flashkda_flags(p)) return RowForm::Dense;
  return p.q_rows.flat() && p.k_rows.flat() && p.g_rows.flat() && p.beta_rows.flat() ? RowForm::Flat
                                                                                       : RowForm::General;
}

WorkspaceLayout workspace_layout(const ProblemShape& p, const LaunchOptions& o) {
  const Memory m = decide_memory(p, Shape(p), o, kMaxSms, true);
  WorkspaceLayout at;
  at.cap = m.bytes;
  at.carry = round_up(at.cap.records);
  at.seg_maps = at.carry + round_up(at.cap.carry);
  at.seg_states = at.seg_maps + round_up(at.cap.seg_maps);
  at.done = at.seg_states + round_up(at.cap.seg_states);
  at.total = at.done + round_up(at.cap.done);
  return at;
}

}  // namespace flash_kda::sm90
