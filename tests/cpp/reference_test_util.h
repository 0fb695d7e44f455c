// Shared helpers for the C++ tests: host tensors that own their memory, bf16 conversion,
// random KDA problems drawn as docs/kda-spec.md "Accuracy contract" describes, and the
// relative Frobenius error. Header-only: every test_*.cpp is compiled into one executable.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "flash_kda/flash_kda.h"
#include "reference/element_io.h"

namespace flash_kda::testing {

using reference_detail::bf16_bits_to_float;

/// fp32 -> bf16 bit pattern, round to nearest, ties to even (the reference's own rounding;
/// from an fp32 it is a single rounding).
inline uint16_t float_to_bf16_bits(float f) { return reference_detail::double_to_bf16_bits(f); }

/// The bf16 value nearest to `f` (ties to even), as an fp32.
inline float round_to_bf16(float f) { return bf16_bits_to_float(float_to_bf16_bits(f)); }

/// A contiguous host tensor that owns its memory; the test-side counterpart of TensorView.
/// A default-constructed HostTensor is "absent" and its view() has ndim == 0.
class HostTensor {
 public:
  HostTensor() = default;

  /// Zero-filled tensor of `dtype` and `shape` (outermost first).
  HostTensor(DType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)), present_(true) {
    bytes_.assign(size_t(numel() * dtype_size(dtype_)), 0);
  }

  /// Tensor holding `values` converted to `dtype` (bf16: via fp32, ties to even; integers:
  /// truncated). Read the stored values back with values() when exactness matters.
  static HostTensor from_values(const std::vector<double>& values, DType dtype, std::vector<int64_t> shape) {
    HostTensor t(dtype, std::move(shape));
    for (size_t i = 0; i < values.size() && int64_t(i) < t.numel(); ++i) t.set(int64_t(i), values[i]);
    return t;
  }

  bool defined() const { return present_; }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape_) n *= s;
    return present_ ? n : 0;
  }
  void* data() { return bytes_.data(); }
  const std::vector<unsigned char>& bytes() const { return bytes_; }

  /// Element i widened to fp64.
  double get(int64_t i) const {
    const void* p = bytes_.data();
    switch (dtype_) {
      case DType::BF16: return bf16_bits_to_float(static_cast<const uint16_t*>(p)[i]);
      case DType::F32: return static_cast<const float*>(p)[i];
      case DType::F64: return static_cast<const double*>(p)[i];
      case DType::I32: return static_cast<const int32_t*>(p)[i];
      case DType::I64: return double(static_cast<const int64_t*>(p)[i]);
      case DType::U8: return static_cast<const uint8_t*>(p)[i];
      case DType::F16: break;
    }
    return std::nan("");
  }

  /// Stores x into element i, converted to the tensor's dtype.
  void set(int64_t i, double x) {
    void* p = bytes_.data();
    switch (dtype_) {
      case DType::BF16: static_cast<uint16_t*>(p)[i] = float_to_bf16_bits(float(x)); break;
      case DType::F32: static_cast<float*>(p)[i] = float(x); break;
      case DType::F64: static_cast<double*>(p)[i] = x; break;
      case DType::I32: static_cast<int32_t*>(p)[i] = int32_t(x); break;
      case DType::I64: static_cast<int64_t*>(p)[i] = int64_t(x); break;
      case DType::U8: static_cast<uint8_t*>(p)[i] = uint8_t(x); break;
      case DType::F16: break;
    }
  }

  /// Every element widened to fp64, in memory order.
  std::vector<double> values() const {
    std::vector<double> out(static_cast<size_t>(numel()));
    for (int64_t i = 0; i < numel(); ++i) out[size_t(i)] = get(i);
    return out;
  }

  void fill(double x) {
    for (int64_t i = 0; i < numel(); ++i) set(i, x);
  }

  /// A TensorView of this tensor (absent when the tensor is).
  TensorView view() {
    if (!present_) return TensorView{};
    TensorView t;
    t.data = bytes_.data();
    t.dtype = dtype_;
    t.ndim = int(shape_.size());
    int64_t stride = 1;
    for (int d = t.ndim - 1; d >= 0; --d) {
      t.shape[d] = shape_[size_t(d)];
      t.strides[d] = stride;
      stride *= shape_[size_t(d)];
    }
    return t;
  }

 private:
  DType dtype_ = DType::F32;
  std::vector<int64_t> shape_;
  std::vector<unsigned char> bytes_;
  bool present_ = false;
};

/// ||got - ref||_F / ||ref||_F over whole tensors (same length). ref must not be all zeros.
inline double rel_frobenius(const std::vector<double>& got, const std::vector<double>& ref) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = (i < got.size() ? got[i] : 0.0) - ref[i];
    diff += d * d;
    norm += ref[i] * ref[i];
  }
  return std::sqrt(diff) / std::sqrt(norm);
}

