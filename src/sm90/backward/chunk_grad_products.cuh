// The tensor-core products of the chunk-gradient kernel (chunk_grad.cu) and the shared-memory
// layouts they read, host-device code over a "warp" (mma_tf32.cuh: DeviceWarp on the GPU, an
// emulated warp in tests/cpp/test_backward_mma_tiles.cpp), so that the CPU test runs the very
// same index arithmetic. Names and math: chunk_algebra.cuh.
//
// The kernel walks the value dimension V in slices of kSliceV columns (the algebra is separable
// over V, chunk_grad.cu says how), so the states S and dS are in shared memory a K x kSliceV
// slice at a time. Each product is a 16-row result computed by one warp on one or two mma
// n-tiles of 8 columns, the contraction looping in steps of 8:
//
//   X  = v - kd S        (a slice's columns; contraction over K)
//   dU = M^T dO + kr dS  (a slice's columns; contraction over the 16 tokens, then K)
//   U = Tinv diag(b) X, dR = Tinv^T dU   (a slice's columns; over the 16 tokens)
//   dkd += dR S^T, dqd += dO S^T, dkr += U dS^T   (16 key columns per warp; contraction over
//                         the slice's value columns, one pass over S's and dS's fragments)
//   dR U^T, dO U^T       (16 x 16, one n-tile of 8 per warp; contraction over the slice)
//
// Every product runs in 3xTF32 (mma_split), to about fp32's accuracy: X is a difference of like
// magnitudes, and the gate's scalar gradients (dA_log, ddt_bias: sums over all of a head's
// tokens of dg, whose terms cancel where the state forgets fast) inherit the error of every
// product above; plain tf32 in any one of them leaves dA_log 1e-3 or more off on a 17-token
// sequence without a state (the CPU model; docs/notes/2026-12-02_chunk-products-3xtf32.md).
//
// Layouts (floats):
//   state slices: element (key c, value v of the slice) of a k-first slice (KFirstSlice: S in
//     the k-first state layout, dS always) at c * kSliceV + (v ^ state_swizzle(c)); of a
//     v-first slice (VFirstSlice: S in the v-first layout) at v * 128 + (c ^ state_swizzle(v)).
//     Either way a global row's 16-byte pieces stay whole (they are copied by cp.async) and the
//     two fragment patterns are free of bank conflicts: B = S read as K x V (k = c = k0 + t or
//     k0 + t + 4, n = v = n0 + g) and B = S^T read as V x K (k = v, n = c): a k-first row is 32
//     floats, one pass over the banks, so the bank is v ^ state_swizzle(c), which carries t in
//     bits 3..4 and g in bits 0..2 (K x V), or t in bits 0..1 and g in bits 2..4 (V x K); a
//     v-first slice is the transpose with the roles of c and v exchanged.
//   row tiles (kd, kr, dO, X): [16][kRowLd], kRowLd = 132; slice row tiles (U, dR):
//     [16][kSliceLd], kSliceLd = 36: either way A fragments (lanes vary the row by g, the
//     column by t: banks 4g + t) and U read as B of dR U^T avoid conflicts; rows stay 16-byte
//     aligned.
//   16 x 16 matrices (M, Tinv): [16][16].
//   The contractions over the 16 tokens (M^T dO, Tinv diag(b) X, Tinv^T dU) read their
//   fragments down the token rows of these tiles (banks 4t + g; 16t + g or 16g + t of the
//   16 x 16 ones), two lanes a bank; they are two steps of k against the sixteen of the
//   contractions over K.
#pragma once

#include "sm90/backward/chunk_algebra.cuh"
#include "sm90/backward/mma_tf32.cuh"

