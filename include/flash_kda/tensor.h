// Non-owning tensor descriptors passed through the flash_kda C++ API.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace flash_kda {

/// Element type of a tensor.
enum class DType : int {
  BF16,  ///< bfloat16 (2 bytes)
  F16,   ///< IEEE half (2 bytes); accepted nowhere today, listed so callers get a clear error
  F32,   ///< IEEE single (4 bytes)
  F64,   ///< IEEE double (8 bytes); accepted by the CPU reference for outputs and states
  I32,   ///< int32 (cu_seqlens)
  I64,   ///< int64 (cu_seqlens)
  U8,    ///< bytes (workspace)
};

/// Where a tensor's memory lives.
enum class DeviceType : int { CPU, CUDA };

/// Size in bytes of one element of `t`.
int dtype_size(DType t);
/// Human-readable name ("bf16", "fp32", ...), used in error messages.
const char* dtype_name(DType t);

/// The most dimensions any KDA tensor has (states: [N, HV, V, K]).
inline constexpr int kMaxDims = 4;

/// A view of a strided tensor. Does not own memory.
///
/// `ndim == 0` means "absent" (optional tensors such as A_log or initial_state). Shapes and
/// strides are in elements, outermost first. Which tensors may be strided is a rule of each call
/// (forward.h, decode.h: the per-token activations may have any batch, token and head strides
/// with a unit-stride last dimension; the rest must be contiguous); validation rejects anything
/// else with a clear error instead of reading the wrong elements.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::F32;
  int ndim = 0;
  int64_t shape[kMaxDims] = {0, 0, 0, 0};
  int64_t strides[kMaxDims] = {0, 0, 0, 0};
  DeviceType device = DeviceType::CPU;
  int device_id = 0;

  /// True when the tensor was given (ndim > 0).
  bool defined() const { return ndim > 0; }
  /// Product of the shape (1 for rank 0 would be meaningless: absent tensors return 0).
  int64_t numel() const {
    if (ndim == 0) return 0;
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  /// True when strides are those of a packed row-major tensor (size-1 dims may have any
  /// stride; a tensor with no elements is contiguous whatever its strides, as numpy and
  /// PyTorch report different strides for empty tensors).
  bool is_contiguous() const {
    if (ndim > 0 && numel() == 0) return true;
    int64_t expect = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      if (shape[i] != 1 && strides[i] != expect) return false;
      expect *= shape[i];
    }
    return true;
  }
};

/// Builds a contiguous TensorView from a pointer and a shape (strides derived).
TensorView make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape,
                       DeviceType device = DeviceType::CPU, int device_id = 0);

}  // namespace flash_kda
