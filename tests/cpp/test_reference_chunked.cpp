// The reference (token-by-token recurrence) against an independent evaluation of the spec:
// the "Chunked form" of docs/kda-spec.md in fp64, with its own pre-processing and (I + L)^-1
// applied by forward substitution. The two agree in exact arithmetic, so in fp64 they must
// agree to rounding (bound 1e-10 relative Frobenius, on out and on final_state).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "chunked_test_util.h"

namespace {

using flash_kda::DType;
using flash_kda::ForwardArgs;
using flash_kda::GateMode;
using flash_kda::StateLayout;
using flash_kda::testing::call_scale;
using flash_kda::testing::final_state_k_first;
using flash_kda::testing::head_inputs;
using flash_kda::testing::HeadInputs;
using flash_kda::testing::KdaConfig;
using flash_kda::testing::KdaProblem;
using flash_kda::testing::make_random_problem;
using flash_kda::testing::Matrix;
using flash_kda::testing::rel_frobenius;
using flash_kda::testing::sequence_starts;
using flash_kda::testing::zeros;

struct ChunkedResult {
  std::vector<double> out;          // [tokens, HV, V]
  std::vector<double> final_state;  // [N, HV, K, V] (S, k-first)
};

// The spec's chunked form for every (sequence, value head), chunk size C.
ChunkedResult chunked_forward(const KdaProblem& p, const ForwardArgs& a, int C) {
  const auto& c = p.config;
  const int64_t HV = c.value_heads, K = c.head_dim_k, V = c.head_dim_v, N = p.num_seqs();
  const double scale = call_scale(a, K);
  const std::vector<int64_t> starts = sequence_starts(p);

  ChunkedResult r;
  r.out.assign(size_t(p.total_tokens() * HV * V), 0.0);
  r.final_state.assign(size_t(N * HV * K * V), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t hv = 0; hv < HV; ++hv) {
      const int64_t T = starts[size_t(n) + 1] - starts[size_t(n)];
      // Pre-processed per-token inputs of this head, and the state S (K x V) at the chunk start.
      HeadInputs in = head_inputs(p, a, n, hv);
      const auto &q = in.q, &k = in.k, &la = in.a, &v = in.v;
      const auto& b = in.b;
      Matrix& S = in.S0;

      for (int64_t c0 = 0; c0 < T; c0 += C) {
        const int64_t L = std::min<int64_t>(C, T - c0);
        auto Gc = zeros(L, K), kd = zeros(L, K), qd = zeros(L, K), ki = zeros(L, K), kr = zeros(L, K);
        for (int64_t i = 0; i < L; ++i)
          for (int64_t d = 0; d < K; ++d)
            Gc[size_t(i)][size_t(d)] = (i ? Gc[size_t(i - 1)][size_t(d)] : 0.0) + la[size_t(c0 + i)][size_t(d)];
        for (int64_t i = 0; i < L; ++i)
          for (int64_t d = 0; d < K; ++d) {
            const double Gi = Gc[size_t(i)][size_t(d)], GC = Gc[size_t(L - 1)][size_t(d)];
            kd[size_t(i)][size_t(d)] = k[size_t(c0 + i)][size_t(d)] * std::exp(Gi);
            qd[size_t(i)][size_t(d)] = scale * q[size_t(c0 + i)][size_t(d)] * std::exp(Gi);
            ki[size_t(i)][size_t(d)] = k[size_t(c0 + i)][size_t(d)] * std::exp(-Gi);
            kr[size_t(i)][size_t(d)] = ki[size_t(i)][size_t(d)] * std::exp(GC);
          }
        auto dot = [&](const std::vector<double>& x, const std::vector<double>& y) {
          double s = 0.0;
          for (size_t d = 0; d < x.size(); ++d) s += x[d] * y[d];
          return s;
        };
        auto row_times_S = [&](const std::vector<double>& x) {  // x^T S, length V
          std::vector<double> y(size_t(V), 0.0);
          for (int64_t d = 0; d < K; ++d)
            for (int64_t j = 0; j < V; ++j) y[size_t(j)] += x[size_t(d)] * S[size_t(d)][size_t(j)];
          return y;
        };
        // U = (I + L)^-1 diag(b) (v - kd S), by forward substitution (L strictly lower).
        auto U = zeros(L, V);
        for (int64_t i = 0; i < L; ++i) {
          const auto kdS = row_times_S(kd[size_t(i)]);
          for (int64_t j = 0; j < V; ++j)
            U[size_t(i)][size_t(j)] = b[size_t(c0 + i)] * (v[size_t(c0 + i)][size_t(j)] - kdS[size_t(j)]);
          for (int64_t m = 0; m < i; ++m) {
            const double Lim = b[size_t(c0 + i)] * dot(kd[size_t(i)], ki[size_t(m)]);
            for (int64_t j = 0; j < V; ++j) U[size_t(i)][size_t(j)] -= Lim * U[size_t(m)][size_t(j)];
          }
        }
        // O = qd S + M U, M = lower_incl_diag(qd ki^T).
        for (int64_t i = 0; i < L; ++i) {
          auto o = row_times_S(qd[size_t(i)]);
          for (int64_t m = 0; m <= i; ++m) {
            const double Mim = dot(qd[size_t(i)], ki[size_t(m)]);
            for (int64_t j = 0; j < V; ++j) o[size_t(j)] += Mim * U[size_t(m)][size_t(j)];
          }
          const int64_t tok = starts[size_t(n)] + c0 + i;
          std::copy(o.begin(), o.end(), r.out.begin() + (tok * HV + hv) * V);
        }
        // S' = diag(exp(G_C)) S + kr^T U.
        for (int64_t d = 0; d < K; ++d)
          for (int64_t j = 0; j < V; ++j) {
            double s = std::exp(Gc[size_t(L - 1)][size_t(d)]) * S[size_t(d)][size_t(j)];
            for (int64_t m = 0; m < L; ++m) s += kr[size_t(m)][size_t(d)] * U[size_t(m)][size_t(j)];
            S[size_t(d)][size_t(j)] = s;
          }
      }
      for (int64_t i = 0; i < K; ++i)
        for (int64_t j = 0; j < V; ++j) r.final_state[size_t(((n * HV + hv) * K + i) * V + j)] = S[size_t(i)][size_t(j)];
    }
  }
  return r;
}

