// The backward kernels' parameter block from a validated call and its workspace (params.h).
// Host code, shared by the launch (launch.cu) and the CPU model of the kernels (tests/emu).
#include "sm90/backward/params.h"

#include "sm90/backward/layout.h"
#include "sm90/forward/launch.h"

namespace flash_kda::sm90::bwd {

BackwardParams backward_params(const BackwardArgs& args, const ProblemShape& p, char* ws, const BackwardLayout& l) {
  const ForwardArgs& f = args.forward;
  const int64_t TT = p.batch * p.seqlen;
  BackwardParams bp{};
  bp.seqs.cu_seqlens = f.cu_seqlens.defined() ? f.cu_seqlens.data : nullptr;
  bp.seqs.cu_is_64 = f.cu_seqlens.dtype == DType::I64;
  bp.seqs.seqlen = p.seqlen;
  bp.seqs.num_seqs = p.num_seqs;
  bp.seqs.total_tokens = TT;
  bp.total_tokens = TT;
  bp.rows = l.rows;
  bp.heads = int(p.heads);
  bp.value_heads = int(p.value_heads);
  bp.group = int(p.value_heads / p.heads);
  bp.scale = float(p.scale);
  bp.lower_bound = float(f.lower_bound);
  bp.gate = f.gate;
  bp.l2norm = f.use_qk_l2norm;
  bp.beta_sigmoid = f.use_beta_sigmoid;
  bp.beta_mul = f.allow_neg_eigval ? 2.f : 1.f;
  bp.state_k_first = f.state_layout == StateLayout::KFirst;
  bp.q = f.q.data;
  bp.k = f.k.data;
  bp.v = f.v.data;
  bp.g = f.g.data;
  bp.beta = f.beta.data;
  bp.q_rows = row_layout(f.q, p);
  bp.k_rows = row_layout(f.k, p);
  bp.v_rows = row_layout(f.v, p);
  bp.g_rows = row_layout(f.g, p);
  bp.beta_rows = row_layout(f.beta, p);
  bp.g_is_f32 = f.g.dtype == DType::F32;
  bp.beta_is_f32 = f.beta.dtype == DType::F32;
  bp.A_log = f.A_log.defined() ? static_cast<const float*>(f.A_log.data) : nullptr;
  bp.dt_bias = f.dt_bias.defined() ? static_cast<const float*>(f.dt_bias.data) : nullptr;
  bp.d_out = args.d_out.data;
  bp.d_out_rows = row_layout(args.d_out, p);
  bp.d_out_is_f32 = args.d_out.dtype == DType::F32;
  bp.d_final_state = args.d_final_state.defined() ? args.d_final_state.data : nullptr;
  bp.d_final_is_f32 = args.d_final_state.dtype == DType::F32;
  const auto f32 = [&](size_t offset) { return reinterpret_cast<float*>(ws + offset); };  // a workspace buffer
  bp.offsets = reinterpret_cast<int64_t*>(ws + l.offsets);
  bp.states = f32(l.states);
  bp.dstates = f32(l.dstates);
  bp.q_hat = f32(l.q_hat);
  bp.k_hat = f32(l.k_hat);
  bp.a = f32(l.a);
  bp.b = f32(l.b);
  bp.dq_hat = f32(l.dq_hat);
  bp.dk_hat = f32(l.dk_hat);
  bp.da = f32(l.da);
  bp.db = f32(l.db);
  bp.part_dt = f32(l.part_dt);
  bp.part_alog = f32(l.part_alog);
  bp.records = f32(l.records);
  bp.chain_seg_len = l.chain.seg_len;
  bp.chain_max_segs = l.chain.max_segs;
  bp.chain_maps = l.chain.seg_len > 0 ? f32(l.chain_maps) : nullptr;
  bp.chain_ends = l.chain.seg_len > 0 ? f32(l.chain_ends) : nullptr;
  bp.dq = args.dq.data;
  bp.dk = args.dk.data;
  bp.dv = args.dv.data;
  bp.dg = args.dg.data;
  bp.dbeta = args.dbeta.data;
  bp.dA_log = args.dA_log.defined() ? static_cast<float*>(args.dA_log.data) : nullptr;
  bp.ddt_bias = args.ddt_bias.defined() ? static_cast<float*>(args.ddt_bias.data) : nullptr;
  bp.d_initial_state = args.d_initial_state.defined() ? args.d_initial_state.data : nullptr;
  bp.d_initial_is_f32 = args.d_initial_state.dtype == DType::F32;
  return bp;
}

}  // namespace flash_kda::sm90::bwd
