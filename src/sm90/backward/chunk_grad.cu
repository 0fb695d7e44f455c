// The input gradients of every chunk at once: one block of 8 warps per (chunk row, value head)
// copies the state before its chunk (the recompute's intermediate state), the gradient of the
// state after it (the chain's) and the chunk's record (records.h) into shared memory and runs
// the chunk's backward (chunk_algebra.cuh), writing dv (v's dtype) and the fp32 per-value-head
// dq_hat, dk_hat, da, db to the workspace, which the finish kernels reduce over GVA heads and
// take through the norm, the gate and the beta activation.
//
// Phases (a block barrier between them):
//   load   S and the record's kd, G, A, M, Tinv, b (cp.async group 0), dS and kr (group 1),
//          v, dO, q_hat, k_hat (plain loads); X = v - kd S starts once group 0 has landed.
//   1      warp w owns value columns 16w .. 16w + 15 of X, dU = M^T dO + kr dS (tensor cores),
//          then of U = Tinv diag(b) X, dR = Tinv^T dU and dv = diag(b) dR (fp32, the warp's
//          own columns hold every token, so only warp barriers are needed).
//   2      warp w owns key columns 16w .. of dkd = -diag(b) dR S^T, dqd = dO S^T, dkr = U dS^T
//          (tensor cores); warps 0-3 also form dL = -strict_lower(dR U^T), dM = lower(dO U^T),
//          warps 4-7 the row sums of dS o S (grad_decay's state term).
//   3      db per token (a warp per two tokens); then a thread per (key channel, pair parity)
//          adds the pair terms of dq, dk, dG (E_ij = exp(G_i - G_j), once per pair), the
//          parity-0 thread also the per-token terms; the two halves meet through shared memory
//          in a fixed order, and the parity-0 thread writes dq, dk and da (the reverse
//          cumulative sum of dG, with GC's own terms on the last token).
#include "sm90/backward/chunk_grad_products.cuh"
#include "sm90/backward/chunk_load.cuh"
#include "sm90/backward/kernels.h"
#include "sm90/backward/records.h"
#include "sm90/common/launch_config.h"
#include "sm90/common/ptx.cuh"

