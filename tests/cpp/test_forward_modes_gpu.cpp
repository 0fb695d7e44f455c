// flash_kda::forward's gate modes and input flags on an sm_90 GPU, against
// flash_kda::reference_forward (fp64) on the same inputs: relative Frobenius error of out and
// final_state <= 1e-2 (docs/kda-spec.md's accuracy contract), every element finite. Covers each
// gate mode (the safe gate with and without A_log / dt_bias; softplus at fla's benchmark
// parameters, at decays that take prepare.cu's mid and levels forms, and at -50 and -1e3 nats a
// token; pre-gated decays in [-1, 0], [-50, 0] and [-1e4, 0]) x beta activations (sigmoid,
// 2 sigmoid, as given) x L2 norm on/off x fixed length / varlen with empty sequences and GVA x bf16
// / fp32 g. Also: q, k, g and beta read through strided views (a fused [B, T, 3, H, K]
// projection, slices of longer buffers) equal to the contiguous call bit for bit, and each of
// the prepare kernel's row forms (General, Flat, Dense) equal to the others.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "flash_kda/flash_kda.h"
#include "gpu_test_util.h"
#include "reference_test_util.h"

#if FLASH_KDA_WITH_CUDA
#include <cuda_runtime.h>

#include "sm90/forward/launch.h"

