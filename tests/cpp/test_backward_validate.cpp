// validate_backward and backward_workspace_size without a GPU: each test breaks one argument of
// a valid Sm90 backward call (fake, never dereferenced device addresses) and expects the
// flash_kda::Error naming it.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "flash_kda/flash_kda.h"
#include "test_validate_helpers.h"

namespace {

using flash_kda::BackwardArgs;
using flash_kda::DeviceType;
using flash_kda::DType;
using flash_kda::Error;
using flash_kda::StateLayout;
using flash_kda::TensorView;
using kda_test::Call;
using kda_test::Spec;

/// A valid backward call over `call`'s tensors: the forward's outputs removed, every gradient
/// given (fp32 d_out and d_final_state).
struct BackwardCall {
  explicit BackwardCall(const Spec& s) : call(s) {
    a.forward = call.args;
    a.forward.out = {};
    a.forward.final_state = {};
    const flash_kda::ForwardArgs& f = a.forward;
    a.d_out = like(call.args.out, DType::F32);
    a.d_final_state = like(call.args.final_state, DType::F32);
    a.dq = like(f.q, f.q.dtype);
    a.dk = like(f.k, f.k.dtype);
    a.dv = like(f.v, f.v.dtype);
    a.dg = like(f.g, f.g.dtype);
    a.dbeta = like(f.beta, f.beta.dtype);
    a.dA_log = like(f.A_log, DType::F32);
    a.ddt_bias = like(f.dt_bias, DType::F32);
    a.d_initial_state = like(f.initial_state, f.initial_state.dtype);
  }
  TensorView like(const TensorView& t, DType dtype) {
    if (!t.defined()) return {};
    // A fresh buffer of t's shape: make() takes an initializer list, so build it per rank.
    switch (t.ndim) {
      case 1: return call.make(dtype, {t.shape[0]});
      case 2: return call.make(dtype, {t.shape[0], t.shape[1]});
      case 3: return call.make(dtype, {t.shape[0], t.shape[1], t.shape[2]});
      default: return call.make(dtype, {t.shape[0], t.shape[1], t.shape[2], t.shape[3]});
    }
  }
  Call call;
  BackwardArgs a;
};

Spec gpu_spec() {
  Spec s;
  s.device = DeviceType::CUDA;
  return s;
}

/// The argument and the message of validate_backward's error for `a` (both empty when it passes).
std::pair<std::string, std::string> error_of(const BackwardArgs& a) {
  try {
    flash_kda::validate_backward(a);
  } catch (const Error& e) {
    return {e.argument(), e.what()};
  }
  return {};
}

std::string error_argument(const BackwardArgs& a) { return error_of(a).first; }

TEST(BackwardValidate, AValidCallPasses) {
  BackwardCall c(gpu_spec());
#if FLASH_KDA_WITH_CUDA
  const flash_kda::ProblemShape p = flash_kda::validate_backward(c.a);
  EXPECT_EQ(p.value_heads, 8);
  EXPECT_EQ(p.num_seqs, 2);
#else
  EXPECT_EQ(error_argument(c.a), "device");
#endif
}

TEST(BackwardValidate, ForwardOutputsMustBeAbsent) {
  {
    BackwardCall c(gpu_spec());
    c.a.forward.out = c.call.args.out;
    EXPECT_EQ(error_argument(c.a), "out");
  }
  {
    BackwardCall c(gpu_spec());
    c.a.forward.final_state = c.call.args.final_state;
    EXPECT_EQ(error_argument(c.a), "final_state");
  }
}

TEST(BackwardValidate, PoolAndIntermediateStatesAreRejected) {
  {
    BackwardCall c(gpu_spec());
    c.a.forward.ssm_state_indices = c.call.make(DType::I32, {2});
    EXPECT_EQ(error_argument(c.a), "ssm_state_indices");
  }
  {
    BackwardCall c(gpu_spec());
    c.a.forward.intermediate_states = c.call.make(DType::F32, {8, 8, 128, 128});
    c.a.forward.intermediate_offsets = c.call.make(DType::I64, {3});
    c.a.forward.intermediate_every = 16;
    EXPECT_EQ(error_argument(c.a), "intermediate_states");
  }
  {
    BackwardCall c(gpu_spec());
    c.a.forward.intermediate_offsets = c.call.make(DType::I64, {3});
    EXPECT_EQ(error_argument(c.a), "intermediate_offsets");
  }
}

TEST(BackwardValidate, MissingGradientsAreNamed) {
  for (const char* name : {"d_out", "dq", "dk", "dv", "dg", "dbeta"}) {
    BackwardCall c(gpu_spec());
    TensorView* t = std::string(name) == "d_out" ? &c.a.d_out
                    : std::string(name) == "dq"  ? &c.a.dq
                    : std::string(name) == "dk"  ? &c.a.dk
                    : std::string(name) == "dv"  ? &c.a.dv
                    : std::string(name) == "dg"  ? &c.a.dg
                                                 : &c.a.dbeta;
    *t = {};
    EXPECT_EQ(error_argument(c.a), name);
  }
}

TEST(BackwardValidate, MisshapedGradientsAreNamed) {
  {
    BackwardCall c(gpu_spec());
    c.a.dq = c.call.make(DType::BF16, {2, 64, 4, 64});
    EXPECT_EQ(error_argument(c.a), "dq");
  }
  {
    BackwardCall c(gpu_spec());
    c.a.d_out = c.call.make(DType::F32, {2, 64, 8, 64});
    EXPECT_EQ(error_argument(c.a), "d_out");
  }
  {
    BackwardCall c(gpu_spec());
    c.a.dbeta = c.call.make(DType::BF16, {2, 64, 4});
    EXPECT_EQ(error_argument(c.a), "dbeta");
  }
  {
    BackwardCall c(gpu_spec());
    c.a.dA_log = c.call.make(DType::F32, {4});
    EXPECT_EQ(error_argument(c.a), "dA_log");
  }
  {
    BackwardCall c(gpu_spec());
    c.a.ddt_bias = c.call.make(DType::F32, {8 * 128});  // dt_bias is [HV, K]: the same form
    EXPECT_EQ(error_argument(c.a), "ddt_bias");
  }
}

TEST(BackwardValidate, GradientDtypesFollowTheirInputs) {
  {
    BackwardCall c(gpu_spec());
    c.a.dq = c.call.make(DType::F32, {2, 64, 4, 128});
    EXPECT_EQ(error_argument(c.a), "dq");
  }
  {
    BackwardCall c(gpu_spec());
    c.a.dg = c.call.make(DType::F32, {2, 64, 8, 128});  // g is bf16
    EXPECT_EQ(error_argument(c.a), "dg");
  }
  {
    BackwardCall c(gpu_spec());
    c.a.d_initial_state = c.call.make(DType::BF16, {2, 8, 128, 128});  // initial_state is fp32
    EXPECT_EQ(error_argument(c.a), "d_initial_state");
  }
  {
    BackwardCall c(gpu_spec());
    c.a.d_out = c.call.make(DType::F64, {2, 64, 8, 128});  // fp64 only on the reference
    EXPECT_EQ(error_argument(c.a), "d_out");
  }
  {
    BackwardCall c(gpu_spec());
    c.a.dA_log = c.call.make(DType::BF16, {8});
    EXPECT_EQ(error_argument(c.a), "dA_log");
  }
}

TEST(BackwardValidate, AGradientNeedsItsInput) {
  {
    Spec s = gpu_spec();
    s.with_gate_params = false;
    BackwardCall c(s);
    c.a.dA_log = c.call.make(DType::F32, {8});
    EXPECT_EQ(error_argument(c.a), "dA_log");
  }
  {
    Spec s = gpu_spec();
    s.with_gate_params = false;
    BackwardCall c(s);
    c.a.ddt_bias = c.call.make(DType::F32, {8, 128});
    EXPECT_EQ(error_argument(c.a), "ddt_bias");
  }
  {
    Spec s = gpu_spec();
    s.with_states = false;
    BackwardCall c(s);
    c.a.d_initial_state = c.call.make(DType::F32, {2, 8, 128, 128});
    EXPECT_EQ(error_argument(c.a), "d_initial_state");
  }
}

TEST(BackwardValidate, DFinalStateFollowsTheStateLayout) {
  {
    BackwardCall c(gpu_spec());  // VFirst [N, HV, V, K]; a wrong N is named
    c.a.d_final_state = c.call.make(DType::F32, {3, 8, 128, 128});
    EXPECT_EQ(error_argument(c.a), "d_final_state");
  }
  {
    BackwardCall c(gpu_spec());
    c.a.d_final_state = c.call.make(DType::F64, {2, 8, 128, 128});
    EXPECT_EQ(error_argument(c.a), "d_final_state");
  }
  {
    BackwardCall c(gpu_spec());
    c.a.d_final_state = {};  // optional
    c.a.d_initial_state = {};
    c.a.dA_log = {};
    c.a.ddt_bias = {};
#if FLASH_KDA_WITH_CUDA
    EXPECT_EQ(error_argument(c.a), "");
#endif
  }
}

TEST(BackwardValidate, GradientsOnTheHostAreNamed) {
  BackwardCall c(gpu_spec());
  c.a.dv.device = DeviceType::CPU;
  EXPECT_EQ(error_argument(c.a), "dv");
}

TEST(BackwardValidate, OverlappingGradientsAreNamed) {
  {
    BackwardCall c(gpu_spec());
    c.a.dk = c.a.dq;
    EXPECT_EQ(error_argument(c.a), "dk");
  }
  {
    BackwardCall c(gpu_spec());
    c.a.dv.data = c.a.forward.v.data;  // writing over an input
    EXPECT_EQ(error_argument(c.a), "dv");
  }
}

#if FLASH_KDA_WITH_CUDA
std::string error_message(const BackwardArgs& a) { return error_of(a).second; }

TEST(BackwardValidate, Sm90RowsAreSixteenByteAligned) {
  {  // fp32 d_out 4 bytes off a 16-byte boundary: element aligned, rows not
    BackwardCall c(gpu_spec());
    c.a.d_out.data = static_cast<char*>(c.a.d_out.data) + 4;
    EXPECT_EQ(error_argument(c.a), "d_out");
    EXPECT_NE(error_message(c.a).find("16-byte"), std::string::npos) << error_message(c.a);
  }
  {  // a token stride of 2 fp32 elements past the packed one: 8-byte rows
    BackwardCall c(gpu_spec());
    c.a.d_out.strides[0] += 2 * c.a.d_out.shape[1];
    c.a.d_out.strides[1] += 2;
    EXPECT_EQ(error_argument(c.a), "d_out");
    EXPECT_NE(error_message(c.a).find("multiple of 16 bytes"), std::string::npos) << error_message(c.a);
  }
  {  // a bf16 dv 2 bytes off: its pairs of elements would be misaligned stores
    BackwardCall c(gpu_spec());
    c.a.dv.data = static_cast<char*>(c.a.dv.data) + 2;
    EXPECT_EQ(error_argument(c.a), "dv");
    EXPECT_NE(error_message(c.a).find("16-byte"), std::string::npos) << error_message(c.a);
  }
}

TEST(BackwardValidate, ValueHeadsFitTheChainsGrid) {
  Spec s = gpu_spec();
  s.H = 1;
  s.HV = 16384;  // 4 chain blocks per value head: 65536 > 65535 on grid y
  s.T = 16;
  BackwardCall c(s);
  EXPECT_EQ(error_argument(c.a), "v");
  s.HV = 16383;
  BackwardCall ok(s);
  EXPECT_EQ(error_argument(ok.a), "");
}
#endif

TEST(BackwardValidate, ForwardErrorsComeFirst) {
  BackwardCall c(gpu_spec());
  c.a.forward.lower_bound = 1.0;
  EXPECT_EQ(error_argument(c.a), "lower_bound");
}

#if FLASH_KDA_WITH_CUDA
TEST(BackwardWorkspace, AlignedAndCoversTheStates) {
  BackwardCall c(gpu_spec());
  const size_t bytes = flash_kda::backward_workspace_size(c.a);
  EXPECT_EQ(bytes % 256, 0u);
  // Two fp32 states per chunk row (R = N + ceil(B T / 16) = 2 + 8) and value head at least.
  EXPECT_GE(bytes, size_t(2) * 10 * 8 * 128 * 128 * 4);
  Spec longer = gpu_spec();
  longer.T = 640;
  BackwardCall d(longer);
  EXPECT_GT(flash_kda::backward_workspace_size(d.a), bytes);
}

TEST(BackwardWorkspace, TooSmallWorkspaceIsANamedErrorBeforeAnyLaunch) {
  BackwardCall c(gpu_spec());
  try {
    flash_kda::backward(c.a, nullptr, 0, nullptr);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "workspace");
  }
}
#endif

}  // namespace
