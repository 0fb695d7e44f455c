// docs/kda-spec.md "Record form" in fp64, against reference_forward (the token-by-token
// recurrence). Every chunk's record (Av, W, Qd, M, kr, gC) is built as the section defines it,
// from 16-token chunks padded with zero tokens, A by the 2 x 2 blocked inverse of 8 x 8 blocks
// as stage 1 computes it. The record-form step then runs over each sequence both ways: on S, and
// on X = S^T as stage 2 does. The segment maps P, Q are composed by a scan. Everything agrees
// with the recurrence in exact arithmetic, so in fp64 the bound is 1e-10 relative Frobenius on
// out and final_state. Each record field, perturbed in one chunk, must miss by far more.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "chunked_test_util.h"

namespace {

using flash_kda::DType;
using flash_kda::ForwardArgs;
using flash_kda::testing::call_scale;
using flash_kda::testing::final_state_k_first;
using flash_kda::testing::head_inputs;
using flash_kda::testing::HeadInputs;
using flash_kda::testing::KdaConfig;
using flash_kda::testing::KdaProblem;
using flash_kda::testing::make_random_problem;
using flash_kda::testing::Matrix;
using flash_kda::testing::rel_frobenius;
using flash_kda::testing::round_to_bf16;
using flash_kda::testing::sequence_starts;
using flash_kda::testing::zeros;

constexpr int kC = 16;  // the record form's chunk (src/sm90/params.h kChunk)

int64_t rows(const Matrix& m) { return int64_t(m.size()); }
int64_t cols(const Matrix& m) { return m.empty() ? 0 : int64_t(m[0].size()); }

Matrix mul(const Matrix& x, const Matrix& y) {
  Matrix z = zeros(rows(x), cols(y));
  for (int64_t i = 0; i < rows(x); ++i)
    for (int64_t m = 0; m < cols(x); ++m)
      for (int64_t j = 0; j < cols(y); ++j) z[size_t(i)][size_t(j)] += x[size_t(i)][size_t(m)] * y[size_t(m)][size_t(j)];
  return z;
}
Matrix tr(const Matrix& x) {
  Matrix z = zeros(cols(x), rows(x));
  for (int64_t i = 0; i < rows(x); ++i)
    for (int64_t j = 0; j < cols(x); ++j) z[size_t(j)][size_t(i)] = x[size_t(i)][size_t(j)];
  return z;
}
// x + s y
Matrix axpy(const Matrix& x, double s, const Matrix& y) {
  Matrix z = x;
  for (int64_t i = 0; i < rows(x); ++i)
    for (int64_t j = 0; j < cols(x); ++j) z[size_t(i)][size_t(j)] += s * y[size_t(i)][size_t(j)];
  return z;
}
Matrix identity(int64_t n) {
  Matrix z = zeros(n, n);
  for (int64_t i = 0; i < n; ++i) z[size_t(i)][size_t(i)] = 1.0;
  return z;
}
double dot(const std::vector<double>& x, const std::vector<double>& y) {
  double s = 0.0;
  for (size_t d = 0; d < x.size(); ++d) s += x[d] * y[d];
  return s;
}
std::vector<double> flat(const Matrix& m) {
  std::vector<double> f;
  for (const auto& r : m) f.insert(f.end(), r.begin(), r.end());
  return f;
}

// One chunk's record (docs/kda-spec.md "Record form"), and its L, which the record does not hold.
struct Record {
  Matrix Av, W, Qd, M, kr;  // C x C, C x K, C x K, C x C, C x K
  std::vector<double> gC;   // K
  Matrix L;                 // C x C, for the checks of A
};

// (I + L)^-1 as stage 1 computes it: [[A11, 0], [-A22 L21 A11, A22]], the diagonal blocks
// (I + L11)^-1 and (I + L22)^-1 by forward substitution, column by column.
Matrix blocked_inverse(const Matrix& L) {
  constexpr int h = kC / 2;
  auto diagonal_block_inverse = [&](int o) {
    Matrix X = zeros(h, h);
    for (int j = 0; j < h; ++j) {
      std::vector<double> x(h, 0.0);
      x[size_t(j)] = 1.0;
      for (int m = 0; m < h; ++m)
        for (int i = m + 1; i < h; ++i) x[size_t(i)] -= L[size_t(o + i)][size_t(o + m)] * x[size_t(m)];
      for (int i = 0; i < h; ++i) X[size_t(i)][size_t(j)] = x[size_t(i)];
    }
    return X;
  };
  const Matrix A11 = diagonal_block_inverse(0), A22 = diagonal_block_inverse(h);
  Matrix L21 = zeros(h, h);
  for (int i = 0; i < h; ++i)
    for (int j = 0; j < h; ++j) L21[size_t(i)][size_t(j)] = L[size_t(h + i)][size_t(j)];
  const Matrix Z = mul(A22, mul(L21, A11));
  Matrix A = zeros(kC, kC);
  for (int i = 0; i < h; ++i)
    for (int j = 0; j < h; ++j) {
      A[size_t(i)][size_t(j)] = A11[size_t(i)][size_t(j)];
      A[size_t(h + i)][size_t(h + j)] = A22[size_t(i)][size_t(j)];
      A[size_t(h + i)][size_t(j)] = -Z[size_t(i)][size_t(j)];
    }
  return A;
}

// The chunked form's Neumann product (I - L)(I + L^2)(I + L^4)(I + L^8) (L^16 = 0).
Matrix neumann_inverse(const Matrix& L) {
  const Matrix I = identity(kC);
  Matrix A = axpy(I, -1.0, L), P = L;
  for (int e = 0; e < 3; ++e) {
    P = mul(P, P);
    A = mul(A, axpy(I, 1.0, P));
  }
  return A;
}

// The chunk starting at token c0 of one head, padded to kC tokens with k = q = 0, b = 0, a = 0.
Record make_record(const HeadInputs& in, int64_t c0, double scale) {
  const int64_t T = rows(in.q), K = int64_t(in.q.empty() ? 0 : in.q[0].size());
  auto padded = [&](const std::vector<std::vector<double>>& x, int64_t t) {
    return c0 + t < T ? x[size_t(c0 + t)] : std::vector<double>(size_t(K), 0.0);
  };
  Matrix G = zeros(kC, K), kn = zeros(kC, K), qn = zeros(kC, K);
  std::vector<double> b(kC, 0.0);
  for (int t = 0; t < kC; ++t) {
    kn[size_t(t)] = padded(in.k, t);
    qn[size_t(t)] = padded(in.q, t);
    b[size_t(t)] = c0 + t < T ? in.b[size_t(c0 + t)] : 0.0;
    const auto a = padded(in.a, t);
    for (int64_t d = 0; d < K; ++d) G[size_t(t)][size_t(d)] = (t ? G[size_t(t - 1)][size_t(d)] : 0.0) + a[size_t(d)];
  }
  const std::vector<double>& GC = G[kC - 1];
  Matrix kd = zeros(kC, K), ki = zeros(kC, K);
  Record r;
  r.Qd = zeros(kC, K);
  r.kr = zeros(kC, K);
  for (int t = 0; t < kC; ++t)
    for (int64_t d = 0; d < K; ++d) {
      const double e = std::exp(G[size_t(t)][size_t(d)]);
      kd[size_t(t)][size_t(d)] = kn[size_t(t)][size_t(d)] * e;
      ki[size_t(t)][size_t(d)] = kn[size_t(t)][size_t(d)] / e;
      r.Qd[size_t(t)][size_t(d)] = scale * qn[size_t(t)][size_t(d)] * e;  // qd
      r.kr[size_t(t)][size_t(d)] = kn[size_t(t)][size_t(d)] * std::exp(GC[size_t(d)] - G[size_t(t)][size_t(d)]);
    }
  r.L = zeros(kC, kC);
  r.M = zeros(kC, kC);
  for (int i = 0; i < kC; ++i)
    for (int j = 0; j <= i; ++j) {
      if (j < i) r.L[size_t(i)][size_t(j)] = b[size_t(i)] * dot(kd[size_t(i)], ki[size_t(j)]);
      r.M[size_t(i)][size_t(j)] = dot(r.Qd[size_t(i)], ki[size_t(j)]);
    }
  r.Av = blocked_inverse(r.L);
  for (int i = 0; i < kC; ++i)
    for (int j = 0; j < kC; ++j) r.Av[size_t(i)][size_t(j)] *= b[size_t(j)];
  r.W = mul(r.Av, kd);
  for (int64_t d = 0; d < K; ++d) r.gC.push_back(std::exp(GC[size_t(d)]));
  return r;
}

// v rows of the chunk at c0, padded with zero rows (as stage 2 zero-fills them).
Matrix chunk_v(const HeadInputs& in, int64_t c0, int64_t V) {
  Matrix v = zeros(kC, V);
  for (int t = 0; t < kC && c0 + t < rows(in.v); ++t) v[size_t(t)] = in.v[size_t(c0 + t)];
  return v;
}

// One record-form step on S (K x n): U = Av v - W S, O = Qd S + M U, S' = diag(gC) S + kr^T U.
// An empty v means U0 = 0 (the P map). Returns O.
Matrix step(const Record& r, const Matrix& v, Matrix& S) {
  const Matrix WS = mul(r.W, S);
  const Matrix U = v.empty() ? axpy(zeros(kC, cols(S)), -1.0, WS) : axpy(mul(r.Av, v), -1.0, WS);
  const Matrix O = axpy(mul(r.Qd, S), 1.0, mul(r.M, U));
  for (int64_t d = 0; d < rows(S); ++d)
    for (auto& x : S[size_t(d)]) x *= r.gC[size_t(d)];
  S = axpy(S, 1.0, mul(tr(r.kr), U));
  return O;
}

// The same step transposed, as stage 2 runs it on X = S^T (n x K): U^T = v^T Av^T - X W^T,
// O^T = X Qd^T + U^T M^T, X <- X diag(gC) + U^T kr. Returns O^T.
Matrix step_transposed(const Record& r, const Matrix& vT, Matrix& X) {
  const Matrix UT = axpy(mul(vT, tr(r.Av)), -1.0, mul(X, tr(r.W)));
  const Matrix OT = axpy(mul(X, tr(r.Qd)), 1.0, mul(UT, tr(r.M)));
  for (auto& row : X)
    for (size_t d = 0; d < row.size(); ++d) row[d] *= r.gC[d];
  X = axpy(X, 1.0, mul(UT, r.kr));
  return OT;
}

// Every (sequence, value head) of a problem with its records and inputs.
struct Head {
  int64_t n, hv, begin;
  HeadInputs in;
  std::vector<Record> records;
};

std::vector<Head> build_heads(const KdaProblem& p, const ForwardArgs& a) {
  const auto& c = p.config;
  const auto starts = sequence_starts(p);
  std::vector<Head> heads;
  for (int64_t n = 0; n < p.num_seqs(); ++n)
    for (int64_t hv = 0; hv < c.value_heads; ++hv) {
      Head h{n, hv, starts[size_t(n)], head_inputs(p, a, n, hv), {}};
      for (int64_t c0 = 0; c0 < rows(h.in.q); c0 += kC) h.records.push_back(make_record(h.in, c0, call_scale(a, c.head_dim_k)));
      heads.push_back(std::move(h));
    }
  return heads;
}

// out ([tokens, HV, V]) and final state ([N, HV, K, V], k-first) of a record-form evaluation.
struct Result {
  std::vector<double> out, state;
};

Result empty_result(const KdaProblem& p) {
  const auto& c = p.config;
  return {std::vector<double>(size_t(p.total_tokens() * c.value_heads * c.head_dim_v), 0.0),
          std::vector<double>(size_t(p.num_seqs() * c.value_heads * c.head_dim_k * c.head_dim_v), 0.0)};
}

// Stores O rows (token t of chunk c0, valid tokens only) and a final state S (K x V) of head h.
void put_out(Result& res, const KdaProblem& p, const Head& h, int64_t c0, const Matrix& O) {
  const int64_t HV = p.config.value_heads, V = p.config.head_dim_v;
  for (int64_t t = 0; t < kC && c0 + t < rows(h.in.q); ++t)
    std::copy(O[size_t(t)].begin(), O[size_t(t)].end(), res.out.begin() + ((h.begin + c0 + t) * HV + h.hv) * V);
}
void put_state(Result& res, const KdaProblem& p, const Head& h, const Matrix& S) {
  const auto f = flat(S);
  std::copy(f.begin(), f.end(), res.state.begin() + (h.n * p.config.value_heads + h.hv) * int64_t(f.size()));
}

// The record-form recurrence over every head: on S, or (transposed) on X = S^T.
Result run(const KdaProblem& p, const std::vector<Head>& heads, bool transposed) {
  Result res = empty_result(p);
  const int64_t V = p.config.head_dim_v;
  for (const Head& h : heads) {
    Matrix S = h.in.S0, X = tr(h.in.S0);
    for (size_t c = 0; c < h.records.size(); ++c) {
      const int64_t c0 = int64_t(c) * kC;
      const Matrix v = chunk_v(h.in, c0, V);
      put_out(res, p, h, c0, transposed ? tr(step_transposed(h.records[c], tr(v), X)) : step(h.records[c], v, S));
    }
    put_state(res, p, h, transposed ? tr(X) : S);
  }
  return res;
}

struct RecordCase {
  std::string name;
  KdaConfig config;
};

void PrintTo(const RecordCase& c, std::ostream* os) { *os << c.name; }

std::vector<RecordCase> record_cases() {
  KdaConfig base;  // safe gate with A_log and dt_bias, bf16 inputs, the kernels' v-first state
  base.state_dtype = DType::F64;
  base.head_dim_k = 32;
  base.head_dim_v = 16;
  std::vector<RecordCase> cases;

  RecordCase fixed{"FixedPartialLastChunkInitialState", base};
  fixed.config.batch = 2;
  fixed.config.seqlen = 37;  // chunks of 16, 16 and 5 tokens
  cases.push_back(fixed);

  RecordCase varlen{"VarlenEmptySequenceGva", base};
  varlen.config.seqlens = {17, 0, 1, 48, 33};  // an empty sequence; 48 ends on a chunk boundary
  varlen.config.heads = 2;
  varlen.config.value_heads = 6;  // GVA: value heads 3h..3h+2 read q/k head h
  varlen.config.seed = 2;
  cases.push_back(varlen);

  RecordCase longer{"LongNoInitialState", base};
  longer.config.batch = 1;
  longer.config.seqlen = 100;  // six full chunks and one of 4 tokens
  longer.config.heads = longer.config.value_heads = 1;
  longer.config.with_initial_state = false;
  longer.config.seed = 3;
  cases.push_back(longer);

  RecordCase kernel{"KernelHeadDims", base};  // K = V = 128, the sm_90a kernels' sizes
  kernel.config.batch = 1;
  kernel.config.seqlen = 40;
  kernel.config.heads = kernel.config.value_heads = 1;
  kernel.config.head_dim_k = kernel.config.head_dim_v = 128;
  kernel.config.seed = 4;
  cases.push_back(kernel);
  return cases;
}

class RecordForm : public ::testing::TestWithParam<RecordCase> {
 protected:
  void SetUp() override {
    p_ = make_random_problem(GetParam().config);
    args_ = p_.args();
    flash_kda::reference_forward(args_, 2);
    ref_out_ = p_.out.values();
    ref_state_ = final_state_k_first(p_);
    heads_ = build_heads(p_, args_);
  }
  // out and final state within 1e-10 of the reference; the errors go to the XML as `key`.
  void expect_close(const Result& r, const std::string& key) {
    const double out_err = rel_frobenius(r.out, ref_out_), state_err = rel_frobenius(r.state, ref_state_);
    EXPECT_LT(out_err, 1e-10) << key;
    EXPECT_LT(state_err, 1e-10) << key;
    char note[96];
    std::snprintf(note, sizeof note, "out %.2e final_state %.2e", out_err, state_err);
    RecordProperty(key, note);
  }
  KdaProblem p_;
  ForwardArgs args_;
  std::vector<double> ref_out_, ref_state_;
  std::vector<Head> heads_;
};

TEST_P(RecordForm, RecurrenceMatchesReference) {
  expect_close(run(p_, heads_, false), "rel_err_S");
  expect_close(run(p_, heads_, true), "rel_err_X");
}

TEST_P(RecordForm, BlockedInverseIsTheNeumannProduct) {
  for (const Head& h : heads_)
    for (const Record& r : h.records) {
      const Matrix A = blocked_inverse(r.L);
      const Matrix IL = axpy(identity(kC), 1.0, r.L);
      EXPECT_LT(rel_frobenius(flat(mul(IL, A)), flat(identity(kC))), 1e-14);
      EXPECT_LT(rel_frobenius(flat(A), flat(neumann_inverse(r.L))), 1e-14);
    }
}

// U0 = Av v with Av as bf16 hi + lo (what stage 2 multiplies) is ~2^-16 relative; with bf16 Av
// alone, ~2^-8 (docs/kda-spec.md "Why Av is stored as hi + lo"). v is bf16 in every case.
TEST_P(RecordForm, AvHiLoKeepsU0NearFp32) {
  std::vector<double> exact, hi_lo, hi_only;
  for (const Head& h : heads_)
    for (size_t c = 0; c < h.records.size(); ++c) {
      Matrix hi = h.records[c].Av, lo = hi;
      for (int i = 0; i < kC; ++i)
        for (int j = 0; j < kC; ++j) {
          const double x = float(h.records[c].Av[size_t(i)][size_t(j)]);  // the fp32 Av of stage 1
          hi[size_t(i)][size_t(j)] = round_to_bf16(float(x));
          lo[size_t(i)][size_t(j)] = round_to_bf16(float(x - hi[size_t(i)][size_t(j)]));
        }
      const Matrix v = chunk_v(h.in, int64_t(c) * kC, p_.config.head_dim_v);
      const auto e = flat(mul(h.records[c].Av, v)), a = flat(mul(hi, v)), s = flat(axpy(mul(hi, v), 1.0, mul(lo, v)));
      exact.insert(exact.end(), e.begin(), e.end());
      hi_only.insert(hi_only.end(), a.begin(), a.end());
      hi_lo.insert(hi_lo.end(), s.begin(), s.end());
    }
  const double err_hi_lo = rel_frobenius(hi_lo, exact), err_hi = rel_frobenius(hi_only, exact);
  EXPECT_LT(err_hi_lo, std::ldexp(1.0, -16));
  EXPECT_GT(err_hi, std::ldexp(1.0, -11));
  EXPECT_LT(err_hi, std::ldexp(1.0, -8));
  char note[64];
  std::snprintf(note, sizeof note, "hi+lo %.2e, hi only %.2e", err_hi_lo, err_hi);
  RecordProperty("U0_rel_err", note);
}

// S_end = P S_start + Q per segment (P = product of diag(gC) - kr^T W, also the step from S = I
// with U0 = 0; Q the step from S = 0), the segments' start states by the scan
// S_{j+1} = P_j S_j + Q_j, and each segment run again from its start state for O. The maps of the
// whole sequence, composed segment by segment, give the final state too.
TEST_P(RecordForm, SegmentMapsCompose) {
  const int64_t K = p_.config.head_dim_k, V = p_.config.head_dim_v;
  for (int64_t seg_len : {1, 2, 3}) {
    SCOPED_TRACE("segments of " + std::to_string(seg_len) + " chunks");
    Result scanned = empty_result(p_), composed = empty_result(p_);
    for (const Head& h : heads_) {
      const int64_t chunks = int64_t(h.records.size());
      Matrix S = h.in.S0, P_all = identity(K), Q_all = zeros(K, V);
      for (int64_t c_begin = 0; c_begin < chunks; c_begin += seg_len) {
        const int64_t c_end = std::min(chunks, c_begin + seg_len);
        Matrix P = identity(K), P_by_step = identity(K), Q = zeros(K, V);
        for (int64_t c = c_begin; c < c_end; ++c) {
          const Record& r = h.records[size_t(c)];
          Matrix Pc = axpy(zeros(K, K), -1.0, mul(tr(r.kr), r.W));
          for (int64_t d = 0; d < K; ++d) Pc[size_t(d)][size_t(d)] += r.gC[size_t(d)];
          P = mul(Pc, P);
          step(r, Matrix{}, P_by_step);
          step(r, chunk_v(h.in, c * kC, V), Q);
        }
        EXPECT_LT(rel_frobenius(flat(P_by_step), flat(P)), 1e-12);
        // The finishing pass: this segment from its true start state S (the scan's S_j).
        Matrix S_run = S;
        for (int64_t c = c_begin; c < c_end; ++c)
          put_out(scanned, p_, h, c * kC, step(h.records[size_t(c)], chunk_v(h.in, c * kC, V), S_run));
        S = axpy(mul(P, S), 1.0, Q);  // the scan's S_{j+1}
        EXPECT_LT(rel_frobenius(flat(S), flat(S_run)), 1e-12);
        Q_all = axpy(mul(P, Q_all), 1.0, Q);  // (P, Q) of segments 0..j
        P_all = mul(P, P_all);
      }
      put_state(scanned, p_, h, S);
      put_state(composed, p_, h, axpy(mul(P_all, h.in.S0), 1.0, Q_all));
    }
    expect_close(scanned, "rel_err_scan_" + std::to_string(seg_len));
    EXPECT_LT(rel_frobenius(composed.state, ref_state_), 1e-10);
  }
}

// Each record field changed by 1e-3 in one entry of one chunk must move out or final_state far
// past the 1e-10 bound, so the comparison above can fail. The chunk is head 0's last (token 0):
// the state entering it is not zero, and no later decay hides the change.
TEST_P(RecordForm, PerturbedRecordMisses) {
  const std::vector<std::pair<std::string, std::function<void(Record&)>>> perturbations = {
      {"Av", [](Record& r) { r.Av[0][0] += 1e-3; }},
      {"W", [](Record& r) { r.W[0][0] += 1e-3; }},
      {"Qd", [](Record& r) { r.Qd[0][0] += 1e-3; }},
      {"M", [](Record& r) { r.M[0][0] += 1e-3; }},
      {"kr", [](Record& r) { r.kr[0][0] += 1e-3; }},
      {"gC", [](Record& r) { r.gC[0] += 1e-3; }},
  };
  ASSERT_GE(heads_[0].records.size(), 2u);
  for (const auto& [field, perturb] : perturbations) {
    std::vector<Head> heads = heads_;
    perturb(heads[0].records.back());
    const Result r = run(p_, heads, true);
    const double err = std::max(rel_frobenius(r.out, ref_out_), rel_frobenius(r.state, ref_state_));
    EXPECT_GT(err, 1e-7) << field;
    char note[32];
    std::snprintf(note, sizeof note, "%.2e", err);
    RecordProperty("perturbed_" + field, note);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, RecordForm, ::testing::ValuesIn(record_cases()),
                         [](const ::testing::TestParamInfo<RecordCase>& info) { return info.param.name; });

}  // namespace