namespace flash_kda::sm90::bwd {
namespace {

static_assert(kGradDim == kHeadDim, "the products are sized for the kernels' head dimension");

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kStateFloats = kHeadDim * kHeadDim;  // S, dS (swizzled, chunk_grad_products.cuh)
constexpr int kRowTile = kC * kRowLd;              // padded 16-row tiles
constexpr int kColTile = kC * kHeadDim;            // G, q, k (read a column per thread)
constexpr int kSmemFloats = 2 * kStateFloats + 7 * kRowTile + 3 * kColTile + 5 * kC * kC + kC + kHeadDim;
constexpr int kSmemBytes = kSmemFloats * 4;  // 220,480 B: one block per SM
static_assert(kSmemBytes <= 227 * 1024, "over sm_90's shared memory per block");
static_assert(kWarps * 16 == kHeadDim, "a warp per 16 output columns");

/// Shared-memory tiles of one block (floats). kd and kr are dead after phase 1 and hold dkd and
/// dkr from phase 2; dO, U and dR hold the parity-1 partial sums at the end of phase 3.
struct Smem {
  float *S, *dS;                          // [K][V] swizzled
  float *kd, *kr, *dO, *X, *U, *dR, *dqd;  // [16][kRowLd]; X holds v, dR holds dU first
  float *G, *q, *k;                       // [16][K]
  float *A, *M, *Tinv, *dL, *dM;          // [16][16]
  float *b, *rowsum;                      // [16], [K]
};

__device__ __forceinline__ Smem carve(float* s) {
  Smem m;
  m.S = s; s += kStateFloats;
  m.dS = s; s += kStateFloats;
  m.kd = s; s += kRowTile;
  m.kr = s; s += kRowTile;
  m.dO = s; s += kRowTile;
  m.X = s; s += kRowTile;
  m.U = s; s += kRowTile;
  m.dR = s; s += kRowTile;
  m.dqd = s; s += kRowTile;
  m.G = s; s += kColTile;
  m.q = s; s += kColTile;
  m.k = s; s += kColTile;
  m.A = s; s += kC * kC;
  m.M = s; s += kC * kC;
  m.Tinv = s; s += kC * kC;
  m.dL = s; s += kC * kC;
  m.dM = s; s += kC * kC;
  m.b = s; s += kC;
  m.rowsum = s;
  return m;
}

/// `rows` x 128 floats at src (row stride 128) into a shared tile of row stride ld, by cp.async.
__device__ __forceinline__ void copy_rows(float* dst, int ld, const float* src, int rows) {
  for (int e = threadIdx.x; e < rows * (kHeadDim / 4); e += kThreads) {
    const int r = e / (kHeadDim / 4), c = (e % (kHeadDim / 4)) * 4;
    ptx::cp_async_16(dst + r * ld + c, src + r * kHeadDim + c);
  }
}

/// A K x V k-first fp32 state at src into a swizzled state tile, by cp.async.
__device__ __forceinline__ void copy_state(float* dst, const float* src) {
  for (int e = threadIdx.x; e < kStateFloats / 4; e += kThreads) {
    const int c = e / (kHeadDim / 4), v = (e % (kHeadDim / 4)) * 4;
    ptx::cp_async_16(dst + state_off(c, v), src + c * kHeadDim + v);
  }
}

/// A V x K (v-first) fp32 state at src into a swizzled (k-first) state tile: 16-byte loads
/// along k, transposed by four 4-byte stores.
__device__ __forceinline__ void load_state_transposed(float* dst, const float* src) {
  for (int e = threadIdx.x; e < kStateFloats / 4; e += kThreads) {
    const int v = e / (kHeadDim / 4), c = (e % (kHeadDim / 4)) * 4;
    const float4 x = __ldg(reinterpret_cast<const float4*>(src + v * kHeadDim + c));
    dst[state_off(c, v)] = x.x;
    dst[state_off(c + 1, v)] = x.y;
    dst[state_off(c + 2, v)] = x.z;
    dst[state_off(c + 3, v)] = x.w;
  }
}

/// v, dO (into X, dO) and q_hat, k_hat (into q, k) of the chunk's `rows` tokens; zero past them.
__device__ __forceinline__ void load_tokens(const BackwardParams& p, const Smem& m, int64_t tok0, int rows, int hv) {
  const int h = hv / p.group;
  const bool varlen = p.seqs.cu_seqlens != nullptr;
  for (int e = threadIdx.x; e < kC * kHeadDim; e += kThreads) {
    const int i = e / kHeadDim, c = e % kHeadDim;
    float q = 0.f, k = 0.f, o = 0.f, v = 0.f;
    if (i < rows) {
      const int64_t tok = tok0 + i;
      q = p.q_hat[(tok * p.heads + h) * kHeadDim + c];
      k = p.k_hat[(tok * p.heads + h) * kHeadDim + c];
      const int64_t ln = layout_seq(tok, p.seqs.seqlen, varlen);
      o = load_f_at(p.d_out, p.d_out_rows.offset(ln, tok, hv) + int64_t(c) * (p.d_out_is_f32 ? 4 : 2), p.d_out_is_f32);
      v = __bfloat162float(
          reinterpret_cast<const __nv_bfloat16*>(static_cast<const char*>(p.v) + p.v_rows.offset(ln, tok, hv))[c]);
    }
    m.q[e] = q;
    m.k[e] = k;
    m.dO[i * kRowLd + c] = o;
    m.X[i * kRowLd + c] = v;
  }
}

/// Phase 1 of warp `w`: X, dU, U, dR and dv on value columns 16w .. 16w + 15 (see the header).
/// Ends with the block barrier after which U and dR are complete.
__device__ __forceinline__ void phase_values(const BackwardParams& p, const Smem& m, int w, int64_t tok0, int rows,
                                             int hv) {
  const DeviceWarp warp;
  const int lane = int(threadIdx.x & 31), n0 = 16 * w;
  FragC acc[2] = {};
  product_residual(warp, acc, n0, m.kd, m.S);
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int r = 0; r < 4; ++r)
      m.X[frag_c_row(lane, r) * kRowLd + n0 + 8 * nt + frag_c_col(lane, r)] -= acc[nt].x[r];

