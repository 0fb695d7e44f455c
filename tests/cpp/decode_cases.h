// The decode cases of the C++ suite and the check of a decode's result against
// flash_kda::reference_decode on the same inputs (fp64, results kept in fp64): relative
// Frobenius error of out and of the whole pool (or final_state) within the bound of its dtype;
// padded slots' rows exactly zero, padding columns of strided rows, untouched pool slots and
// the memory past the pool (what an index >= P would reach) as they were.
// test_decode_gpu.cpp runs every case on the GPU with both kernels; tests/emu/test_decode_emu.cpp
// runs every case, both layouts, through the direct kernel on the CPU model of the GPU (planned
// for a 132-SM and an 8-SM part).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "decode_test_util.h"

namespace flash_kda::testing {

/// One decode problem of the suite and the kernel it asks for.
struct DecodeCase {
  std::string name;
  DecodeConfig config;
  DecodeKernel kernel = DecodeKernel::Auto;
  /// > 0: the warps per block the direct kernel's plan for a 132-SM H200 gives the case, for a
  /// case built to reach that form (the CPU-model test checks it, so that a change of the
  /// plan's rule cannot move the case off the form it is there for).
  int h200_warps = 0;
  /// Set: whether that plan takes wide tiles (bf16 pools), checked as h200_warps is.
  std::optional<bool> h200_wide;
};
inline void PrintTo(const DecodeCase& c, std::ostream* os) { *os << c.name; }

/// Whether DecodeKernel::DirectRows can run case c other than Direct does: a k-first bf16 pool
/// (or state) with more than one token a sequence, which DirectRows gives the row blocks' split
/// form and Direct the warp columns below 4 N HV = SMs (from there the split form too, where
/// DirectRows repeats Direct).
inline bool rows_split_case(const DecodeCase& c) {
  const KdaConfig& b = c.config.base;
  return b.state_layout == StateLayout::KFirst && b.state_dtype == DType::BF16 && !(b.seqlens.empty() && b.seqlen == 1);
}

/// Relative Frobenius error allowed for an output of dtype t.
inline double decode_bound(DType t) { return t == DType::BF16 ? 1e-2 : 1e-4; }

/// What the reference computes for a configuration: out in fp64, and the problem it ran on (the
/// pool or final_state in their own dtype).
struct DecodeWant {
  std::vector<double> out;
  DecodeProblem ref;
};

inline DecodeWant decode_want(const DecodeConfig& cfg) {
  DecodeWant w;
  w.ref = make_decode_problem(cfg);
  HostTensor ref_out(DType::F64, w.ref.act.out.shape());
  DecodeArgs ra = w.ref.reference_args();
  ra.out = ref_out.view();
  reference_decode(ra);
  w.out = ref_out.values();
  return w;
}

/// The problem a kernel runs on: the same inputs as decode_want's (same seed), out and
/// final_state filled with NaN so that an element left unwritten cannot pass.
inline DecodeProblem decode_target(const DecodeConfig& cfg) {
  DecodeProblem prob = make_decode_problem(cfg);
  prob.out.wide.fill(std::nan(""));
  if (prob.final_state.defined()) prob.final_state.fill(std::nan(""));
  return prob;
}

/// Checks `prob` (its out, pool or final_state back on the host) after a decode against `want`;
/// `pool_before` is the pool's values before the call (empty without a pool).
inline void check_decode(const DecodeConfig& cfg, const DecodeWant& want, DecodeProblem& prob,
                         const std::vector<double>& pool_before) {
  const bool pool = cfg.pool_slots > 0;
  const std::vector<double>& want_o = want.out;
  const std::vector<double> got_o = view_values(prob.out.wide, prob.out.view());
  for (size_t i = 0; i < got_o.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got_o[i])) << "out[" << i << "] unwritten or not finite";
    if (want_o[i] == 0.0) ASSERT_EQ(got_o[i], 0.0) << "out[" << i << "] of a padded slot";
  }
  const double out_err = rel_frobenius(got_o, want_o);
  EXPECT_LE(out_err, decode_bound(cfg.base.out_dtype)) << "out";
  // Padding columns of strided out rows stay untouched (NaN).
  for (int64_t i = 0; i < prob.out.wide.numel(); ++i)
    if (cfg.row_pad > 0 && i % (cfg.base.head_dim_v + cfg.row_pad) >= cfg.base.head_dim_v)
      ASSERT_TRUE(std::isnan(prob.out.wide.get(i))) << "out padding written at " << i;

  const double state_bound = decode_bound(cfg.base.state_dtype);
  if (pool) {
    std::vector<double> got = prob.pool.wide.values(), want_pool = want.ref.pool.wide.values();
    // Past the P slots (the memory an index >= P reaches): exactly as it was.
    const size_t in_pool = size_t(cfg.pool_slots * prob.slot_elems);
    for (size_t i = in_pool; i < got.size(); ++i)
      ASSERT_EQ(got[i], pool_before[i]) << "written past the pool's " << cfg.pool_slots << " slots, element " << i - in_pool;
    got.resize(in_pool);
    want_pool.resize(in_pool);
    std::vector<double> got_changed, want_changed;
    for (size_t i = 0; i < got.size(); ++i) {
      if (want_pool[i] == pool_before[i]) {
        // Untouched by the reference: untouched here (a written slot equal by chance is rare and
        // compared by value below anyway).
        if (got[i] != want_pool[i]) {
          got_changed.push_back(got[i]);
          want_changed.push_back(want_pool[i]);
        }
        continue;
      }
      got_changed.push_back(got[i]);
      want_changed.push_back(want_pool[i]);
    }
    for (double x : got) ASSERT_TRUE(std::isfinite(x)) << "pool has NaN/Inf";
    if (!want_changed.empty()) EXPECT_LE(rel_frobenius(got_changed, want_changed), state_bound) << "pool";
    EXPECT_LE(rel_frobenius(got, want_pool), state_bound) << "whole pool";
  } else if (prob.final_state.defined()) {
    const std::vector<double> got = prob.final_state.values(), want_fs = want.ref.final_state.values();
    for (double x : got) ASSERT_TRUE(std::isfinite(x)) << "final_state has NaN/Inf";
    EXPECT_LE(rel_frobenius(got, want_fs), state_bound) << "final_state";
  }
}

