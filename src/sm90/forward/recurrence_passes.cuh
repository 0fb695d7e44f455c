// The three state passes of the forward as compile-time policies of one kernel
// (recurrence.cu, recurrence_kernel<NW, Pass>): each says which block runs which chunks, where
// its start state comes from, whether it writes out, and where its end state goes. The chunk
// step they share is the kernel's; a pass adds no branch to it.
//
//   WindowPass        WindowParams         chunks of [slot_begin, slot_end) per sequence; start:
//                                          the initial state (or zero), or the carry of the
//                                          window before; writes out; end: the final state, or
//                                          the carry to the next window
//   SegmentMapsPass   SegmentMapsParams    segment j of each sequence but the last, twice (grid
//                                          z: P, then Q); start: I (P, with U0 = 0) or 0 (Q);
//                                          no out; end: P or Q into seg_maps
//   SegmentFinishPass SegmentFinishParams  every segment; start: the scan's seg_states; writes
//                                          out; end: the final state, last segment only
//
// The caller's states (initial_state, final_state) are read and written in v-first or k-first
// layout, fp32 or bf16 each, at the sequence's state slot (ChainParams::pool); these choices are
// block-uniform branches around the loads and stores, outside the chunk loop.
//
// The one run-time choice left is SegmentMapsPass's P or Q, by the block's grid z (one launch
// makes both maps of every segment); the kernel then runs one of its two chunk loops (U0 = 0 or
// U0 = Av v), each resolved at compile time.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>

#include <cuda/atomic>

#include "sm90/common/bf16.cuh"
#include "sm90/forward/kernel_shapes.h"
#include "sm90/forward/params.h"

namespace flash_kda::sm90 {

/// The chunks one block walks: chunks [c_begin, c_end) of sequence n (tokens seq_begin ..
/// seq_begin + seq_len, first slot `first`), and, for the segment maps, which map (part).
struct ChainWork {
  int64_t slot_base;  // the slot of the first record in p.records
  int64_t n;
  int64_t seg;
  int part;  // SegmentMapsPass: 0 = P (from X = I, U0 = 0), 1 = Q (from X = 0); else 0
  int64_t state_slot;  // the slot of n's states (StatePool::slot); -1: padded, skipped
  int64_t first, seq_begin, seq_len, num_chunks;
  int64_t c_begin, c_end;
};

/// The state as this lane holds it: s[nt][*] is S^T rows v0 + g and v0 + g + 8, columns
/// k = nt*8 + 2*t4 + {0, 1} (m16n8 accumulator layout).
using StateRegs = float[kHeadDim / 8][4];

/// Calls f(nt, half, v, k) for each pair of state elements this lane holds: s[nt][2 half] and
/// s[nt][2 half + 1] are S^T[v][k] and S^T[v][k + 1].
template <class F>
__device__ __forceinline__ void for_each_state_pair(int v0, int g, int t4, F&& f) {
#pragma unroll
  for (int nt = 0; nt < kHeadDim / 8; ++nt)
#pragma unroll
    for (int half = 0; half < 2; ++half) f(nt, half, v0 + g + 8 * half, nt * 8 + 2 * t4);
}

/// This lane's part of the caller's state at element offset `base` (one [V][K] or [K][V] head
/// state; fp32 or bf16) into s. v-first: S^T[v][k], S^T[v][k + 1] are adjacent, one 8-byte or
/// 4-byte load. k-first: they are S[k][v] and S[k + 1][v], V apart, so each is loaded alone; the
/// 8 lanes of a row group g read 8 consecutive v of one k, so a warp's load touches four whole
/// 32-byte sectors (fp32), or four halves (bf16, whose other halves the rows v + 8 read next).
__device__ __forceinline__ void load_state(StateRegs& s, const void* state, bool is_f32, bool k_first, int64_t base,
                                           int v0, int g, int t4) {
  if (!k_first) {
    for_each_state_pair(v0, g, t4, [&](int nt, int half, int v, int k) {
      const int64_t off = base + int64_t(v) * kHeadDim + k;
      const float2 x = is_f32 ? *reinterpret_cast<const float2*>(static_cast<const float*>(state) + off)
                              : __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(
                                    static_cast<const __nv_bfloat16*>(state) + off));
      s[nt][2 * half] = x.x;
      s[nt][2 * half + 1] = x.y;
    });
  } else {
    for_each_state_pair(v0, g, t4, [&](int nt, int half, int v, int k) {
      const int64_t off = base + int64_t(k) * kHeadDim + v;
      s[nt][2 * half] = load_f(state, off, is_f32);
      s[nt][2 * half + 1] = load_f(state, off + kHeadDim, is_f32);
    });
  }
}

