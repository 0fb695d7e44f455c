// Checks that the forward and the decode call share (validate.cpp, decode.cpp): the
// activation shapes, host cu_seqlens values, the gate's mode and tensors, the flags. Templates
// over the call's argument struct (ForwardArgs, DecodeArgs), which name these fields alike.
// Each throws flash_kda::Error naming the argument.
#pragma once

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "flash_kda/call_table.h"
#include "flash_kda/forward.h"
#include "host/checks.h"
#include "host/problem.h"

namespace flash_kda::detail {

// Sizes from q and v; the rest of the activations must agree with them. `with_out` false: out
// is not part of the call (the backward recomputes it into its workspace) and is not checked.
template <class Args>
void check_activation_shapes(const Args& a, ProblemShape& p, bool with_out = true) {
  check_rank(a.q, "q", 4, tensor_spec("q").shape);
  p.batch = a.q.shape[0];
  p.seqlen = a.q.shape[1];
  p.heads = a.q.shape[2];
  p.head_dim_k = a.q.shape[3];
  if (p.batch <= 0) throw Error("q", "batch B = q.shape[0] must be > 0, got shape " + shape_str(a.q));
  if (p.heads <= 0) throw Error("q", "heads H = q.shape[2] must be > 0, got shape " + shape_str(a.q));
  if (p.head_dim_k <= 0) throw Error("q", "head dim K = q.shape[3] must be > 0, got shape " + shape_str(a.q));
  check_shape(a.k, "k", {p.batch, p.seqlen, p.heads, p.head_dim_k}, tensor_spec("k").shape, "like q");

  check_rank(a.v, "v", 4, tensor_spec("v").shape);
  if (a.v.shape[0] != p.batch || a.v.shape[1] != p.seqlen)
    throw Error("v", "expected shape [" + std::to_string(p.batch) + ", " + std::to_string(p.seqlen) +
                         ", HV, V] (B, T of q), got " + shape_str(a.v));
  p.value_heads = a.v.shape[2];
  p.head_dim_v = a.v.shape[3];
  if (p.value_heads <= 0) throw Error("v", "value heads HV = v.shape[2] must be > 0, got shape " + shape_str(a.v));
  if (p.head_dim_v <= 0) throw Error("v", "head dim V = v.shape[3] must be > 0, got shape " + shape_str(a.v));
  if (p.value_heads % p.heads != 0)
    throw Error("v", "value heads HV = " + std::to_string(p.value_heads) + " must be a multiple of q/k heads H = " +
                         std::to_string(p.heads) + " (GVA: value head hv reads q/k head hv / (HV / H))");

  const int64_t B = p.batch, T = p.seqlen, HV = p.value_heads;
  check_shape(a.g, "g", {B, T, HV, p.head_dim_k}, tensor_spec("g").shape, "from q and v");
  check_shape(a.beta, "beta", {B, T, HV}, tensor_spec("beta").shape, "from q and v");
  if (with_out) check_shape(a.out, "out", {B, T, HV, p.head_dim_v}, tensor_spec("out").shape, "like v");
}

// The rules on cu_seqlens's values: cu[0] == 0, non-decreasing, cu[N] == T_total. `cu` is a
// host tensor whose dtype and length were checked; `where` is appended to each message.
inline void check_cu_seqlens_values(const TensorView& cu, const ProblemShape& p, const std::string& where) {
  const int64_t first = detail::host_cu_seqlens(cu, 0);
  if (first != 0) throw Error("cu_seqlens", "cu_seqlens[0] must be 0, got " + std::to_string(first) + where);
  int64_t prev = first;
  for (int64_t i = 1; i <= p.num_seqs; ++i) {
    const int64_t cur = detail::host_cu_seqlens(cu, i);
    if (cur < prev)
      throw Error("cu_seqlens", "must be non-decreasing, got cu_seqlens[" + std::to_string(i) + "] = " +
                                    std::to_string(cur) + " < cu_seqlens[" + std::to_string(i - 1) +
                                    "] = " + std::to_string(prev) + where);
    prev = cur;
  }
  if (prev != p.seqlen)
    throw Error("cu_seqlens", "last entry cu_seqlens[N = " + std::to_string(p.num_seqs) +
                                  "] must equal the total tokens T_total = q.shape[1] = " +
                                  std::to_string(p.seqlen) + ", got " + std::to_string(prev) + where);
}

/// The flags every call shares: allow_neg_eigval needs the beta sigmoid, the state layout and
/// the scale (finite, > 0; fp32-sized on Sm90).
template <class Args>
void check_flags(const Args& a, Target target) {
  if (a.allow_neg_eigval && !a.use_beta_sigmoid)
    throw Error("allow_neg_eigval", "needs use_beta_sigmoid (b = 2 * sigmoid(beta)); got use_beta_sigmoid = false");
  if (a.state_layout != StateLayout::VFirst && a.state_layout != StateLayout::KFirst)
    throw Error("state_layout", "expected VFirst or KFirst, got value " + std::to_string(static_cast<int>(a.state_layout)));
  if (a.scale && !(std::isfinite(*a.scale) && *a.scale > 0.0))
    throw Error("scale", "must be finite and > 0 when given, got " + std::to_string(*a.scale));
  // The kernels apply scale in fp32: a larger value would turn finite outputs into inf.
  if (target == Target::Sm90 && a.scale && *a.scale > double(std::numeric_limits<float>::max()))
    throw Error("scale", "must fit fp32 (<= 3.4e38) for the Sm90 kernels, got " + std::to_string(*a.scale));
}

/// The gate mode is known, and PreGated comes without A_log and dt_bias.
template <class Args>
void check_gate_mode(const Args& a) {
  if (a.gate != GateMode::SafeSigmoid && a.gate != GateMode::Softplus && a.gate != GateMode::PreGated)
    throw Error("gate", "expected SafeSigmoid, Softplus or PreGated, got value " + std::to_string(static_cast<int>(a.gate)));
  if (a.gate == GateMode::PreGated) {
    // Silently ignoring them would hide a caller who believes the gate is being applied.
    const char* why = "is unused when the gate is pre-computed (a = g); pass none";
    if (a.A_log.defined()) throw Error("A_log", why);
    if (a.dt_bias.defined()) throw Error("dt_bias", why);
  }
}

/// A_log (when given) is [HV].
template <class Args>
void check_A_log_shape(const Args& a, const ProblemShape& p) {
  check_shape(a.A_log, "A_log", {p.value_heads}, tensor_spec("A_log").shape, "from v");
}

/// dt_bias (when given) is [HV, K] or [HV * K].
template <class Args>
void check_dt_bias_shape(const Args& a, const ProblemShape& p) {
  const int64_t HV = p.value_heads, K = p.head_dim_k;
  const bool ok = (a.dt_bias.ndim == 2 && a.dt_bias.shape[0] == HV && a.dt_bias.shape[1] == K) ||
                  (a.dt_bias.ndim == 1 && a.dt_bias.shape[0] == HV * K);
  if (!ok)
    throw Error("dt_bias", "expected shape " + dims_str({HV, K}) + " [HV, K] or " + dims_str({HV * K}) +
                               " [HV*K], got " + shape_str(a.dt_bias));
}

/// The safe gate's lower bound is in [-5, 0).
template <class Args>
void check_lower_bound(const Args& a) {
  if (a.gate == GateMode::SafeSigmoid && !(a.lower_bound >= -5.0 && a.lower_bound < 0.0))
    throw Error("lower_bound", "must be in [-5, 0) for the safe gate, got " + std::to_string(a.lower_bound));
}

/// A tensor of a call with its argument name.
struct NamedView {
  const TensorView* t;
  const char* name;
};

/// Outputs are written while inputs are still being read, so any overlap is a race; the one
/// exception is an exact in-place state update (`in_place(final_state, initial_state)`, whose
/// meaning `in_place_rule` states), which every target reads before it writes. `overlaps(a, b)`
/// says whether two defined tensors share a byte.
template <class Overlaps, class InPlace>
void check_outputs_apart(const TensorView& out, const TensorView& final_state, const TensorView& initial_state,
                         const std::vector<NamedView>& inputs, Overlaps overlaps, InPlace in_place,
                         const char* in_place_rule) {
  for (const NamedView& in : inputs)
    if (in.t->defined() && overlaps(out, *in.t))
      throw Error("out", std::string("overlaps input ") + in.name + "; out must be a separate buffer");
  if (!final_state.defined()) return;
  if (overlaps(out, final_state)) throw Error("out", "overlaps final_state; the two outputs must be separate buffers");
  for (const NamedView& in : inputs) {
    if (!in.t->defined() || !overlaps(final_state, *in.t)) continue;
    if (in.t == &initial_state) {
      if (in_place(final_state, initial_state)) continue;
      throw Error("final_state", std::string("overlaps initial_state partially; an in-place state update needs "
                                             "final_state to be exactly initial_state (") + in_place_rule + ")");
    }
    throw Error("final_state", std::string("overlaps input ") + in.name + "; final_state must be a separate buffer "
                               "(or exactly initial_state, for an in-place update)");
  }
}

}  // namespace flash_kda::detail