  ptx::cp_async_wait<0>();  // dS and kr
  __syncthreads();
  FragC du[2] = {};
  product_dU(warp, du, n0, m.M, m.dO, m.kr, m.dS);
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int r = 0; r < 4; ++r) m.dR[frag_c_row(lane, r) * kRowLd + n0 + 8 * nt + frag_c_col(lane, r)] = du[nt].x[r];
  __syncwarp();

  // U_i = sum_{j<=i} Tinv_ij b_j X_j and dR_i = sum_{j>=i} Tinv_ji dU_j on this lane's
  // accumulator positions (every token of the warp's columns is in the warp's tiles).
  float dr[2][4];
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int i = frag_c_row(lane, r), v = n0 + 8 * nt + frag_c_col(lane, r);
      float u = 0.f, d = 0.f;
      for (int j = 0; j <= i; ++j) u += m.Tinv[i * kC + j] * m.b[j] * m.X[j * kRowLd + v];
      for (int j = i; j < kC; ++j) d += m.Tinv[j * kC + i] * m.dR[j * kRowLd + v];
      m.U[i * kRowLd + v] = u;
      dr[nt][r] = d;
    }
  __syncwarp();
  __nv_bfloat16* dv = static_cast<__nv_bfloat16*>(p.dv);
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int r = 0; r < 4; r += 2) {  // registers r, r + 1: one token, two adjacent columns
      const int i = frag_c_row(lane, r), v = n0 + 8 * nt + frag_c_col(lane, r);
      m.dR[i * kRowLd + v] = dr[nt][r];
      m.dR[i * kRowLd + v + 1] = dr[nt][r + 1];
      if (i < rows)
        *reinterpret_cast<__nv_bfloat162*>(dv + ((tok0 + i) * p.value_heads + hv) * kHeadDim + v) =
            __floats2bfloat162_rn(m.b[i] * dr[nt][r], m.b[i] * dr[nt][r + 1]);
    }
  __syncthreads();
}

/// Phase 2 of warp `w`: dkd (into kd), dqd, dkr (into kr) on key columns 16w .. 16w + 15; dL,
/// dM (warps 0-3) or the row sums of dS o S (warps 4-7). Ends with a block barrier.
__device__ __forceinline__ void phase_keys(const Smem& m, int w) {
  const DeviceWarp warp;
  const int lane = int(threadIdx.x & 31), n0 = 16 * w;
  FragC dkd[2] = {}, dqd[2] = {}, dkr[2] = {};
  product_state_T(warp, dkd, dqd, dkr, n0, m.dR, m.dO, m.U, m.S, m.dS);
  // Every warp finished reading kd and kr (phase 1's barrier), so they take dkd and dkr.
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int i = frag_c_row(lane, r), at = i * kRowLd + n0 + 8 * nt + frag_c_col(lane, r);
      m.kd[at] = -m.b[i] * dkd[nt].x[r];
      m.dqd[at] = dqd[nt].x[r];
      m.kr[at] = dkr[nt].x[r];
    }
  if (w < 4) {
    const bool is_dL = w < 2;
    const int j0 = 8 * (w & 1);
    FragC acc = {};
    product_pairs(warp, acc, j0, is_dL ? m.dR : m.dO, m.U);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int i = frag_c_row(lane, r), j = j0 + frag_c_col(lane, r);
      if (is_dL)
        m.dL[i * kC + j] = j < i ? -acc.x[r] : 0.f;
      else
        m.dM[i * kC + j] = j <= i ? acc.x[r] : 0.f;
    }
  } else {
    for (int c = (w - 4) * 32; c < (w - 3) * 32; ++c) {
      float s = 0.f;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int at = state_off(c, lane + 32 * q);
        s += m.dS[at] * m.S[at];
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane == 0) m.rowsum[c] = s;
    }
  }
  __syncthreads();
}

