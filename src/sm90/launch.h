// Host-side launch logic of the sm_90a forward: workspace layout, split heuristics, kernel
// sequence. The only file that knows how the stages fit together.
#pragma once

#include <cstddef>

#include "flash_kda/forward.h"

namespace flash_kda::sm90 {

/// Workspace bytes for a validated problem (multiple of 256).
size_t workspace_bytes(const ProblemShape& p);

/// Launches the forward on `stream`. `args` is validated for Target::Sm90. Throws Error
/// ("workspace") when `workspace` holds fewer than workspace_bytes(p) bytes or is not a 256-byte
/// aligned pointer (before any CUDA call), Error ("q") when the tensors' device is not compute
/// capability 9.0, CudaError on launch failure.
void launch_forward(const ForwardArgs& args, const ProblemShape& p, void* workspace,
                    size_t workspace_bytes, Stream stream);

}  // namespace flash_kda::sm90
