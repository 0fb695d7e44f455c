// One launch function per backward kernel (what launch.cu calls), each on `stream`, returning
// the CUDA error of the launch. Threads and shared memory are the kernels' own (fixed) sizes.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "sm90/backward/params.h"

namespace flash_kda::sm90::bwd {

/// offsets[n] = first chunk row of sequence n (SeqIndex::first_slot), n = 0..N.
cudaError_t launch_offsets(const BackwardParams& p, cudaStream_t stream);
/// q_hat, k_hat (normalised when l2norm), the log decay a and b, per token (prepare.cu).
cudaError_t launch_prepare(const BackwardParams& p, cudaStream_t stream);
/// Every chunk's record (records.h): one block per (chunk row, value head) (records.cu).
cudaError_t launch_records(const BackwardParams& p, cudaStream_t stream);
/// The reverse state-gradient chain: one block per (sequence, value head, 32 value columns), or
/// with segments (layout.h chain_segments) the segments' maps, the forward's segment scan and
/// one block per (sequence, value head, 32 value columns, segment) (chain.cu).
cudaError_t launch_chain(const BackwardParams& p, uint64_t context_key, cudaStream_t stream);
/// Every chunk's input gradients: one block per (chunk row, value head) (chunk_grad.cu).
cudaError_t launch_chunk_grad(const BackwardParams& p, uint64_t context_key, cudaStream_t stream);
/// dq, dk (GVA sum, L2-norm backward), dg, dbeta and the dA_log / ddt_bias partials, then their
/// fixed-order reduction (finish.cu).
cudaError_t launch_finish(const BackwardParams& p, cudaStream_t stream);

struct BackwardLayout;

/// Everything after the recompute (sequence.cpp): zeroes the gradient accumulators of the
/// workspace (layout `l`) and dv, then prepare, records, chain, chunk_grad and finish, with
/// `context_key` for the kernels' shared-memory attributes. Throws CudaError on a failed call.
void enqueue_backward_kernels(const BackwardParams& p, const BackwardLayout& l, uint64_t context_key,
                              cudaStream_t stream);

}  // namespace flash_kda::sm90::bwd
