// The tensors of one forward call, declared once: name, field of ForwardArgs, role, whether it
// may be absent, rank and shape in the notation of forward.h, and the dtypes each target
// accepts. validate() checks against it, the Python binding builds ForwardArgs from it and
// exports its names (flash_kda._core.forward_tensors), and flash_kda.fwd / flash_kda.reference
// pass their tensors in its order. Rules that relate tensors to each other (extents agreeing,
// the state pool's slot count, A_log being required by the Sm90 softplus gate) and the stride
// rules stay in validate().
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "flash_kda/forward.h"
#include "flash_kda/tensor.h"

namespace flash_kda {

/// Whether a call reads or writes a tensor.
enum class TensorRole : int {
  Input,   ///< read only, never modified
  Output,  ///< written in full
};

/// A set of dtypes (bit i set: DType value i accepted).
using DTypeSet = uint32_t;

/// The set holding `d` alone; combine with `|`.
constexpr DTypeSet dtype_bit(DType d) { return DTypeSet{1} << static_cast<int>(d); }

/// True when `d` is in `set`.
constexpr bool dtype_in(DTypeSet set, DType d) { return (set & dtype_bit(d)) != 0; }

/// "bf16 or fp32", "bf16, fp32 or fp64": the members of `set` in DType order, for messages.
std::string dtype_list(DTypeSet set);

/// One tensor of the call.
struct TensorSpec {
  const char* name;                 ///< the argument's name in C++ and Python ("cu_seqlens")
  TensorView ForwardArgs::*member;  ///< its field in ForwardArgs
  TensorRole role;
  bool optional;                    ///< may be absent (ndim == 0; None in Python)
  int rank;                         ///< the rank it must have; 0 when `shape` allows several
  const char* shape;                ///< "[B, T, H, K]" (forward.h's letters)
  DTypeSet reference;               ///< dtypes reference_forward accepts
  DTypeSet sm90;                    ///< dtypes forward() accepts
  const char* sm90_why;             ///< why forward() accepts fewer ("" when it accepts the same)
  bool host_only;                   ///< always a host tensor, whatever the target
};

namespace call_table_detail {
constexpr DTypeSet kFloat = dtype_bit(DType::BF16) | dtype_bit(DType::F32);
constexpr DTypeSet kFloatOrF64 = kFloat | dtype_bit(DType::F64);
constexpr DTypeSet kBF16 = dtype_bit(DType::BF16);
constexpr DTypeSet kF32 = dtype_bit(DType::F32);
constexpr DTypeSet kIndex = dtype_bit(DType::I32) | dtype_bit(DType::I64);
constexpr const char* kReadsBF16 = "the Sm90 kernels read bf16 q, k, v; the reference also takes fp32";
}  // namespace call_table_detail

/// Every tensor of a forward call, in the order validation reports them and the binding
/// takes them. New tensors go at the end: flash_kda.fwd and flash_kda.reference build their
/// tuples in this order (python/flash_kda/_forward.py FORWARD_TENSORS).
inline constexpr TensorSpec kForwardTensors[] = {
    // clang-format off
  //  name             member                        role                optional rank shape             reference                           sm90                                why                                                      host_only
  {"q",              &ForwardArgs::q,              TensorRole::Input,  false, 4, "[B, T, H, K]",      call_table_detail::kFloat,      call_table_detail::kBF16,   call_table_detail::kReadsBF16,                        false},
  {"k",              &ForwardArgs::k,              TensorRole::Input,  false, 4, "[B, T, H, K]",      call_table_detail::kFloat,      call_table_detail::kBF16,   call_table_detail::kReadsBF16,                        false},
  {"v",              &ForwardArgs::v,              TensorRole::Input,  false, 4, "[B, T, HV, V]",     call_table_detail::kFloat,      call_table_detail::kBF16,   call_table_detail::kReadsBF16,                        false},
  {"g",              &ForwardArgs::g,              TensorRole::Input,  false, 4, "[B, T, HV, K]",     call_table_detail::kFloat,      call_table_detail::kFloat,  "",                                                   false},
  {"beta",           &ForwardArgs::beta,           TensorRole::Input,  false, 3, "[B, T, HV]",        call_table_detail::kFloat,      call_table_detail::kFloat,  "",                                                   false},
  {"out",            &ForwardArgs::out,            TensorRole::Output, false, 4, "[B, T, HV, V]",     call_table_detail::kFloatOrF64, call_table_detail::kBF16,   "the Sm90 kernels write bf16 out",                    false},
  {"A_log",          &ForwardArgs::A_log,          TensorRole::Input,  true,  1, "[HV]",              call_table_detail::kF32,        call_table_detail::kF32,    "",                                                   false},
  {"dt_bias",        &ForwardArgs::dt_bias,        TensorRole::Input,  true,  0, "[HV, K] or [HV*K]", call_table_detail::kF32,        call_table_detail::kF32,    "",                                                   false},
  {"cu_seqlens",     &ForwardArgs::cu_seqlens,     TensorRole::Input,  true,  1, "[N + 1]",           call_table_detail::kIndex,      call_table_detail::kIndex,  "",                                                   false},
  {"initial_state",  &ForwardArgs::initial_state,  TensorRole::Input,  true,  4, "[N or P, HV, V, K]",     call_table_detail::kFloatOrF64, call_table_detail::kFloat,  "the Sm90 kernels keep bf16 or fp32 states",          false},
  {"final_state",    &ForwardArgs::final_state,    TensorRole::Output, true,  4, "[N or P, HV, V, K]",     call_table_detail::kFloatOrF64, call_table_detail::kFloat,  "the Sm90 kernels keep bf16 or fp32 states",          false},
  {"cu_seqlens_cpu", &ForwardArgs::cu_seqlens_cpu, TensorRole::Input,  true,  1, "[N + 1]",           call_table_detail::kIndex,      call_table_detail::kIndex,  "",                                                   true},
  {"ssm_state_indices", &ForwardArgs::ssm_state_indices, TensorRole::Input, true, 1, "[N]",              call_table_detail::kIndex,      call_table_detail::kIndex,  "",                                                   false},
  {"intermediate_states",  &ForwardArgs::intermediate_states,  TensorRole::Output, true, 4, "[S, HV, V, K]", call_table_detail::kFloatOrF64, call_table_detail::kFloat, "the Sm90 kernels keep bf16 or fp32 states", false},
  {"intermediate_offsets", &ForwardArgs::intermediate_offsets, TensorRole::Input,  true, 1, "[N + 1]",       call_table_detail::kIndex,      call_table_detail::kIndex, "",                                          false},
    // clang-format on
};

/// Number of entries of kForwardTensors.
inline constexpr size_t kForwardTensorCount = sizeof(kForwardTensors) / sizeof(kForwardTensors[0]);

/// The dtypes `spec` accepts on `target`.
constexpr DTypeSet accepted_dtypes(const TensorSpec& spec, Target target) {
  return target == Target::Sm90 ? spec.sm90 : spec.reference;
}

/// The entry named `name`; throws std::out_of_range for a name not in the table. constexpr, so
/// that a lookup by a literal name costs nothing at run time.
constexpr const TensorSpec& tensor_spec(std::string_view name) {
  for (const TensorSpec& s : kForwardTensors)
    if (name == s.name) return s;
  throw std::out_of_range("flash_kda: a tensor name not in the call table");
}

/// "expected rank 4 [B, T, H, K]" or, for a tensor of several allowed ranks,
/// "expected shape [HV, K] or [HV*K]": the start of every rank error, so that a rank the
/// binding cannot even describe (5 or more) reads like one the validator rejects.
std::string expected_rank(const TensorSpec& spec);

}  // namespace flash_kda
