#include "tensor_view.h"

#include <string>

namespace flash_kda::python {

DType dtype_from_dlpack(const nb::dlpack::dtype& dt, const char* name) {
  using Code = nb::dlpack::dtype_code;
  if (dt.lanes == 1) {
    switch (static_cast<Code>(dt.code)) {
      case Code::Float:
        if (dt.bits == 16) return DType::F16;
        if (dt.bits == 32) return DType::F32;
        if (dt.bits == 64) return DType::F64;
        break;
      case Code::Bfloat:
        if (dt.bits == 16) return DType::BF16;
        break;
      case Code::Int:
        if (dt.bits == 32) return DType::I32;
        if (dt.bits == 64) return DType::I64;
        break;
      case Code::UInt:
        if (dt.bits == 8) return DType::U8;
        break;
      default:
        break;
    }
  }
  throw Error(name, "bf16, fp32, fp64, int32, int64 or uint8 elements, got DLPack dtype (code " +
                        std::to_string(dt.code) + ", " + std::to_string(dt.bits) + " bits, " +
                        std::to_string(dt.lanes) + " lanes)");
}

TensorView raw_view(const nb::handle& raw, const char* name) {
  TensorView t;
  if (raw.is_none()) return t;
  const nb::tuple d = nb::borrow<nb::tuple>(raw);
  const nb::tuple shape = nb::borrow<nb::tuple>(d[2]), strides = nb::borrow<nb::tuple>(d[3]);
  const size_t ndim = nb::len(shape);
  if (ndim == 0) throw Error(name, "an array with at least one dimension, got a 0-d array");
  if (ndim > static_cast<size_t>(kMaxDims))
    throw Error(name, "at most " + std::to_string(kMaxDims) + " dimensions, got " + std::to_string(ndim));
  const int code = nb::cast<int>(d[1]);
  if (code < static_cast<int>(DType::BF16) || code > static_cast<int>(DType::U8))
    throw Error(name, "a known dtype code, got " + std::to_string(code));
  t.dtype = static_cast<DType>(code);
  t.ndim = static_cast<int>(ndim);
  for (size_t i = 0; i < ndim; ++i) {
    t.shape[i] = nb::cast<int64_t>(shape[i]);
    t.strides[i] = nb::cast<int64_t>(strides[i]);
  }
  t.data = reinterpret_cast<void*>(nb::cast<uintptr_t>(d[0]));
  t.device = DeviceType::CUDA;
  t.device_id = nb::cast<int>(d[4]);
  return t;
}

}  // namespace flash_kda::python
