// Validation of a whole forward call: every argument, for the target that will run it.
// Checks run in a fixed order (presence, per-tensor sanity/device/layout, shapes, dtypes,
// sequences, states, gate and flags, the Sm90 subset, aliasing) so the first error reported is
// the most basic one. The message list is docs/errors.md.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <string_view>
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
using detail::spans_overlap;
using detail::strides_str;

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

// The kernels load q, k, v and g rows with 16-byte copies, store out rows with 16-byte vectors
// and states with 8-byte ones; one rule for every tensor keeps the check simple (torch
// allocations are 256-byte aligned). beta, ssm_state_indices and intermediate_offsets are read an
// element at a time.
constexpr uintptr_t kSm90Alignment = 16;

// The per-token tensors, which may be strided views ([B, T, heads, dim], beta [B, T, HV]).
bool is_activation(const TensorSpec& spec) {
  for (const char* name : {"q", "k", "v", "g", "beta", "out"})
    if (std::string_view(spec.name) == name) return true;
  return false;
}

// An activation view: strides >= 0, unit stride in the last dimension; on Sm90 16-byte aligned
// rows (data pointer and every stride of a dimension of extent > 1, in bytes), or element
// alignment alone for beta, whose rows are HV scalars.
void check_activation_strides(const TensorView& t, const char* name, Target target) {
  if (t.numel() == 0) return;
  detail::check_view_strides(t, name);
  if (target != Target::Sm90) return;
  if (std::string_view(name) != "beta") return detail::check_rows16(t, name, "the Sm90 kernels");
  if (reinterpret_cast<uintptr_t>(t.data) % uintptr_t(dtype_size(t.dtype)) != 0)
    throw Error(name, "data pointer must be element aligned for the Sm90 kernels");
}

// out is written by many threads at once: no two of its elements may share memory. Sorted by
// stride, each dimension must step past everything the inner ones span.
void check_no_self_overlap(const TensorView& t, const char* name) {
  if (t.numel() == 0) return;
  std::vector<int> dims;
  for (int d = 0; d < t.ndim; ++d)
    if (t.shape[d] > 1) dims.push_back(d);
  std::sort(dims.begin(), dims.end(), [&](int a, int b) { return t.strides[a] < t.strides[b]; });
  int64_t span = 1;  // elements spanned by the dimensions so far
  for (int d : dims) {
    if (t.strides[d] < span)
      throw Error(name, "strides " + strides_str(t) + " of shape " + shape_str(t) +
                            " make elements share memory; an output needs distinct elements");
    span = t.strides[d] * (t.shape[d] - 1) + span;
  }
}

void check_placement(const ForwardArgs& a, Target target) {
  for (const TensorSpec& spec : kForwardTensors) {
    const TensorView& t = field(a, spec);
    const Named n{&t, spec.name};
    if (t.ndim < 0) check_sane(t, n.name);  // corrupt, not absent: never treat it as "not given"
    if (!t.defined()) continue;
    check_sane(t, n.name);
    const bool activation = is_activation(spec);
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
      const bool index = std::string_view(spec.name) == "ssm_state_indices" ||
                         std::string_view(spec.name) == "intermediate_offsets";
      const uintptr_t align = index ? uintptr_t(dtype_size(t.dtype)) : kSm90Alignment;
      if (!activation && t.numel() > 0 && reinterpret_cast<uintptr_t>(t.data) % align != 0)
        throw Error(n.name, std::string("data pointer must be ") + (align == kSm90Alignment ? "16-byte" : "element") +
                                " aligned for the Sm90 kernels");
    }
    if (activation)
      check_activation_strides(t, n.name, target);
    else
      check_contiguous(t, n.name);
  }
}


