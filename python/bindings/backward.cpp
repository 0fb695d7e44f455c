// flash_kda._core's backward functions (include/flash_kda/backward.h): the forward call's
// tensors as forward_raw takes them (raw descriptions in call-table order, its outputs None) and
// the gradient tensors in the order of kBackwardTensors below (exported as backward_tensors),
// to a BackwardArgs, then validate_backward / backward. Policy that needs torch (autograd, the
// allocator, the current stream) lives in python/flash_kda/.
#include "backward_binding.h"

#include <cstdint>
#include <optional>
#include <string>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include "flash_kda/backward.h"
#include "flash_kda/call_table.h"
#include "parse.h"
#include "tensor_view.h"

namespace flash_kda::python {
namespace {

using namespace nb::literals;

using call_table_detail::kF32;
using call_table_detail::kFloat;
using call_table_detail::kFloatOrF64;
constexpr DTypeSet kF32OrF64 = kF32 | dtype_bit(DType::F64);
/// The gradient tensors' table entries (the dtype rule "like its input" is validate_backward's).
using BackwardTensor = CallTensor<BackwardArgs>;

// backward.h's table, in the order Python passes the gradient tensors.
// clang-format off
const BackwardTensor kBackwardTensors[] = {
  {call_spec("d_out",           TensorRole::Input,  false, 4, "[B, T, HV, V]",      kFloatOrF64, kFloat), &BackwardArgs::d_out},
  {call_spec("d_final_state",   TensorRole::Input,  true,  4, "[N, HV, V, K]",      kFloatOrF64, kFloat), &BackwardArgs::d_final_state},
  {call_spec("dq",              TensorRole::Output, false, 4, "[B, T, H, K]",       kFloatOrF64, kFloat), &BackwardArgs::dq},
  {call_spec("dk",              TensorRole::Output, false, 4, "[B, T, H, K]",       kFloatOrF64, kFloat), &BackwardArgs::dk},
  {call_spec("dv",              TensorRole::Output, false, 4, "[B, T, HV, V]",      kFloatOrF64, kFloat), &BackwardArgs::dv},
  {call_spec("dg",              TensorRole::Output, false, 4, "[B, T, HV, K]",      kFloatOrF64, kFloat), &BackwardArgs::dg},
  {call_spec("dbeta",           TensorRole::Output, false, 3, "[B, T, HV]",         kFloatOrF64, kFloat), &BackwardArgs::dbeta},
  {call_spec("dA_log",          TensorRole::Output, true,  1, "[HV]",               kF32OrF64,   kF32),   &BackwardArgs::dA_log},
  {call_spec("ddt_bias",        TensorRole::Output, true,  0, "[HV, K] or [HV*K]",  kF32OrF64,   kF32),   &BackwardArgs::ddt_bias},
  {call_spec("d_initial_state", TensorRole::Output, true,  4, "[N, HV, V, K]",      kFloatOrF64, kFloat), &BackwardArgs::d_initial_state},
};
// clang-format on
constexpr size_t kBackwardTensorCount = sizeof(kBackwardTensors) / sizeof(kBackwardTensors[0]);

/// BackwardArgs from the forward call's raw descriptions (forward_raw's tuple, outputs None),
/// the gradients' raw descriptions (backward_tensors' order) and the forward's settings.
BackwardArgs args_from_raw(const nb::tuple& forward_tensors, const nb::tuple& grad_tensors, std::optional<double> scale,
                           double lower_bound, const std::string& gate, const std::string& state_layout,
                           bool use_qk_l2norm, bool use_beta_sigmoid, bool allow_neg_eigval) {
  BackwardArgs a;
  a.forward = forward_args_from_raw(forward_tensors, /*outputs_optional=*/true);
  if (nb::len(grad_tensors) != kBackwardTensorCount)
    throw Error("grad_tensors", "expected " + std::to_string(kBackwardTensorCount) +
                                    " entries in the order of backward_tensors, got " + std::to_string(nb::len(grad_tensors)));
  for (size_t i = 0; i < kBackwardTensorCount; ++i)
    a.*(kBackwardTensors[i].member) = raw_view(grad_tensors[i], kBackwardTensors[i].spec, Target::Sm90);
  ForwardArgs& f = a.forward;
  f.scale = scale;
  f.lower_bound = lower_bound;
  f.gate = parse_gate(gate);
  f.state_layout = parse_layout(state_layout);
  f.use_qk_l2norm = use_qk_l2norm;
  f.use_beta_sigmoid = use_beta_sigmoid;
  f.allow_neg_eigval = allow_neg_eigval;
  return a;
}

/// flash_kda::backward with the workspace from `alloc(nbytes)` (a Python callable returning a
/// uint8 CUDA torch tensor from the caller's stream-ordered allocator), held until the launches
/// are enqueued, on `stream` (a cudaStream_t as an integer).
void backward_raw_py(const nb::tuple& forward_tensors, const nb::tuple& grad_tensors, std::optional<double> scale,
                     double lower_bound, const nb::callable& alloc, uintptr_t stream, const std::string& gate,
                     const std::string& state_layout, bool use_qk_l2norm, bool use_beta_sigmoid, bool allow_neg_eigval) {
  const BackwardArgs a = args_from_raw(forward_tensors, grad_tensors, scale, lower_bound, gate, state_layout,
                                       use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval);
  nb::object workspace;
  const WorkspaceAllocator allocate = [&](size_t bytes) -> void* {
    workspace = alloc(bytes);
    return reinterpret_cast<void*>(nb::cast<uintptr_t>(workspace.attr("data_ptr")()));
  };
  backward(a, allocate, reinterpret_cast<Stream>(stream));
}

nb::tuple validate_backward_raw_py(const nb::tuple& forward_tensors, const nb::tuple& grad_tensors,
                                   std::optional<double> scale, double lower_bound, const std::string& gate,
                                   const std::string& state_layout, bool use_qk_l2norm, bool use_beta_sigmoid,
                                   bool allow_neg_eigval) {
  const ProblemShape p = validate_backward(args_from_raw(forward_tensors, grad_tensors, scale, lower_bound, gate,
                                                         state_layout, use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval));
  return nb::make_tuple(p.batch, p.seqlen, p.num_seqs, p.heads, p.value_heads, p.head_dim_k, p.head_dim_v, p.varlen,
                        p.scale);
}

}  // namespace

void bind_backward(nb::module_& m) {
  nb::list names;  // the order of backward_raw's grad_tensors
  for (const BackwardTensor& t : kBackwardTensors) names.append(t.spec.name);
  m.attr("backward_tensors") = nb::tuple(names);
  m.def("backward_raw", &backward_raw_py, "forward_tensors"_a, "grad_tensors"_a, "scale"_a.none(), "lower_bound"_a,
        "alloc"_a, "stream"_a, "gate"_a = "safe", "state_layout"_a = "v_first", "use_qk_l2norm"_a = true,
        "use_beta_sigmoid"_a = true, "allow_neg_eigval"_a = false,
        "flash_kda::backward on raw torch tensor descriptions (as forward_raw) or None: forward_tensors one per "
        "name of forward_tensors (the forward call's inputs; out, final_state, ssm_state_indices and the "
        "intermediate states None), grad_tensors one per name of backward_tensors. alloc(nbytes) returns the "
        "workspace (a uint8 CUDA tensor); stream is a cudaStream_t as an int. Settings as forward_raw's.");
  m.def("validate_backward_raw", &validate_backward_raw_py, "forward_tensors"_a, "grad_tensors"_a, "scale"_a.none(),
        "lower_bound"_a, "gate"_a = "safe", "state_layout"_a = "v_first", "use_qk_l2norm"_a = true,
        "use_beta_sigmoid"_a = true, "allow_neg_eigval"_a = false,
        "flash_kda::validate_backward on raw descriptions (as backward_raw): everything backward_raw checks before "
        "it launches, nothing launched or allocated. Returns (batch, seqlen, num_seqs, heads, value_heads, K, V, "
        "varlen, scale) or raises flash_kda.Error.");
}

}  // namespace flash_kda::python
