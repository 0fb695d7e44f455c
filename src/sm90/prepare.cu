// Stage 1: the intra-chunk algebra (docs/kda-spec.md "Chunked form", the WY/UT transform).
// One block per (chunk slot, value head), one thread per key channel / value column.
// Everything here is independent of the state, so all chunks of all heads run at once.
#include <cuda_bf16.h>

#include "common/gate.h"
#include "sm90/params.h"

namespace flash_kda::sm90 {
namespace {

constexpr int kThreads = kHeadDim;  // thread c owns key channel c and value column c
// Row stride 132 floats: float4 reads of 16 different rows spread over all banks (4 per row),
// and column writes by consecutive threads stay conflict-free.
constexpr int kPad = kHeadDim + 4;

__device__ __forceinline__ float load_f(const void* base, int64_t i, bool is_f32) {
  return is_f32 ? static_cast<const float*>(base)[i]
                : __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// 4 blocks per SM (<= 128 registers): the block spends much of its time in serial
// stretches (norm reductions, the 16x16 inverse) that only other resident blocks can hide.
__global__ void __launch_bounds__(kThreads, 4) prepare_kernel(const PrepareParams p) {
  __shared__ __align__(16) float s_kd[kChunk][kPad], s_qd[kChunk][kPad], s_ki[kChunk][kPad];
  __shared__ float s_norm[kThreads / 32][2 * kChunk];
  __shared__ float s_b[kChunk];
  __shared__ float s_L[kChunk][kChunk + 1];
  __shared__ __align__(16) float s_M[kChunk][kChunk], s_Ab[kChunk][kChunk];  // read as float4 rows

  const int c = threadIdx.x, lane = c % 32, warp = c / 32;
  const int hv = blockIdx.y, h = hv / (p.value_heads / p.heads);
  const int64_t slot = p.slot_begin + blockIdx.x;
  const int64_t n = p.seqs.seq_of_slot(slot);
  const int64_t chunk = slot - p.seqs.first_slot(n);
  const int64_t seq_begin = p.seqs.start(n), seq_len = p.seqs.start(n + 1) - seq_begin;
  if (chunk * kChunk >= seq_len) return;  // an empty slot: no record is read for it
  const int64_t t0 = seq_begin + chunk * kChunk;
  const int valid = static_cast<int>(seq_len - chunk * kChunk < kChunk ? seq_len - chunk * kChunk : kChunk);

  // Tokens past the sequence end are zero (k = v = q = 0, b = 0, a = 0): they then leave U, S
  // and the chunk decay untouched, so the recurrence needs no masks.
  float q[kChunk], k[kChunk], v[kChunk], a[kChunk];
  const float decay_rate = __expf(p.A_log[hv]);
  const float bias = p.dt_bias[hv * kHeadDim + c];
#pragma unroll
  for (int t = 0; t < kChunk; ++t) {
    q[t] = k[t] = v[t] = a[t] = 0.f;
    if (t < valid) {
      const int64_t tok = t0 + t;
      const int64_t qk = (tok * p.heads + h) * kHeadDim + c;
      const int64_t vg = (tok * p.value_heads + hv) * kHeadDim + c;
      q[t] = __bfloat162float(static_cast<const __nv_bfloat16*>(p.q)[qk]);
      k[t] = __bfloat162float(static_cast<const __nv_bfloat16*>(p.k)[qk]);
      v[t] = __bfloat162float(static_cast<const __nv_bfloat16*>(p.v)[vg]);
      a[t] = math::safe_gate_fast(load_f(p.g, vg, p.g_is_f32) + bias, decay_rate, p.lower_bound);
    }
  }
  if (c < kChunk) {
    s_b[c] = c < valid ? math::beta_sigmoid_fast(load_f(p.beta, (t0 + c) * p.value_heads + hv, p.beta_is_f32))
                       : 0.f;
  }

  // L2 norms of q_t and k_t over the K channels (fp32, eps inside the sqrt).
#pragma unroll
  for (int t = 0; t < kChunk; ++t) {
    const float sq = warp_sum(q[t] * q[t]), sk = warp_sum(k[t] * k[t]);
    if (lane == 0) { s_norm[warp][t] = sq; s_norm[warp][kChunk + t] = sk; }
  }
  __syncthreads();
#pragma unroll
  for (int t = 0; t < kChunk; ++t) {
    float sq = 0.f, sk = 0.f;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) { sq += s_norm[w][t]; sk += s_norm[w][kChunk + t]; }
    q[t] *= rsqrtf(sq + float(math::kL2NormEps));
    k[t] *= rsqrtf(sk + float(math::kL2NormEps));
  }

  // Cumulative decay G_t and the decayed operands. With the safe gate G >= 16 * lower_bound
  // >= -80, so exp(+-G) stays inside fp32's normal range.
  float G[kChunk];
  float acc = 0.f;
#pragma unroll
  for (int t = 0; t < kChunk; ++t) { acc += a[t]; G[t] = acc; }
  const float G_C = acc;
  float kd[kChunk], qd[kChunk];
#pragma unroll
  for (int t = 0; t < kChunk; ++t) {
    const float e = __expf(G[t]);
    kd[t] = k[t] * e;
    qd[t] = p.scale * q[t] * e;
    s_kd[t][c] = kd[t];
    s_qd[t][c] = qd[t];
    s_ki[t][c] = k[t] * __expf(-G[t]);
  }
  __syncthreads();

  // L = strictly_lower(diag(b) kd ki^T), M = lower_incl_diag(qd ki^T). Warp w owns rows 4w..4w+3;
  // lanes 0-15 build L's column j = lane, lanes 16-31 M's.
  {
    const int j = lane % kChunk;
    const bool is_m = lane >= kChunk;
    const float(*src)[kPad] = is_m ? s_qd : s_kd;
    float dot[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
    for (int cc = 0; cc < kHeadDim; cc += 4) {
      const float4 kij = *reinterpret_cast<const float4*>(&s_ki[j][cc]);
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float4 x = *reinterpret_cast<const float4*>(&src[4 * warp + r][cc]);
        dot[r] += x.x * kij.x + x.y * kij.y + x.z * kij.z + x.w * kij.w;
      }
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int i = 4 * warp + r;
      if (is_m) s_M[i][j] = j <= i ? dot[r] : 0.f;
      else s_L[i][j] = j < i ? s_b[i] * dot[r] : 0.f;
    }
  }
  __syncthreads();

  // (I + L)^-1 by forward substitution, one column per lane; folded with diag(b) on the right.
  if (warp == 0 && lane < kChunk) {
    const int j = lane;
    float x[kChunk];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      float s = i == j ? 1.f : 0.f;
#pragma unroll
      for (int m = 0; m < i; ++m) s -= s_L[i][m] * x[m];
      x[i] = i < j ? 0.f : s;
    }
#pragma unroll
    for (int i = 0; i < kChunk; ++i) s_Ab[i][j] = x[i] * s_b[j];
  }
  __syncthreads();