inline DecodeCase make_decode_case(std::string name, GateMode gate, StateLayout layout, int64_t T, bool per_token, DType pool_dtype,
                  DType io_dtype, int64_t N = 5, int64_t H = 2, int64_t HV = 4) {
  DecodeCase c{std::move(name), {}};
  DecodeConfig& d = c.config;
  d.base.batch = N;
  d.base.seqlen = T;
  d.base.heads = H;
  d.base.value_heads = HV;
  d.base.head_dim_k = d.base.head_dim_v = 128;
  d.base.gate = gate;
  d.base.state_layout = layout;
  d.base.state_dtype = pool_dtype;
  d.base.input_dtype = io_dtype;
  d.base.out_dtype = io_dtype;
  d.base.seed = uint64_t(T * 31 + N);
  d.per_token = per_token;
  d.row_pad = 8;    // q, k, v, g, out are views into wider rows
  d.slot_pad = 64;  // pool slots apart
  d.index_dtype = T % 2 ? DType::I32 : DType::I64;
  if (per_token) {
    d.pool_slots = N * T + 2;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t t = 0; t < T; ++t) d.slots.push_back(n == 1 ? -1 : 2 + (N - 1 - n) * T + t);
    if (T > 1) d.slots[size_t(2 * T + 1)] = -1;  // sequence 2 drops its second token's state
    for (int64_t n = 0; n < N; ++n) d.accepted.push_back(1 + (n * 7) % T);
    if (T > 1) d.accepted[2] = 1;
  } else {
    d.pool_slots = N + 3;
    for (int64_t n = 0; n < N; ++n) d.slots.push_back(n == 1 ? -1 : (n == 3 ? N + 2 : n));
  }
  return c;
}

/// A case with indices past the pool (DecodeConfig::kBeyondPool), safe gate, bf16 activations:
/// [N] indices with sequence 0's slot past it; [N, T] ones (T >= 2) with sequence 0's start slot
/// past it, and of sequences 3 and 4 the destination of a token other than the start one.
inline DecodeCase beyond_pool_case(std::string name, StateLayout layout, int64_t T, bool per_token, DType pool_dtype) {
  DecodeCase c = make_decode_case(std::move(name), GateMode::SafeSigmoid, layout, T, per_token, pool_dtype, DType::BF16);
  DecodeConfig& d = c.config;
  if (!per_token) {
    d.slots[0] = DecodeConfig::kBeyondPool;
    return c;
  }
  auto start = [&](int64_t n) { return d.accepted[size_t(n)] - 1; };
  d.slots[size_t(start(0))] = DecodeConfig::kBeyondPool;
  for (int64_t n : {3, 4}) d.slots[size_t(n * T + (start(n) + 1) % T)] = DecodeConfig::kBeyondPool;
  return c;
}

