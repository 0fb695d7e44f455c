// The chunk algebra of the backward kernels (src/sm90/backward/chunk_algebra.cuh), run on the
// CPU exactly as the kernels sequence it (the reverse dS chain over chunks, then every chunk's
// gradients from its start state and end-state gradient), against reference_backward (the
// token-level fp64 reverse mode). The call is chosen so that the finish step is the identity
// (pre-gated g = a, b = beta, no L2 norm, HV = H), so every gradient compared is the chunk
// algebra's own: dq_hat, dk_hat, dv, da, db and the start state's gradient. In double the two
// agree to rounding; in float (the kernels' precision) to ~1e-5.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "flash_kda/flash_kda.h"
#include "reference_test_util.h"
#include "sm90/backward/chunk_algebra.cuh"

namespace {

namespace bwd = flash_kda::sm90::bwd;
using flash_kda::DType;
using flash_kda::GateMode;
using flash_kda::StateLayout;
using flash_kda::testing::HostTensor;
using flash_kda::testing::KdaConfig;
using flash_kda::testing::KdaProblem;

/// The gradients the chunked backward produces, fp64 for the comparison: [T_total, HV, K]
/// (dq, dk, dg), [T_total, HV, V] (dv), [T_total, HV] (dbeta), [N, HV, K, V] k-first (dh0).
struct Grads {
  std::vector<double> dq, dk, dv, dg, dbeta, dh0;
};

template <class T, int K, int V>
Grads chunked_backward(KdaProblem& prob, const HostTensor& d_out, const HostTensor& d_final) {
  constexpr int C = bwd::kC;
  const KdaConfig& cfg = prob.config;
  const int64_t N = prob.num_seqs(), HV = cfg.value_heads, TT = prob.total_tokens();
  const int64_t seqlen = cfg.seqlens.empty() ? cfg.seqlen : TT;
  const bool k_first = cfg.state_layout == StateLayout::KFirst;
  std::vector<int64_t> start(size_t(N + 1), 0);
  for (int64_t n = 0; n < N; ++n)
    start[size_t(n + 1)] = start[size_t(n)] + (cfg.seqlens.empty() ? seqlen : cfg.seqlens[size_t(n)]);
  // Flat token tok, head hv, channel c of a contiguous [B, T, HV, D] tensor.
  auto at = [&](const HostTensor& t, int64_t tok, int64_t hv, int64_t c, int64_t D) {
    return t.get((tok * HV + hv) * D + c);
  };
  auto state_at = [&](const HostTensor& t, int64_t n, int64_t hv, int c, int v) {
    const int64_t base = (n * HV + hv) * K * V;
    return t.get(base + (k_first ? int64_t(c) * V + v : int64_t(v) * K + c));
  };

  Grads out;
  out.dq.assign(size_t(TT * HV * K), 0.0);
  out.dk = out.dq;
  out.dg = out.dq;
  out.dv.assign(size_t(TT * HV * V), 0.0);
  out.dbeta.assign(size_t(TT * HV), 0.0);
  out.dh0.assign(size_t(N * HV * K * V), 0.0);

  std::vector<T> q(C * K), k(C * K), G(C * K), X(C * V), dO(C * V), U(C * V), dR(C * V), dG(C * K);
  std::vector<T> A(C * C), M(C * C), dL(C * C), dM(C * C), b(C), S(K * V), dS(K * V);
  bwd::ChunkTiles<T, K, V> t{q.data(), k.data(), G.data(), X.data(), dO.data(), U.data(), dR.data(), dG.data(),
                             A.data(), M.data(), dL.data(), dM.data(), b.data(), S.data(), dS.data(), V,
                             T(1.0 / std::sqrt(double(K)))};
  const bwd::SerialCtx ctx;
  auto load = [&](int64_t tok0, int rows, int64_t hv) {
    for (int i = 0; i < C; ++i) {
      const bool real = i < rows;
      for (int c = 0; c < K; ++c) {
        q[size_t(i * K + c)] = real ? T(at(prob.q, tok0 + i, hv, c, K)) : T(0);
        k[size_t(i * K + c)] = real ? T(at(prob.k, tok0 + i, hv, c, K)) : T(0);
        G[size_t(i * K + c)] = real ? T(at(prob.g, tok0 + i, hv, c, K)) : T(0);
      }
      for (int v = 0; v < V; ++v) {
        dO[size_t(i * V + v)] = real ? T(at(d_out, tok0 + i, hv, v, V)) : T(0);
        X[size_t(i * V + v)] = real ? T(at(prob.v, tok0 + i, hv, v, V)) : T(0);
      }
      b[size_t(i)] = real ? T(prob.beta.get((tok0 + i) * HV + hv)) : T(0);
    }
  };

  for (int64_t n = 0; n < N; ++n)
    for (int64_t hv = 0; hv < HV; ++hv) {
      const int64_t len = start[size_t(n + 1)] - start[size_t(n)], chunks = (len + C - 1) / C;
      // The state before every chunk, by the token recurrence in fp64 (the forward recompute).
      std::vector<std::vector<double>> states;
      std::vector<double> s(size_t(K * V), 0.0);
      for (int c = 0; c < K; ++c)
        for (int v = 0; v < V; ++v)
          if (prob.initial_state.defined()) s[size_t(c * V + v)] = state_at(prob.initial_state, n, hv, c, v);
      for (int64_t tok = start[size_t(n)]; tok < start[size_t(n + 1)]; ++tok) {
        if ((tok - start[size_t(n)]) % C == 0) states.push_back(s);
        std::vector<double> u(static_cast<size_t>(V), 0.0);
        for (int c = 0; c < K; ++c)
          for (int v = 0; v < V; ++v) {
            s[size_t(c * V + v)] *= std::exp(at(prob.g, tok, hv, c, K));
            u[size_t(v)] += s[size_t(c * V + v)] * at(prob.k, tok, hv, c, K);
          }
        const double bt = prob.beta.get(tok * HV + hv);
        for (int c = 0; c < K; ++c)
          for (int v = 0; v < V; ++v)
            s[size_t(c * V + v)] += at(prob.k, tok, hv, c, K) * bt * (at(prob.v, tok, hv, v, V) - u[size_t(v)]);
      }
      // The chain: dS from d_final_state back through every chunk.
      for (int c = 0; c < K; ++c)
        for (int v = 0; v < V; ++v) dS[size_t(c * V + v)] = d_final.defined() ? T(state_at(d_final, n, hv, c, v)) : T(0);
      std::vector<std::vector<T>> dS_end(static_cast<size_t>(chunks));
      for (int64_t j = chunks - 1; j >= 0; --j) {
        const int rows = int(std::min<int64_t>(C, len - j * C));
        load(start[size_t(n)] + j * C, rows, hv);
        bwd::cumulate_gate(t, ctx);
        bwd::grams(t, ctx);
        bwd::grad_U(t, ctx);
        bwd::solve_dR(t, ctx);
        dS_end[size_t(j)] = dS;
        bwd::state_grad_step(t, ctx);
      }
      for (int64_t e = 0; e < K * V; ++e) out.dh0[size_t((n * HV + hv) * K * V + e)] = double(dS[size_t(e)]);
      // Every chunk's gradients.
      for (int64_t j = 0; j < chunks; ++j) {
        const int rows = int(std::min<int64_t>(C, len - j * C));
        const int64_t tok0 = start[size_t(n)] + j * C;
        load(tok0, rows, hv);
        for (int64_t e = 0; e < K * V; ++e) S[size_t(e)] = T(states[size_t(j)][size_t(e)]);
        dS = dS_end[size_t(j)];
        std::vector<T> dq(size_t(C * HV * K)), dk(size_t(C * HV * K)), da(size_t(C * HV * K)), db(size_t(C * HV));
        bwd::cumulate_gate(t, ctx);
        bwd::grams(t, ctx);
        bwd::state_residual(t, ctx);
        bwd::solve_U(t, ctx);
        bwd::grad_U(t, ctx);
        bwd::solve_dR(t, ctx);
        bwd::grad_pairs(t, ctx);
        bwd::grad_b(t, ctx, db.data(), HV, rows);
        bwd::grad_keys(t, ctx, dq.data(), dk.data(), HV * K, rows);
        bwd::grad_decay(t, ctx, da.data(), HV * K, rows);
        for (int i = 0; i < rows; ++i) {
          const int64_t tok = tok0 + i;
          for (int c = 0; c < K; ++c) {
            out.dq[size_t((tok * HV + hv) * K + c)] = double(dq[size_t(i * HV * K + c)]);
            out.dk[size_t((tok * HV + hv) * K + c)] = double(dk[size_t(i * HV * K + c)]);
            out.dg[size_t((tok * HV + hv) * K + c)] = double(da[size_t(i * HV * K + c)]);
          }
          for (int v = 0; v < V; ++v) out.dv[size_t((tok * HV + hv) * V + v)] = double(b[size_t(i)] * dR[size_t(i * V + v)]);
          out.dbeta[size_t(tok * HV + hv)] = double(db[size_t(i * HV)]);
        }
      }
    }
  return out;
}

template <class T, int K, int V>
void check_against_reference(KdaConfig cfg, double bound) {
  cfg.head_dim_k = K;
  cfg.head_dim_v = V;
  cfg.gate = GateMode::PreGated;
  cfg.beta_logits = false;
  cfg.heads = cfg.value_heads;
  cfg.input_dtype = DType::F32;
  cfg.state_dtype = DType::F32;
  cfg.qk_std = 0.5;  // |k|^2 b < 2 on average without the norm: a stable recurrence
  KdaProblem prob = flash_kda::testing::make_random_problem(cfg);
  std::mt19937_64 rng(3);
  std::normal_distribution<double> nd(0.0, 1.0);
  auto random = [&](const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    std::vector<double> v(static_cast<size_t>(n));
    for (auto& e : v) e = nd(rng);
    return HostTensor::from_values(v, DType::F32, shape);
  };
  HostTensor d_out = random(prob.out.shape());
  HostTensor d_final = prob.final_state.defined() ? random(prob.final_state.shape()) : HostTensor{};

  flash_kda::ForwardArgs forward = prob.args();
  forward.use_qk_l2norm = false;
  flash_kda::testing::Fp64Gradients want(prob);  // pre-gated: no A_log or dt_bias, so no dA_log or ddt_bias
  flash_kda::reference_backward(want.args(forward, d_out, d_final), 2);

  const Grads got = chunked_backward<T, K, V>(prob, d_out, d_final);
  auto rel = [](const std::vector<double>& x, const std::vector<double>& ref) {
    for (double e : x) EXPECT_TRUE(std::isfinite(e));
    return flash_kda::testing::rel_frobenius(x, ref);
  };
  EXPECT_LE(rel(got.dq, want.dq.values()), bound) << "dq";
  EXPECT_LE(rel(got.dk, want.dk.values()), bound) << "dk";
  EXPECT_LE(rel(got.dv, want.dv.values()), bound) << "dv";
  EXPECT_LE(rel(got.dg, want.dg.values()), bound) << "dg (= da)";
  EXPECT_LE(rel(got.dbeta, want.dbeta.values()), bound) << "dbeta (= db)";
  if (want.d_initial_state.defined()) {
    // The reference stores d_initial_state in the call's layout; got.dh0 is k-first.
    std::vector<double> ref_dh0 = want.d_initial_state.values(), mine(ref_dh0.size());
    const int64_t pairs = int64_t(ref_dh0.size()) / (K * V);
    for (int64_t pi = 0; pi < pairs; ++pi)
      for (int c = 0; c < K; ++c)
        for (int v = 0; v < V; ++v) {
          const int64_t e = cfg.state_layout == StateLayout::KFirst ? int64_t(c) * V + v : int64_t(v) * K + c;
          mine[size_t(pi * K * V + e)] = got.dh0[size_t(pi * K * V + c * V + v)];
        }
    EXPECT_LE(rel(mine, ref_dh0), bound) << "d_initial_state";
  }
}

KdaConfig base() {
  KdaConfig c;
  c.batch = 2;
  c.seqlen = 37;  // two full chunks and a short one
  c.value_heads = 2;
  c.pregated_min = -1.0;
  return c;
}

TEST(BackwardChunkAlgebra, DoubleMatchesTheReference) { check_against_reference<double, 8, 8>(base(), 1e-10); }

TEST(BackwardChunkAlgebra, FloatMatchesTheReference) { check_against_reference<float, 8, 8>(base(), 2e-5); }

TEST(BackwardChunkAlgebra, VarlenWithEmptyAndShortSequences) {
  KdaConfig c = base();
  c.seqlens = {17, 0, 33, 16, 5, 0};
  c.state_layout = StateLayout::KFirst;
  check_against_reference<double, 8, 4>(c, 1e-10);
  check_against_reference<float, 8, 4>(c, 2e-5);
}

TEST(BackwardChunkAlgebra, StrongDecaysStayFinite) {
  KdaConfig c = base();
  c.pregated_min = -40.0;  // G over a chunk down to -640 nats: exp(-G) would overflow
  check_against_reference<float, 8, 8>(c, 2e-5);
  check_against_reference<double, 8, 8>(c, 1e-10);
}

TEST(BackwardChunkAlgebra, NoStatesAndKernelSizedHeads) {
  KdaConfig c = base();
  c.batch = 1;
  c.seqlen = 20;
  c.value_heads = 1;
  c.with_initial_state = false;
  c.with_final_state = false;
  check_against_reference<float, 128, 128>(c, 2e-5);
}

}  // namespace
