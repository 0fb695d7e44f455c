// flash_kda._core's decode functions: the decode call's tensors, in the order of kDecodeTensors
// below (exported as decode_tensors), from DLPack arrays or raw torch tensor descriptions to a
// DecodeArgs, then the C++ API of include/flash_kda/decode.h. The scalar settings travel as one
// tuple of ints, bools and floats (no strings to parse): a decode step of a small batch takes
// ~5 us on the GPU, so the host side of a call is kept to conversions.
#include "decode_binding.h"

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/tuple.h>

#include "flash_kda/call_table.h"
#include "flash_kda/decode.h"
#include "tensor_view.h"

namespace flash_kda::python {
namespace {

using namespace nb::literals;

using call_table_detail::kF32;
using call_table_detail::kFloat;
using call_table_detail::kFloatOrF64;
using call_table_detail::kIndex;
using DecodeTensor = CallTensor<DecodeArgs>;

// The decode call's tensors (decode.h's table), in the order Python passes them.
// clang-format off
const DecodeTensor kDecodeTensors[] = {
  {call_spec("q",                   TensorRole::Input,  false, 4, "[B, T, H, K]",        kFloat,      kFloat), &DecodeArgs::q},
  {call_spec("k",                   TensorRole::Input,  false, 4, "[B, T, H, K]",        kFloat,      kFloat), &DecodeArgs::k},
  {call_spec("v",                   TensorRole::Input,  false, 4, "[B, T, HV, V]",       kFloat,      kFloat), &DecodeArgs::v},
  {call_spec("g",                   TensorRole::Input,  false, 4, "[B, T, HV, K]",       kFloat,      kFloat), &DecodeArgs::g},
  {call_spec("beta",                TensorRole::Input,  false, 3, "[B, T, HV]",          kFloat,      kFloat), &DecodeArgs::beta},
  {call_spec("out",                 TensorRole::Output, false, 4, "[B, T, HV, V]",       kFloat,      kFloat), &DecodeArgs::out},
  {call_spec("A_log",               TensorRole::Input,  true,  1, "[HV]",                kF32,        kF32),   &DecodeArgs::A_log},
  {call_spec("dt_bias",             TensorRole::Input,  true,  0, "[HV, K] or [HV*K]",   kF32,        kF32),   &DecodeArgs::dt_bias},
  {call_spec("cu_seqlens",          TensorRole::Input,  true,  1, "[N + 1]",             kIndex,      kIndex), &DecodeArgs::cu_seqlens},
  // The pool is read and written: an Output, so that DLPack imports it writable.
  {call_spec("initial_state",       TensorRole::Output, true,  4, "[P, HV, V, K]",       kFloatOrF64, kFloat), &DecodeArgs::initial_state},
  {call_spec("final_state",         TensorRole::Output, true,  4, "[N, HV, V, K]",       kFloatOrF64, kFloat), &DecodeArgs::final_state},
  {call_spec("ssm_state_indices",   TensorRole::Input,  true,  0, "[N] or [N, T]",       kIndex,      kIndex), &DecodeArgs::ssm_state_indices},
  {call_spec("num_accepted_tokens", TensorRole::Input,  true,  1, "[N]",                 kIndex,      kIndex), &DecodeArgs::num_accepted_tokens},
};
// clang-format on
constexpr size_t kDecodeTensorCount = sizeof(kDecodeTensors) / sizeof(kDecodeTensors[0]);

/// The settings flash_kda's Python passes: (gate, state_v_first, use_qk_l2norm,
/// use_beta_sigmoid, allow_neg_eigval, scale or None, lower_bound); gate is a GateMode value
/// (decode_gates).
using Settings = std::tuple<int, bool, bool, bool, bool, std::optional<double>, double>;

void check_count(const nb::tuple& tensors) {
  if (nb::len(tensors) != kDecodeTensorCount)
    throw Error("tensors", "expected " + std::to_string(kDecodeTensorCount) +
                               " entries in the order of decode_tensors, got " + std::to_string(nb::len(tensors)));
}

void apply(DecodeArgs& a, const Settings& s) {
  int gate = 0;
  bool v_first = true;
  std::tie(gate, v_first, a.use_qk_l2norm, a.use_beta_sigmoid, a.allow_neg_eigval, a.scale, a.lower_bound) = s;
  if (gate < static_cast<int>(GateMode::SafeSigmoid) || gate > static_cast<int>(GateMode::PreGated))
    throw Error("gate", "expected a value of flash_kda._core.decode_gates (0, 1 or 2), got " + std::to_string(gate));
  a.gate = static_cast<GateMode>(gate);
  a.state_layout = v_first ? StateLayout::VFirst : StateLayout::KFirst;
}

DecodeArgs from_arrays(const nb::tuple& tensors, const Settings& s, Target target, Imported& keep) {
  check_count(tensors);
  DecodeArgs a;
  for (size_t i = 0; i < kDecodeTensorCount; ++i)
    a.*(kDecodeTensors[i].member) = to_view(tensors[i], kDecodeTensors[i].spec, target, keep);
  apply(a, s);
  return a;
}

DecodeArgs from_raw(const nb::tuple& tensors, const Settings& s) {
  check_count(tensors);
  DecodeArgs a;
  for (size_t i = 0; i < kDecodeTensorCount; ++i)
    a.*(kDecodeTensors[i].member) = raw_view(tensors[i], kDecodeTensors[i].spec, Target::Sm90);
  apply(a, s);
  return a;
}

/// The launch options from the kernel value flash_kda's Python passes (a decode_kernels value;
/// decode() names a bad one).
DecodeLaunchOptions launch_options(int kernel) {
  DecodeLaunchOptions o;
  o.kernel = static_cast<DecodeKernel>(kernel);
  return o;
}

void decode_py(const nb::tuple& tensors, const Settings& s, uintptr_t stream, int kernel) {
  Imported keep;
  decode(from_arrays(tensors, s, Target::Sm90, keep), reinterpret_cast<Stream>(stream), launch_options(kernel));
}

// No GIL release: the call only validates and enqueues one launch (a few microseconds), less
// than releasing and retaking the GIL would save other threads.
void decode_raw_py(const nb::tuple& tensors, const Settings& s, uintptr_t stream, int kernel) {
  decode(from_raw(tensors, s), reinterpret_cast<Stream>(stream), launch_options(kernel));
}

nb::tuple shape_tuple(const ProblemShape& p) {
  return nb::make_tuple(p.batch, p.seqlen, p.num_seqs, p.heads, p.value_heads, p.head_dim_k, p.head_dim_v, p.varlen,
                        p.scale);
}

nb::tuple validate_raw_py(const nb::tuple& tensors, const Settings& s) {
  return shape_tuple(validate_decode(from_raw(tensors, s), Target::Sm90));
}

void reference_decode_py(const nb::tuple& tensors, const Settings& s, int num_threads) {
  Imported keep;
  DecodeArgs a = from_arrays(tensors, s, Target::CpuReference, keep);
  nb::gil_scoped_release release;  // pure C++; large pools take a while
  reference_decode(a, num_threads);
}

}  // namespace

void bind_decode(nb::module_& m) {
  {
    nb::list names;  // every tensors tuple of the functions below follows this order
    for (const DecodeTensor& t : kDecodeTensors) names.append(t.spec.name);
    m.attr("decode_tensors") = nb::tuple(names);
    nb::dict gates;
    gates["safe"] = static_cast<int>(GateMode::SafeSigmoid);
    gates["softplus"] = static_cast<int>(GateMode::Softplus);
    gates["none"] = static_cast<int>(GateMode::PreGated);
    m.attr("decode_gates") = gates;
    nb::dict kernels;  // DecodeLaunchOptions::kernel
    kernels["auto"] = static_cast<int>(DecodeKernel::Auto);
    kernels["persistent"] = static_cast<int>(DecodeKernel::Persistent);
    kernels["direct"] = static_cast<int>(DecodeKernel::Direct);
    kernels["direct_columns"] = static_cast<int>(DecodeKernel::DirectColumns);
    kernels["direct_rows"] = static_cast<int>(DecodeKernel::DirectRows);
    m.attr("decode_kernels") = kernels;
  }
  const char* settings_doc =
      " settings: (gate (a decode_gates value), state_v_first, use_qk_l2norm, use_beta_sigmoid, "
      "allow_neg_eigval, scale or None, lower_bound).";
  m.def("decode", &decode_py, "tensors"_a, "settings"_a, "stream"_a, "kernel"_a = 0,
        (std::string("flash_kda::decode on DLPack arrays (or None), one per name of decode_tensors; see "
                     "flash_kda.fused_recurrent_kda_fwd. kernel: a decode_kernels value (DecodeLaunchOptions).") +
         settings_doc).c_str());
  m.def("decode_raw", &decode_raw_py, "tensors"_a, "settings"_a, "stream"_a, "kernel"_a = 0,
        (std::string("flash_kda::decode on raw torch tensor descriptions (as forward_raw) or None, one per name "
                     "of decode_tensors; the fast path of flash_kda.fused_recurrent_kda_fwd. kernel: a "
                     "decode_kernels value.") + settings_doc).c_str());
  m.def("validate_decode_raw", &validate_raw_py, "tensors"_a, "settings"_a,
        (std::string("flash_kda::validate_decode(.., Target::Sm90) on raw descriptions; returns (batch, seqlen, "
                     "num_seqs, heads, value_heads, K, V, varlen, scale) or raises flash_kda.Error.") + settings_doc).c_str());
  m.def("reference_decode", &reference_decode_py, "tensors"_a, "settings"_a, "num_threads"_a,
        (std::string("flash_kda::reference_decode on host DLPack arrays (or None), one per name of decode_tensors; "
                     "see flash_kda.reference_decode.") + settings_doc).c_str());
}

}  // namespace flash_kda::python
