// The record kernel: every chunk's record (records.h) from the prepared q_hat, k_hat, log decay
// a and b of the workspace, one block per (chunk row, value head), before the chain and the
// chunk gradients read it. Each exponential of a chunk is taken here once: every factor is
// exp of a difference of cumulative log decays that is <= 0 (or of G_i, GC themselves), so none
// overflows, however strong the decay.
//
// Three phases, each spread over the whole block where it has the work:
// 1. per (channel, half chunk), all 256 threads: the cumulative decay G, the scaled rows kd, qd,
//    kr and G to the record, and G, q, k to shared memory;
// 2. the Grams A and M, one warp per pair of rows (w, 15 - w): 15 strict pairs (i, j), j < i,
//    each giving an A and an M entry, plus the two diagonal M entries, 32 sums in all. Each lane
//    sums 4 channels of every pair, and one reduce-scatter across the warp leaves the sum of
//    entry `lane` in lane `lane`;
// 3. Tinv by forward substitution in one warp, while the others store A and M.
// Every sum runs in a fixed order, so the record is the same bits from run to run.
#include "sm90/backward/kernels.h"
#include "sm90/backward/records.h"
#include "sm90/common/launch_config.h"
#include "sm90/common/ptx.cuh"
#include "sm90/common/seq_index.h"

