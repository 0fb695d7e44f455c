// The decode kernels' parameter block from a validated call and its plan (params.h). Host code,
// shared by the launch (decode.cu) and the CPU model of the kernels (tests/emu).
#include "sm90/decode/params.h"

namespace flash_kda::sm90 {
namespace {

ActView act(const TensorView& t) {
  ActView a;
  a.data = t.data;
  a.batch = t.strides[0];
  a.token = t.strides[1];
  a.head = t.strides[2];
  a.f32 = t.dtype == DType::F32;
  return a;
}

}  // namespace

DecodeParams decode_params(const DecodeArgs& a, const ProblemShape& ps, const DecodePlan& plan) {
  DecodeParams p;
  p.q = act(a.q);
  p.k = act(a.k);
  p.v = act(a.v);
  p.g = act(a.g);
  p.beta = act(a.beta);
  p.out = act(a.out);
  p.A_log = a.gate != GateMode::PreGated && a.A_log.defined() ? static_cast<const float*>(a.A_log.data) : nullptr;
  p.dt_bias = a.gate != GateMode::PreGated && a.dt_bias.defined() ? static_cast<const float*>(a.dt_bias.data) : nullptr;
  p.seq.cu_seqlens = ps.varlen ? a.cu_seqlens.data : nullptr;
  p.seq.cu_is_64 = a.cu_seqlens.dtype == DType::I64;
  p.seq.seqlen = ps.seqlen;
  p.seq.num_seqs = ps.num_seqs;
  p.seq.total_tokens = ps.batch * ps.seqlen;
  if (a.initial_state.defined()) {
    p.state_in = a.initial_state.data;
    p.in_slot_stride = a.initial_state.strides[0];
  }
  if (a.final_state.defined()) {
    p.state_out = a.final_state.data;
    p.out_slot_stride = a.final_state.strides[0];
  }
  const TensorView& idx = a.ssm_state_indices;
  if (idx.defined()) {
    p.index_kind = idx.ndim == 2 ? IndexKind::PerToken : IndexKind::PerSeq;
    p.indices = idx.data;
    p.indices_64 = idx.dtype == DType::I64;
    p.idx_seq_stride = idx.strides[0];
    p.idx_tok_stride = idx.ndim == 2 ? idx.strides[1] : 0;
    p.pool_slots = a.initial_state.shape[0];
    if (a.num_accepted_tokens.defined()) {
      p.accepted = a.num_accepted_tokens.data;
      p.accepted_64 = a.num_accepted_tokens.dtype == DType::I64;
      p.acc_stride = a.num_accepted_tokens.strides[0];
    }
  }
  p.value_heads = int(ps.value_heads);
  p.group = int(ps.value_heads / ps.heads);
  p.scale = float(ps.scale);
  p.lower_bound = float(a.lower_bound);
  p.l2norm = a.use_qk_l2norm;
  p.beta_sigmoid = a.use_beta_sigmoid;
  p.neg_eigval = a.allow_neg_eigval;
  p.slices = plan.slices;
  p.token_group = plan.token_group;
  return p;
}

}  // namespace flash_kda::sm90
