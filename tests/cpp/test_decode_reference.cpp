// reference_decode against reference_forward run per sequence on the state gathered from the
// pool: every gate mode, both layouts, T = 1..16, pools with padded (-1) slots, accepted-token
// counts and per-token writes, varlen with [N] indices and per-sequence states. The two share
// the fp64 token step, so out rows and states agree to rounding of the pool's dtype.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "decode_test_util.h"
#include "reference/element_io.h"

namespace {

using flash_kda::DType;
using flash_kda::GateMode;
using flash_kda::StateLayout;
using flash_kda::TensorView;
using flash_kda::testing::DecodeConfig;
using flash_kda::testing::HostTensor;
using flash_kda::testing::view_values;

struct RefCase {
  std::string name;
  DecodeConfig config;
};
void PrintTo(const RefCase& c, std::ostream* os) { *os << c.name; }

// Rows [begin, begin + len) of a [1 or B, T, heads, dim] tensor (values of `vals`, logical
// order) as a contiguous fp32 [1, len, heads, dim] tensor (exact: the values are bf16).
HostTensor rows_of(const std::vector<double>& vals, int64_t begin, int64_t len, std::vector<int64_t> inner) {
  int64_t per = 1;
  for (int64_t x : inner) per *= x;
  std::vector<int64_t> shape{1, len};
  shape.insert(shape.end(), inner.begin(), inner.end());
  HostTensor t(DType::F32, shape);
  for (int64_t i = 0; i < len * per; ++i) t.set(i, vals[size_t(begin * per + i)]);
  return t;
}

class DecodeReference : public ::testing::TestWithParam<RefCase> {};

TEST_P(DecodeReference, MatchesForwardPerSequence) {
  const DecodeConfig& cfg = GetParam().config;
  auto prob = flash_kda::testing::make_decode_problem(cfg);
  const bool pool = cfg.pool_slots > 0;
  const bool vf = cfg.base.state_layout == StateLayout::VFirst;
  const int64_t N = prob.act.num_seqs(), H = cfg.base.heads, HV = cfg.base.value_heads;
  const int64_t K = cfg.base.head_dim_k, V = cfg.base.head_dim_v;
  const int64_t T = cfg.base.seqlens.empty() ? cfg.base.seqlen : prob.act.total_tokens();

  // Inputs before the call (the pool is updated in place).
  const std::vector<double> q = prob.act.q.values(), k = prob.act.k.values(), v = prob.act.v.values(),
                            g = prob.act.g.values(), beta = prob.act.beta.values();
  const TensorView pool_view = pool ? prob.pool_view() : TensorView{};
  const std::vector<double> pool_before = pool ? prob.pool.wide.values() : std::vector<double>{};
  HostTensor expected_pool = pool ? prob.pool.wide : HostTensor{};

  flash_kda::DecodeArgs a = prob.reference_args();
  flash_kda::reference_decode(a);
  const std::vector<double> out = view_values(prob.out.wide, a.out);

  int64_t checked_rows = 0;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t begin = cfg.base.seqlens.empty() ? n * T : [&] {
      int64_t s = 0;
      for (int64_t m = 0; m < n; ++m) s += cfg.base.seqlens[size_t(m)];
      return s;
    }();
    const int64_t len = cfg.base.seqlens.empty() ? T : cfg.base.seqlens[size_t(n)];
    const int64_t row_elems = HV * V;
    int64_t start_slot = n;
    if (pool) {
      const int64_t t0 = cfg.accepted.empty() ? 0 : cfg.accepted[size_t(n)] - 1;
      start_slot = cfg.slots[size_t(cfg.per_token ? n * T + t0 : n)];
      if (start_slot < 0) {  // padded: zero rows
        for (int64_t i = 0; i < len * row_elems; ++i) ASSERT_EQ(out[size_t(begin * row_elems + i)], 0.0) << "n " << n;
        continue;
      }
    }
    // The start state as an fp64 [1, HV, ., .] tensor in the call's layout.
    HostTensor h0(DType::F64, vf ? std::vector<int64_t>{1, HV, V, K} : std::vector<int64_t>{1, HV, K, V});
    if (pool) {
      for (int64_t i = 0; i < HV * K * V; ++i) h0.set(i, pool_before[size_t(start_slot * pool_view.strides[0] + i)]);
    } else if (prob.initial_state.defined()) {
      for (int64_t i = 0; i < HV * K * V; ++i) h0.set(i, prob.initial_state.get(n * HV * K * V + i));
    }
    // Prefixes of 1..len tokens: the state after each token (all of them for [N, T] writes).
    for (int64_t upto = cfg.per_token ? 1 : len; upto <= len; ++upto) {
      HostTensor qs = rows_of(q, begin, upto, {H, K}), ks = rows_of(k, begin, upto, {H, K});
      HostTensor vs = rows_of(v, begin, upto, {HV, V}), gs = rows_of(g, begin, upto, {HV, K});
      HostTensor bs = rows_of(beta, begin, upto, {HV});
      HostTensor o(DType::F64, {1, upto, HV, V}), ht(DType::F64, h0.shape());
      flash_kda::ForwardArgs f;
      f.q = qs.view(), f.k = ks.view(), f.v = vs.view(), f.g = gs.view(), f.beta = bs.view(), f.out = o.view();
      f.A_log = prob.act.A_log.view(), f.dt_bias = prob.act.dt_bias.view();
      f.initial_state = h0.view(), f.final_state = ht.view();
      f.gate = a.gate, f.state_layout = a.state_layout, f.use_beta_sigmoid = a.use_beta_sigmoid;
      flash_kda::reference_forward(f, 1);
      if (upto == len) {
        for (int64_t i = 0; i < len * row_elems; ++i)
          ASSERT_NEAR(out[size_t(begin * row_elems + i)], o.get(i), 1e-12 * (1 + std::abs(o.get(i)))) << "n " << n << " i " << i;
        checked_rows += len;
      }
      int64_t dst = -1;
      if (pool) dst = cfg.per_token ? cfg.slots[size_t(n * T + upto - 1)] : start_slot;
      if (pool && dst >= 0) {
        const TensorView ev = expected_pool.view();
        for (int64_t i = 0; i < HV * K * V; ++i)
          flash_kda::reference_detail::store_element(ev, dst * pool_view.strides[0] + i, ht.get(i));
      }
      if (!pool && upto == len && prob.final_state.defined())
        for (int64_t i = 0; i < HV * K * V; ++i) {
          const double want = prob.final_state.dtype() == DType::F64 ? ht.get(i) : double(float(ht.get(i)));
          ASSERT_NEAR(prob.final_state.get(n * HV * K * V + i), want, 1e-6 * (1 + std::abs(want))) << "n " << n;
        }
    }
  }
  EXPECT_GT(checked_rows, 0);
  if (pool) {
    const std::vector<double> got = prob.pool.wide.values(), want = expected_pool.values();
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::isnan(want[i])) continue;
      ASSERT_EQ(got[i], want[i]) << "pool element " << i;  // untouched slots and padding stay as they were
    }
  }
}

