// The CPU model's stand-in for the forward's segment scan (src/sm90/forward/segment_scan.cu),
// which the backward's chain segments call (chain.cu): its math on the host, in fp32 with the
// same order of sums (m ascending), on the model's host-memory buffers. The GPU kernel itself
// runs in the GPU suites; here it is what the chain's map and finish passes are checked around.
#include "backward/backward_emu.h"

#include <cstdint>
#include <vector>

#include <cuda_bf16.h>

#include "sm90/forward/kernel_shapes.h"
#include "sm90/forward/kernels.h"
#include "sm90/forward/params.h"

namespace flash_kda::sm90 {

cudaError_t emu_launch_segment_scan(const ScanParams& p, const KernelLaunch&, uint64_t, cudaStream_t) {
  constexpr int K = kHeadDim;
  const int64_t HV = p.value_heads;
  const auto load = [&](int64_t e) {
    if (p.initial_is_f32) return static_cast<const float*>(p.initial_state)[e];
    return __bfloat162float(static_cast<const __nv_bfloat16*>(p.initial_state)[e]);
  };
  std::vector<float> X(K * K), Y(K * K);
  for (int64_t n = 0; n < p.seqs.num_seqs; ++n) {
    const int64_t len = p.seqs.length(n);
    const int64_t chunks = len > 0 ? (len + kChunk - 1) / kChunk : 0;
    const int64_t segs = chunks > 0 ? (chunks + p.seg_len - 1) / p.seg_len : 1;
    for (int64_t hv = 0; hv < HV; ++hv) {
      // X_0 = the initial state as [V][K] (the pool: slot n; the backward passes none).
      for (int v = 0; v < K; ++v)
        for (int k = 0; k < K; ++k) {
          const int64_t e = (n * HV + hv) * K * K + (p.state_k_first ? int64_t(k) * K + v : int64_t(v) * K + k);
          X[v * K + k] = p.initial_state ? load(e) : 0.f;
        }
      for (int64_t j = 0;; ++j) {
        float* out = p.seg_states + seg_state_offset(n, j, hv, p.max_segs, HV);
        for (int i = 0; i < K * K; ++i) out[i] = X[i];
        if (j + 1 >= segs) break;
        const float* P = p.seg_maps + seg_map_offset(n, j, hv, 0, p.max_segs, HV);
        const float* Q = p.seg_maps + seg_map_offset(n, j, hv, 1, p.max_segs, HV);
        for (int v = 0; v < K; ++v)
          for (int k = 0; k < K; ++k) {
            float acc = Q[v * K + k];
            for (int m = 0; m < K; ++m) acc += X[v * K + m] * P[m * K + k];
            Y[v * K + k] = acc;
          }
        X.swap(Y);
      }
    }
  }
  return cudaSuccess;
}

}  // namespace flash_kda::sm90
