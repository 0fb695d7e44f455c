// The tensor-core products of the reverse chain (chain.cu) and the shared-memory layouts they
// read, host-device code over a "warp" (mma_tf32.cuh: DeviceWarp on the GPU, an emulated warp
// in tests/cpp/test_backward_mma_tiles.cpp), so that the CPU test runs the very same index
// arithmetic. Names and math: chunk_algebra.cuh.
//
// The chain holds its slice of dS transposed, dS^T (kChainCols value columns x K channels), in
// mma accumulator fragments: warp w owns channels c0 = 16 w .. c0 + 15, as tiles ds[mt][nt]
// (mt: value rows 16 mt .., nt: channels c0 + 8 nt ..). Transposed, because then dU = kr dS,
// whose contraction runs over the channels, takes dS^T straight from the accumulators as its A
// operand: an accumulator tile's lane holds columns 2t and 2t + 1 where an A fragment holds k
// = t and t + 4 (mma_tf32.cuh: frag_a_of_c), so the contraction runs over the channels in the
// permuted order kperm(k) and kr's B fragment is read in that same order. Per chunk:
//
//   P_w  = dS^T[:, c0..c0+15] kr^T[c0..c0+15, :]  (+ one of dO^T M's eight tiles)   32 x 16
//   dU^T = sum_w P_w    (the kernel: eight partials added in a fixed order, then dR SIMT)
//   ds  <- diag(eg) ds + dO^T qd - (diag(b) dR)^T kd                                 32 x 16
//
// every product in 3xTF32 (mma_split), since dS sums hundreds of steps and must keep fp32's
// accuracy.
//
// Layouts (floats):
//   kd, qd, kr: [16][kChainLd], kChainLd = 136: B fragments of qd and kd (token t or t + 4,
//     channel + g: banks 8t + g) avoid conflicts; kr's permuted ones (token g, channel 2t or
//     2t + 1: banks 8g + 2t) meet at most two lanes a bank; rows stay 16-byte aligned.
//   value-row tiles (dO, -diag(b) dR): kVecTile floats in the A-fragment order of their
//     transposes (vec_frag_off: a fragment is one 16-byte load a lane), each as two planes, its
//     tf32 head and tail (tf32_split: every warp reads all of them as A operands, so they are
//     split once where they are written).
//   M: [16][16] as in the record.
#pragma once

#include "sm90/backward/chunk_algebra.cuh"
#include "sm90/backward/mma_tf32.cuh"

