// Runs flash_kda::forward on an sm_90 GPU the way a C++ caller does: every buffer cudaMalloc'ed
// by the caller, the workspace sized by forward_workspace_size and owned by the caller, the
// call enqueued on the caller's stream. Then checks the result against
// flash_kda::reference_forward (fp64, on the host) on the same bf16 inputs: the relative
// Frobenius error ||x - ref|| / ||ref|| of out and of final_state must be <= 1e-2, the
// accuracy contract of docs/kda-spec.md (the kernels measure ~3e-3).
//
// The problem: a varlen batch of three sequences (100, 0 and 160 tokens), 2 q/k heads shared by
// 4 value heads (GVA), K = V = 128, fp32 initial and final states (v-first [N, HV, V, K]).
//
// Usage: flash_kda_forward_example
// Exit status: 0 when both errors are within the bound, 1 when not (or on an error), 77 when
// there is no sm_90 GPU (ctest reports the test as skipped, with the reason printed).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "flash_kda/flash_kda.h"

namespace {

constexpr double kBound = 1e-2;
constexpr int kSkip = 77;

// Why the example cannot run here, or "" when device 0 is an sm_90 GPU.
std::string skip_reason() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    return "no CUDA device visible";
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "cannot query CUDA device 0";
  if (prop.major != 9 || prop.minor != 0)
    return "device 0 (" + std::string(prop.name) + ") is sm_" + std::to_string(prop.major * 10 + prop.minor) +
           ", the kernels need sm_90";
  return "";
}

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw flash_kda::CudaError(std::string(what) + ": " + cudaGetErrorString(status));
}

// bf16 bits of x, rounded to nearest even (inputs here are finite).
uint16_t to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

double from_bf16(uint16_t h) {
  const uint32_t bits = uint32_t{h} << 16;
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
}

