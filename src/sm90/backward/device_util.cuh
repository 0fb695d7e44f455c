// Small device helpers of the backward kernels: a deterministic block sum and the flat token's
// sequence.
#pragma once

#include <cstdint>

namespace flash_kda::sm90::bwd {

/// The sum of `x` over a block of kThreads threads (a multiple of 32, at most 1024), returned to
/// every thread. Fixed order (a butterfly inside each warp, then the warps' sums in order), so
/// the result is the same on every run. `scratch` holds kThreads / 32 floats; the call begins
/// and ends with a barrier, so consecutive calls may share it.
template <int kThreads>
__device__ __forceinline__ float block_sum(float x, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = x;
  __syncthreads();
  float s = 0.f;
  for (int w = 0; w < kThreads / 32; ++w) s += scratch[w];
  __syncthreads();
  return s;
}

/// The flat token's sequence for a RowLayout: fixed length, tok / T (RowLayout::offset needs it);
/// varlen layouts ignore it (their sequence stride is 0).
__device__ __forceinline__ int64_t layout_seq(int64_t tok, int64_t seqlen, bool varlen) {
  return varlen || seqlen == 0 ? 0 : tok / seqlen;
}

}  // namespace flash_kda::sm90::bwd
