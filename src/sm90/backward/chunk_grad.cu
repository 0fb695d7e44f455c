// The input gradients of every chunk at once: one block of 8 warps per (chunk row, value head)
// runs the chunk's backward (chunk_algebra.cuh) from the state before its chunk (the recompute's
// intermediate state), the gradient of the state after it (the chain's) and the chunk's record
// (records.h), writing dv (v's dtype) and the fp32 per-value-head dq_hat, dk_hat, da, db to the
// workspace, which the finish kernels reduce over GVA heads and take through the norm, the gate
// and the beta activation.
//
// The algebra is separable over the value columns V: for a slice sl of them,
//   X[:, sl] = v[:, sl] - kd S[:, sl]     dU[:, sl] = M^T dO[:, sl] + kr dS[:, sl]
//   U[:, sl] = Tinv diag(b) X[:, sl]      dR[:, sl] = Tinv^T dU[:, sl]     dv = diag(b) dR
// while the products that contract over V add up over the slices:
//   dkd += -diag(b) dR S^T, dqd += dO S^T, dkr += U dS^T, dL += -dR U^T (strict lower),
//   dM += dO U^T (lower), rowsum(dS o S) and db's dR . X.
// So the block walks V in kSlices slices of kSliceV columns and holds only two K x kSliceV
// slices of S and of dS (double-buffered: slice s + 1 lands by cp.async while slice s is
// computed), 109,696 B of shared memory in all: two blocks fit an SM, so one block's loads and
// barriers overlap the other's compute.
//
// Loads: kd, kr, A, M, Tinv, b and slice 0 (cp.async group), slice 1 (group), v and dO (plain
// loads, converted); G, q_hat, k_hat (for the channel phase) go by cp.async into slice 0's
// buffer while the last slice is computed.
// Per slice s (a block barrier before it, after which slice s + 1's copies are issued; slices 0
// and 1 go before the loop):
//   A   warps 0-3 own slice columns 8w .. 8w + 7: X (in place of v), then U (every token of
//       the warp's columns is the warp's, so a warp barrier suffices); warps 4-7 own columns
//       8(w - 4) ..: dU, then dR and dv, and the slice's terms of the row sums of dS o S
//       (grad_decay's state term).
//   B   (after a block barrier) warp w adds the slice's terms of dkd, dqd, dkr on key columns
//       16w .. 16w + 15 (accumulators in registers across slices); warps 0-3 those of dL, dM
//       (one 8-column n-tile each), warps 4-7 those of dR . X per token.
// Every product is a 3xTF32 mma.sync (chunk_grad_products.cuh says why).
// Every accumulator adds its slices in order and its lanes in a fixed tree: deterministic.
// Then, after a barrier: dkd, dqd, dkr, dL, dM, the row sums and dR . X to shared memory; db
// per token; then the channel phase: a thread per (key channel, pair parity) adds the pair terms of dq, dk, dG
// (E_ij = exp(G_i - G_j), once per pair), the parity-0 thread also the per-token terms; the two
// halves meet through shared memory in a fixed order, and the parity-0 thread writes dq, dk and
// da (the reverse cumulative sum of dG, plus exp(GC) rowsum(dS o S) and the kr terms of the
// tokens before: phase_channels).
#include "sm90/backward/chunk_grad_products.cuh"
#include "sm90/backward/kernels.h"
#include "sm90/backward/records.h"
#include "sm90/backward/state_access.cuh"
#include "sm90/common/launch_config.h"
#include "sm90/common/ptx.cuh"

