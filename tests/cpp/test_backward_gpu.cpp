// flash_kda::backward on an sm_90 GPU against flash_kda::reference_backward (fp64 reverse mode of
// the token recurrence) on the same bf16 inputs: relative Frobenius error of every gradient
// <= 2e-2 (bf16 dq, dk, dv round at ~4e-3). Skips itself without an sm_90 GPU. Also checks
// that two runs give the same bits (the backward is deterministic).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "flash_kda/flash_kda.h"
#include "gpu_test_util.h"
#include "reference_test_util.h"

#if FLASH_KDA_WITH_CUDA
#include <cuda_runtime.h>

namespace {

using flash_kda::BackwardArgs;
using flash_kda::DType;
using flash_kda::GateMode;
using flash_kda::StateLayout;
using flash_kda::testing::DeviceTensor;
using flash_kda::testing::HostTensor;
using flash_kda::testing::KdaConfig;

constexpr double kBound = 2e-2;

struct Case {
  std::string name;
  KdaConfig config;
  DType d_out_dtype = DType::BF16;
  bool l2norm = true;
  bool neg_eigval = false;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class BackwardGpu : public ::testing::TestWithParam<Case> {};

HostTensor random_tensor(DType dtype, const std::vector<int64_t>& shape, uint64_t seed, double sd) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n(0.0, sd);
  int64_t count = 1;
  for (int64_t s : shape) count *= s;
  std::vector<double> v(static_cast<size_t>(count));
  for (auto& e : v) e = n(rng);
  return HostTensor::from_values(v, dtype, shape);
}

TEST_P(BackwardGpu, MatchesReference) {
  const std::string why = flash_kda::testing::gpu_skip_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  const Case& tc = GetParam();
  KdaConfig cfg = tc.config;
  cfg.head_dim_k = cfg.head_dim_v = 128;
  cfg.input_dtype = DType::BF16;
  auto prob = flash_kda::testing::make_random_problem(cfg);
  HostTensor d_out = random_tensor(tc.d_out_dtype, prob.out.shape(), 11, 1.0);
  HostTensor d_final = prob.final_state.defined() ? random_tensor(prob.final_state.dtype(), prob.final_state.shape(), 12, 1.0)
                                                  : HostTensor{};

  // The reference: fp64 gradients.
  auto f64_like = [](HostTensor& t) { return t.defined() ? HostTensor(DType::F64, t.shape()) : HostTensor{}; };
  HostTensor r_dq = f64_like(prob.q), r_dk = f64_like(prob.k), r_dv = f64_like(prob.v), r_dg = f64_like(prob.g),
             r_db = f64_like(prob.beta), r_dA = f64_like(prob.A_log), r_ddt = f64_like(prob.dt_bias),
             r_dh0 = f64_like(prob.initial_state);
  BackwardArgs r;
  r.forward = prob.args();
  r.forward.use_qk_l2norm = tc.l2norm;
  r.forward.allow_neg_eigval = tc.neg_eigval;
  r.forward.out = {};
  r.forward.final_state = {};
  r.d_out = d_out.view();
  r.d_final_state = d_final.view();
  r.dq = r_dq.view(); r.dk = r_dk.view(); r.dv = r_dv.view(); r.dg = r_dg.view(); r.dbeta = r_db.view();
  r.dA_log = r_dA.view(); r.ddt_bias = r_ddt.view(); r.d_initial_state = r_dh0.view();
  flash_kda::reference_backward(r);

  // The GPU: gradients in their inputs' dtypes, poisoned so an unwritten element cannot pass.
  auto like = [](HostTensor& t) {
    if (!t.defined()) return HostTensor{};
    HostTensor g(t.dtype(), t.shape());
    g.fill(std::nan(""));
    return g;
  };
  HostTensor g_dq = like(prob.q), g_dk = like(prob.k), g_dv = like(prob.v), g_dg = like(prob.g),
             g_db = like(prob.beta), g_dA = like(prob.A_log), g_ddt = like(prob.dt_bias), g_dh0 = like(prob.initial_state);
  DeviceTensor q(prob.q), k(prob.k), v(prob.v), g(prob.g), beta(prob.beta), A_log(prob.A_log), dt_bias(prob.dt_bias),
      cu(prob.cu_seqlens), h0(prob.initial_state), dout(d_out), dfin(d_final), dq(g_dq), dk(g_dk), dv(g_dv), dg(g_dg),
      db(g_db), dA(g_dA), ddt(g_ddt), dh0(g_dh0);
  BackwardArgs a;
  a.forward = r.forward;
  a.forward.q = q.view(); a.forward.k = k.view(); a.forward.v = v.view(); a.forward.g = g.view();
  a.forward.beta = beta.view(); a.forward.A_log = A_log.view(); a.forward.dt_bias = dt_bias.view();
  a.forward.cu_seqlens = cu.view(); a.forward.initial_state = h0.view();
  a.d_out = dout.view(); a.d_final_state = dfin.view();
  a.dq = dq.view(); a.dk = dk.view(); a.dv = dv.view(); a.dg = dg.view(); a.dbeta = db.view();
  a.dA_log = dA.view(); a.ddt_bias = ddt.view(); a.d_initial_state = dh0.view();

  const size_t ws_bytes = flash_kda::backward_workspace_size(a);
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&ws, ws_bytes), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  flash_kda::backward(a, ws, ws_bytes, stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);

