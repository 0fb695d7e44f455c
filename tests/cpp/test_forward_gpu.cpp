// flash_kda::forward through the C++ API on an sm_90 GPU, against flash_kda::reference_forward
// on the same bf16 inputs: relative Frobenius error of out and final_state <= 1e-2 (the
// accuracy contract of docs/kda-spec.md; the Python suite covers the full grid). The caller
// owns every allocation here, workspace included, as a C++ user would.
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "flash_kda/flash_kda.h"
#include "gpu_test_util.h"
#include "reference_test_util.h"

#if FLASH_KDA_WITH_CUDA
#include <cuda_runtime.h>

namespace {

using flash_kda::DType;
using flash_kda::DeviceType;
using flash_kda::TensorView;
using flash_kda::testing::HostTensor;
using flash_kda::testing::KdaConfig;
using flash_kda::testing::make_random_problem;
using flash_kda::testing::rel_frobenius;

constexpr double kBound = 1e-2;

using flash_kda::testing::gpu_skip_reason;

using flash_kda::testing::DeviceTensor;

struct Case {
  std::string name;
  KdaConfig config;
  flash_kda::LaunchOptions options{};  // forced plan choices (the function computed is the same)
  bool use_allocator = false;          // forward(args, allocate, stream, options)
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class ForwardGpu : public ::testing::TestWithParam<Case> {};

TEST_P(ForwardGpu, MatchesReference) {
  const std::string why = gpu_skip_reason();
  if (!why.empty()) GTEST_SKIP() << why;

  KdaConfig cfg = GetParam().config;
  cfg.head_dim_k = cfg.head_dim_v = 128;
  cfg.input_dtype = DType::BF16;
  cfg.out_dtype = DType::BF16;
  auto prob = make_random_problem(cfg);

  // Reference on the host, results in fp64 out and the problem's state dtype.
  HostTensor ref_out(DType::F64, prob.out.shape());
  flash_kda::ForwardArgs ref_args = prob.args();
  ref_args.out = ref_out.view();
  flash_kda::reference_forward(ref_args);
  const std::vector<double> ref_o = ref_out.values();
  const std::vector<double> ref_s = prob.final_state.defined() ? prob.final_state.values() : std::vector<double>{};

  // The same call on the GPU; outputs poisoned so an unwritten element cannot pass.
  prob.out.fill(std::nan(""));
  if (prob.final_state.defined()) prob.final_state.fill(std::nan(""));
  DeviceTensor q(prob.q), k(prob.k), v(prob.v), g(prob.g), beta(prob.beta), A_log(prob.A_log),
      dt_bias(prob.dt_bias), cu(prob.cu_seqlens), h0(prob.initial_state), ht(prob.final_state), out(prob.out);
  flash_kda::ForwardArgs a = prob.args();
  flash_kda::testing::set_views(a, q, k, v, g, beta, out, A_log, dt_bias, cu, h0, ht);

  const flash_kda::LaunchOptions& options = GetParam().options;
  const size_t ws_bytes = flash_kda::forward_workspace_size(a, options);
  void* ws = nullptr;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  if (GetParam().use_allocator) {
    size_t asked = 0;
    flash_kda::forward(
        a,
        [&](size_t bytes) {
          asked = bytes;
          EXPECT_EQ(cudaMalloc(&ws, bytes), cudaSuccess);
          return ws;
        },
        stream, options);
    EXPECT_EQ(asked, ws_bytes);
  } else {
    ASSERT_EQ(cudaMalloc(&ws, ws_bytes ? ws_bytes : 1), cudaSuccess);
    flash_kda::forward(a, ws, ws_bytes, stream, options);
  }
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaStreamDestroy(stream);
  cudaFree(ws);

  const std::vector<double> got_o = out.download();
  for (double x : got_o) ASSERT_TRUE(std::isfinite(x)) << "out has NaN/Inf (unwritten or overflow)";
  EXPECT_LE(rel_frobenius(got_o, ref_o), kBound);
  if (prob.final_state.defined()) {
    const std::vector<double> got_s = ht.download();
    for (double x : got_s) ASSERT_TRUE(std::isfinite(x)) << "final_state has NaN/Inf";
    EXPECT_LE(rel_frobenius(got_s, ref_s), kBound);
  }
}

Case fixed_fp32_state() {
  Case c{"fixed_B2_T100_H2_fp32", {}};
  c.config.batch = 2;
  c.config.seqlen = 100;
  c.config.state_dtype = DType::F32;
  return c;
}

Case varlen_bf16_state() {
  Case c{"varlen_with_empty_and_single_bf16", {}};
  c.config.seqlens = {37, 0, 1, 64, 5};
  c.config.heads = c.config.value_heads = 3;
  c.config.state_dtype = DType::BF16;
  return c;
}

Case no_state() {
  Case c{"fixed_T17_no_state", {}};
  c.config.batch = 1;
  c.config.seqlen = 17;
  c.config.with_initial_state = false;
  c.config.with_final_state = false;
  return c;
}

Case gva_fp32_state() {  // value head hv reads q/k head hv / (HV / H)
  Case c{"gva_H1_HV4_fixed_B2_T70_fp32", {}};
  c.config.batch = 2;
  c.config.seqlen = 70;
  c.config.heads = 1;
  c.config.value_heads = 4;
  c.config.state_dtype = DType::F32;
  return c;
}

// Each plan path through LaunchOptions: windows (pipelined, carried state), segments, both block
// widths, and the plans of the H100 PCIe (114 SMs) and the H20 (78 SMs) on one GPU: 16 heads of
// 8192 tokens take segments on 132 SMs and pipelined windows on 114 and 78.
Case with_options(Case c, const std::string& suffix, flash_kda::LaunchOptions o, bool use_allocator = false) {
  c.name += "_" + suffix;
  c.options = o;
  c.use_allocator = use_allocator;
  return c;
}
flash_kda::LaunchOptions opts(int num_sms, int64_t window_slots, int segments, int warps) {
  flash_kda::LaunchOptions o;
  o.num_sms = num_sms;
  o.window_slots = window_slots;
  o.segments = segments;
  o.recurrence_warps = warps;
  return o;
}
// A fixed-length case with an fp32 state: `batch` sequences of `T` tokens, `heads` heads.
Case fixed_fp32(int64_t batch, int64_t T, int64_t heads) {
  Case c{"fixed_B" + std::to_string(batch) + "_T" + std::to_string(T) + "_H" + std::to_string(heads) + "_fp32", {}};
  c.config.batch = batch;
  c.config.seqlen = T;
  c.config.heads = c.config.value_heads = heads;
  c.config.state_dtype = DType::F32;
  return c;
}
Case long_h16() { return fixed_fp32(1, 8192, 16); }
Case long_h2() { return fixed_fp32(2, 1000, 2); }

INSTANTIATE_TEST_SUITE_P(Sm90, ForwardGpu,
                         ::testing::Values(fixed_fp32_state(), varlen_bf16_state(), no_state(), gva_fp32_state(),
                                           with_options(varlen_bf16_state(), "windows3", opts(0, 3, 0, 0)),
                                           with_options(gva_fp32_state(), "windows2_warps8", opts(0, 2, 0, 8)),
                                           with_options(long_h2(), "segments4", opts(0, 0, 4, 0)),
                                           with_options(long_h2(), "segments4_allocator", opts(0, 0, 4, 0), true),
                                           with_options(long_h2(), "warps4", opts(0, 0, 1, 4)),
                                           with_options(long_h2(), "warps8", opts(0, 0, 1, 8)),
                                           long_h16(), with_options(long_h16(), "sms114", opts(114, 0, 0, 0)),
                                           with_options(long_h16(), "sms78", opts(78, 0, 0, 0), true)),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
#endif  // FLASH_KDA_WITH_CUDA
