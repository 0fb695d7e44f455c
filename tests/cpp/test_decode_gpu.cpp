// flash_kda::decode on an sm_90 GPU against flash_kda::reference_decode on the same inputs
// (fp64, results kept in fp64): relative Frobenius error of out and of the whole pool (or
// final_state) within the bound of the output's dtype; padded slots' rows exactly zero and
// untouched pool slots bit-identical. Skips without an sm_90 device.
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "decode_test_util.h"
#include "gpu_test_util.h"

#if FLASH_KDA_WITH_CUDA
#include <cuda_runtime.h>

namespace {

using flash_kda::DType;
using flash_kda::DeviceType;
using flash_kda::GateMode;
using flash_kda::StateLayout;
using flash_kda::TensorView;
using flash_kda::testing::DecodeConfig;
using flash_kda::testing::HostTensor;
using flash_kda::testing::rel_frobenius;
using flash_kda::testing::view_values;

using flash_kda::testing::gpu_skip_reason;

using flash_kda::testing::DeviceTensor;

struct GpuCase {
  std::string name;
  DecodeConfig config;
  flash_kda::DecodeKernel kernel = flash_kda::DecodeKernel::Auto;
};
void PrintTo(const GpuCase& c, std::ostream* os) { *os << c.name; }

double bound_for(DType t) { return t == DType::BF16 ? 1e-2 : 1e-4; }

class DecodeGpu : public ::testing::TestWithParam<GpuCase> {};

TEST_P(DecodeGpu, MatchesReference) {
  const std::string why = gpu_skip_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  const DecodeConfig& cfg = GetParam().config;
  const bool pool = cfg.pool_slots > 0;

  // The reference on a copy (fp64 out; the pool or final_state in their own dtype).
  auto ref = flash_kda::testing::make_decode_problem(cfg);
  HostTensor ref_out(DType::F64, ref.act.out.shape());
  flash_kda::DecodeArgs ra = ref.args();
  ra.out = ref_out.view();
  flash_kda::reference_decode(ra);
  const std::vector<double> want_o = ref_out.values();

  auto prob = flash_kda::testing::make_decode_problem(cfg);  // same seed: same inputs
  const std::vector<double> pool_before = pool ? prob.pool.wide.values() : std::vector<double>{};
  prob.out.wide.fill(std::nan(""));  // an unwritten element cannot pass
  if (prob.final_state.defined()) prob.final_state.fill(std::nan(""));
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
  const std::vector<double> got_o = view_values(prob.out.wide, prob.out.view());
  for (size_t i = 0; i < got_o.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got_o[i])) << "out[" << i << "] unwritten or not finite";
    if (want_o[i] == 0.0) ASSERT_EQ(got_o[i], 0.0) << "out[" << i << "] of a padded slot";
  }
  const double out_err = rel_frobenius(got_o, want_o);
  EXPECT_LE(out_err, bound_for(cfg.base.out_dtype)) << "out";
  // Padding columns of strided out rows stay untouched (NaN).
  for (int64_t i = 0; i < prob.out.wide.numel(); ++i)
    if (cfg.row_pad > 0 && i % (cfg.base.head_dim_v + cfg.row_pad) >= cfg.base.head_dim_v)
      ASSERT_TRUE(std::isnan(prob.out.wide.get(i))) << "out padding written at " << i;

  const double state_bound = bound_for(cfg.base.state_dtype);
  if (pool) {
    pl.download();
    const std::vector<double> got = prob.pool.wide.values(), want = ref.pool.wide.values();
    std::vector<double> got_changed, want_changed;
    for (size_t i = 0; i < got.size(); ++i) {
      if (want[i] == pool_before[i]) {
        // Untouched by the reference: untouched here (a written slot equal by chance is rare and
        // compared by value below anyway).
        if (got[i] != want[i]) {
          got_changed.push_back(got[i]);
          want_changed.push_back(want[i]);
        }
        continue;
      }
      got_changed.push_back(got[i]);
      want_changed.push_back(want[i]);
    }
    for (double x : got) ASSERT_TRUE(std::isfinite(x)) << "pool has NaN/Inf";
    if (!want_changed.empty()) EXPECT_LE(rel_frobenius(got_changed, want_changed), state_bound) << "pool";
    EXPECT_LE(rel_frobenius(got, want), state_bound) << "whole pool";
  } else if (prob.final_state.defined()) {
    ht.download();
    const std::vector<double> got = prob.final_state.values(), want = ref.final_state.values();
    for (double x : got) ASSERT_TRUE(std::isfinite(x)) << "final_state has NaN/Inf";
    EXPECT_LE(rel_frobenius(got, want), state_bound) << "final_state";
  }
}

