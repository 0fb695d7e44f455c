// The backward kernels after the recompute, in order (kernels.h): zeroing of the gradient
// accumulators, preparation, the chunk records, the reverse state-gradient chain, the chunk
// gradients, the finish. Host code, shared by the launch (launch.cu) and the CPU model of the
// kernels (tests/emu), which compiles it with its own launches.
#include <cstdint>

#include "sm90/backward/kernels.h"
#include "sm90/backward/layout.h"
#include "sm90/common/cuda_check.h"
#include "sm90/common/record.h"
#include "sm90/common/zero_async.h"

namespace flash_kda::sm90::bwd {

void enqueue_backward_kernels(const BackwardParams& bp, const BackwardLayout& l, uint64_t context_key,
                              cudaStream_t stream) {
  // The chunk gradients write dq_hat .. db and dv for every token a chunk covers; a token no
  // chunk covers (only where device-side cu_seqlens values are bad) reads zero in the finish and
  // keeps a zero dv.
  check_cuda(zero_async(bp.dq_hat, l.part_dt - l.dq_hat, stream), "cudaMemsetAsync (gradients)");
  if (bp.total_tokens > 0)
    check_cuda(zero_async(bp.dv, size_t(bp.total_tokens * bp.value_heads * kHeadDim) * 2, stream),
               "cudaMemsetAsync (dv)");
  check_cuda(launch_prepare(bp, stream), "backward prepare launch");
  check_cuda(launch_records(bp, stream), "backward record launch");
  check_cuda(launch_chain(bp, context_key, stream), "backward chain launch");
  check_cuda(launch_chunk_grad(bp, context_key, stream), "backward chunk gradient launch");
  check_cuda(launch_finish(bp, stream), "backward finish launch");
}

}  // namespace flash_kda::sm90::bwd
