// The decode call's validation and GPU entry point. Checks run in a fixed order (presence,
// per-tensor sanity and device, activation shapes and strides, dtypes, sequences, the pool and
// its indices, gate and flags, the Sm90 subset, aliasing) so the first error reported is the
// most basic one. Semantics: include/flash_kda/decode.h.
#include "flash_kda/decode.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "host/arg_checks.h"
#include "host/checks.h"
#if FLASH_KDA_WITH_CUDA
#include "sm90/decode/launch.h"
#endif

namespace flash_kda {
namespace {

using detail::check_dtype;
using detail::check_rank;
using detail::check_sane;
using detail::check_shape;
using detail::device_str;
using detail::dims_str;
using detail::shape_str;
using detail::strides_str;

using Named = detail::NamedView;

// Every tensor of the call, in the order errors are reported.
std::vector<Named> all_tensors(const DecodeArgs& a) {
  return {{&a.q, "q"},
          {&a.k, "k"},
          {&a.v, "v"},
          {&a.g, "g"},
          {&a.beta, "beta"},
          {&a.out, "out"},
          {&a.A_log, "A_log"},
          {&a.dt_bias, "dt_bias"},
          {&a.cu_seqlens, "cu_seqlens"},
          {&a.initial_state, "initial_state"},
          {&a.final_state, "final_state"},
          {&a.ssm_state_indices, "ssm_state_indices"},
          {&a.num_accepted_tokens, "num_accepted_tokens"}};
}

// The kernel reads q, k, v, g and state rows with 16-byte vectors.
constexpr int64_t kSm90Alignment = 16;

void check_placement(const DecodeArgs& a, Target target) {
  for (const Named& n : all_tensors(a)) {
    const TensorView& t = *n.t;
    if (t.ndim < 0) check_sane(t, n.name);  // corrupt, not absent
    if (!t.defined()) continue;
    check_sane(t, n.name);
    for (int d = 0; d < t.ndim; ++d)
      if (t.strides[d] < 0 && t.shape[d] > 1)
        throw Error(n.name, "strides must be >= 0, got strides " + strides_str(t));
    if (target == Target::CpuReference) {
      if (t.device != DeviceType::CPU)
        throw Error(n.name, "is on " + device_str(t) + ", the CPU reference (reference_decode) needs host tensors");
      continue;
    }
    if (t.device != DeviceType::CUDA)
      throw Error(n.name, "is on the host, a CUDA tensor is needed (decode() runs on the GPU)");
    if (t.device_id != a.q.device_id)
      throw Error(n.name, "q is on " + device_str(a.q) + " but " + n.name + " on " + device_str(t) +
                              "; all tensors must be on one device");
  }
}

// Byte offset of the last element of a strided view, plus one element (0 when empty).
int64_t span_bytes(const TensorView& t) {
  if (t.numel() == 0) return 0;
  int64_t last = 0;
  for (int d = 0; d < t.ndim; ++d) last += (t.shape[d] - 1) * t.strides[d];
  return (last + 1) * dtype_size(t.dtype);
}

bool spans_overlap(const TensorView& a, const TensorView& b) {
  if (!a.defined() || !b.defined() || a.device != b.device) return false;
  if (a.device == DeviceType::CUDA && a.device_id != b.device_id) return false;
  const int64_t sa = span_bytes(a), sb = span_bytes(b);
  if (sa == 0 || sb == 0) return false;
  const auto ba = reinterpret_cast<uintptr_t>(a.data), bb = reinterpret_cast<uintptr_t>(b.data);
  return ba < bb + uintptr_t(sb) && bb < ba + uintptr_t(sa);
}

// An activation view ([B, T, heads, dim] or [B, T, heads]): unit stride in the last dimension;
// on Sm90 the vector-loaded ones (`vector_rows`) need 16-byte aligned data and rows.
void check_activation_strides(const TensorView& t, const char* name, Target target, bool vector_rows) {
  if (t.numel() == 0) return;
  const int last = t.ndim - 1;
  if (t.shape[last] != 1 && t.strides[last] != 1)
    throw Error(name, "last dimension must have unit stride, got strides " + strides_str(t));
  if (target != Target::Sm90) return;
  const int64_t es = dtype_size(t.dtype);
  if (reinterpret_cast<uintptr_t>(t.data) % uintptr_t(vector_rows ? kSm90Alignment : es) != 0)
    throw Error(name, std::string("data pointer must be ") + (vector_rows ? "16-byte" : "element") +
                          " aligned for the Sm90 decode kernel");
  if (!vector_rows) return;
  for (int d = 0; d < last; ++d)
    if (t.shape[d] > 1 && (t.strides[d] * es) % kSm90Alignment != 0)
      throw Error(name, "rows must be 16-byte aligned for the Sm90 decode kernel: strides " + strides_str(t) +
                            " of " + dtype_name(t.dtype) + " elements");
}

void check_activations(const DecodeArgs& a, Target target, ProblemShape& p) {
  detail::check_activation_shapes(a, p);

  const Named acts[] = {{&a.q, "q"}, {&a.k, "k"}, {&a.v, "v"}, {&a.g, "g"}, {&a.beta, "beta"}, {&a.out, "out"}};
  for (const Named& n : acts) {
    if (n.t == &a.out && target == Target::CpuReference)  // the reference may keep its fp64 results
      check_dtype(*n.t, n.name, {DType::BF16, DType::F32, DType::F64});
    else
      check_dtype(*n.t, n.name, {DType::BF16, DType::F32});
    check_activation_strides(*n.t, n.name, target, n.t != &a.beta);
  }
}

// cu_seqlens (fills num_seqs and checks host values: cu[0] == 0, non-decreasing, cu[N] == T_total).
void check_sequences(const DecodeArgs& a, Target target, ProblemShape& p) {
  p.varlen = a.cu_seqlens.defined();
  if (!p.varlen) {
    p.num_seqs = p.batch;
    return;
  }
  const TensorView& cu = a.cu_seqlens;
  check_dtype(cu, "cu_seqlens", {DType::I32, DType::I64});
  check_rank(cu, "cu_seqlens", 1, "[N + 1]");
  detail::check_contiguous(cu, "cu_seqlens");
  if (cu.shape[0] < 2)
    throw Error("cu_seqlens", "expected length N + 1 >= 2 (at least one sequence), got shape " + shape_str(cu));
  if (p.batch != 1)
    throw Error("cu_seqlens", "given with batch B = q.shape[0] = " + std::to_string(p.batch) +
                                  "; a varlen batch packs all sequences into B = 1");
  if (target == Target::Sm90 && reinterpret_cast<uintptr_t>(cu.data) % uintptr_t(dtype_size(cu.dtype)) != 0)
    throw Error("cu_seqlens", "data pointer must be element aligned");
  p.num_seqs = cu.shape[0] - 1;
  if (target != Target::CpuReference) return;  // device values cannot be read without a sync
  detail::check_cu_seqlens_values(cu, p, "");
}

// A state tensor [slots, HV, V, K] / [slots, HV, K, V]: the per-slot part packed, slots at any
// stride that keeps them apart (16-byte multiples on Sm90).
void check_state(const TensorView& t, const char* name, int64_t slots, const std::string& slots_meaning,
                 const DecodeArgs& a, const ProblemShape& p, Target target) {
  const bool v_first = a.state_layout == StateLayout::VFirst;
  const int64_t HV = p.value_heads, K = p.head_dim_k, V = p.head_dim_v;
  const std::vector<int64_t> inner = v_first ? std::vector<int64_t>{HV, V, K} : std::vector<int64_t>{HV, K, V};
  const std::string meaning = v_first ? "[" + slots_meaning + ", HV, V, K] (v-first state layout)"
                                      : "[" + slots_meaning + ", HV, K, V] (k-first state layout)";
  check_dtype(t, name, target == Target::CpuReference ? std::initializer_list<DType>{DType::BF16, DType::F32, DType::F64}
                                                       : std::initializer_list<DType>{DType::BF16, DType::F32});
  if (slots >= 0) {
    check_shape(t, name, {slots, inner[0], inner[1], inner[2]}, meaning);
  } else {
    check_rank(t, name, 4, meaning);
    if (t.shape[0] <= 0) throw Error(name, "the pool needs P = " + std::string(name) + ".shape[0] >= 1 slots, got shape " + shape_str(t));
    check_shape(t, name, {t.shape[0], inner[0], inner[1], inner[2]}, meaning);
  }
  const int64_t slot_elems = HV * K * V;
  const bool inner_packed = (t.shape[3] == 1 || t.strides[3] == 1) && (t.shape[2] == 1 || t.strides[2] == t.shape[3]) &&
                            (t.shape[1] == 1 || t.strides[1] == t.shape[2] * t.shape[3]);
  if (!inner_packed)
    throw Error(name, "each slot must be packed (strides [s, " + std::to_string(inner[1] * inner[2]) + ", " +
                          std::to_string(inner[2]) + ", 1] for any slot stride s), got strides " + strides_str(t));
  if (t.shape[0] > 1 && t.strides[0] < slot_elems)
    throw Error(name, "slot stride must be >= HV * K * V = " + std::to_string(slot_elems) +
                          " elements (slots must not overlap), got strides " + strides_str(t));
  if (target == Target::Sm90 && t.numel() > 0) {
    if (reinterpret_cast<uintptr_t>(t.data) % kSm90Alignment != 0)
      throw Error(name, "data pointer must be 16-byte aligned for the Sm90 decode kernel");
    if (t.shape[0] > 1 && (t.strides[0] * dtype_size(t.dtype)) % kSm90Alignment != 0)
      throw Error(name, "slot stride must be a multiple of 16 bytes for the Sm90 decode kernel, got strides " +
                            strides_str(t));
  }
}

bool same_view(const TensorView& x, const TensorView& y) {
  if (x.data != y.data || x.dtype != y.dtype || x.ndim != y.ndim) return false;
  for (int d = 0; d < x.ndim; ++d)
    if (x.shape[d] != y.shape[d] || (x.shape[d] > 1 && x.strides[d] != y.strides[d])) return false;
  return true;
}

// An index tensor's entry, for the reference's value checks.
int64_t host_index(const TensorView& t, int64_t offset) {
  return t.dtype == DType::I32 ? int64_t(static_cast<const int32_t*>(t.data)[offset])
                               : static_cast<const int64_t*>(t.data)[offset];
}

void check_pool(const DecodeArgs& a, Target target, const ProblemShape& p) {
  const TensorView& idx = a.ssm_state_indices;
  const TensorView& acc = a.num_accepted_tokens;
  if (!idx.defined()) {
    if (acc.defined())
      throw Error("num_accepted_tokens", "is given without ssm_state_indices; it needs indices of shape [N, T]");
    const std::string n_meaning = "N";
    if (a.initial_state.defined()) check_state(a.initial_state, "initial_state", p.num_seqs, n_meaning, a, p, target);
    if (a.final_state.defined()) check_state(a.final_state, "final_state", p.num_seqs, n_meaning, a, p, target);
    if (a.initial_state.defined() && a.final_state.defined() && a.initial_state.dtype != a.final_state.dtype)
      throw Error("final_state", std::string("dtype must equal initial_state's (") + dtype_name(a.initial_state.dtype) +
                                     "), got " + dtype_name(a.final_state.dtype));
    return;
  }
  check_dtype(idx, "ssm_state_indices", {DType::I32, DType::I64});
  if (idx.ndim == 1) {
    check_shape(idx, "ssm_state_indices", {p.num_seqs}, "[N]");
  } else if (idx.ndim == 2) {
    if (p.varlen)
      throw Error("ssm_state_indices", "shape [N, T] needs a fixed-length batch; with cu_seqlens pass [N], got shape " +
                                           shape_str(idx));
    check_shape(idx, "ssm_state_indices", {p.num_seqs, p.seqlen}, "[N, T]");
  } else {
    throw Error("ssm_state_indices", "expected rank 1 [N] or 2 [N, T], got rank " + std::to_string(idx.ndim) + " " +
                                         shape_str(idx));
  }
  if (target == Target::Sm90 && reinterpret_cast<uintptr_t>(idx.data) % uintptr_t(dtype_size(idx.dtype)) != 0)
    throw Error("ssm_state_indices", "data pointer must be element aligned");
  if (acc.defined()) {
    if (idx.ndim != 2)
      throw Error("num_accepted_tokens", "needs ssm_state_indices of shape [N, T], got shape " + shape_str(idx));
    check_dtype(acc, "num_accepted_tokens", {DType::I32, DType::I64});
    check_shape(acc, "num_accepted_tokens", {p.num_seqs}, "[N]");
    if (target == Target::Sm90 && reinterpret_cast<uintptr_t>(acc.data) % uintptr_t(dtype_size(acc.dtype)) != 0)
      throw Error("num_accepted_tokens", "data pointer must be element aligned");
  }
  if (!a.initial_state.defined())
    throw Error("initial_state", "is required with ssm_state_indices (it is the state pool [P, HV, ...])");
  check_state(a.initial_state, "initial_state", -1, "P", a, p, target);
  if (!a.final_state.defined() || !same_view(a.final_state, a.initial_state))
    throw Error("final_state", "must be exactly initial_state (the pool, updated in place) when ssm_state_indices "
                               "is given");
  if (target != Target::CpuReference) return;  // device values cannot be read without a sync
  const int64_t P = a.initial_state.shape[0];
  const int64_t cols = idx.ndim == 2 ? idx.shape[1] : 1;
  for (int64_t n = 0; n < p.num_seqs; ++n) {
    for (int64_t t = 0; t < cols; ++t) {
      const int64_t v = host_index(idx, n * idx.strides[0] + (idx.ndim == 2 ? t * idx.strides[1] : 0));
      if (v >= P)
        throw Error("ssm_state_indices", "entry [" + std::to_string(n) + (idx.ndim == 2 ? ", " + std::to_string(t) : "") +
                                             "] = " + std::to_string(v) + " is outside the pool of P = " +
                                             std::to_string(P) + " slots (negative entries mark padded slots)");
    }
    if (acc.defined()) {
      const int64_t v = host_index(acc, n * acc.strides[0]);
      if (v < 1 || v > p.seqlen)
        throw Error("num_accepted_tokens", "entry [" + std::to_string(n) + "] = " + std::to_string(v) +
                                               " must be in [1, T = " + std::to_string(p.seqlen) + "]");
    }
  }
}

void check_gate(const DecodeArgs& a, Target target, const ProblemShape& p) {
  detail::check_gate_mode(a);
  if (a.gate == GateMode::Softplus && !a.A_log.defined())
    throw Error("A_log", "is required by the softplus gate a = -exp(A_log) * softplus(g + dt_bias) (fp32 [HV])");
  if (a.A_log.defined()) {
    check_dtype(a.A_log, "A_log", {DType::F32});
    detail::check_A_log_shape(a, p);
    detail::check_contiguous(a.A_log, "A_log");
    if (target == Target::Sm90 && reinterpret_cast<uintptr_t>(a.A_log.data) % 4 != 0)
      throw Error("A_log", "data pointer must be element aligned");
  }
  if (a.dt_bias.defined()) {
    check_dtype(a.dt_bias, "dt_bias", {DType::F32});
    detail::check_dt_bias_shape(a, p);
    detail::check_contiguous(a.dt_bias, "dt_bias");
    if (target == Target::Sm90 && reinterpret_cast<uintptr_t>(a.dt_bias.data) % kSm90Alignment != 0)
      throw Error("dt_bias", "data pointer must be 16-byte aligned for the Sm90 decode kernel");
  }
  detail::check_lower_bound(a);
}


void check_sm90_subset(const ProblemShape& p) {
  if (p.head_dim_k != 128) throw Error("q", "head dim K = " + std::to_string(p.head_dim_k) + " unsupported: the Sm90 decode kernel supports K = V = 128");
  if (p.head_dim_v != 128) throw Error("v", "head dim V = " + std::to_string(p.head_dim_v) + " unsupported: the Sm90 decode kernel supports K = V = 128");
  if (!p.varlen && p.seqlen > 16)
    throw Error("q", "T = q.shape[1] = " + std::to_string(p.seqlen) +
                         " tokens per sequence unsupported: the Sm90 decode kernel takes T <= 16 (use forward() for "
                         "longer sequences)");
  // The grid is one dimension of blocks, 16 per (sequence, value head) at most.
  constexpr int64_t kGridLimit = (int64_t{1} << 31) - 1;
  if (p.num_seqs * p.value_heads > kGridLimit / 16)
    throw Error(p.varlen ? "cu_seqlens" : "q", "N * HV = " + std::to_string(p.num_seqs) + " * " +
                                                   std::to_string(p.value_heads) + " must be < 2^27 for the Sm90 decode kernel");
}

// Outputs are written while inputs are still read: any overlap is a race, except the pool's
// exact in-place update (every block reads its part of a slot before it writes).
void check_aliasing(const DecodeArgs& a) {
  const std::vector<Named> inputs = {
      {&a.q, "q"},           {&a.k, "k"},         {&a.v, "v"},
      {&a.g, "g"},           {&a.beta, "beta"},   {&a.A_log, "A_log"},
      {&a.dt_bias, "dt_bias"}, {&a.cu_seqlens, "cu_seqlens"}, {&a.initial_state, "initial_state"},
      {&a.ssm_state_indices, "ssm_state_indices"}, {&a.num_accepted_tokens, "num_accepted_tokens"}};
  detail::check_outputs_apart(a.out, a.final_state, a.initial_state, inputs, spans_overlap, same_view,
                              "same pointer, shape, strides and dtype");
}

}  // namespace

ProblemShape validate_decode(const DecodeArgs& args, Target target) {
  if (target != Target::CpuReference && target != Target::Sm90)
    throw Error("target", "expected Target::CpuReference or Target::Sm90");
  for (const Named n : {Named{&args.q, "q"}, Named{&args.k, "k"}, Named{&args.v, "v"}, Named{&args.g, "g"},
                        Named{&args.beta, "beta"}, Named{&args.out, "out"}})
    detail::require_present(*n.t, n.name);
  check_placement(args, target);
  ProblemShape p;
  check_activations(args, target, p);
  check_sequences(args, target, p);
  detail::check_flags(args, target);
  check_pool(args, target, p);
  check_gate(args, target, p);
  if (target == Target::Sm90) check_sm90_subset(p);
  check_aliasing(args);
  p.scale = args.scale ? *args.scale : 1.0 / std::sqrt(static_cast<double>(p.head_dim_k));
  return p;
}

void validate_decode_options(const DecodeLaunchOptions& options) {
  const int k = static_cast<int>(options.kernel);
  if (k < static_cast<int>(DecodeKernel::Auto) || k > static_cast<int>(DecodeKernel::DirectRows))
    throw Error("launch_options.kernel", "expected DecodeKernel::Auto (0), Persistent (1), Direct (2), DirectColumns (3) or "
                                         "DirectRows (4), got " + std::to_string(k));
}

void decode(const DecodeArgs& args, Stream stream, const DecodeLaunchOptions& options) {
  const ProblemShape p = validate_decode(args, Target::Sm90);
  validate_decode_options(options);
  // No tokens at fixed length with [N, T] slots: nothing to read or write (the pool stays as it
  // is, out has no rows), and a kernel would read the start slot from the empty [N, 0] indices.
  if (!p.varlen && p.seqlen == 0 && args.ssm_state_indices.defined() && args.ssm_state_indices.ndim == 2) return;
#if FLASH_KDA_WITH_CUDA
  sm90::launch_decode(args, p, options.kernel, stream);
#else
  (void)p;
  (void)stream;
  throw Error("device", "flash_kda was built without its CUDA kernels (FLASH_KDA_CUDA=OFF)");
#endif
}

}  // namespace flash_kda
