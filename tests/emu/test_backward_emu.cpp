// The backward kernels (src/sm90/backward: offsets, prepare, records, chain, chunk_grad, finish:
// these very sources, compiled as host C++ in tests/emu/backward) run on the CPU model of
// tests/emu/warp_emu.h and checked against flash_kda::reference_backward (fp64 reverse mode of
// the token recurrence): the relative Frobenius error of every gradient <= 5e-3 (bf16 outputs
// round at ~2e-3: the cases measure <= 2.5e-3; a 10% error in one term of the records' Tinv
// fails four of the first seven). The forward recompute (wgmma and TMA, which the model does
// not run) is the CPU reference forward's intermediate states in fp32, at the
// rows the emulated offsets kernel gives, as the GPU's recompute writes them. The workspace
// starts as 0xff bytes (NaN), so that a kernel reading what nothing wrote fails the finite
// checks. It catches indexing, bounds, barrier and algebra errors; not timing or memory
// ordering (the GPU suite, tests/cpp/test_backward_gpu.cpp, covers those).
#include "backward/backward_emu.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "backward_test_util.h"
#include "host/backward_checks.h"
#include "reference_test_util.h"
#include "sm90/backward/layout.h"
#include "sm90/backward/params.h"

namespace {

using flash_kda::BackwardArgs;
using flash_kda::DType;
using flash_kda::GateMode;
using flash_kda::StateLayout;
using flash_kda::testing::BackwardCase;
using flash_kda::testing::HostTensor;
using flash_kda::testing::KdaConfig;

constexpr double kBound = 5e-3;


/// Host memory standing in for the device workspace: 256-byte aligned, 0xff bytes (NaN).
struct Workspace {
  std::unique_ptr<char, decltype(&std::free)> mem{nullptr, &std::free};
  explicit Workspace(size_t bytes) {
    const size_t size = (bytes + 255) / 256 * 256 + 256;
    mem.reset(static_cast<char*>(std::aligned_alloc(256, size)));
    std::memset(mem.get(), 0xff, size);
  }
};

/// B sequences of T tokens, one head (H = HV = 1), the default gate and states.
KdaConfig fixed(int64_t B, int64_t T) {
  KdaConfig c;
  c.batch = B;
  c.seqlen = T;
  c.heads = c.value_heads = 1;
  return c;
}

/// One gradient's relative Frobenius error against the fp64 reference, and its count of
/// elements that are not finite.
struct GradError {
  const char* name;
  double err;
  size_t not_finite;
};

/// Runs the backward kernels of case tc on the CPU model and returns the error of every
/// gradient the case has; prints them with the model's time. `chain` forces the chain's
/// segments (seg_len 0: the layout's own choice, chain_segments).
std::vector<GradError> run_case(const BackwardCase& tc, flash_kda::sm90::bwd::ChainSegments chain = {}) {
  const auto t_start = std::chrono::steady_clock::now();
  KdaConfig cfg = tc.config;
  cfg.head_dim_k = cfg.head_dim_v = 128;
  cfg.input_dtype = DType::BF16;
  flash_kda::testing::KdaProblem prob = flash_kda::testing::make_random_problem(cfg);
  flash_kda::testing::BackwardInputs in(prob, tc);
  const flash_kda::ForwardArgs& forward = in.forward;

  // The reference: fp64 gradients.
  flash_kda::testing::Fp64Gradients ref(prob);
  BackwardArgs r = ref.args(forward, in.d_out, in.d_final);
  flash_kda::reference_backward(r);

  // The model: gradients in their inputs' dtypes, NaN so that an unwritten element cannot pass.
  flash_kda::testing::PoisonedGradients got(prob);
  BackwardArgs a = r;
  got.point(a);
  const flash_kda::ProblemShape ps = flash_kda::detail::check_backward(a, flash_kda::Target::CpuReference);
  const flash_kda::sm90::bwd::BackwardLayout l = chain.seg_len > 0
                                                    ? flash_kda::sm90::bwd::backward_layout(ps, 0, chain)
                                                    : flash_kda::sm90::bwd::backward_layout(ps, 0);
  Workspace ws(l.total);
  const flash_kda::sm90::bwd::BackwardParams bp = flash_kda::sm90::bwd::backward_params(a, ps, ws.mem.get(), l);

  // The offsets, then the recompute's chunk-start states at the rows they give.
  if (flash_kda::sm90::bwd::emu_launch_offsets(bp, nullptr) != cudaSuccess) {
    ADD_FAILURE() << "the offsets kernel failed";
    return {};
  }
  const int64_t N = ps.num_seqs, HV = ps.value_heads, K = 128, V = 128;
  HostTensor out(DType::F64, prob.out.shape());
  flash_kda::ForwardArgs fa = forward;
  fa.out = out.view();
  fa.final_state = {};
  fa.intermediate_states = flash_kda::make_tensor(ws.mem.get() + l.states, DType::F32,
                                                  {l.rows, HV, K, V});  // K = V: either layout's shape
  fa.intermediate_offsets = flash_kda::make_tensor(ws.mem.get() + l.offsets, DType::I64, {N + 1});
  fa.intermediate_every = 16;
  fa.intermediate_include_initial = true;
  flash_kda::reference_forward(fa);

  const auto t_kernels = std::chrono::steady_clock::now();
  flash_kda::sm90::bwd::emu_enqueue_backward_kernels(bp, l, 0, nullptr);
  const auto t_end = std::chrono::steady_clock::now();

  struct Out {
    const char* name;
    HostTensor* got;
    HostTensor* ref;
  };
  const Out outs[] = {{"dq", &got.dq, &ref.dq},
                      {"dk", &got.dk, &ref.dk},
                      {"dv", &got.dv, &ref.dv},
                      {"dg", &got.dg, &ref.dg},
                      {"dbeta", &got.dbeta, &ref.dbeta},
                      {"dA_log", &got.dA_log, &ref.dA_log},
                      {"ddt_bias", &got.ddt_bias, &ref.ddt_bias},
                      {"d_initial_state", &got.d_initial_state, &ref.d_initial_state}};
  std::vector<GradError> errors;
  std::string report;
  for (const Out& o : outs) {
    if (!o.ref->defined()) continue;
    const std::vector<double> got = o.got->values();
    size_t bad = 0;
    for (double x : got) bad += !std::isfinite(x);
    errors.push_back({o.name, flash_kda::testing::rel_frobenius(got, o.ref->values()), bad});
    char line[96];
    std::snprintf(line, sizeof line, " %s %.2e", o.name, errors.back().err);
    report += line;
  }
  const auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
  std::printf("[ %s ]%s (kernels %.0f ms, case %.0f ms)\n", tc.name.c_str(), report.c_str(), ms(t_end - t_kernels),
              ms(t_end - t_start));
  return errors;
}

class BackwardEmu : public ::testing::TestWithParam<BackwardCase> {};

TEST_P(BackwardEmu, MatchesReference) {
  const std::vector<GradError> errors = run_case(GetParam());
  EXPECT_GE(errors.size(), 6u) << "dq, dk, dv, dg, dbeta and at least one more";
  for (const GradError& e : errors) {
    EXPECT_EQ(e.not_finite, 0u) << e.name << ": elements not finite";
    EXPECT_LE(e.err, kBound) << e.name;
  }
}

// dA_log and ddt_bias are sums over all of a head's tokens; on one short sequence without an
// initial state their terms cancel, and any chunk product left in plain tf32 leaves them ~1e-3
// to 7e-3 off (fla's error at the GPU grid's point safe_T17_H1_nostate ranges from ~1e-4 to
// ~1e-2 over draws). With every product in 3xTF32 the model measures 1e-7 to 6e-6 on these
// draws. Sixteen draws of that point, each held to 2e-4.
TEST(BackwardEmuSums, ScalarGradientsStayAccurateUnderCancellation) {
  for (uint64_t seed = 1; seed <= 16; ++seed) {
    KdaConfig c = fixed(2, 17);
    c.with_initial_state = false;
    c.seed = 1000 + seed;
    const std::vector<GradError> errors = run_case({"safe_b2_t17_no_state_seed" + std::to_string(seed), c});
    int checked = 0;
    for (const GradError& e : errors) {
      if (std::string(e.name) != "dA_log" && std::string(e.name) != "ddt_bias") continue;
      ++checked;
      EXPECT_EQ(e.not_finite, 0u) << e.name << ", seed " << seed;
      EXPECT_LE(e.err, 2e-4) << e.name << ", seed " << seed;
    }
    EXPECT_EQ(checked, 2) << "the safe gate with A_log and dt_bias has both gradients";
  }
}

// The chain cut into segments (layout.h chain_segments; the layout chooses them only for long
// sequences with few heads, too large for the model): the transition and input maps of
// segments 1 .. S - 1, the scan (emu_scan.cpp) and each segment from its end, against the same
// reference. 13 chunks in segments of 3 (the last one a single chunk) and of 5, two sequences
// and GVA, k-first bf16 states (the scan's transposing load of d_final_state).
TEST(BackwardEmuChainSegments, MatchReference) {
  struct Cut {
    BackwardCase tc;
    int64_t seg_len;
  };
  std::vector<Cut> cuts;
  cuts.push_back({{"segments_of_3_t200", fixed(1, 200)}, 3});
  KdaConfig c = fixed(2, 200);
  c.value_heads = 2;
  cuts.push_back({{"segments_of_5_b2_gva", c}, 5});
  c = fixed(1, 200);
  c.state_dtype = DType::BF16;
  c.state_layout = StateLayout::KFirst;
  cuts.push_back({{"segments_of_4_kfirst_bf16", c, DType::F32}, 4});
  c = fixed(1, 200);
  c.with_initial_state = false;
  cuts.push_back({{"segments_of_3_no_state", c}, 3});
  for (const Cut& cut : cuts) {
    const int64_t chunks = (cut.tc.config.seqlen + 15) / 16;
    const flash_kda::sm90::bwd::ChainSegments chain{cut.seg_len, (chunks + cut.seg_len - 1) / cut.seg_len};
    const std::vector<GradError> errors = run_case(cut.tc, chain);
    EXPECT_GE(errors.size(), 6u) << cut.tc.name;
    for (const GradError& e : errors) {
      EXPECT_EQ(e.not_finite, 0u) << cut.tc.name << ": " << e.name << " not finite";
      EXPECT_LE(e.err, kBound) << cut.tc.name << ": " << e.name;
    }
  }
}

std::vector<BackwardCase> cases() {
  std::vector<BackwardCase> v;
  KdaConfig c = fixed(2, 17);
  c.qk_std = 0.3;  // |k| <~ 1 without the L2 norm
  c.beta_logits = false;
  v.push_back({"fixed_b2_t17_no_norm", c, DType::BF16, false});
  c = fixed(1, 40);
  c.value_heads = 2;  // GVA: G = 2
  v.push_back({"gva_t40", c});
  c = fixed(1, 0);
  c.seqlens = {17, 0, 23};
  v.push_back({"varlen_empty", c});
  v.push_back({"safe_gate_norm_sigmoid_neg_eigval", fixed(1, 20), DType::BF16, true, true});
  c = fixed(2, 1);
  c.gate = GateMode::Softplus;
  v.push_back({"softplus_t1", c});
  c = fixed(1, 17);
  c.state_dtype = DType::BF16;
  c.state_layout = StateLayout::KFirst;
  v.push_back({"kfirst_bf16_states_fp32_d_out", c, DType::F32});
  c = fixed(1, 40);
  c.gate = GateMode::PreGated;
  c.pregated_min = -5.0;
  c.qk_std = 0.3;
  v.push_back({"pregated_no_norm", c, DType::BF16, false});
  // 13 chunks: the chain's record ring wraps around several times.
  v.push_back({"long_t200", fixed(1, 200)});
  c = fixed(1, 0);
  c.seqlens = {1, 16, 17, 0, 33};  // a one-token, a whole-chunk and a one-past-a-chunk sequence
  c.value_heads = 2;
  c.cu_dtype = DType::I32;
  v.push_back({"varlen_chunk_edges_gva_i32", c});
  c = fixed(1, 40);
  c.gate = GateMode::Softplus;
  c.g_mean = 2.0;  // softplus(g) ~ 2 with A_log up to log 16: decays down to ~-34 a token
  v.push_back({"softplus_strong_decay", c});
  c.g_mean = 4.0;  // decays of -4 to -64 a token: the state forgets within a token or two, so
                   // da is tiny and a cancelling sum of O(1) terms would be all of it
  v.push_back({"softplus_forgetting_decay", c});
  c = fixed(1, 40);
  c.gate = GateMode::PreGated;
  c.pregated_min = -60.0;  // log decays U(-60, 0) a token
  v.push_back({"pregated_strong_decay", c});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cpu, BackwardEmu, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<BackwardCase>& i) { return i.param.name; });

}  // namespace
