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
// - direct (direct_warp.cu): one block per work item, its state slice loaded straight into
//   registers with 16-byte loads at the block's first instructions; every warp runs its own
//   value rows (v-first) or columns (k-first, the warp-column form) with no block barrier (8,
//   or 16 for a bf16 pool with one token a sequence or in the split form: 4 KB of state a warp).
// - direct, k-first row blocks (kfirst_rows.cu): one block per C value columns (one 128-byte
//   line of a key row: 32 fp32, 64 bf16) of a head, its KW warps splitting the 128 keys, the
//   sums over the keys exchanged through shared memory once a token. A warp-column warp reads
//   16 or 32 rows 512 (256) bytes apart per load instruction, four times the L2 line requests
//   of the bytes (1.37-2.09x of the HBM floor on the H200 where v-first sits at 1.04-1.2x); a
//   row-block warp reads whole lines of four rows.
// The auto rule (here and in plan.cpp only): always the direct kernel. In one H200 sweep
// (graph-timed; docs/notes/2026-12-01_breadth-and-decode.md, its 48-point table) the direct
// kernel took 0.44-1.0x of the persistent kernel's time at 47 of the 48 v-first points
// (1024 x 32 T = 1: fp32 1094 against 1402 us, bf16 575 against 966 us; 1.04x at 1 x 8 heads,
// T = 2, bf16: 4.5 against 4.4 us), and the persistent kernel is slower at each of the 12
// k-first points measured (T = 1, N = 1 to 1024, 32 and 96 heads; 1.9-4.1x). It stays
// available by DecodeLaunchOptions::kernel, for comparison. A k-first fp32 pool or one-token
// bf16 pool takes the row-block form (it reads whole L2 lines; the warp-column form's line
// requests hold those pools far from the floor); a bf16 pool with more tokens the row blocks'
// split form from half a grid of them, the warp columns below (kfirst_rows_serves);
// DecodeKernel::DirectColumns forces the warp columns for the A/B, and DirectRows the row
// blocks.
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

/// Direct kernel: the rows (v-first [V, K]) or columns (k-first [K, V]) of one fp32 register
/// tile of a warp, all 128 keys of them (32 state elements a lane; direct_warp.cu's tiles).
inline constexpr int kDirectWarpTile = 8;
/// Direct kernel: value rows (columns) one warp owns for a pool of `state_bytes` bytes per
/// element, in either layout: 8, or 16 for a bf16 pool in a wide tile (`wide`): 4 KB of state a
/// warp, as fp32's 8, kept as the loaded vectors with one token a sequence (direct_warp.cu's
/// packed form) and half in shared memory with more (its split form).
constexpr int direct_warp_tile(int state_bytes, bool wide) {
  return state_bytes == 2 && wide ? 2 * kDirectWarpTile : kDirectWarpTile;
}
/// Direct kernel, bf16 pool: wide tiles (16 a warp) once a call has at least this many of them
/// per SM (N * HV * 8 >= this * SMs), which is where 8-row warps would not all fit on the SMs
/// at once (16 a SM: the registers of 4 blocks of 4 warps) and wide ones double the bytes in
/// flight of those that do. Below, every 8-row warp is resident from the start: 8 a warp, half
/// the work and latency of 16.
inline constexpr int kDirectWideMinWarpsPerSm = 8;
/// Direct kernel's dynamic shared memory: the split form's fp32 half of every lane's state
/// (4 KB a warp); none in the other forms.
constexpr int direct_smem_bytes(int warps, int warp_tile, int state_bytes, bool one_token) {
  return state_bytes == 2 && !one_token && warp_tile == 2 * kDirectWarpTile ? warps * 4096 : 0;
}
/// Direct kernel: 128-thread blocks per SM its registers are built for (__launch_bounds__(128,
/// 4): <= 128 registers a lane; ptxas spills a few words in the multi-token forms), but for the
/// one-token forms that direct_min_blocks gives more.
inline constexpr int kDirectMinBlocks = 4;
/// Direct kernel: the 128-thread blocks per SM a form's registers are built for. The one-token
/// forms' item is one latency chain (index, state loads, ~600 instructions, stores), so more
/// warps a SM keep more states in flight: 6 (<= 80 registers a lane, no spill) for the fp32
/// v-first warp columns and the fp32 k-first row blocks, 5 (<= 96, 8-28 bytes spilt) for the
/// bf16 k-first row blocks. The other one-token forms (bf16 warp columns, whose packed state
/// needs the registers; fp32 k-first warp columns, which spill at 80) and every multi-token
/// form keep kDirectMinBlocks, as the comment above says of their registers.
constexpr int direct_min_blocks(bool one_token, int state_bytes, StateLayout layout, bool kfirst_rows) {
  if (!one_token) return kDirectMinBlocks;
  if (kfirst_rows) return state_bytes == 4 ? 6 : 5;
  return state_bytes == 4 && layout == StateLayout::VFirst ? 6 : kDirectMinBlocks;
}

