// Zeroing device memory on a stream, behind one function so that the CPU model of the kernels
// (tests/emu/shadow) can stand in a host memset for the CUDA call.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

namespace flash_kda::sm90 {

/// cudaMemsetAsync of `bytes` zero bytes at `p` on `stream`; returns its error.
inline cudaError_t zero_async(void* p, size_t bytes, cudaStream_t stream) { return cudaMemsetAsync(p, 0, bytes, stream); }

}  // namespace flash_kda::sm90
