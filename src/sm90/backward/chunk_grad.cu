// The input gradients of every chunk at once: one block per (chunk row, value head) loads the
// state before its chunk (the recompute's intermediate state) and the gradient of the state
// after it (the chain's), recomputes the chunk's forward (A, M, X, U) and runs its backward
// (chunk_algebra.cuh), writing dv (v's dtype) and the fp32 per-value-head dq_hat, dk_hat, da,
// db to the workspace, which the finish kernels reduce over GVA heads and take through the
// norm, the gate and the beta activation.
#include "sm90/backward/chunk_load.cuh"
#include "sm90/backward/kernels.h"
#include "sm90/common/launch_config.h"

namespace flash_kda::sm90::bwd {
namespace {

constexpr int kThreads = 256;
constexpr int kLd = kHeadDim + 1;  // S and dS row stride: a thread per key row reads distinct banks
constexpr int kTile = kC * kHeadDim;
constexpr int kSmemFloats = 2 * kHeadDim * kLd + 8 * kTile + 4 * kC * kC + kC;
constexpr int kSmemBytes = kSmemFloats * 4;  // 201,792 B: one block per SM
static_assert(kSmemBytes <= 227 * 1024, "over sm_90's shared memory per block");

__global__ void __launch_bounds__(kThreads) chunk_grad_kernel(BackwardParams p) {
  const int64_t slot = blockIdx.x;
  const int hv = blockIdx.y;
  const int64_t n = p.seqs.seq_of_slot(slot);
  const SeqIndex::Span sp = p.seqs.span(n);
  const int64_t j = slot - sp.first_slot;  // the chunk of sequence n
  if (j < 0 || j * kC >= sp.length) return;  // a row no chunk owns
  const int rows = int(sp.length - j * kC < kC ? sp.length - j * kC : kC);
  const int64_t tok0 = sp.begin + j * kC;

  float* s = reinterpret_cast<float*>(dynamic_smem());
  Tiles t{};
  float* S = s;
  t.dS = s + kHeadDim * kLd;
  t.S = S;
  float* f = s + 2 * kHeadDim * kLd;
  t.q = f; f += kTile;
  t.k = f; f += kTile;
  t.G = f; f += kTile;
  t.X = f; f += kTile;
  t.dO = f; f += kTile;
  t.U = f; f += kTile;
  t.dR = f; f += kTile;
  t.dG = f; f += kTile;
  t.A = f; f += kC * kC;
  t.M = f; f += kC * kC;
  t.dL = f; f += kC * kC;
  t.dM = f; f += kC * kC;
  t.b = f;
  t.ld = kLd;
  t.scale = p.scale;
  const BlockCtx ctx{int(threadIdx.x), int(blockDim.x)};

  const int64_t KV = int64_t(kHeadDim) * kHeadDim;
  const float* st = p.states + (slot * p.value_heads + hv) * KV;
  const float* ds = p.dstates + (slot * p.value_heads + hv) * KV;
  for (int e = threadIdx.x; e < KV; e += blockDim.x) {
    const int c = e / kHeadDim, v = e % kHeadDim;
    S[c * kLd + v] = st[state_elem(p.state_k_first, c, v)];
    t.dS[c * kLd + v] = ds[e];
  }
  load_chunk(p, t, n, tok0, rows, hv, true);  // ends with a barrier

  cumulate_gate(t, ctx);
  grams(t, ctx);
  state_residual(t, ctx);
  solve_U(t, ctx);
  grad_U(t, ctx);
  solve_dR(t, ctx);
  grad_pairs(t, ctx);
  grad_b(t, ctx, p.db + tok0 * p.value_heads + hv, int64_t(p.value_heads), rows);
  __nv_bfloat16* dv = static_cast<__nv_bfloat16*>(p.dv);
  for (int e = threadIdx.x; e < rows * kHeadDim; e += blockDim.x) {
    const int i = e / kHeadDim, v = e % kHeadDim;
    dv[((tok0 + i) * p.value_heads + hv) * kHeadDim + v] = __float2bfloat16_rn(t.b[i] * t.dR[e]);
  }
  const int64_t row = (tok0 * p.value_heads + hv) * kHeadDim, stride = int64_t(p.value_heads) * kHeadDim;
  grad_keys(t, ctx, p.dq_hat + row, p.dk_hat + row, stride, rows);
  grad_decay(t, ctx, p.da + row, stride, rows);
}

}  // namespace

cudaError_t launch_chunk_grad(const BackwardParams& p, uint64_t context_key, cudaStream_t stream) {
  if (p.total_tokens == 0) return cudaSuccess;
  KernelLaunch k;
  k.grid_x = unsigned(p.rows);
  k.grid_y = unsigned(p.value_heads);
  k.block = kThreads;
  k.smem_bytes = k.smem_attr = kSmemBytes;
  return launch_planned<chunk_grad_kernel>(k, context_key, p, stream);
}

}  // namespace flash_kda::sm90::bwd
