// The exact CPU reference of the KDA backward (include/flash_kda/backward.h): the recurrence of
// docs/kda-spec.md differentiated token by token in reverse mode, in fp64. Its forward pass is
// the reference forward's token step (token_step.h); the reverse pass follows that step line by
// line, so that it is a yardstick independent of the chunked algebra the kernels use
// (src/sm90/backward/chunk_algebra.cuh).
//
// One token, S0 the state before it (K x V), d = exp(a), b the token's beta activation:
//   S1 = diag(d) S0;  u = S1^T k;  w = b (v - u);  S2 = S1 + k w^T;  o = scale S2^T q
// backward, dS2 the gradient of S2 from the later tokens plus the read of o:
//   dS2 += scale q do^T;  dq = scale S2 do
//   dk = dS2 w;  dw = dS2^T k;  db = dw . (v - u);  dv = b dw;  du = -b dw
//   dS1 = dS2 + k du^T;  dk += S1 du;  da_i = d_i sum_j dS1_ij S0_ij;  dS0 = diag(d) dS1
// then q, k through the L2 norm, a through the gate, b through the sigmoid (common/gate.h).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/gate.h"
#include "flash_kda/backward.h"
#include "host/backward_checks.h"
#include "host/problem.h"
#include "reference/element_io.h"
#include "reference/parallel.h"
#include "reference/token_step.h"

namespace flash_kda {
namespace {

using reference_detail::load_element;
using reference_detail::row_offset;
using reference_detail::state_offset;
using reference_detail::store_element;

/// What every (sequence, value head) task reads, and the private fp64 results it writes.
struct Job {
  const BackwardArgs* args = nullptr;
  ProblemShape p;
  int64_t group = 1;
  std::vector<int64_t> seq_start;  // [N + 1]
  std::vector<double> rate;        // [HV] exp(A_log), 1 without
  std::vector<double> bias;        // [HV * K] dt_bias, 0 without
  // Results per (flat token, value head): gradients of q_hat, k_hat (before the GVA sum and
  // the norm), of the log decay a and of b; dv final.
  std::vector<double> dq_hat, dk_hat, da, db, dv;
  std::vector<double> d_initial;  // [N, HV, K, V] k-first
};

void run_pair(Job& job, int64_t n, int64_t hv) {
  const BackwardArgs& a = *job.args;
  const ForwardArgs& f = a.forward;
  const ProblemShape& p = job.p;
  const int64_t HV = p.value_heads, K = p.head_dim_k, V = p.head_dim_v, h = hv / job.group;
  const int64_t first = job.seq_start[size_t(n)], len = job.seq_start[size_t(n + 1)] - first;
  const double scale = p.scale;

  // Every token's inputs and the state before it, from the forward pass: the reference
  // forward's own token step (token_step.h), its normalised q and k, decay and b kept.
  const size_t tk = static_cast<size_t>(len * K);
  std::vector<double> q(tk), k(tk), d(tk), v(static_cast<size_t>(len * V)), b(static_cast<size_t>(len));
  std::vector<double> states(size_t((len + 1) * K * V), 0.0);
  if (f.initial_state.defined())
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < V; ++j)
        states[size_t(i * V + j)] = load_element(f.initial_state, (n * HV + hv) * K * V + state_offset(f.state_layout, i, j, K, V));
  reference_detail::TokenInputs in(K, V);
  const reference_detail::StepFlags flags = reference_detail::step_flags(f, scale);
  std::vector<double> S(states.begin(), states.begin() + K * V), o(static_cast<size_t>(V));
  for (int64_t t = 0; t < len; ++t) {
    reference_detail::load_token(in, f, p, first + t, h, hv);
    reference_detail::token_step(S, in, flags, job.rate[size_t(hv)], &job.bias[size_t(hv * K)], o.data());
    std::copy(in.q.begin(), in.q.end(), q.begin() + t * K);
    std::copy(in.k.begin(), in.k.end(), k.begin() + t * K);
    std::copy(in.decay.begin(), in.decay.end(), d.begin() + t * K);
    std::copy(in.v.begin(), in.v.end(), v.begin() + t * V);
    b[size_t(t)] = in.b;
    std::copy(S.begin(), S.end(), states.begin() + (t + 1) * K * V);
  }
  std::vector<double> u(static_cast<size_t>(V)), w(static_cast<size_t>(V)), S1(static_cast<size_t>(K * V));

