// The KDA decode step: the recurrence of docs/kda-spec.md run token by token for a few tokens
// per sequence (T = 1 decode, T = 2..16 speculative verification), with each sequence's state
// in a shared pool. Semantics: docs/kda-spec.md "Decode and speculative verification" (fla-core
// 0.6.0 fla/ops/kda/fused_recurrent.py, fused_recurrent_kda_fwd).
#pragma once

#include <optional>

#include "flash_kda/error.h"
#include "flash_kda/forward.h"
#include "flash_kda/tensor.h"

namespace flash_kda {

/// One decode call. Shapes (B batch, T tokens per sequence (1..16 on the GPU), H q/k heads,
/// HV = G*H value heads, K = V = 128 on the GPU, N sequences, P pool slots):
///
/// | field               | dtype         | fixed length   | varlen (cu_seqlens)  |
/// |---------------------|---------------|----------------|----------------------|
/// | q, k                | bf16 or fp32  | [B, T, H, K]   | [1, T_total, H, K]   |
/// | v                   | bf16 or fp32  | [B, T, HV, V]  | [1, T_total, HV, V]  |
/// | g                   | bf16 or fp32  | [B, T, HV, K]  | [1, T_total, HV, K]  |
/// | beta                | bf16 or fp32  | [B, T, HV]     | [1, T_total, HV]     |
/// | out                 | bf16 or fp32 (reference: also fp64) | like v | like v    |
/// | A_log               | fp32          | [HV]           |                      |
/// | dt_bias             | fp32          | [HV, K] or [HV*K] |                   |
/// | cu_seqlens          | int32 / int64 | absent         | [N+1]                |
/// | initial_state       | bf16 or fp32 (reference: also fp64) | with ssm_state_indices: the pool [P, HV, V, K] (VFirst) or [P, HV, K, V]; else [N, HV, ...] |
/// | final_state         | like initial_state | with ssm_state_indices: must be initial_state itself (in place); else [N, HV, ...] or absent |
/// | ssm_state_indices   | int32 / int64 | [N] or [N, T] (fixed length only for [N, T]) |   |
/// | num_accepted_tokens | int32 / int64 | [N], needs ssm_state_indices of shape [N, T] |   |
///
/// Strides: q, k, v, g, beta and out may have any token and head strides (views of a fused
/// projection), with unit stride in the last dimension and 16-byte aligned rows; the state pool
/// may have any stride between slots (its [HV, V, K] / [HV, K, V] part is contiguous).
///
/// The pool, with ssm_state_indices (fla's continuous batching):
/// - sequence n starts from pool[idx[n, num_accepted_tokens[n] - 1]] when num_accepted_tokens is
///   given, else from pool[idx[n, 0]] ([N] indices: pool[idx[n]]);
/// - the state after token t is written to pool[idx[n, t]] ([N] indices: the state after the
///   last token to pool[idx[n]]); with [N, T] indices a negative idx[n, t] of a later token only
///   drops that token's state (the sequence runs from its valid start slot);
/// - a negative slot index skips sequence n: no slot is read or written for it and its rows
///   of out are written as zeros (serving stacks pad batches for CUDA graphs with -1).
/// Without ssm_state_indices: initial_state[n] (zero when absent) and final_state[n] (may be
/// initial_state itself); a varlen sequence of no tokens passes its state through.
/// The math is fp32 whatever the pool dtype (each write rounds to the pool's dtype).
struct DecodeArgs {
  TensorView q, k, v, g, beta;
  TensorView out;
  TensorView A_log;          ///< optional for SafeSigmoid (rate 1 without it); required for Softplus
  TensorView dt_bias;        ///< optional; unused for PreGated
  TensorView cu_seqlens;     ///< optional: varlen batch when given (then B must be 1)
  TensorView initial_state;  ///< optional without ssm_state_indices (zero state); the pool with it
  TensorView final_state;    ///< optional; with ssm_state_indices, exactly initial_state
  TensorView ssm_state_indices;
  TensorView num_accepted_tokens;