namespace flash_kda::sm90::bwd {
namespace {

static_assert(kGradDim == kHeadDim, "the products are sized for the kernels' head dimension");

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kSlices = kHeadDim / kSliceV;
constexpr int kBufFloats = 2 * kSliceFloats;  // a slice of S and of dS
constexpr int kRowTile = kC * kRowLd;         // padded 16-row tiles
constexpr int kSliceTile = kC * kSliceLd;     // padded 16-row slice tiles
constexpr int kColTile = kC * kHeadDim;       // G, q, k and the channel phase's sums
constexpr int kSmemFloats = 2 * kBufFloats + 4 * kRowTile + 2 * kSliceTile + 5 * kC * kC + 2 * kC + kHeadDim;
constexpr int kSmemBytes = kSmemFloats * 4;  // 109,696 B: two blocks per SM
static_assert(2 * (kSmemBytes + 1024) <= 228 * 1024, "two blocks per SM (1 KB reserved per block)");
static_assert(4 * kColTile <= kBufFloats, "G, q, k, dq and the partial sums fit a slice buffer");
static_assert(kWarps == 8 && kSliceV == 32, "warps 0-3 and 4-7 each own the slice's four n-tiles");
static_assert(kWarps * 16 == kHeadDim, "a warp per 16 key columns");

/// Shared-memory tiles of one block (floats). After the slices, kd, kr and X hold dkd, dkr and
/// dqd; buffer 0 holds G, q, k (copied during the last slice) and buffer 1 the channel phase's
/// parity-1 sums.
struct Smem {
  float* buf;                     // two buffers of kBufFloats: a slice of S, then of dS
                                  // (chunk_grad_products.cuh's slice layouts)
  float *kd, *kr, *dO, *X;        // [16][kRowLd]; X holds v first
  float *U, *dR;                  // [16][kSliceLd], the current slice; dR holds dU first
  float *A, *M, *Tinv, *dL, *dM;  // [16][16]
  float *b, *db, *rowsum;         // [16], [16] (sum_v dR X), [K]
};

__device__ __forceinline__ Smem carve(float* s) {
  Smem m;
  m.buf = s; s += 2 * kBufFloats;
  m.kd = s; s += kRowTile;
  m.kr = s; s += kRowTile;
  m.dO = s; s += kRowTile;
  m.X = s; s += kRowTile;
  m.U = s; s += kSliceTile;
  m.dR = s; s += kSliceTile;
  m.A = s; s += kC * kC;
  m.M = s; s += kC * kC;
  m.Tinv = s; s += kC * kC;
  m.dL = s; s += kC * kC;
  m.dM = s; s += kC * kC;
  m.b = s; s += kC;
  m.db = s; s += kC;
  m.rowsum = s;
  return m;
}

/// The buffer of slice s (S's slice, then dS's).
__device__ __forceinline__ float* slice_buf(const Smem& m, int s) { return m.buf + (s & 1) * kBufFloats; }

// The copies below give each thread kThreads-strided 16-byte pieces in loops of compile-time
// length: a thread's pieces then differ by constants (the swizzles depend only on index bits
// that stay fixed), so each copy is little more than its cp.async.

/// 16 x 128 floats at src (row stride 128) into a shared tile of row stride ld, by cp.async.
__device__ __forceinline__ void copy_rows(float* dst, int ld, const float* src) {
  constexpr int kPieces = kHeadDim / 4;
  static_assert(kC * kPieces % kThreads == 0, "whole rounds of pieces");
  const int t = int(threadIdx.x), c = (t % kPieces) * 4;
#pragma unroll
  for (int it = 0; it < kC * kPieces / kThreads; ++it) {
    const int r = t / kPieces + it * (kThreads / kPieces);
    ptx::cp_async_16(dst + r * ld + c, src + r * kHeadDim + c);
  }
}

/// Slice s (value columns kSliceV s ..) of a k-first K x V fp32 state at src into a k-first
/// slice tile, by cp.async: each key row's slice is 128 contiguous bytes.
__device__ __forceinline__ void copy_slice(KFirstSlice, float* dst, const float* src, int s) {
  constexpr int kPieces = kSliceV / 4;
  static_assert(kHeadDim * kPieces % kThreads == 0 && (kThreads / kPieces) % 8 == 0, "fixed swizzle per thread");
  const int t = int(threadIdx.x), v = (t % kPieces) * 4;
#pragma unroll
  for (int it = 0; it < kHeadDim * kPieces / kThreads; ++it) {
    const int c = t / kPieces + it * (kThreads / kPieces);
    ptx::cp_async_16(dst + KFirstSlice::off(c, v), src + c * kHeadDim + kSliceV * s + v);
  }
}

/// Slice s of a v-first V x K fp32 state at src into a v-first slice tile, by cp.async: the
/// slice is kSliceV contiguous rows.
__device__ __forceinline__ void copy_slice(VFirstSlice, float* dst, const float* src, int s) {
  constexpr int kPieces = kHeadDim / 4;
  static_assert(kSliceV * kPieces % kThreads == 0 && (kThreads / kPieces) % 8 == 0, "fixed swizzle per thread");
  const int t = int(threadIdx.x), c = (t % kPieces) * 4;
#pragma unroll
  for (int it = 0; it < kSliceV * kPieces / kThreads; ++it) {
    const int v = t / kPieces + it * (kThreads / kPieces);
    ptx::cp_async_16(dst + VFirstSlice::off(c, v), src + (kSliceV * s + v) * kHeadDim + c);
  }
}

/// S's and dS's slice s into buffer s % 2, by cp.async (not committed).
template <class L>
__device__ __forceinline__ void copy_states(const Smem& m, const float* st, const float* ds, int s) {
  float* to = slice_buf(m, s);
  copy_slice(L{}, to, st, s);
  copy_slice(KFirstSlice{}, to + kSliceFloats, ds, s);
}

/// v and dO (into X and dO) of the chunk's `rows` tokens, dO of type TO (float or bf16); zero
/// past them. The rows past `rows` read the last token again (in bounds) and are zeroed after,
/// so every load of a thread is issued, unconditionally, before its first use: a thread's 16
/// loads are in flight at once.
template <class TO>
__device__ __forceinline__ void load_tokens_as(const BackwardParams& p, const Smem& m, int64_t tok0, int rows,
                                               int hv) {
  constexpr int kIters = kC * kHeadDim / kThreads;
  const int64_t ln = layout_seq(tok0, p.seqs.seqlen, p.seqs.cu_seqlens != nullptr);
  const int c = int(threadIdx.x) % kHeadDim, i0 = int(threadIdx.x) / kHeadDim;
  // The chunk's tokens are consecutive tokens of one sequence: row i is token_stride bytes on.
  const char* o_row0 = static_cast<const char*>(p.d_out) + p.d_out_rows.offset(ln, tok0, hv);
  const char* v_row0 = static_cast<const char*>(p.v) + p.v_rows.offset(ln, tok0, hv);
  TO o[kIters];
  __nv_bfloat16 v[kIters];
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int i = i0 + it * (kThreads / kHeadDim);
    const int64_t r = i < rows ? i : rows - 1;
    o[it] = reinterpret_cast<const TO*>(o_row0 + r * p.d_out_rows.token_stride)[c];
    v[it] = reinterpret_cast<const __nv_bfloat16*>(v_row0 + r * p.v_rows.token_stride)[c];
  }
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int i = i0 + it * (kThreads / kHeadDim);
    m.dO[i * kRowLd + c] = i < rows ? float(o[it]) : 0.f;
    m.X[i * kRowLd + c] = i < rows ? __bfloat162float(v[it]) : 0.f;
  }
}