namespace {

using flash_kda::DType;
using flash_kda::GateMode;
using flash_kda::TensorView;
using flash_kda::testing::DeviceTensor;
using flash_kda::testing::HostTensor;
using flash_kda::testing::KdaConfig;
using flash_kda::testing::KdaProblem;
using flash_kda::testing::make_random_problem;
using flash_kda::testing::rel_frobenius;

constexpr double kBound = 1e-2;

// A gate configuration: the mode and the distribution of its inputs.
struct GateCase {
  std::string name;
  GateMode gate = GateMode::SafeSigmoid;
  bool with_A_log = true, with_dt_bias = true;
  double A_log_exp_min = 1.0, A_log_exp_max = 16.0;  // A_log = log U(min, max)
  double g_mean = 0.0, g_std = 1.0;                  // SafeSigmoid / Softplus
  double pregated_min = -1.0;                        // PreGated: g ~ U(pregated_min, 0)
};

std::vector<GateCase> gate_cases() {
  std::vector<GateCase> c;
  c.push_back({"safe"});
  c.push_back({"safe_noAlog", GateMode::SafeSigmoid, false, true});
  c.push_back({"safe_nobias", GateMode::SafeSigmoid, true, false});
  // fla's benchmark inputs: A_log ~ U(0, 1) is exp(A_log) in [1, e]; the direct form.
  c.push_back({"softplus_bench", GateMode::Softplus, true, true, 1.0, std::exp(1.0)});
  c.push_back({"softplus_nobias", GateMode::Softplus, true, false});
  // ~7 nats a token: G2 at token 15 ~ 160 log2 units, each half chunk ~ 80: the mid form.
  c.push_back({"softplus_mid", GateMode::Softplus, true, true, 4.0, 4.0, 1.5, 0.3});
  // A_log = log 16 and softplus(x) ~ 3.1 or 62.5: ~-50 and ~-1e3 nats a token, the levels form.
  c.push_back({"softplus_decay50", GateMode::Softplus, true, true, 16.0, 16.0, 3.1, 0.5});
  c.push_back({"softplus_decay1e3", GateMode::Softplus, true, true, 16.0, 16.0, 62.5, 2.0});
  GateCase pre{"pregated_1", GateMode::PreGated, false, false};
  c.push_back(pre);
  pre.name = "pregated_50", pre.pregated_min = -50.0;
  c.push_back(pre);
  pre.name = "pregated_1e4", pre.pregated_min = -1e4;
  c.push_back(pre);
  return c;
}

enum class Beta { Sigmoid, NegEigval, Given };

struct Case {
  GateCase gate;
  Beta beta = Beta::Sigmoid;
  bool l2norm = true;
  bool varlen_gva = false;  // varlen {37, 0, 1, 20}, H = 1, HV = 2; else B = 2, T = 40, H = HV = 2
  bool g_f32 = false;
  std::string name() const {
    const char* b = beta == Beta::Sigmoid ? "sigmoid" : beta == Beta::NegEigval ? "negeig" : "given";
    return gate.name + "_" + b + (l2norm ? "_l2" : "_nol2") + (varlen_gva ? "_varlen_gva" : "_fixed") +
           (g_f32 ? "_gf32" : "_gbf16");
  }
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

KdaConfig config_of(const Case& c) {
  KdaConfig cfg;
  cfg.head_dim_k = cfg.head_dim_v = 128;
  cfg.input_dtype = DType::BF16;
  cfg.out_dtype = DType::BF16;
  cfg.state_dtype = DType::F32;
  if (c.varlen_gva) {
    cfg.seqlens = {37, 0, 1, 20};
    cfg.heads = 1;
    cfg.value_heads = 2;
  } else {
    cfg.batch = 2;
    cfg.seqlen = 40;
    cfg.heads = cfg.value_heads = 2;
  }
  cfg.gate = c.gate.gate;
  cfg.with_A_log = c.gate.with_A_log;
  cfg.with_dt_bias = c.gate.with_dt_bias;
  cfg.A_log_exp_min = c.gate.A_log_exp_min;
  cfg.A_log_exp_max = c.gate.A_log_exp_max;
  cfg.g_mean = c.gate.g_mean;
  cfg.g_std = c.gate.g_std;
  cfg.pregated_min = c.gate.pregated_min;
  cfg.beta_logits = c.beta != Beta::Given;  // else beta ~ U(0.05, 1), already activated
  // Without the L2 norm, |k| ~ 0.9 keeps the delta rule's b |k|^2 below 2 (a stable recurrence).
  if (!c.l2norm) cfg.qk_std = 0.08;
  cfg.seed = std::hash<std::string>{}(c.name());
  return cfg;
}

void apply_flags(const Case& c, flash_kda::ForwardArgs& a) {
  a.use_qk_l2norm = c.l2norm;
  a.use_beta_sigmoid = c.beta != Beta::Given;
  a.allow_neg_eigval = c.beta == Beta::NegEigval;
}

// The same values in fp32 (g's other accepted dtype).
HostTensor to_f32(HostTensor& t) { return HostTensor::from_values(t.values(), DType::F32, t.shape()); }

class ForwardModesGpu : public ::testing::TestWithParam<Case> {};

TEST_P(ForwardModesGpu, MatchesReference) {
  const std::string why = flash_kda::testing::gpu_skip_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  const Case& c = GetParam();
  KdaProblem prob = make_random_problem(config_of(c));
  if (c.g_f32) prob.g = to_f32(prob.g);

  HostTensor ref_out(DType::F64, prob.out.shape());
  flash_kda::ForwardArgs ref_args = prob.args();
  apply_flags(c, ref_args);
  ref_args.out = ref_out.view();
  flash_kda::reference_forward(ref_args);
  const std::vector<double> ref_o = ref_out.values();
  const std::vector<double> ref_s = prob.final_state.values();

  prob.out.fill(std::nan(""));
  prob.final_state.fill(std::nan(""));
  DeviceTensor q(prob.q), k(prob.k), v(prob.v), g(prob.g), beta(prob.beta), A_log(prob.A_log),
      dt_bias(prob.dt_bias), cu(prob.cu_seqlens), h0(prob.initial_state), ht(prob.final_state), out(prob.out);
  flash_kda::ForwardArgs a = prob.args();
  flash_kda::testing::set_views(a, q, k, v, g, beta, out, A_log, dt_bias, cu, h0, ht);
  apply_flags(c, a);
  const size_t ws_bytes = flash_kda::forward_workspace_size(a);
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&ws, ws_bytes ? ws_bytes : 1), cudaSuccess);
  flash_kda::forward(a, ws, ws_bytes, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(ws);

  const std::vector<double> got_o = out.download(), got_s = ht.download();
  for (double x : got_o) ASSERT_TRUE(std::isfinite(x)) << "out has NaN/Inf";
  for (double x : got_s) ASSERT_TRUE(std::isfinite(x)) << "final_state has NaN/Inf";
  const double eo = rel_frobenius(got_o, ref_o), es = rel_frobenius(got_s, ref_s);
  EXPECT_LE(eo, kBound) << "out";
  EXPECT_LE(es, kBound) << "final_state";
  RecordProperty("rel_err_out", std::to_string(eo));
  RecordProperty("rel_err_state", std::to_string(es));
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const GateCase& gc : gate_cases())
    for (Beta b : {Beta::Sigmoid, Beta::NegEigval, Beta::Given})
      for (bool l2 : {true, false})
        for (bool vg : {false, true})
          for (bool f32 : {false, true}) cases.push_back({gc, b, l2, vg, f32});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Sm90, ForwardModesGpu, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name(); });

