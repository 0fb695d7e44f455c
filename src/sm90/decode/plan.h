// The launch plan of the sm_90a decode kernel: every launch decision of a call in one value,
// made by one host function (make_decode_plan) from the problem and the SM count of the
// stream's context. decode.cu only executes it. Host code: unit-tested without a GPU
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
/// (fixed length: all T <= 16 at once).
inline constexpr int kDecodeVarlenGroup = 4;

/// Bytes of shared memory of one staged token: q, k and decay (K floats each), the block's v
/// columns (warps * 8 floats), b, and the pool slot it is written to (the b array is padded to
/// 8 bytes once per block).
constexpr int decode_token_smem_bytes(int warps) {
  return (3 * kDecodeHeadDim + warps * kDecodeWarpCols) * 4 + 4 + 8;
}

/// What one decode launch does.
struct DecodePlan {
  int warps = 4;         ///< warps per block: the block owns warps * 8 value columns of one (sequence, value head)
  int slices = 4;        ///< blocks per (sequence, value head): 128 / (warps * 8)
  int token_group = 1;   ///< tokens staged per round in shared memory (T for fixed length, else kDecodeVarlenGroup)
  KernelLaunch launch;   ///< grid (N * HV * slices blocks in x), block, shared memory
};

/// The plan for a validated decode problem on a context of `device.num_sms` SMs: blocks of 4
/// warps (32 value columns), or of 2 (16 columns) when 4-warp blocks would leave SMs without
/// two blocks each, so that small batches spread over every SM.
DecodePlan make_decode_plan(const ProblemShape& p, const DeviceProps& device);

}  // namespace flash_kda::sm90
