// The KDA backward inside one 16-token chunk of one (sequence, value head), in plain loops: the
// chunk algebra that the kernels evaluate with tensor-core products (records.cu,
// chain_products.cuh, chunk_grad_products.cuh), as phases that
// tests/cpp/test_backward_chunk_algebra.cpp checks against the token-level fp64 reference. The
// kernels take the chunk size kC and fexp from here, and the names below. Math: docs/kda-spec.md
// "Chunked form" and "Backward".
//
// Forward of a chunk (S the K x V state at its start, G_i = a_1 + ... + a_i the cumulative log
// decay, a K-vector per token; GC = G of the chunk's last token; E_ij = exp(G_i - G_j) for
// j <= i, every factor <= 1, so no decay overflows fp32 however strong):
//
//   kd_i = exp(G_i) k_i     qd_i = scale exp(G_i) q_i     kr_j = exp(GC - G_j) k_j
//   A_ij = k_i . (E_ij * k_j) (j < i)      M_ij = scale q_i . (E_ij * k_j) (j <= i)
//   L = diag(b) A     X = v - kd S     U = (I + L)^-1 diag(b) X
//   O = qd S + M U    S_end = diag(exp(GC)) S + kr^T U
//
// Backward, given dO (the chunk's rows of d out) and dS (the gradient of S_end), by reverse
// mode through each line (for U = (I+L)^-1 W: dW = (I+L)^-T dU, dL = -dW U^T):
//
//   dU = M^T dO + kr dS                 dR = (I + L)^-T dU      (back substitution)
//   dL = -strictly_lower(dR U^T)        dA = diag(b) dL         dv = diag(b) dR
//   db_i = dR_i . X_i + sum_j dL_ij A_ij
//   dkd = -diag(b) dR S^T    dqd = dO S^T    dM = lower_incl(dO U^T)    dkr = U dS^T
//   dS_start = qd^T dO + diag(exp(GC)) dS - kd^T diag(b) dR
//   dq_i = scale exp(G_i) dqd_i + scale sum_{j<=i} dM_ij E_ij k_j
//   dk_t = exp(G_t) dkd_t + exp(GC - G_t) dkr_t + sum_{j<t} dA_tj E_tj k_j
//          + sum_{i>t} dA_it E_it k_i + scale sum_{i>=t} dM_it E_it q_i
//   dG_t = dkd_t kd_t + dqd_t qd_t - dkr_t kr_t
//          + sum_{j<t} dA_tj k_t k_j E_tj - sum_{i>t} dA_it k_i k_t E_it
//          + scale sum_{j<=t} dM_tj q_t k_j E_tj - scale sum_{i>=t} dM_it q_i k_t E_it
//   dG_last += sum_t dkr_t kr_t + exp(GC) rowsum(dS * S)       (GC is G of the last token)
//   da_t = sum_{s >= t} dG_s                                    (G is a cumulative sum)
//
// (elementwise products of K-vectors where two K-vectors meet.) q and k are the normalised
// q_hat, k_hat when the L2 norm is fused; the finish kernel takes the gradients through it.
//
// A short last chunk (C' < 16 tokens) is padded with k = q = v = dO = 0, b = 0 and a = 0:
// then every padded row and column of A, M, U, dU, dR is zero, G of a padded row equals GC,
// and the formulas above hold unchanged for the real rows (the padded rows' results are not
// stored). So every function works on full 16-row tiles and G[15] is GC.
//
// Execution model: each function is one phase over the threads described by `Ctx` (tid,
// nthreads, sync()): thread tid takes elements tid, tid + nthreads, ..., and the phase ends with
// ctx.sync(). The test runs them with SerialCtx (one thread). Every sum runs in a fixed order.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/gate.h"

