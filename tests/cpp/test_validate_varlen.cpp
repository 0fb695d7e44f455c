// Validation: cu_seqlens (varlen batches), state shapes, and host_seq_start.
#include "host/problem.h"
#include "test_validate_helpers.h"

namespace kda_test {
namespace {

Spec varlen(std::vector<int64_t> cu, DType dtype = DType::I64) {
  Spec s;
  s.cu = std::move(cu);
  s.cu_dtype = dtype;
  return s;
}

TEST(ValidateVarlen, AcceptedFillsNumSeqs) {
  for (DType d : {DType::I64, DType::I32}) {
    Call c(varlen({0, 5, 5, 17, 40}, d));
    const auto p = flash_kda::validate(c.args, Target::CpuReference);
    EXPECT_TRUE(p.varlen);
    EXPECT_EQ(p.batch, 1);
    EXPECT_EQ(p.seqlen, 40);
    EXPECT_EQ(p.num_seqs, 4);
  }
}

TEST(ValidateVarlen, AllEmptySequencesAccepted) {
  Call c(varlen({0, 0, 0}));
  const auto p = flash_kda::validate(c.args, Target::CpuReference);
  EXPECT_EQ(p.seqlen, 0);
  EXPECT_EQ(p.num_seqs, 2);
}

TEST(ValidateVarlen, WrongDtype) {
  Call c(varlen({0, 5, 9}));
  c.args.cu_seqlens.dtype = DType::F32;
  expect_invalid(c.args, Target::CpuReference, "cu_seqlens", {"expected dtype int32 or int64", "got fp32"});
}

TEST(ValidateVarlen, WrongRank) {
  Call c(varlen({0, 4, 8, 12}));
  c.args.cu_seqlens = c.make(DType::I64, {2, 2});
  expect_invalid(c.args, Target::CpuReference, "cu_seqlens", {"expected rank 1 [N + 1]", "got rank 2 [2, 2]"});
}

TEST(ValidateVarlen, TooShort) {
  Call c(varlen({0, 0}));
  c.args.cu_seqlens.shape[0] = 1;
  expect_invalid(c.args, Target::CpuReference, "cu_seqlens", {"length N + 1 >= 2", "got shape [1]"});
}

TEST(ValidateVarlen, BatchMustBeOne) {
  Call c{Spec{}};  // B = 2, T = 64
  c.args.cu_seqlens = c.make(DType::I64, {3});
  c.set_cu({0, 32, 64});
  expect_invalid(c.args, Target::CpuReference, "cu_seqlens", {"given with batch B = q.shape[0] = 2", "B = 1"});
}

TEST(ValidateVarlen, FirstEntryNotZero) {
  Call c(varlen({0, 5, 9}));
  c.set_cu({2, 5, 9});
  expect_invalid(c.args, Target::CpuReference, "cu_seqlens", {"cu_seqlens[0] must be 0, got 2"});
}

TEST(ValidateVarlen, Decreasing) {
  Call c(varlen({0, 5, 6, 9}, DType::I32));
  c.set_cu({0, 7, 6, 9});
  expect_invalid(c.args, Target::CpuReference, "cu_seqlens",
                 {"non-decreasing", "cu_seqlens[2] = 6 < cu_seqlens[1] = 7"});
}

TEST(ValidateVarlen, LastEntryNotTotalTokens) {
  Call c(varlen({0, 5, 9}));
  c.set_cu({0, 5, 8});
  expect_invalid(c.args, Target::CpuReference, "cu_seqlens",
                 {"cu_seqlens[N = 2] must equal the total tokens T_total = q.shape[1] = 9", "got 8"});
}

// Documented: device-resident cu_seqlens values cannot be read without a host sync, so the
// Sm90 validation checks dtype and shape only.
TEST(ValidateVarlen, Sm90DoesNotReadValues) {
  Spec s = sm90_spec();
  s.cu = {0, 5, 9};
  Call c(s);  // fake device addresses: reading them would crash
  EXPECT_EQ(flash_kda::validate(c.args, Target::Sm90).num_seqs, 2);
}

TEST(ValidateState, FirstDimIsNumSeqs) {
  Call c(varlen({0, 5, 9, 20}));
  c.args.initial_state = c.make(DType::F32, {1, 8, 128, 128});
  expect_invalid(c.args, Target::CpuReference, "initial_state",
                 {"expected shape [3, 8, 128, 128] [N, HV, V, K]", "N = len(cu_seqlens) - 1", "got [1, 8, 128, 128]"});
}

TEST(ValidateState, FixedLengthNIsBatch) {
  Call c{Spec{}};
  c.args.final_state = c.make(DType::F32, {1, 8, 128, 128}, true);
  expect_invalid(c.args, Target::CpuReference, "final_state", {"expected shape [2, 8, 128, 128]", "with N = B"});
}

TEST(ValidateState, LayoutDecidesShape) {
  Spec s;
  s.K = 64;
  s.V = 32;
  Call c(s);  // states built [N, HV, V, K] = VFirst
  EXPECT_NO_THROW(flash_kda::validate(c.args, Target::CpuReference));
  c.args.state_layout = StateLayout::KFirst;
  expect_invalid(c.args, Target::CpuReference, "initial_state",
                 {"expected shape [2, 8, 64, 32] [N, HV, K, V] (k-first state layout)", "got [2, 8, 32, 64]"});
  c.args.initial_state = c.make(DType::F32, {2, 8, 64, 32});
  c.args.final_state = c.make(DType::F32, {2, 8, 64, 32}, true);
  EXPECT_NO_THROW(flash_kda::validate(c.args, Target::CpuReference));
}

TEST(ValidateState, WrongRank) {
  Call c{Spec{}};
  c.args.initial_state = c.make(DType::F32, {16, 128, 128});
  expect_invalid(c.args, Target::CpuReference, "initial_state", {"expected shape [2, 8, 128, 128]", "got [16, 128, 128]"});
}

TEST(HostSeqStart, FixedLength) {
  Call c{Spec{}};
  const auto p = flash_kda::validate(c.args, Target::CpuReference);
  EXPECT_EQ(flash_kda::detail::host_seq_start(c.args, p, 0), 0);
  EXPECT_EQ(flash_kda::detail::host_seq_start(c.args, p, 1), 64);
  EXPECT_EQ(flash_kda::detail::host_seq_start(c.args, p, 2), 128);
}

TEST(HostSeqStart, Varlen) {
  for (DType d : {DType::I64, DType::I32}) {
    Call c(varlen({0, 5, 5, 17}, d));
    const auto p = flash_kda::validate(c.args, Target::CpuReference);
    EXPECT_EQ(flash_kda::detail::host_seq_start(c.args, p, 1), 5);
    EXPECT_EQ(flash_kda::detail::host_seq_start(c.args, p, 2), 5);
    EXPECT_EQ(flash_kda::detail::host_seq_start(c.args, p, 3), 17);
  }
}

}  // namespace
}  // namespace kda_test