/// What make_random_problem draws. Defaults: a small fixed-length bf16 problem with the safe
/// gate, A_log, dt_bias and both states, results in fp64.
struct KdaConfig {
  int64_t batch = 2;                 ///< B (forced to 1 when seqlens is given)
  int64_t seqlen = 20;               ///< T per sequence (ignored when seqlens is given)
  std::vector<int64_t> seqlens;      ///< non-empty: varlen batch with these lengths (0 allowed)
  int64_t heads = 2;                 ///< H
  int64_t value_heads = 2;           ///< HV, a multiple of H
  int64_t head_dim_k = 8;            ///< K
  int64_t head_dim_v = 8;            ///< V
  DType input_dtype = DType::BF16;   ///< q, k, v, g, beta
  DType out_dtype = DType::F64;
  DType state_dtype = DType::F32;    ///< initial_state and final_state
  DType cu_dtype = DType::I64;
  StateLayout state_layout = StateLayout::VFirst;
  GateMode gate = GateMode::SafeSigmoid;
  bool with_A_log = true;            ///< ignored (absent) for PreGated, which rejects A_log
  bool with_dt_bias = true;          ///< ignored (absent) for PreGated, which rejects dt_bias
  bool with_initial_state = true;
  bool with_final_state = true;
  bool beta_logits = true;           ///< beta ~ N(0,1) logits; false: beta ~ U(0.05, 1) (post-sigmoid)
  double qk_std = 1.0;               ///< q, k ~ N(0, qk_std^2) (keep |k| <~ 1 without L2 norm)
  double A_log_exp_min = 1.0;        ///< A_log = log U(A_log_exp_min, A_log_exp_max)
  double A_log_exp_max = 16.0;
  double g_mean = 0.0;               ///< SafeSigmoid / Softplus: g ~ N(g_mean, g_std^2)
  double g_std = 1.0;
  double pregated_min = -1.0;        ///< PreGated: g = log decay ~ U(pregated_min, 0)
  uint64_t seed = 1;
};

/// Points the eleven tensors of `a` at views of the given ones (HostTensor, or any type with
/// view()), in the API's order; the flags of `a` are left as they are.
template <typename T>
void set_views(ForwardArgs& a, T& q, T& k, T& v, T& g, T& beta, T& out, T& A_log, T& dt_bias, T& cu_seqlens,
               T& initial_state, T& final_state) {
  a.q = q.view();
  a.k = k.view();
  a.v = v.view();
  a.g = g.view();
  a.beta = beta.view();
  a.out = out.view();
  a.A_log = A_log.view();
  a.dt_bias = dt_bias.view();
  a.cu_seqlens = cu_seqlens.view();
  a.initial_state = initial_state.view();
  a.final_state = final_state.view();
}

/// A random KDA call: owned tensors plus the flags for ForwardArgs.
struct KdaProblem {
  KdaConfig config;
  HostTensor q, k, v, g, beta, A_log, dt_bias, cu_seqlens, initial_state, final_state, out;

  int64_t num_seqs() const { return config.seqlens.empty() ? config.batch : int64_t(config.seqlens.size()); }
  int64_t total_tokens() const {
    if (config.seqlens.empty()) return config.batch * config.seqlen;
    int64_t t = 0;
    for (int64_t s : config.seqlens) t += s;
    return t;
  }

  /// ForwardArgs viewing this problem's tensors, with the config's gate and layout and the
  /// ForwardArgs defaults for every other flag (callers adjust them).
  ForwardArgs args() {
    ForwardArgs a;
    set_views(a, q, k, v, g, beta, out, A_log, dt_bias, cu_seqlens, initial_state, final_state);
    a.gate = config.gate;
    a.state_layout = config.state_layout;
    a.use_beta_sigmoid = config.beta_logits;
    return a;
  }
};

/// The gradients of a problem's inputs, one per input it has (absent where it has none):
/// fp64 zeros for reference_backward (Fp64), or the inputs' own dtypes filled with NaN so that an
/// element a kernel never writes cannot pass (Poisoned).
struct InputGradients {
  enum class Kind { Fp64, Poisoned };
  HostTensor dq, dk, dv, dg, dbeta, dA_log, ddt_bias, d_initial_state;

  InputGradients(const KdaProblem& p, Kind kind)
      : dq(like(p.q, kind)), dk(like(p.k, kind)), dv(like(p.v, kind)), dg(like(p.g, kind)),
        dbeta(like(p.beta, kind)), dA_log(like(p.A_log, kind)), ddt_bias(like(p.dt_bias, kind)),
        d_initial_state(like(p.initial_state, kind)) {}

  /// Points b's gradient views at these tensors.
  void point(BackwardArgs& b) {
    b.dq = dq.view();
    b.dk = dk.view();
    b.dv = dv.view();
    b.dg = dg.view();
    b.dbeta = dbeta.view();
    b.dA_log = dA_log.view();
    b.ddt_bias = ddt_bias.view();
    b.d_initial_state = d_initial_state.view();
  }

