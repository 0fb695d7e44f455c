// flash_kda::decode on an sm_90 GPU against flash_kda::reference_decode on the same inputs
// (fp64, results kept in fp64): relative Frobenius error of out and of the whole pool (or
// final_state) within the bound of the output's dtype; padded slots' rows exactly zero and
// untouched pool slots bit-identical. Skips without an sm_90 device.
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "decode_cases.h"
#include "gpu_test_util.h"

#if FLASH_KDA_WITH_CUDA
#include <cuda_runtime.h>

namespace {

using flash_kda::DType;
using flash_kda::DeviceType;
using flash_kda::GateMode;
using flash_kda::StateLayout;
using flash_kda::TensorView;
using flash_kda::testing::DecodeCase;
using flash_kda::testing::DecodeConfig;
using flash_kda::testing::DecodeProblem;
using flash_kda::testing::DecodeWant;
using flash_kda::testing::check_decode;
using flash_kda::testing::decode_target;
using flash_kda::testing::decode_want;
using flash_kda::testing::HostTensor;
using flash_kda::testing::rel_frobenius;
using flash_kda::testing::view_values;

using flash_kda::testing::gpu_skip_reason;

using flash_kda::testing::DeviceTensor;

class DecodeGpu : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(DecodeGpu, MatchesReference) {
  const std::string why = gpu_skip_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  const DecodeConfig& cfg = GetParam().config;
  const bool pool = cfg.pool_slots > 0;
  const DecodeWant want = decode_want(cfg);
  DecodeProblem prob = decode_target(cfg);
  const std::vector<double> pool_before = pool ? prob.pool.wide.values() : std::vector<double>{};
  DeviceTensor q(prob.q.wide), k(prob.k.wide), v(prob.v.wide), g(prob.g.wide), out(prob.out.wide), beta(prob.act.beta),
      A_log(prob.act.A_log), dt_bias(prob.act.dt_bias), cu(prob.act.cu_seqlens), pl(prob.pool.wide),
      h0(prob.initial_state), ht(prob.final_state), idx(prob.indices), acc(prob.accepted);
  flash_kda::DecodeArgs a = prob.args();
  a.q = q.on_device(a.q), a.k = k.on_device(a.k), a.v = v.on_device(a.v), a.g = g.on_device(a.g);
  a.out = out.on_device(a.out), a.beta = beta.on_device(a.beta), a.A_log = A_log.on_device(a.A_log);
  a.dt_bias = dt_bias.on_device(a.dt_bias), a.cu_seqlens = cu.on_device(a.cu_seqlens);
  if (pool) {
    a.initial_state = a.final_state = pl.on_device(a.initial_state);
  } else {
    a.initial_state = h0.on_device(a.initial_state), a.final_state = ht.on_device(a.final_state);
  }
  a.ssm_state_indices = idx.on_device(a.ssm_state_indices);
  a.num_accepted_tokens = acc.on_device(a.num_accepted_tokens);

  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  flash_kda::DecodeLaunchOptions options;
  options.kernel = GetParam().kernel;
  flash_kda::decode(a, stream, options);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaStreamDestroy(stream);

  out.download();
  if (pool) pl.download();
  else if (prob.final_state.defined()) ht.download();
  check_decode(cfg, want, prob, pool_before);
}

std::vector<DecodeCase> gpu_cases() {
  // Every case on both kernels; k-first cases on the direct kernel's warp-column form as well,
  // and the k-first bf16-pool cases of more than one token in the row blocks' split form
  // (DirectRows; Direct runs those under 33 sequence-heads on the H200 in warp columns).
  std::vector<DecodeCase> both;
  for (const DecodeCase& c : flash_kda::testing::decode_cases()) {
    const bool kfirst = c.config.base.state_layout == StateLayout::KFirst;
    for (flash_kda::DecodeKernel k : {flash_kda::DecodeKernel::Persistent, flash_kda::DecodeKernel::Direct,
                                      flash_kda::DecodeKernel::DirectColumns, flash_kda::DecodeKernel::DirectRows}) {
      if (k == flash_kda::DecodeKernel::DirectColumns && !kfirst) continue;
      if (k == flash_kda::DecodeKernel::DirectRows && !flash_kda::testing::rows_split_case(c)) continue;
      DecodeCase x = c;
      x.kernel = k;
      x.name += k == flash_kda::DecodeKernel::Persistent      ? "_persistent"
                : k == flash_kda::DecodeKernel::Direct        ? "_direct"
                : k == flash_kda::DecodeKernel::DirectColumns ? "_direct_columns"
                                                              : "_direct_rows";
      both.push_back(x);
    }
  }
  return both;
}

INSTANTIATE_TEST_SUITE_P(Sm90, DecodeGpu, ::testing::ValuesIn(gpu_cases()),
                         [](const ::testing::TestParamInfo<DecodeCase>& i) { return i.param.name; });

class DecodeGpuGraph : public ::testing::TestWithParam<flash_kda::DecodeKernel> {};

TEST_P(DecodeGpuGraph, CapturesAndReplays) {
  const std::string why = gpu_skip_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  flash_kda::DecodeLaunchOptions options;
  options.kernel = GetParam();
  DecodeCase c = flash_kda::testing::make_decode_case("graph", GateMode::SafeSigmoid, StateLayout::VFirst, 1, false, DType::F32, DType::BF16, 4, 2, 4);
  auto prob = flash_kda::testing::make_decode_problem(c.config);
  DeviceTensor q(prob.q.wide), k(prob.k.wide), v(prob.v.wide), g(prob.g.wide), out(prob.out.wide), beta(prob.act.beta),
      A_log(prob.act.A_log), dt_bias(prob.act.dt_bias), pl(prob.pool.wide), idx(prob.indices);
  flash_kda::DecodeArgs a = prob.args();
  a.q = q.on_device(a.q), a.k = k.on_device(a.k), a.v = v.on_device(a.v), a.g = g.on_device(a.g);
  a.out = out.on_device(a.out), a.beta = beta.on_device(a.beta), a.A_log = A_log.on_device(a.A_log);
  a.dt_bias = dt_bias.on_device(a.dt_bias);
  a.initial_state = a.final_state = pl.on_device(a.initial_state);
  a.ssm_state_indices = idx.on_device(a.ssm_state_indices);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  flash_kda::decode(a, stream, options);  // no sync, no allocation: capturable
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  out.download();
  for (double x : view_values(prob.out.wide, prob.out.view())) ASSERT_TRUE(std::isfinite(x));
}

INSTANTIATE_TEST_SUITE_P(Sm90, DecodeGpuGraph,
                         ::testing::Values(flash_kda::DecodeKernel::Persistent, flash_kda::DecodeKernel::Direct),
                         [](const ::testing::TestParamInfo<flash_kda::DecodeKernel>& i) {
                           return std::string(i.param == flash_kda::DecodeKernel::Persistent ? "persistent" : "direct");
                         });

}  // namespace
#endif  // FLASH_KDA_WITH_CUDA
