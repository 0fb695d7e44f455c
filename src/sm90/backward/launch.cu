// Executes the backward of a validated call: carves the workspace (layout.h), fills the
// kernels' parameters (params.cpp), recomputes the states before every chunk with the forward
// (intermediate states every 16 tokens, into the workspace, at the rows the offsets kernel
// gives), then the backward kernels in order (sequence.cpp). Everything is enqueued on the
// caller's stream; no host synchronisation, no allocation (beyond the caller's allocator when
// one is given).
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
  return bwd::backward_layout(p, workspace_bytes(p, bwd::recompute_options(p))).total;
}

void launch_backward(const BackwardArgs& args, const ProblemShape& p, void* workspace, size_t have,
                     const WorkspaceAllocator* allocate, Stream stream) {
  const LaunchOptions recompute = bwd::recompute_options(p);
  const bwd::BackwardLayout l = bwd::backward_layout(p, workspace_bytes(p, recompute));
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
  const int64_t N = p.num_seqs, HV = p.value_heads, K = p.head_dim_k, V = p.head_dim_v;

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

  const bwd::BackwardParams bp = bwd::backward_params(args, p, ws, l);
  check_cuda(bwd::launch_offsets(bp, stream), "backward offsets launch");
  launch_forward(fa, p, recompute, ws + l.forward, l.forward_bytes, nullptr, stream);
  bwd::enqueue_backward_kernels(bp, l, ctx, stream);
}

}  // namespace flash_kda::sm90