  /// The backward of `forward` (its out and final_state dropped: the backward takes the
  /// forward's inputs only) with d_out, d_final_state (absent: none) and these gradients.
  BackwardArgs args(const ForwardArgs& forward, HostTensor& d_out, HostTensor& d_final_state) {
    BackwardArgs b;
    b.forward = forward;
    b.forward.out = {};
    b.forward.final_state = {};
    b.d_out = d_out.view();
    b.d_final_state = d_final_state.view();
    point(b);
    return b;
  }

 private:
  static HostTensor like(const HostTensor& t, Kind kind) {
    if (!t.defined()) return HostTensor{};
    if (kind == Kind::Fp64) return HostTensor(DType::F64, t.shape());
    HostTensor g(t.dtype(), t.shape());
    g.fill(std::nan(""));
    return g;
  }
};

/// reference_backward's outputs: fp64 zeros.
struct Fp64Gradients : InputGradients {
  explicit Fp64Gradients(const KdaProblem& p) : InputGradients(p, Kind::Fp64) {}
};

/// Draws a fresh problem from `c` (never zeros): q, k ~ N(0, qk_std^2); v ~ N(0, 1); g ~ N(g_mean, g_std^2) for the
/// SafeSigmoid and Softplus gates, U(pregated_min, 0) for PreGated; dt_bias ~ N(0, 0.1);
/// initial_state ~ N(0, 0.5). Values are rounded to their tensor's dtype when stored.
inline KdaProblem make_random_problem(const KdaConfig& c) {
  KdaProblem p;
  p.config = c;
  if (!c.seqlens.empty()) p.config.batch = 1;
  const KdaConfig& cfg = p.config;
  std::mt19937_64 rng(cfg.seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto draw = [&](int64_t n, auto&& dist) {
    std::vector<double> x(static_cast<size_t>(n));
    for (auto& e : x) e = dist();
    return x;
  };
  auto gauss = [&](double sd) { return [&, sd] { return sd * normal(rng); }; };
  auto uniform = [&](double lo, double hi) {
    return [&, lo, hi] { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  };

  const int64_t B = cfg.batch, T = cfg.seqlens.empty() ? cfg.seqlen : p.total_tokens();
  const int64_t H = cfg.heads, HV = cfg.value_heads, K = cfg.head_dim_k, V = cfg.head_dim_v;
  const int64_t N = p.num_seqs();
  p.q = HostTensor::from_values(draw(B * T * H * K, gauss(cfg.qk_std)), cfg.input_dtype, {B, T, H, K});
  p.k = HostTensor::from_values(draw(B * T * H * K, gauss(cfg.qk_std)), cfg.input_dtype, {B, T, H, K});
  p.v = HostTensor::from_values(draw(B * T * HV * V, gauss(1.0)), cfg.input_dtype, {B, T, HV, V});
  const auto g_values = cfg.gate == GateMode::PreGated ? draw(B * T * HV * K, uniform(cfg.pregated_min, 0.0))
                                                       : draw(B * T * HV * K, [&] { return cfg.g_mean + cfg.g_std * normal(rng); });
  p.g = HostTensor::from_values(g_values, cfg.input_dtype, {B, T, HV, K});
  p.beta = HostTensor::from_values(cfg.beta_logits ? draw(B * T * HV, gauss(1.0)) : draw(B * T * HV, uniform(0.05, 1.0)),
                                   cfg.input_dtype, {B, T, HV});
  p.out = HostTensor(cfg.out_dtype, {B, T, HV, V});
  if (cfg.with_A_log && cfg.gate != GateMode::PreGated) {
    auto a_log = draw(HV, uniform(cfg.A_log_exp_min, cfg.A_log_exp_max));
    for (auto& x : a_log) x = std::log(x);
    p.A_log = HostTensor::from_values(a_log, DType::F32, {HV});
  }
  if (cfg.with_dt_bias && cfg.gate != GateMode::PreGated) p.dt_bias = HostTensor::from_values(draw(HV * K, gauss(0.1)), DType::F32, {HV, K});
  if (!cfg.seqlens.empty()) {
    std::vector<double> cu{0.0};
    for (int64_t s : cfg.seqlens) cu.push_back(cu.back() + double(s));
    p.cu_seqlens = HostTensor::from_values(cu, cfg.cu_dtype, {N + 1});
  }
  const std::vector<int64_t> state_shape = cfg.state_layout == StateLayout::VFirst
                                               ? std::vector<int64_t>{N, HV, V, K}
                                               : std::vector<int64_t>{N, HV, K, V};
  if (cfg.with_initial_state)
    p.initial_state = HostTensor::from_values(draw(N * HV * K * V, gauss(0.5)), cfg.state_dtype, state_shape);
  if (cfg.with_final_state) p.final_state = HostTensor(cfg.state_dtype, state_shape);
  return p;
}

}  // namespace flash_kda::testing
