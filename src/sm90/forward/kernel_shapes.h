// Block shapes and shared-memory sizes of the forward kernels: host-visible, so that the plan
// (plan.cpp) decides every grid, block and dynamic shared-memory reservation from them, and the
// kernels are compiled against the same numbers.
#pragma once

#include <cstdint>

#include "sm90/common/record.h"

namespace flash_kda::sm90 {

// ---- Stage 1 (prepare.cu): one 4-warp block per (chunk slot, value head), static shared memory.
inline constexpr int kPrepareThreads = kHeadDim;
/// Its static shared memory (prepare.cu's Smem, checked there): the plan's exclusive
/// reservation for the state passes is sized to leave no room for one such block.
inline constexpr int kPrepareSmemBytes = 26752;

// ---- State passes (recurrence.cu).

/// Stage buffers in the ring of a state pass: kStages - 2 chunks are in flight while the
/// current one and the one before (whose O products still run) are read.
inline constexpr int kStages = 6;

/// Blocks per (sequence, value head) of a state pass of `warps` warps a block: each warp owns 16
/// value columns of the state, so a block owns warps x 16 of the V = 128.
constexpr int recurrence_column_blocks(int warps) { return kHeadDim / (16 * warps); }

/// Dynamic shared memory of a state-pass block of NW consumer warps: kStages stage buffers
/// (the record byte for byte, then the chunk's 16 rows of the block's v columns), per-warp
/// output staging, the full/empty mbarriers.
template <int NW>
struct RecurrenceSmem {
  static_assert(NW == 4 || NW == 8, "whole warpgroups");
  static constexpr int kRec = 0;                      // the record (16-byte aligned tiles)
  static constexpr int kVRow = NW * 16 * 2 + 16;      // padded row of this block's v columns
  static constexpr int kV = kRecordBytes;
  static constexpr int kStage = kV + kChunk * kVRow;
  static constexpr int kOut = kStages * kStage;       // per-warp [16 tok][16 v] bf16 staging
  static constexpr int kBar = kOut + NW * kChunk * 32;  // mbarriers: full[kStages], empty[kStages]
  static constexpr int kBytes = kBar + 2 * kStages * 8;
  static_assert(kStage % 128 == 0, "stage buffers keep the record's tiles 128-byte aligned");
  static_assert(kVRow % 16 == 0 && kRecordBytes % 16 == 0 && kBar % 8 == 0,
                "bulk copies move 16-byte multiples between 16-byte aligned addresses");
};

/// The staging buffer of a state pass that stores intermediate states (inter_store.cuh), after
/// RecurrenceSmem<NW>'s buffers: the destination's rows over the block's columns, each padded
/// by 16 bytes. v-first heads ([V][K]): NW*16 rows of kHeadDim elements; k-first ([K][V]):
/// kHeadDim rows of NW*16 elements. Sized for fp32 (bf16 uses part of it).
template <int NW>
struct InterStaging {
  static constexpr int kOffset = (RecurrenceSmem<NW>::kBytes + 127) / 128 * 128;
  /// Bytes of one destination row over the block's columns, for the layout and the element
  /// size (4: fp32, 2: bf16): what each row's bulk copy moves.
  static constexpr int row_bytes(bool k_first, int esize) { return (k_first ? NW * 16 : kHeadDim) * esize; }
  /// Padded row pitch in bytes.
  static constexpr int pitch(bool k_first, int esize) { return row_bytes(k_first, esize) + 16; }
  static constexpr int rows(bool k_first) { return k_first ? kHeadDim : NW * 16; }
  /// Where row r goes: the element offset of its first element in the head's state ([V][K]
  /// v-first, [K][V] k-first), for the block whose first value column is v_block.
  static constexpr int64_t row_destination(bool k_first, int r, int v_block) {
    return k_first ? int64_t(r) * kHeadDim + v_block : int64_t(v_block + r) * kHeadDim;
  }
  static constexpr int kBytes = rows(true) * pitch(true, 4) > rows(false) * pitch(false, 4)
                                    ? rows(true) * pitch(true, 4)
                                    : rows(false) * pitch(false, 4);
  /// The block's dynamic shared memory with the staging buffer.
  static constexpr int kSmemBytes = kOffset + kBytes;
  static_assert(pitch(true, 2) % 16 == 0 && pitch(false, 2) % 16 == 0 && kOffset % 16 == 0,
                "bulk copies move 16-byte multiples between 16-byte aligned addresses");
};

/// One warpgroup (NW = 4) gets a fifth warp that only issues the chunk loads, a producer in the
/// manner of warp specialisation: with one warp per scheduler every instruction of a consumer
/// warp is on the chunk step's chain, and the loads are ~35 of its ~310 a step (state pass of
/// h4_fixed_1024 42.5 -> 39.2 us, docs/performance.md). Two warpgroups issue the loads themselves,
/// beside their products: a third, producer warpgroup (setmaxnreg 232 / 40, as 255 registers x
/// 288 threads would not fit) makes h96_fixed_8192's state pass slower, 369 -> 415 us.
constexpr bool recurrence_has_producer(int warps) { return warps == 4; }
constexpr int recurrence_block_threads(int warps) { return warps * 32 + (recurrence_has_producer(warps) ? 32 : 0); }

// ---- Segment scan (segment_scan.cu): one block per (sequence, value head, 16 rows of X).
inline constexpr int kScanRows = 16;
inline constexpr int kScanThreads = 256;  // warp w: rows w and w + 8; lane l: columns 4l .. 4l + 3
inline constexpr int kScanXPad = kHeadDim + 4;
inline constexpr int kScanSmemBytes = 2 * kHeadDim * kHeadDim * 4 + kScanRows * kScanXPad * 4;  // P_j, P_{j+1}, X

}  // namespace flash_kda::sm90
