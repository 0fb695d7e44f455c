// The launch plan of the sm_90a decode kernel: every launch decision of a call in one value,
// made by one host function (make_decode_plan) from the problem, the pool dtype and the SM count
// of the stream's context. decode.cu only executes it. Host code: unit-tested without a GPU
// (tests/cpp/test_decode_plan.cpp).
#pragma once

#include <cstdint>

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
/// copies wait in shared memory (3 blocks keep 48 KB of reads in flight per SM).
constexpr int decode_min_blocks(StateLayout layout) { return layout == StateLayout::VFirst ? 3 : 4; }
/// Registers per lane those launch bounds allow (65536 per SM, allocated in units of 8 per lane).
constexpr int decode_max_regs(StateLayout layout) { return (65536 / (128 * decode_min_blocks(layout))) & ~7; }
/// Shared memory of one SM on sm_90 (228 KB) and what the runtime reserves per block (1 KB).
inline constexpr int kSm90SmemPerSm = 228 * 1024;
inline constexpr int kSm90SmemReservedPerBlock = 1024;

/// Work items whose state copies are in flight behind the one a block computes: 1 for fp32 pools
/// (16 KB per 4-warp block), 2 for bf16 pools (8 KB each), so that a block keeps ~16 KB of state
/// reads in flight whatever the pool dtype. `state_bytes`: bytes per pool element (4 or 2).
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

/// What one decode launch does.
struct DecodePlan {
  int warps = 4;          ///< warps per block: the block owns warps * 8 value columns of one (sequence, value head)
  int slices = 4;         ///< work items per (sequence, value head): 128 / (warps * 8)
  int token_group = 1;    ///< tokens staged per round in shared memory (T for fixed length, else kDecodeVarlenGroup)
  int blocks_per_sm = 4;  ///< resident blocks per SM the registers and shared memory allow
  int64_t items = 0;      ///< work items: N * HV * slices
  KernelLaunch launch;    ///< grid (min(items, SMs * blocks_per_sm) persistent blocks in x), block, shared memory
};

/// The plan for a validated decode problem with a pool (or initial/final state) of
/// `state_bytes` bytes per element (4: fp32, 2: bf16; no state: 4) in `layout`, on a context of
/// `device.num_sms` SMs: blocks of 4 warps (32 value columns), or of 2 (16 columns) when 4-warp
/// blocks would leave SMs without two blocks each, so that small batches spread over every SM;
/// a persistent grid of at most as many blocks as fit on the SMs at once, each looping over
/// work items with the next items' state copies in flight. smem_attr is the kernel's largest
/// request (T = 16, 4 warps) so that the attribute is the same on every call.
DecodePlan make_decode_plan(const ProblemShape& p, const DeviceProps& device, int state_bytes, StateLayout layout);

}  // namespace flash_kda::sm90
