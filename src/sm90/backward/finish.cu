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

constexpr int kThreads = kHeadDim;  // one thread per channel (finish_gate_kernel, reduce_kernel)

// finish_keys_kernel: a warp per (token, q/k head, q or k), four channels a lane, so the L2
// norm's two sums are warp butterflies: block-wide sums, two per head with their barriers, leave
// such a short kernel latency-bound.
constexpr int kKeyThreads = 256;
constexpr int kKeyWarps = kKeyThreads / 32;

__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// dx of one token and q/k head from the workspace's per-value-head d x_hat (summed over the
// group's value heads in order); x is the raw input. Lane l holds channels 4 l .. 4 l + 3.
__device__ __forceinline__ void finish_key(const BackwardParams& p, const void* x, const RowLayout& rows,
                                           const float* d_hat, void* out, int64_t tok, int64_t ln, int h) {
  const int c = 4 * (threadIdx.x % 32);
  float4 dx = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int gi = 0; gi < p.group; ++gi) {
    const float4 d = *reinterpret_cast<const float4*>(d_hat + (tok * p.value_heads + h * p.group + gi) * kHeadDim + c);
    dx.x += d.x; dx.y += d.y; dx.z += d.z; dx.w += d.w;
  }
  if (p.l2norm) {
    // Rows are 16-byte aligned (validated), so a lane's four bf16 are one 8-byte load.
    const uint2 raw = *reinterpret_cast<const uint2*>(static_cast<const char*>(x) + rows.offset(ln, tok, h) + c * 2);
    const float2 x01 = unpack_bf16(raw.x), x23 = unpack_bf16(raw.y);
    const float inv = 1.f / sqrtf(warp_sum((x01.x * x01.x + x01.y * x01.y) + (x23.x * x23.x + x23.y * x23.y)) +
                                  float(math::kL2NormEps));
    const float4 xh = make_float4(x01.x * inv, x01.y * inv, x23.x * inv, x23.y * inv);
    const float dot = warp_sum((xh.x * dx.x + xh.y * dx.y) + (xh.z * dx.z + xh.w * dx.w));
    dx = make_float4(math::l2norm_grad(dx.x, xh.x, dot, inv), math::l2norm_grad(dx.y, xh.y, dot, inv),
                     math::l2norm_grad(dx.z, xh.z, dot, inv), math::l2norm_grad(dx.w, xh.w, dot, inv));
  }
  *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(out) + (tok * p.heads + h) * kHeadDim + c) =
      make_uint2(pack_bf16(dx.x, dx.y), pack_bf16(dx.z, dx.w));
}

// Item i = (token, head, q or k): i / (2 heads) is the token, (i / 2) % heads the head, i % 2
// q (0) or k (1).
__global__ void __launch_bounds__(kKeyThreads) finish_keys_kernel(BackwardParams p) {
  const bool varlen = p.seqs.cu_seqlens != nullptr;
  const int64_t items = p.total_tokens * p.heads * 2;
  for (int64_t i = int64_t(blockIdx.x) * kKeyWarps + threadIdx.x / 32; i < items; i += int64_t(gridDim.x) * kKeyWarps) {
    const int64_t tok = i / (2 * p.heads);
    const int h = int((i / 2) % p.heads);
    const int64_t ln = layout_seq(tok, p.seqs.seqlen, varlen);
    if (i % 2 == 0)
      finish_key(p, p.q, p.q_rows, p.dq_hat, p.dq, tok, ln, h);
    else
      finish_key(p, p.k, p.k_rows, p.dk_hat, p.dk, tok, ln, h);
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
    const int64_t key_blocks = (p.total_tokens * p.heads * 2 + kKeyWarps - 1) / kKeyWarps;
    k.grid_x = unsigned(key_blocks < (int64_t{1} << 20) ? key_blocks : (int64_t{1} << 20));
    k.block = kKeyThreads;
    if (const cudaError_t e = launch_planned<finish_keys_kernel>(k, 0, p, stream); e != cudaSuccess) return e;
    k.block = kThreads;
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
