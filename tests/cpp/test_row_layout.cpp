// The row addressing of the per-token tensors (src/sm90/common/row_layout.h) and the prepare
// kernel's row form (plan.h: prepare_row_form; launch.h: prepare_form) on the host: which
// layouts fold their batch into the token index (flat()), that the folded address equals the
// general one at every (sequence, token, head), and which form each kind of call takes. No GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "sm90/common/row_layout.h"

#if defined(FLASH_KDA_WITH_CUDA)
#include "flash_kda/forward.h"
#include "sm90/forward/launch.h"
#include "sm90/forward/params.h"
#include "sm90/forward/plan.h"
#endif

namespace {

using flash_kda::sm90::RowForm;
using flash_kda::sm90::RowLayout;

constexpr int64_t kB = 3, kT = 37, kH = 4, kRow = 256;  // 128 bf16 channels a row

// [B, T_long, slots, H, row] buffer's slot `slot` (byte strides), its first T tokens.
RowLayout view(int64_t slots, int64_t pad_tokens) {
  const int64_t token = slots * kH * kRow;
  return RowLayout{(kT + pad_tokens) * token, kT, token, kRow};
}

// Every (sequence, flat token, head) of a fixed-length batch: `a` and `b` address the same byte.
void expect_same_rows(const RowLayout& a, const RowLayout& b, const std::string& what) {
  for (int64_t n = 0; n < kB; ++n)
    for (int64_t t = n * kT; t < (n + 1) * kT; ++t)
      for (int64_t h = 0; h < kH; ++h)
        ASSERT_EQ(a.offset(n, t, h), b.offset(n, t, h)) << what << ": n " << n << " t " << t << " h " << h;
}

TEST(RowLayout, FusedProjectionViewsAreFlatNotDense) {
  for (int64_t slots : {2, 3}) {
    const RowLayout r = view(slots, 0);
    EXPECT_TRUE(r.flat()) << slots;
    EXPECT_FALSE(r.dense(kH, kRow)) << slots;
    const RowLayout f = r.flattened();
    EXPECT_EQ(f.seq_stride, 0);
    EXPECT_EQ(f.seq_tokens, 0);
    EXPECT_EQ(f.token_stride, r.token_stride);
    EXPECT_EQ(f.head_stride, r.head_stride);
    expect_same_rows(r, f, "fused projection of " + std::to_string(slots));
    // Flat token t of sequence n: t token strides, whatever n.
    EXPECT_EQ(f.offset(2, 2 * kT + 5, 3), (2 * kT + 5) * slots * kH * kRow + 3 * kRow);
  }
}

TEST(RowLayout, ContiguousTensorsAreDenseAndFlat) {
  const RowLayout r = view(1, 0);
  EXPECT_TRUE(r.dense(kH, kRow));
  EXPECT_TRUE(r.flat());
  const RowLayout d = RowLayout::dense_of(kH, kRow), f = r.flattened();
  EXPECT_TRUE(d.dense(kH, kRow));
  EXPECT_TRUE(d.flat());
  EXPECT_EQ(f.token_stride, d.token_stride);
  EXPECT_EQ(f.head_stride, d.head_stride);
  expect_same_rows(r, d, "dense_of");
  expect_same_rows(r, f, "flattened");
}

TEST(RowLayout, HeadSlicesAndWiderRowsAreFlat) {
  // Heads 2..3 of a [B, T, 2 H, row] tensor (the view starts at head 2: the base pointer's job),
  // and rows of a [B, T, H, 2 row] tensor's first half: strides of the parent, batch T tokens.
  const RowLayout heads{kT * 2 * kH * kRow, kT, 2 * kH * kRow, kRow};
  const RowLayout wide{kT * kH * 2 * kRow, kT, kH * 2 * kRow, 2 * kRow};
  for (const RowLayout& r : {heads, wide}) {
    EXPECT_TRUE(r.flat());
    EXPECT_FALSE(r.dense(kH, kRow));
    expect_same_rows(r, r.flattened(), "slice");
  }
}

TEST(RowLayout, SlicesOfLongerSequencesAndPermutedBatchesAreNotFlat) {
  const RowLayout sliced = view(1, 5);  // [B, T + 5, H, row][:, :T]
  EXPECT_FALSE(sliced.flat());
  EXPECT_FALSE(sliced.dense(kH, kRow));
  EXPECT_NE(sliced.offset(1, kT, 0), sliced.flattened().offset(1, kT, 0));  // the batch term is needed
  // [T, B, H, row].transpose(0, 1): batch entries one token row apart.
  const RowLayout batch_inner{kH * kRow, kT, kB * kH * kRow, kRow};
  EXPECT_FALSE(batch_inner.flat());
}

TEST(RowLayout, VarlenIsAlwaysFlat) {
  // B = 1, flat tokens of every sequence on one axis: sequence and batch stride both 0.
  for (const RowLayout& r : {RowLayout{0, 0, 3 * kH * kRow, kRow}, RowLayout{0, 0, kH * kRow, kRow}}) {
    EXPECT_TRUE(r.flat());
    const RowLayout f = r.flattened();
    for (int64_t n = 0; n < 4; ++n)
      for (int64_t t : {int64_t(0), int64_t(17), int64_t(1000)})
        EXPECT_EQ(r.offset(n, t, 3), f.offset(0, t, 3));
  }
}

TEST(RowLayout, ConstexprOnTheHost) {
  static_assert(RowLayout{2 * 10 * 64, 10, 2 * 64, 64}.flat());
  static_assert(!RowLayout{2 * 11 * 64, 10, 2 * 64, 64}.flat());
  static_assert(RowLayout{2 * 11 * 64, 10, 2 * 64, 64}.flattened().offset(1, 12, 1) == 12 * 128 + 64);
  SUCCEED();
}

#if defined(FLASH_KDA_WITH_CUDA)

using flash_kda::GateMode;
using flash_kda::sm90::PrepareParams;
using flash_kda::sm90::prepare_flashkda_flags;
using flash_kda::sm90::prepare_row_form;

const float kParam = 0.f;  // A_log / dt_bias: only their presence matters here

// FlashKDA's own call (safe gate, A_log and dt_bias, L2 norm, b = sigmoid(beta)) with the
// given layouts of q and k (H heads) and of g and beta (HV = H heads).
PrepareParams flashkda_call(const RowLayout& qk, const RowLayout& g, const RowLayout& beta) {
  PrepareParams p{};
  p.q_rows = p.k_rows = qk;
  p.g_rows = g;
  p.beta_rows = beta;
  p.A_log = &kParam;
  p.dt_bias = &kParam;
  p.gate = GateMode::SafeSigmoid;
  p.l2norm = p.beta_sigmoid = true;
  p.beta_mul = 1.f;
  p.heads = p.value_heads = int(kH);
  return p;
}

RowLayout rows_of(int64_t slots, int64_t pad, int64_t row_bytes) {
  const int64_t token = slots * kH * row_bytes;
  return RowLayout{(kT + pad) * token, kT, token, row_bytes};
}

TEST(PrepareRowForm, FlashKdaCallsWithDenseInputsAreDense) {
  for (bool g32 : {false, true})
    for (bool b32 : {false, true}) {
      PrepareParams p = flashkda_call(rows_of(1, 0, 256), rows_of(1, 0, g32 ? 512 : 256), rows_of(1, 0, b32 ? 4 : 2));
      p.g_is_f32 = g32;
      p.beta_is_f32 = b32;
      EXPECT_EQ(prepare_row_form(p), RowForm::Dense) << g32 << b32;
    }
}

TEST(PrepareRowForm, FusedProjectionViewsAreFlat) {
  // q and k slots of a [B, T, 3, H, K] projection, g of a [B, T, 2, HV, K] one, beta of [B, T, 2, HV].
  const PrepareParams p = flashkda_call(rows_of(3, 0, 256), rows_of(2, 0, 256), rows_of(2, 0, 2));
  EXPECT_EQ(prepare_row_form(p), RowForm::Flat);
}

TEST(PrepareRowForm, OneInputThatIsNotFlatMakesItGeneral) {
  const RowLayout qk = rows_of(1, 0, 256), g = rows_of(1, 0, 256), beta = rows_of(1, 0, 2);
  const RowLayout sliced_qk = rows_of(1, 5, 256), sliced_g = rows_of(1, 5, 256), sliced_beta = rows_of(1, 5, 2);
  EXPECT_EQ(prepare_row_form(flashkda_call(sliced_qk, g, beta)), RowForm::General);
  EXPECT_EQ(prepare_row_form(flashkda_call(qk, sliced_g, beta)), RowForm::General);
  EXPECT_EQ(prepare_row_form(flashkda_call(qk, g, sliced_beta)), RowForm::General);
  PrepareParams k_only = flashkda_call(qk, g, beta);
  k_only.k_rows = sliced_qk;
  EXPECT_EQ(prepare_row_form(k_only), RowForm::General);
  PrepareParams softplus = flashkda_call(qk, sliced_g, beta);
  softplus.gate = GateMode::Softplus;
  EXPECT_EQ(prepare_row_form(softplus), RowForm::General);
}

TEST(PrepareRowForm, DenseInputsOfOtherCallsAreFlat) {
  const RowLayout qk = rows_of(1, 0, 256), g = rows_of(1, 0, 256), beta = rows_of(1, 0, 2);
  auto form = [&](auto change) {
    PrepareParams p = flashkda_call(qk, g, beta);
    change(p);
    return prepare_row_form(p);
  };
  EXPECT_EQ(form([](PrepareParams& p) { p.gate = GateMode::Softplus; }), RowForm::Flat);
  EXPECT_EQ(form([](PrepareParams& p) { p.gate = GateMode::PreGated, p.A_log = p.dt_bias = nullptr; }), RowForm::Flat);
  EXPECT_EQ(form([](PrepareParams& p) { p.A_log = nullptr; }), RowForm::Flat);
  EXPECT_EQ(form([](PrepareParams& p) { p.dt_bias = nullptr; }), RowForm::Flat);
  EXPECT_EQ(form([](PrepareParams& p) { p.l2norm = false; }), RowForm::Flat);
  EXPECT_EQ(form([](PrepareParams& p) { p.beta_sigmoid = false; }), RowForm::Flat);
  EXPECT_EQ(form([](PrepareParams& p) { p.beta_mul = 2.f; }), RowForm::Flat);  // allow_neg_eigval
  // A dense layout of the other dtype's row is not dense: g declared fp32 over bf16 strides.
  EXPECT_EQ(form([](PrepareParams& p) { p.g_is_f32 = true; }), RowForm::Flat);
}

TEST(PrepareRowForm, FlashKdaFlagsDoNotDependOnTheRows) {
  const RowLayout qk = rows_of(1, 0, 256), g = rows_of(1, 0, 256), beta = rows_of(1, 0, 2);
  EXPECT_TRUE(prepare_flashkda_flags(flashkda_call(qk, g, beta)));
  EXPECT_TRUE(prepare_flashkda_flags(flashkda_call(rows_of(3, 0, 256), rows_of(2, 0, 256), rows_of(2, 0, 2))));
  EXPECT_TRUE(prepare_flashkda_flags(flashkda_call(rows_of(1, 5, 256), g, beta)));  // General rows
  auto flags = [&](auto change) {
    PrepareParams p = flashkda_call(qk, g, beta);
    change(p);
    return prepare_flashkda_flags(p);
  };
  EXPECT_FALSE(flags([](PrepareParams& p) { p.gate = GateMode::Softplus; }));
  EXPECT_FALSE(flags([](PrepareParams& p) { p.gate = GateMode::PreGated, p.A_log = p.dt_bias = nullptr; }));
  EXPECT_FALSE(flags([](PrepareParams& p) { p.A_log = nullptr; }));
  EXPECT_FALSE(flags([](PrepareParams& p) { p.dt_bias = nullptr; }));
  EXPECT_FALSE(flags([](PrepareParams& p) { p.l2norm = false; }));
  EXPECT_FALSE(flags([](PrepareParams& p) { p.beta_sigmoid = false; }));
  EXPECT_FALSE(flags([](PrepareParams& p) { p.beta_mul = 2.f; }));
}

TEST(PrepareRowForm, VarlenIsNeverGeneral) {
  const RowLayout packed{0, 0, 3 * kH * 256, 256}, beta{0, 0, 2 * kH * 2, 2};
  EXPECT_EQ(prepare_row_form(flashkda_call(packed, packed, beta)), RowForm::Flat);
  EXPECT_EQ(prepare_row_form(flashkda_call(RowLayout{0, 0, kH * 256, 256}, RowLayout{0, 0, kH * 256, 256},
                                           RowLayout{0, 0, kH * 2, 2})),
            RowForm::Dense);
}

// prepare_form of a call's tensors (launch.cu's row layouts): bf16 [B, T, H, 128] views over
// buffers of `pad` extra tokens a sequence; A_log, dt_bias present (FlashKDA's flags).
flash_kda::ForwardArgs call_with_views(int64_t B, int64_t pad, int64_t slots) {
  static char buffer[16];  // never read: the row form depends on strides alone
  auto view = [&](int ndim, int64_t heads, int64_t dim) {
    flash_kda::TensorView t;
    t.data = buffer;
    t.dtype = flash_kda::DType::BF16;
    t.ndim = ndim;
    t.shape[0] = B, t.shape[1] = kT, t.shape[2] = heads, t.shape[3] = dim;
    const int64_t row = ndim == 4 ? dim : 1, token = slots * heads * row;
    t.strides[0] = (kT + pad) * token, t.strides[1] = token, t.strides[2] = row, t.strides[3] = 1;
    t.device = flash_kda::DeviceType::CUDA;
    return t;
  };
  flash_kda::ForwardArgs a;
  a.q = a.k = a.v = a.out = view(4, kH, 128);
  a.g = view(4, kH, 128);
  a.beta = view(3, kH, 1);
  a.A_log.data = a.dt_bias.data = buffer;
  a.A_log.ndim = a.dt_bias.ndim = 1;
  return a;
}

flash_kda::ProblemShape fixed_shape(int64_t B) {
  flash_kda::ProblemShape p;
  p.batch = p.num_seqs = B;
  p.seqlen = kT;
  p.heads = p.value_heads = kH;
  p.head_dim_k = p.head_dim_v = 128;
  p.scale = 0.088;
  return p;
}

TEST(PrepareRowForm, TheLaunchTakesEachFormFromTheTensors) {
  using flash_kda::sm90::prepare_form;
  EXPECT_EQ(prepare_form(call_with_views(2, 0, 1), fixed_shape(2)), RowForm::Dense);    // contiguous
  EXPECT_EQ(prepare_form(call_with_views(2, 0, 3), fixed_shape(2)), RowForm::Flat);     // fused projection
  EXPECT_EQ(prepare_form(call_with_views(2, 5, 1), fixed_shape(2)), RowForm::General);  // slices of longer sequences
  // A batch of one has no batch stride to honour: its slices fold too.
  EXPECT_EQ(prepare_form(call_with_views(1, 5, 1), fixed_shape(1)), RowForm::Dense);
  EXPECT_EQ(prepare_form(call_with_views(1, 5, 3), fixed_shape(1)), RowForm::Flat);
  flash_kda::ForwardArgs softplus = call_with_views(2, 0, 1);
  softplus.gate = GateMode::Softplus;
  EXPECT_EQ(prepare_form(softplus, fixed_shape(2)), RowForm::Flat);
}

#endif  // FLASH_KDA_WITH_CUDA

}  // namespace
