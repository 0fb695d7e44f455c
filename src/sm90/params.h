// What the two forward stages share: the chunk record layout in the workspace, the kernel
// parameter blocks and the sequence/slot indexing. Math: docs/kda-spec.md "Chunked form".
//
// Stage 1 (prepare.cu, fully parallel) turns each 16-token chunk of one value head into a
// "chunk record" that makes the state recurrence linear in S (all of it independent of S):
//
//   W   = (I+L)^-1 diag(b) kd          [16 x K]   so  U = Av v - W S
//   Qd  = scale qd / ||q||             [16 x K]   so  O = Qd S + M U
//   kr  = k * exp(G_C - G)             [16 x K]   so  S' = diag(gC) S + kr^T U
//   Av  = (I+L)^-1 diag(b)             [16 x 16], as bf16 hi + lo parts (U0 = Av v to ~fp32)
//   M   = lower_incl(scale qn kn^T * decay)  [16 x 16]
//   gC  = exp(G_C)                     [K] fp32
//
// v itself is not in the record: the recurrence reads it from the input (a record carrying
// U0 = Av v and O0 = M U0 would be 8 KB larger, written once and read once).
//
// Stage 2 (recurrence.cu) walks the chunks of each sequence in order, split over value
// columns: the delta rule is independent per value column, so each warp owns 16 columns of
// S^T and never talks to the others.
#pragma once

#include <cstdint>

#include <driver_types.h>  // cudaError_t

namespace flash_kda::sm90 {

inline constexpr int kChunk = 16;     // tokens per chunk (FlashKDA's C)
inline constexpr int kHeadDim = 128;  // K = V = 128 in this kernel family

/// Blocks per (sequence, value head) of a recurrence of `warps` warps a block: each warp owns 16
/// value columns of the state (recurrence.cu), so a block owns warps x 16 of the V = 128.
constexpr int recurrence_column_blocks(int warps) { return kHeadDim / (16 * warps); }

// Chunk record: byte offsets inside one (slot, value head) record. The bf16 tiles are stored
// as the recurrence's wgmma reads them from shared memory (gmma_tile_offset), so a record is
// copied there byte for byte.
inline constexpr int kRecW = 0;                                 // bf16 [16 t][128 k]
inline constexpr int kRecQd = kRecW + kChunk * kHeadDim * 2;     // bf16 [16 t][128 k]
inline constexpr int kRecKr = kRecQd + kChunk * kHeadDim * 2;    // bf16 [128 k][16 t]: kr transposed
inline constexpr int kRecAv = kRecKr + kChunk * kHeadDim * 2;    // bf16 [16 i][16 j]
inline constexpr int kRecAvLo = kRecAv + kChunk * kChunk * 2;    // bf16 [16][16]: Av - bf16(Av)
inline constexpr int kRecM = kRecAvLo + kChunk * kChunk * 2;     // bf16 [16 i][16 j], row i = query token i
inline constexpr int kRecGC = kRecM + kChunk * kChunk * 2;       // fp32 [128], plain
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

/// Where each sequence starts. Fixed length: sequence n starts at token n*T of the flattened
/// [B*T] token axis; varlen: cu_seqlens[n].
///
/// Chunk slots: chunk c of sequence n owns slot n + floor(start_n / 16) + c. Slots of different
/// sequences never collide and all lie below N + ceil(T_total / 16), so both stages can index
/// the workspace without reading cu_seqlens on the host. A zero-length sequence owns the
/// (empty) slot n + floor(start_n / 16) for its pass-through.
struct SeqIndex {
  const void* cu_seqlens = nullptr;  // nullptr: fixed length
  bool cu_is_64 = true;
  int64_t seqlen = 0;                // T (fixed length)
  int64_t num_seqs = 0;              // N
  int64_t total_tokens = 0;          // B * T, or T of the packed varlen batch

#if defined(__CUDACC__)
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

/// Stage 1 parameters. Tensors are the validated, contiguous inputs (bf16 unless noted).
struct PrepareParams {
  const void* q;          // [.., H, K]
  const void* k;          // [.., H, K]
  const void* g;          // [.., HV, K] bf16 or fp32 (g_is_f32)
  const void* beta;       // [.., HV]    bf16 or fp32 (beta_is_f32)
  const float* A_log;     // [HV]
  const float* dt_bias;   // [HV * K]
  bool g_is_f32, beta_is_f32;
  SeqIndex seqs;
  int heads, value_heads;  // H, HV
  int group;               // HV / H, set by launch_prepare (a division per block otherwise)
  float scale, lower_bound;
  char* records;           // window's records: [(slot - slot_begin) * HV + hv]
  int64_t slot_begin, slot_end;
};

/// Stage 2 parameters.
struct RecurrenceParams {
  const char* records;
  const void* v;                // bf16 [.., HV, V]: U = Av v - W S
  SeqIndex seqs;
  int value_heads;
  void* out;                    // bf16 [.., HV, V]
  const void* initial_state;    // [N, HV, V, K] or nullptr (zero state)
  void* final_state;            // [N, HV, V, K] or nullptr
  bool state_is_f32;
  float* carry_in;              // fp32 [HV, V, K]: state of the sequence crossing slot_begin
  float* carry_out;             // fp32 [HV, V, K]: state of the sequence crossing slot_end
  int64_t slot_begin, slot_end;
  // Pipelined windows (launch.cu): every consumer warp of this grid adds 1 to *done_out once its
  // last read of the records and its last write (out, carry, final state) are done, and the grid
  // lets the next kernel (the next window's stage 1) launch early; a grid with done_in waits,
  // past the programmatic launch wait, for *done_in to reach done_expected (the previous
  // window's grid) before reading the carry or letting that stage 1 start. Both nullptr
  // otherwise (done_out is nullptr for the last window).
  unsigned* done_in = nullptr;
  unsigned done_expected = 0;
  unsigned* done_out = nullptr;

