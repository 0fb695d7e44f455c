// The exact CPU reference of KDA: the recurrence of docs/kda-spec.md evaluated token by token
// in fp64. It is the yardstick for every GPU test, so it follows the spec literally (no chunked
// algebra) and is made fast only by running (sequence, value head) pairs on separate threads.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/gate.h"
#include "flash_kda/forward.h"
#include "host/problem.h"
#include "reference/element_io.h"
#include "reference/parallel.h"
#include "reference/token_step.h"

namespace flash_kda {
namespace {

using reference_detail::load_element;
using reference_detail::row_offset;
using reference_detail::state_offset;
using reference_detail::store_element;

/// Everything a (sequence, value head) task needs, read once from the call.
struct Plan {
  const ForwardArgs* args = nullptr;
  ProblemShape p;
  int64_t group = 1;                 ///< G = HV / H: value heads per q/k head (GVA)
  std::vector<int64_t> seq_start;    ///< [N + 1] first token of each sequence, then the end
  std::vector<double> decay_rate;    ///< [HV] exp(A_log), 1 without A_log
  std::vector<double> dt_bias;       ///< [HV * K], 0 without dt_bias
  std::vector<double>* out = nullptr;          ///< [T_total, HV, V] (B * T tokens when fixed)
  std::vector<double>* final_state = nullptr;  ///< [N, HV, K, V] (S itself, k-first; by sequence, not slot)
  /// Intermediate states (forward.h), when asked for: [S, HV, K, V] (k-first), and for each row
  /// the sequence whose state it receives (-1: none; the last of overlapping ranges).
  std::vector<double>* inter = nullptr;
  std::vector<int64_t> inter_row_first;  ///< [N] offsets[n]
  std::vector<int64_t> inter_writer;     ///< [S]
};

/// Entry i of an int32 / int64 index tensor, widened.
int64_t index_at(const TensorView& t, int64_t i) {
  return t.dtype == DType::I32 ? int64_t(static_cast<const int32_t*>(t.data)[i]) : static_cast<const int64_t*>(t.data)[i];
}

/// The row of intermediate_states that receives sequence n's state after `done` tokens, or -1:
/// done must be a multiple of intermediate_every, its j (forward.h) inside n's range, and the
/// row not taken by a later sequence.
int64_t inter_row(const Plan& plan, int64_t n, int64_t done) {
  const ForwardArgs& a = *plan.args;
  if (plan.inter == nullptr || done % a.intermediate_every != 0) return -1;
  const int64_t j = done / a.intermediate_every - (a.intermediate_include_initial ? 0 : 1);
  if (j < 0) return -1;
  const int64_t row = plan.inter_row_first[size_t(n)] + j;
  return row < int64_t(plan.inter_writer.size()) && plan.inter_writer[size_t(row)] == n ? row : -1;
}

/// Copies S (k-first K x V) into row `row`, value head hv, of the plan's intermediate buffer.
void keep_inter(const Plan& plan, int64_t row, int64_t hv, const std::vector<double>& S) {
  if (row < 0) return;
  const int64_t KV = plan.p.head_dim_k * plan.p.head_dim_v;
  std::copy(S.begin(), S.end(), plan.inter->begin() + (row * plan.p.value_heads + hv) * KV);
}

/// Pool slot of sequence n (ssm_state_indices[n]; validate() checked it is < P), or n without
/// a pool. Negative: a padded sequence.
int64_t state_slot(const ForwardArgs& a, int64_t n) {
  const TensorView& idx = a.ssm_state_indices;
  if (!idx.defined()) return n;
  return idx.dtype == DType::I32 ? int64_t(static_cast<const int32_t*>(idx.data)[n])
                                 : static_cast<const int64_t*>(idx.data)[n];
}

/// Token boundaries of every sequence (values already checked by validate()).
std::vector<int64_t> sequence_starts(const ForwardArgs& args, const ProblemShape& p) {
  std::vector<int64_t> starts(size_t(p.num_seqs) + 1);
  for (int64_t n = 0; n <= p.num_seqs; ++n) starts[size_t(n)] = detail::host_seq_start(args, p, n);
  return starts;
}

/// Runs the recurrence for sequence n, value head hv, into the plan's private buffers.
void run_head(const Plan& plan, int64_t n, int64_t hv) {
  const ForwardArgs& a = *plan.args;
  const ProblemShape& p = plan.p;
  const int64_t HV = p.value_heads, K = p.head_dim_k, V = p.head_dim_v;
  const int64_t h = hv / plan.group;

  // A padded pool entry: no state read or written, its out rows stay zero.
  const int64_t slot = state_slot(a, n);
  if (slot < 0) return;

  // S is K x V, row i = key channel i (the spec's S, not the v-first S^T).
  std::vector<double> S(static_cast<size_t>(K * V), 0.0);
  if (a.initial_state.defined()) {
    const int64_t base = (slot * HV + hv) * K * V;
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < V; ++j) {
        const int64_t src = state_offset(a.state_layout, i, j, K, V);
        S[size_t(i * V + j)] = load_element(a.initial_state, base + src);
      }
  }

  reference_detail::TokenInputs in(K, V);
  const reference_detail::StepFlags flags = reference_detail::step_flags(a, p.scale);
  const double rate = plan.decay_rate[size_t(hv)];
  const double* bias = &plan.dt_bias[size_t(hv * K)];

