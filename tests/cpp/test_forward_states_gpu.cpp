// flash_kda::forward on an sm_90 GPU with strided v and out, k-first states, independent state
// dtypes and the ssm_state_indices pool, each through both recurrence paths (window pass,
// forced small windows; segment-parallel, forced segments). Exactness where the function is the
// same (views vs contiguous, k-first vs v-first: bit for bit); otherwise against the fp64
// reference_forward, relative Frobenius error <= 1e-2 (docs/kda-spec.md accuracy contract).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "flash_kda/call_table.h"
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
using flash_kda::TensorView;
using flash_kda::testing::DeviceTensor;
using flash_kda::testing::HostTensor;
using flash_kda::testing::KdaConfig;
using flash_kda::testing::KdaProblem;
using flash_kda::testing::make_random_problem;
using flash_kda::testing::rel_frobenius;

constexpr double kBound = 1e-2;

// Device copies of host tensors; a host view (any strides, into one of them) is re-pointed at
// the same bytes of its copy.
class Mirror {
 public:
  void add(HostTensor& h) {
    if (h.defined()) copies_.push_back({&h, std::make_unique<DeviceTensor>(h)});
  }
  TensorView on_device(const TensorView& t) const {
    if (!t.defined()) return t;
    const char* p = static_cast<const char*>(t.data);
    for (const auto& c : copies_) {
      const char* b = static_cast<const char*>(c.host->data());
      if (p >= b && p < b + c.host->bytes().size()) return c.device->on_device(t);
    }
    ADD_FAILURE() << "a view outside every mirrored tensor";
    return t;
  }
  /// Every device copy back into its host tensor.
  void download() {
    for (auto& c : copies_) c.device->download();
  }

 private:
  struct Copy {
    HostTensor* host;
    std::unique_ptr<DeviceTensor> device;
  };
  std::vector<Copy> copies_;
};

// forward() on the device copies of `host`'s tensors (all in `m`), then every copy downloaded.
void run_forward(const ForwardArgs& host, Mirror& m, const LaunchOptions& options) {
  ForwardArgs a = host;
  for (const flash_kda::TensorSpec& s : flash_kda::kForwardTensors)
    if (!s.host_only) a.*(s.member) = m.on_device(host.*(s.member));
  const size_t bytes = flash_kda::forward_workspace_size(a, options);
  void* ws = nullptr;
  ASSERT_EQ(cudaMalloc(&ws, bytes ? bytes : 1), cudaSuccess);
  flash_kda::forward(a, ws, bytes, nullptr, options);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaFree(ws);
  m.download();
}

struct Path {
  const char* name;
  LaunchOptions options;
};
std::vector<Path> paths() {
  LaunchOptions windows, segments, warps4;
  windows.window_slots = 3;  // sequences cross windows: the carry path
  segments.segments = 3;     // segment maps, scan, finish
  warps4.segments = 1;
  warps4.recurrence_warps = 4;
  return {{"plan", {}}, {"windows3", windows}, {"segments3", segments}, {"warps4", warps4}};
}

KdaConfig config(bool varlen, DType state, StateLayout layout) {
  KdaConfig c;
  c.head_dim_k = c.head_dim_v = 128;
  c.heads = c.value_heads = 2;
  c.out_dtype = DType::BF16;
  c.state_dtype = state;
  c.state_layout = layout;
  if (varlen)
    c.seqlens = {70, 0, 1, 150, 33};
  else
    c.batch = 2, c.seqlen = 130;
  return c;
}

void expect_finite(const std::vector<double>& x, const char* what) {
  for (double e : x) ASSERT_TRUE(std::isfinite(e)) << what << " has NaN/Inf (unwritten or overflow)";
}

// The reference on the same inputs and state dtypes, fp64 out.
std::vector<double> reference_out(KdaProblem& p, ForwardArgs a) {
  HostTensor ref(DType::F64, p.out.shape());
  a.out = ref.view();
  flash_kda::reference_forward(a);
  return ref.values();
}

class StatesGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = flash_kda::testing::gpu_skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
  }
};

