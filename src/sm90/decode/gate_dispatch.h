// The gate mode of a decode call as a kernel's template argument: every decode kernel takes its
// gate at compile time (the gate's math differs per mode), and each launch picks the
// instantiation for the call's mode here.
#pragma once

#include <type_traits>

#include "flash_kda/forward.h"

namespace flash_kda::sm90 {

/// f(std::integral_constant<GateMode, G>{}) for the call's gate mode G: the safe gate, the
/// softplus gate, or the pre-computed decay for any other value (validation admits no other).
/// Returns what f returns.
template <class F>
decltype(auto) with_gate(GateMode gate, F&& f) {
  switch (gate) {
    case GateMode::SafeSigmoid: return f(std::integral_constant<GateMode, GateMode::SafeSigmoid>{});
    case GateMode::Softplus: return f(std::integral_constant<GateMode, GateMode::Softplus>{});
    default: return f(std::integral_constant<GateMode, GateMode::PreGated>{});
  }
}

}  // namespace flash_kda::sm90
