// The parameter block every backward kernel reads (backward_params fills it once per call from
// the validated call and the workspace layout, layout.h). Per-token inputs are read in place
// through their RowLayouts (any batch, token and head strides); the gradients are contiguous.
// Token indices are on the flattened token axis of SeqIndex: sequence n of a fixed-length
// batch owns tokens n*T .. n*T + T - 1.
#pragma once

#include <cstdint>

#include "flash_kda/backward.h"
#include "flash_kda/forward.h"
#include "sm90/common/row_layout.h"
#include "sm90/common/seq_index.h"

namespace flash_kda::sm90::bwd {

struct BackwardParams {
  SeqIndex seqs;
  int64_t total_tokens;  // B * T
  int64_t rows;          // chunk rows R of the workspace (layout.h)
  int heads, value_heads, group;  // H, HV, HV / H
  float scale, lower_bound;
  GateMode gate;
  bool l2norm, beta_sigmoid;
  float beta_mul;  // 2 with allow_neg_eigval, else 1
  bool state_k_first;

  // The forward's inputs.
  const void *q, *k, *v, *g, *beta;  // q, k, v bf16; g, beta bf16 or fp32
  RowLayout q_rows, k_rows, v_rows, g_rows, beta_rows;
  bool g_is_f32, beta_is_f32;
  const float* A_log;    // [HV] or nullptr (rate 1)
  const float* dt_bias;  // [HV * K] or nullptr (zero bias)

  // The output gradients.
  const void* d_out;  // [B, T, HV, V] bf16 or fp32, strided
  RowLayout d_out_rows;
  bool d_out_is_f32;
  const void* d_final_state;  // [N, HV, ...] in the call's layout, or nullptr (zero)
  bool d_final_is_f32;

  // Workspace (layout.h).
  int64_t* offsets;
  const float* states;  // in the call's state layout
  float* dstates;       // k-first
  float *q_hat, *k_hat, *a, *b;
  float *dq_hat, *dk_hat, *da, *db;
  float *part_dt, *part_alog;
  float* records;  // [R, HV, kRecordFloats] (records.h), written by the record kernel
  // The chain's segments (layout.h chain_segments; seg_len 0: none) and their buffers.
  int64_t chain_seg_len, chain_max_segs;
  float* chain_maps;  // [N, S - 1, HV, 2, K x K]
  float* chain_ends;  // [N, S, HV, V x K]

  // The input gradients (contiguous; dtypes as their inputs').
  void *dq, *dk, *dv, *dg, *dbeta;  // dq, dk, dv bf16; dg like g; dbeta like beta
  float* dA_log;                    // [HV] or nullptr
  float* ddt_bias;                  // [HV * K] or nullptr
  void* d_initial_state;            // [N, HV, ...] in the call's layout, or nullptr
  bool d_initial_is_f32;
};

struct BackwardLayout;

/// The parameter block of the validated call `args` of shape `p` whose workspace (layout `l`)
/// starts at `ws` (params.cpp; host code, shared by the launch and the CPU model of the kernels
/// in tests/emu).
BackwardParams backward_params(const BackwardArgs& args, const ProblemShape& p, char* ws, const BackwardLayout& l);

}  // namespace flash_kda::sm90::bwd