GpuCase make_case(std::string name, GateMode gate, StateLayout layout, int64_t T, bool per_token, DType pool_dtype,
                  DType io_dtype, int64_t N = 5, int64_t H = 2, int64_t HV = 4) {
  GpuCase c{std::move(name), {}};
  DecodeConfig& d = c.config;
  d.base.batch = N;
  d.base.seqlen = T;
  d.base.heads = H;
  d.base.value_heads = HV;
  d.base.head_dim_k = d.base.head_dim_v = 128;
  d.base.gate = gate;
  d.base.state_layout = layout;
  d.base.state_dtype = pool_dtype;
  d.base.input_dtype = io_dtype;
  d.base.out_dtype = io_dtype;
  d.base.seed = uint64_t(T * 31 + N);
  d.per_token = per_token;
  d.row_pad = 8;    // q, k, v, g, out are views into wider rows
  d.slot_pad = 64;  // pool slots apart
  d.index_dtype = T % 2 ? DType::I32 : DType::I64;
  if (per_token) {
    d.pool_slots = N * T + 2;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t t = 0; t < T; ++t) d.slots.push_back(n == 1 ? -1 : 2 + (N - 1 - n) * T + t);
    if (T > 1) d.slots[size_t(2 * T + 1)] = -1;  // sequence 2 drops its second token's state
    for (int64_t n = 0; n < N; ++n) d.accepted.push_back(1 + (n * 7) % T);
    if (T > 1) d.accepted[2] = 1;
  } else {
    d.pool_slots = N + 3;
    for (int64_t n = 0; n < N; ++n) d.slots.push_back(n == 1 ? -1 : (n == 3 ? N + 2 : n));
  }
  return c;
}

