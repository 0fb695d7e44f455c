// The launch plan of the sm_90a decode kernels: every launch decision of a call in one value,
// made by one host function (make_decode_plan) from the problem, the pool dtype, the SM count
// of the stream's context and the caller's kernel request. decode.cu only executes it. Host
// code: unit-tested without a GPU (tests/cpp/test_decode_plan.cpp).
//
// Two kernels, the same semantics (include/flash_kda/decode.h):
// - persistent (decode.cu): a grid of at most the resident blocks, each looping over work
//   items with the next items' state slices copied into shared memory by cp.async while it
//   computes one. Its v-first registers (~150 a lane) allow 3 blocks of 128 threads per SM,
//   and its state bytes in flight are what its shared-memory stages hold (~16 KB a block).
// - direct (direct.cu): one block per work item; its first instructions issue every load of
//   its state slice straight into registers (16-byte vectors), then the token inputs are
//   staged and the tokens run on the registers. At <= 128 registers a lane (4 blocks of 128
//   threads per SM; ptxas needs ~115-140 without a bound and spills below ~100) an SM holds
//   4 x 16 KB = 64 KB of fp32 state reads (32 KB bf16) in flight, against the ~32 KB that
//   Little's law asks for (4.25 TB/s x ~1 us / 132 SMs), with no
//   shared-memory round trip of the state and no pipeline prologue; the block scheduler
//   replaces the persistent loop.
// The auto rule (here and in plan.cpp only), from one H200 sweep of both kernels (v-first,
// graph-timed; docs/notes/2026-12-01_breadth-and-decode.md): the persistent kernel for one
// token a sequence at fixed length once N * HV >= kDecodePersistentHeads (it is 3-15% faster
// there: 256 x 32 fp32 359 against 396 us, 1024 x 96 bf16 2868 against 3424 us), the direct
// kernel otherwise (up to 1.7x faster for small batches, where both are one latency chain
// (slot index, state load, a token, the store) that the direct kernel spreads over more,
// smaller blocks: 32 x 8 fp32 11.0 against 18.9 us; and 5-20% faster for T >= 2, whose tokens
// the persistent kernel stages one round trip each).
#pragma once

#include <cstdint>

#include "flash_kda/decode.h"
#include "flash_kda/forward.h"
#include "sm90/common/device_props.h"
#include "sm90/common/kernel_launch.h"

