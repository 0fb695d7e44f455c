// Segment scan of the segment-parallel forward (params.h, RecurrenceParams "Segment-parallel
// mode"): X_{j+1} = X_j P_j + Q_j for j = 0 .. segments - 2, X_0 the initial state, with
// X = S^T [V x K]; every X_j lands in seg_states, X_0 included, so that the finishing pass never
// reads initial_state (it may be the final_state buffer, written by another block there). The
// rows of X are independent, so each block owns 16 rows of one (sequence, head) and walks the
// segments in order; fp32 throughout (these products compound over the whole sequence, so they
// get no bf16 rounding).
#include <cuda_bf16.h>

#include <cute/arch/copy_sm80.hpp>

#include "sm90/kernel_attrs.h"
#include "sm90/params.h"

namespace flash_kda::sm90 {
namespace {

constexpr int kRows = 16;                 // rows of X per block
constexpr int kThreads = 256;             // 16 threads per row, 8 columns each
constexpr int kXPad = kHeadDim + 4;
constexpr int kPBytes = kHeadDim * kHeadDim * 4;
constexpr int kSmemBytes = 2 * kPBytes + kRows * kXPad * 4;  // P_j and P_{j+1}, then X

__global__ void __launch_bounds__(kThreads) segment_scan_kernel(const ScanParams p) {
  extern __shared__ __align__(16) float smem[];
  float(*X)[kXPad] = reinterpret_cast<float(*)[kXPad]>(smem + 2 * kHeadDim * kHeadDim);

  const int tid = threadIdx.x, r = tid / 16, k0 = (tid % 16) * 8;
  const int64_t n = blockIdx.x;
  const int hv = blockIdx.y, v = blockIdx.z * kRows + r;
  const int64_t HV = p.value_heads;
  const int64_t seq_len = p.seqs.length(n);
  const int64_t num_chunks = seq_len > 0 ? (seq_len + kChunk - 1) / kChunk : 0;
  const int64_t num_segs = num_chunks > 0 ? (num_chunks + p.seg_len - 1) / p.seg_len : 1;
  const int64_t maps_per_seq = p.max_segs - 1;
  auto store = [&](int64_t j, const float (&x)[8]) {
    float* out = p.seg_states + ((n * p.max_segs + j) * HV + hv) * (kHeadDim * kHeadDim) + v * kHeadDim + k0;
    *reinterpret_cast<float4*>(out) = make_float4(x[0], x[1], x[2], x[3]);
    *reinterpret_cast<float4*>(out + 4) = make_float4(x[4], x[5], x[6], x[7]);
  };

  float x[8];
  {
    const int64_t off = ((n * HV + hv) * kHeadDim + v) * kHeadDim + k0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      x[i] = 0.f;
      if (p.initial_state != nullptr)
        x[i] = p.state_is_f32 ? static_cast<const float*>(p.initial_state)[off + i]
                              : __bfloat162float(static_cast<const __nv_bfloat16*>(p.initial_state)[off + i]);
      X[r][k0 + i] = x[i];
    }
    store(0, x);
  }

  // P_j (64 KB) is copied by cp.async one segment ahead, into the other of two buffers: the
  // scan is one chain of segment steps, and loading P_j in the step itself (v5) left each step
  // waiting on 64 KB from global memory (~11 us a step on the H200).
  auto load_p = [&](int64_t j) {
    using Copy = cute::SM80_CP_ASYNC_CACHEGLOBAL<cute::uint128_t>;
    const float* P = p.seg_maps + ((n * maps_per_seq + j) * HV + hv) * 2 * (kHeadDim * kHeadDim);
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
    const float* Q = p.seg_maps + ((n * maps_per_seq + j) * HV + hv) * 2 * (kHeadDim * kHeadDim) + kHeadDim * kHeadDim;
    const float* Pm = smem + (j & 1) * (kHeadDim * kHeadDim);
    float acc[8];
    {
      const float4 q0 = *reinterpret_cast<const float4*>(Q + v * kHeadDim + k0);
      const float4 q1 = *reinterpret_cast<const float4*>(Q + v * kHeadDim + k0 + 4);
      acc[0] = q0.x; acc[1] = q0.y; acc[2] = q0.z; acc[3] = q0.w;
      acc[4] = q1.x; acc[5] = q1.y; acc[6] = q1.z; acc[7] = q1.w;
    }
    cute::cp_async_wait<1>();
    __syncthreads();  // P_j and X_j complete
#pragma unroll 8
    for (int m = 0; m < kHeadDim; ++m) {
      const float xm = X[r][m];
      const float4 p0 = *reinterpret_cast<const float4*>(Pm + m * kHeadDim + k0);
      const float4 p1 = *reinterpret_cast<const float4*>(Pm + m * kHeadDim + k0 + 4);
      acc[0] += xm * p0.x; acc[1] += xm * p0.y; acc[2] += xm * p0.z; acc[3] += xm * p0.w;
      acc[4] += xm * p1.x; acc[5] += xm * p1.y; acc[6] += xm * p1.z; acc[7] += xm * p1.w;
    }
    __syncthreads();  // everyone is done reading P_j and X_j
    store(j + 1, acc);
#pragma unroll
    for (int i = 0; i < 8; ++i) X[r][k0 + i] = acc[i];
  }
  cute::cp_async_wait<0>();  // no copy outlives the block
}

}  // namespace

cudaError_t launch_segment_scan(const ScanParams& p, cudaStream_t stream) {
  const cudaError_t e = allow_dynamic_smem<segment_scan_kernel>(kSmemBytes);
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(p.seqs.num_seqs), static_cast<unsigned>(p.value_heads), kHeadDim / kRows);
  segment_scan_kernel<<<grid, kThreads, kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flash_kda::sm90
