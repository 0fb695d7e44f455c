// The direct decode kernel (src/sm90/decode/direct_warp.cu and kfirst_rows.cu: these very
// sources, compiled as host C++) run on the CPU model of tests/emu/warp_emu.h, over every case
// of the C++ decode suite (tests/cpp/decode_cases.h), planned for a 132-SM H200 and for an 8-SM
// part (other block splits; the few-hundred-sequence cases on the H200 plan only), and checked
// against flash_kda::reference_decode exactly as the GPU suite checks it. The plan picks the
// form; every k-first case runs once more on the H200 plan in the form that plan does not give
// it (the warp columns, DecodeKernel::DirectColumns, or the row blocks, DirectRows), and every
// k-first bf16 case of more than one token in the warp columns on the 8-SM plan too, whose
// wider blocks the 8-SM plan gives only the row blocks' split form. A case may name the H200
// plan's block split or tile form and must get it. It catches what the model shares with the GPU:
// lane and row mapping, shuffle partners, reductions, indexing, bounds and pool semantics; not
// timing or memory ordering (the GPU suite and compute-sanitizer cover those).
#include "warp_emu.h"

// The kernel source under its own launch name, so that this test's copy does not collide with
// the library's.
#define launch_direct emu_launch_direct
#define launch_kfirst_rows emu_launch_kfirst_rows
#include "sm90/decode/direct_warp.cu"
#include "sm90/decode/kfirst_rows.cu"
#undef launch_kfirst_rows
#undef launch_direct

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "decode_cases.h"