  GateMode gate = GateMode::SafeSigmoid;
  StateLayout state_layout = StateLayout::VFirst;
  bool use_qk_l2norm = true;
  bool use_beta_sigmoid = true;
  bool allow_neg_eigval = false;
  std::optional<double> scale;  ///< default K^-0.5
  double lower_bound = -5.0;    ///< SafeSigmoid only, natural-log units, in [-5, 0)
};

/// Which sm_90a decode kernel runs a call (DecodeLaunchOptions::kernel).
enum class DecodeKernel : int {
  Auto = 0,        ///< the launch plan's choice (src/sm90/decode/plan.h says which and why)
  Persistent = 1,  ///< a persistent grid whose blocks stage the next items' state slices in shared memory
  Direct = 2,      ///< one block per state slice, the slice loaded straight into registers
  /// The direct kernel with every k-first pool in its warp-column form (each warp owns value
  /// columns of all 128 keys), also for the pools that Direct runs in row blocks (a block's
  /// warps split the keys of whole 128-byte lines of its value columns); the same as Direct for
  /// v-first pools and for the other k-first ones. Kept for the A/B of the two forms.
  DirectColumns = 3,
  /// The direct kernel with every k-first pool in row blocks, also the bf16 pools with more than
  /// one token a sequence over few sequence-heads that Direct runs in warp columns (bf16 pools
  /// of more tokens in the row blocks' split form: half of each lane's fp32 state in shared
  /// memory); the same as Direct for v-first pools and for the other k-first ones. Kept for the
  /// A/B of the two forms.
  DirectRows = 4,
};

/// Launch choices a caller may fix instead of leaving them to the launch plan; none changes the
/// function computed (both kernels have the same semantics), only how it runs: the benchmark's
/// A/B (`--decode-kernel`) and the tests use it to run each kernel. A value outside the enum
/// raises flash_kda::Error naming "launch_options.kernel" before any kernel runs.
/// From Python: flash_kda.DecodeLaunchOptions(kernel="auto" | "persistent" | "direct" |
/// "direct_columns" | "direct_rows").
struct DecodeLaunchOptions {
  DecodeKernel kernel = DecodeKernel::Auto;
};

/// Checks `options` (the kernel value); throws flash_kda::Error naming the bad field.
void validate_decode_options(const DecodeLaunchOptions& options);

/// Checks every argument of `args` for `target` and returns the derived sizes (seqlen = T per
/// sequence for fixed length, T_total for varlen). Throws flash_kda::Error naming the first bad
/// argument. Reads no tensor data on the GPU (index values are the caller's contract: an index
/// >= P is clamped away on the device, see decode()).
ProblemShape validate_decode(const DecodeArgs& args, Target target);

/// The decode step on an sm_90 GPU, asynchronously on `stream`: validates first (nothing is
/// written on error), then one kernel launch; no host synchronisation, no allocation, no
/// workspace, so the call can be captured in a CUDA graph. A fixed-length batch of T = 0 with
/// [N, T] slots launches nothing (no token, no state read or written). Supported subset: K = V = 128,
/// T <= 16 tokens per sequence for a fixed-length batch (varlen sequences may be of any length;
/// cu_seqlens values on the GPU are not checked, bad ones are
/// clamped to [0, T_total] so that nothing outside the tensors is accessed). Slot indices >= P are treated
/// like negative ones (skipped) so that no access leaves the pool. `options` may force a kernel
/// or form (validated after the arguments). Throws flash_kda::CudaError if the launch fails.
void decode(const DecodeArgs& args, Stream stream, const DecodeLaunchOptions& options = {});

/// The exact CPU reference of decode(): fp64, host tensors, any K, V and T, every gate mode
/// and flag, both layouts, the pool semantics above (indices and cu_seqlens values checked:
/// Error on one out of range). Writes out and the states like decode().
/// num_threads (>= 0) is accepted for symmetry with reference_forward; the work runs on one thread.
void reference_decode(const DecodeArgs& args, int num_threads = 0);

}  // namespace flash_kda
