// One token of the KDA recurrence in fp64 (docs/kda-spec.md "Pre-processing" and
// "Recurrence"), shared by reference_forward and reference_decode, which differ only in where
// they read a token's inputs and where states start and end.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/gate.h"
#include "flash_kda/forward.h"
#include "reference/element_io.h"

namespace flash_kda::reference_detail {

/// The flags of a call that the token step applies.
struct StepFlags {
  GateMode gate = GateMode::SafeSigmoid;
  double lower_bound = -5.0;
  bool use_qk_l2norm = true;
  bool use_beta_sigmoid = true;
  bool allow_neg_eigval = false;
  double scale = 1.0;
};

/// The step flags of a call (ForwardArgs or DecodeArgs) whose applied scale is `scale`.
template <class Args>
StepFlags step_flags(const Args& a, double scale) {
  StepFlags f;
  f.gate = a.gate;
  f.lower_bound = a.lower_bound;
  f.use_qk_l2norm = a.use_qk_l2norm;
  f.use_beta_sigmoid = a.use_beta_sigmoid;
  f.allow_neg_eigval = a.allow_neg_eigval;
  f.scale = scale;
  return f;
}

/// The raw inputs of one token of one value head, loaded by the caller (K entries for q, k
/// and g; V for v), and scratch the step reuses. The step normalises q and k in place and
/// leaves its intermediates here: decay = exp(a), b the beta activation, u = S^T k with the
/// decayed S, w = b (v - u), o = S^T q.
struct TokenInputs {
  explicit TokenInputs(int64_t K, int64_t V)
      : q(size_t(K)), k(size_t(K)), g(size_t(K)), decay(size_t(K)), v(size_t(V)), u(size_t(V)), w(size_t(V)), o(size_t(V)) {}
  std::vector<double> q, k, g, decay, v, u, w, o;
  double beta = 0.0;
  double b = 0.0;
};

/// Offset of element (i = key channel, j = value column) in a K x V state slice stored in
/// `layout` (v-first rows are value columns, k-first rows are key channels).
inline int64_t state_offset(StateLayout layout, int64_t i, int64_t j, int64_t K, int64_t V) {
  return layout == StateLayout::VFirst ? j * K + i : i * V + j;
}

/// Element offset of the row of flat token `tok`, head `h` of a per-token tensor ([B, T, heads,
/// dim] or beta [B, T, HV]; any batch, token and head strides, unit last stride): token tok is
/// entry tok % T of batch entry tok / T (varlen: B = 1, T = T_total).
inline int64_t row_offset(const TensorView& t, const ProblemShape& p, int64_t tok, int64_t h) {
  return (tok / p.seqlen) * t.strides[0] + (tok % p.seqlen) * t.strides[1] + h * t.strides[2];
}

/// Loads flat token `tok` of a forward call's q, k (head h), g, v and beta (value head hv) into
/// `in`, raw (the step applies the norm, the gate and the beta activation).
inline void load_token(TokenInputs& in, const ForwardArgs& a, const ProblemShape& p, int64_t tok, int64_t h,
                       int64_t hv) {
  const int64_t K = int64_t(in.q.size()), V = int64_t(in.v.size());
  const int64_t q_base = row_offset(a.q, p, tok, h), k_base = row_offset(a.k, p, tok, h);
  const int64_t g_base = row_offset(a.g, p, tok, hv), v_base = row_offset(a.v, p, tok, hv);
  for (int64_t i = 0; i < K; ++i) {
    in.q[size_t(i)] = load_element(a.q, q_base + i);
    in.k[size_t(i)] = load_element(a.k, k_base + i);
    in.g[size_t(i)] = load_element(a.g, g_base + i);
  }
  in.beta = load_element(a.beta, row_offset(a.beta, p, tok, hv));
  for (int64_t j = 0; j < V; ++j) in.v[size_t(j)] = load_element(a.v, v_base + j);
}

/// Advances S (K x V, row i = key channel i) by one token and writes scale * S^T q to
/// out_row[0..V). `rate` is exp(A_log) (1 without A_log) and `bias` the head's K dt_bias values
/// (zeros without dt_bias); both unused for PreGated.
inline void token_step(std::vector<double>& S, TokenInputs& in, const StepFlags& f, double rate, const double* bias,
                       double* out_row) {
  const size_t K = in.q.size(), V = in.v.size();
  if (f.use_qk_l2norm) {
    double qq = 0.0, kk = 0.0;
    for (size_t i = 0; i < K; ++i) {
      qq += in.q[i] * in.q[i];
      kk += in.k[i] * in.k[i];
    }
    const double q_inv = 1.0 / std::sqrt(qq + math::kL2NormEps);
    const double k_inv = 1.0 / std::sqrt(kk + math::kL2NormEps);
    for (size_t i = 0; i < K; ++i) {
      in.q[i] *= q_inv;
      in.k[i] *= k_inv;
    }
  }
  for (size_t i = 0; i < K; ++i) {
    double log_decay = in.g[i];
    if (f.gate == GateMode::SafeSigmoid)
      log_decay = math::safe_gate<double>(in.g[i] + bias[i], rate, f.lower_bound);
    else if (f.gate == GateMode::Softplus)
      log_decay = math::softplus_gate<double>(in.g[i] + bias[i], rate);
    in.decay[i] = std::exp(log_decay);
  }
  in.b = f.use_beta_sigmoid ? math::beta_sigmoid<double>(in.beta, f.allow_neg_eigval) : in.beta;
  const double b = in.b;

  // S <- diag(exp(a_t)) S, and u = S^T k_t with the decayed S.
  std::fill(in.u.begin(), in.u.end(), 0.0);
  for (size_t i = 0; i < K; ++i) {
    double* row = &S[i * V];
    const double d = in.decay[i], ki = in.k[i];
    for (size_t j = 0; j < V; ++j) {
      row[j] *= d;
      in.u[j] += row[j] * ki;
    }
  }
  // S <- S + b k_t (v_t - u)^T, and o_t = S^T q_t with the updated S.
  for (size_t j = 0; j < V; ++j) in.w[j] = b * (in.v[j] - in.u[j]);
  std::fill(in.o.begin(), in.o.end(), 0.0);
  for (size_t i = 0; i < K; ++i) {
    double* row = &S[i * V];
    const double ki = in.k[i], qi = in.q[i];
    for (size_t j = 0; j < V; ++j) {
      row[j] += ki * in.w[j];
      in.o[j] += row[j] * qi;
    }
  }
  for (size_t j = 0; j < V; ++j) out_row[j] = f.scale * in.o[j];
}

}  // namespace flash_kda::reference_detail
