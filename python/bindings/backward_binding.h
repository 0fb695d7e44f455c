// The backward part of flash_kda._core (backward.cpp), added to the module by module.cpp.
#pragma once

#include <nanobind/nanobind.h>

namespace flash_kda::python {

/// Adds backward_tensors, backward_raw and validate_backward_raw to the module `m`.
void bind_backward(nanobind::module_& m);

}  // namespace flash_kda::python
