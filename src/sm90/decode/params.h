// The decode kernels' parameter block: the call's tensors as pointers and element strides, its
// flags, and the plan's shape. Filled by decode_params (params.cpp) from a validated call.
#pragma once

#include <cstdint>

#include "flash_kda/decode.h"
#include "sm90/common/seq_index.h"
#include "sm90/decode/plan.h"

namespace flash_kda::sm90 {

/// A [B, T, heads, dim] (or [B, T, heads]) activation view: data, dtype and the element strides
/// of batch, token and head (the last dimension has unit stride).
struct ActView {
  const void* data = nullptr;
  int64_t batch = 0, token = 0, head = 0;
  bool f32 = false;  // else bf16
};

/// Which slots a sequence's state comes from and goes to.
enum class IndexKind : int {
  None,      ///< initial_state[n] (or zero) -> final_state[n] (when given)
  PerSeq,    ///< [N]: pool[idx[n]] -> pool[idx[n]] after the last token
  PerToken,  ///< [N, T]: pool[idx[n, acc[n] - 1]] (or idx[n, 0]) -> pool[idx[n, t]] after token t
};

struct DecodeParams {
  ActView q, k, v, g, beta;
  ActView out;  // not const: written
  const float* A_log = nullptr;    // [HV] or null
  const float* dt_bias = nullptr;  // [HV * K] or null
  SeqIndex seq;

  const void* state_in = nullptr;  // initial_state / the pool, or null (zero start)
  void* state_out = nullptr;       // final_state / the pool, or null
  int64_t in_slot_stride = 0, out_slot_stride = 0;  // elements between slots (rows n / pool slots)
  int64_t pool_slots = 0;          // P (IndexKind != None): indices outside [0, P) are skipped

  IndexKind index_kind = IndexKind::None;
  const void* indices = nullptr;
  bool indices_64 = false;
  int64_t idx_seq_stride = 0, idx_tok_stride = 0;
  const void* accepted = nullptr;  // num_accepted_tokens [N] or null (PerToken only)
  bool accepted_64 = false;
  int64_t acc_stride = 0;

  int value_heads = 0;  // HV
  int group = 1;        // HV / H
  float scale = 0.f;
  float lower_bound = -5.f;
  bool l2norm = true, beta_sigmoid = true, neg_eigval = false;

  int slices = 4;       // blocks per (sequence, value head) (plan)
  int token_group = 1;  // tokens staged per round (plan)
};

/// The parameter block of a call that validate_decode(args, Target::Sm90) accepted (`p` its
/// result), for `plan` (its slices and token group): pointers and element strides of every
/// tensor, the index kind, the gate's tensors (none for a pre-computed gate) and the flags.
/// Host code; reads no tensor data.
DecodeParams decode_params(const DecodeArgs& args, const ProblemShape& p, const DecodePlan& plan);

}  // namespace flash_kda::sm90