/// Two adjacent elements of a v-first final state ([.., HV, V, K], fp32 or bf16) at element
/// offset `off`.
__device__ __forceinline__ void store_state_pair(void* state, bool is_f32, int64_t off, float2 x) {
  if (is_f32)
    *reinterpret_cast<float2*>(static_cast<float*>(state) + off) = x;
  else
    *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(state) + off) = __floats2bfloat162_rn(x.x, x.y);
}

/// One element of a final state at element offset `off`, rounded to its dtype.
__device__ __forceinline__ void store_state_elem(void* state, bool is_f32, int64_t off, float x) {
  if (is_f32)
    static_cast<float*>(state)[off] = x;
  else
    static_cast<__nv_bfloat16*>(state)[off] = __float2bfloat16_rn(x);
}

/// This lane's part of s into the caller's state at element offset `base` (the layouts and
/// access pattern of load_state).
__device__ __forceinline__ void store_state(void* state, bool is_f32, bool k_first, int64_t base, const StateRegs& s,
                                            int v0, int g, int t4) {
  if (!k_first) {
    for_each_state_pair(v0, g, t4, [&](int nt, int half, int v, int k) {
      store_state_pair(state, is_f32, base + int64_t(v) * kHeadDim + k, make_float2(s[nt][2 * half], s[nt][2 * half + 1]));
    });
  } else {
    for_each_state_pair(v0, g, t4, [&](int nt, int half, int v, int k) {
      const int64_t off = base + int64_t(k) * kHeadDim + v;
      store_state_elem(state, is_f32, off, s[nt][2 * half]);
      store_state_elem(state, is_f32, off + kHeadDim, s[nt][2 * half + 1]);
    });
  }
}

struct WindowPass {
  using Params = WindowParams;
  static constexpr bool kWritesOut = true;
  /// Whether this block loads v (U0 = Av v): every block but those of the P maps.
  static __device__ __forceinline__ bool uses_v(const ChainWork&) { return true; }

  /// Pipelined windows: this warp's reads of the records and carry and its writes of out, carry
  /// and final state are done (WindowParams::done_out). Every exit of a consumer warp passes
  /// here once; the producer warp's loads complete before the consumers' last products.
  template <int NW>
  static __device__ __forceinline__ void signal_done(const Params& p, int warp, int lane) {
    if (p.done_out == nullptr || warp >= NW) return;
    __syncwarp();
    if (lane == 0)  // release: orders the warp's writes (made the lane's by __syncwarp) before it
      cuda::atomic_ref<unsigned, cuda::thread_scope_device>(*p.done_out).fetch_add(1u, cuda::memory_order_release);
  }

  /// The window's sequences are consecutive: block x takes the x-th one from the first.
  template <int NW>
  static __device__ __forceinline__ bool locate(const Params& p, ChainWork& w) {
    w.slot_base = p.slot_begin;
    w.n = p.seqs.seq_of_slot(p.slot_begin) + blockIdx.x;
    w.seg = 0;
    w.part = 0;
    if (w.n >= p.seqs.num_seqs) return false;
    const SeqIndex::Span span = p.seqs.span(w.n);
    w.first = span.first_slot, w.seq_begin = span.begin, w.seq_len = span.length;
    w.num_chunks = (w.seq_len + kChunk - 1) / kChunk;
    const int64_t owned_end = w.first + (w.num_chunks > 0 ? w.num_chunks : 1);  // an empty sequence owns one slot
    if (owned_end <= p.slot_begin || w.first >= p.slot_end) return false;
    w.c_begin = p.slot_begin > w.first ? p.slot_begin - w.first : 0;
    w.c_end = min(w.num_chunks, p.slot_end - w.first);
    return true;
  }