inline std::vector<DecodeCase> decode_cases() {
  std::vector<DecodeCase> cases;
  const GateMode gates[] = {GateMode::SafeSigmoid, GateMode::Softplus, GateMode::PreGated};
  const char* gate_names[] = {"safe", "softplus", "pregated"};
  for (int gi = 0; gi < 3; ++gi)
    for (StateLayout layout : {StateLayout::VFirst, StateLayout::KFirst})
      for (DType pool : {DType::F32, DType::BF16})
        for (int64_t T : {1, 2, 4, 16}) {
          const std::string name = std::string(gate_names[gi]) + (layout == StateLayout::VFirst ? "_vfirst" : "_kfirst") +
                                   (pool == DType::F32 ? "_fp32pool" : "_bf16pool") + "_T" + std::to_string(T);
          const DType io = T == 2 ? DType::F32 : DType::BF16;
          cases.push_back(make_decode_case(name + "_per_token", gates[gi], layout, T, true, pool, io));
          if (T <= 4) cases.push_back(make_decode_case(name + "_per_seq", gates[gi], layout, T, false, pool, io));
        }
  // Small and GVA-heavy shapes: 1 x 32 heads (2-warp blocks), 1 q/k head for 8 value heads.
  cases.push_back(make_decode_case("n1_hv32_T1", GateMode::SafeSigmoid, StateLayout::VFirst, 1, false, DType::F32, DType::BF16, 1, 32, 32));
  cases.push_back(make_decode_case("gva_h1_hv8_T2", GateMode::Softplus, StateLayout::KFirst, 2, true, DType::BF16, DType::BF16, 3, 1, 8));
  // Persistent grid: many more work items than resident blocks (odd N x 8 heads x 4 slices
  // over <= 528 blocks), so every block computes many items with the next ones in flight
  // (fp32 pools 1 behind, bf16 2), padded and out-of-range slots among them.
  cases.push_back(make_decode_case("persistent_vfirst_fp32pool_n131_T1", GateMode::SafeSigmoid, StateLayout::VFirst, 1, false,
                            DType::F32, DType::BF16, 131, 8, 8));
  cases.push_back(make_decode_case("persistent_vfirst_bf16pool_n131_T2_per_token", GateMode::Softplus, StateLayout::VFirst, 2,
                            true, DType::BF16, DType::BF16, 131, 4, 8));
  cases.push_back(make_decode_case("persistent_kfirst_bf16pool_n97_T4_per_token", GateMode::PreGated, StateLayout::KFirst, 4,
                            true, DType::BF16, DType::F32, 97, 8, 8));
  cases.push_back(make_decode_case("persistent_kfirst_fp32pool_n129_T3", GateMode::SafeSigmoid, StateLayout::KFirst, 3, false,
                            DType::F32, DType::BF16, 129, 8, 8));
  // Varlen over a persistent grid: 150 sequences of 0..9 tokens (long ones take a second and
  // third staging group, loaded directly), [N] indices with padded slots.
  DecodeCase vlp = make_decode_case("varlen_persistent_bf16pool", GateMode::SafeSigmoid, StateLayout::VFirst, 1, false, DType::BF16,
                          DType::BF16, 150, 8, 8);
  for (int64_t n = 0; n < 150; ++n) vlp.config.base.seqlens.push_back((n * 7) % 10);
  cases.push_back(vlp);
  // Varlen with [N] indices (a padded slot, a zero-length sequence, one longer than 16).
  DecodeCase vl = make_decode_case("varlen_per_seq", GateMode::SafeSigmoid, StateLayout::VFirst, 1, false, DType::F32, DType::BF16, 5);
  vl.config.base.seqlens = {3, 1, 0, 21, 2};
  cases.push_back(vl);
  // No pool: per-sequence states, varlen with a zero-length sequence (state passes through),
  // and a zero start state without final_state, beta given as values (use_beta_sigmoid off).
  DecodeCase np{"varlen_states_kfirst", {}};
  np.config.base.seqlens = {2, 0, 5, 16};
  np.config.base.heads = 2;
  np.config.base.value_heads = 4;
  np.config.base.head_dim_k = np.config.base.head_dim_v = 128;
  np.config.base.state_layout = StateLayout::KFirst;
  np.config.base.out_dtype = DType::BF16;
  cases.push_back(np);
  DecodeCase zs = np;
  zs.name = "fixed_zero_start_no_final_beta_raw";
  zs.config.base.seqlens.clear();
  zs.config.base.batch = 3;
  zs.config.base.seqlen = 4;
  zs.config.base.with_initial_state = false;
  zs.config.base.with_final_state = false;
  zs.config.base.beta_logits = false;
  zs.config.base.state_layout = StateLayout::VFirst;
  cases.push_back(zs);
  // The direct kernel's v-first splits on 132 SMs (plan.h): 1 x 8 heads, bf16 pool, T = 1 (8
  // rows a warp: 1-warp blocks, 16 a head) and 9 x 8 heads (4-warp blocks, 4 a head); fp32
  // pools at 1 x 8 heads T = 2 (1-warp blocks, 16 a head), 5 x 8 heads (2-warp blocks), 40 x 8
  // heads (4-warp blocks); k-first fp32 at N = 1 with T = 5. A bf16 pool's wide tiles (from
  // 132 heads): packed at 17 x 8 heads, T = 1, in each layout (split: the persistent_* bf16
  // cases, 131 and 97 x 8 heads at T = 2 and 4).
  for (StateLayout layout : {StateLayout::VFirst, StateLayout::KFirst})
    cases.push_back(make_decode_case(layout == StateLayout::VFirst ? "wide_n17_hv8_bf16pool_T1" : "wide_n17_hv8_kfirst_bf16pool_T1",
                                     GateMode::Softplus, layout, 1, false, DType::BF16, DType::BF16, 17, 4, 8));
  cases.push_back(make_decode_case("split_n1_hv8_bf16pool_T1", GateMode::Softplus, StateLayout::VFirst, 1, false, DType::BF16,
                            DType::BF16, 1, 8, 8));
  cases.push_back(make_decode_case("split_n9_hv8_bf16pool_T1", GateMode::SafeSigmoid, StateLayout::VFirst, 1, false,
                            DType::BF16, DType::BF16, 9, 8, 8));
  cases.push_back(make_decode_case("split_n1_hv8_fp32pool_T2", GateMode::SafeSigmoid, StateLayout::VFirst, 2, false,
                            DType::F32, DType::F32, 1, 4, 8));
  cases.push_back(make_decode_case("split_n5_hv8_fp32pool_T1", GateMode::SafeSigmoid, StateLayout::VFirst, 1, false, DType::F32,
                            DType::F32, 5, 8, 8));
  cases.push_back(make_decode_case("split_n40_hv8_fp32pool_T2", GateMode::PreGated, StateLayout::VFirst, 2, true, DType::F32,
                            DType::BF16, 40, 2, 8));
  cases.push_back(make_decode_case("split_n1_hv4_kfirst_fp32pool_T5", GateMode::SafeSigmoid, StateLayout::KFirst, 5, false,
                            DType::F32, DType::BF16, 1, 4, 4));

  // Indices past the pool (>= P): skipped like negative ones, as a start slot (zero rows of
  // out, no state read or written) and as a later token's destination (no store).
  cases.push_back(beyond_pool_case("beyond_pool_vfirst_fp32pool_T1_per_seq", StateLayout::VFirst, 1, false, DType::F32));
  cases.push_back(beyond_pool_case("beyond_pool_kfirst_bf16pool_T2_per_seq", StateLayout::KFirst, 2, false, DType::BF16));
  cases.push_back(beyond_pool_case("beyond_pool_vfirst_bf16pool_T2_per_token", StateLayout::VFirst, 2, true, DType::BF16));
  cases.push_back(beyond_pool_case("beyond_pool_kfirst_fp32pool_T3_per_token", StateLayout::KFirst, 3, true, DType::F32));

  // The call's flags away from their defaults, one at a time: no L2 norm of q and k (drawn
  // with |q|, |k| ~ 0.7 so that the state stays bounded and a normalisation shows), beta in
  // (0, 2), a scale other than K^-0.5, a safe-gate floor other than -5.
  DecodeCase nl = make_decode_case("flag_no_l2norm_vfirst_fp32pool_T2_per_token", GateMode::SafeSigmoid, StateLayout::VFirst, 2,
                                   true, DType::F32, DType::BF16, 3);
  nl.config.use_qk_l2norm = false;
  nl.config.base.qk_std = 0.06;
  cases.push_back(nl);
  DecodeCase ne = make_decode_case("flag_neg_eigval_kfirst_bf16pool_T2_per_seq", GateMode::Softplus, StateLayout::KFirst, 2,
                                   false, DType::BF16, DType::BF16, 3);
  ne.config.allow_neg_eigval = true;
  cases.push_back(ne);
  DecodeCase sc = make_decode_case("flag_scale_vfirst_bf16pool_T1_per_seq", GateMode::PreGated, StateLayout::VFirst, 1, false,
                                   DType::BF16, DType::F32, 3);
  sc.config.scale = 0.25;
  cases.push_back(sc);
  DecodeCase lb = make_decode_case("flag_lower_bound_kfirst_fp32pool_T3_per_token", GateMode::SafeSigmoid, StateLayout::KFirst,
                                   3, true, DType::F32, DType::BF16, 3);
  lb.config.lower_bound = -2.0;
  cases.push_back(lb);

  // Shapes and inputs the cases above leave out.
  // Three value heads to a q/k head.
  cases.push_back(make_decode_case("gva3_h2_hv6_vfirst_fp32pool_T2_per_token", GateMode::Softplus, StateLayout::VFirst, 2, true,
                                   DType::F32, DType::BF16, 3, 2, 6));
  // fp32 activations into the packed wide bf16 tiles (17 x 8 heads, T = 1), in each layout.
  for (StateLayout layout : {StateLayout::VFirst, StateLayout::KFirst}) {
    DecodeCase w = make_decode_case(layout == StateLayout::VFirst ? "wide_n17_hv8_bf16pool_f32io_T1"
                                                                  : "wide_n17_hv8_kfirst_bf16pool_f32io_T1",
                                    GateMode::SafeSigmoid, layout, 1, false, DType::BF16, DType::F32, 17, 4, 8);
    w.h200_wide = true;
    cases.push_back(w);
  }
  // fp32 activations, k-first fp32 pool, T = 1.
  cases.push_back(make_decode_case("kfirst_fp32pool_f32io_T1_per_seq", GateMode::Softplus, StateLayout::KFirst, 1, false,
                                   DType::F32, DType::F32, 3));
  // The safe gate without A_log (rate 1) and without dt_bias, in each layout.
  for (StateLayout layout : {StateLayout::VFirst, StateLayout::KFirst}) {
    const bool vf = layout == StateLayout::VFirst;
    DecodeCase na = make_decode_case(vf ? "no_A_log_no_dt_bias_vfirst_bf16pool_T1_per_seq" : "no_A_log_no_dt_bias_kfirst_fp32pool_T2_per_token",
                                     GateMode::SafeSigmoid, layout, vf ? 1 : 2, !vf, vf ? DType::BF16 : DType::F32, DType::BF16, 3);
    na.config.base.with_A_log = false;
    na.config.base.with_dt_bias = false;
    cases.push_back(na);
  }
  // Pool slots 16 mod 32 bytes apart (16-byte aligned, not 32), each pool dtype.
  DecodeCase s16 = make_decode_case("slot_stride_16mod32_vfirst_fp32pool_T1_per_seq", GateMode::SafeSigmoid, StateLayout::VFirst,
                                    1, false, DType::F32, DType::BF16, 3);
  s16.config.slot_pad = 4;  // 16 bytes of fp32
  cases.push_back(s16);
  DecodeCase b16 = make_decode_case("slot_stride_16mod32_kfirst_bf16pool_T2_per_token", GateMode::Softplus, StateLayout::KFirst,
                                    2, true, DType::BF16, DType::BF16, 3);
  b16.config.slot_pad = 8;  // 16 bytes of bf16
  cases.push_back(b16);
  // Varlen over a bf16 pool ([N] indices: a padded slot, a zero-length sequence, one longer
  // than 16).
  DecodeCase vb = make_decode_case("varlen_per_seq_kfirst_bf16pool", GateMode::Softplus, StateLayout::KFirst, 1, false, DType::BF16,
                                   DType::BF16, 5);
  vb.config.base.seqlens = {3, 1, 0, 21, 2};
  cases.push_back(vb);
  // k-first in 2-warp blocks (5 x 8 heads on 132 SMs).
  DecodeCase k2 = make_decode_case("two_warp_n5_hv8_kfirst_fp32pool_T2_per_token", GateMode::PreGated, StateLayout::KFirst, 2,
                                   true, DType::F32, DType::BF16, 5, 4, 8);
  k2.h200_warps = 2;
  cases.push_back(k2);

  // k-first row blocks (direct kernel, kfirst_rows.cu) in each form with what the cases above
  // give only v-first: no L2 norm (the norms are applied after the cross-warp sums), beta as
  // values with a scale of its own, three value heads to a q/k head, varlen over an fp32 pool,
  // no state at all (and a zero start into a bf16 final_state).
  DecodeCase kn = make_decode_case("flag_no_l2norm_kfirst_bf16pool_T3_per_token", GateMode::Softplus, StateLayout::KFirst, 3, true,
                                   DType::BF16, DType::BF16, 3);
  kn.config.use_qk_l2norm = false;
  kn.config.base.qk_std = 0.06;
  cases.push_back(kn);
  DecodeCase kn1 = make_decode_case("flag_no_l2norm_kfirst_fp32pool_T1_per_seq", GateMode::PreGated, StateLayout::KFirst, 1, false,
                                    DType::F32, DType::F32, 3);
  kn1.config.use_qk_l2norm = false;
  kn1.config.base.qk_std = 0.06;
  cases.push_back(kn1);
  DecodeCase kb = make_decode_case("flag_beta_raw_scale_kfirst_bf16pool_T1_per_seq", GateMode::SafeSigmoid, StateLayout::KFirst, 1,
                                   false, DType::BF16, DType::BF16, 3);
  kb.config.base.beta_logits = false;
  kb.config.scale = 0.25;
  cases.push_back(kb);
  cases.push_back(make_decode_case("gva3_h2_hv6_kfirst_bf16pool_T1_per_seq", GateMode::Softplus, StateLayout::KFirst, 1, false,
                                   DType::BF16, DType::BF16, 3, 2, 6));
  cases.push_back(make_decode_case("gva3_h2_hv6_kfirst_fp32pool_T3_per_token", GateMode::SafeSigmoid, StateLayout::KFirst, 3, true,
                                   DType::F32, DType::F32, 3, 2, 6));
  DecodeCase kv = make_decode_case("varlen_per_seq_kfirst_fp32pool", GateMode::PreGated, StateLayout::KFirst, 1, false, DType::F32,
                                   DType::F32, 5);
  kv.config.base.seqlens = {3, 1, 0, 21, 2};
  cases.push_back(kv);
  DecodeCase kz = zs;
  kz.name = "fixed_zero_start_no_final_beta_raw_kfirst";
  kz.config.base.state_layout = StateLayout::KFirst;
  cases.push_back(kz);
  // k-first bf16 pools of more than one token (the warp columns, and the row blocks' split form
  // under DirectRows) with what the cases above leave out: T = 3 with [N] slots and fp32
  // activations, T = 3 with [N, T] slots and the L2 norm; varlen bf16 states without a pool
  // (a zero-length sequence, one of 21 tokens).
  cases.push_back(make_decode_case("kfirst_bf16pool_f32io_T3_per_seq", GateMode::PreGated, StateLayout::KFirst, 3, false,
                                   DType::BF16, DType::F32, 5));
  cases.push_back(make_decode_case("kfirst_bf16pool_T3_per_token", GateMode::SafeSigmoid, StateLayout::KFirst, 3, true,
                                   DType::BF16, DType::BF16, 5));
  DecodeCase vsb = np;
  vsb.name = "varlen_states_kfirst_bf16state";
  vsb.config.base.seqlens = {2, 0, 21, 3};
  vsb.config.base.state_dtype = DType::BF16;
  vsb.config.base.gate = GateMode::Softplus;
  cases.push_back(vsb);
  DecodeCase kzb = kz;
  kzb.name = "fixed_zero_start_kfirst_bf16state_T1";
  kzb.config.base.seqlen = 1;
  kzb.config.base.with_final_state = true;
  kzb.config.base.state_dtype = DType::BF16;
  cases.push_back(kzb);
  return cases;
}

}  // namespace flash_kda::testing