__device__ __forceinline__ void load_tokens(const BackwardParams& p, const Smem& m, int64_t tok0, int rows, int hv) {
  if (p.d_out_is_f32)
    load_tokens_as<float>(p, m, tok0, rows, hv);
  else
    load_tokens_as<__nv_bfloat16>(p, m, tok0, rows, hv);
}

/// G (from the record) and q_hat, k_hat of the chunk's `rows` tokens (zero past them) into
/// [16][K] tiles at dst, dst + kColTile, dst + 2 kColTile, by cp.async (not committed).
__device__ __forceinline__ void copy_channels(const BackwardParams& p, float* dst, const float* rec, int64_t tok0,
                                              int rows, int hv) {
  const int h = hv / p.group;
  copy_rows(dst, kHeadDim, rec + RecordField::G);
  constexpr int kPieces = kHeadDim / 4;
  static_assert(kC * kPieces % kThreads == 0, "whole rounds of pieces");
  const int t = int(threadIdx.x), c = (t % kPieces) * 4;
#pragma unroll
  for (int it = 0; it < 2 * kC * kPieces / kThreads; ++it) {
    const int e = t + it * kThreads, which = e / (kC * kPieces), i = (e / kPieces) % kC;
    float* to = dst + (1 + which) * kColTile + i * kHeadDim + c;
    if (i < rows)
      ptx::cp_async_16(to, (which == 0 ? p.q_hat : p.k_hat) + ((tok0 + i) * p.heads + h) * kHeadDim + c);
    else
      *reinterpret_cast<float4*>(to) = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

/// Step A of slice s (see the header) for warp w; S and dS are the slice's tiles. Warps 4-7
/// add the slice's terms of the row sums of dS o S of rows 8 (w - 4 + 4 q) + lane % 8 to
/// aux.x[q] (warps 0-3 hold dL or dM in aux).
template <class L>
__device__ __forceinline__ void slice_values(const BackwardParams& p, const Smem& m, const float* S, const float* dS,
                                             int s, int w, int64_t tok0, int rows, int hv, FragC& aux) {
  const DeviceWarp warp;
  const int lane = int(threadIdx.x & 31), nb = 8 * (w & 3), v0 = kSliceV * s;
  FragC acc = {};
  if (w < 4) {
    // X = v - kd S, then U = Tinv diag(b) X on the warp's columns.
    product_residual<L>(warp, acc, nb, m.kd, S);
#pragma unroll
    for (int r = 0; r < 4; ++r) m.X[frag_c_row(lane, r) * kRowLd + v0 + nb + frag_c_col(lane, r)] -= acc.x[r];
    __syncwarp();
    FragC u = {};
    product_solve_U(warp, u, nb, m.Tinv, m.b, m.X + v0);
#pragma unroll
    for (int r = 0; r < 4; ++r) m.U[frag_c_row(lane, r) * kSliceLd + nb + frag_c_col(lane, r)] = u.x[r];
    return;
  }
  // dU = M^T dO + kr dS, then dR = Tinv^T dU (in place) and dv = diag(b) dR.
  product_dU(warp, acc, nb, m.M, m.dO + v0, m.kr, dS);
#pragma unroll
  for (int r = 0; r < 4; ++r) m.dR[frag_c_row(lane, r) * kSliceLd + nb + frag_c_col(lane, r)] = acc.x[r];
  __syncwarp();
  FragC d = {};
  product_solve_dR(warp, d, nb, m.Tinv, m.dR);
  const float(&dr)[4] = d.x;
  __syncwarp();
  __nv_bfloat16* dv = static_cast<__nv_bfloat16*>(p.dv);
#pragma unroll
  for (int r = 0; r < 4; r += 2) {  // registers r, r + 1: one token, two adjacent columns
    const int i = frag_c_row(lane, r), v = nb + frag_c_col(lane, r);
    m.dR[i * kSliceLd + v] = dr[r];
    m.dR[i * kSliceLd + v + 1] = dr[r + 1];
    if (i < rows)
      *reinterpret_cast<__nv_bfloat162*>(dv + ((tok0 + i) * p.value_heads + hv) * kHeadDim + v0 + v) =
          __floats2bfloat162_rn(m.b[i] * dr[r], m.b[i] * dr[r + 1]);
  }
  // Row sums: lane l takes key row cb + l % 8 and slice columns l / 8, l / 8 + 4, ...: both
  // slice layouts then put the 32 lanes on 32 banks.
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int c = 8 * (w - 4 + 4 * q) + (lane & 7);
#pragma unroll
    for (int v = lane >> 3; v < kSliceV; v += 4) aux.x[q] += dS[KFirstSlice::off(c, v)] * S[L::off(c, v)];
  }
}

/// Step B of slice s for warp w (see the header): dkd, dqd, dkr on key columns 16w ..; dL
/// (warps 0, 1) or dM (warps 2, 3) on token columns 8 (w % 2) .. (into aux); dR . X of token
/// (threadIdx.x - 128) / 8 on slice columns 4 (threadIdx.x % 8) .. + 3 (warps 4-7).
template <class L>
__device__ __forceinline__ void slice_keys(const Smem& m, const float* S, const float* dS, int s, int w,
                                           FragC (&dkd)[2], FragC (&dqd)[2], FragC (&dkr)[2], FragC& aux,
                                           float& dRX) {
  const DeviceWarp warp;
  const int v0 = kSliceV * s;
  product_state_T<L>(warp, dkd, dqd, dkr, 16 * w, m.dR, m.dO + v0, m.U, S, dS);
  if (w < 4) {
    if (w < 2)
      product_pairs(warp, aux, 8 * (w & 1), m.dR, kSliceLd, m.U);
    else
      product_pairs(warp, aux, 8 * (w & 1), m.dO + v0, kRowLd, m.U);
  } else {
    const int e = int(threadIdx.x) - 128, i = e / 8, v = 4 * (e % 8);
    const float4 r = *reinterpret_cast<const float4*>(m.dR + i * kSliceLd + v);
    const float4 x = *reinterpret_cast<const float4*>(m.X + i * kRowLd + v0 + v);
    dRX += r.x * x.x + r.y * x.y + r.z * x.z + r.w * x.w;
  }
}

/// After the slices (and a barrier): the accumulators to shared memory, dkd (as -diag(b) dR S^T)
/// into kd, dqd into X, dkr into kr, dL or dM (aux of warps 0-3), the row sums (aux of warps
/// 4-7) and dR . X.
__device__ __forceinline__ void store_sums(const Smem& m, int w, const FragC (&dkd)[2], const FragC (&dqd)[2],
                                           const FragC (&dkr)[2], FragC aux, float dRX) {
  const int lane = int(threadIdx.x & 31), n0 = 16 * w;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int i = frag_c_row(lane, r), at = i * kRowLd + n0 + 8 * nt + frag_c_col(lane, r);
      m.kd[at] = -m.b[i] * dkd[nt].x[r];
      m.X[at] = dqd[nt].x[r];
      m.kr[at] = dkr[nt].x[r];
    }
  if (w < 4) {
    const bool is_dL = w < 2;
    const int j0 = 8 * (w & 1);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int i = frag_c_row(lane, r), j = j0 + frag_c_col(lane, r);
      if (is_dL)
        m.dL[i * kC + j] = j < i ? -aux.x[r] : 0.f;
      else
        m.dM[i * kC + j] = j <= i ? aux.x[r] : 0.f;
    }
    return;
  }
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    aux.x[q] += __shfl_xor_sync(0xffffffffu, aux.x[q], 8);
    aux.x[q] += __shfl_xor_sync(0xffffffffu, aux.x[q], 16);
    if (lane < 8) m.rowsum[8 * (w - 4 + 4 * q) + lane] = aux.x[q];
  }
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) dRX += __shfl_xor_sync(0xffffffffu, dRX, o);
  if (lane % 8 == 0) m.db[(int(threadIdx.x) - 128) / 8] = dRX;
}