namespace flash_kda::sm90 {

/// Value columns one warp owns (all K = 128 key rows of them): 32 state elements per lane.
inline constexpr int kDecodeWarpCols = 8;
/// Head dims of the kernel (K = V).
inline constexpr int kDecodeHeadDim = 128;
/// Tokens whose q, k, decay, v and b a block stages in shared memory at once for a varlen batch
/// (fixed length: all T <= 16 at once). At least the most warps of a block (4): a sequence
/// longer than one group then has every warp stage a token of its first group, which is where
/// a warp's copy of the gate parameters comes from (decode.cu).
inline constexpr int kDecodeVarlenGroup = 4;
/// The largest fixed-length T the kernel stages in one group (validate_decode's limit).
inline constexpr int kDecodeMaxTokens = 16;
/// 4-warp blocks per SM the kernel's registers are built for (__launch_bounds__(128, n)):
/// v-first's 32 distinct keys per lane take more registers than k-first's (~150 against ~128),
/// so 3 for v-first and 4 for k-first. The state bytes in flight do not depend on it: the state
/// copies wait in shared memory (decode_stages below).
constexpr int decode_min_blocks(StateLayout layout) { return layout == StateLayout::VFirst ? 3 : 4; }
/// Registers per lane those launch bounds allow (65536 per SM, allocated in units of 8 per lane).
constexpr int decode_max_regs(StateLayout layout) { return (65536 / (128 * decode_min_blocks(layout))) & ~7; }
/// Shared memory of one SM on sm_90 (228 KB) and what the runtime reserves per block (1 KB).
inline constexpr int kSm90SmemPerSm = 228 * 1024;
inline constexpr int kSm90SmemReservedPerBlock = 1024;

/// Work items whose state copies are in flight behind the one a block computes: 1 for fp32 pools
/// (16 KB per 4-warp block), 2 for bf16 pools (8 KB each), so that a block keeps ~16 KB of state
/// reads in flight whatever the pool dtype. Twice as many (2 and 4) measured 0-4% slower on
/// every point of the sweep (docs/notes/2026-12-01_breadth-and-decode.md): the bytes in flight
/// are not what holds the kernel at ~1.4x of the floor. `state_bytes`: bytes per pool element
/// (4 or 2).
constexpr int decode_stages(int state_bytes) { return state_bytes == 2 ? 2 : 1; }

/// N * HV from which the auto rule takes the persistent kernel for T = 1 (the rule above).
inline constexpr int64_t kDecodePersistentHeads = 2048;

/// Bytes of one work item's header (decode.cu's ItemHead: four int64 and four int32).
inline constexpr int kDecodeItemHeadBytes = 48;

/// Bytes of one staging slot: `tg` tokens' q, k and decay (K floats each), the block's v columns
/// (warps * 8 floats), each warp's copy of the gate parameters (dt_bias row and A_log, 132
/// floats), b (padded to an even count), the pool slot each token's state goes to (int64) and
/// each warp's copy of the item's header; rounded up to 16 bytes so that every slot starts
/// 16-byte aligned.
constexpr int decode_slot_bytes(int warps, int tg) {
  const int floats = tg * (3 * kDecodeHeadDim + warps * kDecodeWarpCols) + warps * (kDecodeHeadDim + 4) + ((tg + 1) & ~1);
  return (floats * 4 + tg * 8 + warps * kDecodeItemHeadBytes + 15) & ~15;
}

/// Bytes of one state slot: the block's 128 x (warps * 8) slice of a state at the pool dtype.
constexpr int decode_state_slot_bytes(int warps, int state_bytes) {
  return warps * kDecodeWarpCols * kDecodeHeadDim * state_bytes;
}

/// Dynamic shared memory of a block: decode_stages state slots and one staging slot more (the
/// slot of the item being computed stays readable while the next items' copies land).
constexpr int decode_smem_bytes(int warps, int tg, int state_bytes) {
  const int stages = decode_stages(state_bytes);
  return stages * decode_state_slot_bytes(warps, state_bytes) + (stages + 1) * decode_slot_bytes(warps, tg);
}

/// Direct kernel, v-first [V, K]: value rows one warp owns (16-byte vectors along K: an fp32
/// lane holds keys 4 lane .. + 3 of 8 rows, a bf16 lane keys 8 (lane % 16) .. + 7 of 4 rows).
inline constexpr int kDirectWarpRows = 8;
/// Direct kernel, k-first [K, V]: value columns one block owns (4 warps of 32 key rows each).
inline constexpr int kDirectBlockCols = 32;
/// Direct kernel: 128-thread blocks per SM its registers are built for (__launch_bounds__(128,
/// 4): <= 128 registers a lane, no spills; tighter bounds spill, see the header comment).
inline constexpr int kDirectMinBlocks = 4;
/// Direct kernel: bytes of k-first's cross-warp partial sums (2 token parities x 4 warps x
/// 64 floats).
inline constexpr int kDirectReduceBytes = 2 * 4 * 64 * 4;

/// Direct kernel's dynamic shared memory: `tg` tokens' q, k and decay (K floats each), the
/// block's `block_cols` value columns of v, b and k.q (an even count), each token's pool slot
/// (int64), and for k-first the partial sums first; rounded up to 16 bytes.
constexpr int direct_smem_bytes(int block_cols, int tg, bool k_first) {
  const int floats = tg * (3 * kDecodeHeadDim + block_cols) + ((2 * tg + 1) & ~1);
  return ((k_first ? kDirectReduceBytes : 0) + floats * 4 + tg * 8 + 15) & ~15;
}

/// What one decode launch does.
struct DecodePlan {
  DecodeKernel kernel = DecodeKernel::Persistent;  ///< the kernel launched (never Auto)
  /// Value columns (v-first: value rows) of one work item: persistent warps * 8; direct v-first
  /// warps * 8, k-first 32.
  int block_cols = 32;
  int warps = 4;          ///< warps per block (direct k-first: always 4, each 32 of the key rows)
  int slices = 4;         ///< work items per (sequence, value head): 128 / block_cols
  int token_group = 1;    ///< tokens staged per round in shared memory (T for fixed length, else kDecodeVarlenGroup)
  int blocks_per_sm = 4;  ///< resident blocks per SM the registers and shared memory allow
  int64_t items = 0;      ///< work items: N * HV * slices
  /// grid (persistent: min(items, SMs * blocks_per_sm) blocks; direct: one block per item, at
  /// most 2^31 - 1, the kernel loops past that), block, shared memory
  KernelLaunch launch;
};

/// The plan for a validated decode problem with a pool (or initial/final state) of
/// `state_bytes` bytes per element (4: fp32, 2: bf16; no state: 4) in `layout`, on a context of
/// `device.num_sms` SMs, running `kernel` (Auto: the rule above).
/// Persistent: blocks of 4 warps (32 value columns), or of 2 (16 columns) when 4-warp blocks
/// would leave SMs without two blocks each, so that small batches spread over every SM; a
/// persistent grid of at most as many blocks as fit on the SMs at once, each looping over work
/// items with the next items' state copies in flight. smem_attr is the kernel's largest
/// request (T = 16, 4 warps) so that the attribute is the same on every call.
/// Direct: one block per item. v-first blocks of 4 warps (32 value rows: 4 items per head)
/// while N * HV * 4 >= 2 * SMs, else of 2 warps (8 items per head) while N * HV * 8 >= 2 * SMs,
/// else of 1 warp (16 items per head): the grid then has at least ~2 blocks a SM or is a
/// head's finest split (1 x 32 heads: 512 one-warp blocks, ~4 a SM, 8 rows = 4 KB fp32 each,
/// instead of 128 four-warp blocks on 128 of the 132 SMs); but at least 2 warps for T = 2 and
/// 4 for T >= 3 or varlen, since each warp stages one token at a time (one dependent round
/// trip of its q, k, g, v loads per token). k-first blocks are always 4 warps
/// x 32 columns (4 items per head). The work per warp is the same in every split (8 value rows
/// or 32 key rows of 32 columns); the split only spreads the warps over the SMs.
DecodePlan make_decode_plan(const ProblemShape& p, const DeviceProps& device, int state_bytes, StateLayout layout,
                            DecodeKernel kernel = DecodeKernel::Auto);

}  // namespace flash_kda::sm90
