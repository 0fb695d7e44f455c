// The conversions from Python objects to the library's TensorView, one tensor of the call
// table (flash_kda/call_table.h) at a time: from a DLPack array (numpy, torch, anything with
// __dlpack__), and from the raw description flash_kda.fwd's fast path builds from a torch
// tensor (DLPack import costs ~5 us per tensor in torch's Python __dlpack__, a dozen times a
// call). Every failure is a flash_kda::Error naming the tensor, so no Python object reaches
// nanobind's own argument casting, whose TypeError lists a signature instead of the argument.
#pragma once

#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include "flash_kda/call_table.h"
#include "flash_kda/error.h"
#include "flash_kda/tensor.h"

namespace flash_kda::python {

namespace nb = nanobind;

/// Keeps the imported DLPack arrays (and so their memory) alive for the duration of a call.
struct Imported {
  std::vector<nb::ndarray<nb::ro>> inputs;
  std::vector<nb::ndarray<>> outputs;
};

/// A view of `obj` for the tensor `spec` of a call on `target`: None -> absent (an Error for a
/// required tensor); anything else must import through DLPack (read-only for inputs, writable
/// for outputs), be host or CUDA memory, have 1..kMaxDims dimensions and a dtype the library
/// names. Errors name spec.name and say what was expected (the table's rank, shape and the
/// target's dtypes). Shape agreement and contiguity are the validator's job. The imported
/// array is appended to `keep`.
TensorView to_view(nb::handle obj, const TensorSpec& spec, Target target, Imported& keep);

/// A view from a raw description, a tuple (data_ptr, dtype, shape, strides, device_id) built
/// by flash_kda.fwd from a torch tensor: dtype is a flash_kda::DType value
/// (flash_kda._core.dtype_codes) or, for a dtype the library has no code for, its torch name
/// ("bool"); strides are in elements; device_id < 0 means host memory. None -> absent. The
/// same errors as to_view.
TensorView raw_view(nb::handle raw, const TensorSpec& spec, Target target);

/// One tensor of a call other than the forward (decode, backward): the TensorSpec its
/// conversion's errors read (spec.member unused) and its field of the call's Args.
template <class Args>
struct CallTensor {
  TensorSpec spec;
  TensorView Args::*member;
};

/// The TensorSpec of such a tensor: name, role, whether it may be absent, rank, shape and the
/// dtypes each target accepts; no sm90 reason, never host-only.
constexpr TensorSpec call_spec(const char* name, TensorRole role, bool optional, int rank, const char* shape,
                               DTypeSet reference, DTypeSet sm90) {
  return TensorSpec{name, nullptr, role, optional, rank, shape, reference, sm90, "", false};
}

}  // namespace flash_kda::python
