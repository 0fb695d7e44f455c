// The reverse state-gradient chain (the backward's only sequential part): one block per
// (sequence, value head) walks its chunks from the last to the first, holding dS, the
// gradient of the state after the current chunk, in shared memory (fp32). For each chunk it
// stores dS (the chunk-gradient kernel's input), then steps it back across the chunk
// (chunk_algebra.cuh: dU, dR, dS_start). dS starts at d_final_state (zero without it); what
// is left after the first chunk is d_initial_state. An empty sequence passes d_final_state
// through.
#include "sm90/backward/chunk_load.cuh"
#include "sm90/backward/kernels.h"
#include "sm90/common/launch_config.h"

namespace flash_kda::sm90::bwd {
namespace {

constexpr int kThreads = 256;
constexpr int kLd = kHeadDim + 1;  // dS row stride: a thread per key row reads distinct banks
constexpr int kTile = kC * kHeadDim;
constexpr int kSmemFloats = kHeadDim * kLd + 5 * kTile + 2 * kC * kC + kC;
constexpr int kSmemBytes = kSmemFloats * 4;

__global__ void __launch_bounds__(kThreads) chain_kernel(BackwardParams p) {
  float* s = reinterpret_cast<float*>(dynamic_smem());
  Tiles t{};
  t.dS = s;
  float* f = s + kHeadDim * kLd;
  t.q = f; f += kTile;
  t.k = f; f += kTile;
  t.G = f; f += kTile;
  t.dO = f; f += kTile;
  t.dR = f; f += kTile;
  t.A = f; f += kC * kC;
  t.M = f; f += kC * kC;
  t.b = f;
  t.ld = kLd;
  t.scale = p.scale;
  const BlockCtx ctx{int(threadIdx.x), int(blockDim.x)};

  const int64_t n = blockIdx.x;
  const int hv = blockIdx.y;
  const int64_t KV = int64_t(kHeadDim) * kHeadDim;
  const int64_t slice = (n * p.value_heads + hv) * KV;
  for (int e = threadIdx.x; e < KV; e += blockDim.x) {
    const int c = e / kHeadDim, v = e % kHeadDim;
    t.dS[c * kLd + v] = p.d_final_state ? load_f(p.d_final_state, slice + state_elem(p.state_k_first, c, v), p.d_final_is_f32) : 0.f;
  }
  __syncthreads();

  const SeqIndex::Span sp = p.seqs.span(n);
  const int64_t chunks = (sp.length + kC - 1) / kC;
  for (int64_t j = chunks - 1; j >= 0; --j) {
    const int rows = int(sp.length - j * kC < kC ? sp.length - j * kC : kC);
    load_chunk(p, t, n, sp.begin + j * kC, rows, hv, false);
    cumulate_gate(t, ctx);
    grams(t, ctx);
    grad_U(t, ctx);
    solve_dR(t, ctx);
    // dS of this chunk's end, for the chunk-gradient kernel (k-first, fp32). Each thread stores
    // the elements it updates next, so no barrier is needed in between.
    float* out = p.dstates + ((sp.first_slot + j) * p.value_heads + hv) * KV;
    for (int e = threadIdx.x; e < KV; e += blockDim.x) out[e] = t.dS[(e / kHeadDim) * kLd + e % kHeadDim];
    state_grad_step(t, ctx);
  }

  if (p.d_initial_state)
    for (int e = threadIdx.x; e < KV; e += blockDim.x) {
      const int c = e / kHeadDim, v = e % kHeadDim;
      store_f(p.d_initial_state, slice + state_elem(p.state_k_first, c, v), t.dS[c * kLd + v], p.d_initial_is_f32);
    }
}

}  // namespace

cudaError_t launch_chain(const BackwardParams& p, uint64_t context_key, cudaStream_t stream) {
  KernelLaunch k;
  k.grid_x = unsigned(p.seqs.num_seqs);
  k.grid_y = unsigned(p.value_heads);
  k.block = kThreads;
  k.smem_bytes = k.smem_attr = kSmemBytes;
  return launch_planned<chain_kernel>(k, context_key, p, stream);
}

}  // namespace flash_kda::sm90::bwd
