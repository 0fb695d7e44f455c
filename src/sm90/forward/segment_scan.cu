// Segment scan of the segment-parallel forward (params.h; between SegmentMapsPass and
// SegmentFinishPass): X_{j+1} = X_j P_j + Q_j for j = 0 .. segments - 2, X_0 the initial state, with
// X = S^T [V x K]; X_0 is read from initial_state in either layout (at the sequence's state
// slot; zero for a padded pool entry); every X_j lands in seg_states, X_0 included, so that the finishing pass never
// reads initial_state (it may be the final_state buffer, written by another block there). The
// rows of X are independent, so each block owns 16 rows of one (sequence, head) and walks the
// segments in order; fp32 throughout (these products compound over the whole sequence, so they
// get no bf16 rounding).
#include <cuda_bf16.h>

#include <cute/arch/copy_sm80.hpp>

#include "sm90/common/bf16.cuh"
#include "sm90/common/launch_config.h"
#include "sm90/forward/kernel_shapes.h"
#include "sm90/forward/kernels.h"

namespace flash_kda::sm90 {
namespace {

constexpr int kRows = kScanRows;      // rows of X per block
constexpr int kThreads = kScanThreads;  // warp w: rows w and w + 8; lane l: columns 4l .. 4l + 3
constexpr int kXPad = kScanXPad;

// KFirst: initial_state is [.., HV, K, V] (p.state_k_first), one instantiation per layout so that the
// transposing load of X_0 stays out of the V-first kernel's register allocation.
template <bool KFirst>
__global__ void __launch_bounds__(kThreads) segment_scan_kernel(const ScanParams p) {
  extern __shared__ __align__(16) float smem[];
  float(*X)[kXPad] = reinterpret_cast<float(*)[kXPad]>(smem + 2 * kHeadDim * kHeadDim);

  // A warp reads each row of P_j as 32 lanes x 16 contiguous bytes (the fewest shared-memory
  // wavefronts, 4) and uses it for two rows of X; with 16 threads x 8 columns per row the reads
  // are 2-way bank-conflicted and each serves one row: ~17 wavefronts per k per warp, which
  // makes the step shared-memory bound (~9.8 us on the H200, docs/performance.md).
  const int tid = threadIdx.x, r0 = tid / 32, k0 = (tid % 32) * 4;
  const int64_t n = blockIdx.x;
  const int hv = blockIdx.y, v0 = blockIdx.z * kRows + r0;
  const int64_t HV = p.value_heads;
  const int64_t seq_len = p.seqs.length(n);
  const int64_t num_chunks = seq_len > 0 ? (seq_len + kChunk - 1) / kChunk : 0;
  const int64_t num_segs = num_chunks > 0 ? (num_chunks + p.seg_len - 1) / p.seg_len : 1;
  // x[h][i]: row r0 + 8h (of this block's 16), column k0 + i.
  auto store = [&](int64_t j, const float (&x)[2][4]) {
    float* out = p.seg_states + seg_state_offset(n, j, hv, p.max_segs, HV) + v0 * kHeadDim + k0;
#pragma unroll
    for (int h = 0; h < 2; ++h)
      *reinterpret_cast<float4*>(out + h * 8 * kHeadDim) = make_float4(x[h][0], x[h][1], x[h][2], x[h][3]);
  };

  // X_0: the initial state at the sequence's slot, or zero (none, or a padded pool entry).
  float x[2][4];
  const int64_t slot = p.pool.slot(n);
  const bool from_state = p.initial_state != nullptr && slot >= 0;
  if (KFirst && from_state) {
    // [K][V]: this block's 16 rows of X are 16 consecutive v of each of the 128 k rows. Thread
    // tid reads v = tid % 16 of k = tid / 16 + 16 i (16 threads: 64 or 32 contiguous bytes),
    // through X, instead of its own x elements (4 bytes from 32 different k rows per warp).
    const int64_t base = (slot * HV + hv) * kHeadDim * kHeadDim + blockIdx.z * kRows;
#pragma unroll 4
    for (int i = 0; i < kHeadDim * kRows / kThreads; ++i) {
      const int e = i * kThreads + tid, vr = e % kRows, k = e / kRows;
      X[vr][k] = load_f(p.initial_state, base + int64_t(k) * kHeadDim + vr, p.initial_is_f32);
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < 4; ++i) x[h][i] = X[r0 + 8 * h][k0 + i];
    store(0, x);
  } else {
    const int64_t off = ((slot * HV + hv) * kHeadDim + v0) * kHeadDim + k0;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t e = off + h * 8 * kHeadDim + i;
        x[h][i] = 0.f;
        if (from_state) x[h][i] = load_f(p.initial_state, e, p.initial_is_f32);
        X[r0 + 8 * h][k0 + i] = x[h][i];
      }
    store(0, x);
  }

  // P_j (64 KB) is copied by cp.async one segment ahead, into the other of two buffers: the
  // scan is one chain of segment steps, and loading P_j in the step itself leaves each step
  // waiting on 64 KB from global memory (~11 us a step on the H200).
  auto load_p = [&](int64_t j) {
    using Copy = cute::SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>;
    const float* P = p.seg_maps + seg_map_offset(n, j, hv, 0, p.max_segs, HV);
    float* dst = smem + (j & 1) * (kHeadDim * kHeadDim);
#pragma unroll 4
    for (int i = tid; i < kHeadDim * kHeadDim / 4; i += kThreads)
      Copy::copy(reinterpret_cast<const cute::uint128_t*>(P)[i], reinterpret_cast<cute::uint128_t*>(dst)[i]);
  };
  if (num_segs > 1) load_p(0);
  cute::cp_async_fence();
  for (int64_t j = 0; j + 1 < num_segs; ++j) {
    if (j + 2 < num_segs) load_p(j + 1);  // its buffer was last read in step j - 1
    cute::cp_async_fence();
    const float* Q = p.seg_maps + seg_map_offset(n, j, hv, 1, p.max_segs, HV);
    const float* Pm = smem + (j & 1) * (kHeadDim * kHeadDim);
    float acc[2][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float4 q = *reinterpret_cast<const float4*>(Q + (v0 + 8 * h) * kHeadDim + k0);
      acc[h][0] = q.x; acc[h][1] = q.y; acc[h][2] = q.z; acc[h][3] = q.w;
    }
    cute::cp_async_wait<1>();
    __syncthreads();  // P_j and X_j complete
#pragma unroll 8
    for (int m = 0; m < kHeadDim; ++m) {
      const float4 pm = *reinterpret_cast<const float4*>(Pm + m * kHeadDim + k0);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float xm = X[r0 + 8 * h][m];
        acc[h][0] += xm * pm.x; acc[h][1] += xm * pm.y; acc[h][2] += xm * pm.z; acc[h][3] += xm * pm.w;
      }
    }
    __syncthreads();  // everyone is done reading P_j and X_j
    store(j + 1, acc);
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < 4; ++i) X[r0 + 8 * h][k0 + i] = acc[h][i];
  }
  cute::cp_async_wait<0>();  // no copy outlives the block
}

}  // namespace

cudaError_t launch_segment_scan(const ScanParams& p, const KernelLaunch& k, uint64_t context_key, cudaStream_t stream) {
  return p.state_k_first ? launch_planned<segment_scan_kernel<true>>(k, context_key, p, stream)
                         : launch_planned<segment_scan_kernel<false>>(k, context_key, p, stream);
}

}  // namespace flash_kda::sm90