  // Segment-parallel mode (seg_len > 0; one window only). Across a segment of chunks the state
  // map is affine, X -> X P + Q with X = S^T [V x K] (docs/kda-spec.md, last section of
  // "Chunked form"), so each sequence is cut into segments of seg_len chunks walked by
  // different blocks (blockIdx.x = sequence * max_segs + segment):
  //   pass kSegMaps:   P (from X = I with U0 = 0) and Q (from X = 0) of every segment but the
  //                    last, into seg_maps; no output;
  //   segment_scan:    X_0 = the initial state, X_{j+1} = X_j P_j + Q_j, all into seg_states;
  //   pass kSegFinish: every segment from its true start state, writing out and final_state.
  int64_t seg_len = 0;           // chunks per segment; 0: whole sequences (no segments)
  int64_t max_segs = 1;          // segments per sequence in the grid
  int seg_pass = 0;              // kSegFinish or kSegMaps
  float* seg_maps = nullptr;     // fp32 [N][max_segs - 1][HV][2][V][K]: P then Q of segment j
  const float* seg_states = nullptr;  // fp32 [N][max_segs][HV][V][K]: state entering segment j
};

inline constexpr int kSegFinish = 0;
inline constexpr int kSegMaps = 1;

/// Segment scan parameters (segment_scan.cu).
struct ScanParams {
  SeqIndex seqs;
  int value_heads;
  int64_t seg_len, max_segs;
  const float* seg_maps;
  float* seg_states;
  const void* initial_state;  // [N, HV, V, K] or nullptr (zero state)
  bool state_is_f32;
};

/// Launches stage 1 over the window's slots; returns the launch's error status. after_recurrence:
/// launched as the programmatic dependent of the previous window's recurrence, so that it runs
/// beside it (it reads only the inputs and writes the record buffer that recurrence is not reading).
cudaError_t launch_prepare(const PrepareParams& p, bool after_recurrence, struct CUstream_st* stream);
/// How stage 2 is launched.
struct RecurrenceLaunch {
  int warps_per_block = 8;   // 4 or 8 (one or two warpgroups): 16 value columns per warp
  int64_t max_seqs = 0;      // sequences overlapping the window at most (each owns >= 1 slot)
  bool after_prepare = false;  // directly follows launch_prepare on the stream: launched as its
                               // programmatic dependent (starts in stage 1's last wave)
  int num_sms = 0;           // a grid of at most this many blocks gets one block per SM
};
/// Launches stage 2 over the window's sequences; returns the launch's error status.
cudaError_t launch_recurrence(const RecurrenceParams& p, const RecurrenceLaunch& how, struct CUstream_st* stream);
/// Consumer warps of that launch's grid: what its done_out count reaches.
unsigned recurrence_consumer_warps(const RecurrenceParams& p, const RecurrenceLaunch& how);
/// Launches the sequential scan over segment maps, one block per (sequence, head, 16 rows).
cudaError_t launch_segment_scan(const ScanParams& p, struct CUstream_st* stream);

/// Bytes of one segment map buffer entry: a fp32 [V][K] matrix.
inline constexpr int64_t kStateBytes = int64_t(kHeadDim) * kHeadDim * 4;

/// Element offset of the [V][K] state of (sequence n, value head hv) in initial_state /
/// final_state ([N, HV, V, K]); HV value heads.
__host__ __device__ constexpr int64_t state_offset(int64_t n, int64_t hv, int64_t HV) {
  return (n * HV + hv) * (kHeadDim * kHeadDim);
}

/// Element offsets in the segment buffers (layouts in RecurrenceParams): the state entering
/// segment j of (sequence n, value head hv) in seg_states, and that segment's map `part`
/// (0: P, 1: Q) in seg_maps; HV value heads, max_segs segments per sequence.
__host__ __device__ constexpr int64_t seg_state_offset(int64_t n, int64_t j, int64_t hv, int64_t max_segs,
                                                       int64_t HV) {
  return ((n * max_segs + j) * HV + hv) * (kHeadDim * kHeadDim);
}
__host__ __device__ constexpr int64_t seg_map_offset(int64_t n, int64_t j, int64_t hv, int part, int64_t max_segs,
                                                     int64_t HV) {
  return (((n * (max_segs - 1) + j) * HV + hv) * 2 + part) * (kHeadDim * kHeadDim);
}

}  // namespace flash_kda::sm90