struct ChunkedCase {
  std::string name;
  KdaConfig config;
  bool l2norm = true;
  bool neg_eigval = false;
  double lower_bound = -5.0;
};

void PrintTo(const ChunkedCase& c, std::ostream* os) { *os << c.name; }

std::vector<ChunkedCase> chunked_cases() {
  std::vector<ChunkedCase> cases;
  KdaConfig base;
  base.batch = 2;
  base.seqlen = 37;  // two full 16-chunks and a partial one; five 7-chunks and a partial one
  base.state_dtype = DType::F64;
  base.state_layout = StateLayout::KFirst;

  ChunkedCase safe{"SafeSigmoid", base};
  cases.push_back(safe);

  ChunkedCase safe_bare{"SafeSigmoidNoALogNoBias", base};
  safe_bare.config.with_A_log = false;
  safe_bare.config.with_dt_bias = false;
  safe_bare.lower_bound = -1.5;
  safe_bare.config.seed = 2;
  cases.push_back(safe_bare);

  ChunkedCase softplus{"Softplus", base};
  softplus.config.gate = GateMode::Softplus;
  softplus.config.A_log_exp_max = 2.0;  // keeps exp(-G_i) over a 16-token chunk inside fp64
  softplus.config.seed = 3;
  cases.push_back(softplus);

  ChunkedCase pregated{"PreGatedRawBetaNoNorm", base};
  pregated.config.gate = GateMode::PreGated;
  pregated.config.beta_logits = false;
  pregated.config.qk_std = 0.3;  // |k| ~ 1 without the L2 norm keeps the delta rule contractive
  pregated.l2norm = false;
  pregated.config.state_layout = StateLayout::VFirst;
  pregated.config.seed = 4;
  cases.push_back(pregated);

  ChunkedCase neg{"SafeSigmoidNegEigvalVarlenGvaFp32", base};
  neg.neg_eigval = true;
  neg.config.seqlens = {17, 0, 1, 33, 5};
  neg.config.heads = 2;
  neg.config.value_heads = 6;
  neg.config.head_dim_k = 12;
  neg.config.head_dim_v = 6;
  neg.config.input_dtype = DType::F32;
  neg.config.state_layout = StateLayout::VFirst;
  neg.config.seed = 5;
  cases.push_back(neg);

  ChunkedCase softplus_noinit{"SoftplusNoInitialStateLargeK", base};
  softplus_noinit.config.gate = GateMode::Softplus;
  softplus_noinit.config.A_log_exp_max = 2.0;
  softplus_noinit.config.with_initial_state = false;
  softplus_noinit.config.head_dim_k = 32;
  softplus_noinit.config.head_dim_v = 24;
  softplus_noinit.config.seed = 6;
  cases.push_back(softplus_noinit);
  return cases;
}

class ReferenceVsChunked : public ::testing::TestWithParam<ChunkedCase> {};

TEST_P(ReferenceVsChunked, AgreesInFp64) {
  const ChunkedCase& tc = GetParam();
  KdaProblem p = make_random_problem(tc.config);
  ForwardArgs a = p.args();
  a.use_qk_l2norm = tc.l2norm;
  a.allow_neg_eigval = tc.neg_eigval;
  a.lower_bound = tc.lower_bound;
  flash_kda::reference_forward(a, 3);
  const auto out = p.out.values();
  // Final state in the k-first order chunked_forward produces.
  const std::vector<double> fin = final_state_k_first(p);
  for (int C : {16, 7}) {
    SCOPED_TRACE("chunk size " + std::to_string(C));
    const ChunkedResult ref = chunked_forward(p, a, C);
    const double out_err = rel_frobenius(out, ref.out), state_err = rel_frobenius(fin, ref.final_state);
    EXPECT_LT(out_err, 1e-10);
    EXPECT_LT(state_err, 1e-10);
    char note[96];
    std::snprintf(note, sizeof note, "C=%d out %.2e final_state %.2e", C, out_err, state_err);
    RecordProperty("rel_err_C" + std::to_string(C), note);
  }
}

INSTANTIATE_TEST_SUITE_P(GateModes, ReferenceVsChunked, ::testing::ValuesIn(chunked_cases()),
                         [](const ::testing::TestParamInfo<ChunkedCase>& info) { return info.param.name; });

}  // namespace
