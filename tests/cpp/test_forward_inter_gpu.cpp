// flash_kda::forward's intermediate (prefix-cache) states on an sm_90 GPU (include/flash_kda/
// forward.h), on every recurrence path (plan, small windows that sequences cross, forced
// segments, 4-warp blocks), both layouts and dtypes, fixed length with a partial last chunk and
// varlen with empty and partial sequences, in fla's form (every 64 with the start state, one
// row per started chunk) and the every-n form (with and without the start state, ranges with a
// row no state reaches). Checked: every written row against the fp64 reference_forward
// (relative Frobenius error <= 1e-2, the accuracy contract's bound for states), every row that
// must stay untouched bit for bit, out and final_state bit-identical to the same call without
// intermediate states, and a state after a sequence's last token equal to its final state.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "flash_kda/flash_kda.h"
#include "gpu_test_util.h"
#include "reference_test_util.h"

#if FLASH_KDA_WITH_CUDA
#include <cuda_runtime.h>

namespace {

using flash_kda::DType;
using flash_kda::ForwardArgs;
using flash_kda::LaunchOptions;
using flash_kda::StateLayout;
using flash_kda::testing::DeviceTensor;
using flash_kda::testing::HostTensor;
using flash_kda::testing::KdaConfig;
using flash_kda::testing::KdaProblem;
using flash_kda::testing::make_random_problem;
using flash_kda::testing::rel_frobenius;

constexpr double kBound = 1e-2;
constexpr double kSentinel = -776.0;  // exact in bf16 and fp32: an unwritten row reads back as itself

struct Path {
  const char* name;
  LaunchOptions options;
};
std::vector<Path> paths() {
  LaunchOptions windows, segments, warps4;
  windows.window_slots = 3;  // sequences cross windows: boundaries in the carried part
  segments.segments = 3;     // boundaries inside and at the ends of segments
  warps4.segments = 1;
  warps4.recurrence_warps = 4;
  return {{"plan", {}}, {"windows3", windows}, {"segments3", segments}, {"warps4", warps4}};
}

struct Form {
  const char* name;
  int64_t every;
  bool include_initial;
  bool fla_rows;    // ceil(len / 64) rows (fla's chunk_offsets), else every reachable state + 1 spare
};
const Form kForms[] = {{"fla", 64, true, true}, {"every48", 48, false, false}, {"every16+initial", 16, true, false}};

KdaConfig config(bool varlen, DType state, StateLayout layout) {
  KdaConfig c;
  c.head_dim_k = c.head_dim_v = 128;
  c.heads = c.value_heads = 2;
  c.out_dtype = DType::BF16;
  c.state_dtype = state;
  c.state_layout = layout;
  if (varlen)
    c.seqlens = {70, 0, 1, 150, 33, 64, 200};
  else
    c.batch = 2, c.seqlen = 300;  // 18 chunks and 12 tokens
  return c;
}

std::vector<int64_t> lengths(const KdaProblem& p) {
  if (!p.config.seqlens.empty()) return p.config.seqlens;
  return std::vector<int64_t>(size_t(p.config.batch), p.config.seqlen);
}

// Row counts per sequence for a form, and which rows a state reaches.
struct Rows {
  std::vector<int64_t> offsets;  // [N + 1]
  std::vector<bool> reached;     // [S]
};
Rows rows_for(const KdaProblem& p, const Form& f) {
  Rows r{{0}, {}};
  for (int64_t len : lengths(p)) {
    const int64_t reach = len / f.every + (f.include_initial ? 1 : 0);
    const int64_t count = f.fla_rows ? (len + 63) / 64 : reach + 1;
    r.offsets.push_back(r.offsets.back() + count);
    for (int64_t j = 0; j < count; ++j) r.reached.push_back(j < reach);
  }
  return r;
}

HostTensor states_tensor(const KdaProblem& p, int64_t S, DType dtype) {
  HostTensor t(dtype, {S, p.config.value_heads, 128, 128});  // K = V: one shape for both layouts
  t.fill(kSentinel);
  return t;
}

// forward() on device copies of p's tensors and, when `inter` is given, of the intermediate
// states and offsets; everything written is copied back into the host tensors.
void run_gpu(KdaProblem& p, HostTensor* inter, HostTensor* offsets, const Form& f, const LaunchOptions& options) {
  std::vector<std::unique_ptr<DeviceTensor>> d;
  auto dev = [&](HostTensor& h) {
    d.push_back(std::make_unique<DeviceTensor>(h));
    return d.back()->view();
  };
  ForwardArgs a = p.args();
  a.q = dev(p.q), a.k = dev(p.k), a.v = dev(p.v), a.g = dev(p.g), a.beta = dev(p.beta);
  a.A_log = dev(p.A_log), a.dt_bias = dev(p.dt_bias), a.cu_seqlens = dev(p.cu_seqlens);
  a.initial_state = dev(p.initial_state);
  a.out = dev(p.out);
  DeviceTensor* out = d.back().get();
  a.final_state = dev(p.final_state);
  DeviceTensor* fin = d.back().get();
  DeviceTensor* st = nullptr;
  if (inter != nullptr) {
    a.intermediate_states = dev(*inter);
    st = d.back().get();
    a.intermediate_offsets = dev(*offsets);
    a.intermediate_every = f.every;
    a.intermediate_include_initial = f.include_initial;
  }
  const size_t bytes = flash_kda::forward_workspace_size(a, options);
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&ws, bytes ? bytes : 1), cudaSuccess);
  flash_kda::forward(a, ws, bytes, nullptr, options);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(ws);
  out->download();
  fin->download();
  if (st != nullptr) st->download();
}

class InterGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = flash_kda::testing::gpu_skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
  }
};

TEST_F(InterGpu, EveryPathFormLayoutAndDtypeAgainstTheReference) {
  for (bool varlen : {false, true})
    for (StateLayout layout : {StateLayout::VFirst, StateLayout::KFirst})
      for (DType dtype : {DType::F32, DType::BF16})
        for (const Form& f : kForms) {
          KdaProblem p = make_random_problem(config(varlen, DType::F32, layout));
          const Rows rows = rows_for(p, f);
          const int64_t S = rows.offsets.back();
          HostTensor offsets = HostTensor::from_values(std::vector<double>(rows.offsets.begin(), rows.offsets.end()),
                                                       varlen ? DType::I32 : DType::I64, {int64_t(rows.offsets.size())});
          // The reference: fp64 states.
          HostTensor ref = states_tensor(p, S, DType::F64);
          HostTensor ref_out(DType::F64, p.out.shape());
          ForwardArgs ra = p.args();
          ra.out = ref_out.view();
          ra.intermediate_states = ref.view();
          ra.intermediate_offsets = offsets.view();
          ra.intermediate_every = f.every;
          ra.intermediate_include_initial = f.include_initial;
          flash_kda::reference_forward(ra);

          for (const Path& path : paths()) {
            SCOPED_TRACE(std::string(varlen ? "varlen " : "fixed ") + (layout == StateLayout::VFirst ? "v-first " : "k-first ") +
                         flash_kda::dtype_name(dtype) + " " + f.name + " " + path.name);
            run_gpu(p, nullptr, nullptr, f, path.options);  // without intermediate states
            const std::vector<double> plain_out = p.out.values(), plain_state = p.final_state.values();
            HostTensor got = states_tensor(p, S, dtype);
            p.out.fill(std::nan(""));
            p.final_state.fill(std::nan(""));
            run_gpu(p, &got, &offsets, f, path.options);
            EXPECT_EQ(p.out.values(), plain_out) << "out changed by asking for intermediate states";
            EXPECT_EQ(p.final_state.values(), plain_state) << "final_state changed by asking for intermediate states";

            const int64_t e = got.numel() / S;
            std::vector<double> g, r;
            for (int64_t row = 0; row < S; ++row)
              for (int64_t i = 0; i < e; ++i) {
                const double x = got.get(row * e + i);
                if (!rows.reached[size_t(row)]) {
                  ASSERT_EQ(x, kSentinel) << "row " << row << " is reached by no state but was written";
                  continue;
                }
                ASSERT_TRUE(std::isfinite(x)) << "row " << row << " element " << i;
                g.push_back(x);
                r.push_back(ref.get(row * e + i));
              }
            ASSERT_FALSE(r.empty());
            EXPECT_LE(rel_frobenius(g, r), kBound);
          }
        }
}

