// What the forward's and the backward's bindings (module.cpp, backward.cpp) both parse: the gate
// and state-layout strings of the Python API, and a forward call's raw tensor descriptions.
#pragma once

#include <string>

#include <nanobind/nanobind.h>

#include "flash_kda/call_table.h"
#include "flash_kda/error.h"
#include "flash_kda/forward.h"
#include "tensor_view.h"

namespace flash_kda::python {

/// "safe", "softplus", "none" -> GateMode; anything else is an Error naming gate.
inline GateMode parse_gate(const std::string& s) {
  if (s == "safe") return GateMode::SafeSigmoid;
  if (s == "softplus") return GateMode::Softplus;
  if (s == "none") return GateMode::PreGated;
  throw Error("gate", "expected one of 'safe', 'softplus', 'none', got '" + s + "'");
}

/// "v_first", "k_first" -> StateLayout; anything else is an Error naming state_layout.
inline StateLayout parse_layout(const std::string& s) {
  if (s == "v_first") return StateLayout::VFirst;
  if (s == "k_first") return StateLayout::KFirst;
  throw Error("state_layout", "expected 'v_first' or 'k_first', got '" + s + "'");
}

/// ForwardArgs from raw descriptions (raw_view) or None, one per entry of the call table, in
/// its order (Sm90 target); a tuple of another length is an Error naming tensors. With
/// `outputs_optional` (the backward, which takes the forward's inputs only) out may be None too.
inline ForwardArgs forward_args_from_raw(const nanobind::tuple& tensors, bool outputs_optional = false) {
  if (nanobind::len(tensors) != kForwardTensorCount)
    throw Error("tensors", "expected " + std::to_string(kForwardTensorCount) +
                               " entries in the order of forward_tensors, got " + std::to_string(nanobind::len(tensors)));
  ForwardArgs a;
  for (size_t i = 0; i < kForwardTensorCount; ++i) {
    TensorSpec spec = kForwardTensors[i];
    if (outputs_optional && spec.role == TensorRole::Output) spec.optional = true;
    a.*(spec.member) = raw_view(tensors[i], spec, Target::Sm90);
  }
  return a;
}

}  // namespace flash_kda::python