namespace flash_kda::sm90::bwd {

/// Value columns of a chain block's slice.
inline constexpr int kChainCols = 32;
/// Row stride of kd, qd, kr in the chain's shared copy of a record.
inline constexpr int kChainLd = 128 + 8;
/// Floats of a value-row tile (16 tokens x kChainCols values).
inline constexpr int kVecTile = kC * kChainCols;

/// Offset of element (token i, value v) of a value-row tile, stored in the A-fragment order of
/// its transpose: fragment (mt, ks) of the 32 x 16 transpose (values 16 mt .., tokens 8 ks ..)
/// is 128 floats, lane l's four registers at 4 l .. 4 l + 3, so that a lane loads a fragment
/// in one 16-byte load.
FKDA_HOST_DEVICE int vec_frag_off(int i, int v) {
  const int mt = v >> 4, m = v & 15, ks = i >> 3, k = i & 7;
  const int lane = ((m & 7) << 2) | (k & 3), r = (m >> 3) | ((k >> 2) << 1);  // frag_a_row, frag_a_col inverted
  return (((mt * 2 + ks) * 32 + lane) << 2) | r;
}

/// a[mt][ks]: A fragments of P^T (value rows 16 mt .., tokens 8 ks ..) for a value-row tile P
/// in vec_frag_off's order.
template <class W>
FKDA_HOST_DEVICE void chain_load_a_vec_T(const W& w, typename W::A (&a)[2][2], const float* P) {
  for (int mt = 0; mt < 2; ++mt)
    for (int ks = 0; ks < 2; ++ks) a[mt][ks] = w.load_a_packed(P + (mt * 2 + ks) * 128);
}

/// b[ks][nt]: B fragments of X (tokens 8 ks .., channels c0 + 8 nt ..) for X [16][kChainLd].
template <class W>
FKDA_HOST_DEVICE void chain_load_b_rows(const W& w, typename W::B (&b)[2][2], const float* X, int c0) {
  for (int ks = 0; ks < 2; ++ks)
    for (int nt = 0; nt < 2; ++nt)
      b[ks][nt] = w.load_b([&](int k, int n) { return X[(8 * ks + k) * kChainLd + c0 + 8 * nt + n]; });
}

/// b[ks][nt]: B fragments of kr^T (channels c0 + 8 ks + kperm(k), tokens 8 nt ..), the channel
/// order of A fragments taken from accumulators.
template <class W>
FKDA_HOST_DEVICE void chain_load_b_kr(const W& w, typename W::B (&b)[2][2], const float* kr, int c0) {
  for (int ks = 0; ks < 2; ++ks)
    for (int nt = 0; nt < 2; ++nt)
      b[ks][nt] = w.load_b([&](int k, int n) { return kr[(8 * nt + n) * kChainLd + c0 + 8 * ks + frag_kperm(k)]; });
}

/// acc[mt][nt] += sum_ks a[mt][ks] b[ks][nt] (3xTF32); the four tiles' chains interleave.
template <class W>
FKDA_HOST_DEVICE void chain_mma(const W& w, typename W::C (&acc)[2][2], const typename W::A (&a)[2][2],
                                const typename W::B (&b)[2][2]) {
  for (int ks = 0; ks < 2; ++ks)
    for (int mt = 0; mt < 2; ++mt)
      for (int nt = 0; nt < 2; ++nt) w.mma_split(acc[mt][nt], a[mt][ks], b[ks][nt]);
}

/// acc[mt][nt] += sum_ks a[mt][ks] b[ks][nt] with A split beforehand (ahi, alo: mma_split_a).
template <class W>
FKDA_HOST_DEVICE void chain_mma_a(const W& w, typename W::C (&acc)[2][2], const typename W::A (&ahi)[2][2],
                                  const typename W::A (&alo)[2][2], const typename W::B (&b)[2][2]) {
  for (int ks = 0; ks < 2; ++ks)
    for (int mt = 0; mt < 2; ++mt)
      for (int nt = 0; nt < 2; ++nt) w.mma_split_a(acc[mt][nt], ahi[mt][ks], alo[mt][ks], b[ks][nt]);
}

/// part[mt][nt] = dS^T[:, c0..c0+15] kr^T[c0..c0+15, :] (value rows x tokens) from the warp's
/// dS^T tiles ds and kr's fragments bkr (chain_load_b_kr): the warp's dU partial without d out
/// (the transition map's chain, whose d out is zero).
template <class W>
FKDA_HOST_DEVICE void chain_state_kr(const W& w, typename W::C (&part)[2][2], const typename W::C (&ds)[2][2],
                                     const typename W::B (&bkr)[2][2]) {
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) part[i][j] = typename W::C{};
  typename W::A a[2][2];
  for (int i = 0; i < 2; ++i)
    for (int k = 0; k < 2; ++k) a[i][k] = w.a_of_c(ds[i][k]);
  chain_mma(w, part, a, bkr);
}

/// part[mt][nt] = dS^T[:, c0..c0+15] kr^T[c0..c0+15, :] (value rows x tokens) from the warp's
/// dS^T tiles ds and kr's fragments bkr (chain_load_b_kr), plus tile `tile` (0..7: mt, nt, ks
/// its bits 2, 1, 0) of dO^T M (dO split beforehand into dOhi + dOlo): the eight warps
/// together add dO^T M once.
template <class W>
FKDA_HOST_DEVICE void chain_dU_partial(const W& w, typename W::C (&part)[2][2], const typename W::C (&ds)[2][2],
                                       const typename W::B (&bkr)[2][2], int tile, const float* dOhi,
                                       const float* dOlo, const float* M) {
  const int mt = (tile >> 2) & 1, nt = (tile >> 1) & 1, ks = tile & 1;
  chain_state_kr(w, part, ds, bkr);
  const typename W::B bM = w.load_b([&](int k, int n) { return M[(8 * ks + k) * kC + 8 * nt + n]; });
  typename W::C pm{};
  const int f = (mt * 2 + ks) * 128;
  w.mma_split_a(pm, w.load_a_packed(dOhi + f), w.load_a_packed(dOlo + f), bM);
  // Added by selects, not part[mt][nt] (a register array indexed at run time goes to local memory).
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) w.add_c_if(part[i][j], pm, i == mt && j == nt);
}

}  // namespace flash_kda::sm90::bwd
