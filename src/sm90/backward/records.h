// The chunk record: what the chain and the chunk-gradient kernels read of every 16-token chunk
// of one value head, written once by the record kernel (records.cu) so that neither recomputes
// an exponential or a Gram. fp32, kRecordFloats per (chunk row, value head), at
// records + (row * HV + hv) * kRecordFloats. Math and names: chunk_algebra.cuh (G the
// cumulative log decay, GC = G[15]; E_ij = exp(G_i - G_j)); a short last chunk is padded with
// zero q, k, b and a as chunk_algebra.cuh says, so G[15] is GC for it too.
#pragma once

#include "sm90/backward/chunk_algebra.cuh"
#include "sm90/common/record.h"

namespace flash_kda::sm90::bwd {

/// Offsets (in floats) of the record's fields; each a multiple of 4 floats (16 B).
struct RecordField {
  static constexpr int G = 0;                       // [16][K] cumulative log decay
  static constexpr int kd = G + kC * kHeadDim;      // [16][K] exp(G_i) k_i
  static constexpr int qd = kd + kC * kHeadDim;     // [16][K] scale exp(G_i) q_i
  static constexpr int kr = qd + kC * kHeadDim;     // [16][K] exp(GC - G_j) k_j
  static constexpr int eg = kr + kC * kHeadDim;     // [K] exp(GC)
  static constexpr int A = eg + kHeadDim;           // [16][16] k_i . (E_ij k_j), j < i; else 0
  static constexpr int M = A + kC * kC;             // [16][16] scale q_i . (E_ij k_j), j <= i; else 0
  static constexpr int Tinv = M + kC * kC;          // [16][16] (I + diag(b) A)^-1, unit lower
  static constexpr int b = Tinv + kC * kC;          // [16] beta activation (0 on padded rows)
  static constexpr int end = b + kC;
};

/// Floats per record.
inline constexpr int kRecordFloats = RecordField::end;
static_assert(kRecordFloats % 4 == 0, "records must stay 16-byte aligned");

}  // namespace flash_kda::sm90::bwd
