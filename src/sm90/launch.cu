// Launch logic of the sm_90a forward: workspace layout, windows over chunk slots, the value
// split of the recurrence, and the kernel sequence.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>

#include "sm90/launch.h"
#include "sm90/params.h"
#include "sm90/plan.h"

namespace flash_kda::sm90 {
namespace {

size_t round_up(size_t x) { return (x + 255) / 256 * 256; }

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw CudaError(std::string("flash_kda: ") + what + ": " + cudaGetErrorString(e));
}

// Warps per recurrence block: plan.h's recurrence_warps, or FLASH_KDA_SM90_WARPS=4|8 (tuning
// sweeps and tests).
int pick_warps_per_block(int64_t seq_heads, int num_sms) {
  if (const char* env = std::getenv("FLASH_KDA_SM90_WARPS")) {
    const int w = std::atoi(env);
    if (w == 4 || w == 8) return w;
  }
  return recurrence_warps(seq_heads, num_sms);
}

// Makes `device` current for the launches and restores the caller's device afterwards.
struct DeviceGuard {
  int previous = -1;
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&previous), "cudaGetDevice");
    if (previous != device) check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous) cudaSetDevice(previous);
  }
};

// What the launch needs to know of a device, queried once per device: the forward is called once
// per layer and step, and three driver queries a call were part of its host time.
struct DeviceInfo {
  int major = 0, minor = 0, num_sms = 0;
};