/// db_i = dR_i . X_i + sum_{j<i} dL_ij A_ij for the chunk's tokens (threads 0-15), to p.db.
__device__ __forceinline__ void grad_beta(const BackwardParams& p, const Smem& m, int64_t tok0, int rows, int hv) {
  const int i = int(threadIdx.x);
  if (i >= rows) return;
  float s = m.db[i];
  for (int j = 0; j < i; ++j) s += m.dL[i * kC + j] * m.A[i * kC + j];
  p.db[(tok0 + i) * p.value_heads + hv] = s;
}

constexpr float kLog2e = 1.4426950408889634f;

/// The terms of dq, dk, dG on key channel c of the pairs (i, j), j <= i, with (i + j) % 2 ==
/// kParity (the diagonal is parity 0; chunk_algebra.cuh's grad_keys; E_ij = exp(G_i - G_j) once
/// per pair, serving both tokens), and with kParity 0 also the per-token terms of dkd, dqd, dkr
/// (kr_i . dkr_i into m.kr, for da's prefix sum) and exp(GC) rowsum(dS o S) (into `last`). G, q,
/// k are the [16][K] tiles at ch; dq_i is complete after row i, so it goes to dq_out[i * K + c]
/// at once; dk and dG take terms of later rows too and stay in registers.
template <int kParity>
__device__ __forceinline__ void channel_terms(const Smem& m, float scale, const float* ch, int c, float* dq_out,
                                              float (&dk)[kC], float (&dG)[kC], float& last) {
  float G[kC], k[kC];
  const float GC = ch[(kC - 1) * kHeadDim + c];
#pragma unroll
  for (int i = 0; i < kC; ++i) {
    G[i] = ch[i * kHeadDim + c];
    k[i] = ch[2 * kColTile + i * kHeadDim + c];
    const float qi = ch[kColTile + i * kHeadDim + c];
    float dq = 0.f;
    dk[i] = dG[i] = 0.f;
#pragma unroll
    for (int j = 0; j <= i; ++j) {
      if (((i + j) & 1) != kParity) continue;
      if (j == i) {  // E_ii = 1; the two dG terms cancel
        const float mm = scale * m.dM[i * kC + i];
        dq += mm * k[i];
        dk[i] += mm * qi;
        continue;
      }
      // E_ij by MUFU.EX2 (about 2 ulp; E_ij <= 1, and one that flushes to zero is below fp32's
      // normal range): expf's range reduction would add about six instructions per pair.
      const float E = ptx::ex2((G[i] - G[j]) * kLog2e);
      const float mm = scale * m.dM[i * kC + j] * E;  // scale dM_ij E_ij
      const float aa = m.b[i] * m.dL[i * kC + j] * E;  // dA_ij E_ij
      dq += mm * k[j];
      dk[j] += mm * qi + aa * k[i];
      dk[i] += aa * k[j];
      const float g = (mm * qi + aa * k[i]) * k[j];
      dG[i] += g;
      dG[j] -= g;
    }
    if (kParity == 0) {
      const float eg = fexp(G[i]), er = fexp(GC - G[i]);
      const float dkd = m.kd[i * kRowLd + c], dqd = m.X[i * kRowLd + c], dkr = m.kr[i * kRowLd + c];
      dq += scale * eg * dqd;
      dk[i] += eg * dkd + er * dkr;
      dG[i] += eg * k[i] * dkd + scale * eg * qi * dqd;
      m.kr[i * kRowLd + c] = er * k[i] * dkr;  // kr_i . dkr_i, for da's prefix sum (phase_channels)
      if (i == kC - 1) last += eg * m.rowsum[c];
    }
    dq_out[i * kHeadDim + c] = dq;
  }
}

