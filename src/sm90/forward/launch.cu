// Executes the plan (plan.h) of a forward call: fills the kernels' parameter blocks from the
// call's tensors and the plan, and launches the kernels in order. It decides nothing.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "sm90/common/cuda_check.h"
#include "sm90/common/device_props.h"
#include "sm90/common/row_layout.h"
#include "sm90/forward/kernels.h"
#include "sm90/forward/launch.h"
#include "sm90/forward/params.h"
#include "sm90/forward/plan.h"

namespace flash_kda::sm90 {
namespace {

// Stage 1's parameter block for a validated call, all but the sequence index and the window
// (seqs, records, slot_begin, slot_end), with the row form of its inputs.
PrepareParams prepare_params(const ForwardArgs& a, const ProblemShape& p) {
  PrepareParams pp{};
  pp.q = a.q.data; pp.k = a.k.data; pp.g = a.g.data; pp.beta = a.beta.data;
  pp.q_rows = row_layout(a.q, p);
  pp.k_rows = row_layout(a.k, p);
  pp.g_rows = row_layout(a.g, p);
  pp.beta_rows = row_layout(a.beta, p);
  // Absent A_log: decay rate 1; absent dt_bias: zero bias (validate.cpp; PreGated takes neither).
  pp.A_log = a.A_log.defined() ? static_cast<const float*>(a.A_log.data) : nullptr;
  pp.dt_bias = a.dt_bias.defined() ? static_cast<const float*>(a.dt_bias.data) : nullptr;
  pp.gate = a.gate;
  pp.g_is_f32 = a.g.dtype == DType::F32;
  pp.beta_is_f32 = a.beta.dtype == DType::F32;
  pp.l2norm = a.use_qk_l2norm;
  pp.beta_sigmoid = a.use_beta_sigmoid;
  pp.beta_mul = a.allow_neg_eigval ? 2.f : 1.f;
  pp.heads = static_cast<int>(p.heads);
  pp.value_heads = static_cast<int>(p.value_heads);
  pp.group = static_cast<int>(p.value_heads / p.heads);
  pp.scale = static_cast<float>(p.scale);
  pp.lower_bound = static_cast<float>(a.lower_bound);
  pp.flashkda_flags = prepare_flashkda_flags(pp);
  pp.row_form = prepare_row_form(pp);
  return pp;
}

}  // namespace

RowLayout row_layout(const TensorView& t, const ProblemShape& p) {
  const int64_t es = dtype_size(t.dtype);
  RowLayout r;
  r.token_stride = t.strides[1] * es;
  // A batch of one has no second entry: its stride is taken as T tokens, so that the layout is
  // flat() (and dense() when contiguous) whatever the view's outer stride.
  r.seq_stride = p.varlen ? 0 : p.batch == 1 ? p.seqlen * r.token_stride : t.strides[0] * es;
  r.seq_tokens = p.varlen ? 0 : p.seqlen;
  r.head_stride = t.strides[2] * es;
  return r;
}

RowForm prepare_form(const ForwardArgs& args, const ProblemShape& p) { return prepare_params(args, p).row_form; }

size_t workspace_bytes(const ProblemShape& p, const LaunchOptions& options) {
  return workspace_layout(p, options).total;
}

void launch_forward(const ForwardArgs& a, const ProblemShape& p, const LaunchOptions& options, void* workspace,
                    size_t have, const WorkspaceAllocator* allocate, Stream stream) {
  const WorkspaceLayout at = workspace_layout(p, options);
  const size_t need = at.total;
  if (allocate == nullptr) {
    if (have < need)
      throw Error("workspace", "at least " + std::to_string(need) + " bytes (forward_workspace_size), got " +
                                   std::to_string(have));
    if (need > 0 && (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 256 != 0))
      throw Error("workspace", "a non-null device pointer aligned to 256 bytes");
  }

  const int device = a.q.device_id;
  DeviceGuard guard(device);
  uint64_t ctx = 0;
  const DeviceProps props = sm90_stream_props(device, stream, &ctx);
  validate_device_options(options, props);
  const Plan plan = make_plan({p, props, options}, at);  // within `at` by construction (plan.h)

  if (allocate != nullptr) {
    workspace = need > 0 ? (*allocate)(need) : nullptr;
    if (need > 0 && (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 256 != 0))
      throw Error("workspace", "the allocator returned a null or not 256-byte aligned pointer");
  }
  char* records = static_cast<char*>(workspace);
  float* carry = reinterpret_cast<float*>(records + at.carry);
  float* seg_maps = reinterpret_cast<float*>(records + at.seg_maps);
  float* seg_states = reinterpret_cast<float*>(records + at.seg_states);
  unsigned* done = reinterpret_cast<unsigned*>(records + at.done);
  const size_t carry_elems = size_t(p.value_heads) * kHeadDim * kHeadDim;

  SeqIndex seqs;
  seqs.cu_seqlens = a.cu_seqlens.defined() ? a.cu_seqlens.data : nullptr;
  seqs.cu_is_64 = a.cu_seqlens.dtype == DType::I64;
  seqs.seqlen = p.seqlen;
  seqs.num_seqs = p.num_seqs;
  seqs.total_tokens = p.batch * p.seqlen;

  PrepareParams pp = prepare_params(a, p);
  pp.seqs = seqs;
  pp.records = records;

  // The states: each its own dtype; with ssm_state_indices, pools of P slots (validated: the
  // same P for both).
  StatePool pool;
  if (a.ssm_state_indices.defined()) {
    pool.indices = a.ssm_state_indices.data;
    pool.indices_64 = a.ssm_state_indices.dtype == DType::I64;
    pool.num_slots = (a.initial_state.defined() ? a.initial_state : a.final_state).shape[0];
  }
  const void* initial_state = a.initial_state.defined() ? a.initial_state.data : nullptr;
  void* final_state = a.final_state.defined() ? a.final_state.data : nullptr;
  const bool initial_is_f32 = a.initial_state.defined() && a.initial_state.dtype == DType::F32;
  const bool final_is_f32 = a.final_state.defined() && a.final_state.dtype == DType::F32;
  const bool k_first = a.state_layout == StateLayout::KFirst;
  const RowLayout out_rows = row_layout(a.out, p);

  InterStates inter;  // states == nullptr: none asked for
  if (a.intermediate_states.defined()) {
    inter.states = a.intermediate_states.data;
    inter.is_f32 = a.intermediate_states.dtype == DType::F32;
    inter.offsets = a.intermediate_offsets.data;
    inter.offsets_64 = a.intermediate_offsets.dtype == DType::I64;
    inter.num_rows = a.intermediate_states.shape[0];
    inter.every_chunks = a.intermediate_every / kChunk;
    inter.include_initial = a.intermediate_include_initial;
  }

  ChainParams chain{};
  chain.records = records;
  chain.v = a.v.data;
  chain.v_rows = row_layout(a.v, p);
  chain.seqs = seqs;
  chain.pool = pool;
  chain.value_heads = static_cast<int>(p.value_heads);
  chain.state_k_first = k_first;

  if (plan.segments()) {  // one window: stage 1, segment maps, scan, segments from their starts
    pp.slot_begin = 0;
    pp.slot_end = plan.total_slots;
    check_cuda(launch_prepare(pp, plan.prepare_launch(0), ctx, stream), "prepare kernel launch");
    SegmentMapsParams mp{};
    static_cast<ChainParams&>(mp) = chain;
    mp.seg_len = plan.seg_len;
    mp.max_segs = plan.max_segs;
    mp.seg_maps = seg_maps;
    check_cuda(launch_segment_maps(mp, plan.segment_maps, ctx, stream), "segment maps launch");
    ScanParams sp{};
    sp.seqs = seqs;
    sp.value_heads = chain.value_heads;
    sp.seg_len = plan.seg_len;
    sp.max_segs = plan.max_segs;
    sp.seg_maps = seg_maps;
    sp.seg_states = seg_states;
    sp.initial_state = initial_state;
    sp.initial_is_f32 = initial_is_f32;
    sp.state_k_first = k_first;
    sp.pool = pool;
    check_cuda(launch_segment_scan(sp, plan.segment_scan, ctx, stream), "segment scan launch");
    SegmentFinishParams fp{};
    static_cast<ChainParams&>(fp) = chain;
    fp.seg_len = plan.seg_len;
    fp.max_segs = plan.max_segs;
    fp.out = a.out.data;
    fp.out_rows = out_rows;
    fp.final_state = final_state;
    fp.final_is_f32 = final_is_f32;
    fp.seg_states = seg_states;
    fp.inter = inter;
    check_cuda(launch_segment_finish(fp, plan.segment_finish, ctx, stream), "segment finish launch");
    return;
  }
  // Windows: stage 1 then the window pass of each, records in two alternating buffers. Stage 1
  // of window w + 1 is the programmatic dependent of window w's pass, which lets it launch once
  // it has waited for window w - 1 (WindowParams::done_in): stage 1 then runs on the SMs the
  // pass leaves idle (its one-wave blocks keep their SMs), filling the buffer window w - 1 read.
  WindowParams rp{};
  static_cast<ChainParams&>(rp) = chain;
  rp.out = a.out.data;
  rp.out_rows = out_rows;
  rp.initial_state = initial_state;
  rp.final_state = final_state;
  rp.initial_is_f32 = initial_is_f32;
  rp.final_is_f32 = final_is_f32;
  rp.inter = inter;
  const size_t window_records = size_t(plan.window_slots) * size_t(p.value_heads) * kRecordBytes;
  if (plan.pipelined()) check_cuda(cudaMemsetAsync(done, 0, plan.bytes.done, stream), "cudaMemsetAsync (window counts)");
  for (int64_t w = 0; w < plan.num_windows; ++w) {
    pp.slot_begin = rp.slot_begin = plan.window_begin(w);
    pp.slot_end = rp.slot_end = plan.window_end(w);
    pp.records = records + (w % 2) * window_records;
    rp.records = pp.records;
    rp.carry_in = carry + (w % 2) * carry_elems;
    rp.carry_out = carry + ((w + 1) % 2) * carry_elems;
    rp.done_in = w > 0 ? done + (w - 1) : nullptr;
    rp.done_expected = w > 0 ? plan.window_pass_warps : 0;
    rp.done_out = w + 1 < plan.num_windows ? done + w : nullptr;
    check_cuda(launch_prepare(pp, plan.prepare_launch(w), ctx, stream), "prepare kernel launch");
    check_cuda(launch_window_pass(rp, plan.window_warps, plan.window_pass, ctx, stream), "window pass launch");
  }
}

}  // namespace flash_kda::sm90
