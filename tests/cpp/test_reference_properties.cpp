// Structural properties of the reference that the spec implies exactly: varlen is a set of
// independent sequences, GVA is head repetition, the two state layouts are transposes, bf16
// and fp32 inputs holding the same values are the same call, results round once, and a bad
// call writes nothing. Every comparison here is bitwise, since each pair of calls performs the
// same fp64 operations in the same order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "reference_test_util.h"

namespace {

using flash_kda::DType;
using flash_kda::ForwardArgs;
using flash_kda::GateMode;
using flash_kda::StateLayout;
using flash_kda::testing::HostTensor;
using flash_kda::testing::KdaConfig;
using flash_kda::testing::KdaProblem;
using flash_kda::testing::make_random_problem;

// Elements [start, start + len) of the outermost-but-one axis of t ([1, T, ...] tensors) or,
// with `axis` 0, of the outermost axis ([N, ...] states). Same dtype, values copied exactly.
HostTensor slice(const HostTensor& t, int axis, int64_t start, int64_t len) {
  std::vector<int64_t> shape = t.shape();
  int64_t inner = 1;
  for (size_t d = size_t(axis) + 1; d < shape.size(); ++d) inner *= shape[d];
  shape[size_t(axis)] = len;
  HostTensor s(t.dtype(), shape);
  const int64_t es = flash_kda::dtype_size(t.dtype());
  std::memcpy(s.data(), t.bytes().data() + start * inner * es, size_t(len * inner * es));
  return s;
}

// A copy of t in another dtype (values are converted; exact when they are representable).
HostTensor as_dtype(const HostTensor& t, DType dtype) { return HostTensor::from_values(t.values(), dtype, t.shape()); }

// [N, HV, X, Y] -> [N, HV, Y, X].
HostTensor transpose_state(const HostTensor& t) {
  const auto& s = t.shape();
  HostTensor r(t.dtype(), {s[0], s[1], s[3], s[2]});
  for (int64_t nh = 0; nh < s[0] * s[1]; ++nh)
    for (int64_t x = 0; x < s[2]; ++x)
      for (int64_t y = 0; y < s[3]; ++y) r.set((nh * s[3] + y) * s[2] + x, t.get((nh * s[2] + x) * s[3] + y));
  return r;
}

TEST(ReferenceProperties, VarlenEqualsSequencesOneByOne) {
  for (DType cu_dtype : {DType::I64, DType::I32}) {
    SCOPED_TRACE(flash_kda::dtype_name(cu_dtype));
    KdaConfig cfg;
    cfg.seqlens = {5, 0, 1, 13, 0, 7, 1};
    cfg.heads = 2;
    cfg.value_heads = 4;
    cfg.head_dim_k = 8;
    cfg.head_dim_v = 6;
    cfg.cu_dtype = cu_dtype;
    cfg.seed = 11;
    KdaProblem batch = make_random_problem(cfg);
    flash_kda::reference_forward(batch.args(), 3);
    const auto out = batch.out.values(), fin = batch.final_state.values();
    const int64_t HV = cfg.value_heads, V = cfg.head_dim_v, state_size = HV * cfg.head_dim_k * V;

    int64_t start = 0;
    for (size_t n = 0; n < cfg.seqlens.size(); ++n) {
      SCOPED_TRACE("sequence " + std::to_string(n));
      const int64_t len = cfg.seqlens[n];
      const auto init_n = slice(batch.initial_state, 0, int64_t(n), 1).values();
      const std::vector<double> fin_n(fin.begin() + int64_t(n) * state_size, fin.begin() + int64_t(n + 1) * state_size);
      if (len == 0) {  // a fixed-length call cannot have T = 0; the state must pass through
        EXPECT_EQ(fin_n, init_n);
        continue;
      }
      KdaProblem one = batch;
      one.config.seqlens.clear();
      one.cu_seqlens = HostTensor();
      for (HostTensor* t : {&one.q, &one.k, &one.v, &one.g, &one.beta, &one.out}) *t = slice(*t, 1, start, len);
      one.initial_state = slice(batch.initial_state, 0, int64_t(n), 1);
      one.final_state = HostTensor(batch.final_state.dtype(), one.initial_state.shape());
      flash_kda::reference_forward(one.args(), 1);
      const std::vector<double> out_n(out.begin() + start * HV * V, out.begin() + (start + len) * HV * V);
      EXPECT_EQ(one.out.values(), out_n);
      EXPECT_EQ(one.final_state.values(), fin_n);
      start += len;
    }
  }
}

TEST(ReferenceProperties, ZeroLengthSequencePassesInitialStateThrough) {
  for (DType state_dtype : {DType::BF16, DType::F32, DType::F64}) {
    for (StateLayout layout : {StateLayout::VFirst, StateLayout::KFirst}) {
      SCOPED_TRACE(std::string(flash_kda::dtype_name(state_dtype)) + (layout == StateLayout::VFirst ? " v-first" : " k-first"));
      KdaConfig cfg;
      cfg.seqlens = {0, 4, 0};
      cfg.head_dim_k = 6;
      cfg.head_dim_v = 10;
      cfg.state_dtype = state_dtype;
      cfg.state_layout = layout;
      cfg.seed = 12;
      KdaProblem p = make_random_problem(cfg);
      p.final_state.fill(123.0);
      flash_kda::reference_forward(p.args(), 2);
      const size_t bytes = p.initial_state.bytes().size() / 3;
      const auto& in = p.initial_state.bytes();
      const auto& fin = p.final_state.bytes();
      EXPECT_TRUE(std::equal(in.begin(), in.begin() + bytes, fin.begin())) << "sequence 0";
      EXPECT_TRUE(std::equal(in.begin() + 2 * bytes, in.end(), fin.begin() + 2 * bytes)) << "sequence 2";
      EXPECT_FALSE(std::equal(in.begin() + bytes, in.begin() + 2 * bytes, fin.begin() + bytes))
          << "sequence 1 has tokens, so its state must change";
    }
  }
}

TEST(ReferenceProperties, GvaEqualsRepeatedQkHeads) {
  KdaConfig cfg;
  cfg.heads = 2;
  cfg.value_heads = 6;  // G = 3: value heads 0-2 read q/k head 0, 3-5 read head 1
  cfg.head_dim_k = 8;
  cfg.head_dim_v = 5;
  cfg.seed = 13;
  KdaProblem gva = make_random_problem(cfg);
  flash_kda::reference_forward(gva.args(), 2);

  KdaProblem rep = gva;
  const int64_t B = cfg.batch, T = cfg.seqlen, H = cfg.heads, HV = cfg.value_heads, K = cfg.head_dim_k;
  for (HostTensor* t : {&rep.q, &rep.k}) {
    const HostTensor src = *t;
    *t = HostTensor(src.dtype(), {B, T, HV, K});
    for (int64_t bt = 0; bt < B * T; ++bt)
      for (int64_t hv = 0; hv < HV; ++hv)
        for (int64_t i = 0; i < K; ++i) t->set((bt * HV + hv) * K + i, src.get((bt * H + hv / (HV / H)) * K + i));
  }
  rep.out = HostTensor(gva.out.dtype(), gva.out.shape());
  rep.final_state = HostTensor(gva.final_state.dtype(), gva.final_state.shape());
  flash_kda::reference_forward(rep.args(), 2);
  EXPECT_EQ(rep.out.values(), gva.out.values());
  EXPECT_EQ(rep.final_state.values(), gva.final_state.values());
}

TEST(ReferenceProperties, StateLayoutsAreTransposes) {
  KdaConfig cfg;
  cfg.head_dim_k = 8;
  cfg.head_dim_v = 12;
  cfg.state_layout = StateLayout::KFirst;
  cfg.seed = 14;
  KdaProblem k_first = make_random_problem(cfg);
  flash_kda::reference_forward(k_first.args(), 2);

  KdaProblem v_first = k_first;
  v_first.config.state_layout = StateLayout::VFirst;
  v_first.initial_state = transpose_state(k_first.initial_state);
  v_first.final_state = HostTensor(k_first.final_state.dtype(), v_first.initial_state.shape());
  v_first.out = HostTensor(k_first.out.dtype(), k_first.out.shape());
  flash_kda::reference_forward(v_first.args(), 2);
  EXPECT_EQ(v_first.out.values(), k_first.out.values());
  EXPECT_EQ(transpose_state(v_first.final_state).values(), k_first.final_state.values());
}

TEST(ReferenceProperties, Bf16AndFp32InputsWithSameValuesAgree) {
  KdaConfig cfg;
  cfg.input_dtype = DType::BF16;
  cfg.seqlens = {9, 3, 0, 12};
  cfg.gate = GateMode::Softplus;
  cfg.seed = 15;
  KdaProblem bf16 = make_random_problem(cfg);
  flash_kda::reference_forward(bf16.args(), 2);

  KdaProblem fp32 = bf16;
  for (HostTensor* t : {&fp32.q, &fp32.k, &fp32.v, &fp32.g, &fp32.beta}) *t = as_dtype(*t, DType::F32);
  fp32.out = HostTensor(bf16.out.dtype(), bf16.out.shape());
  fp32.final_state = HostTensor(bf16.final_state.dtype(), bf16.final_state.shape());
  flash_kda::reference_forward(fp32.args(), 2);
  EXPECT_EQ(fp32.out.values(), bf16.out.values());
  EXPECT_EQ(fp32.final_state.values(), bf16.final_state.values());
}

TEST(ReferenceProperties, ThreadCountDoesNotChangeResults) {
  KdaConfig cfg;
  cfg.seqlens = {30, 1, 17};
  cfg.heads = 2;
  cfg.value_heads = 4;
  cfg.seed = 16;
  KdaProblem base = make_random_problem(cfg);
  flash_kda::reference_forward(base.args(), 1);
  for (int threads : {0, 2, 5, 64}) {
    SCOPED_TRACE(threads);
    KdaProblem p = base;
    p.out.fill(0.0);
    p.final_state.fill(0.0);
    flash_kda::reference_forward(p.args(), threads);
    EXPECT_EQ(p.out.values(), base.out.values());
    EXPECT_EQ(p.final_state.values(), base.final_state.values());
  }
}

// The bf16 value with bit pattern `bits` +- 1 is the neighbour on either side (same sign).
double bf16_neighbour(uint16_t bits, int step) {
  return flash_kda::testing::bf16_bits_to_float(uint16_t(bits + step));
}

TEST(ReferenceProperties, NarrowOutputsAreTheFp64ResultRoundedOnce) {
  KdaConfig cfg;
  cfg.state_dtype = DType::F64;
  cfg.seed = 17;
  KdaProblem wide = make_random_problem(cfg);
  flash_kda::reference_forward(wide.args(), 2);
  const auto out = wide.out.values(), fin = wide.final_state.values();

  KdaProblem f32 = wide;
  f32.out = HostTensor(DType::F32, wide.out.shape());
  flash_kda::reference_forward(f32.args(), 2);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(f32.out.get(int64_t(i)), double(float(out[i]))) << i;

  // bf16 out and bf16 states: each stored value must be a nearest bf16 to the fp64 result.
  KdaProblem bf = wide;
  bf.out = HostTensor(DType::BF16, wide.out.shape());
  bf.initial_state = as_dtype(wide.initial_state, DType::BF16);
  bf.final_state = HostTensor(DType::BF16, wide.final_state.shape());
  KdaProblem ref_bf_state = bf;  // same bf16 initial state, fp64 results
  ref_bf_state.out = HostTensor(DType::F64, wide.out.shape());
  ref_bf_state.initial_state = as_dtype(bf.initial_state, DType::F64);
  ref_bf_state.final_state = HostTensor(DType::F64, wide.final_state.shape());
  flash_kda::reference_forward(bf.args(), 2);
  flash_kda::reference_forward(ref_bf_state.args(), 2);
  auto check_nearest = [](const HostTensor& got, const std::vector<double>& exact, const char* what) {
    const auto* bits = static_cast<const uint16_t*>(static_cast<const void*>(got.bytes().data()));
    for (size_t i = 0; i < exact.size(); ++i) {
      const double err = std::fabs(got.get(int64_t(i)) - exact[i]);
      ASSERT_LE(err, std::fabs(bf16_neighbour(bits[i], 1) - exact[i])) << what << " element " << i;
      ASSERT_LE(err, std::fabs(bf16_neighbour(bits[i], -1) - exact[i])) << what << " element " << i;
    }
  };
  check_nearest(bf.out, ref_bf_state.out.values(), "out");
  check_nearest(bf.final_state, ref_bf_state.final_state.values(), "final_state");
}

TEST(ReferenceProperties, InPlaceStateUpdateEqualsSeparateBuffers) {
  KdaConfig cfg;
  cfg.seqlens = {6, 0, 11};
  cfg.seed = 18;
  KdaProblem separate = make_random_problem(cfg);
  flash_kda::reference_forward(separate.args(), 2);

  KdaProblem in_place = separate;
  in_place.out = HostTensor(separate.out.dtype(), separate.out.shape());
  ForwardArgs a = in_place.args();
  a.final_state = a.initial_state;  // the state tensor is updated where it lies
  flash_kda::reference_forward(a, 2);
  EXPECT_EQ(in_place.out.values(), separate.out.values());
  EXPECT_EQ(in_place.initial_state.values(), separate.final_state.values());
}

TEST(ReferenceProperties, BadCuSeqlensValuesWriteNothing) {
  struct Bad {
    const char* what;
    std::vector<int64_t> cu;
  };
  // T_total = 10 tokens in every case.
  const Bad cases[] = {
      {"first entry not 0", {1, 4, 10}},
      {"decreasing", {0, 6, 4, 10}},
      {"last entry != T_total", {0, 4, 9}},
  };
  for (const Bad& bad : cases) {
    for (DType cu_dtype : {DType::I64, DType::I32}) {
      SCOPED_TRACE(std::string(bad.what) + " " + flash_kda::dtype_name(cu_dtype));
      KdaConfig cfg;
      cfg.seqlens = std::vector<int64_t>(bad.cu.size() - 1, 0);
      cfg.seqlens[0] = 10;
      cfg.seed = 19;
      KdaProblem p = make_random_problem(cfg);
      p.cu_seqlens = HostTensor::from_values(std::vector<double>(bad.cu.begin(), bad.cu.end()), cu_dtype,
                                             {int64_t(bad.cu.size())});
      p.out.fill(-7.0);
      p.final_state.fill(-7.0);
      const auto out_before = p.out.bytes(), fin_before = p.final_state.bytes(), init_before = p.initial_state.bytes();
      try {
        flash_kda::reference_forward(p.args(), 2);
        ADD_FAILURE() << "expected flash_kda::Error";
      } catch (const flash_kda::Error& e) {
        EXPECT_EQ(e.argument(), "cu_seqlens") << e.what();
      }
      EXPECT_EQ(p.out.bytes(), out_before);
      EXPECT_EQ(p.final_state.bytes(), fin_before);
      EXPECT_EQ(p.initial_state.bytes(), init_before);
    }
  }
}

}  // namespace
