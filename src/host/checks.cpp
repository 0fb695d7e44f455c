// Generic per-tensor checks: formatting of shapes/devices and the Error messages built from them.
#include "host/checks.h"

#include <algorithm>
#include <limits>

namespace flash_kda::detail {

std::string dims_str(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  return s + "]";
}

std::string shape_str(const TensorView& t) {
  const int n = std::clamp(t.ndim, 0, kMaxDims);
  return dims_str(std::vector<int64_t>(t.shape, t.shape + n));
}

std::string strides_str(const TensorView& t) {
  const int n = std::clamp(t.ndim, 0, kMaxDims);
  return dims_str(std::vector<int64_t>(t.strides, t.strides + n));
}

std::string device_str(const TensorView& t) {
  if (t.device == DeviceType::CPU) return "the host";
  return "cuda:" + std::to_string(t.device_id);
}

void require_present(const TensorView& t, const char* name) {
  if (!t.defined()) throw Error(name, "is required, got an absent tensor (ndim == 0)");
}

void check_sane(const TensorView& t, const char* name) {
  if (t.ndim < 0 || t.ndim > kMaxDims)
    throw Error(name, "rank must be in [0, " + std::to_string(kMaxDims) + "], got " + std::to_string(t.ndim));
  if (dtype_size(t.dtype) == 0)
    throw Error(name, "has an unknown dtype value " + std::to_string(static_cast<int>(t.dtype)));
  // Overflow guard: every later byte-range and offset computation assumes it fits int64.
  int64_t bytes = dtype_size(t.dtype);
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] < 0)
      throw Error(name, "extents must be >= 0, got shape " + shape_str(t));
    if (t.shape[i] != 0 && bytes > std::numeric_limits<int64_t>::max() / t.shape[i])
      throw Error(name, "shape " + shape_str(t) + " is larger than 2^63 bytes");
    bytes *= t.shape[i];
  }
  if (t.numel() > 0 && t.data == nullptr)
    throw Error(name, "data pointer is null for a tensor of shape " + shape_str(t));
}

void check_contiguous(const TensorView& t, const char* name) {
  if (t.is_contiguous()) return;
  std::vector<int64_t> packed(t.ndim);
  int64_t stride = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    packed[i] = stride;
    stride *= t.shape[i];
  }
  throw Error(name, "must be contiguous (row-major): shape " + shape_str(t) + " needs strides " +
                        dims_str(packed) + ", got strides " + strides_str(t));
}

void check_dtype(const TensorView& t, const char* name, std::initializer_list<DType> allowed,
                 const std::string& why) {
  if (std::find(allowed.begin(), allowed.end(), t.dtype) != allowed.end()) return;
  std::string list;
  size_t i = 0;
  for (DType d : allowed) {
    if (i) list += (i + 1 == allowed.size()) ? " or " : ", ";
    list += dtype_name(d);
    ++i;
  }
  std::string msg = "expected dtype " + list;
  if (!why.empty()) msg += " (" + why + ")";
  throw Error(name, msg + ", got " + dtype_name(t.dtype));
}

void check_rank(const TensorView& t, const char* name, int ndim, const std::string& meaning) {
  if (t.ndim == ndim) return;
  throw Error(name, "expected rank " + std::to_string(ndim) + " " + meaning + ", got rank " +
                        std::to_string(t.ndim) + " " + shape_str(t));
}

void check_shape(const TensorView& t, const char* name, const std::vector<int64_t>& dims,
                 const std::string& meaning, const std::string& like) {
  bool same = t.ndim == static_cast<int>(dims.size());
  for (int i = 0; same && i < t.ndim; ++i) same = t.shape[i] == dims[i];
  if (same) return;
  std::string msg = "expected shape " + dims_str(dims) + " " + meaning;
  if (!like.empty()) msg += " " + like;
  throw Error(name, msg + ", got " + shape_str(t));
}

namespace {

// True when a and b live on the same device and their non-empty byte ranges ra, rb meet.
bool same_device_ranges_overlap(const TensorView& a, const TensorView& b, ByteRange ra, ByteRange rb) {
  if (a.device != b.device || (a.device == DeviceType::CUDA && a.device_id != b.device_id)) return false;
  if (ra.begin == ra.end || rb.begin == rb.end) return false;
  return ra.begin < rb.end && rb.begin < ra.end;
}

// [begin, end) bytes a view may touch whatever its strides: from its first element to one past
// its last (empty for an absent view or one with no elements).
ByteRange span_range(const TensorView& t) {
  if (!t.defined() || t.numel() <= 0 || t.data == nullptr) return {};
  int64_t last = 0;
  for (int d = 0; d < t.ndim; ++d) last += (t.shape[d] - 1) * t.strides[d];
  const auto begin = reinterpret_cast<uintptr_t>(t.data);
  return {begin, begin + uintptr_t(last + 1) * uintptr_t(dtype_size(t.dtype))};
}

}  // namespace

ByteRange byte_range(const TensorView& t) {
  const int64_t n = t.numel();
  if (n <= 0 || t.data == nullptr) return {};
  const auto begin = reinterpret_cast<uintptr_t>(t.data);
  return {begin, begin + static_cast<uintptr_t>(n) * static_cast<uintptr_t>(dtype_size(t.dtype))};
}

bool overlaps(const TensorView& a, const TensorView& b) {
  return same_device_ranges_overlap(a, b, byte_range(a), byte_range(b));
}

void check_view_strides(const TensorView& t, const char* name) {
  if (t.numel() == 0) return;
  for (int d = 0; d < t.ndim; ++d)
    if (t.shape[d] > 1 && t.strides[d] < 0) throw Error(name, "strides must be >= 0, got strides " + strides_str(t));
  const int last = t.ndim - 1;
  if (t.shape[last] != 1 && t.strides[last] != 1)
    throw Error(name, "last dimension must have unit stride (strides [.., 1]), got strides " + strides_str(t));
}

void check_rows16(const TensorView& t, const char* name, const char* for_what) {
  if (t.numel() == 0) return;
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0)
    throw Error(name, std::string("data pointer must be 16-byte aligned for ") + for_what);
  static const char* const kDimNames[] = {"batch", "token", "head"};
  const int64_t es = dtype_size(t.dtype);
  for (int d = 0; d + 1 < t.ndim && d < 3; ++d)
    if (t.shape[d] > 1 && (t.strides[d] * es) % 16 != 0)
      throw Error(name, std::string(kDimNames[d]) + " stride " + std::to_string(t.strides[d]) + " (" +
                            std::to_string(t.strides[d] * es) + " bytes of " + dtype_name(t.dtype) +
                            ") must be a multiple of 16 bytes (16-byte aligned rows for " + for_what +
                            "), got strides " + strides_str(t));
}

bool spans_overlap(const TensorView& a, const TensorView& b) {
  return same_device_ranges_overlap(a, b, span_range(a), span_range(b));
}

}  // namespace flash_kda::detail