// v as slice 1 of a fused [B, T, 2, HV, V] buffer (token stride 2 HV V) and out as buf[:, :T]
// of a [B, T + 5, HV, V] buffer give the contiguous call's bits; the rows past T stay as they were.
TEST_F(StatesGpu, StridedVAndOutBitExact) {
  for (bool varlen : {false, true})
    for (const Path& path : paths()) {
      SCOPED_TRACE(std::string(varlen ? "varlen " : "fixed ") + path.name);
      KdaProblem p = make_random_problem(config(varlen, DType::F32, StateLayout::VFirst));
      Mirror m0;
      for (HostTensor* t : {&p.q, &p.k, &p.v, &p.g, &p.beta, &p.A_log, &p.dt_bias, &p.cu_seqlens, &p.initial_state,
                            &p.final_state, &p.out})
        m0.add(*t);
      run_forward(p.args(), m0, path.options);
      const std::vector<double> want_out = p.out.values(), want_state = p.final_state.values();

      const auto& s = p.v.shape();
      const int64_t B = s[0], T = s[1], HV = s[2], V = s[3];
      HostTensor vbuf(DType::BF16, {B, T, 2, HV, V}), obuf(DType::BF16, {B, T + 5, HV, V});
      for (int64_t r = 0; r < B * T; ++r)
        for (int64_t e = 0; e < HV * V; ++e) {
          vbuf.set((r * 2 + 1) * HV * V + e, p.v.get(r * HV * V + e));
          vbuf.set((r * 2) * HV * V + e, 1e4);  // slice 0: must never be read
        }
      obuf.fill(-7.0);
      ForwardArgs a = p.args();
      a.v = p.v.view();
      a.v.data = static_cast<char*>(vbuf.data()) + HV * V * 2;
      a.v.strides[1] = 2 * HV * V;
      a.v.strides[0] = T * 2 * HV * V;
      a.out = obuf.view();
      a.out.shape[1] = T;
      p.final_state.fill(std::nan(""));
      Mirror m;
      for (HostTensor* t : {&p.q, &p.k, &vbuf, &p.g, &p.beta, &p.A_log, &p.dt_bias, &p.cu_seqlens, &p.initial_state,
                            &p.final_state, &obuf})
        m.add(*t);
      run_forward(a, m, path.options);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T + 5; ++t)
          for (int64_t e = 0; e < HV * V; ++e) {
            const double got = obuf.get((b * (T + 5) + t) * HV * V + e);
            if (t < T)
              ASSERT_EQ(got, want_out[size_t((b * T + t) * HV * V + e)]) << "b " << b << " t " << t << " e " << e;
            else
              ASSERT_EQ(got, -7.0) << "a row past the view was written";
          }
      EXPECT_EQ(p.final_state.values(), want_state);
    }
}

// k-first states: out bit-identical to the v-first call and the final state its transpose, for
// every state dtype pair; the v-first call itself against the reference.
TEST_F(StatesGpu, KFirstIsTheTransposeAndDtypesAreIndependent) {
  const DType kDtypes[] = {DType::BF16, DType::F32};
  for (bool varlen : {false, true})
    for (const Path& path : paths())
      for (DType din : kDtypes)
        for (DType dout : kDtypes) {
          SCOPED_TRACE(std::string(varlen ? "varlen " : "fixed ") + path.name + " " + flash_kda::dtype_name(din) +
                       " -> " + flash_kda::dtype_name(dout));
          KdaProblem p = make_random_problem(config(varlen, din, StateLayout::VFirst));
          p.final_state = HostTensor(dout, p.initial_state.shape());
          // Reference: fp64 out, final state in dout.
          HostTensor ref_state(dout, p.initial_state.shape());
          ForwardArgs ra = p.args();
          ra.final_state = ref_state.view();
          const std::vector<double> ref_out = reference_out(p, ra);

          p.out.fill(std::nan(""));
          p.final_state.fill(std::nan(""));
          Mirror mv;
          for (HostTensor* t : {&p.q, &p.k, &p.v, &p.g, &p.beta, &p.A_log, &p.dt_bias, &p.cu_seqlens,
                                &p.initial_state, &p.final_state, &p.out})
            mv.add(*t);
          run_forward(p.args(), mv, path.options);
          const std::vector<double> out_v = p.out.values(), state_v = p.final_state.values();
          expect_finite(out_v, "out");
          expect_finite(state_v, "final_state");
          EXPECT_LE(rel_frobenius(out_v, ref_out), kBound);
          EXPECT_LE(rel_frobenius(state_v, ref_state.values()), kBound);

          // The same call in k-first layout: initial_state transposed per head.
          const int64_t heads = p.initial_state.numel() / (128 * 128);
          HostTensor h0k(din, p.initial_state.shape()), htk(dout, p.initial_state.shape());
          for (int64_t nh = 0; nh < heads; ++nh)
            for (int64_t i = 0; i < 128; ++i)
              for (int64_t j = 0; j < 128; ++j)
                h0k.set(nh * 16384 + i * 128 + j, p.initial_state.get(nh * 16384 + j * 128 + i));
          htk.fill(std::nan(""));
          p.out.fill(std::nan(""));
          ForwardArgs ka = p.args();
          ka.state_layout = StateLayout::KFirst;
          ka.initial_state = h0k.view();
          ka.final_state = htk.view();
          Mirror mk;
          for (HostTensor* t : {&p.q, &p.k, &p.v, &p.g, &p.beta, &p.A_log, &p.dt_bias, &p.cu_seqlens, &h0k, &htk,
                                &p.out})
            mk.add(*t);
          run_forward(ka, mk, path.options);
          ASSERT_EQ(p.out.values(), out_v) << "k-first out differs from v-first";
          for (int64_t nh = 0; nh < heads; ++nh)
            for (int64_t i = 0; i < 128; ++i)
              for (int64_t j = 0; j < 128; ++j)
                ASSERT_EQ(htk.get(nh * 16384 + i * 128 + j), state_v[size_t(nh * 16384 + j * 128 + i)])
                    << "k-first final state is not the transpose, head " << nh;
        }
}

