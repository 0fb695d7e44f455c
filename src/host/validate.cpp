// Validation of a whole forward call: every argument, for the target that will run it.
// Checks run in a fixed order (presence, per-tensor sanity/device/layout, shapes, dtypes,
// sequences, states, gate and flags, the Sm90 subset, aliasing) so the first error reported is
// the most basic one. The message list is docs/errors.md.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "flash_kda/call_table.h"
#include "flash_kda/forward.h"
#include "host/arg_checks.h"
#include "host/checks.h"
#include "host/problem.h"

namespace flash_kda {
namespace {

using detail::check_activation_shapes;
using detail::check_contiguous;
using detail::check_cu_seqlens_values;
using detail::check_flags;
using detail::check_rank;
using detail::check_sane;
using detail::check_shape;
using detail::device_str;
using detail::dims_str;
using detail::shape_str;

using Named = detail::NamedView;

const TensorView& field(const ForwardArgs& a, const TensorSpec& spec) { return a.*(spec.member); }

// The table's dtype rule of `name` for `target`, with its reason where Sm90 accepts fewer.
void check_table_dtype(const ForwardArgs& a, const char* name, Target target) {
  const TensorSpec& spec = tensor_spec(name);
  const DTypeSet allowed = accepted_dtypes(spec, target);
  const TensorView& t = field(a, spec);
  if (dtype_in(allowed, t.dtype)) return;
  std::string msg = "expected dtype " + dtype_list(allowed);
  if (target == Target::Sm90 && allowed != spec.reference && spec.sm90_why[0]) msg += std::string(" (") + spec.sm90_why + ")";
  throw Error(name, msg + ", got " + dtype_name(t.dtype));
}

// The kernels load q, k, v and g with 16-byte cp.async, store out with 16-byte vectors and
// states with 8-byte ones; one rule for every tensor keeps the check simple (torch allocations
// are 256-byte aligned).
constexpr uintptr_t kSm90Alignment = 16;

void check_placement(const ForwardArgs& a, Target target) {
  for (const TensorSpec& spec : kForwardTensors) {
    const TensorView& t = field(a, spec);
    const Named n{&t, spec.name};
    if (t.ndim < 0) check_sane(t, n.name);  // corrupt, not absent: never treat it as "not given"
    if (!t.defined()) continue;
    check_sane(t, n.name);
    if (spec.host_only) {
      if (t.device != DeviceType::CPU)
        throw Error(n.name, "is on " + device_str(t) + "; it is the host copy of cu_seqlens, a host tensor is needed");
    } else if (target == Target::CpuReference) {
      if (t.device != DeviceType::CPU)
        throw Error(n.name, "is on " + device_str(t) + ", the CPU reference (reference_forward) needs host tensors");
    } else {
      if (t.device != DeviceType::CUDA)
        throw Error(n.name, "is on the host, a CUDA tensor is needed (forward() runs on the GPU)");
      if (t.device_id != a.q.device_id)
        throw Error(n.name, "q is on " + device_str(a.q) + " but " + n.name + " on " + device_str(t) +
                                "; all tensors must be on one device");
      if (t.numel() > 0 && reinterpret_cast<uintptr_t>(t.data) % kSm90Alignment != 0)
        throw Error(n.name, "data pointer must be 16-byte aligned for the Sm90 kernels");
    }
    check_contiguous(t, n.name);
  }
}


void check_activation_dtypes(const ForwardArgs& a, Target target) {
  for (const char* name : {"q", "k", "v", "out", "g", "beta"}) check_table_dtype(a, name, target);
}


// Fills num_seqs; reads cu_seqlens values where they are on the host (the reference) and those
// of the host copy cu_seqlens_cpu when one is given (any target).
void check_sequences(const ForwardArgs& a, Target target, ProblemShape& p) {
  const TensorView& host = a.cu_seqlens_cpu;
  p.varlen = a.cu_seqlens.defined();
  if (!p.varlen) {
    if (host.defined()) throw Error("cu_seqlens_cpu", "is given without cu_seqlens; pass both or neither");
    p.num_seqs = p.batch;
    return;
  }
  const TensorView& cu = a.cu_seqlens;
  check_table_dtype(a, "cu_seqlens", target);
  check_rank(cu, "cu_seqlens", 1, tensor_spec("cu_seqlens").shape);
  if (cu.shape[0] < 2)
    throw Error("cu_seqlens", "expected length N + 1 >= 2 (at least one sequence), got shape " + shape_str(cu));
  if (p.batch != 1)
    throw Error("cu_seqlens", "given with batch B = q.shape[0] = " + std::to_string(p.batch) +
                                  "; a varlen batch packs all sequences into B = 1");
  p.num_seqs = cu.shape[0] - 1;
  if (host.defined()) {
    check_table_dtype(a, "cu_seqlens_cpu", target);
    check_shape(host, "cu_seqlens_cpu", {cu.shape[0]}, tensor_spec("cu_seqlens_cpu").shape, "like cu_seqlens");
    check_cu_seqlens_values(host, p, " (read from its host copy cu_seqlens_cpu)");
  }
  // The GPU path cannot read device values without a host sync; the reference checks them.
  if (target == Target::CpuReference && cu.device == DeviceType::CPU) check_cu_seqlens_values(cu, p, "");
}

void check_states(const ForwardArgs& a, Target target, const ProblemShape& p) {
  const bool v_first = a.state_layout == StateLayout::VFirst;
  const std::vector<int64_t> dims =
      v_first ? std::vector<int64_t>{p.num_seqs, p.value_heads, p.head_dim_v, p.head_dim_k}
              : std::vector<int64_t>{p.num_seqs, p.value_heads, p.head_dim_k, p.head_dim_v};
  const std::string meaning = v_first ? "[N, HV, V, K] (v-first state layout)" : "[N, HV, K, V] (k-first state layout)";
  for (const Named n : {Named{&a.initial_state, "initial_state"}, Named{&a.final_state, "final_state"}}) {
    if (!n.t->defined()) continue;
    check_table_dtype(a, n.name, target);
    check_shape(*n.t, n.name, dims, meaning, p.varlen ? "with N = len(cu_seqlens) - 1" : "with N = B");
  }
  if (a.initial_state.defined() && a.final_state.defined() && a.initial_state.dtype != a.final_state.dtype)
    throw Error("final_state", std::string("dtype must equal initial_state's (") + dtype_name(a.initial_state.dtype) +
                                   "), got " + dtype_name(a.final_state.dtype));
}

void check_gate(const ForwardArgs& a, Target target, const ProblemShape& p) {
  detail::check_gate_mode(a);
  // As fla's chunk_kda and the decode call: the softplus gate's rate has no default on the GPU.
  if (target == Target::Sm90 && a.gate == GateMode::Softplus && !a.A_log.defined())
    throw Error("A_log", "is required by the Sm90 softplus gate a = -exp(A_log) * softplus(g + dt_bias) (fp32 [HV]), "
                         "got an absent tensor");
  if (a.A_log.defined()) {
    check_table_dtype(a, "A_log", target);
    detail::check_A_log_shape(a, p);
  }
  if (a.dt_bias.defined()) {
    check_table_dtype(a, "dt_bias", target);
    detail::check_dt_bias_shape(a, p);
  }
  detail::check_lower_bound(a);
}


// What the sm_90a kernels implement; everything else runs on the reference only.
void check_sm90_subset(const ForwardArgs& a, const ProblemShape& p) {
  const std::string subset =
      "the Sm90 kernels support K = V = 128 and v-first states; the reference (reference_forward, "
      "flash_kda.reference) covers the rest";
  if (p.head_dim_k != 128) throw Error("q", "head dim K = " + std::to_string(p.head_dim_k) + " unsupported: " + subset);
  if (p.head_dim_v != 128) throw Error("v", "head dim V = " + std::to_string(p.head_dim_v) + " unsupported: " + subset);
  // Every gate mode and flag runs on the kernels (prepare.cu).
  if (a.state_layout != StateLayout::VFirst) throw Error("state_layout", "k-first is unsupported: " + subset);

  // Chunk slots (16-token chunks plus one per sequence) and grid dims are 32-bit in the kernels.
  constexpr int64_t kInt32Limit = int64_t{1} << 31;
  const int64_t total = p.batch * p.seqlen;
  if (p.num_seqs >= kInt32Limit)
    throw Error(p.varlen ? "cu_seqlens" : "q", "N = " + std::to_string(p.num_seqs) + " sequences must be < 2^31 for Sm90");
  if (p.value_heads > 65535)
    throw Error("v", "value heads HV = " + std::to_string(p.value_heads) + " must be <= 65535 (a CUDA grid dimension) for Sm90");
  const int64_t slots = p.num_seqs + (total + 15) / 16;
  if (slots > (kInt32Limit - 1) / p.value_heads)
    throw Error("q", "(N + ceil(T_total / 16)) * HV = " + std::to_string(slots) + " * " + std::to_string(p.value_heads) +
                         " must be < 2^31 (32-bit chunk indexing of the Sm90 kernels)");
}

// Outputs are written while inputs are still being read, so any overlap is a race; the one
// exception is an exact in-place state update, which every target reads before it writes.
void check_aliasing(const ForwardArgs& a) {
  std::vector<Named> inputs;
  for (const TensorSpec& spec : kForwardTensors)
    if (spec.role == TensorRole::Input) inputs.push_back({&field(a, spec), spec.name});
  // Shapes and dtypes already agree (check_states), so the same pointer means the same tensor.
  detail::check_outputs_apart(
      a.out, a.final_state, a.initial_state, inputs, detail::overlaps,
      [](const TensorView& f, const TensorView& i) { return f.data == i.data; }, "same pointer, shape and dtype");
}

}  // namespace

ProblemShape validate(const ForwardArgs& args, Target target) {
  if (target != Target::CpuReference && target != Target::Sm90)
    throw Error("target", "expected Target::CpuReference or Target::Sm90");
  for (const TensorSpec& spec : kForwardTensors)
    if (!spec.optional) detail::require_present(field(args, spec), spec.name);
  check_placement(args, target);
  ProblemShape p;
  check_activation_shapes(args, p);
  check_activation_dtypes(args, target);
  check_sequences(args, target, p);
  check_flags(args, target);
  check_states(args, target, p);
  check_gate(args, target, p);
  if (target == Target::Sm90) check_sm90_subset(args, p);
  check_aliasing(args);
  p.scale = args.scale ? *args.scale : 1.0 / std::sqrt(static_cast<double>(p.head_dim_k));
  return p;
}

}  // namespace flash_kda
