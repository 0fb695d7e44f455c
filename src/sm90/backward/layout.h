// The backward's workspace, from the problem's shape alone (host code): which buffer lives at
// which byte offset. backward_workspace_size reports `total`; launch.cu carves the buffers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flash_kda/forward.h"
#include "sm90/backward/records.h"
#include "sm90/forward/plan.h"

namespace flash_kda::sm90::bwd {

/// Tokens per block of the gate-finish kernel: dA_log and ddt_bias are summed per such block of
/// tokens first (partials in the workspace), then over the blocks in order (reduce kernel).
inline constexpr int64_t kFinishTokens = 64;

/// Blocks of the chain per value head (chain.cu: one per 32 value columns), on grid y: the
/// backward takes at most 65535 / kChainSlices value heads (validate_backward says so).
inline constexpr int64_t kChainSlices = 4;

/// The launch options of the recompute, the forward that stores fp32 states every 16 tokens
/// (64 KB a chunk and value head). Its state pass is bound by each SM's rate of state stores, so
/// where few (sequence, value head) pairs leave most SMs idle it takes segments
/// (forward/plan.cpp), which spread the stores over more SMs: S = min(kMaxSms / pairs,
/// chunks / 8, 16) per sequence, taken when S >= 4; else the forward's plan decides. On the H200
/// the segments' 3x state-passing work costs less than the idle SMs' store bandwidth where
/// S >= 4, by a sweep that stored the states from registers; the staged store
/// (forward/inter_store.cuh) moves that balance by an amount no sweep has measured
/// (docs/performance.md, "Backward").
///
/// Only for sequences of one length (a fixed-length batch, or one sequence): the plan cuts every
/// sequence of a varlen batch by the longest possible one (T_total), so a forced count there
/// gives the shorter sequences one segment each, on the slower segment passes. The count is
/// sized for the 132-SM part, like the workspace: on a part with fewer SMs the segments' blocks
/// take more than one wave.
inline LaunchOptions recompute_options(const ProblemShape& p) {
  LaunchOptions o;
  if (p.varlen && p.num_seqs > 1) return o;
  const int64_t pairs = p.num_seqs * p.value_heads > 0 ? p.num_seqs * p.value_heads : 1;
  const int64_t chunks = (p.seqlen + 15) / 16;  // every sequence's
  int64_t segs = int64_t(kMaxSms) / pairs;
  if (chunks / 8 < segs) segs = chunks / 8;
  if (segs > 16) segs = 16;
  if (segs >= 4) o.segments = int(segs);
  return o;
}

/// How the reverse chain (chain.cu) cuts each sequence: seg_len chunks a segment and max_segs
/// segments, or seg_len = 0 for one block walking the whole sequence.
struct ChainSegments {
  int64_t seg_len = 0, max_segs = 1;
};

/// The chain's segments. A chain block's step is a dependent path of ~2 us (one block an SM) or
/// ~3.6 us (two), so where few (sequence, value head) pairs leave SMs idle and each walks many
/// chunks, segments give the walk to more blocks: the transition and input maps of segments
/// 1 .. S - 1 (two launches), the forward's segment scan for every segment's end, then each
/// segment from its end. That is ~2.7 whole steps per segment step at two blocks an SM (the
/// transition map's steps, without d out, cost ~0.7 of one), so it pays from S ~5 on: S =
/// min(2 kMaxSms / blocks, chunks / 32, 16), taken when S >= 8 (on the H200 the chain takes
/// 1.13 ms in 4 segments at h16_fixed_8192 against the whole walk's 1.02, 2.24 in 8 at
/// h8_fixed_32768 against 4.03, 2.27 in 16 at h4_fixed_65536 against 8.59; docs/performance.md
/// "Backward"). A segment of fewer than 32 chunks leaves the scan's
/// ~4 us a segment a large share. Fixed-length batches and single sequences only (one count
/// fits every sequence), like recompute_options; sized for the 132-SM part like it, so on a
/// part with fewer SMs the segments' blocks take more waves.
inline ChainSegments chain_segments(const ProblemShape& p) {
  ChainSegments c;
  if (p.varlen && p.num_seqs > 1) return c;
  const int64_t blocks = p.num_seqs * p.value_heads * kChainSlices;
  const int64_t chunks = (p.seqlen + 15) / 16;
  int64_t segs = blocks > 0 ? 2 * int64_t(kMaxSms) / blocks : 0;
  if (chunks / 32 < segs) segs = chunks / 32;
  if (segs > 16) segs = 16;
  if (segs < 8) return c;
  c.seg_len = (chunks + segs - 1) / segs;
  c.max_segs = (chunks + c.seg_len - 1) / c.seg_len;
  return c;
}

/// Byte offsets of every workspace buffer (each 256-byte aligned) and the total. R = N +
/// ceil(T_total / 16) chunk rows: chunk c of sequence n is row n + floor(start_n / 16) + c
/// (SeqIndex's slot), so rows never collide and need no scan over the sequences.
///
///   offsets    int64 [N + 1]          row of each sequence's first chunk (the forward's
///                                     intermediate_offsets)
///   states     fp32  [R, HV, K x V]   state before each chunk (the recompute's intermediate
///                                     states, in the call's state_layout)
///   dstates    fp32  [R, HV, K, V]    gradient of the state after each chunk (k-first)
///   out        bf16  [T_total, HV, V] the recompute's output (never read)
///   q_hat, k_hat fp32 [T_total, H, K] q and k after the L2 norm (as read without it)
///   a          fp32  [T_total, HV, K] log decay;   b fp32 [T_total, HV] beta activation
///   dq_hat, dk_hat, da fp32 [T_total, HV, K];       db fp32 [T_total, HV]
///   part_dt, part_alog fp32 [ceil(T_total / kFinishTokens), HV, K]
///   records    fp32  [R, HV, kRecordFloats]  every chunk's record (records.h)
///   chain_maps fp32  [N, S - 1, HV, 2, K x K]  with chain segments (chain_segments, S =
///                                     max_segs): segment s's transition and input maps,
///                                     transposed, at index S - 1 - s (the forward scan's
///                                     seg_maps, which it walks from index 0)
///   chain_ends fp32  [N, S, HV, V x K]   dS at each segment's end, transposed, index S - 1 - s
///                                     (the scan's seg_states); empty without segments
///   forward    the forward's own workspace (forward_workspace_size)
struct BackwardLayout {
  int64_t rows = 0;  // R
  size_t offsets = 0, states = 0, dstates = 0, out = 0, q_hat = 0, k_hat = 0, a = 0, b = 0;
  size_t dq_hat = 0, dk_hat = 0, da = 0, db = 0, part_dt = 0, part_alog = 0, records = 0, forward = 0;
  size_t chain_maps = 0, chain_ends = 0;
  ChainSegments chain;
  size_t forward_bytes = 0;
  size_t total = 0;
};

/// The layout for a validated problem; `forward_bytes` is the forward's workspace for it, `chain`
/// the chain's segments (chain_segments(p) but in the CPU model's tests, which choose them).
inline BackwardLayout backward_layout(const ProblemShape& p, size_t forward_bytes, ChainSegments chain) {
  const uint64_t TT = uint64_t(p.batch) * uint64_t(p.seqlen), N = uint64_t(p.num_seqs);
  const uint64_t H = uint64_t(p.heads), HV = uint64_t(p.value_heads), K = uint64_t(p.head_dim_k),
                 V = uint64_t(p.head_dim_v);
  BackwardLayout l;
  l.rows = int64_t(N + (TT + 15) / 16);
  const uint64_t R = uint64_t(l.rows);
  const uint64_t tiles = (TT + uint64_t(kFinishTokens) - 1) / uint64_t(kFinishTokens);
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t here = at;
    at += (bytes + 255) / 256 * 256;
    return here;
  };
  l.offsets = take((N + 1) * 8);
  l.states = take(R * HV * K * V * 4);
  l.dstates = take(R * HV * K * V * 4);
  l.out = take(TT * HV * V * 2);
  l.q_hat = take(TT * H * K * 4);
  l.k_hat = take(TT * H * K * 4);
  l.a = take(TT * HV * K * 4);
  l.b = take(TT * HV * 4);
  l.dq_hat = take(TT * HV * K * 4);
  l.dk_hat = take(TT * HV * K * 4);
  l.da = take(TT * HV * K * 4);
  l.db = take(TT * HV * 4);
  l.part_dt = take(tiles * HV * K * 4);
  l.part_alog = take(tiles * HV * K * 4);
  l.records = take(R * HV * uint64_t(kRecordFloats) * 4);
  l.chain = chain;
  if (l.chain.seg_len > 0) {
    const uint64_t S = uint64_t(l.chain.max_segs);
    l.chain_maps = take(N * (S - 1) * HV * 2 * K * K * 4);
    l.chain_ends = take(N * S * HV * K * V * 4);
  }
  l.forward_bytes = forward_bytes;
  l.forward = take(forward_bytes);
  l.total = at;
  return l;
}
inline BackwardLayout backward_layout(const ProblemShape& p, size_t forward_bytes) {
  return backward_layout(p, forward_bytes, chain_segments(p));
}

}  // namespace flash_kda::sm90::bwd