/// The channel phase (after store_sums and a barrier): dq_hat, dk_hat, da of the chunk's
/// `rows` tokens on key channel threadIdx.x % 128 (see the header). G, q, k are the [16][K]
/// tiles at buffer 0, whose fourth tile takes the parity-0 dq; the parity-1 sums meet the
/// parity-0 ones through buffer 1.
__device__ __forceinline__ void phase_channels(const BackwardParams& p, const Smem& m, int64_t tok0, int rows,
                                               int hv) {
  const int c = int(threadIdx.x) % kHeadDim, half = int(threadIdx.x) / kHeadDim;
  const float* ch = slice_buf(m, 0);
  float* dq0 = slice_buf(m, 0) + 3 * kColTile;
  float* part = slice_buf(m, 1);  // free since the barrier after the last slice
  float dk[kC], dG[kC];
  float last = 0.f;  // exp(GC) rowsum(dS o S), the last token's own term
  if (half == 0) {
    channel_terms<0>(m, p.scale, ch, c, dq0, dk, dG, last);
  } else {
    channel_terms<1>(m, p.scale, ch, c, part, dk, dG, last);
#pragma unroll
    for (int i = 0; i < kC; ++i) {
      part[kColTile + i * kHeadDim + c] = dk[i];
      part[2 * kColTile + i * kHeadDim + c] = dG[i];
    }
  }
  __syncthreads();
  if (half == 1) return;
  const int64_t row = (tok0 * p.value_heads + hv) * kHeadDim + c, stride = int64_t(p.value_heads) * kHeadDim;
  // da_t = exp(GC) rowsum(dS o S) + sum_{j<t} kr_j . dkr_j + sum_{s>=t} dG_s: the kr terms of
  // s >= t cancel analytically (each is in both GC's terms and dG_s), so they are left out
  // rather than added and subtracted, which under strong decay (every other term tiny) would
  // leave fp32's rounding of them as the whole result.
  float pre = 0.f;
#pragma unroll
  for (int i = 0; i < kC; ++i) {
    const float t = m.kr[i * kRowLd + c];
    m.kr[i * kRowLd + c] = pre;
    pre += t;
  }
  float acc = last;
#pragma unroll
  for (int i = kC - 1; i >= 0; --i) {
    acc += dG[i] + part[2 * kColTile + i * kHeadDim + c];
    if (i < rows) {
      p.dq_hat[row + i * stride] = dq0[i * kHeadDim + c] + part[i * kHeadDim + c];
      p.dk_hat[row + i * stride] = dk[i] + part[kColTile + i * kHeadDim + c];
      p.da[row + i * stride] = acc + m.kr[i * kRowLd + c];
    }
  }
}

