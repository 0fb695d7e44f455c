// TensorView helpers: element sizes, names for messages, and packed views.
#include "flash_kda/tensor.h"

#include <string>

#include "flash_kda/error.h"

namespace flash_kda {

int dtype_size(DType t) {
  switch (t) {
    case DType::BF16: case DType::F16: return 2;
    case DType::F32: case DType::I32: return 4;
    case DType::F64: case DType::I64: return 8;
    case DType::U8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::BF16: return "bf16";
    case DType::F16: return "fp16";
    case DType::F32: return "fp32";
    case DType::F64: return "fp64";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    case DType::U8: return "uint8";
  }
  return "?";
}

TensorView make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape, DeviceType device,
                       int device_id) {
  if (shape.size() == 0 || shape.size() > static_cast<size_t>(kMaxDims))
    throw Error("shape", "rank must be in [1, " + std::to_string(kMaxDims) + "], got " + std::to_string(shape.size()));
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.device_id = device_id;
  t.ndim = static_cast<int>(shape.size());
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.strides[d] = stride;
    stride *= t.shape[d];
  }
  return t;
}

}  // namespace flash_kda
