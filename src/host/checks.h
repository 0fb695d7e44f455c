// Generic per-tensor checks used by validate(): each throws flash_kda::Error naming the
// argument and what was expected. Nothing here knows about KDA; validate.cpp does.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "flash_kda/error.h"
#include "flash_kda/tensor.h"

namespace flash_kda::detail {

/// "[2, 64, 4, 128]" for a shape given as a list of extents.
std::string dims_str(const std::vector<int64_t>& dims);
/// The shape of `t` formatted like dims_str ("[]" when absent).
std::string shape_str(const TensorView& t);
/// The strides of `t` formatted like dims_str.
std::string strides_str(const TensorView& t);
/// "the host" or "cuda:<id>".
std::string device_str(const TensorView& t);

/// Throws unless `t` is given.
void require_present(const TensorView& t, const char* name);

/// Throws unless 0 <= ndim <= kMaxDims, every extent is >= 0, the byte size fits in int64,
/// and data is non-null whenever the tensor has elements. Must run before anything reads
/// numel() or the data range, which would otherwise be meaningless.
void check_sane(const TensorView& t, const char* name);

/// Throws unless `t` has strides of a packed row-major tensor of its shape.
void check_contiguous(const TensorView& t, const char* name);

/// Throws unless t.dtype is one of `allowed`; `why` (may be empty) explains the restriction.
void check_dtype(const TensorView& t, const char* name, std::initializer_list<DType> allowed,
                 const std::string& why = "");

/// Throws unless `t` has exactly `dims` as shape; `meaning` names the dims ("[B, T, H, K]")
/// and `like` (may be empty) says where the expected extents come from ("like q").
void check_shape(const TensorView& t, const char* name, const std::vector<int64_t>& dims,
                 const std::string& meaning, const std::string& like = "");

/// Throws unless t.ndim == ndim; `meaning` names the dims ("[B, T, H, K]").
void check_rank(const TensorView& t, const char* name, int ndim, const std::string& meaning);

/// [begin, end) byte range of a contiguous tensor's storage (empty for a tensor with no
/// elements, which then overlaps nothing).
struct ByteRange {
  uintptr_t begin = 0, end = 0;
};
ByteRange byte_range(const TensorView& t);
/// True when both ranges are non-empty, live on the same device and share at least one byte.
bool overlaps(const TensorView& a, const TensorView& b);

/// A view read row by row: strides >= 0 in every dimension of extent > 1 and a unit stride in
/// the last one (Error naming `name` otherwise). Nothing to check for a view with no elements.
void check_view_strides(const TensorView& t, const char* name);

/// 16-byte aligned rows of a [batch, token, head, dim] view for the Sm90 kernels: the data pointer
/// and every stride of a dimension of extent > 1 but the last, in bytes, multiples of 16 (Error
/// naming `name`, ending "... for <for_what>", otherwise). Nothing to check without elements.
void check_rows16(const TensorView& t, const char* name, const char* for_what);

/// True when both views' spans (from the first element to one past the last, whatever the
/// strides) are non-empty, live on the same device and share a byte. A
/// strided view's span includes the gaps between its rows, so interleaved views of one buffer
/// count as overlapping: conservative, never a race.
bool spans_overlap(const TensorView& a, const TensorView& b);

}  // namespace flash_kda::detail
