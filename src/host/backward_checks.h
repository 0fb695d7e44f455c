// The backward call's validation for either target: validate_backward (Sm90) and
// reference_backward (CpuReference) share it.
#pragma once

#include "flash_kda/backward.h"

namespace flash_kda::detail {

/// Every check of a backward call for `target` (backward.h's table; on CpuReference each
/// gradient output may also be fp64 and d_out, d_final_state fp64, host tensors). Throws
/// flash_kda::Error naming the first bad argument; returns the forward's sizes.
ProblemShape check_backward(const BackwardArgs& args, Target target);

}  // namespace flash_kda::detail