/// L: the slice layout of S (KFirstSlice or VFirstSlice, the call's state layout).
template <class L>
__global__ void __launch_bounds__(kThreads, 2) chunk_grad_kernel(BackwardParams p) {
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

  // Group 0: the record's tiles and slice 0; group 1: slice 1; then the plain loads of v, dO.
  copy_rows(m.kd, kRowLd, rec + RecordField::kd);
  copy_rows(m.kr, kRowLd, rec + RecordField::kr);
  for (int e = threadIdx.x; e < kC * kC / 4; e += kThreads) {
    ptx::cp_async_16(m.A + 4 * e, rec + RecordField::A + 4 * e);
    ptx::cp_async_16(m.M + 4 * e, rec + RecordField::M + 4 * e);
    ptx::cp_async_16(m.Tinv + 4 * e, rec + RecordField::Tinv + 4 * e);
  }
  if (threadIdx.x < kC / 4) ptx::cp_async_16(m.b + 4 * threadIdx.x, rec + RecordField::b + 4 * threadIdx.x);
  copy_states<L>(m, st, ds, 0);
  ptx::cp_async_commit();
  copy_states<L>(m, st, ds, 1);
  ptx::cp_async_commit();
  load_tokens(p, m, tok0, rows, hv);

  // Accumulated over the slices: aux is dL (warps 0, 1), dM (warps 2, 3) or row sums (4-7).
  FragC dkd[2] = {}, dqd[2] = {}, dkr[2] = {}, aux = {};
  float dRX = 0.f;
  for (int s = 0; s < kSlices; ++s) {
    // Slice s has landed and every warp is past slice s - 1: its buffer takes slice s + 1
    // (slices 0 and 1 were issued above), or, during the last slice, G, q and k.
    if (s == 0)
      ptx::cp_async_wait<1>();
    else
      ptx::cp_async_wait<0>();
    __syncthreads();
    if (s >= 1 && s + 1 < kSlices) {
      copy_states<L>(m, st, ds, s + 1);
      ptx::cp_async_commit();
    } else if (s == kSlices - 1) {
      copy_channels(p, slice_buf(m, s + 1), rec, tok0, rows, hv);
      ptx::cp_async_commit();
    }
    const float* S = slice_buf(m, s);
    const float* dS = S + kSliceFloats;
    slice_values<L>(p, m, S, dS, s, w, tok0, rows, hv, aux);
    __syncthreads();
    slice_keys<L>(m, S, dS, s, w, dkd, dqd, dkr, aux, dRX);
  }
  __syncthreads();  // every warp is past the last slice: kd, kr, X and buffer 1 are free
  store_sums(m, w, dkd, dqd, dkr, aux, dRX);
  ptx::cp_async_wait<0>();  // G, q, k
  __syncthreads();
  grad_beta(p, m, tok0, rows, hv);
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
  return p.state_k_first ? launch_planned<chunk_grad_kernel<KFirstSlice>>(k, context_key, p, stream)
                         : launch_planned<chunk_grad_kernel<VFirstSlice>>(k, context_key, p, stream);
}

}  // namespace flash_kda::sm90::bwd
