// The chunk record: what stage 1 (forward/prepare.cu) writes for each (16-token chunk, value
// head) and every state pass (forward/recurrence.cu) reads, and the tile layout it is stored in.
// Host-visible (the plan sizes the record buffers from kRecordBytes).
//
// The record form (docs/kda-spec.md "Record form") makes a chunk's state step linear in S, all
// of it independent of S, with S^T [V x K] the state as the kernels hold it:
//
//   U0 = Av v                      (Av kept as bf16 hi + lo: U0 to ~fp32)
//   U  = U0 - W S                  [16 t x V]
//   O  = Qd S + M U                [16 t x V]
//   S' = diag(gC) S + kr^T U       (S'^T = S^T diag(gC) + U^T kr)
//
// with W, Qd [16 t x K], kr [16 t x K] (stored transposed, kr^T [K x 16 t]), Av, Av lo, M
// [16 x 16] and gC [K]. v is not in the record: the passes read it from the input (a record
// carrying U0 and M U0 would be 8 KB larger, written once and read once).
#pragma once

namespace flash_kda::sm90 {

inline constexpr int kChunk = 16;     // tokens per chunk
inline constexpr int kHeadDim = 128;  // K = V = 128 in this kernel family

// Byte offsets inside one (slot, value head) record. The bf16 tiles are stored as the
// recurrence's wgmma reads them from shared memory (gmma_tile_offset), so a record is copied
// there byte for byte.
inline constexpr int kRecW = 0;                                 // bf16 [16 t][128 k]
inline constexpr int kRecQd = kRecW + kChunk * kHeadDim * 2;     // bf16 [16 t][128 k]
inline constexpr int kRecKr = kRecQd + kChunk * kHeadDim * 2;    // bf16 [128 k][16 t]: kr^T
inline constexpr int kRecAv = kRecKr + kChunk * kHeadDim * 2;    // bf16 [16 i][16 j]
inline constexpr int kRecAvLo = kRecAv + kChunk * kChunk * 2;    // bf16 [16][16]: Av - bf16(Av)
inline constexpr int kRecM = kRecAvLo + kChunk * kChunk * 2;     // bf16 [16 i][16 j], row i = query token i
inline constexpr int kRecGC = kRecM + kChunk * kChunk * 2;       // fp32 [128] gC, plain
inline constexpr int kRecordBytes = kRecGC + kHeadDim * 4;       // 14336, a multiple of 256
static_assert(kRecordBytes % 256 == 0, "records are 256-byte aligned in the workspace");

/// Byte offset of element (n, k) of a bf16 [N][K] tile in wgmma's canonical K-major layout
/// without swizzle (PTX ISA, "Shared memory matrix layout"; CuTe's LayoutType::INTERLEAVE):
/// 8x8 core matrices of 128 contiguous bytes (8 rows of 16 bytes), the core matrices of one
/// 8-row group adjacent along K (leading byte offset 128), 8-row groups K * 16 bytes apart
/// (stride byte offset). A 16-byte piece is 8 consecutive k of one row n.
constexpr int gmma_tile_offset(int n, int k, int K) {
  return ((n / 8) * (K / 8) + k / 8) * 128 + (n % 8) * 16 + (k % 8) * 2;
}

}  // namespace flash_kda::sm90
