// The conversions to the library's TensorView: from a DLPack array (numpy, torch, anything with
// __dlpack__), and from the raw description flash_kda.fwd's fast path builds from a CUDA torch
// tensor (DLPack import costs ~5 us per tensor in torch's Python __dlpack__, eleven times a
// call). Kept apart from the module so every entry point reads arrays the same way.
#pragma once

#include <optional>

#include <nanobind/ndarray.h>

#include "flash_kda/error.h"
#include "flash_kda/tensor.h"

namespace flash_kda::python {

namespace nb = nanobind;

/// DLPack (code, bits) -> DType; throws Error(name, ...) for anything the library has no name for.
DType dtype_from_dlpack(const nb::dlpack::dtype& dt, const char* name);

/// Describes `a` without copying: data pointer (byte_offset applied), dtype, shape, strides in
/// elements, device. Pinned host memory counts as CPU (the reference can read it). Throws
/// flash_kda::Error naming `name` for a 0-d array, more than kMaxDims dimensions, an unknown
/// dtype or a device other than CPU/CUDA. Shape and contiguity rules are the validator's job.
template <typename... Ts>
TensorView to_view(const nb::ndarray<Ts...>& a, const char* name) {
  TensorView t;
  const size_t ndim = a.ndim();
  if (ndim == 0) throw Error(name, "an array with at least one dimension, got a 0-d array");
  if (ndim > static_cast<size_t>(kMaxDims))
    throw Error(name, "at most " + std::to_string(kMaxDims) + " dimensions, got " + std::to_string(ndim));
  t.dtype = dtype_from_dlpack(a.dtype(), name);
  t.ndim = static_cast<int>(ndim);
  for (size_t i = 0; i < ndim; ++i) {
    t.shape[i] = static_cast<int64_t>(a.shape(i));
    t.strides[i] = static_cast<int64_t>(a.stride(i));
  }
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  const int dev = a.device_type();
  if (dev == nb::device::cpu::value || dev == nb::device::cuda_host::value) {
    t.device = DeviceType::CPU;
  } else if (dev == nb::device::cuda::value) {
    t.device = DeviceType::CUDA;
  } else {
    throw Error(name, "a CPU or CUDA array, got DLPack device type " + std::to_string(dev));
  }
  t.device_id = a.device_id();
  return t;
}

/// Describes a CUDA tensor from its raw description, a tuple (data_ptr, dtype, shape, strides,
/// device_id): dtype is a flash_kda::DType value (flash_kda._core.dtype_codes), strides are in
/// elements. None -> an absent TensorView. Throws flash_kda::Error naming `name` for a 0-d
/// tensor, more than kMaxDims dimensions or an unknown dtype code; a malformed tuple raises
/// nanobind's cast error (only flash_kda's own Python code builds these).
TensorView raw_view(const nb::handle& raw, const char* name);

/// Optional arrays: None -> an absent TensorView (ndim 0).
template <typename... Ts>
TensorView to_view(const std::optional<nb::ndarray<Ts...>>& a, const char* name) {
  return a ? to_view(*a, name) : TensorView{};
}

}  // namespace flash_kda::python