RefCase pool_case(std::string name, GateMode gate, StateLayout layout, int64_t T, bool per_token, DType pool_dtype) {
  RefCase c{std::move(name), {}};
  DecodeConfig& d = c.config;
  d.base.batch = 4;
  d.base.seqlen = T;
  d.base.heads = 1;
  d.base.value_heads = 2;
  d.base.gate = gate;
  d.base.state_layout = layout;
  d.base.state_dtype = pool_dtype;
  d.base.with_A_log = true;
  d.pool_slots = per_token ? 4 * T + 3 : 7;
  d.per_token = per_token;
  d.slot_pad = 8;
  d.row_pad = 8;
  if (per_token) {
    // Sequence 1 is padded; sequence 3 drops its second token's state (-1 inside the row).
    for (int64_t n = 0; n < 4; ++n)
      for (int64_t t = 0; t < T; ++t) d.slots.push_back(n == 1 ? -1 : 3 + n * T + t);
    if (T > 1) d.slots[size_t(3 * T + 1)] = -1;
    d.accepted = {1, 1, T, (T + 1) / 2};
    if (T > 1) d.accepted[3] = T == 2 ? 1 : 3;  // never the dropped token's slot
  } else {
    d.slots = {5, -1, 0, 2};
  }
  return c;
}

std::vector<RefCase> reference_cases() {
  std::vector<RefCase> cases;
  const GateMode gates[] = {GateMode::SafeSigmoid, GateMode::Softplus, GateMode::PreGated};
  const char* gate_names[] = {"safe", "softplus", "pregated"};
  for (int gi = 0; gi < 3; ++gi)
    for (StateLayout layout : {StateLayout::VFirst, StateLayout::KFirst})
      for (int64_t T : {1, 2, 5, 16}) {
        const std::string base = std::string(gate_names[gi]) + (layout == StateLayout::VFirst ? "_vfirst" : "_kfirst") +
                                 "_T" + std::to_string(T);
        cases.push_back(pool_case(base + "_per_token_fp32", gates[gi], layout, T, true, DType::F32));
        cases.push_back(pool_case(base + "_per_seq_bf16", gates[gi], layout, T, false, DType::BF16));
      }
  // Varlen with [N] indices (one padded) and with per-sequence states (a zero-length sequence).
  RefCase vl = pool_case("varlen_per_seq_pool", GateMode::SafeSigmoid, StateLayout::VFirst, 1, false, DType::F32);
  vl.config.base.seqlens = {3, 1, 0, 16};
  cases.push_back(vl);
  RefCase nopool{"varlen_states_no_pool_gva", {}};
  nopool.config.base.seqlens = {2, 0, 5};
  nopool.config.base.heads = 1;
  nopool.config.base.value_heads = 3;
  nopool.config.base.state_layout = StateLayout::KFirst;
  cases.push_back(nopool);
  RefCase zero{"fixed_zero_start_flags", {}};
  zero.config.base.seqlen = 3;
  zero.config.base.with_initial_state = false;
  zero.config.base.beta_logits = false;
  zero.config.base.qk_std = 0.1;
  cases.push_back(zero);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cpu, DecodeReference, ::testing::ValuesIn(reference_cases()),
                         [](const ::testing::TestParamInfo<RefCase>& i) { return i.param.name; });

TEST(DecodeReference, SlotAtOrAbovePoolIsAnError) {
  DecodeConfig d = pool_case("x", GateMode::SafeSigmoid, StateLayout::VFirst, 1, false, DType::F32).config;
  d.slots = {7, 0, 1, 2};  // P = 7
  auto prob = flash_kda::testing::make_decode_problem(d);
  try {
    flash_kda::reference_decode(prob.reference_args());
    FAIL() << "no error";
  } catch (const flash_kda::Error& e) {
    EXPECT_EQ(e.argument(), "ssm_state_indices");
  }
}

TEST(DecodeReference, AcceptedCountOutsideOneToTIsAnError) {
  DecodeConfig d = pool_case("x", GateMode::SafeSigmoid, StateLayout::VFirst, 2, true, DType::F32).config;
  d.accepted = {1, 1, 3, 1};  // T = 2
  auto prob = flash_kda::testing::make_decode_problem(d);
  try {
    flash_kda::reference_decode(prob.reference_args());
    FAIL() << "no error";
  } catch (const flash_kda::Error& e) {
    EXPECT_EQ(e.argument(), "num_accepted_tokens");
  }
}

}  // namespace
