// The parameter blocks of the forward kernels (what the device reads), and the element offsets
// of the state buffers. Each state pass has its own block: a pass's type says which one it reads
// (recurrence_passes.cuh). The plan (plan.h) fills none of them: launch.cu does, from the plan
// and the call's tensors.
//
// The stages, in the record form (docs/kda-spec.md "Record form", common/record.h):
//   prepare (stage 1, fully parallel): one record per (chunk, value head);
//   WindowPass: the chunks of a window of slots in order, per sequence, from the initial
//     state or the carry of the window before; writes out and the final state or the carry;
//   segment-parallel (one window, few long chains): across a segment of chunks the state map
//     is affine, X -> X P + Q with X = S^T [V x K], so each sequence is cut into segments:
//     SegmentMapsPass: P (from X = I with U0 = 0) and Q (from X = 0) of every segment but
//       the last, no output;
//     segment_scan: X_0 = the initial state, X_{j+1} = X_j P_j + Q_j, into seg_states;
//     SegmentFinishPass: every segment from its true start state, writing out and the final
//       state.
#pragma once

#include <cstdint>

#include "flash_kda/forward.h"
#include "sm90/common/record.h"
#include "sm90/common/row_layout.h"
#include "sm90/common/seq_index.h"

namespace flash_kda::sm90 {

/// Stage 1 parameters. q, k, g and beta are read in place through their RowLayouts (any batch,
/// token and head strides, unit last-dimension stride, 16-byte aligned rows: validate.cpp), bf16
/// unless noted. The gate mode is the kernel's template parameter (launch_prepare picks it).
struct PrepareParams {
  const void* q;          // [.., H, K]
  const void* k;          // [.., H, K]
  const void* g;          // [.., HV, K] bf16 or fp32 (g_is_f32)
  const void* beta;       // [.., HV]    bf16 or fp32 (beta_is_f32)
  RowLayout q_rows, k_rows, g_rows, beta_rows;  // byte addressing of each (row_layout.h)
  const float* A_log;     // [HV], or nullptr: decay rate exp(A_log) = 1 (unused for PreGated)
  const float* dt_bias;   // [HV * K], contiguous, or nullptr: zero bias (unused for PreGated)
  GateMode gate;          // SafeSigmoid, Softplus or PreGated
  bool g_is_f32, beta_is_f32;
  bool l2norm;            // use_qk_l2norm: q / ||q||, k / ||k|| (else q, k as given)
  bool beta_sigmoid;      // use_beta_sigmoid: b = beta_mul * sigmoid(beta) (else b = beta)
  float beta_mul;         // 2 with allow_neg_eigval, else 1
  // FlashKDA's flags (the safe gate with A_log and dt_bias, the L2 norm, b = sigmoid(beta)),
  // chosen by prepare_flashkda_flags (plan.h): the kernel's Dense and Flat forms then have them
  // fixed at compile time, so FlashKDA's call, the most common one, contiguous or on views of a
  // fused projection, pays no instruction for the other modes' flags.
  bool flashkda_flags;
  // The kernel's addressing of q, k, g and beta (row_layout.h), chosen by prepare_row_form
  // (plan.h): Dense, FlashKDA's flags with every input dense (constant strides); Flat, every
  // input's batch folded into its token index; General, any strides.
  RowForm row_form;
  SeqIndex seqs;
  int heads, value_heads;  // H, HV
  int group;               // HV / H (the host divides once; a division per block otherwise)
  float scale, lower_bound;
  char* records;           // the window's records: [(slot - slot_begin) * HV + hv]
  int64_t slot_begin, slot_end;
};

/// Which state slot each sequence reads and writes: sequence n itself, or, with a state pool,
/// ssm_state_indices[n] (forward.h). Index values are on the device and unchecked, so an entry
/// outside [0, num_slots) reads as -1 (padded: skipped), which keeps every access in the pool.
struct StatePool {
  const void* indices = nullptr;  // int32 / int64 [N], or nullptr: slot n
  bool indices_64 = false;
  int64_t num_slots = 0;          // P (pool slots; unused without indices)
#if defined(__CUDACC__)
  /// Slot of sequence n, or -1 for a padded (or out-of-range) entry.
  __device__ __forceinline__ int64_t slot(int64_t n) const {
    if (indices == nullptr) return n;
    const int64_t s = indices_64 ? static_cast<const int64_t*>(indices)[n]
                                 : static_cast<int64_t>(static_cast<const int32_t*>(indices)[n]);
    return s >= 0 && s < num_slots ? s : -1;
  }
#endif
};

/// Intermediate states (forward.h "Intermediate states"): where the passes that walk a sequence's
/// chunks in order (WindowPass, SegmentFinishPass) store the state at every_chunks-chunk
/// boundaries. The offsets are on the device and unchecked, so each range is clamped into
/// [0, num_rows): no store leaves the tensor. states == nullptr: none asked for (the kernels
/// then run an instantiation without this code, recurrence.cu).
struct InterStates {
  void* states = nullptr;          // [S, HV, V, K] (or K, V) bf16 or fp32 (is_f32), or nullptr
  bool is_f32 = false;
  const void* offsets = nullptr;   // int32 / int64 [N + 1]
  bool offsets_64 = false;
  int64_t num_rows = 0;            // S
  int64_t every_chunks = 1;        // intermediate_every / 16
  bool include_initial = true;     // row j: after j * every tokens (else (j + 1) * every)
#if defined(__CUDACC__)
  /// First row and row count of sequence n, clamped: 0 <= first, first + count <= num_rows.
  struct Rows {
    int64_t first, count;
  };
  __device__ __forceinline__ Rows rows(int64_t n) const {
    auto at = [&](int64_t i) {
      const int64_t o = offsets_64 ? static_cast<const int64_t*>(offsets)[i]
                                   : static_cast<int64_t>(static_cast<const int32_t*>(offsets)[i]);
      return o < 0 ? int64_t(0) : (o > num_rows ? num_rows : o);
    };
    const int64_t b = at(n), e = at(n + 1);
    return {b, e > b ? e - b : 0};
  }
#endif
};

/// What every state pass reads.
struct ChainParams {
  const char* records;          // [(slot - slot_begin) * HV + hv] (slot_begin 0 with segments)
  const void* v;                // bf16 [.., HV, V] at v_rows: U0 = Av v
  RowLayout v_rows;             // v's byte strides (row_layout.h)
  SeqIndex seqs;
  StatePool pool;               // state slot of each sequence (pool prefill), -1: padded
  int value_heads;              // HV
  bool state_k_first;           // states [.., HV, K, V] (S) instead of [.., HV, V, K] (S^T)
};

/// WindowPass: whole sequences, or the part of each that lies in [slot_begin, slot_end).
struct WindowParams : ChainParams {
  void* out;                    // bf16 [.., HV, V] at out_rows
  RowLayout out_rows;
  const void* initial_state;    // [N or P, HV, V, K] (or K, V) or nullptr (zero state)
  void* final_state;            // [N or P, HV, V, K] (or K, V) or nullptr
  bool initial_is_f32, final_is_f32;
  float* carry_in;              // fp32 [HV, V, K]: state of the sequence crossing slot_begin
  float* carry_out;             // fp32 [HV, V, K]: state of the sequence crossing slot_end
  int64_t slot_begin, slot_end;
  // Pipelined windows: every consumer warp of this grid adds 1 to *done_out once its last read
  // of the records and its last write (out, carry, final state) are done, and the grid lets the
  // next kernel (the next window's stage 1) launch early; a grid with done_in waits, past the
  // programmatic launch wait, for *done_in to reach done_expected (the previous window's grid)
  // before reading the carry or letting that stage 1 start. Both nullptr otherwise (done_out is
  // nullptr for the last window).
  unsigned* done_in;
  unsigned done_expected;
  unsigned* done_out;
  InterStates inter;            // last, so the fields above keep their offsets
};

/// What both segment passes read: seg_len chunks per segment, blockIdx.x = sequence *
/// max_segs + segment.
struct SegmentParams : ChainParams {
  int64_t seg_len;
  int64_t max_segs;
};

/// SegmentMapsPass: writes P and Q of every segment but each sequence's last.
struct SegmentMapsParams : SegmentParams {
  float* seg_maps;              // fp32 [N][max_segs - 1][HV][2][V][K]: P then Q of segment j
};

/// SegmentFinishPass: every segment from the start state the scan made for it.
struct SegmentFinishParams : SegmentParams {
  void* out;                    // bf16 [.., HV, V] at out_rows
  RowLayout out_rows;
  void* final_state;            // [N or P, HV, V, K] (or K, V) or nullptr
  bool final_is_f32;
  const float* seg_states;      // fp32 [N][max_segs][HV][V][K]: state entering segment j
  InterStates inter;            // last, so the fields above keep their offsets
};

/// Segment scan parameters (segment_scan.cu).
struct ScanParams {
  SeqIndex seqs;
  int value_heads;
  int64_t seg_len, max_segs;
  const float* seg_maps;
  float* seg_states;
  const void* initial_state;  // [N or P, HV, V, K] (or K, V) or nullptr (zero state)
  bool initial_is_f32;
  bool state_k_first;         // initial_state is [.., HV, K, V]
  StatePool pool;             // the state slot sequence n starts from; -1: padded (zero start)
};

/// Bytes of one fp32 [V][K] state.
inline constexpr int64_t kStateBytes = int64_t(kHeadDim) * kHeadDim * 4;

#if defined(__CUDACC__)
#define FKDA_OFFSET_FN __host__ __device__ constexpr
#else
#define FKDA_OFFSET_FN constexpr
#endif

/// Element offset of the [V][K] (or [K][V]) state of (slot n, value head hv) in initial_state /
/// final_state ([N or P, HV, ..]); HV value heads.
FKDA_OFFSET_FN int64_t state_offset(int64_t n, int64_t hv, int64_t HV) {
  return (n * HV + hv) * (kHeadDim * kHeadDim);
}

/// Element offsets in the segment buffers (layouts above): the state entering segment j of
/// (sequence n, value head hv) in seg_states, and that segment's map `part` (0: P, 1: Q) in
/// seg_maps; HV value heads, max_segs segments per sequence.
FKDA_OFFSET_FN int64_t seg_state_offset(int64_t n, int64_t j, int64_t hv, int64_t max_segs, int64_t HV) {
  return ((n * max_segs + j) * HV + hv) * (kHeadDim * kHeadDim);
}
FKDA_OFFSET_FN int64_t seg_map_offset(int64_t n, int64_t j, int64_t hv, int part, int64_t max_segs, int64_t HV) {
  return (((n * (max_segs - 1) + j) * HV + hv) * 2 + part) * (kHeadDim * kHeadDim);
}

#undef FKDA_OFFSET_FN

}  // namespace flash_kda::sm90