// ---- Strided q, k, g, beta: prepare reads them through their RowLayouts.
//
// The views are built in host buffers and copied as a whole; sm90::launch_forward runs them
// directly (validation of strided inputs belongs to validate.cpp, whose stride rules are not
// this test's subject), with the ProblemShape the contiguous call validates to.

// A [B, T, n, ...rest] buffer's slot `which` as a [B, T, ...rest] view (the fused projection
// split), or a [B, T_long, ...] buffer's first T tokens (a slice).
struct StridedCopy {
  HostTensor buffer;
  TensorView view;
};

// Copies `t` ([B, T, X...], contiguous, X the trailing extent product) into slot `slot` of
// `slots` slots per token of a buffer with `pad_tokens` extra tokens per sequence.
StridedCopy strided_copy(HostTensor& t, int slots, int slot, int64_t pad_tokens) {
  const std::vector<int64_t>& shape = t.shape();
  const int64_t B = shape[0], T = shape[1];
  int64_t X = 1;
  for (size_t i = 2; i < shape.size(); ++i) X *= shape[i];
  const std::vector<double> vals = t.values();
  const int64_t T_long = T + pad_tokens;
  std::vector<double> buf(size_t(B * T_long * slots * X), -7.0);  // the other slots hold other values
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < T; ++s)
      for (int64_t x = 0; x < X; ++x) buf[size_t(((b * T_long + s) * slots + slot) * X + x)] = vals[size_t((b * T + s) * X + x)];
  StridedCopy out{HostTensor::from_values(buf, t.dtype(), {B * T_long * slots * X}), {}};
  TensorView v = t.view();
  const int64_t es = int64_t(flash_kda::dtype_size(t.dtype()));
  v.data = static_cast<char*>(out.buffer.view().data) + slot * X * es;
  v.strides[0] = T_long * slots * X;
  v.strides[1] = slots * X;
  for (int i = int(shape.size()) - 1, inner = 1; i >= 2; --i) {
    v.strides[i] = inner;
    inner *= int(shape[size_t(i)]);
  }
  out.view = v;
  return out;
}

// Runs `a` with out and final_state poisoned (0xff bytes: NaN) first, so that a run that writes
// nothing cannot reproduce the previous run's results.
void run_and_download(flash_kda::ForwardArgs a, const flash_kda::ProblemShape& p, DeviceTensor& out,
                      DeviceTensor& ht, std::vector<double>& o, std::vector<double>& s) {
  for (const TensorView& t : {a.out, a.final_state})
    ASSERT_EQ(cudaMemset(t.data, 0xff, size_t(t.numel()) * size_t(flash_kda::dtype_size(t.dtype))), cudaSuccess);
  const size_t ws_bytes = flash_kda::sm90::workspace_bytes(p, {});
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&ws, ws_bytes ? ws_bytes : 1), cudaSuccess);
  flash_kda::sm90::launch_forward(a, p, {}, ws, ws_bytes, nullptr, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(ws);
  o = out.download();
  s = ht.download();
}