// In place (final_state is initial_state), both layouts: against the reference.
TEST_F(StatesGpu, InPlace) {
  for (StateLayout layout : {StateLayout::VFirst, StateLayout::KFirst})
    for (const Path& path : paths()) {
      SCOPED_TRACE(path.name);
      KdaProblem p = make_random_problem(config(true, DType::F32, layout));
      HostTensor ref_state(DType::F32, p.initial_state.shape());
      ForwardArgs ra = p.args();
      ra.final_state = ref_state.view();
      const std::vector<double> ref_out = reference_out(p, ra);
      ForwardArgs a = p.args();
      a.final_state = p.initial_state.view();
      Mirror m;
      for (HostTensor* t : {&p.q, &p.k, &p.v, &p.g, &p.beta, &p.A_log, &p.dt_bias, &p.cu_seqlens, &p.initial_state,
                            &p.out})
        m.add(*t);
      run_forward(a, m, path.options);
      EXPECT_LE(rel_frobenius(p.out.values(), ref_out), kBound);
      EXPECT_LE(rel_frobenius(p.initial_state.values(), ref_state.values()), kBound);
    }
}

// Prefill into a pool of P = 7 slots: slots idx[n]; -1 and an index >= P (skipped on the device)
// give zero out rows and touch no slot; every slot no sequence names keeps its bits.
TEST_F(StatesGpu, PoolPrefill) {
  for (StateLayout layout : {StateLayout::VFirst, StateLayout::KFirst})
    for (DType dtype : {DType::BF16, DType::F32})
      for (bool in_place : {true, false})
        for (const Path& path : paths()) {
          SCOPED_TRACE(std::string(path.name) + (in_place ? " in place " : " two pools ") +
                       flash_kda::dtype_name(dtype) + (layout == StateLayout::KFirst ? " k-first" : " v-first"));
          KdaConfig c = config(true, dtype, layout);  // 5 sequences
          c.with_initial_state = c.with_final_state = false;
          KdaProblem p = make_random_problem(c);
          const int64_t P = 7, slot = 2 * 128 * 128;
          KdaConfig pc = config(false, dtype, layout);
          pc.batch = P;
          pc.seqlen = 1;
          pc.seed = 11;
          HostTensor pool = make_random_problem(pc).initial_state;
          const HostTensor pool_before = pool;
          HostTensor final_pool(dtype, pool.shape());
          final_pool.fill(5.0);
          const HostTensor final_before = final_pool;
          // Sequences [0, 70), [70, 70), [70, 71), [71, 221), [221, 254): the empty one passes slot
          // 0 through; 9 >= P is skipped on the GPU (the reference rejects it: -1 there).
          const std::vector<double> idx_gpu = {4, 0, -1, 6, 9};
          const std::vector<double> idx_ref = {4, 0, -1, 6, -1};
          HostTensor indices = HostTensor::from_values(idx_gpu, DType::I64, {5});
          HostTensor indices_ref = HostTensor::from_values(idx_ref, DType::I64, {5});

          HostTensor ref_pool = in_place ? pool : final_pool;
          ForwardArgs ra = p.args();
          HostTensor ref_in = pool;
          ra.initial_state = ref_in.view();
          ra.final_state = ref_pool.view();
          ra.ssm_state_indices = indices_ref.view();
          const std::vector<double> ref_out = reference_out(p, ra);

          p.out.fill(std::nan(""));
          ForwardArgs a = p.args();
          a.initial_state = pool.view();
          a.final_state = in_place ? pool.view() : final_pool.view();
          a.ssm_state_indices = indices.view();
          Mirror m;
          for (HostTensor* t : {&p.q, &p.k, &p.v, &p.g, &p.beta, &p.A_log, &p.dt_bias, &p.cu_seqlens, &pool,
                                &final_pool, &indices, &p.out})
            m.add(*t);
          run_forward(a, m, path.options);
          const std::vector<double> out = p.out.values();
          expect_finite(out, "out");
          EXPECT_LE(rel_frobenius(out, ref_out), kBound);
          // Padded sequences 2 and 4: rows [70, 71) and [221, 254) exactly zero.
          for (int64_t t = 0; t < 254; ++t)
            if (t == 70 || t >= 221)
              for (int64_t e = 0; e < 256; ++e) ASSERT_EQ(out[size_t(t * 256 + e)], 0.0) << "padded row " << t;
          const HostTensor& got = in_place ? pool : final_pool;
          const HostTensor& before = in_place ? pool_before : final_before;
          for (int64_t s = 0; s < P; ++s) {
            const bool named = s == 4 || s == 0 || s == 6;
            std::vector<double> g(static_cast<size_t>(slot)), r(static_cast<size_t>(slot));
            for (int64_t e = 0; e < slot; ++e) {
              g[size_t(e)] = got.get(s * slot + e);
              r[size_t(e)] = (named ? ref_pool : before).get(s * slot + e);
            }
            if (named)
              EXPECT_LE(rel_frobenius(g, r), kBound) << "slot " << s;
            else
              ASSERT_EQ(g, r) << "slot " << s << " belongs to no sequence and changed";
          }
        }
}

}  // namespace
#endif  // FLASH_KDA_WITH_CUDA