/// db_i = dR_i . X_i + sum_{j<i} dL_ij A_ij for tokens 2w, 2w + 1 (warp w), to p.db.
__device__ __forceinline__ void grad_beta(const BackwardParams& p, const Smem& m, int w, int64_t tok0, int rows,
                                          int hv) {
  const int lane = int(threadIdx.x & 31);
  for (int i = 2 * w; i < 2 * w + 2; ++i) {
    float s = 0.f;
#pragma unroll
    for (int q = 0; q < 4; ++q) s += m.dR[i * kRowLd + lane + 32 * q] * m.X[i * kRowLd + lane + 32 * q];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0 && i < rows) {
      for (int j = 0; j < i; ++j) s += m.dL[i * kC + j] * m.A[i * kC + j];
      p.db[(tok0 + i) * p.value_heads + hv] = s;
    }
  }
}

/// The pair terms of dq, dk, dG on key channel c for the pairs (i, j), j <= i, with
/// (i + j) % 2 == kParity (the diagonal is parity 0), added to dq, dk, dG (chunk_algebra.cuh's
/// grad_keys; E_ij = exp(G_i - G_j) once per pair, serving both tokens).
template <int kParity>
__device__ __forceinline__ void pair_terms(const Smem& m, float scale, const float (&G)[kC], const float (&q)[kC],
                                           const float (&k)[kC], float (&dq)[kC], float (&dk)[kC], float (&dG)[kC]) {
#pragma unroll
  for (int i = 0; i < kC; ++i)
#pragma unroll
    for (int j = 0; j <= i; ++j) {
      if (((i + j) & 1) != kParity) continue;
      if (j == i) {  // E_ii = 1; the two dG terms cancel
        const float mm = scale * m.dM[i * kC + i];
        dq[i] += mm * k[i];
        dk[i] += mm * q[i];
        continue;
      }
      const float E = fexp(G[i] - G[j]);
      const float mm = scale * m.dM[i * kC + j] * E;  // scale dM_ij E_ij
      const float aa = m.b[i] * m.dL[i * kC + j] * E;  // dA_ij E_ij
      dq[i] += mm * k[j];
      dk[j] += mm * q[i] + aa * k[i];
      dk[i] += aa * k[j];
      const float g = (mm * q[i] + aa * k[i]) * k[j];
      dG[i] += g;
      dG[j] -= g;
    }
}

