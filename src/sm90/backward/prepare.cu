// The backward's elementwise preparation, per token: q_hat and k_hat (L2-normalised in fp32
// when the norm is fused, eps inside the square root), the log decay a by the gate mode
// (common/gate.h's forms in fp32) and b by the beta activation, into the workspace; and the
// chunk-row offsets of the recompute's intermediate states.
#include <cuda_bf16.h>

#include "common/gate.h"
#include "sm90/backward/device_util.cuh"
#include "sm90/backward/kernels.h"
#include "sm90/common/bf16.cuh"
#include "sm90/common/launch_config.h"
#include "sm90/common/record.h"

namespace flash_kda::sm90::bwd {
namespace {

constexpr int kThreads = kHeadDim;  // one thread per channel

__global__ void offsets_kernel(BackwardParams p) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n <= p.seqs.num_seqs) p.offsets[n] = p.seqs.first_slot(n);
}

// One block per token (grid-stride): the H q/k heads, then the HV value heads.
__global__ void __launch_bounds__(kThreads) prepare_kernel(BackwardParams p) {
  __shared__ float scratch[kThreads / 32];
  const int c = threadIdx.x;
  const bool varlen = p.seqs.cu_seqlens != nullptr;
  for (int64_t tok = blockIdx.x; tok < p.total_tokens; tok += gridDim.x) {
    const int64_t n = layout_seq(tok, p.seqs.seqlen, varlen);
    for (int h = 0; h < p.heads; ++h) {
      const char* qrow = static_cast<const char*>(p.q) + p.q_rows.offset(n, tok, h);
      const char* krow = static_cast<const char*>(p.k) + p.k_rows.offset(n, tok, h);
      float q = __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(qrow)[c]);
      float k = __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(krow)[c]);
      if (p.l2norm) {
        q *= 1.f / sqrtf(block_sum<kThreads>(q * q, scratch) + float(math::kL2NormEps));
        k *= 1.f / sqrtf(block_sum<kThreads>(k * k, scratch) + float(math::kL2NormEps));
      }
      p.q_hat[(tok * p.heads + h) * kHeadDim + c] = q;
      p.k_hat[(tok * p.heads + h) * kHeadDim + c] = k;
    }
    for (int hv = 0; hv < p.value_heads; ++hv) {
      const float g = load_f_at(p.g, p.g_rows.offset(n, tok, hv) + int64_t(c) * (p.g_is_f32 ? 4 : 2), p.g_is_f32);
      float a = g;
      if (p.gate != GateMode::PreGated) {
        const float rate = p.A_log ? expf(p.A_log[hv]) : 1.f;
        const float x = g + (p.dt_bias ? p.dt_bias[hv * kHeadDim + c] : 0.f);
        a = p.gate == GateMode::SafeSigmoid ? math::safe_gate<float>(x, rate, p.lower_bound)
                                            : math::softplus_gate<float>(x, rate);
      }
      p.a[(tok * p.value_heads + hv) * kHeadDim + c] = a;
      if (c == 0) {
        const float beta = load_f_at(p.beta, p.beta_rows.offset(n, tok, hv), p.beta_is_f32);
        p.b[tok * p.value_heads + hv] =
            p.beta_sigmoid ? p.beta_mul * math::beta_sigmoid<float>(beta, false) : beta;
      }
    }
  }
}

}  // namespace

cudaError_t launch_offsets(const BackwardParams& p, cudaStream_t stream) {
  KernelLaunch k;
  k.grid_x = unsigned((p.seqs.num_seqs + 1 + 255) / 256);
  k.block = 256;
  return launch_planned<offsets_kernel>(k, 0, p, stream);  // no dynamic shared memory: no context key
}

cudaError_t launch_prepare(const BackwardParams& p, cudaStream_t stream) {
  if (p.total_tokens == 0) return cudaSuccess;
  KernelLaunch k;
  k.grid_x = unsigned(p.total_tokens < (int64_t{1} << 20) ? p.total_tokens : (int64_t{1} << 20));
  k.block = kThreads;
  return launch_planned<prepare_kernel>(k, 0, p, stream);
}

}  // namespace flash_kda::sm90::bwd