  /// The previous window of a pipelined call may still be writing the carry: it is read past
  /// wait_previous; every other start state is read early, beside stage 1's tail.
  static __device__ __forceinline__ bool late_start(const Params& p, const ChainWork& w) {
    return w.c_begin > 0 && p.done_in != nullptr;
  }

  /// The carry of the window before, or the initial state at the sequence's slot, or zero
  /// (no initial_state, or a padded pool entry).
  template <int NW>
  static __device__ __forceinline__ void load_start(const Params& p, const ChainWork& w, StateRegs& s, int v0, int g,
                                                    int t4) {
    if (w.c_begin > 0) {
      for_each_state_pair(v0, g, t4, [&](int nt, int half, int v, int k) {
        const float2 x =
            *reinterpret_cast<const float2*>(p.carry_in + (int64_t(blockIdx.y) * kHeadDim + v) * kHeadDim + k);
        s[nt][2 * half] = x.x;
        s[nt][2 * half + 1] = x.y;
      });
    } else if (p.initial_state != nullptr && w.state_slot >= 0) {
      load_state(s, p.initial_state, p.initial_is_f32, p.state_k_first,
                 state_offset(w.state_slot, blockIdx.y, p.value_heads), v0, g, t4);
    } else {
      for_each_state_pair(v0, g, t4, [&](int nt, int half, int, int) { s[nt][2 * half] = s[nt][2 * half + 1] = 0.f; });
    }
  }

  /// Pipelined windows: stage 1 of this window does not wait for the previous window's pass,
  /// so its completion says nothing of it; wait for that grid's warps here (they are all
  /// resident or done: this grid launched after its stage 1 launched, which launched after
  /// every block of that grid had passed this point). Then the next window's stage 1 may start:
  /// the record buffer it fills was last read by that grid.
  static __device__ __forceinline__ void wait_previous(const Params& p, int tid) {
    if (p.done_in != nullptr) {
      if (tid == 0) {
        cuda::atomic_ref<unsigned, cuda::thread_scope_device> done(*p.done_in);
        while (done.load(cuda::memory_order_acquire) < p.done_expected) __nanosleep(64);
      }
      __syncthreads();
    }
    if (p.done_out != nullptr) cudaTriggerProgrammaticLaunchCompletion();  // another window follows
  }

  /// The state after this window: the sequence's final state, or the carry to the next window.
  template <int NW>
  static __device__ __forceinline__ void store_end(const Params& p, const ChainWork& w, const StateRegs& s, int v0,
                                                   int g, int t4, int warp, int lane) {
    const int64_t HV = p.value_heads;
    const int hv = blockIdx.y;
    const bool done = w.c_end == w.num_chunks;
    if (done && (p.final_state == nullptr || w.state_slot < 0)) return signal_done<NW>(p, warp, lane);
    if (!done) {
      for_each_state_pair(v0, g, t4, [&](int nt, int half, int v, int k) {
        *reinterpret_cast<float2*>(p.carry_out + (int64_t(hv) * kHeadDim + v) * kHeadDim + k) =
            make_float2(s[nt][2 * half], s[nt][2 * half + 1]);
      });
    } else {
      store_state(p.final_state, p.final_is_f32, p.state_k_first, state_offset(w.state_slot, hv, HV), s, v0, g, t4);
    }
    signal_done<NW>(p, warp, lane);
  }
};

/// What both segment passes share: block x is segment x % max_segs of sequence x / max_segs
/// (one window holds every slot, so the segment alone bounds the chunks; slot 0 is sequence
/// 0's, hence no slot search).
struct SegmentPassBase {
  static __device__ __forceinline__ bool uses_v(const ChainWork&) { return true; }
  template <int NW>
  static __device__ __forceinline__ void signal_done(const SegmentParams&, int, int) {}
  static __device__ __forceinline__ bool late_start(const SegmentParams&, const ChainWork&) { return false; }
  static __device__ __forceinline__ void wait_previous(const SegmentParams&, int) {}

