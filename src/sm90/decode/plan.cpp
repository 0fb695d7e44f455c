// The decode kernel's launch decisions (plan.h says what and why).
#include "sm90/decode/plan.h"

#include <algorithm>

namespace flash_kda::sm90 {

namespace {

// Tokens staged per round: all T (<= 16) for fixed length, kDecodeVarlenGroup for varlen.
int token_group(const ProblemShape& p) {
  return p.varlen ? kDecodeVarlenGroup : int(std::clamp<int64_t>(p.seqlen, 1, kDecodeMaxTokens));
}

// Resident blocks a SM of `threads` threads and `smem` bytes of shared memory each, with
// `by_regs` blocks allowed by the registers.
int blocks_per_sm(int threads, int smem, int by_regs) {
  const int by_smem = kSm90SmemPerSm / (smem + kSm90SmemReservedPerBlock);
  return std::max(1, std::min({by_regs, by_smem, 2048 / threads, 32}));
}

// Resident blocks of a direct kernel form whose registers are built for `min_blocks` blocks of
// 128 threads a SM (direct_min_blocks, plan.h), its shared memory as given.
int direct_blocks_per_sm(int threads, int smem, int min_blocks) {
  return blocks_per_sm(threads, smem, min_blocks * 128 / threads);
}

// The launch of a direct plan whose warps and items are set, either form: one block per item
// (at most 2^31 - 1, the kernels loop past that), `smem` bytes of shared memory (<= 21 KB, under
// the 48 KB past which an attribute is set), the programmatic dependent of the kernel before it
// (plan.h).
void direct_launch(DecodePlan& plan, int smem, int state_bytes, StateLayout layout) {
  const int threads = plan.warps * 32;
  plan.blocks_per_sm =
      direct_blocks_per_sm(threads, smem, direct_min_blocks(plan.one_token, state_bytes, layout, plan.kfirst_rows));
  plan.launch.grid_x = uint32_t(std::clamp<int64_t>(plan.items, 1, 0x7fffffff));
  plan.launch.block = uint32_t(threads);
  plan.launch.smem_bytes = smem;
  plan.launch.dependent = true;  // the kernels' first step is the programmatic wait
}

// Fixed length with one token a sequence (the direct kernels' one-token forms).
bool one_token_of(const ProblemShape& p) { return !p.varlen && p.seqlen == 1; }

// k-first row blocks (plan.h): the block is the form's, one per item.
DecodePlan kfirst_rows_plan(const ProblemShape& p, int state_bytes) {
  DecodePlan plan;
  plan.kernel = DecodeKernel::Direct;
  plan.kfirst_rows = true;
  plan.one_token = one_token_of(p);
  plan.warps = kKFirstRowsKeyWarps;
  plan.block_cols = kfirst_rows_cols(state_bytes);
  plan.warp_tile = plan.block_cols;
  plan.slices = kDecodeHeadDim / plan.block_cols;
  plan.token_group = token_group(p);
  plan.items = p.num_seqs * p.value_heads * plan.slices;
  direct_launch(plan, kfirst_rows_smem_bytes(plan.warps, plan.block_cols, state_bytes == 2 && !plan.one_token),
                state_bytes, StateLayout::KFirst);
  return plan;
}

DecodePlan direct_plan(const ProblemShape& p, int64_t sms, int state_bytes, StateLayout layout) {
  DecodePlan plan;
  plan.kernel = DecodeKernel::Direct;
  const int64_t heads = p.num_seqs * p.value_heads;
  plan.one_token = one_token_of(p);
  // Each warp runs its tile alone: the split only spreads the warps over the SMs.
  plan.wide = state_bytes == 2 && heads * (kDecodeHeadDim / (2 * kDirectWarpTile)) >= kDirectWideMinWarpsPerSm * sms;
  plan.warp_tile = direct_warp_tile(state_bytes, plan.wide);
  const int64_t per_head = kDecodeHeadDim / plan.warp_tile;  // 1-warp items of a head
  plan.warps = heads * per_head >= 8 * sms ? 4 : (heads * per_head >= 4 * sms ? 2 : 1);
  plan.block_cols = plan.warps * plan.warp_tile;
  plan.slices = kDecodeHeadDim / plan.block_cols;
  plan.token_group = token_group(p);
  plan.items = heads * plan.slices;
  direct_launch(plan, direct_smem_bytes(plan.warps, plan.warp_tile, state_bytes, plan.one_token), state_bytes, layout);
  return plan;
}

}  // namespace

DecodePlan make_decode_plan(const ProblemShape& p, const DeviceProps& device, int state_bytes, StateLayout layout,
                            DecodeKernel kernel) {
  const int64_t sms = std::max(1, device.num_sms);
  // The auto rule (plan.h): the direct kernel, k-first pools in row blocks where those serve
  // them (kfirst_rows_serves) unless DirectColumns asks for the warp-column form; DirectRows
  // puts every k-first pool in row blocks.
  if (kernel != DecodeKernel::Persistent) {
    const bool rows = kernel == DecodeKernel::DirectRows ||
                      (kernel != DecodeKernel::DirectColumns &&
                       kfirst_rows_serves(state_bytes, one_token_of(p), p.num_seqs * p.value_heads, sms));
    if (layout == StateLayout::KFirst && rows) return kfirst_rows_plan(p, state_bytes);
    return direct_plan(p, sms, state_bytes, layout);
  }
  DecodePlan plan;
  plan.kernel = DecodeKernel::Persistent;
  const int bytes = state_bytes == 2 ? 2 : 4;
  const int64_t heads = p.num_seqs * p.value_heads;
  // The state traffic is the same either way; 2-warp blocks only halve the block's share of
  // the staging (q, k, gate), which 4-warp blocks amortise over more columns.
  plan.warps = heads * 4 < 2 * sms ? 2 : 4;
  plan.block_cols = plan.warps * kDecodeWarpCols;
  plan.slices = kDecodeHeadDim / plan.block_cols;
  plan.token_group = token_group(p);
  plan.items = heads * plan.slices;
  const int threads = plan.warps * 32;
  const int smem = decode_smem_bytes(plan.warps, plan.token_group, bytes);
  plan.blocks_per_sm = blocks_per_sm(threads, smem, 65536 / (decode_max_regs(layout) * threads));
  plan.launch.grid_x = uint32_t(std::max<int64_t>(1, std::min<int64_t>(plan.items, sms * plan.blocks_per_sm)));
  plan.launch.block = uint32_t(threads);
  plan.launch.smem_bytes = smem;
  plan.launch.smem_attr = decode_smem_bytes(4, kDecodeMaxTokens, bytes);
  return plan;
}

}  // namespace flash_kda::sm90
