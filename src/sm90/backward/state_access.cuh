// What the chain and the chunk-gradient kernels need beyond their own files to read and write
// the call's tensors: the bf16/fp32 element helpers, dynamic shared memory, the flat token's
// sequence (device_util.cuh), and where element (key c, value v) of a K x V state lies in the
// call's state layout.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "sm90/backward/device_util.cuh"
#include "sm90/backward/params.h"
#include "sm90/common/bf16.cuh"
#include "sm90/common/dynamic_smem.cuh"
#include "sm90/common/record.h"

namespace flash_kda::sm90::bwd {

/// Offset of element (key c, value v) in a [K x V] state slice of the call's layout: k-first
/// rows are keys, v-first rows are values.
__device__ __forceinline__ int64_t state_elem(bool k_first, int c, int v) {
  return k_first ? int64_t(c) * kHeadDim + v : int64_t(v) * kHeadDim + c;
}

}  // namespace flash_kda::sm90::bwd