namespace {

using flash_kda::DecodeKernel;
using flash_kda::DType;
using flash_kda::testing::DecodeCase;

struct EmuCase {
  DecodeCase c;
  int num_sms = 132;
  /// Direct (the plan's form), DirectColumns (k-first's warp-column form) or DirectRows
  /// (k-first's row blocks, bf16 pools of more tokens in the split form).
  DecodeKernel kernel = DecodeKernel::Direct;
};
std::string emu_name(const EmuCase& e) {
  const char* form = e.kernel == DecodeKernel::DirectColumns ? "_columns" : (e.kernel == DecodeKernel::DirectRows ? "_rows" : "");
  return e.c.name + "_sms" + std::to_string(e.num_sms) + form;
}
void PrintTo(const EmuCase& e, std::ostream* os) { *os << emu_name(e); }

class DecodeEmu : public ::testing::TestWithParam<EmuCase> {};

TEST_P(DecodeEmu, DirectMatchesReference) {
  const flash_kda::testing::DecodeConfig& cfg = GetParam().c.config;
  const flash_kda::testing::DecodeWant want = flash_kda::testing::decode_want(cfg);
  flash_kda::testing::DecodeProblem prob = flash_kda::testing::decode_target(cfg);
  const bool pool = cfg.pool_slots > 0;
  const std::vector<double> pool_before = pool ? prob.pool.wide.values() : std::vector<double>{};
  const flash_kda::DecodeArgs a = prob.args();
  // The shapes as the reference's validation derives them, from its indices (it rejects an
  // index >= P, which the kernel gets and skips).
  const flash_kda::ProblemShape ps = flash_kda::validate_decode(prob.reference_args(), flash_kda::Target::CpuReference);
  flash_kda::sm90::DeviceProps props;
  props.major = 9;
  props.num_sms = GetParam().num_sms;
  const bool bf16_pool = cfg.base.state_dtype == DType::BF16;
  const flash_kda::sm90::DecodePlan plan =
      flash_kda::sm90::make_decode_plan(ps, props, bf16_pool ? 2 : 4, a.state_layout, GetParam().kernel);
  ASSERT_EQ(plan.kernel, DecodeKernel::Direct);
  ASSERT_EQ(plan.kfirst_rows, a.state_layout == flash_kda::StateLayout::KFirst &&
                                  (GetParam().kernel == DecodeKernel::DirectRows ||
                                   (GetParam().kernel == DecodeKernel::Direct &&
                                    flash_kda::sm90::kfirst_rows_serves(bf16_pool ? 2 : 4, plan.one_token,
                                                                        ps.num_seqs * ps.value_heads,
                                                                        GetParam().num_sms))));
  // The named block split and tile form are the warp-column form's.
  if (GetParam().num_sms == 132 && !plan.kfirst_rows) {
    if (GetParam().c.h200_warps > 0) ASSERT_EQ(plan.warps, GetParam().c.h200_warps) << "the case's block split";
    if (GetParam().c.h200_wide) ASSERT_EQ(plan.wide, *GetParam().c.h200_wide) << "the case's tile form";
  }
  const flash_kda::sm90::DecodeParams p = flash_kda::sm90::decode_params(a, ps, plan);
  const cudaError_t e = plan.kfirst_rows ? flash_kda::sm90::emu_launch_kfirst_rows(bf16_pool, a.gate, plan, 0, p, nullptr)
                                         : flash_kda::sm90::emu_launch_direct(a.state_layout, bf16_pool, a.gate, plan, 0, p, nullptr);
  ASSERT_EQ(e, cudaSuccess);
  flash_kda::testing::check_decode(cfg, want, prob, pool_before);
}

std::vector<EmuCase> emu_cases() {
  std::vector<EmuCase> cases;
  for (const DecodeCase& c : flash_kda::testing::decode_cases()) {
    // The persistent grid's many-item cases (~9 s each here) once, on the H200 plan.
    const bool large = c.name.find("persistent") != std::string::npos;
    for (int sms : {132, 8})
      if (!large || sms == 132) cases.push_back({c, sms});
    // Every k-first case once more in each form the H200 plan does not give it: the warp
    // columns where it takes the row blocks, the row blocks (a bf16 pool of more tokens: the
    // split form) where it takes the warp columns.
    if (c.config.base.state_layout == flash_kda::StateLayout::KFirst) {
      const flash_kda::testing::KdaConfig& b = c.config.base;
      const bool one_token = b.seqlens.empty() && b.seqlen == 1;
      const int64_t seqs = b.seqlens.empty() ? b.batch : int64_t(b.seqlens.size());
      const bool rows = flash_kda::sm90::kfirst_rows_serves(b.state_dtype == DType::BF16 ? 2 : 4, one_token,
                                                            seqs * b.value_heads, 132);
      cases.push_back({c, 132, rows ? DecodeKernel::DirectColumns : DecodeKernel::DirectRows});
      if (flash_kda::testing::rows_split_case(c)) cases.push_back({c, 8, DecodeKernel::DirectColumns});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cpu, DecodeEmu, ::testing::ValuesIn(emu_cases()),
                         [](const ::testing::TestParamInfo<EmuCase>& i) { return emu_name(i.param); });

TEST(DecodeEmuLaunch, SplitFormRefusesAPlanWithoutItsLaneWords) {
  // launch_kfirst_rows refuses a split-form plan whose shared memory ends before the lanes'
  // state words (their last 16 bytes missing), before any block runs.
  flash_kda::ProblemShape ps;
  ps.batch = ps.num_seqs = 4;
  ps.seqlen = 2;
  ps.heads = ps.value_heads = 16;
  ps.head_dim_k = ps.head_dim_v = 128;
  flash_kda::sm90::DeviceProps props;
  props.major = 9;
  props.num_sms = 132;
  flash_kda::sm90::DecodePlan plan =
      flash_kda::sm90::make_decode_plan(ps, props, 2, flash_kda::StateLayout::KFirst, DecodeKernel::Auto);
  ASSERT_TRUE(plan.kfirst_rows);
  ASSERT_FALSE(plan.one_token);
  plan.launch.smem_bytes -= 16;
  const flash_kda::sm90::DecodeParams p{};
  EXPECT_EQ(flash_kda::sm90::emu_launch_kfirst_rows(true, flash_kda::GateMode::SafeSigmoid, plan, 0, p, nullptr),
            cudaErrorInvalidConfiguration);
}

}  // namespace
