// The tensor-core products of the chunk-gradient kernel (chunk_grad.cu) and the shared-memory
// layouts they read, host-device code over a "warp" (mma_tf32.cuh: DeviceWarp on the GPU, an
// emulated warp in tests/cpp/test_backward_mma_tiles.cpp), so that the CPU test runs the very
// same index arithmetic. Names and math: chunk_algebra.cuh.
//
// Each product is a 16-row result of which one warp computes 16 columns (n0 .. n0 + 15, two
// mma n-tiles of 8), the contraction looping in steps of 8:
//
//   X  = v - kd S        (kd S: 3xTF32, since X is a difference of like magnitudes)
//   dU = M^T dO + kr dS
//   dkd = dR S^T, dqd = dO S^T, dkr = U dS^T   (one pass over S's and dS's fragments)
//   dR U^T, dO U^T       (16 x 16: one n-tile of 8 per warp)
//
// Layouts (floats):
//   state tiles S, dS: K x V, row c (key), element (c, v) at c * 128 + (v ^ state_swizzle(c)).
//     The swizzle keeps both fragment patterns free of bank conflicts: B = S read as K x V
//     (c = k0 + t or k0 + t + 4, v = n0 + g: bank bits 3..4 carry t, bits 0..2 g) and B = S^T
//     read as V x K (c = n0 + g, v = k0 + t or k0 + t + 4: bits 0..1 carry t, bit 2 g / 4,
//     bits 3..4 g % 4). It permutes the 16-byte pieces of a row among themselves, so a row is
//     still copied 16 bytes at a time.
//   row tiles (kd, kr, dO, X, U, dR, ...): [16][kRowLd], kRowLd = 132, so that A fragments
//     (lanes vary the row by g, the column by t: banks 4g + t) and U read as B of dR U^T avoid
//     conflicts; rows stay 16-byte aligned.
//   16 x 16 matrices (M): [16][16].
#pragma once

#include "sm90/backward/chunk_algebra.cuh"
#include "sm90/backward/mma_tf32.cuh"

namespace flash_kda::sm90::bwd {

/// Unrolls the contraction loops on the device (loads of later steps overlap earlier mma); a
/// no-op on the host.
#if defined(__CUDA_ARCH__)
#define FKDA_BWD_UNROLL _Pragma("unroll 4")
#else
#define FKDA_BWD_UNROLL
#endif

/// Head dimension of the products (K = V).
inline constexpr int kGradDim = 128;
/// Row stride (floats) of the 16-row tiles.
inline constexpr int kRowLd = kGradDim + 4;

/// The XOR applied to the column of key row c of a state tile (bits 2..4 of the column).
FKDA_HOST_DEVICE int state_swizzle(int c) { return ((c & 3) << 3) | (c & 4); }
/// Offset of element (c, v) of a state tile.
FKDA_HOST_DEVICE int state_off(int c, int v) { return c * kGradDim + (v ^ state_swizzle(c)); }

/// acc[nt] += kd S for columns n0 + 8 nt .. + 7 of the 16 x V result (3xTF32).
template <class W>
FKDA_HOST_DEVICE void product_residual(const W& w, typename W::C (&acc)[2], int n0, const float* kd,
                                       const float* S) {
  FKDA_BWD_UNROLL
  for (int k0 = 0; k0 < kGradDim; k0 += 8) {
    const typename W::A a = w.load_a([&](int r, int k) { return kd[r * kRowLd + k0 + k]; });
    for (int nt = 0; nt < 2; ++nt) {
      const int nb = n0 + 8 * nt;
      const typename W::B b = w.load_b([&](int k, int n) { return S[state_off(k0 + k, nb + n)]; });
      w.mma_split(acc[nt], a, b);
    }
  }
}

/// acc[nt] += M^T dO + kr dS for columns n0 + 8 nt .. + 7 of the 16 x V result.
template <class W>
FKDA_HOST_DEVICE void product_dU(const W& w, typename W::C (&acc)[2], int n0, const float* M, const float* dO,
                                 const float* kr, const float* dS) {
  for (int j0 = 0; j0 < kC; j0 += 8) {
    const typename W::A a = w.load_a([&](int r, int k) { return M[(j0 + k) * kC + r]; });
    for (int nt = 0; nt < 2; ++nt) {
      const int nb = n0 + 8 * nt;
      const typename W::B b = w.load_b([&](int k, int n) { return dO[(j0 + k) * kRowLd + nb + n]; });
      w.mma(acc[nt], a, b);
    }
  }
  FKDA_BWD_UNROLL
  for (int k0 = 0; k0 < kGradDim; k0 += 8) {
    const typename W::A a = w.load_a([&](int r, int k) { return kr[r * kRowLd + k0 + k]; });
    for (int nt = 0; nt < 2; ++nt) {
      const int nb = n0 + 8 * nt;
      const typename W::B b = w.load_b([&](int k, int n) { return dS[state_off(k0 + k, nb + n)]; });
      w.mma(acc[nt], a, b);
    }
  }
}

/// dkd[nt] += dR S^T, dqd[nt] += dO S^T, dkr[nt] += U dS^T for key columns n0 + 8 nt .. + 7
/// of the 16 x K results (S's fragments shared by the first two).
template <class W>
FKDA_HOST_DEVICE void product_state_T(const W& w, typename W::C (&dkd)[2], typename W::C (&dqd)[2],
                                      typename W::C (&dkr)[2], int n0, const float* dR, const float* dO,
                                      const float* U, const float* S, const float* dS) {
  FKDA_BWD_UNROLL
  for (int k0 = 0; k0 < kGradDim; k0 += 8) {
    const typename W::A aR = w.load_a([&](int r, int k) { return dR[r * kRowLd + k0 + k]; });
    const typename W::A aO = w.load_a([&](int r, int k) { return dO[r * kRowLd + k0 + k]; });
    const typename W::A aU = w.load_a([&](int r, int k) { return U[r * kRowLd + k0 + k]; });
    for (int nt = 0; nt < 2; ++nt) {
      const int nb = n0 + 8 * nt;
      const typename W::B bS = w.load_b([&](int k, int n) { return S[state_off(nb + n, k0 + k)]; });
      const typename W::B bD = w.load_b([&](int k, int n) { return dS[state_off(nb + n, k0 + k)]; });
      w.mma(dkd[nt], aR, bS);
      w.mma(dqd[nt], aO, bS);
      w.mma(dkr[nt], aU, bD);
    }
  }
}

/// acc += P U^T for the token columns j0 .. j0 + 7 of the 16 x 16 result (P = dR or dO).
template <class W>
FKDA_HOST_DEVICE void product_pairs(const W& w, typename W::C& acc, int j0, const float* P, const float* U) {
  FKDA_BWD_UNROLL
  for (int k0 = 0; k0 < kGradDim; k0 += 8) {
    const typename W::A a = w.load_a([&](int r, int k) { return P[r * kRowLd + k0 + k]; });
    const typename W::B b = w.load_b([&](int k, int n) { return U[(j0 + n) * kRowLd + k0 + k]; });
    w.mma(acc, a, b);
  }
}

}  // namespace flash_kda::sm90::bwd