namespace flash_kda::sm90::bwd {
namespace {

constexpr int kThreads = 256;
constexpr int kHalf = kC / 2;  // tokens per thread in phase 1
static_assert(kThreads == 2 * kHeadDim, "phase 1: one thread per (channel, half chunk)");
static_assert(kThreads / 32 == kC / 2, "phase 2: one warp per pair of rows (w, 15 - w)");
static_assert(kHeadDim == 4 * 32, "phase 2: each lane sums 4 consecutive channels");
static_assert(RecordField::M == RecordField::A + kC * kC, "A and M are stored as one run");

struct Smem {
  float G[kC][kHeadDim], q[kC][kHeadDim], k[kC][kHeadDim];
  float A[kC][kC], M[kC][kC];  // the record's order: stored as one run
  float b[kC];
};

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }

/// Lane-partial Gram sums of pair (i, j), j < i, over the lane's 4 channels:
/// a = sum k_i E_ij k_j and m = sum q_i E_ij k_j, E_ij = exp(G_i - G_j) <= 1.
__device__ __forceinline__ void pair_sums(float4 Gi, float4 ki, float4 qi, float4 Gj, float4 kj, float& a, float& m) {
  const float e0 = expf(Gi.x - Gj.x) * kj.x, e1 = expf(Gi.y - Gj.y) * kj.y;
  const float e2 = expf(Gi.z - Gj.z) * kj.z, e3 = expf(Gi.w - Gj.w) * kj.w;
  a = ki.x * e0;
  m = qi.x * e0;
  a = fmaf(ki.y, e1, a);
  m = fmaf(qi.y, e1, m);
  a = fmaf(ki.z, e2, a);
  m = fmaf(qi.z, e2, m);
  a = fmaf(ki.w, e3, a);
  m = fmaf(qi.w, e3, m);
}

/// The diagonal M sum (E_ii = 1) over the lane's 4 channels.
__device__ __forceinline__ float diag_sum(float4 qi, float4 ki) {
  return fmaf(qi.w, ki.w, fmaf(qi.z, ki.z, fmaf(qi.y, ki.y, qi.x * ki.x)));
}

/// One step of the warp's reduce-scatter of v[0 .. 2W): a lane keeps the half of the entries
/// whose index has the lane's bit W, adds its partner's (lane ^ W) copy of them, and leaves
/// them in v[0 .. W).
template <int W>
__device__ __forceinline__ void reduce_half(float (&v)[32], int lane) {
  const bool upper = lane & W;
#pragma unroll
  for (int s = 0; s < W; ++s) {
    const float keep = upper ? v[s + W] : v[s];
    const float give = upper ? v[s] : v[s + W];
    v[s] = keep + __shfl_xor_sync(0xffffffffu, give, W);
  }
}

// 64 registers, no spills: four blocks (32 warps) per SM to hide phase 1's loads.
__global__ void __launch_bounds__(kThreads, 4) records_kernel(BackwardParams p) {
  const int64_t slot = blockIdx.x;
  const int hv = blockIdx.y;
  const int64_t n = p.seqs.seq_of_slot(slot);
  const SeqIndex::Span sp = p.seqs.span(n);
  const int64_t j0 = slot - sp.first_slot;  // the chunk of sequence n
  if (j0 < 0 || j0 * kC >= sp.length) return;  // a row no chunk owns: never read
  const int rows = int(sp.length - j0 * kC < kC ? sp.length - j0 * kC : kC);
  const int64_t tok0 = sp.begin + j0 * kC;
  const int h = hv / p.group;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;

  __shared__ __align__(16) Smem sm;
  float* rec = p.records + (slot * p.value_heads + hv) * int64_t(kRecordFloats);

  // Phase 1: thread (c, half) takes channel c of tokens r0 .. r0 + 7. Both halves sum a over all
  // 16 tokens in order (the half of tokens 8..15 needs G_7, the other GC), so G has the same
  // bits in both. Every load is issued before the first store (the record could alias the
  // inputs as far as the compiler knows).
  {
    const int c = tid % kHeadDim, r0 = (tid / kHeadDim) * kHalf;
    // One pointer per input, stepped a token at a time: a 64-bit add per load, where indexing
    // from the parameters costs ~7 instructions per load.
    const float* pa = p.a + (tok0 * p.value_heads + hv) * kHeadDim + c;
    const float* pq = p.q_hat + ((tok0 + r0) * p.heads + h) * kHeadDim + c;
    const float* pk = p.k_hat + ((tok0 + r0) * p.heads + h) * kHeadDim + c;
    const int64_t sa = int64_t(p.value_heads) * kHeadDim, sq = int64_t(p.heads) * kHeadDim;
    float a[kC], qv[kHalf], kv[kHalf];
#pragma unroll
    for (int i = 0; i < kC; ++i, pa += sa) a[i] = i < rows ? *pa : 0.f;
#pragma unroll
    for (int i = 0; i < kHalf; ++i, pq += sq, pk += sq) {
      qv[i] = r0 + i < rows ? *pq : 0.f;
      kv[i] = r0 + i < rows ? *pk : 0.f;
    }
    const float bv = tid < rows ? p.b[(tok0 + tid) * p.value_heads + hv] : 0.f;  // rows <= 16

    float g[kC];
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < kC; ++i) g[i] = acc += a[i];
    const float GC = acc;
    if (r0 == 0) rec[RecordField::eg + c] = expf(GC);
#pragma unroll
    for (int i = 0; i < kHalf; ++i) {
      const int r = r0 + i;
      const float Gr = r0 == 0 ? g[i] : g[kHalf + i];
      sm.G[r][c] = Gr;
      sm.q[r][c] = qv[i];
      sm.k[r][c] = kv[i];
      const float e = expf(Gr);
      rec[RecordField::G + r * kHeadDim + c] = Gr;
      rec[RecordField::kd + r * kHeadDim + c] = e * kv[i];
      rec[RecordField::qd + r * kHeadDim + c] = p.scale * e * qv[i];
      rec[RecordField::kr + r * kHeadDim + c] = expf(GC - Gr) * kv[i];
    }
    if (tid < kC) {
      sm.b[tid] = bv;
      rec[RecordField::b + tid] = bv;
    }
    // The entries no pair of phase 2 writes: A on and above the diagonal, M above it.
    const int i = tid / kC, j = tid % kC;
    if (j >= i) sm.A[i][j] = 0.f;
    if (j > i) sm.M[i][j] = 0.f;
  }
  __syncthreads();

