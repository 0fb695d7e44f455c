// The backward's last step, from the per-value-head fp32 gradients of the workspace to the
// caller's tensors: dq and dk summed over the G value heads of each q/k head (in head order)
// and taken through the L2 norm; dg through the gate and dbeta through the beta activation
// (common/gate.h's derivatives); dA_log and ddt_bias summed over the tokens in two fixed-order
// levels (per block of kFinishTokens tokens, then over the blocks in order), so every result is
// the same on every run.
#include <cuda_bf16.h>

#include "common/gate.h"
#include "sm90/backward/device_util.cuh"
#include "sm90/backward/kernels.h"
#include "sm90/backward/layout.h"
#include "sm90/common/bf16.cuh"
#include "sm90/common/launch_config.h"
#include "sm90/common/record.h"

namespace flash_kda::sm90::bwd {
namespace {

constexpr int kThreads = kHeadDim;  // one thread per channel

// dx of one token and q/k head from the workspace's per-value-head d x_hat; x is the raw input.
__device__ void finish_key(const BackwardParams& p, const void* x, const RowLayout& rows, const float* d_hat,
                           void* out, int64_t tok, int64_t ln, int h, float* scratch) {
  const int c = threadIdx.x;
  float dx = 0.f;
  for (int gi = 0; gi < p.group; ++gi) dx += d_hat[(tok * p.value_heads + h * p.group + gi) * kHeadDim + c];
  if (p.l2norm) {
    const float xv = __bfloat162float(
        reinterpret_cast<const __nv_bfloat16*>(static_cast<const char*>(x) + rows.offset(ln, tok, h))[c]);
    const float inv = 1.f / sqrtf(block_sum<kThreads>(xv * xv, scratch) + float(math::kL2NormEps));
    const float xh = xv * inv;
    const float dot = block_sum<kThreads>(xh * dx, scratch);
    dx = math::l2norm_grad(dx, xh, dot, inv);
  }
  static_cast<__nv_bfloat16*>(out)[(tok * p.heads + h) * kHeadDim + c] = __float2bfloat16_rn(dx);
}

__global__ void __launch_bounds__(kThreads) finish_keys_kernel(BackwardParams p) {
  __shared__ float scratch[kThreads / 32];
  const bool varlen = p.seqs.cu_seqlens != nullptr;
  for (int64_t tok = blockIdx.x; tok < p.total_tokens; tok += gridDim.x) {
    const int64_t ln = layout_seq(tok, p.seqs.seqlen, varlen);
    for (int h = 0; h < p.heads; ++h) {
      finish_key(p, p.q, p.q_rows, p.dq_hat, p.dq, tok, ln, h, scratch);
      finish_key(p, p.k, p.k_rows, p.dk_hat, p.dk, tok, ln, h, scratch);
    }
  }
}

// One block per (block of kFinishTokens tokens, value head): dg and dbeta of its tokens, and
// its partial sums of ddt_bias (per channel) and dA_log (per channel, summed over channels in
// the reduction).
__global__ void __launch_bounds__(kThreads) finish_gate_kernel(BackwardParams p) {
  const int c = threadIdx.x;
  const int64_t tile = blockIdx.x;
  const int hv = blockIdx.y;
  const bool varlen = p.seqs.cu_seqlens != nullptr;
  const float rate = p.A_log ? expf(p.A_log[hv]) : 1.f;
  const float bias = p.dt_bias ? p.dt_bias[hv * kHeadDim + c] : 0.f;
  float sum_dt = 0.f, sum_alog = 0.f;
  const int64_t end = (tile + 1) * kFinishTokens < p.total_tokens ? (tile + 1) * kFinishTokens : p.total_tokens;
  for (int64_t tok = tile * kFinishTokens; tok < end; ++tok) {
    const int64_t ln = layout_seq(tok, p.seqs.seqlen, varlen);
    const int64_t at = (tok * p.value_heads + hv) * kHeadDim + c;
    const float da = p.da[at];
    float dg = da;
    if (p.gate != GateMode::PreGated) {
      const float x =
          load_f_at(p.g, p.g_rows.offset(ln, tok, hv) + int64_t(c) * (p.g_is_f32 ? 4 : 2), p.g_is_f32) + bias;
      const math::GateGrad<float> gg = p.gate == GateMode::SafeSigmoid ? math::safe_gate_grad<float>(x, rate, p.lower_bound)
                                                                       : math::softplus_gate_grad<float>(x, rate);
      dg = da * gg.dx;
      sum_dt += dg;
      sum_alog += da * gg.dA_log;
    }
    store_f(p.dg, at, dg, p.g_is_f32);
    if (c == 0) {
      const float db = p.db[tok * p.value_heads + hv];
      float dbeta = db;
      if (p.beta_sigmoid) {
        const float beta = load_f_at(p.beta, p.beta_rows.offset(ln, tok, hv), p.beta_is_f32);
        dbeta = db * p.beta_mul * math::beta_sigmoid_grad<float>(beta, false);
      }
      store_f(p.dbeta, tok * p.value_heads + hv, dbeta, p.beta_is_f32);
    }
  }
  p.part_dt[(tile * p.value_heads + hv) * kHeadDim + c] = sum_dt;
  p.part_alog[(tile * p.value_heads + hv) * kHeadDim + c] = sum_alog;
}

// One block per value head: the partials over the token blocks in order, then dA_log over the
// channels by block_sum.
__global__ void __launch_bounds__(kThreads) reduce_kernel(BackwardParams p) {
  __shared__ float scratch[kThreads / 32];
  const int64_t tiles = (p.total_tokens + kFinishTokens - 1) / kFinishTokens;
  const int c = threadIdx.x;
  const int hv = blockIdx.x;
  float dt = 0.f, alog = 0.f;
  for (int64_t tile = 0; tile < tiles; ++tile) {
    dt += p.part_dt[(tile * p.value_heads + hv) * kHeadDim + c];
    alog += p.part_alog[(tile * p.value_heads + hv) * kHeadDim + c];
  }
  if (p.ddt_bias) p.ddt_bias[hv * kHeadDim + c] = dt;
  const float total = block_sum<kThreads>(alog, scratch);
  if (p.dA_log && c == 0) p.dA_log[hv] = total;
}

}  // namespace

cudaError_t launch_finish(const BackwardParams& p, cudaStream_t stream) {
  // No dynamic shared memory: no context key.
  if (p.total_tokens > 0) {
    KernelLaunch k;
    k.grid_x = unsigned(p.total_tokens < (int64_t{1} << 20) ? p.total_tokens : (int64_t{1} << 20));
    k.block = kThreads;
    if (const cudaError_t e = launch_planned<finish_keys_kernel>(k, 0, p, stream); e != cudaSuccess) return e;
    k.grid_x = unsigned((p.total_tokens + kFinishTokens - 1) / kFinishTokens);
    k.grid_y = unsigned(p.value_heads);
    if (const cudaError_t e = launch_planned<finish_gate_kernel>(k, 0, p, stream); e != cudaSuccess) return e;
  }
  KernelLaunch k;
  k.grid_x = unsigned(p.value_heads);
  k.block = kThreads;
  return launch_planned<reduce_kernel>(k, 0, p, stream);
}

}  // namespace flash_kda::sm90::bwd
