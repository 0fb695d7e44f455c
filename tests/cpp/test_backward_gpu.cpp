// flash_kda::backward on an sm_90 GPU against flash_kda::reference_backward (fp64 reverse mode of
// the token recurrence) on the same bf16 inputs: relative Frobenius error of every gradient
// <= 2e-2 (bf16 dq, dk, dv round at ~4e-3). Skips itself without an sm_90 GPU. Also checks
// that two runs give the same bits (the backward is deterministic).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "flash_kda/flash_kda.h"
#include "backward_test_util.h"
#include "gpu_test_util.h"
#include "reference_test_util.h"

#if FLASH_KDA_WITH_CUDA
#include <cuda_runtime.h>

namespace {

using flash_kda::BackwardArgs;
using flash_kda::DType;
using flash_kda::GateMode;
using flash_kda::StateLayout;
using flash_kda::testing::BackwardCase;
using flash_kda::testing::DeviceTensor;
using flash_kda::testing::HostTensor;
using flash_kda::testing::KdaConfig;

constexpr double kBound = 2e-2;

class BackwardGpu : public ::testing::TestWithParam<BackwardCase> {};

TEST_P(BackwardGpu, MatchesReference) {
  const std::string why = flash_kda::testing::gpu_skip_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  const BackwardCase& tc = GetParam();
  KdaConfig cfg = tc.config;
  cfg.head_dim_k = cfg.head_dim_v = 128;
  cfg.input_dtype = DType::BF16;
  auto prob = flash_kda::testing::make_random_problem(cfg);
  flash_kda::testing::BackwardInputs in(prob, tc);

  // The reference: fp64 gradients.
  flash_kda::testing::Fp64Gradients ref(prob);
  BackwardArgs r = ref.args(in.forward, in.d_out, in.d_final);
  flash_kda::reference_backward(r);

  // The GPU: gradients in their inputs' dtypes, poisoned so an unwritten element cannot pass.
  flash_kda::testing::PoisonedGradients poisoned(prob);
  DeviceTensor q(prob.q), k(prob.k), v(prob.v), g(prob.g), beta(prob.beta), A_log(prob.A_log), dt_bias(prob.dt_bias),
      cu(prob.cu_seqlens), h0(prob.initial_state), dout(in.d_out), dfin(in.d_final), dq(poisoned.dq), dk(poisoned.dk),
      dv(poisoned.dv), dg(poisoned.dg), db(poisoned.dbeta), dA(poisoned.dA_log), ddt(poisoned.ddt_bias),
      dh0(poisoned.d_initial_state);
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
  const Out outs[] = {{"dq", &dq, &ref.dq}, {"dk", &dk, &ref.dk}, {"dv", &dv, &ref.dv}, {"dg", &dg, &ref.dg},
                      {"dbeta", &db, &ref.dbeta}, {"dA_log", &dA, &ref.dA_log}, {"ddt_bias", &ddt, &ref.ddt_bias},
                      {"d_initial_state", &dh0, &ref.d_initial_state}};
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

std::vector<BackwardCase> cases() {
  std::vector<BackwardCase> v;
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
                         [](const ::testing::TestParamInfo<BackwardCase>& i) { return i.param.name; });

}  // namespace
#endif