void check_activation_dtypes(const ForwardArgs& a, Target target, bool with_out) {
  for (const char* name : {"q", "k", "v", "out", "g", "beta"})
    if (with_out || std::string_view(name) != "out") check_table_dtype(a, name, target);
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

// An index tensor's entry (int32 or int64, contiguous), widened.
int64_t host_index(const TensorView& t, int64_t i) {
  return t.dtype == DType::I32 ? int64_t(static_cast<const int32_t*>(t.data)[i]) : static_cast<const int64_t*>(t.data)[i];
}

// The states: [N, HV, ...] each, or, with ssm_state_indices, pools [P, HV, ...] of one P. Their
// dtypes are independent (the kernels compute in fp32 and round once per store). The
// reference reads host index values and rejects one >= P; the GPU skips it (forward.h).
void check_states(const ForwardArgs& a, Target target, const ProblemShape& p) {
  const bool v_first = a.state_layout == StateLayout::VFirst;
  const TensorView& idx = a.ssm_state_indices;
  const bool pool = idx.defined();
  const std::string rows = pool ? "P" : "N";
  const std::string meaning = v_first ? "[" + rows + ", HV, V, K] (v-first state layout)"
                                      : "[" + rows + ", HV, K, V] (k-first state layout)";
  int64_t slots = p.num_seqs;
  if (pool) {
    check_table_dtype(a, "ssm_state_indices", target);
    check_shape(idx, "ssm_state_indices", {p.num_seqs}, tensor_spec("ssm_state_indices").shape,
                p.varlen ? "with N = len(cu_seqlens) - 1" : "with N = B");
    if (!a.initial_state.defined() && !a.final_state.defined())
      throw Error("ssm_state_indices", "is given without initial_state or final_state; the indices select slots of "
                                       "a state pool [P, HV, ...], pass the pool");
    const TensorView& first = a.initial_state.defined() ? a.initial_state : a.final_state;
    const char* first_name = a.initial_state.defined() ? "initial_state" : "final_state";
    check_rank(first, first_name, 4, meaning);
    slots = first.shape[0];
    if (slots < 1)
      throw Error(first_name, "the state pool needs P = " + std::string(first_name) + ".shape[0] >= 1 slots, got shape " +
                                  shape_str(first));
  }
  const std::vector<int64_t> dims =
      v_first ? std::vector<int64_t>{slots, p.value_heads, p.head_dim_v, p.head_dim_k}
              : std::vector<int64_t>{slots, p.value_heads, p.head_dim_k, p.head_dim_v};
  const std::string like = pool ? "(a pool of P slots, P from initial_state, or final_state without it)"
                                : (p.varlen ? "with N = len(cu_seqlens) - 1" : "with N = B");
  for (const Named n : {Named{&a.initial_state, "initial_state"}, Named{&a.final_state, "final_state"}}) {
    if (!n.t->defined()) continue;
    check_table_dtype(a, n.name, target);
    check_shape(*n.t, n.name, dims, meaning, like);
  }
  if (!pool || idx.device != DeviceType::CPU) return;  // device values cannot be read without a sync
  for (int64_t i = 0; i < p.num_seqs; ++i) {
    const int64_t slot = host_index(idx, i);
    if (slot >= slots)
      throw Error("ssm_state_indices", "entry [" + std::to_string(i) + "] = " + std::to_string(slot) +
                                           " is outside the pool of P = " + std::to_string(slots) +
                                           " slots (negative entries mark padded sequences)");
  }
}

// Intermediate states (forward.h): the tensor, its offsets and the spacing go together. The
// offsets' values are read where they are on the host (the reference); on the GPU the kernels
// clamp them.
void check_intermediate(const ForwardArgs& a, Target target, const ProblemShape& p) {
  const TensorView& st = a.intermediate_states;
  const TensorView& off = a.intermediate_offsets;
  if (!st.defined()) {
    if (off.defined())
      throw Error("intermediate_offsets", "is given without intermediate_states; pass both or neither");
    return;
  }
  if (!off.defined())
    throw Error("intermediate_offsets", "is required with intermediate_states (int32/int64 [N + 1]: sequence n's "
                                        "states are rows offsets[n] .. offsets[n + 1] - 1), got an absent tensor");
  const int64_t every = a.intermediate_every;
  if (every <= 0 || every % 16 != 0)
    throw Error("intermediate_every", "expected a positive multiple of 16 (tokens between intermediate states), got " +
                                          std::to_string(every));
  if (target == Target::Sm90 && every / 16 >= (int64_t{1} << 31))
    throw Error("intermediate_every", "must be < 2^35 tokens for Sm90 (32-bit chunk counts), got " + std::to_string(every));
  const bool v_first = a.state_layout == StateLayout::VFirst;
  check_table_dtype(a, "intermediate_states", target);
  check_rank(st, "intermediate_states", 4, v_first ? "[S, HV, V, K] (v-first state layout)" : "[S, HV, K, V] (k-first state layout)");
  const int64_t rows = st.shape[0];
  const std::vector<int64_t> dims = v_first ? std::vector<int64_t>{rows, p.value_heads, p.head_dim_v, p.head_dim_k}
                                            : std::vector<int64_t>{rows, p.value_heads, p.head_dim_k, p.head_dim_v};
  check_shape(st, "intermediate_states", dims,
              v_first ? "[S, HV, V, K] (v-first state layout)" : "[S, HV, K, V] (k-first state layout)",
              "(S rows of states, HV, V and K like v and k)");
  check_table_dtype(a, "intermediate_offsets", target);
  check_shape(off, "intermediate_offsets", {p.num_seqs + 1}, tensor_spec("intermediate_offsets").shape,
              p.varlen ? "with N = len(cu_seqlens) - 1" : "with N = B");
  if (target == Target::Sm90 && rows >= (int64_t{1} << 31))
    throw Error("intermediate_states", "S = " + std::to_string(rows) + " rows must be < 2^31 for Sm90");
  if (off.device != DeviceType::CPU) return;  // device values cannot be read without a sync
  int64_t prev = 0;
  for (int64_t i = 0; i <= p.num_seqs; ++i) {
    const int64_t o = host_index(off, i);
    if (o < prev || o > rows)
      throw Error("intermediate_offsets", "entry [" + std::to_string(i) + "] = " + std::to_string(o) +
                                              (o < prev ? " is below the entry before it (" + std::to_string(prev) + ")"
                                                        : " is past S = intermediate_states.shape[0] = " + std::to_string(rows)) +
                                              "; expected 0 <= offsets[0] <= ... <= offsets[N] <= S");
    prev = o;
  }
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
void check_sm90_subset(const ProblemShape& p) {
  const std::string subset =
      "the Sm90 kernels support K = V = 128; the reference (reference_forward, flash_kda.reference) "
      "covers the rest";
  if (p.head_dim_k != 128) throw Error("q", "head dim K = " + std::to_string(p.head_dim_k) + " unsupported: " + subset);
  if (p.head_dim_v != 128) throw Error("v", "head dim V = " + std::to_string(p.head_dim_v) + " unsupported: " + subset);
  // Every gate mode, flag, state layout and state dtype runs on the kernels.

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
  check_no_self_overlap(a.out, "out");
  std::vector<Named> inputs;
  for (const TensorSpec& spec : kForwardTensors)
    if (spec.role == TensorRole::Input) inputs.push_back({&field(a, spec), spec.name});
  // Shapes already agree (check_states) and states are contiguous, so the same pointer and
  // dtype mean the same tensor.
  detail::check_outputs_apart(
      a.out, a.final_state, a.initial_state, inputs, spans_overlap,
      [](const TensorView& f, const TensorView& i) { return f.data == i.data && f.dtype == i.dtype; },
      "same pointer, shape and dtype");
  const TensorView& st = a.intermediate_states;
  if (!st.defined()) return;
  for (const Named& in : inputs)
    if (in.t->defined() && spans_overlap(st, *in.t))
      throw Error("intermediate_states", std::string("overlaps input ") + in.name +
                                             "; intermediate_states must be a separate buffer");
  for (const Named o : {Named{&a.out, "out"}, Named{&a.final_state, "final_state"}})
    if (o.t->defined() && spans_overlap(st, *o.t))
      throw Error("intermediate_states", std::string("overlaps ") + o.name + "; the outputs must be separate buffers");
}

}  // namespace

namespace {

// validate() with or without out (with_out false: out must be absent, validate_inputs).
ProblemShape validate_call(const ForwardArgs& args, Target target, bool with_out) {
  if (target != Target::CpuReference && target != Target::Sm90)
    throw Error("target", "expected Target::CpuReference or Target::Sm90");
  for (const TensorSpec& spec : kForwardTensors)
    if (!spec.optional && (with_out || std::string_view(spec.name) != "out"))
      detail::require_present(field(args, spec), spec.name);
  check_placement(args, target);
  ProblemShape p;
  check_activation_shapes(args, p, with_out);
  check_activation_dtypes(args, target, with_out);
  check_sequences(args, target, p);
  check_flags(args, target);
  check_states(args, target, p);
  check_intermediate(args, target, p);
  check_gate(args, target, p);
  if (target == Target::Sm90) check_sm90_subset(p);
  check_aliasing(args);
  p.scale = args.scale ? *args.scale : 1.0 / std::sqrt(static_cast<double>(p.head_dim_k));
  return p;
}

}  // namespace

ProblemShape validate(const ForwardArgs& args, Target target) { return validate_call(args, target, true); }

namespace detail {
ProblemShape validate_inputs(const ForwardArgs& args, Target target) {
  if (args.out.defined()) throw Error("out", "must be absent here (the call recomputes the forward's output)");
  return validate_call(args, target, false);
}
}  // namespace detail

}  // namespace flash_kda
