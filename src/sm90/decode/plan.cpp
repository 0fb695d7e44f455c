// The decode kernel's launch decisions (plan.h says what and why).
#include "sm90/decode/plan.h"

#include <algorithm>

namespace flash_kda::sm90 {

DecodePlan make_decode_plan(const ProblemShape& p, const DeviceProps& device) {
  DecodePlan plan;
  const int64_t heads = p.num_seqs * p.value_heads;
  const int64_t sms = std::max(1, device.num_sms);
  // The state traffic is the same either way; 2-warp blocks only halve the block's share of
  // the staging (q, k, gate), which 4-warp blocks amortise over more columns.
  plan.warps = heads * 4 < 2 * sms ? 2 : 4;
  plan.slices = kDecodeHeadDim / (plan.warps * kDecodeWarpCols);
  plan.token_group = p.varlen ? kDecodeVarlenGroup : int(std::max<int64_t>(1, p.seqlen));
  plan.launch.grid_x = uint32_t(heads * plan.slices);
  plan.launch.block = uint32_t(plan.warps * 32);
  plan.launch.smem_bytes = plan.token_group * decode_token_smem_bytes(plan.warps) + 8;  // + b's padding to 8 bytes
  plan.launch.smem_attr = plan.launch.smem_bytes;
  return plan;
}

}  // namespace flash_kda::sm90
