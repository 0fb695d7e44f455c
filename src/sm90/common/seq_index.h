// Sequences and chunk slots: how every sm_90a kernel finds its sequence's tokens and records
// without the host reading cu_seqlens.
#pragma once

#include <cstdint>

#include "sm90/common/record.h"

namespace flash_kda::sm90 {

/// Where each sequence starts. Fixed length: sequence n starts at token n*T of the flattened
/// [B*T] token axis; varlen: cu_seqlens[n].
///
/// Chunk slots: chunk c of sequence n owns slot n + floor(start_n / 16) + c. Slots of different
/// sequences never collide and all lie below N + ceil(T_total / 16), so every kernel can index
/// the workspace without reading cu_seqlens on the host. A zero-length sequence owns the
/// (empty) slot n + floor(start_n / 16) for its pass-through.
struct SeqIndex {
  const void* cu_seqlens = nullptr;  // nullptr: fixed length
  bool cu_is_64 = true;
  int64_t seqlen = 0;                // T (fixed length)
  int64_t num_seqs = 0;              // N
  int64_t total_tokens = 0;          // B * T, or T of the packed varlen batch

#if defined(__CUDACC__) || defined(FLASH_KDA_EMU)  // FLASH_KDA_EMU: tests/emu's CPU model
  /// cu_seqlens cannot be checked on the host without a synchronisation, so its values are
  /// clamped to [0, total_tokens] (and lengths to >= 0, see length()): bad values give
  /// unspecified results (a clamped range may overlap another sequence's rows) but never an
  /// access outside q, k, v, g, beta, out or the workspace.
  __device__ __forceinline__ int64_t start(int64_t n) const {
    if (cu_seqlens == nullptr) return n * seqlen;
    const int64_t s = cu_is_64 ? static_cast<const int64_t*>(cu_seqlens)[n]
                               : static_cast<int64_t>(static_cast<const int32_t*>(cu_seqlens)[n]);
    return s < 0 ? 0 : (s > total_tokens ? total_tokens : s);
  }
  /// Tokens of sequence n; 0 where bad (decreasing) cu_seqlens values would make it negative.
  __device__ __forceinline__ int64_t length(int64_t n) const {
    const int64_t len = start(n + 1) - start(n);
    return len > 0 ? len : 0;
  }
  __device__ __forceinline__ int64_t first_slot(int64_t n) const { return n + start(n) / kChunk; }
  /// start(n), length(n) and first_slot(n) from one start() each of n and n + 1 (the separate
  /// calls repeat them: ~30 instructions in stage 1's prologue).
  struct Span {
    int64_t begin, length, first_slot;
  };
  __device__ __forceinline__ Span span(int64_t n) const {
    const int64_t b = start(n), e = start(n + 1);
    return {b, e > b ? e - b : 0, n + static_cast<int64_t>(static_cast<uint64_t>(b) / kChunk)};
  }
  /// The sequence owning `slot`: the largest n with first_slot(n) <= slot.
  __device__ __forceinline__ int64_t seq_of_slot(int64_t slot) const {
    int64_t lo = 0, hi = num_seqs - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (first_slot(mid) <= slot) lo = mid; else hi = mid - 1;
    }
    return lo;
  }
#endif
};

}  // namespace flash_kda::sm90