  /// `skip_last`: the last segment's map is never used (the scan stops before it).
  static __device__ __forceinline__ bool locate_segment(const SegmentParams& p, ChainWork& w, bool skip_last) {
    w.slot_base = 0;
    w.n = blockIdx.x / p.max_segs;
    w.seg = blockIdx.x % p.max_segs;
    if (w.n >= p.seqs.num_seqs) return false;
    const SeqIndex::Span span = p.seqs.span(w.n);
    w.first = span.first_slot, w.seq_begin = span.begin, w.seq_len = span.length;
    w.num_chunks = (w.seq_len + kChunk - 1) / kChunk;
    const int64_t num_segs = w.num_chunks > 0 ? (w.num_chunks + p.seg_len - 1) / p.seg_len : 1;
    if (w.seg >= num_segs || (skip_last && w.seg == num_segs - 1)) return false;
    w.c_begin = w.seg * p.seg_len;
    w.c_end = min(w.num_chunks, w.c_begin + p.seg_len);
    return true;
  }
};

struct SegmentMapsPass : SegmentPassBase {
  using Params = SegmentMapsParams;
  static constexpr bool kWritesOut = false;

  template <int NW>
  static __device__ __forceinline__ bool locate(const Params& p, ChainWork& w) {
    w.part = blockIdx.z / recurrence_column_blocks(NW);
    return locate_segment(p, w, true);
  }

  /// P: U0 = 0 (the map's linear part has no input term), so v is not loaded.
  static __device__ __forceinline__ bool uses_v(const ChainWork& w) { return w.part != 0; }

  template <int NW>
  static __device__ __forceinline__ void load_start(const Params&, const ChainWork& w, StateRegs& s, int v0, int g,
                                                    int t4) {
    for_each_state_pair(v0, g, t4, [&](int nt, int half, int v, int k) {
      float2 x = make_float2(0.f, 0.f);
      if (w.part == 0) x = make_float2(v == k ? 1.f : 0.f, v == k + 1 ? 1.f : 0.f);
      s[nt][2 * half] = x.x;
      s[nt][2 * half + 1] = x.y;
    });
  }

  template <int NW>
  static __device__ __forceinline__ void store_end(const Params& p, const ChainWork& w, const StateRegs& s, int v0,
                                                   int g, int t4, int, int) {
    // Written out rather than through for_each_state_pair: that form (offset v * kHeadDim + k
    // per pair) compiles to ~120 more instructions in this pass.
    float* dst = p.seg_maps + seg_map_offset(w.n, w.seg, blockIdx.y, w.part, p.max_segs, p.value_heads);
#pragma unroll
    for (int nt = 0; nt < kHeadDim / 8; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        *reinterpret_cast<float2*>(dst + (v0 + g + 8 * half) * kHeadDim + nt * 8 + 2 * t4) =
            make_float2(s[nt][2 * half], s[nt][2 * half + 1]);
  }
};

struct SegmentFinishPass : SegmentPassBase {
  using Params = SegmentFinishParams;
  static constexpr bool kWritesOut = true;

  template <int NW>
  static __device__ __forceinline__ bool locate(const Params& p, ChainWork& w) {
    w.part = 0;
    return locate_segment(p, w, false);
  }

  /// The scan wrote every segment's start state, the first one's included (so this pass never
  /// reads initial_state, which may be the final_state another block writes).
  template <int NW>
  static __device__ __forceinline__ void load_start(const Params& p, const ChainWork& w, StateRegs& s, int v0, int g,
                                                    int t4) {
    const float* seg_state = p.seg_states + seg_state_offset(w.n, w.seg, blockIdx.y, p.max_segs, p.value_heads);
    for_each_state_pair(v0, g, t4, [&](int nt, int half, int v, int k) {
      const float2 x = *reinterpret_cast<const float2*>(seg_state + v * kHeadDim + k);
      s[nt][2 * half] = x.x;
      s[nt][2 * half + 1] = x.y;
    });
  }

  /// Only the last segment's end state is kept: the scan made the others.
  template <int NW>
  static __device__ __forceinline__ void store_end(const Params& p, const ChainWork& w, const StateRegs& s, int v0,
                                                   int g, int t4, int, int) {
    if (w.c_end != w.num_chunks || p.final_state == nullptr || w.state_slot < 0) return;
    store_state(p.final_state, p.final_is_f32, p.state_k_first, state_offset(w.state_slot, blockIdx.y, p.value_heads),
                s, v0, g, t4);
  }
};

}  // namespace flash_kda::sm90
