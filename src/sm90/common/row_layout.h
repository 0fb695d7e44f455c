// Addressing of the per-token tensors (q, k, v, g, beta, out) of a call: [B, T, heads, D] for
// fixed length or [1, T_total, heads, D] for varlen, with any batch, token and head strides and
// a contiguous last dimension. The kernels see tokens on the flattened token axis of SeqIndex
// (sequence n's tokens start at n*T, fixed length; at cu_seqlens[n], varlen); a RowLayout turns
// (sequence, flat token, head) into the byte offset of that row, so views of a fused projection
// or of a larger buffer are read in place, without a copy.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FKDA_ROW_FN __host__ __device__ __forceinline__ constexpr
#else
#define FKDA_ROW_FN constexpr
#endif

namespace flash_kda::sm90 {

/// Byte strides of one per-token tensor. For fixed length, the row of flat token t of sequence
/// n (t in [n*T, (n+1)*T)) is at n * seq_stride + (t - n*T) * token_stride; for varlen (B = 1)
/// seq_stride = seq_tokens = 0 and it is at t * token_stride. Head h adds h * head_stride.
struct RowLayout {
  int64_t seq_stride = 0;    ///< bytes between batch entries (fixed length); 0 for varlen
  int64_t seq_tokens = 0;    ///< T (fixed length); 0 for varlen
  int64_t token_stride = 0;  ///< bytes between consecutive tokens
  int64_t head_stride = 0;   ///< bytes between consecutive heads

  /// Byte offset of (sequence n, flat token t, head h).
  FKDA_ROW_FN int64_t offset(int64_t n, int64_t t, int64_t h) const {
    return n * seq_stride + (t - n * seq_tokens) * token_stride + h * head_stride;
  }

  /// Whether the batch folds into the token index: batch entries T token strides apart (views of
  /// a fused projection, slices of the head axis or of a wider row, contiguous tensors; always
  /// for varlen, where both are 0). Then the row of flat token t, head h is at t * token_stride +
  /// h * head_stride whatever n (flattened()).
  FKDA_ROW_FN bool flat() const { return seq_stride == seq_tokens * token_stride; }

  /// These strides addressed by the flat token alone (sequence stride 0), for kernels
  /// specialised to flat inputs (flat()): the batch term drops out of their addressing.
  FKDA_ROW_FN RowLayout flattened() const { return RowLayout{0, 0, token_stride, head_stride}; }

  /// Whether these are the strides of a contiguous tensor of `heads` rows of `row_bytes` a
  /// token: then the row of flat token t, head h is at (t * heads + h) * row_bytes whatever n.
  FKDA_ROW_FN bool dense(int64_t heads, int64_t row_bytes) const {
    return head_stride == row_bytes && token_stride == heads * row_bytes && flat();
  }

  /// The layout of a contiguous tensor of `heads` rows of `row_bytes` a token, addressed by the
  /// flat token alone (sequence stride 0), for kernels specialised to dense inputs: its constant
  /// strides fold into the addressing.
  static FKDA_ROW_FN RowLayout dense_of(int64_t heads, int64_t row_bytes) {
    return RowLayout{0, 0, heads * row_bytes, row_bytes};
  }
};

/// How a kernel specialised on its inputs' addressing reads their rows, one instantiation each
/// (the prepare kernel's third template argument): General through RowLayout::offset (any batch
/// stride), Flat through flattened() (every input flat()), Dense through dense_of() (every input
/// dense(): constant strides).
enum class RowForm { General, Flat, Dense };

}  // namespace flash_kda::sm90

#undef FKDA_ROW_FN
