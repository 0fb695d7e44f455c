// The forward's kernels as the launch sees them: one function per kernel, each launching it as
// the plan decided (KernelLaunch) and returning the launch's CUDA error. Host-callable from C++.
#pragma once

#include <cstdint>

#include <driver_types.h>  // cudaError_t

#include "sm90/common/kernel_launch.h"
#include "sm90/forward/params.h"

struct CUstream_st;

namespace flash_kda::sm90 {

/// Stage 1 over the window's slots [p.slot_begin, p.slot_end): k.grid_x = their count,
/// k.grid_y = HV. `context_key`: stream_context_key() (kernel attributes are per context).
cudaError_t launch_prepare(const PrepareParams& p, const KernelLaunch& k, uint64_t context_key, CUstream_st* stream);

/// The state passes (recurrence.cu): recurrence_kernel<warps, WindowPass>, warps 4 or 8.
cudaError_t launch_window_pass(const WindowParams& p, int warps, const KernelLaunch& k, uint64_t context_key,
                               CUstream_st* stream);
/// recurrence_kernel<kSegmentWarps, SegmentMapsPass> and <kSegmentWarps, SegmentFinishPass>.
cudaError_t launch_segment_maps(const SegmentMapsParams& p, const KernelLaunch& k, uint64_t context_key,
                                CUstream_st* stream);
cudaError_t launch_segment_finish(const SegmentFinishParams& p, const KernelLaunch& k, uint64_t context_key,
                                  CUstream_st* stream);
/// Warps per block of both segment passes: their grids (sequences x segments x heads, x 2 for
/// the maps) already fill the SMs, so the block that shares one record load between the most
/// columns is the one taken.
inline constexpr int kSegmentWarps = 8;

/// The sequential scan over segment maps (segment_scan.cu).
cudaError_t launch_segment_scan(const ScanParams& p, const KernelLaunch& k, uint64_t context_key,
                                CUstream_st* stream);

}  // namespace flash_kda::sm90
