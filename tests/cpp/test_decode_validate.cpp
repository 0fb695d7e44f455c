// validate_decode: every bad argument of a decode call is a flash_kda::Error naming it, raised
// before anything runs, for the CPU reference and the Sm90 target (views marked as CUDA
// tensors: the Sm90 checks read no data).
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "decode_test_util.h"

namespace {

using flash_kda::DecodeArgs;
using flash_kda::DeviceType;
using flash_kda::DType;
using flash_kda::GateMode;
using flash_kda::StateLayout;
using flash_kda::Target;
using flash_kda::TensorView;
using flash_kda::testing::DecodeConfig;

// A valid pooled call: B = 3, T = 2, H = 1, HV = 2, K = V = 128 (the Sm90 subset), [N, T]
// indices with accepted counts, bf16 activations, fp32 pool of 8 slots.
DecodeConfig valid_config() {
  DecodeConfig d;
  d.base.batch = 3;
  d.base.seqlen = 2;
  d.base.heads = 1;
  d.base.value_heads = 2;
  d.base.head_dim_k = d.base.head_dim_v = 128;
  d.base.out_dtype = DType::BF16;
  d.pool_slots = 8;
  d.per_token = true;
  d.slots = {0, 1, -1, -1, 4, 5};
  d.accepted = {1, 1, 2};
  return d;
}

TensorView as_cuda(TensorView t) {
  if (t.defined()) t.device = DeviceType::CUDA;
  return t;
}
DecodeArgs on_gpu(DecodeArgs a) {
  for (TensorView* t : {&a.q, &a.k, &a.v, &a.g, &a.beta, &a.out, &a.A_log, &a.dt_bias, &a.cu_seqlens, &a.initial_state,
                        &a.final_state, &a.ssm_state_indices, &a.num_accepted_tokens})
    *t = as_cuda(*t);
  return a;
}

// Runs `mutate` on a valid call and expects validate_decode(target) to name `argument`.
void expect_error(const std::string& argument, const std::function<void(DecodeArgs&)>& mutate,
                  Target target = Target::CpuReference, DecodeConfig cfg = valid_config()) {
  auto prob = flash_kda::testing::make_decode_problem(cfg);
  DecodeArgs a = prob.args();
  if (target == Target::Sm90) a = on_gpu(a);
  const Target baseline = target == Target::Sm90 && cfg.base.head_dim_k == 128 ? Target::Sm90 : Target::CpuReference;
  ASSERT_NO_THROW(flash_kda::validate_decode(target == Target::Sm90 && baseline != target ? prob.args() : a, baseline))
      << "the baseline must be valid";
  mutate(a);
  try {
    flash_kda::validate_decode(a, target);
    ADD_FAILURE() << "no error for " << argument;
  } catch (const flash_kda::Error& e) {
    EXPECT_EQ(e.argument(), argument) << e.what();
  }
}

TEST(DecodeValidate, BaselinesAreValid) {
  auto prob = flash_kda::testing::make_decode_problem(valid_config());
  const flash_kda::ProblemShape p = flash_kda::validate_decode(prob.args(), Target::CpuReference);
  EXPECT_EQ(p.num_seqs, 3);
  EXPECT_EQ(p.seqlen, 2);
  EXPECT_EQ(p.value_heads, 2);
  EXPECT_NO_THROW(flash_kda::validate_decode(on_gpu(prob.args()), Target::Sm90));
  DecodeConfig strided = valid_config();
  strided.row_pad = 8;
  strided.slot_pad = 64;
  auto sp = flash_kda::testing::make_decode_problem(strided);
  EXPECT_NO_THROW(flash_kda::validate_decode(on_gpu(sp.args()), Target::Sm90));
}

TEST(DecodeValidate, MissingTensors) {
  for (const char* name : {"q", "k", "v", "g", "beta", "out"})
    expect_error(name, [&](DecodeArgs& a) {
      const std::string n = name;
      TensorView* t = n == "q" ? &a.q : n == "k" ? &a.k : n == "v" ? &a.v : n == "g" ? &a.g : n == "beta" ? &a.beta : &a.out;
      *t = TensorView{};
    });
}

TEST(DecodeValidate, Shapes) {
  expect_error("q", [](DecodeArgs& a) { a.q.ndim = 3; });
  expect_error("k", [](DecodeArgs& a) { a.k.shape[3] = 64; });
  expect_error("v", [](DecodeArgs& a) { a.v.shape[1] = 1; });
  expect_error("v", [](DecodeArgs& a) {  // HV not a multiple of H
    a.q.shape[2] = 2; a.k.shape[2] = 2; a.v.shape[2] = 3;
  });
  expect_error("g", [](DecodeArgs& a) { a.g.shape[3] = 64; });
  expect_error("beta", [](DecodeArgs& a) { a.beta.shape[2] = 1; });
  expect_error("out", [](DecodeArgs& a) { a.out.shape[3] = 64; });
  expect_error("A_log", [](DecodeArgs& a) { a.A_log.shape[0] = 3; });
  expect_error("dt_bias", [](DecodeArgs& a) { a.dt_bias.shape[1] = 3; });
}

TEST(DecodeValidate, Dtypes) {
  expect_error("q", [](DecodeArgs& a) { a.q.dtype = DType::F16; });
  expect_error("v", [](DecodeArgs& a) { a.v.dtype = DType::F64; });
  expect_error("beta", [](DecodeArgs& a) { a.beta.dtype = DType::I32; });
  expect_error("A_log", [](DecodeArgs& a) { a.A_log.dtype = DType::BF16; });
  expect_error("dt_bias", [](DecodeArgs& a) { a.dt_bias.dtype = DType::BF16; });
  expect_error("initial_state", [](DecodeArgs& a) { a.initial_state.dtype = DType::F64; a.final_state.dtype = DType::F64; },
               Target::Sm90);
  expect_error("ssm_state_indices", [](DecodeArgs& a) { a.ssm_state_indices.dtype = DType::F32; });
  expect_error("num_accepted_tokens", [](DecodeArgs& a) { a.num_accepted_tokens.dtype = DType::F32; });
}

TEST(DecodeValidate, StridesAndAlignment) {
  expect_error("q", [](DecodeArgs& a) { a.q.strides[3] = 2; });
  expect_error("v", [](DecodeArgs& a) { a.v.strides[2] = -128; });
  expect_error("k", [](DecodeArgs& a) { a.k.strides[1] += 1; }, Target::Sm90);  // rows 2 bytes off 16
  expect_error("g", [](DecodeArgs& a) { a.g.data = static_cast<char*>(a.g.data) + 8; }, Target::Sm90);
  expect_error("out", [](DecodeArgs& a) { a.out.strides[2] += 4; }, Target::Sm90);
  expect_error("initial_state", [](DecodeArgs& a) {
    a.initial_state.strides[2] += 1;
    a.final_state = a.initial_state;
  });
  expect_error("initial_state", [](DecodeArgs& a) {  // slots overlapping
    a.initial_state.strides[0] = 128;
    a.final_state = a.initial_state;
  });
  expect_error("initial_state", [](DecodeArgs& a) {  // slot stride not a multiple of 16 bytes
    a.initial_state.strides[0] += 1;
    a.final_state = a.initial_state;
  }, Target::Sm90);
  expect_error("dt_bias", [](DecodeArgs& a) { a.dt_bias.data = static_cast<char*>(a.dt_bias.data) + 4; }, Target::Sm90);
}

TEST(DecodeValidate, Devices) {
  expect_error("q", [](DecodeArgs& a) { a.q.device = DeviceType::CUDA; });  // reference needs host tensors
  expect_error("v", [](DecodeArgs& a) { a.v.device = DeviceType::CPU; }, Target::Sm90);
  expect_error("g", [](DecodeArgs& a) { a.g.device_id = 1; }, Target::Sm90);
}

TEST(DecodeValidate, Sm90Subset) {
  DecodeConfig long_t = valid_config();
  long_t.base.seqlen = 17;
  long_t.slots.assign(3 * 17, 0);
  long_t.accepted = {1, 1, 1};
  auto prob = flash_kda::testing::make_decode_problem(long_t);
  EXPECT_NO_THROW(flash_kda::validate_decode(prob.args(), Target::CpuReference));  // the reference takes any T
  try {
    flash_kda::validate_decode(on_gpu(prob.args()), Target::Sm90);
    ADD_FAILURE() << "T = 17 accepted on Sm90";
  } catch (const flash_kda::Error& e) {
    EXPECT_EQ(e.argument(), "q");
    EXPECT_NE(std::string(e.what()).find("T <= 16"), std::string::npos) << e.what();
  }
  DecodeConfig small = valid_config();
  small.base.head_dim_k = small.base.head_dim_v = 64;
  auto sp = flash_kda::testing::make_decode_problem(small);
  EXPECT_NO_THROW(flash_kda::validate_decode(sp.args(), Target::CpuReference));
  expect_error("q", [](DecodeArgs&) {}, Target::Sm90, small);
}

TEST(DecodeValidate, Indices) {
  expect_error("ssm_state_indices", [](DecodeArgs& a) { a.ssm_state_indices.shape[0] = 2; });
  expect_error("ssm_state_indices", [](DecodeArgs& a) { a.ssm_state_indices.shape[1] = 3; });
  expect_error("ssm_state_indices", [](DecodeArgs& a) { a.ssm_state_indices.ndim = 3; a.ssm_state_indices.shape[2] = 1; });
  expect_error("num_accepted_tokens", [](DecodeArgs& a) { a.num_accepted_tokens.shape[0] = 4; });
  expect_error("num_accepted_tokens", [](DecodeArgs& a) {  // needs [N, T] indices
    a.ssm_state_indices.ndim = 1;
  });
  expect_error("num_accepted_tokens", [](DecodeArgs& a) {  // given without indices
    a.ssm_state_indices = TensorView{};
    a.initial_state = TensorView{};
    a.final_state = TensorView{};
  });
  expect_error("ssm_state_indices", [](DecodeArgs& a) {  // values checked by the reference
    static_cast<int32_t*>(a.ssm_state_indices.data)[1] = 8;
  });
  expect_error("num_accepted_tokens", [](DecodeArgs& a) { static_cast<int32_t*>(a.num_accepted_tokens.data)[0] = 0; });
  expect_error("num_accepted_tokens", [](DecodeArgs& a) { static_cast<int32_t*>(a.num_accepted_tokens.data)[2] = 3; });
  DecodeConfig varlen = valid_config();  // [N, T] indices need a fixed-length batch
  varlen.base.seqlens = {1, 2, 1};
  varlen.accepted.clear();
  expect_error("ssm_state_indices", [](DecodeArgs& a) {
    a.ssm_state_indices.ndim = 2;
    a.ssm_state_indices.shape[1] = 4;
    a.ssm_state_indices.strides[0] = 4;
    a.ssm_state_indices.strides[1] = 1;
  }, Target::CpuReference, [&] {
    DecodeConfig c = varlen;
    c.per_token = false;
    c.slots = {0, 1, 2};
    return c;
  }());
}

TEST(DecodeValidate, PoolAndFinalState) {
  expect_error("initial_state", [](DecodeArgs& a) { a.initial_state = TensorView{}; });
  expect_error("final_state", [](DecodeArgs& a) { a.final_state = TensorView{}; });
  expect_error("final_state", [](DecodeArgs& a) {  // not the pool itself
    a.final_state.data = static_cast<char*>(a.final_state.data) + 4 * 128 * 128 * 2;
    a.final_state.shape[0] -= 1;
  });
  expect_error("initial_state", [](DecodeArgs& a) {  // pool heads must match HV
    a.initial_state.shape[1] = 1;
    a.final_state = a.initial_state;
  });
  DecodeConfig no_pool = valid_config();
  no_pool.pool_slots = 0;
  no_pool.accepted.clear();
  no_pool.slots.clear();
  no_pool.base.with_initial_state = true;
  no_pool.base.with_final_state = true;
  expect_error("initial_state", [](DecodeArgs& a) { a.initial_state.shape[0] = 4; }, Target::CpuReference, no_pool);
  expect_error("final_state", [](DecodeArgs& a) { a.final_state.dtype = DType::BF16; }, Target::CpuReference, no_pool);
  expect_error("final_state", [](DecodeArgs& a) {  // partial overlap with the input state
    a.final_state.data = static_cast<char*>(a.initial_state.data) + 16;
  }, Target::CpuReference, no_pool);
  expect_error("out", [](DecodeArgs& a) { a.out.data = a.q.data; a.out.dtype = a.q.dtype; });
  expect_error("final_state", [](DecodeArgs& a) { a.v.data = a.final_state.data; }, Target::CpuReference, no_pool);
}

TEST(DecodeValidate, GateAndFlags) {
  expect_error("gate", [](DecodeArgs& a) { a.gate = static_cast<GateMode>(7); });
  expect_error("A_log", [](DecodeArgs& a) { a.gate = GateMode::PreGated; });
  expect_error("dt_bias", [](DecodeArgs& a) { a.gate = GateMode::PreGated; a.A_log = TensorView{}; });
  expect_error("A_log", [](DecodeArgs& a) { a.gate = GateMode::Softplus; a.A_log = TensorView{}; });
  expect_error("lower_bound", [](DecodeArgs& a) { a.lower_bound = 0.0; });
  expect_error("lower_bound", [](DecodeArgs& a) { a.lower_bound = -6.0; });
  expect_error("allow_neg_eigval", [](DecodeArgs& a) { a.allow_neg_eigval = true; a.use_beta_sigmoid = false; });
  expect_error("state_layout", [](DecodeArgs& a) { a.state_layout = static_cast<StateLayout>(5); });
  expect_error("scale", [](DecodeArgs& a) { a.scale = -1.0; });
  expect_error("scale", [](DecodeArgs& a) { a.scale = 1e39; }, Target::Sm90);
  expect_error("target", [](DecodeArgs&) {}, static_cast<Target>(9));
}

TEST(DecodeValidate, Sequences) {
  DecodeConfig varlen = valid_config();
  varlen.base.seqlens = {1, 2, 1};
  varlen.per_token = false;
  varlen.slots = {0, 1, 2};
  varlen.accepted.clear();
  expect_error("cu_seqlens", [](DecodeArgs& a) { static_cast<int64_t*>(a.cu_seqlens.data)[0] = 1; }, Target::CpuReference,
               varlen);
  expect_error("cu_seqlens", [](DecodeArgs& a) { static_cast<int64_t*>(a.cu_seqlens.data)[3] = 3; }, Target::CpuReference,
               varlen);
  expect_error("cu_seqlens", [](DecodeArgs& a) { a.cu_seqlens.dtype = DType::F32; }, Target::CpuReference, varlen);
  expect_error("cu_seqlens", [](DecodeArgs& a) { a.cu_seqlens.shape[0] = 1; }, Target::CpuReference, varlen);
}

TEST(DecodeValidate, NothingWrittenOnError) {
  DecodeConfig d = valid_config();
  auto prob = flash_kda::testing::make_decode_problem(d);
  const std::vector<double> pool = prob.pool.wide.values();
  DecodeArgs a = prob.args();
  a.lower_bound = 1.0;
  EXPECT_THROW(flash_kda::reference_decode(a), flash_kda::Error);
  EXPECT_THROW(flash_kda::decode(on_gpu(a), nullptr), flash_kda::Error);
  const std::vector<double> after = prob.pool.wide.values();
  for (size_t i = 0; i < pool.size(); ++i) ASSERT_TRUE(after[i] == pool[i] || (std::isnan(after[i]) && std::isnan(pool[i])));
}

}  // namespace

