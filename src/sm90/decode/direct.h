// The direct decode kernel's launches (direct_warp.cu; kfirst_rows.cu, k-first pools' row-block
// form), called by decode.cu with the parameter
// block it fills for either kernel and the plan.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "flash_kda/forward.h"
#include "sm90/decode/params.h"
#include "sm90/decode/plan.h"

namespace flash_kda::sm90 {

/// Launches the direct kernel for `layout`, the pool dtype and the gate mode as `plan` says.
/// Returns the CUDA error of the launch.
cudaError_t launch_direct(StateLayout layout, bool bf16_pool, GateMode gate, const DecodePlan& plan, uint64_t ctx,
                          const DecodeParams& p, cudaStream_t stream);

/// Launches the direct kernel's k-first row-block form (plan.kfirst_rows) for the pool dtype and
/// the gate mode as `plan` says (its warps: the key warps of the form). Returns the CUDA error of
/// the launch (cudaErrorInvalidConfiguration for a plan of no instantiated form, or one whose
/// shared memory is short of the form's).
cudaError_t launch_kfirst_rows(bool bf16_pool, GateMode gate, const DecodePlan& plan, uint64_t ctx, const DecodeParams& p,
                               cudaStream_t stream);

}  // namespace flash_kda::sm90
