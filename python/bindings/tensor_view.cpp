#include "tensor_view.h"

#include <cstdint>
#include <string>

#include "flash_kda/call_table.h"

namespace flash_kda::python {
namespace {

using Code = nb::dlpack::dtype_code;

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

[[noreturn]] void bad_dtype(const TensorSpec& spec, Target target, const std::string& got) {
  throw Error(spec.name, "expected dtype " + dtype_list(accepted_dtypes(spec, target)) + ", got " + got);
}

// Rank checks the TensorView cannot express: 0-d arrays and more than kMaxDims dimensions.
void check_rank_fits(const TensorSpec& spec, const std::vector<int64_t>& shape) {
  if (shape.empty()) throw Error(spec.name, expected_rank(spec) + ", got a 0-d array");
  if (shape.size() > static_cast<size_t>(kMaxDims))
    throw Error(spec.name, expected_rank(spec) + ", got rank " + std::to_string(shape.size()) + " " + dims_text(shape));
}

// The name of a DLPack dtype, numpy-style ("bool", "uint64", "complex64") where the library
// has none of its own.
std::string dlpack_name(const nb::dlpack::dtype& dt) {
  std::string base;
  switch (static_cast<Code>(dt.code)) {
    case Code::Int: base = "int" + std::to_string(dt.bits); break;
    case Code::UInt: base = "uint" + std::to_string(dt.bits); break;
    case Code::Float: base = "float" + std::to_string(dt.bits); break;
    case Code::Bfloat: base = "bfloat" + std::to_string(dt.bits); break;
    case Code::Complex: base = "complex" + std::to_string(dt.bits); break;
    case Code::Bool: base = "bool"; break;
    default: base = "DLPack type code " + std::to_string(dt.code) + " (" + std::to_string(dt.bits) + " bits)"; break;
  }
  if (dt.lanes != 1) base += " x" + std::to_string(dt.lanes) + " lanes";
  return base;
}

DType dtype_from_dlpack(const nb::dlpack::dtype& dt, const TensorSpec& spec, Target target) {
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
  bad_dtype(spec, target, dlpack_name(dt));
}

template <typename Array>
TensorView view_of(const Array& a, const TensorSpec& spec, Target target) {
  std::vector<int64_t> shape(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) shape[i] = static_cast<int64_t>(a.shape(i));
  check_rank_fits(spec, shape);
  TensorView t;
  t.dtype = dtype_from_dlpack(a.dtype(), spec, target);
  t.ndim = static_cast<int>(shape.size());
  for (int i = 0; i < t.ndim; ++i) {
    t.shape[i] = shape[size_t(i)];
    t.strides[i] = static_cast<int64_t>(a.stride(size_t(i)));
  }
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  const int dev = a.device_type();
  if (dev == nb::device::cpu::value || dev == nb::device::cuda_host::value) {
    t.device = DeviceType::CPU;  // pinned host memory too: the reference can read it
  } else if (dev == nb::device::cuda::value) {
    t.device = DeviceType::CUDA;
  } else {
    throw Error(spec.name, "expected a host or CUDA array, got one on DLPack device type " + std::to_string(dev));
  }
  t.device_id = a.device_id();
  return t;
}

std::string type_of(nb::handle obj) { return nb::type_name(obj.type()).c_str(); }

}  // namespace

TensorView to_view(nb::handle obj, const TensorSpec& spec, Target target, Imported& keep) {
  if (obj.is_none()) {
    if (!spec.optional) throw Error(spec.name, std::string("is required (") + spec.shape + "), got None");
    return TensorView{};
  }
  if (spec.role == TensorRole::Output) {
    nb::ndarray<> rw;
    if (nb::try_cast(obj, rw, /*convert=*/false)) {
      keep.outputs.push_back(rw);
      return view_of(rw, spec, target);
    }
  }
  nb::ndarray<nb::ro> ro;
  if (!nb::try_cast(obj, ro, /*convert=*/false))
    throw Error(spec.name, std::string("expected an array ") + spec.shape +
                               " (numpy array, torch tensor or another DLPack array), got " + type_of(obj));
  if (spec.role == TensorRole::Output) throw Error(spec.name, "is read-only; it is an output and is written in place");
  keep.inputs.push_back(ro);
  return view_of(ro, spec, target);
}

TensorView raw_view(nb::handle raw, const TensorSpec& spec, Target target) {
  TensorView t;
  if (raw.is_none()) {
    if (!spec.optional) throw Error(spec.name, std::string("is required (") + spec.shape + "), got None");
    return t;
  }
  const nb::tuple d = nb::borrow<nb::tuple>(raw);
  const nb::tuple shape_t = nb::borrow<nb::tuple>(d[2]), strides = nb::borrow<nb::tuple>(d[3]);
  std::vector<int64_t> shape(nb::len(shape_t));
  for (size_t i = 0; i < shape.size(); ++i) shape[i] = nb::cast<int64_t>(shape_t[i]);
  check_rank_fits(spec, shape);
  if (nb::isinstance<nb::str>(d[1])) bad_dtype(spec, target, nb::cast<std::string>(d[1]));
  const int code = nb::cast<int>(d[1]);
  if (code < static_cast<int>(DType::BF16) || code > static_cast<int>(DType::U8))
    bad_dtype(spec, target, "dtype code " + std::to_string(code));
  t.dtype = static_cast<DType>(code);
  t.ndim = static_cast<int>(shape.size());
  for (int i = 0; i < t.ndim; ++i) {
    t.shape[i] = shape[size_t(i)];
    t.strides[i] = nb::cast<int64_t>(strides[size_t(i)]);
  }
  t.data = reinterpret_cast<void*>(nb::cast<uintptr_t>(d[0]));
  const int device_id = nb::cast<int>(d[4]);
  t.device = device_id < 0 ? DeviceType::CPU : DeviceType::CUDA;
  t.device_id = device_id < 0 ? 0 : device_id;
  return t;
}

}  // namespace flash_kda::python
