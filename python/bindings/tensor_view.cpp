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

}  // namespace flash_kda::python