TEST(ForwardStridedGpu, FusedProjectionAndSlicesEqualTheContiguousCall) {
  const std::string why = flash_kda::testing::gpu_skip_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  for (GateMode mode : {GateMode::SafeSigmoid, GateMode::Softplus, GateMode::PreGated}) {
    KdaConfig cfg;
    cfg.head_dim_k = cfg.head_dim_v = 128;
    cfg.input_dtype = DType::BF16;
    cfg.out_dtype = DType::BF16;
    cfg.batch = 2;
    cfg.seqlen = 37;
    cfg.heads = 2;
    cfg.value_heads = 4;
    cfg.gate = mode;
    KdaProblem prob = make_random_problem(cfg);
    flash_kda::ForwardArgs a = prob.args();
    DeviceTensor q(prob.q), k(prob.k), v(prob.v), g(prob.g), beta(prob.beta), A_log(prob.A_log),
        dt_bias(prob.dt_bias), cu(prob.cu_seqlens), h0(prob.initial_state), ht(prob.final_state), out(prob.out);
    flash_kda::testing::set_views(a, q, k, v, g, beta, out, A_log, dt_bias, cu, h0, ht);
    const flash_kda::ProblemShape p = flash_kda::validate(a, flash_kda::Target::Sm90);
    std::vector<double> o_ref, s_ref;
    run_and_download(a, p, out, ht, o_ref, s_ref);

    // q and k: slots 0 and 1 of a fused [B, T, 3, H, K] projection; g: a [B, T + 5, HV, K]
    // buffer's first T tokens; beta: slot 1 of a [B, T + 3, 2, HV] buffer.
    StridedCopy qs = strided_copy(prob.q, 3, 0, 0), ks = strided_copy(prob.k, 3, 1, 0);
    StridedCopy gs = strided_copy(prob.g, 1, 0, 5), bs = strided_copy(prob.beta, 2, 1, 3);
    DeviceTensor qd(qs.buffer), kd(ks.buffer), gd(gs.buffer), bd(bs.buffer);
    flash_kda::ForwardArgs as = a;
    as.q = qd.on_device(qs.view);
    as.k = kd.on_device(ks.view);
    as.g = gd.on_device(gs.view);
    as.beta = bd.on_device(bs.view);
    std::vector<double> o_str, s_str;
    run_and_download(as, p, out, ht, o_str, s_str);
    ASSERT_EQ(o_str.size(), o_ref.size());
    EXPECT_EQ(std::memcmp(o_str.data(), o_ref.data(), o_ref.size() * sizeof(double)), 0) << int(mode);
    EXPECT_EQ(std::memcmp(s_str.data(), s_ref.data(), s_ref.size() * sizeof(double)), 0) << int(mode);
    for (double x : o_ref) ASSERT_TRUE(std::isfinite(x));  // both calls ran (out was not left as is)
  }
}


// ---- The prepare kernel's row forms (row_layout.h: General, Flat, Dense) give the same bits.
//
// One call per gate (FlashKDA's safe call, the safe gate without dt_bias, softplus, pre-gated),
// bf16 and fp32 g, fixed length (B = 2 and B = 1) and varlen with an empty sequence and GVA,
// run with three sets of the same inputs: contiguous, views of fused projections (q, k slots of
// [B, T, 3, H, K], g of [B, T, 2, HV, K], beta of [B, T, 2, HV]) and the same views over
// buffers of more tokens a sequence. prepare_form says which form each takes (checked: each
// form is run where the inputs allow it; on the fused views FlashKDA's safe call takes the Flat
// form with its flags fixed, plan.h's prepare_flashkda_flags, the other calls the Flat form
// with their flags read); out and final_state must match bit for bit.
struct FormCase {
  const char* name;
  GateMode gate;
  bool with_dt_bias;
};

