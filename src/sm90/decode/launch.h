// The sm_90a decode step's launch: plans the grid for the call (plan.h) and launches the one
// kernel on the caller's stream.
#pragma once

#include "flash_kda/decode.h"

namespace flash_kda::sm90 {

/// Launches the decode kernel for a call validated by validate_decode(args, Target::Sm90)
/// (`p` its result) on `stream`, on q's device (made current for the launch, then restored).
/// No host synchronisation, no allocation. Throws CudaError if the launch fails.
void launch_decode(const DecodeArgs& args, const ProblemShape& p, Stream stream);

}  // namespace flash_kda::sm90
