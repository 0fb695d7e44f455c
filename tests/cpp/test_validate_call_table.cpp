// The call table (flash_kda/call_table.h) and what validate() derives from it: every field of
// ForwardArgs listed once, the host copy cu_seqlens_cpu checked on every target, and the
// reference's num_threads.
#include <cstddef>
#include <set>
#include <string>

#include "flash_kda/call_table.h"
#include "test_validate_helpers.h"

namespace kda_test {
namespace {

using flash_kda::kForwardTensors;
using flash_kda::TensorRole;
using flash_kda::TensorSpec;

TEST(CallTable, ListsEveryTensorFieldOnceInApiOrder) {
  const std::vector<std::string> expected = {"q",       "k",          "v",             "g",           "beta",
                                             "out",     "A_log",      "dt_bias",       "cu_seqlens",  "initial_state",
                                             "final_state", "cu_seqlens_cpu", "ssm_state_indices",
                                             "intermediate_states", "intermediate_offsets"};
  std::vector<std::string> names;
  std::set<const TensorView*> members;
  const ForwardArgs probe;
  for (const TensorSpec& s : kForwardTensors) {
    names.push_back(s.name);
    members.insert(&(probe.*s.member));
  }
  EXPECT_EQ(names, expected);
  EXPECT_EQ(members.size(), flash_kda::kForwardTensorCount);
  // ForwardArgs has exactly these TensorView fields: its size is theirs plus the flags after them.
  EXPECT_EQ(offsetof(ForwardArgs, gate), flash_kda::kForwardTensorCount * sizeof(TensorView));
}

TEST(CallTable, RolesAndOptionality) {
  for (const TensorSpec& s : kForwardTensors) {
    const std::string n = s.name;
    EXPECT_EQ(s.role == TensorRole::Output, n == "out" || n == "final_state" || n == "intermediate_states") << n;
    const bool required = n == "q" || n == "k" || n == "v" || n == "g" || n == "beta" || n == "out";
    EXPECT_EQ(s.optional, !required) << n;
    EXPECT_EQ(s.host_only, n == "cu_seqlens_cpu") << n;
    EXPECT_EQ(flash_kda::accepted_dtypes(s, Target::Sm90) & ~s.reference, 0u) << n << ": Sm90 accepts a subset";
  }
}

TEST(CallTable, MessagesFromTheTable) {
  EXPECT_EQ(flash_kda::dtype_list(flash_kda::tensor_spec("out").reference), "bf16, fp32 or fp64");
  EXPECT_EQ(flash_kda::dtype_list(flash_kda::tensor_spec("cu_seqlens").sm90), "int32 or int64");
  EXPECT_EQ(flash_kda::expected_rank(flash_kda::tensor_spec("q")), "expected rank 4 [B, T, H, K]");
  EXPECT_EQ(flash_kda::expected_rank(flash_kda::tensor_spec("dt_bias")), "expected shape [HV, K] or [HV*K]");
  EXPECT_THROW(flash_kda::tensor_spec("workspace"), std::out_of_range);
}

Spec varlen(std::vector<int64_t> cu, DeviceType device = DeviceType::CPU) {
  Spec s;
  s.cu = std::move(cu);
  s.device = device;
  return s;
}

// A host cu_seqlens_cpu holding `values` (int64), owned by the test.
struct HostCopy {
  explicit HostCopy(const std::vector<int64_t>& values, DType dtype = DType::I64) : v64(values) {
    for (int64_t x : values) v32.push_back(static_cast<int32_t>(x));
    void* data = dtype == DType::I32 ? static_cast<void*>(v32.data()) : static_cast<void*>(v64.data());
    view = flash_kda::make_tensor(data, dtype, {static_cast<int64_t>(values.size())});
  }
  std::vector<int64_t> v64;
  std::vector<int32_t> v32;
  TensorView view;
};

TEST(ValidateHostCopy, GoodValuesAcceptedOnBothTargets) {
  for (DType d : {DType::I64, DType::I32}) {
    Call gpu(varlen({0, 5, 5, 40}, DeviceType::CUDA));
    HostCopy host({0, 5, 5, 40}, d);
    gpu.args.cu_seqlens_cpu = host.view;
    EXPECT_EQ(flash_kda::validate(gpu.args, Target::Sm90).num_seqs, 3);
    Call cpu(varlen({0, 5, 5, 40}));
    cpu.args.cu_seqlens_cpu = host.view;
    EXPECT_EQ(flash_kda::validate(cpu.args, Target::CpuReference).num_seqs, 3);
  }
}

TEST(ValidateHostCopy, BadValuesNamedOnTheGpuTarget) {
  struct Bad {
    std::vector<int64_t> values;
    const char* fragment;
  };
  for (const Bad& bad : {Bad{{3, 5, 5, 40}, "cu_seqlens[0] must be 0, got 3"},
                         Bad{{0, 9, 5, 40}, "non-decreasing, got cu_seqlens[2] = 5 < cu_seqlens[1] = 9"},
                         Bad{{0, 5, 5, 39}, "must equal the total tokens T_total = q.shape[1] = 40, got 39"}}) {
    Call c(varlen({0, 5, 5, 40}, DeviceType::CUDA));
    HostCopy host(bad.values);
    c.args.cu_seqlens_cpu = host.view;
    expect_invalid(c.args, Target::Sm90, "cu_seqlens", {bad.fragment, "host copy cu_seqlens_cpu"});
  }
}

TEST(ValidateHostCopy, ItsOwnDefectsNameIt) {
  Call c(varlen({0, 5, 5, 40}, DeviceType::CUDA));
  HostCopy shorter({0, 5, 40});
  c.args.cu_seqlens_cpu = shorter.view;
  expect_invalid(c.args, Target::Sm90, "cu_seqlens_cpu", {"expected shape [4] [N + 1] like cu_seqlens", "got [3]"});

  HostCopy wrong_dtype({0, 5, 5, 40});
  wrong_dtype.view.dtype = DType::F32;
  c.args.cu_seqlens_cpu = wrong_dtype.view;
  expect_invalid(c.args, Target::Sm90, "cu_seqlens_cpu", {"expected dtype int32 or int64", "got fp32"});

  HostCopy on_gpu({0, 5, 5, 40});
  on_gpu.view.device = DeviceType::CUDA;
  c.args.cu_seqlens_cpu = on_gpu.view;
  expect_invalid(c.args, Target::Sm90, "cu_seqlens_cpu", {"is on cuda:0", "a host tensor is needed"});

  Call fixed{sm90_spec()};
  HostCopy alone({0, 64});
  fixed.args.cu_seqlens_cpu = alone.view;
  expect_invalid(fixed.args, Target::Sm90, "cu_seqlens_cpu", {"without cu_seqlens"});
}

TEST(ValidateHostCopy, ReferenceChecksTheCopyToo) {
  Call c(varlen({0, 5, 5, 40}));
  HostCopy host({0, 5, 4, 40});
  c.args.cu_seqlens_cpu = host.view;
  expect_invalid(c.args, Target::CpuReference, "cu_seqlens", {"non-decreasing", "host copy"});
}

TEST(ReferenceThreads, NegativeCountIsNamedAndNothingIsWritten) {
  Call c{Spec{}};
  const auto before = c.snapshot();
  expect_error([&] { flash_kda::reference_forward(c.args, -1); }, "num_threads", {"must be >= 0", "got -1"});
  EXPECT_EQ(c.snapshot(), before);
}

}  // namespace
}  // namespace kda_test