  // Phase 2: warp w takes row il = 15 - w (pairs j = 0 .. 14 - w) and row is = w (pairs
  // j = 0 .. w - 1): pair slot t (entries 2t: A, 2t + 1: M) is (il, t) for t < il and
  // (is, 14 - t) after it; entries 30 and 31 are M_is,is and M_il,il. Each lane owns channels
  // 4 lane .. 4 lane + 3, so a warp's float4 loads of a row are one conflict-free 512 bytes.
  {
    const int il = kC - 1 - warp, is = warp, c0 = 4 * lane;
    float v[32];
    {
      const float4 Gi = ld4(&sm.G[il][c0]), ki = ld4(&sm.k[il][c0]), qi = ld4(&sm.q[il][c0]);
      // t < il holds for every t < 8 as well; the test keeps each pair's loads next to its use
      // (without it the compiler hoists them all and runs out of registers).
#pragma unroll
      for (int t = 0; t < kC - 1; ++t)
        if (t < il) pair_sums(Gi, ki, qi, ld4(&sm.G[t][c0]), ld4(&sm.k[t][c0]), v[2 * t], v[2 * t + 1]);
      v[31] = diag_sum(qi, ki);
    }
    {
      const float4 Gi = ld4(&sm.G[is][c0]), ki = ld4(&sm.k[is][c0]), qi = ld4(&sm.q[is][c0]);
#pragma unroll
      for (int t = 0; t < kC - 1; ++t)  // il >= 8: no slot below 8 is the short row's
        if (t >= kHalf && t >= il) pair_sums(Gi, ki, qi, ld4(&sm.G[kC - 2 - t][c0]), ld4(&sm.k[kC - 2 - t][c0]), v[2 * t], v[2 * t + 1]);
      v[30] = diag_sum(qi, ki);
    }
    // Reduce-scatter over the warp: 31 shuffles leave entry `lane`'s sum in lane `lane`.
    reduce_half<16>(v, lane);
    reduce_half<8>(v, lane);
    reduce_half<4>(v, lane);
    reduce_half<2>(v, lane);
    reduce_half<1>(v, lane);
    const int t = lane / 2;
    if (lane >= 2 * (kC - 1))
      sm.M[lane == 30 ? is : il][lane == 30 ? is : il] = p.scale * v[0];
    else if (lane % 2 == 0)
      sm.A[t < il ? il : is][t < il ? t : kC - 2 - t] = v[0];
    else
      sm.M[t < il ? il : is][t < il ? t : kC - 2 - t] = p.scale * v[0];
  }
  __syncthreads();

  // Phase 3: Tinv = (I + diag(b) A)^-1 by forward substitution, one thread per column j:
  // Tinv_ij = [i == j] - b_i sum_{j <= m < i} A_im Tinv_mj. Meanwhile warps 1..4 store A and M.
  if (tid < kC) {
    const int j = tid;
    float col[kC];
#pragma unroll
    for (int i = 0; i < kC; ++i) {
      float acc = i == j ? 1.f : 0.f;
#pragma unroll
      for (int m = 0; m < i; ++m) acc -= sm.b[i] * sm.A[i][m] * col[m];
      col[i] = i < j ? 0.f : acc;
      rec[RecordField::Tinv + i * kC + j] = col[i];
    }
  } else if (tid >= 32 && tid < 32 + 2 * kC * kC / 4) {
    const int e = tid - 32;  // 16 bytes of A, M
    ptx::st_global_v4(rec + RecordField::A + 4 * e, reinterpret_cast<const uint4*>(&sm.A[0][0])[e]);
  }
}

}  // namespace

cudaError_t launch_records(const BackwardParams& p, cudaStream_t stream) {
  if (p.total_tokens == 0) return cudaSuccess;
  KernelLaunch k;
  k.grid_x = unsigned(p.rows);
  k.grid_y = unsigned(p.value_heads);
  k.block = kThreads;
  return launch_planned<records_kernel>(k, 0, p, stream);  // no dynamic shared memory: no context key
}

}  // namespace flash_kda::sm90::bwd