  const int64_t seq_first = plan.seq_start[size_t(n)];
  keep_inter(plan, inter_row(plan, n, 0), hv, S);
  for (int64_t tok = seq_first; tok < plan.seq_start[size_t(n + 1)]; ++tok) {
    reference_detail::load_token(in, a, p, tok, h, hv);
    const int64_t out_base = (tok * HV + hv) * V;  // the private [T_total, HV, V] buffer
    reference_detail::token_step(S, in, flags, rate, bias, &(*plan.out)[size_t(out_base)]);
    keep_inter(plan, inter_row(plan, n, tok - seq_first + 1), hv, S);
  }

  if (plan.final_state)
    std::copy(S.begin(), S.end(), plan.final_state->begin() + (n * HV + hv) * K * V);
}

/// Runs every (sequence, value head) pair on up to `num_threads` threads. Pairs share no
/// state and write disjoint parts of the private buffers, so no locking is needed there.
void run_all(const Plan& plan, int num_threads) {
  reference_detail::for_each_pair(plan.p.num_seqs, plan.p.value_heads, num_threads,
                                  [&](int64_t n, int64_t hv) { run_head(plan, n, hv); });
}

}  // namespace

void reference_forward(const ForwardArgs& args, int num_threads) {
  if (num_threads < 0)
    throw Error("num_threads", "must be >= 0 (0 = one per hardware thread), got " + std::to_string(num_threads));
  const ProblemShape p = validate(args, Target::CpuReference);
  const int64_t HV = p.value_heads, K = p.head_dim_k, V = p.head_dim_v;

  Plan plan;
  plan.args = &args;
  plan.p = p;
  plan.group = p.heads > 0 ? HV / p.heads : 1;
  plan.seq_start = sequence_starts(args, p);
  plan.decay_rate.assign(size_t(HV), 1.0);
  plan.dt_bias.assign(size_t(HV * K), 0.0);
  if (args.gate != GateMode::PreGated) {
    if (args.A_log.defined())
      for (int64_t hv = 0; hv < HV; ++hv) plan.decay_rate[size_t(hv)] = std::exp(load_element(args.A_log, hv));
    if (args.dt_bias.defined())  // [HV, K] and flat [HV * K] share one linear index
      for (int64_t i = 0; i < HV * K; ++i) plan.dt_bias[size_t(i)] = load_element(args.dt_bias, i);
  }

  // Results go to private buffers first so that out and final_state are written only after
  // everything succeeded, and so that final_state may alias initial_state.
  std::vector<double> out(size_t(p.batch * p.seqlen * HV * V), 0.0);  // padded pool entries' rows stay 0
  std::vector<double> final_state;
  plan.out = &out;
  if (args.final_state.defined()) {
    final_state.resize(size_t(p.num_seqs * HV * K * V));
    plan.final_state = &final_state;
  }
  std::vector<double> inter;
  if (args.intermediate_states.defined()) {
    // Which row takes which sequence's state, in sequence order (a later range wins a shared row).
    const TensorView& off = args.intermediate_offsets;
    const int64_t rows = args.intermediate_states.shape[0], every = args.intermediate_every;
    const int64_t shift = args.intermediate_include_initial ? 0 : 1;
    plan.inter_writer.assign(size_t(rows), -1);
    plan.inter_row_first.resize(size_t(p.num_seqs));
    for (int64_t n = 0; n < p.num_seqs; ++n) {
      const int64_t begin = index_at(off, n), count = index_at(off, n + 1) - begin;
      const int64_t len = plan.seq_start[size_t(n + 1)] - plan.seq_start[size_t(n)];
      plan.inter_row_first[size_t(n)] = begin;
      if (state_slot(args, n) < 0) continue;  // padded: no state at all
      for (int64_t j = 0; j < count && (j + shift) * every <= len; ++j) plan.inter_writer[size_t(begin + j)] = n;
    }
    inter.resize(size_t(rows * HV * K * V));
    plan.inter = &inter;
  }
  run_all(plan, num_threads);

  for (int64_t tok = 0; tok < p.batch * p.seqlen; ++tok)
    for (int64_t hv = 0; hv < HV; ++hv) {
      const int64_t dst = row_offset(args.out, p, tok, hv);
      for (int64_t j = 0; j < V; ++j) store_element(args.out, dst + j, out[size_t((tok * HV + hv) * V + j)]);
    }
  if (args.final_state.defined()) {
    // In sequence order: with a pool, a slot two sequences share keeps the later one's state.
    for (int64_t n = 0; n < p.num_seqs; ++n) {
      const int64_t slot = state_slot(args, n);
      if (slot < 0) continue;  // padded: its slot is not written
      for (int64_t hv = 0; hv < HV; ++hv) {
        const double* S = &final_state[size_t((n * HV + hv) * K * V)];
        const int64_t base = (slot * HV + hv) * K * V;
        for (int64_t i = 0; i < K; ++i)
          for (int64_t j = 0; j < V; ++j) {
            const int64_t dst = state_offset(args.state_layout, i, j, K, V);
            store_element(args.final_state, base + dst, S[i * V + j]);
          }
      }
    }
  }
  for (int64_t row = 0; row < int64_t(plan.inter_writer.size()); ++row) {
    if (plan.inter_writer[size_t(row)] < 0) continue;  // rows no sequence reaches stay untouched
    for (int64_t hv = 0; hv < HV; ++hv) {
      const double* S = &inter[size_t((row * HV + hv) * K * V)];
      const int64_t base = (row * HV + hv) * K * V;
      for (int64_t i = 0; i < K; ++i)
        for (int64_t j = 0; j < V; ++j) {
          const int64_t dst = state_offset(args.state_layout, i, j, K, V);
          store_element(args.intermediate_states, base + dst, S[i * V + j]);
        }
    }
  }
}

}  // namespace flash_kda