std::vector<GpuCase> gpu_cases() {
  std::vector<GpuCase> cases;
  const GateMode gates[] = {GateMode::SafeSigmoid, GateMode::Softplus, GateMode::PreGated};
  const char* gate_names[] = {"safe", "softplus", "pregated"};
  for (int gi = 0; gi < 3; ++gi)
    for (StateLayout layout : {StateLayout::VFirst, StateLayout::KFirst})
      for (DType pool : {DType::F32, DType::BF16})
        for (int64_t T : {1, 2, 4, 16}) {
          const std::string name = std::string(gate_names[gi]) + (layout == StateLayout::VFirst ? "_vfirst" : "_kfirst") +
                                   (pool == DType::F32 ? "_fp32pool" : "_bf16pool") + "_T" + std::to_string(T);
          const DType io = T == 2 ? DType::F32 : DType::BF16;
          cases.push_back(make_case(name + "_per_token", gates[gi], layout, T, true, pool, io));
          if (T <= 4) cases.push_back(make_case(name + "_per_seq", gates[gi], layout, T, false, pool, io));
        }
  // Small and GVA-heavy shapes: 1 x 32 heads (2-warp blocks), 1 q/k head for 8 value heads.
  cases.push_back(make_case("n1_hv32_T1", GateMode::SafeSigmoid, StateLayout::VFirst, 1, false, DType::F32, DType::BF16, 1, 32, 32));
  cases.push_back(make_case("gva_h1_hv8_T2", GateMode::Softplus, StateLayout::KFirst, 2, true, DType::BF16, DType::BF16, 3, 1, 8));
  // Persistent grid: many more work items than resident blocks (odd N x 8 heads x 4 slices
  // over <= 528 blocks), so every block computes many items with the next ones in flight
  // (fp32 pools 1 behind, bf16 2), padded and out-of-range slots among them.
  cases.push_back(make_case("persistent_vfirst_fp32pool_n131_T1", GateMode::SafeSigmoid, StateLayout::VFirst, 1, false,
                            DType::F32, DType::BF16, 131, 8, 8));
  cases.push_back(make_case("persistent_vfirst_bf16pool_n131_T2_per_token", GateMode::Softplus, StateLayout::VFirst, 2,
                            true, DType::BF16, DType::BF16, 131, 4, 8));
  cases.push_back(make_case("persistent_kfirst_bf16pool_n97_T4_per_token", GateMode::PreGated, StateLayout::KFirst, 4,
                            true, DType::BF16, DType::F32, 97, 8, 8));
  cases.push_back(make_case("persistent_kfirst_fp32pool_n129_T3", GateMode::SafeSigmoid, StateLayout::KFirst, 3, false,
                            DType::F32, DType::BF16, 129, 8, 8));
  // Varlen over a persistent grid: 150 sequences of 0..9 tokens (long ones take a second and
  // third staging group, loaded directly), [N] indices with padded slots.
  GpuCase vlp = make_case("varlen_persistent_bf16pool", GateMode::SafeSigmoid, StateLayout::VFirst, 1, false, DType::BF16,
                          DType::BF16, 150, 8, 8);
  for (int64_t n = 0; n < 150; ++n) vlp.config.base.seqlens.push_back((n * 7) % 10);
  cases.push_back(vlp);
  // Varlen with [N] indices (a padded slot, a zero-length sequence, one longer than 16).
  GpuCase vl = make_case("varlen_per_seq", GateMode::SafeSigmoid, StateLayout::VFirst, 1, false, DType::F32, DType::BF16, 5);
  vl.config.base.seqlens = {3, 1, 0, 21, 2};
  cases.push_back(vl);
  // No pool: per-sequence states, varlen with a zero-length sequence (state passes through),
  // and a zero start state without final_state; flags off.
  GpuCase np{"varlen_states_kfirst", {}};
  np.config.base.seqlens = {2, 0, 5, 16};
  np.config.base.heads = 2;
  np.config.base.value_heads = 4;
  np.config.base.head_dim_k = np.config.base.head_dim_v = 128;
  np.config.base.state_layout = StateLayout::KFirst;
  np.config.base.out_dtype = DType::BF16;
  cases.push_back(np);
  GpuCase zs = np;
  zs.name = "fixed_zero_start_no_final_beta_raw";
  zs.config.base.seqlens.clear();
  zs.config.base.batch = 3;
  zs.config.base.seqlen = 4;
  zs.config.base.with_initial_state = false;
  zs.config.base.with_final_state = false;
  zs.config.base.beta_logits = false;
  zs.config.base.state_layout = StateLayout::VFirst;
  cases.push_back(zs);
  // The direct kernel's v-first splits (plan.h): 1 x 8 heads, bf16 pool, T = 1 (the packed
  // form: 1-warp blocks, 8 a head) and 9 x 8 heads (2-warp blocks, 4 a head); fp32 pools at
  // 1 x 8 heads T = 2 (1-warp blocks, 16 a head), 5 x 8 heads (2-warp blocks), 40 x 8 heads
  // (4-warp blocks); k-first fp32 at N = 1 with T = 5.
  cases.push_back(make_case("split_n1_hv8_bf16pool_T1", GateMode::Softplus, StateLayout::VFirst, 1, false, DType::BF16,
                            DType::BF16, 1, 8, 8));
  cases.push_back(make_case("split_n9_hv8_bf16pool_T1", GateMode::SafeSigmoid, StateLayout::VFirst, 1, false,
                            DType::BF16, DType::BF16, 9, 8, 8));
  cases.push_back(make_case("split_n1_hv8_fp32pool_T2", GateMode::SafeSigmoid, StateLayout::VFirst, 2, false,
                            DType::F32, DType::F32, 1, 4, 8));
  cases.push_back(make_case("split_n5_hv8_fp32pool_T1", GateMode::SafeSigmoid, StateLayout::VFirst, 1, false, DType::F32,
                            DType::F32, 5, 8, 8));
  cases.push_back(make_case("split_n40_hv8_fp32pool_T2", GateMode::PreGated, StateLayout::VFirst, 2, true, DType::F32,
                            DType::BF16, 40, 2, 8));
  cases.push_back(make_case("split_n1_hv4_kfirst_fp32pool_T5", GateMode::SafeSigmoid, StateLayout::KFirst, 5, false,
                            DType::F32, DType::BF16, 1, 4, 4));
  // Every case on both kernels.
  std::vector<GpuCase> both;
  for (const GpuCase& c : cases)
    for (flash_kda::DecodeKernel k : {flash_kda::DecodeKernel::Persistent, flash_kda::DecodeKernel::Direct}) {
      GpuCase x = c;
      x.kernel = k;
      x.name += k == flash_kda::DecodeKernel::Persistent ? "_persistent" : "_direct";
      both.push_back(x);
    }
  return both;
}

INSTANTIATE_TEST_SUITE_P(Sm90, DecodeGpu, ::testing::ValuesIn(gpu_cases()),
                         [](const ::testing::TestParamInfo<GpuCase>& i) { return i.param.name; });

class DecodeGpuGraph : public ::testing::TestWithParam<flash_kda::DecodeKernel> {};

TEST_P(DecodeGpuGraph, CapturesAndReplays) {
  const std::string why = gpu_skip_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  flash_kda::DecodeLaunchOptions options;
  options.kernel = GetParam();
  GpuCase c = make_case("graph", GateMode::SafeSigmoid, StateLayout::VFirst, 1, false, DType::F32, DType::BF16, 4, 2, 4);
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