/// Phase 3 (after grad_beta): dq_hat, dk_hat, da of the chunk's `rows` tokens on key channel
/// threadIdx.x % 128 (see the header).
__device__ __forceinline__ void phase_channels(const BackwardParams& p, const Smem& m, int64_t tok0, int rows,
                                               int hv) {
  const int c = int(threadIdx.x) % kHeadDim, half = int(threadIdx.x) / kHeadDim;
  float G[kC], q[kC], k[kC], dq[kC], dk[kC], dG[kC];
#pragma unroll
  for (int i = 0; i < kC; ++i) {
    G[i] = m.G[i * kHeadDim + c];
    q[i] = m.q[i * kHeadDim + c];
    k[i] = m.k[i * kHeadDim + c];
    dq[i] = dk[i] = dG[i] = 0.f;
  }
  float last = 0.f;  // GC's own terms: sum_t dkr_t kr_t + exp(GC) rowsum(dS o S)
  if (half == 0) {
    pair_terms<0>(m, p.scale, G, q, k, dq, dk, dG);
#pragma unroll
    for (int i = 0; i < kC; ++i) {
      const float eg = fexp(G[i]), er = fexp(G[kC - 1] - G[i]);
      const float dkd = m.kd[i * kRowLd + c], dqd = m.dqd[i * kRowLd + c], dkr = m.kr[i * kRowLd + c];
      const float kr_dkr = er * k[i] * dkr;
      dq[i] += p.scale * eg * dqd;
      dk[i] += eg * dkd + er * dkr;
      dG[i] += eg * k[i] * dkd + p.scale * eg * q[i] * dqd - kr_dkr;
      last += kr_dkr;
      if (i == kC - 1) last += eg * m.rowsum[c];
    }
  } else {
    pair_terms<1>(m, p.scale, G, q, k, dq, dk, dG);
  }
  __syncthreads();  // grad_beta and every warp's reads of dO, U, dR are done
  if (half == 1)
#pragma unroll
    for (int i = 0; i < kC; ++i) {
      m.dO[i * kRowLd + c] = dq[i];
      m.U[i * kRowLd + c] = dk[i];
      m.dR[i * kRowLd + c] = dG[i];
    }
  __syncthreads();
  if (half == 1) return;
  const int64_t row = (tok0 * p.value_heads + hv) * kHeadDim + c, stride = int64_t(p.value_heads) * kHeadDim;
  float acc = last;
#pragma unroll
  for (int i = kC - 1; i >= 0; --i) {
    acc += dG[i] + m.dR[i * kRowLd + c];
    if (i < rows) {
      p.dq_hat[row + i * stride] = dq[i] + m.dO[i * kRowLd + c];
      p.dk_hat[row + i * stride] = dk[i] + m.U[i * kRowLd + c];
      p.da[row + i * stride] = acc;
    }
  }
}

__global__ void __launch_bounds__(kThreads, 1) chunk_grad_kernel(BackwardParams p) {
  const int64_t slot = blockIdx.x;
  const int hv = blockIdx.y;
  const int64_t n = p.seqs.seq_of_slot(slot);
  const SeqIndex::Span sp = p.seqs.span(n);
  const int64_t j = slot - sp.first_slot;  // the chunk of sequence n
  if (j < 0 || j * kC >= sp.length) return;  // a row no chunk owns
  const int rows = int(sp.length - j * kC < kC ? sp.length - j * kC : kC);
  const int64_t tok0 = sp.begin + j * kC;
  const int w = int(threadIdx.x) / 32;

  const Smem m = carve(reinterpret_cast<float*>(dynamic_smem()));
  const int64_t KV = int64_t(kHeadDim) * kHeadDim;
  const float* st = p.states + (slot * p.value_heads + hv) * KV;
  const float* ds = p.dstates + (slot * p.value_heads + hv) * KV;
  const float* rec = p.records + (slot * p.value_heads + hv) * int64_t(kRecordFloats);

  // Group 0: what X = v - kd S needs (and the small matrices); group 1: what dU needs.
  if (p.state_k_first) copy_state(m.S, st);
  copy_rows(m.kd, kRowLd, rec + RecordField::kd, kC);
  copy_rows(m.G, kHeadDim, rec + RecordField::G, kC);
  for (int e = threadIdx.x; e < kC * kC / 4; e += kThreads) {
    ptx::cp_async_16(m.A + 4 * e, rec + RecordField::A + 4 * e);
    ptx::cp_async_16(m.M + 4 * e, rec + RecordField::M + 4 * e);
    ptx::cp_async_16(m.Tinv + 4 * e, rec + RecordField::Tinv + 4 * e);
  }
  if (threadIdx.x < kC / 4) ptx::cp_async_16(m.b + 4 * threadIdx.x, rec + RecordField::b + 4 * threadIdx.x);
  ptx::cp_async_commit();
  copy_state(m.dS, ds);
  copy_rows(m.kr, kRowLd, rec + RecordField::kr, kC);
  ptx::cp_async_commit();
  if (!p.state_k_first) load_state_transposed(m.S, st);
  load_tokens(p, m, tok0, rows, hv);
  ptx::cp_async_wait<1>();
  __syncthreads();

  phase_values(p, m, w, tok0, rows, hv);
  phase_keys(m, w);
  grad_beta(p, m, w, tok0, rows, hv);
  phase_channels(p, m, tok0, rows, hv);
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
