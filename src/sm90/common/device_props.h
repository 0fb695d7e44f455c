// What the plan needs to know of the GPU the call runs on, queried once per CUDA context and
// cached: the forward runs once per layer and step, and driver queries on every call would be part
// of its host time.
#pragma once

#include <cstdint>

struct CUstream_st;

namespace flash_kda::sm90 {

/// Properties of the device of the CUDA context a call's kernels run in: the context of the call's
/// stream (a stream made in a green context, cuGreenCtxStreamCreate included, belongs to that
/// green context; the NULL and per-thread streams to the current context). num_sms is the SMs
/// that context may use: the SM resource of a green context (a partition of the device), else
/// the device's count.
struct DeviceProps {
  int device = -1;                  // CUDA device ordinal
  int major = 0, minor = 0;         // compute capability
  int num_sms = 0;                  // SMs of the current context
  int smem_per_sm = 0;              // bytes of shared memory per SM
  int smem_per_block_optin = 0;     // the most dynamic + static shared memory one block may opt in to
  int smem_reserved_per_block = 0;  // bytes the driver reserves per resident block
};

/// A key of the (device, context) `stream` belongs to (the current one for the NULL and per-thread
/// streams), unique for the process's lifetime (cuCtxGetId); `device`'s primary context is made
/// current first when no context is current; a key derived from `device` where the driver has
/// no context ids. Throws CudaError when the device cannot be made current.
uint64_t stream_context_key(int device, CUstream_st* stream);

/// DeviceProps of that context (key from stream_context_key), queried the first time per
/// context (up to 64 contexts; more are queried on every call). Throws CudaError when a query
/// fails.
DeviceProps stream_device_props(int device, uint64_t context_key, CUstream_st* stream);

}  // namespace flash_kda::sm90