namespace flash_kda::sm90::bwd {

/// Unrolls the contraction loops on the device (loads of later steps overlap earlier mma); a
/// no-op on the host.
#if defined(__CUDA_ARCH__)
#define FKDA_BWD_UNROLL _Pragma("unroll 4")
#define FKDA_BWD_UNROLL_2 _Pragma("unroll 2")
#else
#define FKDA_BWD_UNROLL
#define FKDA_BWD_UNROLL_2
#endif

/// Head dimension of the products (K = V).
inline constexpr int kGradDim = 128;
/// Row stride (floats) of the 16-row tiles.
inline constexpr int kRowLd = kGradDim + 4;
/// Value columns per slice of the states.
inline constexpr int kSliceV = 32;
/// Row stride (floats) of the 16-row slice tiles.
inline constexpr int kSliceLd = kSliceV + 4;
/// Floats of a K x kSliceV state slice.
inline constexpr int kSliceFloats = kGradDim * kSliceV;
static_assert(kGradDim % kSliceV == 0 && kSliceV % 16 == 0, "whole slices of whole mma n-tiles");

/// The XOR applied to the minor index of major row x of a state slice (bits 2..4).
FKDA_HOST_DEVICE int state_swizzle(int x) { return ((x & 3) << 3) | (x & 4); }

/// A k-first state slice (K rows of kSliceV values): S in the k-first layout, dS.
struct KFirstSlice {
  /// Offset of element (key c, slice value v).
  static FKDA_HOST_DEVICE int off(int c, int v) { return c * kSliceV + (v ^ state_swizzle(c)); }
};
/// A v-first state slice (kSliceV rows of K keys): S in the v-first layout.
struct VFirstSlice {
  static FKDA_HOST_DEVICE int off(int c, int v) { return v * kGradDim + (c ^ state_swizzle(v)); }
};

/// acc += kd S for slice columns nb .. nb + 7 of the 16 x kSliceV result. The even
/// and odd steps of k go to two accumulators, met at the end: two dependent chains of mma
/// instead of one.
template <class L, class W>
FKDA_HOST_DEVICE void product_residual(const W& w, typename W::C& acc, int nb, const float* kd, const float* S) {
  typename W::C part[2] = {};
  FKDA_BWD_UNROLL
  for (int k0 = 0; k0 < kGradDim; k0 += 8) {
    const typename W::A a = w.load_a([&](int r, int k) { return kd[r * kRowLd + k0 + k]; });
    const typename W::B b = w.load_b([&](int k, int n) { return S[L::off(k0 + k, nb + n)]; });
    w.mma_split(part[(k0 / 8) & 1], w.split(a), w.split(b));
  }
  w.add(part[0], part[1]);
  w.add(acc, part[0]);
}

/// acc += M^T dO + kr dS for slice columns nb .. nb + 7 of the 16 x kSliceV result; dO points
/// at the slice's first column of the dO tile, dS at the k-first slice. Two accumulators as in
/// product_residual (M^T dO and kr dS's even steps, kr dS's odd steps).
template <class W>
FKDA_HOST_DEVICE void product_dU(const W& w, typename W::C& acc, int nb, const float* M, const float* dO,
                                 const float* kr, const float* dS) {
  typename W::C part[2] = {};
  for (int j0 = 0; j0 < kC; j0 += 8) {
    const typename W::A a = w.load_a([&](int r, int k) { return M[(j0 + k) * kC + r]; });
    const typename W::B b = w.load_b([&](int k, int n) { return dO[(j0 + k) * kRowLd + nb + n]; });
    w.mma_split(part[0], w.split(a), w.split(b));
  }
  FKDA_BWD_UNROLL
  for (int k0 = 0; k0 < kGradDim; k0 += 8) {
    const typename W::A a = w.load_a([&](int r, int k) { return kr[r * kRowLd + k0 + k]; });
    const typename W::B b = w.load_b([&](int k, int n) { return dS[KFirstSlice::off(k0 + k, nb + n)]; });
    w.mma_split(part[(k0 / 8) & 1], w.split(a), w.split(b));
  }
  w.add(part[0], part[1]);
  w.add(acc, part[0]);
}

/// acc += Tinv diag(b) X for slice columns nb .. nb + 7 of the 16 x kSliceV result (U); X points
/// at the slice's first column of the X tile. Tinv is unit lower triangular with zeros above the
/// diagonal (records.h), so the product over all 16 tokens is the triangular one.
template <class W>
FKDA_HOST_DEVICE void product_solve_U(const W& w, typename W::C& acc, int nb, const float* Tinv, const float* b,
                                      const float* X) {
  for (int j0 = 0; j0 < kC; j0 += 8) {
    const typename W::A a = w.load_a([&](int r, int k) { return Tinv[r * kC + j0 + k]; });
    const typename W::B x = w.load_b([&](int k, int n) { return b[j0 + k] * X[(j0 + k) * kRowLd + nb + n]; });
    w.mma_split(acc, w.split(a), w.split(x));
  }
}

/// acc += Tinv^T dU for slice columns nb .. nb + 7 of the 16 x kSliceV result (dR);
/// dU is a slice row tile.
template <class W>
FKDA_HOST_DEVICE void product_solve_dR(const W& w, typename W::C& acc, int nb, const float* Tinv, const float* dU) {
  for (int j0 = 0; j0 < kC; j0 += 8) {
    const typename W::A a = w.load_a([&](int r, int k) { return Tinv[(j0 + k) * kC + r]; });
    const typename W::B d = w.load_b([&](int k, int n) { return dU[(j0 + k) * kSliceLd + nb + n]; });
    w.mma_split(acc, w.split(a), w.split(d));
  }
}

/// dkd[nt] += dR S^T, dqd[nt] += dO S^T, dkr[nt] += U dS^T for key columns n0 + 8 nt .. + 7 of
/// the 16 x K results, contracted over one slice (S's fragments shared by the first two). dR and
/// U are slice row tiles, dO points at the slice's first column of the dO tile. Each operand is
/// split into its tf32 head and tail once and meets the others split.
template <class L, class W>
FKDA_HOST_DEVICE void product_state_T(const W& w, typename W::C (&dkd)[2], typename W::C (&dqd)[2],
                                      typename W::C (&dkr)[2], int n0, const float* dR, const float* dO,
                                      const float* U, const float* S, const float* dS) {
  FKDA_BWD_UNROLL_2
  for (int k0 = 0; k0 < kSliceV; k0 += 8) {
    const auto aR = w.split(w.load_a([&](int r, int k) { return dR[r * kSliceLd + k0 + k]; }));
    const auto aO = w.split(w.load_a([&](int r, int k) { return dO[r * kRowLd + k0 + k]; }));
    const auto aU = w.split(w.load_a([&](int r, int k) { return U[r * kSliceLd + k0 + k]; }));
    for (int nt = 0; nt < 2; ++nt) {
      const int nb = n0 + 8 * nt;
      const auto bS = w.split(w.load_b([&](int k, int n) { return S[L::off(nb + n, k0 + k)]; }));
      const auto bD = w.split(w.load_b([&](int k, int n) { return dS[KFirstSlice::off(nb + n, k0 + k)]; }));
      w.mma_split(dkd[nt], aR, bS);
      w.mma_split(dqd[nt], aO, bS);
      w.mma_split(dkr[nt], aU, bD);
    }
  }
}

/// acc += P U^T for the token columns j0 .. j0 + 7 of the 16 x 16 result, contracted over one
/// slice: P (row stride ld) is the dR slice tile or the slice's first column of dO, U the U
/// slice tile.
template <class W>
FKDA_HOST_DEVICE void product_pairs(const W& w, typename W::C& acc, int j0, const float* P, int ld, const float* U) {
  FKDA_BWD_UNROLL
  for (int k0 = 0; k0 < kSliceV; k0 += 8) {
    const typename W::A a = w.load_a([&](int r, int k) { return P[r * ld + k0 + k]; });
    const typename W::B b = w.load_b([&](int k, int n) { return U[(j0 + n) * kSliceLd + k0 + k]; });
    w.mma_split(acc, w.split(a), w.split(b));
  }
}

}  // namespace flash_kda::sm90::bwd
