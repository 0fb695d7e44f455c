// The exact CPU reference of decode(): each sequence's start state gathered from the pool (or
// initial_state, or zero), the recurrence run token by token in fp64 (reference/token_step.h),
// the state writes of include/flash_kda/decode.h applied afterwards in sequence and token
// order. Everything is computed into private buffers first, so nothing is written on error and
// the pool may be read and written by the same call.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "flash_kda/decode.h"
#include "reference/element_io.h"
#include "reference/token_step.h"

namespace flash_kda {
namespace {

using reference_detail::load_element;
using reference_detail::store_element;

int64_t index_at(const TensorView& t, int64_t offset) {
  return t.dtype == DType::I32 ? int64_t(static_cast<const int32_t*>(t.data)[offset])
                               : static_cast<const int64_t*>(t.data)[offset];
}

// Element offset of state element S[i][j] (key i, value j) of value head hv within a slot.
int64_t state_offset(const DecodeArgs& a, int64_t hv, int64_t i, int64_t j, int64_t K, int64_t V) {
  return hv * K * V + reference_detail::state_offset(a.state_layout, i, j, K, V);
}

// One pending state write: all HV heads of a slot (pool slot, or final_state row n).
struct StateWrite {
  int64_t slot;
  std::vector<double> S;  // [HV, K, V]
};

}  // namespace

void reference_decode(const DecodeArgs& args, int num_threads) {
  if (num_threads < 0)
    throw Error("num_threads", "must be >= 0 (0 = one per hardware thread), got " + std::to_string(num_threads));
  const ProblemShape p = validate_decode(args, Target::CpuReference);
  const int64_t N = p.num_seqs, H = p.heads, HV = p.value_heads, K = p.head_dim_k, V = p.head_dim_v;
  const int64_t G = HV / H;
  const TensorView& idx = args.ssm_state_indices;
  const bool pool = idx.defined();
  const bool per_token = pool && idx.ndim == 2;

  const reference_detail::StepFlags flags = reference_detail::step_flags(args, p.scale);
  std::vector<double> rate(size_t(HV), 1.0), bias(size_t(HV * K), 0.0);
  if (args.gate != GateMode::PreGated) {
    if (args.A_log.defined())
      for (int64_t hv = 0; hv < HV; ++hv) rate[size_t(hv)] = std::exp(load_element(args.A_log, hv));
    if (args.dt_bias.defined())
      for (int64_t i = 0; i < HV * K; ++i) bias[size_t(i)] = load_element(args.dt_bias, i);
  }

  auto elem = [](const TensorView& t, std::initializer_list<int64_t> ix) {
    int64_t off = 0, d = 0;
    for (int64_t x : ix) off += x * t.strides[d++];
    return load_element(t, off);
  };
  auto slot_index = [&](int64_t n, int64_t t) {
    return index_at(idx, n * idx.strides[0] + (per_token ? t * idx.strides[1] : 0));
  };

  std::vector<double> out(size_t(p.batch * p.seqlen * HV * V), 0.0);  // [B, T, HV, V]; skipped rows stay 0
  std::vector<StateWrite> writes;
  reference_detail::TokenInputs in(K, V);
  std::vector<double> S(size_t(K * V));
  (void)num_threads;  // decode problems are a few tokens per sequence: one thread suffices

  for (int64_t n = 0; n < N; ++n) {
    const int64_t begin = p.varlen ? index_at(args.cu_seqlens, n) : 0;
    const int64_t len = p.varlen ? index_at(args.cu_seqlens, n + 1) - begin : p.seqlen;
    const int64_t b = p.varlen ? 0 : n;
    int64_t start_slot = -1;
    if (pool) {
      const int64_t t0 = args.num_accepted_tokens.defined()
                             ? index_at(args.num_accepted_tokens, n * args.num_accepted_tokens.strides[0]) - 1
                             : 0;
      start_slot = slot_index(n, t0);
      if (start_slot < 0) continue;  // padded: nothing read or written, out rows stay zero
      if (len == 0) continue;        // no token: the slot already holds the state
    }
    std::vector<double> all(size_t(HV * K * V), 0.0);  // the state of every head after each token
    std::vector<std::vector<double>> heads(size_t(HV), std::vector<double>(size_t(K * V), 0.0));
    const TensorView& h0 = args.initial_state;
    const int64_t src_slot = pool ? start_slot : n;
    if (h0.defined())
      for (int64_t hv = 0; hv < HV; ++hv)
        for (int64_t i = 0; i < K; ++i)
          for (int64_t j = 0; j < V; ++j)
            heads[size_t(hv)][size_t(i * V + j)] = load_element(h0, src_slot * h0.strides[0] + state_offset(args, hv, i, j, K, V));

    for (int64_t t = 0; t < len; ++t) {
      const int64_t tok = begin + t;
      for (int64_t hv = 0; hv < HV; ++hv) {
        const int64_t h = hv / G;
        for (int64_t i = 0; i < K; ++i) {
          in.q[size_t(i)] = elem(args.q, {b, tok, h, i});
          in.k[size_t(i)] = elem(args.k, {b, tok, h, i});
          in.g[size_t(i)] = elem(args.g, {b, tok, hv, i});
        }
        for (int64_t j = 0; j < V; ++j) in.v[size_t(j)] = elem(args.v, {b, tok, hv, j});
        in.beta = elem(args.beta, {b, tok, hv});
        double* out_row = &out[size_t(((b * p.seqlen + tok) * HV + hv) * V)];
        reference_detail::token_step(heads[size_t(hv)], in, flags, rate[size_t(hv)], &bias[size_t(hv * K)], out_row);
      }
      if (!per_token && t != len - 1) continue;  // [N] indices and final_state keep the last token's state
      int64_t dst = n;
      if (pool) dst = per_token ? slot_index(n, t) : start_slot;
      if (dst < 0) continue;  // a padded token slot: that token's state is not kept
      if (!pool && !args.final_state.defined()) continue;
      for (int64_t hv = 0; hv < HV; ++hv)
        std::copy(heads[size_t(hv)].begin(), heads[size_t(hv)].end(), all.begin() + hv * K * V);
      writes.push_back({dst, all});
    }
    if (!pool && len == 0 && args.final_state.defined()) {  // pass-through of the start state
      for (int64_t hv = 0; hv < HV; ++hv)
        std::copy(heads[size_t(hv)].begin(), heads[size_t(hv)].end(), all.begin() + hv * K * V);
      writes.push_back({n, all});
    }
  }

  // Every result is ready: store out, then the states in sequence and token order.
  for (int64_t bb = 0; bb < p.batch; ++bb)
    for (int64_t t = 0; t < p.seqlen; ++t)
      for (int64_t hv = 0; hv < HV; ++hv)
        for (int64_t j = 0; j < V; ++j) {
          const TensorView& o = args.out;
          const int64_t off = bb * o.strides[0] + t * o.strides[1] + hv * o.strides[2] + j * o.strides[3];
          store_element(o, off, out[size_t(((bb * p.seqlen + t) * HV + hv) * V + j)]);
        }
  const TensorView& ht = args.final_state;
  for (const StateWrite& w : writes)
    for (int64_t hv = 0; hv < HV; ++hv)
      for (int64_t i = 0; i < K; ++i)
        for (int64_t j = 0; j < V; ++j)
          store_element(ht, w.slot * ht.strides[0] + state_offset(args, hv, i, j, K, V),
                        w.S[size_t((hv * K + i) * V + j)]);
}

}  // namespace flash_kda
