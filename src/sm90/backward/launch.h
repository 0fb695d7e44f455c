// The sm_90a backward's entry for src/host/backward.cpp: the workspace size, and the launch of
// the whole backward (launch.cu).
#pragma once

#include <cstddef>

#include "flash_kda/backward.h"

namespace flash_kda::sm90 {

/// Workspace bytes of the backward for a validated problem (layout.h; a multiple of 256).
size_t backward_workspace_bytes(const ProblemShape& p);

/// Enqueues the backward of the validated call `args` on `stream`: the forward recompute with
/// intermediate states every 16 tokens, then the backward kernels. With `allocate`, the
/// workspace comes from it (once); else `workspace` must hold backward_workspace_bytes(p)
/// bytes, 256-byte aligned (Error "workspace" before any launch otherwise). Error ("q") when
/// the device is not sm_90; CudaError on a failed CUDA call.
void launch_backward(const BackwardArgs& args, const ProblemShape& p, void* workspace, size_t have,
                     const WorkspaceAllocator* allocate, Stream stream);

}  // namespace flash_kda::sm90
