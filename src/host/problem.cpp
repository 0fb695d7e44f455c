// Host-side reading of sequence boundaries (fixed-length batches and cu_seqlens).
#include "host/problem.h"

namespace flash_kda::detail {

int64_t host_cu_seqlens(const TensorView& cu_seqlens, int64_t i) {
  if (cu_seqlens.dtype == DType::I32) return static_cast<const int32_t*>(cu_seqlens.data)[i];
  return static_cast<const int64_t*>(cu_seqlens.data)[i];
}

int64_t host_seq_start(const ForwardArgs& args, const ProblemShape& p, int64_t n) {
  if (p.varlen) return host_cu_seqlens(args.cu_seqlens, n);
  return n * p.seqlen;
}

}  // namespace flash_kda::detail
