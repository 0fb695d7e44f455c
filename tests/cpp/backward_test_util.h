// What the backward's kernel tests share (tests/cpp/test_backward_gpu.cpp on the GPU,
// tests/emu/test_backward_emu.cpp on the CPU model): the case, the random output gradients, and
// the gradients under test, NaN-filled so that an element the kernels never write cannot pass.
#pragma once

#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "reference_test_util.h"

namespace flash_kda::testing {

/// One backward kernel case: a problem configuration and the flags the problem leaves open.
struct BackwardCase {
  std::string name;
  KdaConfig config;
  DType d_out_dtype = DType::BF16;
  bool l2norm = true;
  bool neg_eigval = false;
};
inline void PrintTo(const BackwardCase& c, std::ostream* os) { *os << c.name; }

/// Normal(0, sd) values of `shape` in `dtype`, from `seed`.
inline HostTensor random_tensor(DType dtype, const std::vector<int64_t>& shape, uint64_t seed, double sd) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n(0.0, sd);
  int64_t count = 1;
  for (int64_t s : shape) count *= s;
  std::vector<double> v(static_cast<size_t>(count));
  for (auto& e : v) e = n(rng);
  return HostTensor::from_values(v, dtype, shape);
}

/// A case's random d_out (its dtype) and d_final_state (the final state's dtype; absent without
/// a final state), and its forward call with the case's flags.
struct BackwardInputs {
  HostTensor d_out, d_final;
  ForwardArgs forward;

  BackwardInputs(KdaProblem& prob, const BackwardCase& c)
      : d_out(random_tensor(c.d_out_dtype, prob.out.shape(), 11, 1.0)),
        d_final(prob.final_state.defined() ? random_tensor(prob.final_state.dtype(), prob.final_state.shape(), 12, 1.0)
                                           : HostTensor{}),
        forward(prob.args()) {
    forward.use_qk_l2norm = c.l2norm;
    forward.allow_neg_eigval = c.neg_eigval;
  }
};

/// Gradients in their inputs' dtypes and shapes (absent where the input is), NaN-filled.
struct PoisonedGradients : InputGradients {
  explicit PoisonedGradients(const KdaProblem& p) : InputGradients(p, Kind::Poisoned) {}
};

}  // namespace flash_kda::testing