TEST(ForwardRowFormsGpu, EveryFormGivesTheSameBits) {
  const std::string why = flash_kda::testing::gpu_skip_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  using flash_kda::sm90::RowForm;
  using flash_kda::sm90::prepare_form;
  enum class Shape { FixedB2, FixedB1, Varlen };
  for (const FormCase& fc : {FormCase{"safe", GateMode::SafeSigmoid, true},
                             FormCase{"safe_nobias", GateMode::SafeSigmoid, false},
                             FormCase{"softplus", GateMode::Softplus, true},
                             FormCase{"pregated", GateMode::PreGated, false}})
    for (Shape shape : {Shape::FixedB2, Shape::FixedB1, Shape::Varlen})
      for (bool g_f32 : {false, true}) {
        const char* shape_name = shape == Shape::Varlen ? " varlen" : shape == Shape::FixedB1 ? " B=1" : " B=2";
        const std::string what = std::string(fc.name) + shape_name + (g_f32 ? " g fp32" : " g bf16");
        KdaConfig cfg;
        cfg.head_dim_k = cfg.head_dim_v = 128;
        cfg.input_dtype = DType::BF16;
        cfg.out_dtype = DType::BF16;
        if (shape == Shape::Varlen) {
          cfg.seqlens = {37, 0, 1, 20};
          cfg.heads = 1;
          cfg.value_heads = 2;
        } else {
          cfg.batch = shape == Shape::FixedB1 ? 1 : 2;
          cfg.seqlen = 37;
          cfg.heads = 2;
          cfg.value_heads = 4;
        }
        cfg.gate = fc.gate;
        cfg.with_dt_bias = fc.with_dt_bias;
        cfg.seed = std::hash<std::string>{}(what);
        KdaProblem prob = make_random_problem(cfg);
        if (g_f32) prob.g = to_f32(prob.g);
        flash_kda::ForwardArgs a = prob.args();
        DeviceTensor q(prob.q), k(prob.k), v(prob.v), g(prob.g), beta(prob.beta), A_log(prob.A_log),
            dt_bias(prob.dt_bias), cu(prob.cu_seqlens), h0(prob.initial_state), ht(prob.final_state), out(prob.out);
        flash_kda::testing::set_views(a, q, k, v, g, beta, out, A_log, dt_bias, cu, h0, ht);
        const flash_kda::ProblemShape p = flash_kda::validate(a, flash_kda::Target::Sm90);
        const bool flashkda = fc.gate == GateMode::SafeSigmoid && fc.with_dt_bias;
        EXPECT_EQ(prepare_form(a, p), flashkda ? RowForm::Dense : RowForm::Flat) << what << ": contiguous";
        std::vector<double> o_ref, s_ref;
        run_and_download(a, p, out, ht, o_ref, s_ref);
        for (double x : o_ref) ASSERT_TRUE(std::isfinite(x)) << what;  // the call ran (out was poisoned)

        // pad: extra tokens a sequence in every buffer (0: views of fused projections).
        for (int64_t pad : {0, 5}) {
          StridedCopy qs = strided_copy(prob.q, 3, 0, pad), ks = strided_copy(prob.k, 3, 1, pad);
          StridedCopy gs = strided_copy(prob.g, 2, 0, pad), bs = strided_copy(prob.beta, 2, 1, pad);
          DeviceTensor qd(qs.buffer), kd(ks.buffer), gd(gs.buffer), bd(bs.buffer);
          flash_kda::ForwardArgs as = a;
          as.q = qd.on_device(qs.view);
          as.k = kd.on_device(ks.view);
          as.g = gd.on_device(gs.view);
          as.beta = bd.on_device(bs.view);
          // Varlen and a batch of one fold any such view; two sequences T + 5 tokens apart do not.
          const RowForm want = pad > 0 && shape == Shape::FixedB2 ? RowForm::General : RowForm::Flat;
          const std::string view_what = what + (pad > 0 ? ": views of longer buffers" : ": fused projections");
          EXPECT_EQ(prepare_form(as, p), want) << view_what;
          std::vector<double> o, st;
          run_and_download(as, p, out, ht, o, st);
          ASSERT_EQ(o.size(), o_ref.size());
          EXPECT_EQ(std::memcmp(o.data(), o_ref.data(), o_ref.size() * sizeof(double)), 0) << view_what << ": out";
          EXPECT_EQ(std::memcmp(st.data(), s_ref.data(), s_ref.size() * sizeof(double)), 0) << view_what << ": state";
        }
      }
}

}  // namespace
#endif  // FLASH_KDA_WITH_CUDA