namespace flash_kda::sm90::bwd {

/// Tokens per chunk.
inline constexpr int kC = 16;

/// exp in the precision of T: expf on the device for float, std::exp on the host.
FKDA_HOST_DEVICE float fexp(float x) {
#if defined(__CUDA_ARCH__)
  return ::expf(x);
#else
  return std::exp(x);
#endif
}
FKDA_HOST_DEVICE double fexp(double x) {
#if defined(__CUDA_ARCH__)
  return ::exp(x);
#else
  return std::exp(x);
#endif
}

/// One thread doing every element: the CPU form of a block.
struct SerialCtx {
  int tid = 0;
  int nthreads = 1;
  FKDA_HOST_DEVICE void sync() const {}
};

/// The chunk's tiles (row-major, row = token). [kC][K]: q, k, G (holds a on entry to
/// cumulate_gate), dG; [kC][V]: X (holds v on entry to state_residual), dO, U, dR (holds dU
/// before solve_dR); [kC][kC]: A, M, dL, dM; [kC]: b. S and dS are K x V with row stride ld.
template <class T, int K, int V>
struct ChunkTiles {
  T* q;
  T* k;
  T* G;
  T* X;
  T* dO;
  T* U;
  T* dR;
  T* dG;
  T* A;
  T* M;
  T* dL;
  T* dM;
  T* b;
  const T* S;
  T* dS;
  int ld;
  T scale;
};

/// G[i][c] = a_1 + ... + a_i in place (one thread per channel, tokens in order).
template <class T, int K, int V, class Ctx>
FKDA_HOST_DEVICE void cumulate_gate(const ChunkTiles<T, K, V>& t, const Ctx& ctx) {
  for (int c = ctx.tid; c < K; c += ctx.nthreads) {
    T acc = T(0);
    for (int i = 0; i < kC; ++i) {
      acc += t.G[i * K + c];
      t.G[i * K + c] = acc;
    }
  }
  ctx.sync();
}

/// A (strictly lower) and M (lower including the diagonal), zero elsewhere.
template <class T, int K, int V, class Ctx>
FKDA_HOST_DEVICE void grams(const ChunkTiles<T, K, V>& t, const Ctx& ctx) {
  for (int e = ctx.tid; e < kC * kC; e += ctx.nthreads) {
    const int i = e / kC, j = e % kC;
    T a = T(0), m = T(0);
    if (j <= i) {
      for (int c = 0; c < K; ++c) {
        const T ek = fexp(t.G[i * K + c] - t.G[j * K + c]) * t.k[j * K + c];
        a += t.k[i * K + c] * ek;
        m += t.q[i * K + c] * ek;
      }
    }
    t.A[e] = j < i ? a : T(0);
    t.M[e] = j <= i ? t.scale * m : T(0);
  }
  ctx.sync();
}

/// X = v - kd S in place (X holds v on entry).
template <class T, int K, int V, class Ctx>
FKDA_HOST_DEVICE void state_residual(const ChunkTiles<T, K, V>& t, const Ctx& ctx) {
  for (int e = ctx.tid; e < kC * V; e += ctx.nthreads) {
    const int i = e / V, v = e % V;
    T acc = T(0);
    for (int c = 0; c < K; ++c) acc += fexp(t.G[i * K + c]) * t.k[i * K + c] * t.S[c * t.ld + v];
    t.X[e] -= acc;
  }
  ctx.sync();
}

/// U = (I + L)^-1 diag(b) X by forward substitution, one thread per value column:
/// U_i = b_i X_i - sum_{j<i} b_i A_ij U_j.
template <class T, int K, int V, class Ctx>
FKDA_HOST_DEVICE void solve_U(const ChunkTiles<T, K, V>& t, const Ctx& ctx) {
  for (int v = ctx.tid; v < V; v += ctx.nthreads) {
    for (int i = 0; i < kC; ++i) {
      T acc = t.X[i * V + v];
      for (int j = 0; j < i; ++j) acc -= t.A[i * kC + j] * t.U[j * V + v];
      t.U[i * V + v] = t.b[i] * acc;
    }
  }
  ctx.sync();
}

/// dU = M^T dO + kr dS into dR (solve_dR then turns it into dR in place).
template <class T, int K, int V, class Ctx>
FKDA_HOST_DEVICE void grad_U(const ChunkTiles<T, K, V>& t, const Ctx& ctx) {
  for (int e = ctx.tid; e < kC * V; e += ctx.nthreads) {
    const int i = e / V, v = e % V;
    T acc = T(0);
    for (int c = 0; c < K; ++c)
      acc += fexp(t.G[(kC - 1) * K + c] - t.G[i * K + c]) * t.k[i * K + c] * t.dS[c * t.ld + v];
    for (int j = i; j < kC; ++j) acc += t.M[j * kC + i] * t.dO[j * V + v];
    t.dR[e] = acc;
  }
  ctx.sync();
}

/// dR = (I + L)^-T dU in place by back substitution, one thread per value column:
/// dR_i = dU_i - sum_{j>i} L_ji dR_j with L_ji = b_j A_ji.
template <class T, int K, int V, class Ctx>
FKDA_HOST_DEVICE void solve_dR(const ChunkTiles<T, K, V>& t, const Ctx& ctx) {
  for (int v = ctx.tid; v < V; v += ctx.nthreads) {
    for (int i = kC - 1; i >= 0; --i) {
      T acc = t.dR[i * V + v];
      for (int j = i + 1; j < kC; ++j) acc -= t.b[j] * t.A[j * kC + i] * t.dR[j * V + v];
      t.dR[i * V + v] = acc;
    }
  }
  ctx.sync();
}

/// dL = -strictly_lower(dR U^T) and dM = lower_incl(dO U^T), zero elsewhere.
template <class T, int K, int V, class Ctx>
FKDA_HOST_DEVICE void grad_pairs(const ChunkTiles<T, K, V>& t, const Ctx& ctx) {
  for (int e = ctx.tid; e < kC * kC; e += ctx.nthreads) {
    const int i = e / kC, j = e % kC;
    T l = T(0), m = T(0);
    if (j <= i) {
      for (int v = 0; v < V; ++v) {
        l += t.dR[i * V + v] * t.U[j * V + v];
        m += t.dO[i * V + v] * t.U[j * V + v];
      }
    }
    t.dL[e] = j < i ? -l : T(0);
    t.dM[e] = j <= i ? m : T(0);
  }
  ctx.sync();
}

/// db_i = dR_i . X_i + sum_{j<i} dL_ij A_ij for the first `rows` tokens, to db[i * db_stride]
/// (no sync: reads only what earlier phases finished).
template <class T, int K, int V, class Ctx>
FKDA_HOST_DEVICE void grad_b(const ChunkTiles<T, K, V>& t, const Ctx& ctx, T* db, int64_t db_stride, int rows) {
  for (int i = ctx.tid; i < rows; i += ctx.nthreads) {
    T acc = T(0);
    for (int v = 0; v < V; ++v) acc += t.dR[i * V + v] * t.X[i * V + v];
    for (int j = 0; j < i; ++j) acc += t.dL[i * kC + j] * t.A[i * kC + j];
    db[i * db_stride] = acc;
  }
}

/// dq, dk of the first `rows` tokens (to dq[i * stride + c], dk[i * stride + c]) and dG of all
/// 16 into the dG tile, one thread per (token, channel).
template <class T, int K, int V, class Ctx>
FKDA_HOST_DEVICE void grad_keys(const ChunkTiles<T, K, V>& t, const Ctx& ctx, T* dq, T* dk, int64_t stride, int rows) {
  for (int e = ctx.tid; e < kC * K; e += ctx.nthreads) {
    const int i = e / K, c = e % K;
    T dkd = T(0), dqd = T(0), dkr = T(0);
    for (int v = 0; v < V; ++v) {
      const T s = t.S[c * t.ld + v];
      dkd += t.dR[i * V + v] * s;
      dqd += t.dO[i * V + v] * s;
      dkr += t.U[i * V + v] * t.dS[c * t.ld + v];
    }
    dkd *= -t.b[i];
    const T Gi = t.G[i * K + c], GC = t.G[(kC - 1) * K + c];
    const T qi = t.q[i * K + c], ki = t.k[i * K + c];
    const T egi = fexp(Gi), eri = fexp(GC - Gi);
    T dq_acc = t.scale * egi * dqd;
    T dk_acc = egi * dkd + eri * dkr;
    // The kr term (-dkr eri ki) is left to grad_decay's prefix sum (see there).
    T dg = dkd * egi * ki + dqd * t.scale * egi * qi;
    for (int j = 0; j < kC; ++j) {
      const T Gj = t.G[j * K + c], qj = t.q[j * K + c], kj = t.k[j * K + c];
      if (j <= i) {  // pairs (i, j), i the later token: E_ij = exp(G_i - G_j)
        const T E = fexp(Gi - Gj);
        const T m = t.scale * t.dM[i * kC + j] * E;  // scale dM_ij E_ij
        dq_acc += m * kj;
        dg += m * qi * kj;
        if (j < i) {
          const T a = t.b[i] * t.dL[i * kC + j] * E;  // dA_ij E_ij
          dk_acc += a * kj;
          dg += a * ki * kj;
        }
      }
      if (j >= i) {  // pairs (j, i), i the earlier token: E_ji = exp(G_j - G_i)
        const T E = fexp(Gj - Gi);
        const T m = t.scale * t.dM[j * kC + i] * E;
        dk_acc += m * qj;
        dg -= m * qj * ki;
        if (j > i) {
          const T a = t.b[j] * t.dL[j * kC + i] * E;
          dk_acc += a * kj;
          dg -= a * kj * ki;
        }
      }
    }
    t.dG[e] = dg;
    if (i < rows) {
      dq[i * stride + c] = dq_acc;
      dk[i * stride + c] = dk_acc;
    }
  }
  ctx.sync();
}

/// da of the first `rows` tokens (to da[i * stride + c]):
///   da_t = exp(GC) rowsum(dS o S) + sum_{j<t} kr_j dkr_j + sum_{s>=t} dG_s,
/// with dG without its kr terms (grad_keys). The kr terms of s >= t are in both GC's own terms
/// and dG_s and cancel analytically, so they are left out rather than added and subtracted:
/// under strong decay every other term is tiny and fp32's rounding of them would be the result.
template <class T, int K, int V, class Ctx>
FKDA_HOST_DEVICE void grad_decay(const ChunkTiles<T, K, V>& t, const Ctx& ctx, T* da, int64_t stride, int rows) {
  for (int c = ctx.tid; c < K; c += ctx.nthreads) {
    const T GC = t.G[(kC - 1) * K + c];
    T last = T(0);
    for (int v = 0; v < V; ++v) last += t.dS[c * t.ld + v] * t.S[c * t.ld + v];
    last *= fexp(GC);
    T before[kC];  // sum_{j<i} kr_j dkr_j
    T pre = T(0);
    for (int j = 0; j < kC; ++j) {
      T dkr = T(0);
      for (int v = 0; v < V; ++v) dkr += t.U[j * V + v] * t.dS[c * t.ld + v];
      before[j] = pre;
      pre += dkr * fexp(GC - t.G[j * K + c]) * t.k[j * K + c];
    }
    T acc = last;
    for (int i = kC - 1; i >= 0; --i) {
      acc += t.dG[i * K + c];
      if (i < rows) da[i * stride + c] = acc + before[i];
    }
  }
  ctx.sync();
}

/// dS <- qd^T dO + diag(exp(GC)) dS - kd^T diag(b) dR in place: the gradient of the chunk's
/// start state, from that of its end state (grad_U and solve_dR must have used the old dS).
template <class T, int K, int V, class Ctx>
FKDA_HOST_DEVICE void state_grad_step(const ChunkTiles<T, K, V>& t, const Ctx& ctx) {
  for (int e = ctx.tid; e < K * V; e += ctx.nthreads) {
    const int c = e / V, v = e % V;
    T acc = fexp(t.G[(kC - 1) * K + c]) * t.dS[c * t.ld + v];
    for (int i = 0; i < kC; ++i) {
      const T eg = fexp(t.G[i * K + c]);
      acc += eg * (t.scale * t.q[i * K + c] * t.dO[i * V + v] - t.k[i * K + c] * t.b[i] * t.dR[i * V + v]);
    }
    t.dS[c * t.ld + v] = acc;
  }
  ctx.sync();
}

}  // namespace flash_kda::sm90::bwd
