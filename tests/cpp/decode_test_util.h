// Random decode problems for the C++ tests: the activations of make_random_problem, a state
// pool with its slot indices and accepted-token counts, the call's flags, and strided views
// (activations inside wider rows, pool slots apart), as include/flash_kda/decode.h describes
// them. An index past the pool has two forms, the kernel's (>= P, skipped) and the reference's
// (-1, which it skips the same way; it rejects one >= P).
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
  std::vector<int64_t> slots;     ///< index values, [N] or [N * T] row-major; negative = padded,
                                  ///< kBeyondPool = past the pool
  std::vector<int64_t> accepted;  ///< num_accepted_tokens [N], empty = absent
  DType index_dtype = DType::I32;
  int64_t row_pad = 0;            ///< > 0: q, k, v, g and out rows sit in rows this much wider
  int64_t slot_pad = 0;           ///< > 0: pool slots this many elements apart beyond HV * K * V
  bool use_qk_l2norm = true;      ///< DecodeArgs::use_qk_l2norm (off: keep |q|, |k| ~ 1 by base.qk_std)
  bool allow_neg_eigval = false;  ///< DecodeArgs::allow_neg_eigval (beta scaled to (0, 2))
  std::optional<double> scale;    ///< DecodeArgs::scale; absent: the default K^-0.5
  double lower_bound = -5.0;      ///< DecodeArgs::lower_bound (the safe gate's floor)

  /// A `slots` value for an index past the pool: the kernel gets P + kBeyondPoolOffset, which
  /// decode() skips as it does a negative index, the reference -1 (it rejects an index >= P), so
  /// that the kernel's result must be that of a padded slot.
  static constexpr int64_t kBeyondPool = -2;
  /// How far past the last slot a kBeyondPool index points (P + 3: not just the first slot past).
  static constexpr int64_t kBeyondPoolOffset = 3;
  /// Whether some slot is kBeyondPool (the pool's memory then goes on past its P slots).
  bool reaches_beyond_pool() const {
    for (int64_t s : slots)
      if (s == kBeyondPool) return true;
    return false;
  }
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
  /// [P, HV, ...] with slot padding, or absent. With a kBeyondPool slot the memory goes on for
  /// kBeyondPoolOffset + 1 slots of random values past the P slots of the view, so that a kernel
  /// access at an index >= P stays inside the allocation: a read gives finite values, a write
  /// shows (check_decode requires that memory unchanged).
  Narrowed pool;
  int64_t slot_elems = 0;            ///< elements from one pool slot to the next (HV K V + slot_pad)
  HostTensor initial_state, final_state;  ///< per-sequence states (no pool)
  HostTensor indices;                ///< ssm_state_indices as the kernel gets them (kBeyondPool as P + 3)
  HostTensor reference_indices;      ///< the same as the reference gets them (kBeyondPool as -1)
  HostTensor accepted;

  /// DecodeArgs on these tensors, with the kernel's indices: the pool in place when there is one.
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
  /// args() with the reference's indices (-1 where the kernel gets an index past the pool).
  DecodeArgs reference_args() {
    DecodeArgs a = args();
    if (config.pool_slots > 0) a.ssm_state_indices = reference_indices.view();
    return a;
  }
  /// The pool as a [P, HV, ., .] view with the slot stride of its padding.
  TensorView pool_view() {
    TensorView t = pool.wide.view();
    if (!t.defined()) return t;
    const int64_t P = config.pool_slots;
    const int64_t slot = slot_elems;
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
    p.slot_elems = HV * KV + c.slot_pad;
    const int64_t slots = c.pool_slots + (c.reaches_beyond_pool() ? DecodeConfig::kBeyondPoolOffset + 1 : 0);
    std::mt19937_64 rng(base.seed + 7);
    std::normal_distribution<double> normal(0.0, 0.5);
    p.pool.wide = HostTensor(base.state_dtype, {slots * p.slot_elems});
    for (int64_t i = 0; i < p.pool.wide.numel(); ++i) p.pool.wide.set(i, normal(rng));
    const int64_t N = p.act.num_seqs();
    std::vector<double> idx, ref_idx;
    for (int64_t s : c.slots) {
      const bool beyond = s == DecodeConfig::kBeyondPool;
      idx.push_back(double(beyond ? c.pool_slots + DecodeConfig::kBeyondPoolOffset : s));
      ref_idx.push_back(double(beyond ? -1 : s));
    }
    const std::vector<int64_t> idx_shape = c.per_token ? std::vector<int64_t>{N, base.seqlen} : std::vector<int64_t>{N};
    p.indices = HostTensor::from_values(idx, c.index_dtype, idx_shape);
    p.reference_indices = HostTensor::from_values(ref_idx, c.index_dtype, idx_shape);
    if (!c.accepted.empty())
      p.accepted = HostTensor::from_values(std::vector<double>(c.accepted.begin(), c.accepted.end()), c.index_dtype, {N});
  }
  return p;
}

}  // namespace flash_kda::testing