double rel_frobenius(const std::vector<double>& x, const std::vector<double>& ref) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff += (x[i] - ref[i]) * (x[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  return std::sqrt(diff / norm);
}

// A caller-owned device buffer.
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { check(cudaMalloc(&ptr, bytes ? bytes : 1), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(DeviceBuffer&& other) noexcept : ptr(other.ptr) { other.ptr = nullptr; }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

template <typename T>
DeviceBuffer upload(const std::vector<T>& host) {
  DeviceBuffer d(host.size() * sizeof(T));
  check(cudaMemcpy(d.ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy to device");
  return d;
}

int run() {
  using flash_kda::DeviceType;
  using flash_kda::DType;
  using flash_kda::make_tensor;
  const std::vector<int32_t> cu = {0, 100, 100, 260};  // three sequences, one empty
  const int64_t N = int64_t(cu.size()) - 1, T = cu.back(), H = 2, HV = 4, K = 128, V = 128;

  // Inputs as Kimi Linear draws them: q, k, v, beta ~ N(0, 1), g ~ N(0, 1), A_log = log U(1, 16),
  // dt_bias ~ U(-1, 1); q, k, v, g, beta in bf16.
  std::mt19937 rng(2026);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f), rate(1.0f, 16.0f);
  auto bf16s = [&](int64_t n) {
    std::vector<uint16_t> x(static_cast<size_t>(n));
    for (uint16_t& b : x) b = to_bf16(normal(rng));
    return x;
  };
  const std::vector<uint16_t> q = bf16s(T * H * K), k = bf16s(T * H * K), v = bf16s(T * HV * V);
  const std::vector<uint16_t> g = bf16s(T * HV * K), beta = bf16s(T * HV);
  std::vector<float> A_log(static_cast<size_t>(HV)), dt_bias(static_cast<size_t>(HV * K));
  std::vector<float> h0(static_cast<size_t>(N * HV * V * K));
  for (float& a : A_log) a = std::log(rate(rng));
  for (float& d : dt_bias) d = unit(rng);
  for (float& s : h0) s = 0.1f * normal(rng);

  // The GPU call: device buffers, a caller-owned workspace and stream.
  DeviceBuffer d_q = upload(q), d_k = upload(k), d_v = upload(v), d_g = upload(g), d_beta = upload(beta);
  DeviceBuffer d_A_log = upload(A_log), d_dt_bias = upload(dt_bias), d_cu = upload(cu), d_h0 = upload(h0);
  DeviceBuffer d_out(static_cast<size_t>(T * HV * V) * 2), d_h1(h0.size() * sizeof(float));
  const auto cuda = [](void* p, DType dtype, std::initializer_list<int64_t> shape) {
    return make_tensor(p, dtype, shape, DeviceType::CUDA, /*device_id=*/0);
  };
  flash_kda::ForwardArgs args;
  args.q = cuda(d_q.ptr, DType::BF16, {1, T, H, K});
  args.k = cuda(d_k.ptr, DType::BF16, {1, T, H, K});
  args.v = cuda(d_v.ptr, DType::BF16, {1, T, HV, V});
  args.g = cuda(d_g.ptr, DType::BF16, {1, T, HV, K});
  args.beta = cuda(d_beta.ptr, DType::BF16, {1, T, HV});
  args.out = cuda(d_out.ptr, DType::BF16, {1, T, HV, V});
  args.A_log = cuda(d_A_log.ptr, DType::F32, {HV});
  args.dt_bias = cuda(d_dt_bias.ptr, DType::F32, {HV, K});
  args.cu_seqlens = cuda(d_cu.ptr, DType::I32, {N + 1});
  args.initial_state = cuda(d_h0.ptr, DType::F32, {N, HV, V, K});
  args.final_state = cuda(d_h1.ptr, DType::F32, {N, HV, V, K});
  // The host copy of cu_seqlens: its values are checked at no cost to the GPU.
  args.cu_seqlens_cpu = make_tensor(const_cast<int32_t*>(cu.data()), DType::I32, {N + 1});
  args.lower_bound = -5.0;  // gate SafeSigmoid, scale K^-0.5: the defaults

  const size_t workspace_bytes = flash_kda::forward_workspace_size(args);
  DeviceBuffer workspace(workspace_bytes);
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  flash_kda::forward(args, workspace.ptr, workspace_bytes, stream);  // enqueues only: no sync
  check(cudaStreamSynchronize(stream), "the forward kernels");
  check(cudaStreamDestroy(stream), "cudaStreamDestroy");

  std::vector<uint16_t> out_bf16(static_cast<size_t>(T * HV * V));
  std::vector<float> h1(h0.size());
  check(cudaMemcpy(out_bf16.data(), d_out.ptr, out_bf16.size() * 2, cudaMemcpyDeviceToHost), "cudaMemcpy out");
  check(cudaMemcpy(h1.data(), d_h1.ptr, h1.size() * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy final_state");

  // The reference on host copies of the same inputs; results in fp64 (the state widened
  // exactly to fp64 so that the fp64 final state matches its dtype).
  std::vector<double> ref_out(out_bf16.size()), ref_h0(h0.begin(), h0.end()), ref_h1(h0.size());
  flash_kda::ForwardArgs ref = args;
  ref.q = make_tensor(const_cast<uint16_t*>(q.data()), DType::BF16, {1, T, H, K});
  ref.k = make_tensor(const_cast<uint16_t*>(k.data()), DType::BF16, {1, T, H, K});
  ref.v = make_tensor(const_cast<uint16_t*>(v.data()), DType::BF16, {1, T, HV, V});
  ref.g = make_tensor(const_cast<uint16_t*>(g.data()), DType::BF16, {1, T, HV, K});
  ref.beta = make_tensor(const_cast<uint16_t*>(beta.data()), DType::BF16, {1, T, HV});
  ref.out = make_tensor(ref_out.data(), DType::F64, {1, T, HV, V});
  ref.A_log = make_tensor(A_log.data(), DType::F32, {HV});
  ref.dt_bias = make_tensor(dt_bias.data(), DType::F32, {HV, K});
  ref.cu_seqlens = make_tensor(const_cast<int32_t*>(cu.data()), DType::I32, {N + 1});
  ref.initial_state = make_tensor(ref_h0.data(), DType::F64, {N, HV, V, K});
  ref.final_state = make_tensor(ref_h1.data(), DType::F64, {N, HV, V, K});
  flash_kda::reference_forward(ref);

  std::vector<double> got_out(out_bf16.size()), got_h1(h1.begin(), h1.end());
  for (size_t i = 0; i < out_bf16.size(); ++i) got_out[i] = from_bf16(out_bf16[i]);
  const double err_out = rel_frobenius(got_out, ref_out), err_h1 = rel_frobenius(got_h1, ref_h1);
  const bool ok = err_out <= kBound && err_h1 <= kBound;  // false for NaN too
  std::printf("flash_kda %s forward: varlen N=%lld T=%lld H=%lld HV=%lld K=V=%lld, workspace %zu bytes\n",
              flash_kda::kVersion, (long long)N, (long long)T, (long long)H, (long long)HV, (long long)K,
              workspace_bytes);
  std::printf("relative Frobenius error vs reference_forward: out %.3e, final_state %.3e (bound %.0e): %s\n",
              err_out, err_h1, kBound, ok ? "ok" : "FAIL");
  return ok ? 0 : 1;
}

}  // namespace

int main() {
  const std::string why = skip_reason();
  if (!why.empty()) {
    std::printf("SKIP: %s\n", why.c_str());
    return kSkip;
  }
  try {
    return run();
  } catch (const std::exception& e) {  // flash_kda::Error, flash_kda::CudaError
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
