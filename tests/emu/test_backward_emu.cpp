// The backward kernels (src/sm90/backward: offsets, prepare, records, chain, chunk_grad, finish:
// these very sources, compiled as host C++ in tests/emu/backward) run on the CPU model of
// tests/emu/warp_emu.h and checked against flash_kda::reference_backward (fp64 reverse mode of
// the token recurrence): the relative Frobenius error of every gradient <= 5e-3 (bf16 outputs
// round at ~2e-3 and the chunk products run in tf32: the cases measure <= 2.5e-3; a 10% error
// in one term of the records' Tinv fails four of the seven). The forward recompute (wgmma and TMA, which
// the model does not run) is the CPU reference forward's intermediate states in fp32, at the
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
#include <random>
#include <string>
#include <vector>

#include "host/backward_checks.h"
#include "reference_test_util.h"
#include "sm90/backward/layout.h"
#include "sm90/backward/params.h"

namespace {

using flash_kda::BackwardArgs;
using flash_kda::DType;
using flash_kda::GateMode;
using flash_kda::StateLayout;
using flash_kda::testing::HostTensor;
using flash_kda::testing::KdaConfig;

constexpr double kBound = 5e-3;

struct Case {
  std::string name;
  KdaConfig config;
  DType d_out_dtype = DType::BF16;
  bool l2norm = true;
  bool neg_eigval = false;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

/// Normal(0, sd) values of `shape` in `dtype`.
HostTensor random_tensor(DType dtype, const std::vector<int64_t>& shape, uint64_t seed, double sd) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n(0.0, sd);
  int64_t count = 1;
  for (int64_t s : shape) count *= s;
  std::vector<double> v(static_cast<size_t>(count));
  for (auto& e : v) e = n(rng);
  return HostTensor::from_values(v, dtype, shape);
}

/// Host memory standing in for the device workspace: 256-byte aligned, 0xff bytes (NaN).
struct Workspace {
  std::unique_ptr<char, decltype(&std::free)> mem{nullptr, &std::free};
  explicit Workspace(size_t bytes) {
    const size_t size = (bytes + 255) / 256 * 256 + 256;
    mem.reset(static_cast<char*>(std::aligned_alloc(256, size)));
    std::memset(mem.get(), 0xff, size);
  }
};

class BackwardEmu : public ::testing::TestWithParam<Case> {};

TEST_P(BackwardEmu, MatchesReference) {
  const auto t_start = std::chrono::steady_clock::now();
  const Case& tc = GetParam();
  KdaConfig cfg = tc.config;
  cfg.head_dim_k = cfg.head_dim_v = 128;
  cfg.input_dtype = DType::BF16;
  flash_kda::testing::KdaProblem prob = flash_kda::testing::make_random_problem(cfg);
  HostTensor d_out = random_tensor(tc.d_out_dtype, prob.out.shape(), 11, 1.0);
  HostTensor d_final = prob.final_state.defined()
                           ? random_tensor(prob.final_state.dtype(), prob.final_state.shape(), 12, 1.0)
                           : HostTensor{};
  flash_kda::ForwardArgs forward = prob.args();
  forward.use_qk_l2norm = tc.l2norm;
  forward.allow_neg_eigval = tc.neg_eigval;

  // The reference: fp64 gradients.
  flash_kda::testing::Fp64Gradients ref(prob);
  BackwardArgs r = ref.args(forward, d_out, d_final);
  flash_kda::reference_backward(r);

  // The model: gradients in their inputs' dtypes, NaN so that an unwritten element cannot pass.
  auto like = [](const HostTensor& t) {
    if (!t.defined()) return HostTensor{};
    HostTensor g(t.dtype(), t.shape());
    g.fill(std::nan(""));
    return g;
  };
  HostTensor dq = like(prob.q), dk = like(prob.k), dv = like(prob.v), dg = like(prob.g), db = like(prob.beta),
             dA = like(prob.A_log), ddt = like(prob.dt_bias), dh0 = like(prob.initial_state);
  BackwardArgs a = r;
  a.dq = dq.view(); a.dk = dk.view(); a.dv = dv.view(); a.dg = dg.view(); a.dbeta = db.view();
  a.dA_log = dA.view(); a.ddt_bias = ddt.view(); a.d_initial_state = dh0.view();
  const flash_kda::ProblemShape ps = flash_kda::detail::check_backward(a, flash_kda::Target::CpuReference);
  const flash_kda::sm90::bwd::BackwardLayout l = flash_kda::sm90::bwd::backward_layout(ps, 0);
  Workspace ws(l.total);
  const flash_kda::sm90::bwd::BackwardParams bp = flash_kda::sm90::bwd::backward_params(a, ps, ws.mem.get(), l);

  // The offsets, then the recompute's chunk-start states at the rows they give.
  ASSERT_EQ(flash_kda::sm90::bwd::emu_launch_offsets(bp, nullptr), cudaSuccess);
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
  const Out outs[] = {{"dq", &dq, &ref.dq}, {"dk", &dk, &ref.dk}, {"dv", &dv, &ref.dv}, {"dg", &dg, &ref.dg},
                      {"dbeta", &db, &ref.dbeta}, {"dA_log", &dA, &ref.dA_log}, {"ddt_bias", &ddt, &ref.ddt_bias},
                      {"d_initial_state", &dh0, &ref.d_initial_state}};
  std::string report;
  for (const Out& o : outs) {
    if (!o.ref->defined()) continue;
    const std::vector<double> got = o.got->values();
    size_t bad = 0;
    for (double x : got) bad += !std::isfinite(x);
    EXPECT_EQ(bad, 0u) << o.name << ": elements not finite";
    const double err = flash_kda::testing::rel_frobenius(got, o.ref->values());
    EXPECT_LE(err, kBound) << o.name;
    char line[96];
    std::snprintf(line, sizeof line, " %s %.2e", o.name, err);
    report += line;
  }
  const auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
  std::printf("[ %s ]%s (kernels %.0f ms, case %.0f ms)\n", tc.name.c_str(), report.c_str(), ms(t_end - t_kernels),
              ms(t_end - t_start));
}

std::vector<Case> cases() {
  std::vector<Case> v;
  KdaConfig c;
  c.batch = 2;
  c.seqlen = 17;
  c.heads = c.value_heads = 1;
  c.qk_std = 0.3;  // |k| <~ 1 without the L2 norm
  c.beta_logits = false;
  v.push_back({"fixed_b2_t17_no_norm", c, DType::BF16, false});
  c = KdaConfig{};
  c.batch = 1;
  c.seqlen = 40;
  c.heads = 1;
  c.value_heads = 2;  // GVA: G = 2
  v.push_back({"gva_t40", c});
  c = KdaConfig{};
  c.seqlens = {17, 0, 23};
  c.heads = c.value_heads = 1;
  v.push_back({"varlen_empty", c});
  c = KdaConfig{};
  c.batch = 1;
  c.seqlen = 20;
  c.heads = c.value_heads = 1;
  v.push_back({"safe_gate_norm_sigmoid_neg_eigval", c, DType::BF16, true, true});
  c = KdaConfig{};
  c.batch = 2;
  c.seqlen = 1;
  c.heads = c.value_heads = 1;
  c.gate = GateMode::Softplus;
  v.push_back({"softplus_t1", c});
  c = KdaConfig{};
  c.batch = 1;
  c.seqlen = 17;
  c.heads = c.value_heads = 1;
  c.state_dtype = DType::BF16;
  c.state_layout = StateLayout::KFirst;
  v.push_back({"kfirst_bf16_states_fp32_d_out", c, DType::F32});
  c = KdaConfig{};
  c.batch = 1;
  c.seqlen = 40;
  c.heads = c.value_heads = 1;
  c.gate = GateMode::PreGated;
  c.pregated_min = -5.0;
  c.qk_std = 0.3;
  v.push_back({"pregated_no_norm", c, DType::BF16, false});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cpu, BackwardEmu, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
