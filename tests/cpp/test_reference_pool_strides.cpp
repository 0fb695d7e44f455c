// reference_forward on strided activations, mixed state dtypes and the ssm_state_indices pool
// (include/flash_kda/forward.h), each against an equivalent plain call: the reference is the
// yardstick of the GPU tests of the same features, so its meaning is pinned here exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "flash_kda/flash_kda.h"
#include "reference_test_util.h"

namespace {

using flash_kda::DType;
using flash_kda::ForwardArgs;
using flash_kda::StateLayout;
using flash_kda::TensorView;
using flash_kda::testing::HostTensor;
using flash_kda::testing::KdaConfig;
using flash_kda::testing::KdaProblem;
using flash_kda::testing::make_random_problem;

KdaConfig small(int64_t batch, int64_t T) {
  KdaConfig c;
  c.batch = batch;
  c.seqlen = T;
  c.heads = c.value_heads = 2;
  c.head_dim_k = c.head_dim_v = 8;
  c.out_dtype = DType::F64;
  return c;
}

// q, k, v copied into one fused [B, T, 3, H, K] buffer (H = HV, K = V) and viewed from it.
struct Fused {
  HostTensor qkv;
  TensorView q, k, v;
  Fused(KdaProblem& p) {
    const auto& s = p.q.shape();
    const int64_t B = s[0], T = s[1], H = s[2], K = s[3];
    qkv = HostTensor(DType::BF16, {B, T, 3, H, K});
    HostTensor* src[3] = {&p.q, &p.k, &p.v};
    for (int j = 0; j < 3; ++j)
      for (int64_t r = 0; r < B * T; ++r)
        for (int64_t e = 0; e < H * K; ++e) qkv.set((r * 3 + j) * H * K + e, src[j]->get(r * H * K + e));
    TensorView* dst[3] = {&q, &k, &v};
    for (int j = 0; j < 3; ++j) {
      *dst[j] = src[j]->view();
      dst[j]->data = static_cast<char*>(qkv.data()) + j * H * K * 2;
      dst[j]->strides[2] = K;
      dst[j]->strides[1] = 3 * H * K;
      dst[j]->strides[0] = T * 3 * H * K;
    }
  }
};

TEST(ReferenceStrides, FusedViewsAndOutSliceEqualContiguous) {
  for (int64_t batch : {1, 3}) {
    KdaProblem p = make_random_problem(small(batch, 21));
    ForwardArgs plain = p.args();
    flash_kda::reference_forward(plain);
    const std::vector<double> want_out = p.out.values(), want_state = p.final_state.values();

    Fused f(p);
    const int64_t B = batch, T = 21, HV = 2, V = 8;
    HostTensor out_buf(DType::F64, {B, T + 3, HV, V});
    out_buf.fill(-123.0);  // the rows past T must stay untouched
    HostTensor beta_buf(DType::BF16, {B, T, HV + 1});  // beta[..., :HV] of a wider buffer
    for (int64_t r = 0; r < B * T; ++r)
      for (int64_t h = 0; h < HV; ++h) beta_buf.set(r * (HV + 1) + h, p.beta.get(r * HV + h));
    ForwardArgs a = p.args();
    a.q = f.q;
    a.k = f.k;
    a.v = f.v;
    a.beta = beta_buf.view();
    a.beta.shape[2] = HV;
    a.out = out_buf.view();
    a.out.shape[1] = T;
    p.final_state.fill(0.0);
    flash_kda::reference_forward(a);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T + 3; ++t)
        for (int64_t e = 0; e < HV * V; ++e) {
          const double got = out_buf.get((b * (T + 3) + t) * HV * V + e);
          if (t < T)
            ASSERT_EQ(got, want_out[size_t((b * T + t) * HV * V + e)]) << "b " << b << " t " << t;
          else
            ASSERT_EQ(got, -123.0) << "row past the view written";
        }
    EXPECT_EQ(p.final_state.values(), want_state);
  }
}

TEST(ReferenceStates, MixedDtypes) {
  KdaConfig c = small(2, 17);
  c.state_dtype = DType::BF16;
  KdaProblem p = make_random_problem(c);
  // bf16 in, fp32 out == fp32 in (the same values, widened exactly), fp32 out.
  HostTensor h0_f32 = HostTensor::from_values(p.initial_state.values(), DType::F32, p.initial_state.shape());
  HostTensor ht_a(DType::F32, p.initial_state.shape()), ht_b(DType::F32, p.initial_state.shape());
  ForwardArgs a = p.args();
  a.final_state = ht_a.view();
  flash_kda::reference_forward(a);
  ForwardArgs b = p.args();
  b.initial_state = h0_f32.view();
  b.final_state = ht_b.view();
  flash_kda::reference_forward(b);
  EXPECT_EQ(ht_a.values(), ht_b.values());
  // fp32 in, bf16 out: the fp64 final state rounded once to bf16 (within half a bf16 ulp).
  HostTensor ht_bf16(DType::BF16, p.initial_state.shape()), ht_f64(DType::F64, p.initial_state.shape());
  b.final_state = ht_bf16.view();
  flash_kda::reference_forward(b);
  b.final_state = ht_f64.view();
  flash_kda::reference_forward(b);
  for (int64_t i = 0; i < ht_f64.numel(); ++i)
    ASSERT_LE(std::fabs(ht_bf16.get(i) - ht_f64.get(i)), std::ldexp(std::fabs(ht_f64.get(i)), -8)) << i;
}

