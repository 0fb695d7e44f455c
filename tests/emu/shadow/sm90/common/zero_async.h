// tests/emu's stand-in for src/sm90/common/zero_async.h: the model's "device" memory is host
// memory, zeroed at once (the model runs one grid at a time, in stream order).
#pragma once

#include <cstddef>
#include <cstring>

#include <cuda_runtime.h>

namespace flash_kda::sm90 {

inline cudaError_t zero_async(void* p, size_t bytes, cudaStream_t) {
  std::memset(p, 0, bytes);
  return cudaSuccess;
}

}  // namespace flash_kda::sm90