/// Direct kernel, k-first row blocks: value columns of a block, one 16-byte vector of each of 8
/// lanes along a key row (one 128-byte line): 32 for fp32 pools, 64 for bf16.
constexpr int kfirst_rows_cols(int state_bytes) { return 8 * 16 / (state_bytes == 2 ? 2 : 4); }
/// Direct kernel, k-first row blocks: warps a block splits the 128 keys over: 4, 8 keys a lane
/// (32 fp32 registers of state, or a bf16 pool's 64 elements kept as 32 registers of their bits
/// with one token a sequence, or with more as 32 fp32 registers and 32 floats of shared memory:
/// the split form).
inline constexpr int kKFirstRowsKeyWarps = 4;
/// Direct kernel, k-first: whether the row blocks serve a pool of `state_bytes` bytes per
/// element for `heads` = N * HV sequence-heads on `sms` SMs: fp32 pools and bf16 pools with one
/// token a sequence (the packed form) always; bf16 pools with more tokens (the split form: half
/// of a lane's 64 fp32 state elements in its shared-memory words) from a grid of half the SMs
/// (2 blocks a head, so 4 * heads >= sms). Below that the warp-column form's 8x as many,
/// smaller blocks (16 one-warp blocks a head against 2 of 4 warps) spread the few heads wider: on
/// the H200 (docs/notes/2026-12-02_strided-and-split-rows.md, "Decode: the split row blocks
/// against the warp columns") the split form took 0.67-0.93x of the warp columns' time at every
/// point from 64 sequence-heads up (T = 2, 4; 32 points) and 1.03-1.68x at the 8 of 32 or fewer.
constexpr bool kfirst_rows_serves(int state_bytes, bool one_token, int64_t heads, int64_t sms) {
  return state_bytes != 2 || one_token || 4 * heads >= sms;
}
/// Direct kernel, k-first row blocks: dynamic shared memory, two token-parity buffers of every
/// warp's partial (S^T k, S^T q) of each column (8 bytes) and its (|q|^2, |k|^2, k . q) (16),
/// then in the split form (`split`: bf16 pool, more than one token a sequence) the fp32 half of
/// every lane's state, half of its 128 / key_warps / 4 vectors of cols / 8 elements (at 4 key
/// warps and 64 columns: 4 vectors, 128 bytes a lane, 16 KB a block; 20.6 KB in all, under the
/// 48 KB a launch takes without an attribute, and the 4 blocks a SM the registers allow use 83
/// KB of the 228).
constexpr int kfirst_rows_smem_bytes(int key_warps, int cols, bool split) {
  const int lane_vectors = kDecodeHeadDim / key_warps / 4;  // a lane's NR
  return 2 * key_warps * (cols * 8 + 16) + (split ? key_warps * 32 * (lane_vectors / 2) * cols / 8 * 4 : 0);
}

/// What one decode launch does.
struct DecodePlan {
  DecodeKernel kernel = DecodeKernel::Persistent;  ///< the kernel launched: Persistent or Direct (never Auto, DirectColumns or DirectRows)
  /// Value columns (v-first: value rows) of one work item: persistent warps * 8; direct warps *
  /// warp_tile.
  int block_cols = 32;
  int warps = 4;          ///< warps per block
  bool one_token = false;  ///< fixed length T = 1 (direct: its own kernels)
  int warp_tile = 8;      ///< direct: value rows (columns) a warp owns (direct_warp_tile)
  bool wide = false;      ///< direct: wide tiles (bf16 pool, 16 a warp: packed or split)
  /// direct, k-first: the row-block form (kfirst_rows.cu): warps = kKFirstRowsKeyWarps, each
  /// over its share of the keys of all block_cols = kfirst_rows_cols columns (warp_tile equals
  /// block_cols, wide is false; a bf16 pool with more tokens: the split form); else the
  /// warp-column form of direct_warp.cu.
  bool kfirst_rows = false;
  int slices = 4;         ///< work items per (sequence, value head): 128 / block_cols
  int token_group = 1;    ///< tokens staged per round in shared memory (persistent: T for fixed length, else kDecodeVarlenGroup; direct stages none)
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
/// Direct: one block per item, in either layout: blocks of 4 warps while the head's 1-warp
/// items (128 / warp_tile of them) times N * HV reach 8 * SMs, else of 2 warps while they reach
/// 4 * SMs, else of 1 warp: the grid then has at least ~2 blocks a SM or is a head's finest
/// split (1 x 32 heads fp32: 512 one-warp blocks of 8 rows = 4 KB each). Every warp runs its
/// tile alone, so the split only spreads the warps over the SMs. A bf16 pool takes wide tiles
/// (16 a warp) from kDirectWideMinWarpsPerSm of them a SM.
/// Direct, k-first (`kernel` Auto or Direct), where kfirst_rows_serves (fp32 pools, one-token
/// bf16 ones, bf16 ones with more tokens from half a grid of blocks): the row-block form, blocks
/// of kKFirstRowsKeyWarps warps over kfirst_rows_cols columns, one block per item (4 or 2 items
/// a head; the split form's 20.6 KB of shared memory for bf16 pools with more tokens); the other
/// bf16 pools, and DirectColumns: the warp-column form as for v-first (which DirectColumns leaves
/// as Direct plans it). DirectRows: every k-first pool in row blocks, v-first as Direct.
/// plan.kernel is Direct for all of them.
/// Every direct launch is the programmatic dependent of the kernel before it on the stream
/// (launch.dependent): a decode step is a few microseconds of work at small batches, about as
/// long as a kernel's launch, and its blocks' launch and setup then overlap the previous
/// kernel's tail; the kernels' first step waits for that kernel's completion, so every input
/// may be its output.
DecodePlan make_decode_plan(const ProblemShape& p, const DeviceProps& device, int state_bytes, StateLayout layout,
                            DecodeKernel kernel = DecodeKernel::Auto);

}  // namespace flash_kda::sm90