TEST(DecodeValidate, LaunchOptionsKernel) {
  EXPECT_NO_THROW(flash_kda::validate_decode_options({}));
  for (flash_kda::DecodeKernel k :
       {flash_kda::DecodeKernel::Auto, flash_kda::DecodeKernel::Persistent, flash_kda::DecodeKernel::Direct,
        flash_kda::DecodeKernel::DirectColumns, flash_kda::DecodeKernel::DirectRows}) {
    flash_kda::DecodeLaunchOptions o;
    o.kernel = k;
    EXPECT_NO_THROW(flash_kda::validate_decode_options(o));
  }
  for (int bad : {-1, 5, 100}) {
    flash_kda::DecodeLaunchOptions o;
    o.kernel = static_cast<flash_kda::DecodeKernel>(bad);
    try {
      flash_kda::validate_decode_options(o);
      ADD_FAILURE() << "no error for kernel " << bad;
    } catch (const flash_kda::Error& e) {
      EXPECT_EQ(e.argument(), "launch_options.kernel") << e.what();
    }
  }
}

TEST(DecodeValidate, DecodeNamesABadKernelBeforeAnyLaunch) {
  // The arguments are valid for the GPU (pointers are host memory, never touched): decode()
  // validates them, then the options, and throws before the launch.
  auto prob = flash_kda::testing::make_decode_problem(valid_config());
  flash_kda::DecodeLaunchOptions o;
  o.kernel = static_cast<flash_kda::DecodeKernel>(7);
  try {
    flash_kda::decode(on_gpu(prob.args()), nullptr, o);
    ADD_FAILURE() << "no error";
  } catch (const flash_kda::Error& e) {
    EXPECT_EQ(e.argument(), "launch_options.kernel") << e.what();
  }
}

namespace {

// T = 0 at fixed length with [N, 0] slots: decode() returns without a launch (the kernels would
// read a start slot from the empty indices). Without a GPU a launch would raise, so the call
// returning normally is the check.
TEST(DecodeValidate, NoTokensWithPerTokenSlotsLaunchesNothing) {
  DecodeConfig cfg = valid_config();
  cfg.base.seqlen = 0;
  cfg.slots = {};
  cfg.accepted = {};
  auto prob = flash_kda::testing::make_decode_problem(cfg);
  const DecodeArgs a = on_gpu(prob.args());
  ASSERT_NO_THROW(flash_kda::validate_decode(a, Target::Sm90));
  EXPECT_NO_THROW(flash_kda::decode(a, nullptr));
}

}  // namespace
