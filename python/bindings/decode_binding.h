// The decode part of flash_kda._core (decode.cpp), added to the module by module.cpp.
#pragma once

#include <nanobind/nanobind.h>

namespace flash_kda::python {

/// Adds decode_tensors, decode_gates, decode, decode_raw, validate_decode_raw and
/// reference_decode to the module `m`.
void bind_decode(nanobind::module_& m);

}  // namespace flash_kda::python
