// Executes the backward of a validated call: carves the workspace (layout.h), recomputes the
// states before every chunk with the forward (intermediate states every 16 tokens, into the
// workspace), then the backward kernels in order: preparation, the chunk records, the reverse
// state-gradient chain, the chunk gradients, the finish. Everything is enqueued on the caller's stream; no
// host synchronisation, no allocation (beyond the caller's allocator when one is given).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "sm90/backward/kernels.h"
#include "sm90/backward/launch.h"
#include "sm90/backward/layout.h"
#include "sm90/backward/params.h"
#include "sm90/common/cuda_check.h"
#include "sm90/forward/launch.h"

namespace flash_kda::sm90 {
namespace {

TensorView device_view(void* data, DType dtype, std::initializer_list<int64_t> shape, int device) {
  return make_tensor(data, dtype, shape, DeviceType::CUDA, device);
}

}  // namespace

size_t backward_workspace_bytes(const ProblemShape& p) {
  return bwd::backward_layout(p, workspace_bytes(p, LaunchOptions{})).total;
}

void launch_backward(const BackwardArgs& args, const ProblemShape& p, void* workspace, size_t have,
                     const WorkspaceAllocator* allocate, Stream stream) {
  const bwd::BackwardLayout l = bwd::backward_layout(p, workspace_bytes(p, LaunchOptions{}));
  if (allocate == nullptr) {
    if (have < l.total)
      throw Error("workspace", "at least " + std::to_string(l.total) + " bytes (backward_workspace_size), got " +
                                   std::to_string(have));
    if (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 256 != 0)
      throw Error("workspace", "a non-null device pointer aligned to 256 bytes");
  }
  const ForwardArgs& f = args.forward;
  const int device = f.q.device_id;
  DeviceGuard guard(device);
  uint64_t ctx = 0;
  (void)sm90_stream_props(device, stream, &ctx);  // Error("q") unless sm_90, before any launch

  if (allocate != nullptr) {
    workspace = (*allocate)(l.total);
    if (workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 256 != 0)
      throw Error("workspace", "the allocator returned a null or not 256-byte aligned pointer");
  }
  char* ws = static_cast<char*>(workspace);
  const int64_t TT = p.batch * p.seqlen, N = p.num_seqs, HV = p.value_heads, K = p.head_dim_k, V = p.head_dim_v;

  // The recompute: the forward call with the chunk-start states as intermediate states.
  ForwardArgs fa = f;
  fa.out = device_view(ws + l.out, DType::BF16, {p.batch, p.seqlen, HV, V}, device);
  fa.final_state = TensorView{};
  fa.intermediate_states = f.state_layout == StateLayout::VFirst
                               ? device_view(ws + l.states, DType::F32, {l.rows, HV, V, K}, device)
                               : device_view(ws + l.states, DType::F32, {l.rows, HV, K, V}, device);
  fa.intermediate_offsets = device_view(ws + l.offsets, DType::I64, {N + 1}, device);
  fa.intermediate_every = 16;
  fa.intermediate_include_initial = true;
  (void)validate_forward(fa);  // cannot fail for a validated call; checked before any launch

  bwd::BackwardParams bp{};
  bp.seqs.cu_seqlens = f.cu_seqlens.defined() ? f.cu_seqlens.data : nullptr;
  bp.seqs.cu_is_64 = f.cu_seqlens.dtype == DType::I64;
  bp.seqs.seqlen = p.seqlen;
  bp.seqs.num_seqs = N;
  bp.seqs.total_tokens = TT;
  bp.total_tokens = TT;
  bp.rows = l.rows;
  bp.heads = int(p.heads);
  bp.value_heads = int(HV);
  bp.group = int(HV / p.heads);
  bp.scale = float(p.scale);
  bp.lower_bound = float(f.lower_bound);
  bp.gate = f.gate;
  bp.l2norm = f.use_qk_l2norm;
  bp.beta_sigmoid = f.use_beta_sigmoid;
  bp.beta_mul = f.allow_neg_eigval ? 2.f : 1.f;
  bp.state_k_first = f.state_layout == StateLayout::KFirst;
  bp.q = f.q.data; bp.k = f.k.data; bp.v = f.v.data; bp.g = f.g.data; bp.beta = f.beta.data;
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
  bp.offsets = reinterpret_cast<int64_t*>(ws + l.offsets);
  bp.states = reinterpret_cast<const float*>(ws + l.states);
  bp.dstates = reinterpret_cast<float*>(ws + l.dstates);
  bp.q_hat = reinterpret_cast<float*>(ws + l.q_hat);
  bp.k_hat = reinterpret_cast<float*>(ws + l.k_hat);
  bp.a = reinterpret_cast<float*>(ws + l.a);
  bp.b = reinterpret_cast<float*>(ws + l.b);
  bp.dq_hat = reinterpret_cast<float*>(ws + l.dq_hat);
  bp.dk_hat = reinterpret_cast<float*>(ws + l.dk_hat);
  bp.da = reinterpret_cast<float*>(ws + l.da);
  bp.db = reinterpret_cast<float*>(ws + l.db);
  bp.part_dt = reinterpret_cast<float*>(ws + l.part_dt);
  bp.part_alog = reinterpret_cast<float*>(ws + l.part_alog);
  bp.records = reinterpret_cast<float*>(ws + l.records);
  bp.dq = args.dq.data; bp.dk = args.dk.data; bp.dv = args.dv.data; bp.dg = args.dg.data; bp.dbeta = args.dbeta.data;
  bp.dA_log = args.dA_log.defined() ? static_cast<float*>(args.dA_log.data) : nullptr;
  bp.ddt_bias = args.ddt_bias.defined() ? static_cast<float*>(args.ddt_bias.data) : nullptr;
  bp.d_initial_state = args.d_initial_state.defined() ? args.d_initial_state.data : nullptr;
  bp.d_initial_is_f32 = args.d_initial_state.dtype == DType::F32;

  check_cuda(bwd::launch_offsets(bp, stream), "backward offsets launch");
  launch_forward(fa, p, LaunchOptions{}, ws + l.forward, l.forward_bytes, nullptr, stream);
  // Tokens no chunk covers (only where cu_seqlens values are bad) keep zero gradients.
  check_cuda(cudaMemsetAsync(ws + l.dq_hat, 0, l.part_dt - l.dq_hat, stream), "cudaMemsetAsync (gradients)");
  if (TT > 0) check_cuda(cudaMemsetAsync(args.dv.data, 0, size_t(TT * HV * V) * 2, stream), "cudaMemsetAsync (dv)");
  check_cuda(bwd::launch_prepare(bp, stream), "backward prepare launch");
  check_cuda(bwd::launch_records(bp, stream), "backward record launch");
  check_cuda(bwd::launch_chain(bp, ctx, stream), "backward chain launch");
  check_cuda(bwd::launch_chunk_grad(bp, ctx, stream), "backward chunk gradient launch");
  check_cuda(bwd::launch_finish(bp, stream), "backward finish launch");
}

}  // namespace flash_kda::sm90