// Pool semantics: sequence n reads and writes slot idx[n]; negative: zero out rows, no slot
// touched; other slots unchanged. Compared with the plain call whose initial_state[n] is
// pool[idx[n]] (zero where padded).
void check_pool(StateLayout layout, DType pool_dtype, const std::vector<int64_t>& idx, bool in_place) {
  const int64_t N = int64_t(idx.size()), P = 5, HV = 2, D = 8, T = 19, slot_elems = HV * D * D;
  KdaConfig c = small(N, T);
  c.state_layout = layout;
  c.state_dtype = pool_dtype;
  KdaProblem p = make_random_problem(c);
  KdaConfig pc = small(P, 1);
  pc.state_layout = layout;
  pc.state_dtype = pool_dtype;
  pc.seed = 7;
  HostTensor pool = make_random_problem(pc).initial_state;  // [P, HV, ..] random
  const HostTensor pool_before = pool;
  HostTensor final_pool(pool_dtype, pool.shape());
  final_pool.fill(77.0);
  const HostTensor final_before = final_pool;

  // The plain equivalent.
  HostTensor h0(pool_dtype, {N, HV, D, D});
  for (int64_t n = 0; n < N; ++n)
    if (idx[size_t(n)] >= 0)
      for (int64_t e = 0; e < slot_elems; ++e) h0.set(n * slot_elems + e, pool.get(idx[size_t(n)] * slot_elems + e));
  HostTensor ht(pool_dtype, {N, HV, D, D});  // rounded as the pool's stores round
  ForwardArgs plain = p.args();
  plain.initial_state = h0.view();
  plain.final_state = ht.view();
  flash_kda::reference_forward(plain);
  const std::vector<double> plain_out = p.out.values();

  HostTensor indices = HostTensor::from_values(std::vector<double>(idx.begin(), idx.end()), DType::I32, {N});
  ForwardArgs a = p.args();
  a.initial_state = pool.view();
  a.final_state = in_place ? pool.view() : final_pool.view();
  a.ssm_state_indices = indices.view();
  p.out.fill(-5.0);
  flash_kda::reference_forward(a);

  const HostTensor& written = in_place ? pool : final_pool;
  const HostTensor& untouched = in_place ? pool_before : final_before;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t r = 0; r < T * HV * D; ++r) {
      const int64_t i = n * T * HV * D + r;
      ASSERT_EQ(p.out.get(i), idx[size_t(n)] < 0 ? 0.0 : plain_out[size_t(i)]) << "sequence " << n;
    }
  for (int64_t s = 0; s < P; ++s) {
    int64_t last = -1;  // the last sequence writing slot s
    for (int64_t n = 0; n < N; ++n)
      if (idx[size_t(n)] == s) last = n;
    for (int64_t e = 0; e < slot_elems; ++e) {
      const double got = written.get(s * slot_elems + e);
      if (last < 0) {
        ASSERT_EQ(got, untouched.get(s * slot_elems + e)) << "slot " << s << " is not any sequence's";
      } else {
        ASSERT_EQ(got, ht.get(last * slot_elems + e)) << "slot " << s << " element " << e;
      }
    }
  }
}

TEST(ReferencePool, SlotsPaddingAndUntouchedSlots) {
  for (StateLayout layout : {StateLayout::VFirst, StateLayout::KFirst})
    for (DType d : {DType::F32, DType::BF16})
      for (bool in_place : {true, false}) check_pool(layout, d, {3, -1, 0}, in_place);
}

TEST(ReferencePool, DuplicateSlotsLastSequenceWins) {
  // Both sequences start from the slot's original contents (every start state is read first).
  check_pool(StateLayout::VFirst, DType::F32, {2, -1, 2}, false);
  check_pool(StateLayout::VFirst, DType::F32, {2, 2}, true);
}

TEST(ReferencePool, FinalPoolAloneStartsFromZero) {
  KdaConfig c = small(2, 9);
  c.with_initial_state = false;
  KdaProblem p = make_random_problem(c);
  HostTensor ht(DType::F64, {2, 2, 8, 8});
  ForwardArgs plain = p.args();
  plain.final_state = ht.view();
  flash_kda::reference_forward(plain);
  HostTensor pool(DType::F64, {4, 2, 8, 8});
  pool.fill(3.0);
  HostTensor indices = HostTensor::from_values({1, 0}, DType::I64, {2});
  ForwardArgs a = p.args();
  a.final_state = pool.view();
  a.ssm_state_indices = indices.view();
  flash_kda::reference_forward(a);
  for (int64_t e = 0; e < 128; ++e) {
    ASSERT_EQ(pool.get(128 + e), ht.get(e));
    ASSERT_EQ(pool.get(e), ht.get(128 + e));
    ASSERT_EQ(pool.get(256 + e), 3.0);
  }
}

}  // namespace
