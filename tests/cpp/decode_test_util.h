// Random decode problems for the C++ tests: the activations of make_random_problem, a state
// pool with its slot indices and accepted-token counts, the call's flags, and strided views
// (activations inside wider rows, pool slots apart), as include/flash_kda/decode.h describes
// them.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "flash_kda/flash_kda.h"
#include "reference_test_util.h"

namespace flash_kda::testing {

/// What make_decode_problem draws on top of the activations of `base`.
struct DecodeConfig {
  KdaConfig base;                 ///< activations, gate, layout, state dtype (the pool's)
  int64_t pool_slots = 0;         ///< P > 0: a pool with ssm_state_indices; 0: per-sequence states
  bool per_token = false;         ///< indices [N, T] (else [N])
  std::vector<int64_t> slots;     ///< index values, [N] or [N * T] row-major; negative = padded
  std::vector<int64_t> accepted;  ///< num_accepted_tokens [N], empty = absent
  DType index_dtype = DType::I32;
  int64_t row_pad = 0;            ///< > 0: q, k, v, g and out rows sit in rows this much wider
  int64_t slot_pad = 0;           ///< > 0: pool slots this many elements apart beyond HV * K * V
  bool use_qk_l2norm = true;      ///< DecodeArgs::use_qk_l2norm (off: keep |q|, |k| ~ 1 by base.qk_std)
  bool allow_neg_eigval = false;  ///< DecodeArgs::allow_neg_eigval (beta scaled to (0, 2))
  std::optional<double> scale;    ///< DecodeArgs::scale; absent: the default K^-0.5
  double lower_bound = -5.0;      ///< DecodeArgs::lower_bound (the safe gate's floor)
};

/// A contiguous host tensor `wide` whose last dimension is `pad` wider than the view taken of
/// it; view() describes the narrow part (strides of the wide tensor).
struct Narrowed {
  HostTensor wide;
  int64_t pad = 0;
  TensorView view() {
    TensorView t = wide.view();
    if (t.defined()) t.shape[t.ndim - 1] -= pad;
    return t;
  }
};

/// `src` copied into a tensor whose last dimension is `pad` wider (the extra columns hold NaN,
/// so reading them shows).
inline Narrowed widen(const HostTensor& src, int64_t pad) {
  Narrowed n;
  n.pad = pad;
  if (!src.defined()) return n;
  std::vector<int64_t> shape = src.shape();
  const int64_t last = shape.back();
  shape.back() += pad;
  n.wide = HostTensor(src.dtype(), shape);
  n.wide.fill(std::nan(""));
  for (int64_t i = 0; i < src.numel(); ++i) n.wide.set(i / last * (last + pad) + i % last, src.get(i));
  return n;
}

/// The elements of a strided view of `wide`'s memory (same layout as `view`), in logical order.
inline std::vector<double> view_values(const HostTensor& wide, const TensorView& view) {
  std::vector<double> out;
  const int64_t n = view.numel();
  out.reserve(size_t(n));
  for (int64_t lin = 0; lin < n; ++lin) {
    int64_t rem = lin, off = 0;
    for (int d = view.ndim - 1; d >= 0; --d) {
      off += (rem % view.shape[d]) * view.strides[d];
      rem /= view.shape[d];
    }
    out.push_back(wide.get(off));
  }
  return out;
}

/// A random decode call: owned tensors and the flags of DecodeArgs.
struct DecodeProblem {
  DecodeConfig config;
  KdaProblem act;                    ///< q, k, v, g, beta, A_log, dt_bias, cu_seqlens; states unused
  Narrowed q, k, v, g, out;          ///< the activations as (possibly) strided views
  Narrowed pool;                     ///< [P, HV, ...] with slot padding, or absent
  HostTensor initial_state, final_state;  ///< per-sequence states (no pool)
  HostTensor indices, accepted;

  /// DecodeArgs on these tensors: the pool in place when there is one.
  DecodeArgs args() {
    DecodeArgs a;
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.g = g.view();
    a.beta = act.beta.view();
    a.out = out.view();
    a.A_log = act.A_log.view();
    a.dt_bias = act.dt_bias.view();
    a.cu_seqlens = act.cu_seqlens.view();
    a.gate = config.base.gate;
    a.state_layout = config.base.state_layout;
    a.use_beta_sigmoid = config.base.beta_logits;
    a.use_qk_l2norm = config.use_qk_l2norm;
    a.allow_neg_eigval = config.allow_neg_eigval;
    a.scale = config.scale;
    a.lower_bound = config.lower_bound;
    if (config.pool_slots > 0) {
      a.initial_state = pool_view();
      a.final_state = a.initial_state;
      a.ssm_state_indices = indices.view();
      a.num_accepted_tokens = accepted.view();
    } else {
      a.initial_state = initial_state.view();
      a.final_state = final_state.view();
    }
    return a;
  }
  /// The pool as a [P, HV, ., .] view with the slot stride of its padding.
  TensorView pool_view() {
    TensorView t = pool.wide.view();
    if (!t.defined()) return t;
    const int64_t P = config.pool_slots;
    const int64_t slot = t.shape[0] / P;  // elements per padded slot
    const int64_t HV = config.base.value_heads, K = config.base.head_dim_k, V = config.base.head_dim_v;
    const bool vf = config.base.state_layout == StateLayout::VFirst;
    t.ndim = 4;
    const int64_t shape[4] = {P, HV, vf ? V : K, vf ? K : V};
    const int64_t strides[4] = {slot, K * V, vf ? K : V, 1};
    for (int d = 0; d < 4; ++d) t.shape[d] = shape[d], t.strides[d] = strides[d];
    return t;
  }
};

inline DecodeProblem make_decode_problem(const DecodeConfig& c) {
  DecodeProblem p;
  p.config = c;
  KdaConfig base = c.base;
  base.with_initial_state = c.pool_slots == 0 && c.base.with_initial_state;
  base.with_final_state = c.pool_slots == 0 && c.base.with_final_state;
  p.act = make_random_problem(base);
  p.q = widen(p.act.q, c.row_pad);
  p.k = widen(p.act.k, c.row_pad);
  p.v = widen(p.act.v, c.row_pad);
  p.g = widen(p.act.g, c.row_pad);
  p.out = widen(p.act.out, c.row_pad);
  p.initial_state = p.act.initial_state;
  p.final_state = p.act.final_state;
  if (c.pool_slots > 0) {
    const int64_t HV = base.value_heads, KV = base.head_dim_k * base.head_dim_v;
    const int64_t slot = HV * KV + c.slot_pad;
    std::mt19937_64 rng(base.seed + 7);
    std::normal_distribution<double> normal(0.0, 0.5);
    p.pool.wide = HostTensor(base.state_dtype, {c.pool_slots * slot});
    for (int64_t i = 0; i < p.pool.wide.numel(); ++i) p.pool.wide.set(i, normal(rng));
    const int64_t N = p.act.num_seqs();
    std::vector<double> idx(c.slots.begin(), c.slots.end());
    if (c.per_token)
      p.indices = HostTensor::from_values(idx, c.index_dtype, {N, base.seqlen});
    else
      p.indices = HostTensor::from_values(idx, c.index_dtype, {N});
    if (!c.accepted.empty())
      p.accepted = HostTensor::from_values(std::vector<double>(c.accepted.begin(), c.accepted.end()), c.index_dtype, {N});
  }
  return p;
}

}  // namespace flash_kda::testing
