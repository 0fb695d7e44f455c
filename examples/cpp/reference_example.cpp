// Runs the KDA CPU reference on a tiny random problem and prints the output and state norms.
// Usage: flash_kda_example   (exit status 0 on success, 1 if flash_kda rejects the call)
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "flash_kda/flash_kda.h"

namespace {

double norm(const std::vector<float>& x) {
  double s = 0.0;
  for (float v : x) s += double(v) * v;
  return std::sqrt(s);
}

}  // namespace

int main() {
  using flash_kda::DType;
  using flash_kda::make_tensor;
  // Two sequences of 32 tokens; 2 q/k heads shared by 4 value heads (GVA); small head dims.
  const int64_t B = 2, T = 32, H = 2, HV = 4, K = 16, V = 16;

  std::mt19937 rng(2026);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random = [&](size_t n) {
    std::vector<float> x(n);
    for (float& v : x) v = normal(rng);
    return x;
  };
  std::vector<float> q = random(B * T * H * K), k = random(B * T * H * K), v = random(B * T * HV * V);
  std::vector<float> g = random(B * T * HV * K), beta = random(B * T * HV);
  std::vector<float> A_log(HV), dt_bias = random(HV * K);
  std::uniform_real_distribution<float> rate(1.0f, 16.0f);
  for (float& a : A_log) a = std::log(rate(rng));  // A_log ~ log U(1, 16), as in Kimi Linear
  for (float& d : dt_bias) d *= 0.1f;
  std::vector<float> h0 = random(B * HV * V * K);
  std::vector<float> out(B * T * HV * V), h1(B * HV * V * K);

  flash_kda::ForwardArgs args;
  args.q = make_tensor(q.data(), DType::F32, {B, T, H, K});
  args.k = make_tensor(k.data(), DType::F32, {B, T, H, K});
  args.v = make_tensor(v.data(), DType::F32, {B, T, HV, V});
  args.g = make_tensor(g.data(), DType::F32, {B, T, HV, K});
  args.beta = make_tensor(beta.data(), DType::F32, {B, T, HV});
  args.out = make_tensor(out.data(), DType::F32, {B, T, HV, V});
  args.A_log = make_tensor(A_log.data(), DType::F32, {HV});
  args.dt_bias = make_tensor(dt_bias.data(), DType::F32, {HV, K});
  args.initial_state = make_tensor(h0.data(), DType::F32, {B, HV, V, K});
  args.final_state = make_tensor(h1.data(), DType::F32, {B, HV, V, K});
  args.gate = flash_kda::GateMode::SafeSigmoid;
  args.lower_bound = -5.0;

  try {
    flash_kda::reference_forward(args);
  } catch (const flash_kda::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  std::printf("flash_kda %s reference_forward B=%lld T=%lld H=%lld HV=%lld K=%lld V=%lld\n", flash_kda::kVersion,
              (long long)B, (long long)T, (long long)H, (long long)HV, (long long)K, (long long)V);
  std::printf("out norm: %.6f\nfinal_state norm: %.6f\n", norm(out), norm(h1));
  return 0;
}
