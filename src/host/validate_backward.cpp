// Validation of a whole backward call (include/flash_kda/backward.h): the forward call it
// differentiates (its inputs as validate() checks them, its outputs absent), then each
// gradient tensor against the input it belongs to, then that no output shares memory with
// anything else. Checks run in that order, so the first error is the most basic one.
#include <string>
#include <vector>

#include "flash_kda/backward.h"
#include "flash_kda/call_table.h"
#include "host/arg_checks.h"
#include "host/backward_checks.h"
#include "host/checks.h"
#include "host/problem.h"
#include "sm90/backward/layout.h"

namespace flash_kda::detail {
namespace {

using call_table_detail::kFloat;
using call_table_detail::kFloatOrF64;
constexpr DTypeSet kF64 = dtype_bit(DType::F64);

// The forward's outputs and the serving features the backward leaves out, each with why.
void check_forward_outputs_absent(const ForwardArgs& f) {
  const char* recomputed = "must be absent in a backward call (the backward recomputes what it needs from the inputs)";
  if (f.out.defined()) throw Error("out", recomputed);
  if (f.final_state.defined()) throw Error("final_state", recomputed);
  if (f.ssm_state_indices.defined())
    throw Error("ssm_state_indices", "the state pool is a serving feature without a gradient; the backward takes "
                                     "initial_state [N, HV, ...] per sequence, pass no ssm_state_indices");
  if (f.intermediate_states.defined())
    throw Error("intermediate_states", "intermediate states are not supported by the backward; pass none");
  if (f.intermediate_offsets.defined())
    throw Error("intermediate_offsets", "intermediate states are not supported by the backward; pass none");
}

// Device and basic sanity of a given gradient tensor: on q's device (CUDA for Sm90, the host
// for the reference) and element aligned.
void check_place(const TensorView& t, const char* name, const TensorView& q, Target target) {
  check_sane(t, name);
  if (target == Target::Sm90) {
    if (t.device != DeviceType::CUDA)
      throw Error(name, "is on the host, a CUDA tensor is needed (backward() runs on the GPU)");
    if (t.device_id != q.device_id)
      throw Error(name, "q is on " + device_str(q) + " but " + name + " on " + device_str(t) +
                            "; all tensors must be on one device");
  } else if (t.device != DeviceType::CPU) {
    throw Error(name, "is on " + device_str(t) + ", the CPU reference (reference_backward) needs host tensors");
  }
  if (t.numel() > 0 && reinterpret_cast<uintptr_t>(t.data) % uintptr_t(dtype_size(t.dtype)) != 0)
    throw Error(name, "data pointer must be aligned to its element size");
}

void check_dtype_in(const TensorView& t, const char* name, DTypeSet allowed, const std::string& rule) {
  if (!dtype_in(allowed, t.dtype))
    throw Error(name, "expected dtype " + dtype_list(allowed) + (rule.empty() ? "" : " (" + rule + ")") + ", got " +
                          dtype_name(t.dtype));
}

// A gradient that mirrors an input: contiguous, the input's shape, the input's dtype (or fp64
// on the reference).
void check_like(const TensorView& t, const char* name, const TensorView& input, const char* input_name,
                const TensorView& q, Target target) {
  check_place(t, name, q, target);
  check_contiguous(t, name);
  check_shape(t, name, std::vector<int64_t>(input.shape, input.shape + input.ndim), shape_str(input),
              std::string("like ") + input_name);
  DTypeSet allowed = dtype_bit(input.dtype);
  if (target == Target::CpuReference) allowed |= kF64;
  check_dtype_in(t, name, allowed, std::string("like ") + input_name);
}

// The Sm90 kernels read d_out and store the [.., K or V] gradients several elements at a time:
// on Sm90 their data and rows are 16-byte aligned (detail::check_rows16, the rule of the
// forward's activations).
constexpr const char* kRowsFor = "the Sm90 backward";

// d_out: [B, T, HV, V] like out, any batch, token and head strides >= 0 with a unit last
// stride (it is read only, so a zero stride, as an expanded gradient has, is fine), and on
// Sm90 16-byte aligned rows.
void check_d_out(const BackwardArgs& a, const ProblemShape& p, Target target) {
  const TensorView& t = a.d_out;
  require_present(t, "d_out");
  check_place(t, "d_out", a.forward.q, target);
  check_shape(t, "d_out", {p.batch, p.seqlen, p.value_heads, p.head_dim_v}, "[B, T, HV, V]", "like out");
  check_dtype_in(t, "d_out", target == Target::Sm90 ? kFloat : kFloatOrF64, "");
  check_view_strides(t, "d_out");
  if (target == Target::Sm90) check_rows16(t, "d_out", kRowsFor);
}


std::vector<int64_t> state_dims(const ForwardArgs& f, const ProblemShape& p) {
  return f.state_layout == StateLayout::VFirst
             ? std::vector<int64_t>{p.num_seqs, p.value_heads, p.head_dim_v, p.head_dim_k}
             : std::vector<int64_t>{p.num_seqs, p.value_heads, p.head_dim_k, p.head_dim_v};
}

// Outputs are written while the inputs are read and while other outputs are written: none may
// share a byte with an input or with another output.
void check_aliasing(const BackwardArgs& a) {
  std::vector<NamedView> inputs;
  for (const TensorSpec& spec : kForwardTensors)
    if (spec.role == TensorRole::Input) inputs.push_back({&(a.forward.*(spec.member)), spec.name});
  inputs.push_back({&a.d_out, "d_out"});
  inputs.push_back({&a.d_final_state, "d_final_state"});
  const NamedView outputs[] = {{&a.dq, "dq"},         {&a.dk, "dk"},         {&a.dv, "dv"},
                               {&a.dg, "dg"},         {&a.dbeta, "dbeta"},   {&a.dA_log, "dA_log"},
                               {&a.ddt_bias, "ddt_bias"}, {&a.d_initial_state, "d_initial_state"}};
  for (size_t i = 0; i < sizeof(outputs) / sizeof(outputs[0]); ++i) {
    const NamedView& o = outputs[i];
    if (!o.t->defined()) continue;
    for (const NamedView& in : inputs)
      if (in.t->defined() && spans_overlap(*o.t, *in.t))
        throw Error(o.name, std::string("overlaps input ") + in.name + "; the gradients must be separate buffers");
    for (size_t j = 0; j < i; ++j)
      if (outputs[j].t->defined() && spans_overlap(*o.t, *outputs[j].t))
        throw Error(o.name, std::string("overlaps ") + outputs[j].name + "; the gradients must be separate buffers");
  }
}

}  // namespace

ProblemShape check_backward(const BackwardArgs& a, Target target) {
  const ForwardArgs& f = a.forward;
  check_forward_outputs_absent(f);
  const ProblemShape p = validate_inputs(f, target);

  if (target == Target::Sm90 && p.value_heads * sm90::bwd::kChainSlices > 65535)
    throw Error("v", "the Sm90 backward takes at most " + std::to_string(65535 / sm90::bwd::kChainSlices) +
                         " value heads (HV), got " + std::to_string(p.value_heads));
  check_d_out(a, p, target);
  if (a.d_final_state.defined()) {
    check_place(a.d_final_state, "d_final_state", f.q, target);
    check_contiguous(a.d_final_state, "d_final_state");
    check_shape(a.d_final_state, "d_final_state", state_dims(f, p),
                f.state_layout == StateLayout::VFirst ? "[N, HV, V, K] (v-first state layout)"
                                                      : "[N, HV, K, V] (k-first state layout)",
                "like final_state in the call's state_layout");
    check_dtype_in(a.d_final_state, "d_final_state", target == Target::Sm90 ? kFloat : kFloatOrF64, "");
  }
  const struct {
    const TensorView* grad;
    const char* name;
    const TensorView* input;
    const char* input_name;
  } mirrored[] = {{&a.dq, "dq", &f.q, "q"}, {&a.dk, "dk", &f.k, "k"}, {&a.dv, "dv", &f.v, "v"},
                  {&a.dg, "dg", &f.g, "g"}, {&a.dbeta, "dbeta", &f.beta, "beta"}};
  for (const auto& m : mirrored) {
    require_present(*m.grad, m.name);
    check_like(*m.grad, m.name, *m.input, m.input_name, f.q, target);
    if (target == Target::Sm90 && m.grad != &a.dbeta) check_rows16(*m.grad, m.name, kRowsFor);
  }
  const struct {
    const TensorView* grad;
    const char* name;
    const TensorView* input;
    const char* input_name;
  } optional[] = {{&a.dA_log, "dA_log", &f.A_log, "A_log"},
                  {&a.ddt_bias, "ddt_bias", &f.dt_bias, "dt_bias"},
                  {&a.d_initial_state, "d_initial_state", &f.initial_state, "initial_state"}};
  for (const auto& o : optional) {
    if (!o.grad->defined()) continue;
    if (!o.input->defined())
      throw Error(o.name, std::string("is given without ") + o.input_name + "; a gradient needs its input (pass " +
                              o.input_name + " or no " + o.name + ")");
    check_like(*o.grad, o.name, *o.input, o.input_name, f.q, target);
  }
  check_aliasing(a);
  return p;
}

}  // namespace flash_kda::detail
