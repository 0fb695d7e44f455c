// Internal helpers shared by validation, dispatch and the reference.
#pragma once

#include <cstdint>

#include "flash_kda/forward.h"

namespace flash_kda::detail {

/// Entry i of a host cu_seqlens tensor (int32 or int64), widened to int64. The caller has
/// checked dtype, rank and 0 <= i < shape[0] (validate() does).
int64_t host_cu_seqlens(const TensorView& cu_seqlens, int64_t i);

/// Start token of sequence n (fixed length: n * T; varlen: cu_seqlens[n]) for host tensors.
/// `args` must have passed validate(); 0 <= n <= p.num_seqs (n == num_seqs gives the end
/// of the last sequence, so the length of sequence n is start(n + 1) - start(n)).
int64_t host_seq_start(const ForwardArgs& args, const ProblemShape& p, int64_t n);

/// validate(args, target) for a call that reads the forward's inputs but has no out (the
/// backward, which recomputes it): every check of validate() except those of out, which must
/// be absent (Error "out" otherwise). The other outputs are checked as validate() checks them.
ProblemShape validate_inputs(const ForwardArgs& args, Target target);

}  // namespace flash_kda::detail