  struct Out {
    const char* name;
    DeviceTensor* got;
    HostTensor* ref;
  };
  const Out outs[] = {{"dq", &dq, &r_dq}, {"dk", &dk, &r_dk}, {"dv", &dv, &r_dv}, {"dg", &dg, &r_dg},
                      {"dbeta", &db, &r_db}, {"dA_log", &dA, &r_dA}, {"ddt_bias", &ddt, &r_ddt},
                      {"d_initial_state", &dh0, &r_dh0}};
  std::vector<std::vector<double>> first;
  for (const Out& o : outs) {
    if (!o.ref->defined()) continue;
    const std::vector<double> got = o.got->download();
    for (double x : got) ASSERT_TRUE(std::isfinite(x)) << o.name;
    EXPECT_LE(flash_kda::testing::rel_frobenius(got, o.ref->values()), kBound) << o.name;
    first.push_back(got);
  }

  // A second run (through the allocator overload) gives the same bits.
  std::vector<void*> owned;
  flash_kda::backward(
      a,
      [&](size_t bytes) {
        void* p = nullptr;
        EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
        owned.push_back(p);
        return p;
      },
      stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  size_t i = 0;
  for (const Out& o : outs) {
    if (!o.ref->defined()) continue;
    const std::vector<double> again = o.got->download();
    EXPECT_EQ(std::memcmp(again.data(), first[i].data(), again.size() * sizeof(double)), 0) << o.name;
    ++i;
  }
  for (void* p : owned) cudaFree(p);
  cudaFree(ws);
  cudaStreamDestroy(stream);
}

KdaConfig base() {
  KdaConfig c;
  c.batch = 2;
  c.seqlen = 40;
  c.heads = 2;
  c.value_heads = 4;  // GVA: G = 2
  return c;
}

std::vector<Case> cases() {
  std::vector<Case> v;
  v.push_back({"safe_gate_fp32_states", base()});
  KdaConfig c = base();
  c.state_dtype = DType::BF16;
  c.state_layout = StateLayout::KFirst;
  v.push_back({"bf16_states_kfirst_fp32_d_out", c, DType::F32});
  c = base();
  c.gate = GateMode::Softplus;
  c.seqlens = {37, 0, 16, 50, 1};
  v.push_back({"softplus_varlen_empty", c});
  c = base();
  c.gate = GateMode::PreGated;
  c.pregated_min = -20.0;  // strong decays
  c.qk_std = 0.3;
  v.push_back({"pregated_no_norm_strong_decay", c, DType::BF16, false});
  c = base();
  c.with_A_log = false;
  c.with_initial_state = false;
  c.with_final_state = false;
  v.push_back({"no_A_log_no_states_neg_eigval", c, DType::BF16, true, true});
  c = base();
  c.beta_logits = false;
  c.with_dt_bias = false;
  v.push_back({"beta_given_no_dt_bias", c});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, BackwardGpu, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
#endif
