// reference_forward's intermediate (prefix-cache) states (include/flash_kda/forward.h): the
// state after j * every tokens of a sequence is exactly (fp64, bit for bit) the final state of
// the same call cut after those tokens; rows no sequence reaches stay untouched; narrower
// dtypes are the fp64 states rounded once; fla's form (every 64, include_initial, chunk
// offsets) has one row per started 64-token chunk. The GPU tests compare against this.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "flash_kda/flash_kda.h"
#include "reference/element_io.h"
#include "reference_test_util.h"

namespace {

using flash_kda::DType;
using flash_kda::ForwardArgs;
using flash_kda::StateLayout;
using flash_kda::testing::HostTensor;
using flash_kda::testing::KdaConfig;
using flash_kda::testing::KdaProblem;
using flash_kda::testing::make_random_problem;

constexpr double kSentinel = -777.0;  // what rows nobody writes keep

KdaConfig small_varlen(std::vector<int64_t> seqlens, StateLayout layout) {
  KdaConfig c;
  c.seqlens = std::move(seqlens);
  c.heads = c.value_heads = 2;
  c.head_dim_k = 8;
  c.head_dim_v = 4;  // K != V: a transposed layout cannot pass by accident
  c.state_layout = layout;
  c.state_dtype = DType::F64;
  return c;
}

// Rows a sequence of `len` tokens can fill: the states after j * every tokens, j = 0 or 1 on.
int64_t reachable_rows(int64_t len, int64_t every, bool include_initial) {
  return len / every + (include_initial ? 1 : 0);
}

std::vector<int64_t> prefix_sums(const std::vector<int64_t>& counts) {
  std::vector<int64_t> off{0};
  for (int64_t c : counts) off.push_back(off.back() + c);
  return off;
}

// The intermediate-state tensors of a call: states [S, HV, ...] filled with kSentinel, offsets.
struct Inter {
  HostTensor states, offsets;
  Inter(const KdaProblem& p, const std::vector<int64_t>& offsets_values, DType dtype = DType::F64,
        DType offsets_dtype = DType::I64) {
    const KdaConfig& c = p.config;
    const int64_t S = offsets_values.back();
    states = c.state_layout == StateLayout::VFirst ? HostTensor(dtype, {S, c.value_heads, c.head_dim_v, c.head_dim_k})
                                                    : HostTensor(dtype, {S, c.value_heads, c.head_dim_k, c.head_dim_v});
    states.fill(kSentinel);
    std::vector<double> o(offsets_values.begin(), offsets_values.end());
    offsets = HostTensor::from_values(o, offsets_dtype, {int64_t(o.size())});
  }
  void attach(ForwardArgs& a, int64_t every, bool include_initial) {
    a.intermediate_states = states.view();
    a.intermediate_offsets = offsets.view();
    a.intermediate_every = every;
    a.intermediate_include_initial = include_initial;
  }
  int64_t state_elems() const { return states.numel() / states.shape()[0]; }
  std::vector<double> row(int64_t r) const {
    const int64_t e = state_elems();
    std::vector<double> v(static_cast<size_t>(e));
    for (int64_t i = 0; i < e; ++i) v[size_t(i)] = states.get(r * e + i);
    return v;
  }
};

// The final state ([HV, ...] of the call's layout) of sequence n of `p` cut after its first
// `len` tokens: the same tensors with cu_seqlens {0, start, start + len, T_total} and a state
// pool whose only live entry is n (so the cut sequence starts from n's initial state).
std::vector<double> prefix_final_state(KdaProblem& p, int64_t n, int64_t len) {
  const KdaConfig& c = p.config;
  int64_t start = 0;
  for (int64_t m = 0; m < n; ++m) start += c.seqlens[size_t(m)];
  const int64_t total = p.total_tokens(), N = p.num_seqs();
  HostTensor cu = HostTensor::from_values({0.0, double(start), double(start + len), double(total)}, DType::I64, {4});
  HostTensor idx = HostTensor::from_values({-1.0, double(n), -1.0}, DType::I64, {3});
  HostTensor fin(DType::F64, p.initial_state.shape());
  HostTensor out(DType::F64, p.out.shape());
  ForwardArgs a = p.args();
  a.cu_seqlens = cu.view();
  a.ssm_state_indices = idx.view();
  a.final_state = fin.view();
  a.out = out.view();
  flash_kda::reference_forward(a);
  const int64_t e = fin.numel() / N;
  std::vector<double> v(static_cast<size_t>(e));
  for (int64_t i = 0; i < e; ++i) v[size_t(i)] = fin.get(n * e + i);
  return v;
}

TEST(ReferenceIntermediate, StateAfterJEveryTokensIsTheFinalStateOfThatPrefix) {
  const std::vector<int64_t> lens = {70, 0, 1, 150, 33, 64, 128};
  for (StateLayout layout : {StateLayout::VFirst, StateLayout::KFirst})
    for (int64_t every : {16, 48, 64})
      for (bool include_initial : {true, false}) {
        KdaProblem p = make_random_problem(small_varlen(lens, layout));
        std::vector<int64_t> counts;
        for (int64_t len : lens) counts.push_back(reachable_rows(len, every, include_initial));
        const std::vector<int64_t> off = prefix_sums(counts);
        Inter in(p, off);
        ForwardArgs a = p.args();
        in.attach(a, every, include_initial);
        flash_kda::reference_forward(a);
        for (size_t n = 0; n < lens.size(); ++n)
          for (int64_t j = 0; j < counts[n]; ++j) {
            const int64_t tokens = (j + (include_initial ? 0 : 1)) * every;
            const std::vector<double> want = prefix_final_state(p, int64_t(n), tokens);
            EXPECT_EQ(in.row(off[n] + j), want) << "sequence " << n << " row " << j << " (" << tokens
                                                << " tokens), every " << every << ", include_initial "
                                                << include_initial << ", layout " << int(layout);
          }
      }
}

TEST(ReferenceIntermediate, FlaFormOneRowPerStartedChunk) {
  // fla's chunk_kda(return_intermediate_states=True): h[i] is the state before chunk i of 64
  // tokens; a sequence of len tokens has ceil(len / 64) of them (none when empty), starting at
  // fla's chunk_offsets.
  const std::vector<int64_t> lens = {130, 0, 64, 1, 65};
  KdaProblem p = make_random_problem(small_varlen(lens, StateLayout::KFirst));
  std::vector<int64_t> counts;
  for (int64_t len : lens) counts.push_back((len + 63) / 64);
  const std::vector<int64_t> off = prefix_sums(counts);
  ASSERT_EQ(off.back(), 3 + 0 + 1 + 1 + 2);
  Inter in(p, off);
  ForwardArgs a = p.args();
  in.attach(a, 64, true);
  flash_kda::reference_forward(a);
  const int64_t e = in.state_elems();
  for (size_t n = 0; n < lens.size(); ++n)
    for (int64_t j = 0; j < counts[n]; ++j) {
      EXPECT_EQ(in.row(off[n] + j), prefix_final_state(p, int64_t(n), 64 * j)) << n << " " << j;
      if (j == 0)  // the start state itself, widened exactly from fp64
        for (int64_t i = 0; i < e; ++i) ASSERT_EQ(in.states.get(off[n] * e + i), p.initial_state.get(int64_t(n) * e + i));
    }
}

TEST(ReferenceIntermediate, OnlyReachableRowsOfEachRangeAreWritten) {
  // Sequence 0 (40 tokens, every 16): rows after 16 and 32 tokens; its range has 4 rows, so the
  // last two stay untouched. Sequence 1 (100 tokens) has a range of 2 of its 6 states.
  // Sequence 2 is a padded pool entry: its range stays untouched.
  KdaProblem p = make_random_problem(small_varlen({40, 100, 50}, StateLayout::VFirst));
  const std::vector<int64_t> off = {1, 5, 7, 10};  // row 0 belongs to no sequence
  Inter in(p, off);
  HostTensor idx = HostTensor::from_values({0.0, 1.0, -1.0}, DType::I32, {3});
  HostTensor fin(DType::F64, p.initial_state.shape());
  ForwardArgs a = p.args();
  a.ssm_state_indices = idx.view();
  a.final_state = fin.view();
  in.attach(a, 16, false);
  flash_kda::reference_forward(a);
  const std::vector<double> untouched(size_t(in.state_elems()), kSentinel);
  EXPECT_EQ(in.row(0), untouched);
  EXPECT_EQ(in.row(1), prefix_final_state(p, 0, 16));
  EXPECT_EQ(in.row(2), prefix_final_state(p, 0, 32));
  EXPECT_EQ(in.row(3), untouched);
  EXPECT_EQ(in.row(4), untouched);
  EXPECT_EQ(in.row(5), prefix_final_state(p, 1, 16));
  EXPECT_EQ(in.row(6), prefix_final_state(p, 1, 32));
  for (int64_t r = 7; r < 10; ++r) EXPECT_EQ(in.row(r), untouched) << r;
}

TEST(ReferenceIntermediate, NarrowDtypesAreTheFp64StatesRoundedOnce) {
  const std::vector<int64_t> lens = {96, 20, 64};
  KdaProblem p = make_random_problem(small_varlen(lens, StateLayout::VFirst));
  std::vector<int64_t> counts;
  for (int64_t len : lens) counts.push_back(reachable_rows(len, 32, true));
  const std::vector<int64_t> off = prefix_sums(counts);
  Inter exact(p, off);
  ForwardArgs a = p.args();
  exact.attach(a, 32, true);
  flash_kda::reference_forward(a);
  for (DType dtype : {DType::BF16, DType::F32})
    for (DType od : {DType::I32, DType::I64}) {
      Inter narrow(p, off, dtype, od);
      ForwardArgs b = p.args();
      narrow.attach(b, 32, true);
      flash_kda::reference_forward(b);
      for (int64_t i = 0; i < exact.states.numel(); ++i) {
        const double x = exact.states.get(i);
        const double want = dtype == DType::F32 ? double(float(x))
                                                : double(flash_kda::reference_detail::bf16_bits_to_float(
                                                      flash_kda::reference_detail::double_to_bf16_bits(x)));
        ASSERT_EQ(narrow.states.get(i), want) << "element " << i << " dtype " << int(dtype);
      }
    }
}

TEST(ReferenceIntermediate, FixedLengthEqualsTheSameTokensAsVarlen) {
  KdaConfig c = small_varlen({}, StateLayout::VFirst);
  c.batch = 3;
  c.seqlen = 80;
  KdaProblem p = make_random_problem(c);
  const std::vector<int64_t> off = {0, 6, 12, 18};  // 80 / 16 + 1 states each
  Inter fixed(p, off);
  ForwardArgs a = p.args();
  fixed.attach(a, 16, true);
  flash_kda::reference_forward(a);
  // The same memory as one packed batch of three 80-token sequences.
  HostTensor cu = HostTensor::from_values({0, 80, 160, 240}, DType::I64, {4});
  Inter packed(p, off);
  ForwardArgs b = p.args();
  for (flash_kda::TensorView* t : {&b.q, &b.k, &b.v, &b.g, &b.beta, &b.out}) {  // [B, T, ..] -> [1, B*T, ..]
    t->shape[1] *= t->shape[0];
    t->shape[0] = 1;
    t->strides[0] = t->shape[1] * t->strides[1];
  }
  HostTensor out2(DType::F64, p.out.shape());
  b.out.data = out2.data();
  b.cu_seqlens = cu.view();
  packed.attach(b, 16, true);
  flash_kda::reference_forward(b);
  EXPECT_EQ(fixed.states.values(), packed.states.values());
  for (int64_t r = 0; r < 18; ++r) EXPECT_NE(fixed.row(r)[0], kSentinel) << r;
}

}  // namespace