DeviceInfo query_device(int device) {
  DeviceInfo d;
  check(cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
  check(cudaDeviceGetAttribute(&d.minor, cudaDevAttrComputeCapabilityMinor, device), "cudaDeviceGetAttribute");
  check(cudaDeviceGetAttribute(&d.num_sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  return d;
}

DeviceInfo device_info(int device) {
  constexpr int kCached = 64;
  static DeviceInfo info[kCached];
  static std::once_flag once[kCached];
  if (device < 0 || device >= kCached) return query_device(device);
  // A query that throws leaves its flag unset: the next call asks again.
  std::call_once(once[device], [device] { info[device] = query_device(device); });
  return info[device];
}

// Byte offsets of the plan's buffers in the workspace, each 256-byte aligned, in this order
// (records at 0), and the bytes of the whole: forward_workspace_size and the launch read both
// from here.
struct WorkspaceLayout {
  size_t carry, seg_maps, seg_states, done, total;
  explicit WorkspaceLayout(const Plan& plan)
      : carry(round_up(plan.records_bytes)),
        seg_maps(carry + round_up(plan.carry_bytes)),
        seg_states(seg_maps + round_up(plan.seg_maps_bytes)),
        done(seg_states + round_up(plan.seg_states_bytes)),
        total(done + round_up(plan.done_bytes)) {}
};

}  // namespace

size_t workspace_bytes(const ProblemShape& p) { return WorkspaceLayout(make_plan(p)).total; }

void launch_forward(const ForwardArgs& a, const ProblemShape& p, void* workspace, size_t have, Stream stream) {
  // One plan per call: it sizes the workspace check and lays the workspace out.
  const Plan plan = make_plan(p);
  const WorkspaceLayout at(plan);
  const size_t need = at.total;
  if (have < need)
    throw Error("workspace", "at least " + std::to_string(need) + " bytes (forward_workspace_size), got " +
                                 std::to_string(have));
  if (need > 0 && (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 256 != 0))
    throw Error("workspace", "a non-null device pointer aligned to 256 bytes");

  const int device = a.q.device_id;
  DeviceGuard guard(device);
  const DeviceInfo info = device_info(device);
  if (info.major != 9 || info.minor != 0)
    throw Error("q", "tensors on an sm_90 (Hopper) GPU; device " + std::to_string(device) + " is sm_" +
                         std::to_string(info.major) + std::to_string(info.minor));

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

  PrepareParams pp{};
  pp.q = a.q.data; pp.k = a.k.data; pp.g = a.g.data; pp.beta = a.beta.data;
  pp.A_log = static_cast<const float*>(a.A_log.data);
  pp.dt_bias = static_cast<const float*>(a.dt_bias.data);
  pp.g_is_f32 = a.g.dtype == DType::F32;
  pp.beta_is_f32 = a.beta.dtype == DType::F32;
  pp.seqs = seqs;
  pp.heads = static_cast<int>(p.heads);
  pp.value_heads = static_cast<int>(p.value_heads);
  pp.scale = static_cast<float>(p.scale);
  pp.lower_bound = static_cast<float>(a.lower_bound);
  pp.records = records;

  RecurrenceParams rp{};
  rp.records = records;
  rp.v = a.v.data;
  rp.seqs = seqs;
  rp.value_heads = static_cast<int>(p.value_heads);
  rp.out = a.out.data;
  rp.initial_state = a.initial_state.defined() ? a.initial_state.data : nullptr;
  rp.final_state = a.final_state.defined() ? a.final_state.data : nullptr;
  const TensorView& st = a.initial_state.defined() ? a.initial_state : a.final_state;
  rp.state_is_f32 = st.defined() && st.dtype == DType::F32;
  const int nw = pick_warps_per_block(p.num_seqs * p.value_heads, info.num_sms);

  if (plan.seg_len > 0) {  // one window: stage 1, segment maps, scan, segments from their starts
    pp.slot_begin = rp.slot_begin = 0;
    pp.slot_end = rp.slot_end = plan.total_slots;
    rp.carry_in = rp.carry_out = nullptr;
    rp.seg_len = plan.seg_len;
    rp.max_segs = plan.max_segs;
    rp.seg_maps = seg_maps;
    rp.seg_states = seg_states;
    check(launch_prepare(pp, false, stream), "prepare kernel launch");
    rp.seg_pass = kSegMaps;
    check(launch_recurrence(rp, {8, plan.total_slots, true, info.num_sms}, stream), "segment maps launch");
    ScanParams sp{};
    sp.seqs = seqs;
    sp.value_heads = rp.value_heads;
    sp.seg_len = plan.seg_len;
    sp.max_segs = plan.max_segs;
    sp.seg_maps = seg_maps;
    sp.seg_states = seg_states;
    sp.initial_state = rp.initial_state;
    sp.state_is_f32 = rp.state_is_f32;
    check(launch_segment_scan(sp, stream), "segment scan launch");
    rp.seg_pass = kSegFinish;
    check(launch_recurrence(rp, {8, plan.total_slots, false, info.num_sms}, stream), "segment finish launch");
    return;
  }
  // Windows: stage 1 then the recurrence of each, records in two alternating buffers. Stage 1 of
  // window w + 1 is the programmatic dependent of window w's recurrence, which lets it launch
  // once it has waited for window w - 1 (RecurrenceParams::done_in): stage 1 then runs on the SMs
  // the recurrence leaves idle (its one-wave blocks keep their SMs: recurrence.cu), filling the
  // buffer window w - 1 read.
  const bool windows = plan.num_windows > 1;
  const size_t window_records = size_t(plan.window_slots) * size_t(p.value_heads) * kRecordBytes;
  if (windows) check(cudaMemsetAsync(done, 0, plan.done_bytes, stream), "cudaMemsetAsync (window counts)");
  unsigned previous_warps = 0;
  for (int64_t w = 0; w < plan.num_windows; ++w) {
    const int64_t begin = w * plan.window_slots;
    const int64_t end = std::min(plan.total_slots, begin + plan.window_slots);
    pp.slot_begin = rp.slot_begin = begin;
    pp.slot_end = rp.slot_end = end;
    pp.records = records + (w % 2) * window_records;
    rp.records = pp.records;
    rp.carry_in = carry + (w % 2) * carry_elems;
    rp.carry_out = carry + ((w + 1) % 2) * carry_elems;
    rp.done_in = w > 0 ? done + (w - 1) : nullptr;
    rp.done_expected = previous_warps;
    rp.done_out = w + 1 < plan.num_windows ? done + w : nullptr;
    const RecurrenceLaunch how{nw, plan.window_slots, true, info.num_sms};
    check(launch_prepare(pp, w > 0, stream), "prepare kernel launch");
    check(launch_recurrence(rp, how, stream), "recurrence kernel launch");
    previous_warps = recurrence_consumer_warps(rp, how);
  }
}

}  // namespace flash_kda::sm90
