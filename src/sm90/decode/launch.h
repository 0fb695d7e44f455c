// The sm_90a decode step's launch: plans the call (plan.h: which kernel, its grid) and launches
// the planned kernel on the caller's stream.
#pragma once

#include "flash_kda/decode.h"

namespace flash_kda::sm90 {

/// Launches the planned decode kernel (`kernel`: the caller's request, Auto for the plan's
/// choice) for a call validated by validate_decode(args, Target::Sm90) (`p` its result) on
/// `stream`, on q's device (made current for the launch, then restored). No host
/// synchronisation, no allocation. Throws CudaError if the launch fails.
void launch_decode(const DecodeArgs& args, const ProblemShape& p, DecodeKernel kernel, Stream stream);


}  // namespace flash_kda::sm90
