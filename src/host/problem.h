// Internal helpers shared by validation, dispatch and the reference.
#pragma once

#include "flash_kda/forward.h"

namespace flash_kda::detail {

/// Start token of sequence n (fixed length: n * T; varlen: cu_seqlens[n]) for host tensors.
int64_t host_seq_start(const ForwardArgs& args, const ProblemShape& p, int64_t n);

}  // namespace flash_kda::detail
