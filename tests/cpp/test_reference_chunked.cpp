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

#include "reference_test_util.h"

namespace {

using flash_kda::DType;
using flash_kda::ForwardArgs;
using flash_kda::GateMode;
using flash_kda::StateLayout;
using flash_kda::testing::KdaConfig;
using flash_kda::testing::KdaProblem;
using flash_kda::testing::make_random_problem;
using flash_kda::testing::rel_frobenius;

struct ChunkedResult {
  std::vector<double> out;          // [tokens, HV, V]
  std::vector<double> final_state;  // [N, HV, K, V] (S, k-first)
};

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// The spec's chunked form for every (sequence, value head), chunk size C.
ChunkedResult chunked_forward(const KdaProblem& p, const ForwardArgs& a, int C) {
  const auto& c = p.config;
  const int64_t H = c.heads, HV = c.value_heads, K = c.head_dim_k, V = c.head_dim_v, N = p.num_seqs();
  const int64_t G_ratio = HV / H;
  const double scale = a.scale ? *a.scale : 1.0 / std::sqrt(double(K));
  const auto q_all = p.q.values(), k_all = p.k.values(), v_all = p.v.values(), g_all = p.g.values(),
             beta_all = p.beta.values();
  const auto a_log = p.A_log.values(), dt_bias = p.dt_bias.values(), init = p.initial_state.values();

  std::vector<int64_t> starts{0};
  for (int64_t n = 0; n < N; ++n)
    starts.push_back(starts.back() + (c.seqlens.empty() ? c.seqlen : c.seqlens[size_t(n)]));

  ChunkedResult r;
  r.out.assign(size_t(p.total_tokens() * HV * V), 0.0);
  r.final_state.assign(size_t(N * HV * K * V), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t hv = 0; hv < HV; ++hv) {
      const int64_t h = hv / G_ratio, T = starts[size_t(n) + 1] - starts[size_t(n)];
      // Pre-processed per-token inputs of this head.
      const size_t Ts = static_cast<size_t>(T);
      std::vector<std::vector<double>> q(Ts), k(Ts), la(Ts), v(Ts);
      std::vector<double> b(Ts);
      for (int64_t t = 0; t < T; ++t) {
        const int64_t tok = starts[size_t(n)] + t;
        auto slice = [&](const std::vector<double>& x, int64_t off, int64_t len) {
          return std::vector<double>(x.begin() + off, x.begin() + off + len);
        };
        q[size_t(t)] = slice(q_all, (tok * H + h) * K, K);
        k[size_t(t)] = slice(k_all, (tok * H + h) * K, K);
        v[size_t(t)] = slice(v_all, (tok * HV + hv) * V, V);
        if (a.use_qk_l2norm) {
          for (auto* x : {&q[size_t(t)], &k[size_t(t)]}) {
            double ss = 0.0;
            for (double e : *x) ss += e * e;
            for (double& e : *x) e /= std::sqrt(ss + 1e-6);
          }
        }
        la[size_t(t)].resize(size_t(K));
        const double rate = (a.A_log.defined() && a.gate != GateMode::PreGated) ? std::exp(a_log[size_t(hv)]) : 1.0;
        for (int64_t i = 0; i < K; ++i) {
          const double g = g_all[size_t((tok * HV + hv) * K + i)];
          const double x = g + (a.dt_bias.defined() ? dt_bias[size_t(hv * K + i)] : 0.0);
          double ai = g;
          if (a.gate == GateMode::SafeSigmoid) ai = a.lower_bound * sigmoid(rate * x);
          if (a.gate == GateMode::Softplus) ai = -rate * std::log1p(std::exp(x));
          la[size_t(t)][size_t(i)] = ai;
        }
        const double beta = beta_all[size_t(tok * HV + hv)];
        b[size_t(t)] = a.use_beta_sigmoid ? (a.allow_neg_eigval ? 2.0 : 1.0) * sigmoid(beta) : beta;
      }

      // State S (K x V) at the chunk start.
      std::vector<std::vector<double>> S(size_t(K), std::vector<double>(size_t(V), 0.0));
      if (a.initial_state.defined())
        for (int64_t i = 0; i < K; ++i)
          for (int64_t j = 0; j < V; ++j)
            S[size_t(i)][size_t(j)] = init[size_t((n * HV + hv) * K * V +
                                                  (a.state_layout == StateLayout::VFirst ? j * K + i : i * V + j))];

      for (int64_t c0 = 0; c0 < T; c0 += C) {
        const int64_t L = std::min<int64_t>(C, T - c0);
        auto mat = [](int64_t r, int64_t cols) {
          return std::vector<std::vector<double>>(size_t(r), std::vector<double>(size_t(cols), 0.0));
        };
        auto Gc = mat(L, K), kd = mat(L, K), qd = mat(L, K), ki = mat(L, K), kr = mat(L, K);
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
        auto U = mat(L, V);
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
  std::vector<double> fin = p.final_state.values();
  if (tc.config.state_layout == StateLayout::VFirst) {
    const int64_t K = tc.config.head_dim_k, V = tc.config.head_dim_v;
    std::vector<double> kf(fin.size());
    for (size_t nh = 0; nh < fin.size() / size_t(K * V); ++nh)
      for (int64_t i = 0; i < K; ++i)
        for (int64_t j = 0; j < V; ++j) kf[nh * size_t(K * V) + size_t(i * V + j)] = fin[nh * size_t(K * V) + size_t(j * K + i)];
    fin = kf;
  }
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