// A state after a sequence's last token (its length a multiple of every) is the final state:
// the same fp32 registers rounded to the same dtype, bit for bit.
TEST_F(InterGpu, StateAtTheSequenceEndIsTheFinalState) {
  for (const Path& path : paths())
    for (DType dtype : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(std::string(path.name) + " " + flash_kda::dtype_name(dtype));
      KdaConfig c = config(true, dtype, StateLayout::VFirst);
      c.seqlens = {64, 160, 32};
      KdaProblem p = make_random_problem(c);
      const Form f{"every32", 32, false, false};
      HostTensor offsets = HostTensor::from_values({0, 2, 7, 8}, DType::I64, {4});  // 64/32, 160/32, 32/32
      HostTensor got = states_tensor(p, 8, dtype);
      run_gpu(p, &got, &offsets, f, path.options);
      const int64_t e = got.numel() / 8;
      const int64_t last_row[] = {1, 6, 7};
      for (int64_t n = 0; n < 3; ++n)
        for (int64_t i = 0; i < e; ++i)
          ASSERT_EQ(got.get(last_row[n] * e + i), p.final_state.get(n * e + i)) << "sequence " << n << " element " << i;
    }
}

// Offsets past S on the device are clamped: nothing outside the tensor is written (a guard
// row after it keeps its sentinel) and the call completes.
TEST_F(InterGpu, BadDeviceOffsetsStayInsideTheTensor) {
  KdaProblem p = make_random_problem(config(true, DType::F32, StateLayout::VFirst));
  const int64_t N = int64_t(p.config.seqlens.size());
  std::vector<double> off(size_t(N + 1));
  for (int64_t n = 0; n <= N; ++n) off[size_t(n)] = double(n == N ? 1000 : 3 * n);  // the last range runs past S
  HostTensor offsets = HostTensor::from_values(off, DType::I64, {N + 1});
  const int64_t S = 3 * N;
  HostTensor guarded = states_tensor(p, S + 1, DType::F32);  // row S: the guard
  HostTensor* host = &guarded;
  // The call sees S rows; the device buffer has S + 1.
  std::vector<std::unique_ptr<DeviceTensor>> keep;
  const Form f{"every16", 16, true, false};
  {
    ForwardArgs a = p.args();
    auto dev = [&](HostTensor& h) {
      keep.push_back(std::make_unique<DeviceTensor>(h));
      return keep.back()->view();
    };
    a.q = dev(p.q), a.k = dev(p.k), a.v = dev(p.v), a.g = dev(p.g), a.beta = dev(p.beta);
    a.A_log = dev(p.A_log), a.dt_bias = dev(p.dt_bias), a.cu_seqlens = dev(p.cu_seqlens);
    a.initial_state = dev(p.initial_state), a.out = dev(p.out), a.final_state = dev(p.final_state);
    a.intermediate_states = dev(*host);
    DeviceTensor* st = keep.back().get();
    a.intermediate_states.shape[0] = S;
    a.intermediate_offsets = dev(offsets);
    a.intermediate_every = f.every;
    const size_t bytes = flash_kda::forward_workspace_size(a);
    void* ws = nullptr;
    ASSERT_EQ(cudaMalloc(&ws, bytes ? bytes : 1), cudaSuccess);
    flash_kda::forward(a, ws, bytes, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaFree(ws);
    st->download();
  }
  const int64_t e = guarded.numel() / (S + 1);
  for (int64_t i = 0; i < e; ++i) ASSERT_EQ(guarded.get(S * e + i), kSentinel) << "the guard row was written";
}

}  // namespace
#endif