  // The reverse pass, dS the gradient of the state after token t.
  std::vector<double> dS(size_t(K * V), 0.0), dw(static_cast<size_t>(V)), du(static_cast<size_t>(V)), dout(static_cast<size_t>(V));
  if (a.d_final_state.defined())
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < V; ++j)
        dS[size_t(i * V + j)] = load_element(a.d_final_state, (n * HV + hv) * K * V + state_offset(f.state_layout, i, j, K, V));
  for (int64_t t = len - 1; t >= 0; --t) {
    const int64_t tok = first + t;
    const double* S0 = &states[size_t(t * K * V)];
    const double* S2 = &states[size_t((t + 1) * K * V)];
    const double* qt = &q[size_t(t * K)];
    const double* kt = &k[size_t(t * K)];
    const double* dt = &d[size_t(t * K)];
    const double bt = b[size_t(t)];
    std::fill(u.begin(), u.end(), 0.0);
    for (int64_t i = 0; i < K; ++i) {
      for (int64_t j = 0; j < V; ++j) {
        S1[size_t(i * V + j)] = dt[i] * S0[i * V + j];
        u[size_t(j)] += S1[size_t(i * V + j)] * kt[i];
      }
    }
    for (int64_t j = 0; j < V; ++j) w[size_t(j)] = bt * (v[size_t(t * V + j)] - u[size_t(j)]);
    const int64_t o_base = row_offset(a.d_out, p, tok, hv);
    for (int64_t j = 0; j < V; ++j) dout[size_t(j)] = load_element(a.d_out, o_base + j);

    const size_t at = size_t(tok * HV + hv);
    double* dq = &job.dq_hat[at * size_t(K)];
    double* dk = &job.dk_hat[at * size_t(K)];
    double* da = &job.da[at * size_t(K)];
    double* dv = &job.dv[at * size_t(V)];
    // o = scale S2^T q.
    for (int64_t i = 0; i < K; ++i) {
      double acc = 0.0;
      for (int64_t j = 0; j < V; ++j) {
        acc += S2[i * V + j] * dout[size_t(j)];
        dS[size_t(i * V + j)] += scale * qt[i] * dout[size_t(j)];
      }
      dq[i] = scale * acc;
    }
    // S2 = S1 + k w^T.
    std::fill(dw.begin(), dw.end(), 0.0);
    for (int64_t i = 0; i < K; ++i) {
      double acc = 0.0;
      for (int64_t j = 0; j < V; ++j) {
        acc += dS[size_t(i * V + j)] * w[size_t(j)];
        dw[size_t(j)] += dS[size_t(i * V + j)] * kt[i];
      }
      dk[i] = acc;
    }
    // w = b (v - u).
    double db = 0.0;
    for (int64_t j = 0; j < V; ++j) {
      db += dw[size_t(j)] * (v[size_t(t * V + j)] - u[size_t(j)]);
      dv[j] = bt * dw[size_t(j)];
      du[size_t(j)] = -bt * dw[size_t(j)];
    }
    job.db[at] = db;
    // u = S1^T k, S1 = diag(d) S0.
    for (int64_t i = 0; i < K; ++i) {
      double acc = 0.0, dd = 0.0;
      for (int64_t j = 0; j < V; ++j) {
        const double dS1 = dS[size_t(i * V + j)] + kt[i] * du[size_t(j)];
        acc += S1[size_t(i * V + j)] * du[size_t(j)];
        dd += dS1 * S0[i * V + j];
        dS[size_t(i * V + j)] = dt[i] * dS1;
      }
      dk[i] += acc;
      da[i] = dd * dt[i];
    }
  }
  std::copy(dS.begin(), dS.end(), job.d_initial.begin() + (n * HV + hv) * K * V);
}

void run_all(Job& job, int num_threads) {
  reference_detail::for_each_pair(job.p.num_seqs, job.p.value_heads, num_threads,
                                  [&](int64_t n, int64_t hv) { run_pair(job, n, hv); });
}

// dq (or dk) of one token and q/k head from the G value heads' gradients of x_hat, through the
// L2 norm when it is fused; written to `out` (contiguous like x).
void finish_key(const Job& job, const TensorView& x, const std::vector<double>& d_hat, const TensorView& out,
                int64_t tok, int64_t h) {
  const ProblemShape& p = job.p;
  const int64_t K = p.head_dim_k, HV = p.value_heads;
  std::vector<double> dx(size_t(K), 0.0), xh(static_cast<size_t>(K));
  for (int64_t gi = 0; gi < job.group; ++gi)
    for (int64_t i = 0; i < K; ++i) dx[size_t(i)] += d_hat[size_t((tok * HV + h * job.group + gi) * K + i)];
  const int64_t base = row_offset(x, p, tok, h);
  if (job.args->forward.use_qk_l2norm) {
    double ss = 0.0;
    for (int64_t i = 0; i < K; ++i) {
      xh[size_t(i)] = load_element(x, base + i);
      ss += xh[size_t(i)] * xh[size_t(i)];
    }
    const double inv = 1.0 / std::sqrt(ss + math::kL2NormEps);
    double dot = 0.0;
    for (int64_t i = 0; i < K; ++i) {
      xh[size_t(i)] *= inv;
      dot += xh[size_t(i)] * dx[size_t(i)];
    }
    for (int64_t i = 0; i < K; ++i) dx[size_t(i)] = math::l2norm_grad(dx[size_t(i)], xh[size_t(i)], dot, inv);
  }
  for (int64_t i = 0; i < K; ++i) store_element(out, (tok * p.heads + h) * K + i, dx[size_t(i)]);
}

}  // namespace

