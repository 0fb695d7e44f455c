// Helpers of the fp64 tests that evaluate docs/kda-spec.md's chunked algebra independently of the
// reference (test_reference_chunked.cpp: "Chunked form"; test_record_form.cpp: "Record form"):
// the spec's pre-processing of one (sequence, value head) with its own code, dense matrices, and
// the reference's final state in k-first order.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "reference_test_util.h"

namespace flash_kda::testing {

/// A dense fp64 matrix, row-major, as rows.
using Matrix = std::vector<std::vector<double>>;

inline Matrix zeros(int64_t rows, int64_t cols) {
  return Matrix(static_cast<size_t>(rows), std::vector<double>(static_cast<size_t>(cols), 0.0));
}

/// Token index where each sequence starts, plus the total at the end ([N + 1]).
inline std::vector<int64_t> sequence_starts(const KdaProblem& p) {
  const auto& c = p.config;
  std::vector<int64_t> starts{0};
  for (int64_t n = 0; n < p.num_seqs(); ++n)
    starts.push_back(starts.back() + (c.seqlens.empty() ? c.seqlen : c.seqlens[size_t(n)]));
  return starts;
}

/// The scale the call uses: a.scale, or K^-0.5.
inline double call_scale(const ForwardArgs& a, int64_t K) { return a.scale ? *a.scale : 1.0 / std::sqrt(double(K)); }

/// One (sequence, value head) after the spec's pre-processing, token by token: q and k
/// (L2-normalised when the call asks for it), v, the log decay a (K channels) and b; S0 is the
/// start state (K x V, zero without initial_state).
struct HeadInputs {
  std::vector<std::vector<double>> q, k, v, a;
  std::vector<double> b;
  Matrix S0;
};

/// The pre-processed inputs of sequence n, value head hv (docs/kda-spec.md "Pre-processing"),
/// computed here from the spec, not by the reference's code.
inline HeadInputs head_inputs(const KdaProblem& p, const ForwardArgs& a, int64_t n, int64_t hv) {
  const auto& c = p.config;
  const int64_t H = c.heads, HV = c.value_heads, K = c.head_dim_k, V = c.head_dim_v;
  const int64_t h = hv / (HV / H);
  const auto starts = sequence_starts(p);
  const auto q_all = p.q.values(), k_all = p.k.values(), v_all = p.v.values(), g_all = p.g.values(),
             beta_all = p.beta.values();
  const auto a_log = p.A_log.values(), dt_bias = p.dt_bias.values(), init = p.initial_state.values();
  auto sigmoid = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  auto slice = [](const std::vector<double>& x, int64_t off, int64_t len) {
    return std::vector<double>(x.begin() + off, x.begin() + off + len);
  };

  HeadInputs in;
  const int64_t T = starts[size_t(n) + 1] - starts[size_t(n)];
  for (int64_t t = 0; t < T; ++t) {
    const int64_t tok = starts[size_t(n)] + t;
    auto q = slice(q_all, (tok * H + h) * K, K), k = slice(k_all, (tok * H + h) * K, K);
    if (a.use_qk_l2norm) {
      for (auto* x : {&q, &k}) {
        double ss = 0.0;
        for (double e : *x) ss += e * e;
        for (double& e : *x) e /= std::sqrt(ss + 1e-6);
      }
    }
    in.q.push_back(q);
    in.k.push_back(k);
    in.v.push_back(slice(v_all, (tok * HV + hv) * V, V));
    std::vector<double> la(static_cast<size_t>(K));
    const double rate = (a.A_log.defined() && a.gate != GateMode::PreGated) ? std::exp(a_log[size_t(hv)]) : 1.0;
    for (int64_t i = 0; i < K; ++i) {
      const double g = g_all[size_t((tok * HV + hv) * K + i)];
      const double x = g + (a.dt_bias.defined() ? dt_bias[size_t(hv * K + i)] : 0.0);
      double ai = g;
      if (a.gate == GateMode::SafeSigmoid) ai = a.lower_bound * sigmoid(rate * x);
      if (a.gate == GateMode::Softplus) ai = -rate * std::log1p(std::exp(x));
      la[size_t(i)] = ai;
    }
    in.a.push_back(la);
    const double beta = beta_all[size_t(tok * HV + hv)];
    in.b.push_back(a.use_beta_sigmoid ? (a.allow_neg_eigval ? 2.0 : 1.0) * sigmoid(beta) : beta);
  }

  in.S0 = zeros(K, V);
  if (a.initial_state.defined())
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < V; ++j)
        in.S0[size_t(i)][size_t(j)] = init[size_t((n * HV + hv) * K * V +
                                                  (a.state_layout == StateLayout::VFirst ? j * K + i : i * V + j))];
  return in;
}

/// final_state's values ([N, HV, V, K] or [N, HV, K, V]) in k-first order ([N, HV, K, V]).
inline std::vector<double> final_state_k_first(const KdaProblem& p) {
  std::vector<double> fin = p.final_state.values();
  if (p.config.state_layout != StateLayout::VFirst) return fin;
  const int64_t K = p.config.head_dim_k, V = p.config.head_dim_v;
  std::vector<double> kf(fin.size());
  for (size_t nh = 0; nh < fin.size() / size_t(K * V); ++nh)
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < V; ++j) kf[nh * size_t(K * V) + size_t(i * V + j)] = fin[nh * size_t(K * V) + size_t(j * K + i)];
  return kf;
}

}  // namespace flash_kda::testing
