// The sm_90a forward's entry for src/host/forward.cpp: plan, check or obtain the workspace, and
// execute the plan (launch.cu).
#pragma once

#include <cstddef>

#include "flash_kda/forward.h"
#include "sm90/common/row_layout.h"

namespace flash_kda::sm90 {

/// Workspace bytes for a validated problem and validated options (a multiple of 256): the
/// capacity of plan.h's workspace_layout, from the shape and the forced options alone.
size_t workspace_bytes(const ProblemShape& p, const LaunchOptions& options);

/// Launches the forward on `stream`. `args` is validated for Target::Sm90 and `options` by
/// validate_options. With `allocate`, the workspace comes from it (once, after planning; not
/// called when none is needed) and `workspace`/`have` are ignored. Throws Error ("workspace")
/// when the workspace holds fewer than workspace_bytes(p, options) bytes or is not a 256-byte
/// aligned pointer (before any kernel launch), Error ("q") when the tensors' device is not
/// compute capability 9.0, Error ("launch_options.num_sms") when num_sms exceeds the SMs of the
/// context of `stream`, CudaError on a failed CUDA call.
void launch_forward(const ForwardArgs& args, const ProblemShape& p, const LaunchOptions& options, void* workspace,
                    size_t have, const WorkspaceAllocator* allocate, Stream stream);

/// The byte strides of a validated per-token tensor ([B, T, heads, D], or [B, T, HV] for beta;
/// row_layout.h: the head dimension is dimension 2 in both), as every kernel reading such a
/// tensor addresses it.
RowLayout row_layout(const TensorView& t, const ProblemShape& p);

/// The row form the prepare kernel takes for a call validated for Target::Sm90 (plan.h,
/// prepare_row_form): tests check with it that their inputs select the form they mean to run.
RowForm prepare_form(const ForwardArgs& args, const ProblemShape& p);

}  // namespace flash_kda::sm90