  // Column c of W, U0 = Ab [kd | v]; Qe = qd - M W; O0 = M U0. Ab and M are lower triangular
  // with exact zeros above the diagonal, so whole float4 groups up to the diagonal are summed.
  float W[kChunk], U0[kChunk];
#pragma unroll
  for (int i = 0; i < kChunk; ++i) {
    float w = 0.f, u = 0.f;
#pragma unroll
    for (int j0 = 0; j0 <= i; j0 += 4) {
      const float4 ab = *reinterpret_cast<const float4*>(&s_Ab[i][j0]);
      w += ab.x * kd[j0] + ab.y * kd[j0 + 1] + ab.z * kd[j0 + 2] + ab.w * kd[j0 + 3];
      u += ab.x * v[j0] + ab.y * v[j0 + 1] + ab.z * v[j0 + 2] + ab.w * v[j0 + 3];
    }
    W[i] = w;
    U0[i] = u;
  }
  char* rec = p.records + ((slot - p.slot_begin) * p.value_heads + hv) * int64_t(kRecordBytes);
  auto* rW = reinterpret_cast<__nv_bfloat16*>(rec + kRecW);
  auto* rQe = reinterpret_cast<__nv_bfloat16*>(rec + kRecQe);
  auto* rKr = reinterpret_cast<__nv_bfloat16*>(rec + kRecKr);
  __align__(16) __nv_bfloat16 u0t[kChunk], o0t[kChunk];
#pragma unroll
  for (int i = 0; i < kChunk; ++i) {
    float qe = qd[i], o0 = 0.f;
#pragma unroll
    for (int j0 = 0; j0 <= i; j0 += 4) {
      const float4 m = *reinterpret_cast<const float4*>(&s_M[i][j0]);
      qe -= m.x * W[j0] + m.y * W[j0 + 1] + m.z * W[j0 + 2] + m.w * W[j0 + 3];
      o0 += m.x * U0[j0] + m.y * U0[j0 + 1] + m.z * U0[j0 + 2] + m.w * U0[j0 + 3];
    }
    rW[i * kHeadDim + c] = __float2bfloat16(W[i]);
    rQe[i * kHeadDim + c] = __float2bfloat16(qe);
    rKr[i * kHeadDim + c] = __float2bfloat16(k[i] * __expf(G_C - G[i]));
    u0t[i] = __float2bfloat16(U0[i]);
    o0t[i] = __float2bfloat16(o0);
  }
  auto* rU0T = reinterpret_cast<uint4*>(rec + kRecU0T + c * kChunk * 2);
  auto* rO0T = reinterpret_cast<uint4*>(rec + kRecO0T + c * kChunk * 2);
  rU0T[0] = reinterpret_cast<const uint4*>(u0t)[0];
  rU0T[1] = reinterpret_cast<const uint4*>(u0t)[1];
  rO0T[0] = reinterpret_cast<const uint4*>(o0t)[0];
  rO0T[1] = reinterpret_cast<const uint4*>(o0t)[1];
  reinterpret_cast<float*>(rec + kRecGC)[c] = __expf(G_C);
}

}  // namespace

void launch_prepare(const PrepareParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.slot_end - p.slot_begin), static_cast<unsigned>(p.value_heads));
  prepare_kernel<<<grid, kThreads, 0, stream>>>(p);
}

}  // namespace flash_kda::sm90
