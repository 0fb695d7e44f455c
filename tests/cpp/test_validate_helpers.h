// Builds valid KDA calls for the validation tests, so each test breaks exactly one thing.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "flash_kda/flash_kda.h"

namespace kda_test {

using flash_kda::DeviceType;
using flash_kda::DType;
using flash_kda::ForwardArgs;
using flash_kda::GateMode;
using flash_kda::StateLayout;
using flash_kda::Target;
using flash_kda::TensorView;

/// Sizes and dtypes of a call. With `cu` non-empty the call is varlen: B = 1, T = cu.back().
struct Spec {
  int64_t B = 2, T = 64, H = 4, HV = 8, K = 128, V = 128;
  DType in = DType::BF16;      // q, k, v, g, beta
  DType out = DType::BF16;
  DType state = DType::F32;
  bool with_states = true;     // initial_state and final_state
  bool with_gate_params = true;  // A_log and dt_bias
  std::vector<int64_t> cu;     // cu_seqlens values
  DType cu_dtype = DType::I64;
  DeviceType device = DeviceType::CPU;
};

/// A call described by `spec`. Host calls own real, randomly filled storage (outputs poisoned
/// with 0xA5); CUDA calls get distinct, 256-byte aligned fake addresses that are never
/// dereferenced (validate() reads no device memory), so huge shapes cost nothing.
class Call {
 public:
  explicit Call(const Spec& s) : fake_(s.device == DeviceType::CUDA), device_(s.device) {
    const int64_t B = s.cu.empty() ? s.B : 1;
    const int64_t T = s.cu.empty() ? s.T : s.cu.back();
    const int64_t N = s.cu.empty() ? B : static_cast<int64_t>(s.cu.size()) - 1;
    args.q = make(s.in, {B, T, s.H, s.K});
    args.k = make(s.in, {B, T, s.H, s.K});
    args.v = make(s.in, {B, T, s.HV, s.V});
    args.g = make(s.in, {B, T, s.HV, s.K});
    args.beta = make(s.in, {B, T, s.HV});
    args.out = make(s.out, {B, T, s.HV, s.V}, /*poison=*/true);
    if (s.with_gate_params) {
      args.A_log = make(DType::F32, {s.HV});
      args.dt_bias = make(DType::F32, {s.HV, s.K});
    }
    if (!s.cu.empty()) {
      args.cu_seqlens = make(s.cu_dtype, {static_cast<int64_t>(s.cu.size())});
      set_cu(s.cu);
    }
    if (s.with_states) {
      args.initial_state = make(s.state, {N, s.HV, s.V, s.K});
      args.final_state = make(s.state, {N, s.HV, s.V, s.K}, /*poison=*/true);
    }
  }

  /// Overwrites the cu_seqlens values (host calls only; a CUDA call's values are never read).
  void set_cu(const std::vector<int64_t>& cu) {
    if (fake_) return;
    for (size_t i = 0; i < cu.size(); ++i) {
      if (args.cu_seqlens.dtype == DType::I32)
        static_cast<int32_t*>(args.cu_seqlens.data)[i] = static_cast<int32_t>(cu[i]);
      else
        static_cast<int64_t*>(args.cu_seqlens.data)[i] = cu[i];
    }
  }

  /// A tensor of the call's device with its own storage (or fake address).
  TensorView make(DType dtype, std::initializer_list<int64_t> shape, bool poison = false) {
    TensorView t = flash_kda::make_tensor(nullptr, dtype, shape, device_, 0);
    const size_t bytes = static_cast<size_t>(t.numel()) * flash_kda::dtype_size(dtype);
    if (fake_) {
      // 256-byte aligned, with a 256-byte gap that keeps fake tensors disjoint.
      t.data = reinterpret_cast<void*>(next_fake_);
      next_fake_ += ((bytes + 255) / 256 + 1) * 256;
      return t;
    }
    storage_.emplace_back(new Block[bytes / sizeof(Block) + 1]);
    t.data = storage_.back().get();
    fill(t, poison);
    return t;
  }

  /// Bytes of every given tensor of `args` (host calls), to prove nothing was written.
  std::vector<std::vector<unsigned char>> snapshot() const {
    std::vector<std::vector<unsigned char>> out;
    for (const TensorView* t : {&args.q, &args.k, &args.v, &args.g, &args.beta, &args.out, &args.A_log,
                                &args.dt_bias, &args.cu_seqlens, &args.initial_state, &args.final_state}) {
      if (!t->defined()) continue;
      const auto* p = static_cast<const unsigned char*>(t->data);
      out.emplace_back(p, p + t->numel() * flash_kda::dtype_size(t->dtype));
    }
    return out;
  }

  ForwardArgs args;

 private:
  struct alignas(256) Block {
    unsigned char b[256];
  };

  void fill(const TensorView& t, bool poison) {
    auto* p = static_cast<unsigned char*>(t.data);
    const int64_t n = t.numel();
    if (poison) {
      std::memset(p, 0xA5, static_cast<size_t>(n) * flash_kda::dtype_size(t.dtype));
      return;
    }
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int64_t i = 0; i < n; ++i) {
      const float x = u(rng_);
      switch (t.dtype) {
        case DType::F32: std::memcpy(p + 4 * i, &x, 4); break;
        case DType::F64: { const double d = x; std::memcpy(p + 8 * i, &d, 8); break; }
        case DType::BF16: case DType::F16: {
          uint32_t bits;
          std::memcpy(&bits, &x, 4);
          const uint16_t hi = static_cast<uint16_t>(bits >> 16);  // bf16 = top half of fp32
          std::memcpy(p + 2 * i, &hi, 2);
          break;
        }
        default: std::memset(p, 0, static_cast<size_t>(n) * flash_kda::dtype_size(t.dtype)); return;
      }
    }
  }

  bool fake_;
  DeviceType device_;
  uintptr_t next_fake_ = uintptr_t{1} << 40;
  std::mt19937 rng_{12345};
  std::vector<std::unique_ptr<Block[]>> storage_;
};

/// Spec for the Sm90 target: CUDA fake tensors in the supported subset.
inline Spec sm90_spec() {
  Spec s;
  s.device = DeviceType::CUDA;
  return s;
}

/// Expects `f` to throw flash_kda::Error for `argument` whose message starts with
/// "flash_kda: <argument>: " and contains every fragment.
template <class F>
void expect_error(F&& f, const std::string& argument, const std::vector<std::string>& fragments) {
  try {
    f();
  } catch (const flash_kda::Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.argument(), argument) << what;
    EXPECT_EQ(what.rfind("flash_kda: " + argument + ": ", 0), 0u) << what;
    for (const std::string& frag : fragments)
      EXPECT_NE(what.find(frag), std::string::npos) << "missing \"" << frag << "\" in: " << what;
    return;
  }
  ADD_FAILURE() << "no flash_kda::Error thrown; expected one naming " << argument;
}

/// expect_error for validate(args, target).
inline void expect_invalid(const ForwardArgs& args, Target target, const std::string& argument,
                           const std::vector<std::string>& fragments) {
  expect_error([&] { flash_kda::validate(args, target); }, argument, fragments);
}

}  // namespace kda_test