void reference_backward(const BackwardArgs& args, int num_threads) {
  if (num_threads < 0)
    throw Error("num_threads", "must be >= 0 (0 = one per hardware thread), got " + std::to_string(num_threads));
  const ProblemShape p = detail::check_backward(args, Target::CpuReference);
  const ForwardArgs& f = args.forward;
  const int64_t HV = p.value_heads, K = p.head_dim_k, V = p.head_dim_v, TT = p.batch * p.seqlen;

  Job job;
  job.args = &args;
  job.p = p;
  job.group = HV / p.heads;
  job.seq_start.resize(size_t(p.num_seqs + 1));
  for (int64_t n = 0; n <= p.num_seqs; ++n) job.seq_start[size_t(n)] = detail::host_seq_start(f, p, n);
  job.rate.assign(size_t(HV), 1.0);
  job.bias.assign(size_t(HV * K), 0.0);
  if (f.A_log.defined())
    for (int64_t hv = 0; hv < HV; ++hv) job.rate[size_t(hv)] = std::exp(load_element(f.A_log, hv));
  if (f.dt_bias.defined())
    for (int64_t i = 0; i < HV * K; ++i) job.bias[size_t(i)] = load_element(f.dt_bias, i);
  // Tokens of no sequence keep zero gradients.
  job.dq_hat.assign(size_t(TT * HV * K), 0.0);
  job.dk_hat.assign(size_t(TT * HV * K), 0.0);
  job.da.assign(size_t(TT * HV * K), 0.0);
  job.db.assign(size_t(TT * HV), 0.0);
  job.dv.assign(size_t(TT * HV * V), 0.0);
  job.d_initial.assign(size_t(p.num_seqs * HV * K * V), 0.0);
  run_all(job, num_threads);

  // Everything below only stores: nothing was written before the work succeeded.
  for (int64_t tok = 0; tok < TT; ++tok)
    for (int64_t h = 0; h < p.heads; ++h) {
      finish_key(job, f.q, job.dq_hat, args.dq, tok, h);
      finish_key(job, f.k, job.dk_hat, args.dk, tok, h);
    }
  for (int64_t i = 0; i < TT * HV * V; ++i) store_element(args.dv, i, job.dv[size_t(i)]);
  std::vector<double> dA_log(size_t(HV), 0.0), ddt_bias(size_t(HV * K), 0.0);
  for (int64_t tok = 0; tok < TT; ++tok)
    for (int64_t hv = 0; hv < HV; ++hv) {
      const int64_t row = tok * HV + hv;
      const int64_t g_base = row_offset(f.g, p, tok, hv);
      for (int64_t i = 0; i < K; ++i) {
        const double da = job.da[size_t(row * K + i)];
        double dg = da;
        if (f.gate != GateMode::PreGated) {
          const double x = load_element(f.g, g_base + i) + job.bias[size_t(hv * K + i)];
          const math::GateGrad<double> gg = f.gate == GateMode::SafeSigmoid
                                                ? math::safe_gate_grad<double>(x, job.rate[size_t(hv)], f.lower_bound)
                                                : math::softplus_gate_grad<double>(x, job.rate[size_t(hv)]);
          dg = da * gg.dx;
          ddt_bias[size_t(hv * K + i)] += dg;
          dA_log[size_t(hv)] += da * gg.dA_log;
        }
        store_element(args.dg, row * K + i, dg);
      }
      const double beta = load_element(f.beta, row_offset(f.beta, p, tok, hv));
      const double db = job.db[size_t(row)];
      store_element(args.dbeta, row, f.use_beta_sigmoid ? db * math::beta_sigmoid_grad<double>(beta, f.allow_neg_eigval) : db);
    }
  if (args.dA_log.defined())
    for (int64_t hv = 0; hv < HV; ++hv) store_element(args.dA_log, hv, dA_log[size_t(hv)]);
  if (args.ddt_bias.defined())
    for (int64_t i = 0; i < HV * K; ++i) store_element(args.ddt_bias, i, ddt_bias[size_t(i)]);
  if (args.d_initial_state.defined())
    for (int64_t n = 0; n < p.num_seqs; ++n)
      for (int64_t hv = 0; hv < HV; ++hv)
        for (int64_t i = 0; i < K; ++i)
          for (int64_t j = 0; j < V; ++j)
            store_element(args.d_initial_state, (n * HV + hv) * K * V + state_offset(f.state_layout, i, j, K, V),
                          job.d_initial[size_t(((n * HV + hv) * K + i) * V + j)]);
}

}  // namespace flash_kda
