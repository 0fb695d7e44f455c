// The KDA forward: one call description, its validation, the GPU entry point and the CPU
// reference. The function computed is defined in docs/kda-spec.md (Kimi Linear, arXiv
// 2510.26692; fla.ops.kda.naive_recurrent_kda / chunk_kda).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>

#include "flash_kda/error.h"
#include "flash_kda/tensor.h"

struct CUstream_st;

namespace flash_kda {

/// A CUDA stream (identical to cudaStream_t); nullptr is the legacy default stream.
using Stream = CUstream_st*;

/// How the per-token, per-channel log decay a_t (natural log, <= 0) is made from g.
enum class GateMode : int {
  /// a = lower_bound * sigmoid(exp(A_log) * (g + dt_bias)); without A_log,
  /// a = lower_bound * sigmoid(g + dt_bias). FlashKDA's only mode ("safe gate").
  SafeSigmoid,
  /// a = -exp(A_log) * softplus(g + dt_bias) (fla's default KDA gate; unbounded below).
  Softplus,
  /// a = g: the caller already computed the log decay.
  PreGated,
};

/// Memory layout of initial_state / final_state.
enum class StateLayout : int {
  VFirst,  ///< [N, HV, V, K] (stores S^T; FlashKDA and chunk_kda(state_v_first=True))
  KFirst,  ///< [N, HV, K, V] (stores S)
};

/// One KDA forward call. Shapes (B batch, T tokens, H q/k heads, HV = G*H value heads,
/// K key dim, V value dim, N sequences):
///
/// | field          | dtype            | fixed length     | varlen (cu_seqlens)     |
/// |----------------|------------------|------------------|-------------------------|
/// | q, k           | bf16 or fp32     | [B, T, H, K]     | [1, T_total, H, K]      |
/// | v              | bf16 or fp32     | [B, T, HV, V]    | [1, T_total, HV, V]     |
/// | g              | bf16 or fp32     | [B, T, HV, K]    | [1, T_total, HV, K]     |
/// | beta           | bf16 or fp32     | [B, T, HV]       | [1, T_total, HV]        |
/// | out            | bf16 (GPU); bf16, fp32 or fp64 (reference) | like v        |
/// | A_log          | fp32             | [HV]             |                         |
/// | dt_bias        | fp32             | [HV, K] or [HV*K]|                         |
/// | cu_seqlens     | int64 or int32   | absent           | [N+1], 0 = cu[0] <= ... <= cu[N] = T_total |
/// | cu_seqlens_cpu | int64 or int32   | absent           | host copy of cu_seqlens (optional) |
/// | initial_state  | bf16 or fp32 (reference: also fp64) | [B, HV, V, K] (VFirst) or [B, HV, K, V] | [N, ...] |
/// | final_state    | bf16 or fp32 (reference: also fp64), independently of initial_state's dtype |
/// | ssm_state_indices | int32 or int64 [N] (optional): the states are pools [P, HV, ...] (below) |
///
/// Value head hv reads q/k head hv / (HV / H) (GVA). All tensors on one device. Inputs are never
/// modified; out and final_state are written in full (pool slots: below).
///
/// Strides: q, k, v, g, beta and out may have any batch, token and head strides (>= 0), with
/// unit stride in the last dimension: views of a fused projection (qkv.view(B, T, 3, H, K)[:, :,
/// 0]) or of a longer buffer (buf[:, :T]) are read and written in place. On Sm90 their rows must
/// be 16-byte aligned (data pointer and the token, head and batch strides in bytes multiples of
/// 16), except beta's, which needs element alignment only. Every other tensor is contiguous
/// (initial_state, final_state, A_log, dt_bias, cu_seqlens, cu_seqlens_cpu, ssm_state_indices).
///
/// States: initial_state and final_state take their dtypes independently (bf16 in and fp32 out,
/// as fla's FlashKDA backend passes them, or the reverse); final_state may be exactly
/// initial_state (an in-place update, same dtype then). The math is fp32 on Sm90 (fp64 in the
/// reference) whatever the state dtypes; each store rounds once to final_state's dtype.
///
/// The state pool, with ssm_state_indices (prefill into the pool the decode reads; the meaning
/// of decode()'s [N] indices, include/flash_kda/decode.h):
/// - initial_state and final_state (either or both; at least one) are pools [P, HV, V, K]
///   (VFirst) or [P, HV, K, V] of P >= 1 slots, both of the same P when both are given;
///   final_state may be exactly initial_state (the pool updated in place);
/// - sequence n starts from initial_state[idx[n]] (zero without initial_state) and writes its
///   final state to final_state[idx[n]]; other slots are never read or written;
/// - idx[n] < 0 marks a padded sequence: no slot is read or written for it and its rows of out
///   are written as zeros (serving stacks pad batches with -1);
/// - on Sm90, idx[n] >= P is treated like a negative index (skipped: the values are on the GPU,
///   validate() cannot read them, and no access may leave the pool); the reference raises
///   flash_kda::Error for it;
/// - two sequences with the same slot (idx[n] == idx[m] >= 0, n != m) race on Sm90: that slot's
///   final contents (and, in place, the start state the other reads) are unspecified. The
///   reference reads every start state before it writes any and writes in sequence order (the
///   last sequence wins). Distinct slots are what serving stacks pass.
///
/// Intermediate states (prefix caching; docs/kda-spec.md "Intermediate states"), with
/// intermediate_states, intermediate_offsets and intermediate_every = e (a positive multiple of
/// 16 tokens):
/// - sequence n's states are rows offsets[n] .. offsets[n + 1] - 1 of intermediate_states
///   ([S, HV, V, K] VFirst or [S, HV, K, V] KFirst, in the state_layout of the call, bf16 or fp32
///   (reference: also fp64), independent of the other states' dtypes);
/// - its row offsets[n] + j holds the state after j*e tokens (intermediate_include_initial: j = 0
///   is the start state) or after (j+1)*e tokens (not include_initial), for every such j with
///   that many tokens in the sequence and j < offsets[n + 1] - offsets[n]; other rows are never
///   written. fla's chunk_kda(return_intermediate_states=True) is e = 64 with include_initial
///   and offsets[n] = sum over m < n of ceil(len_m / 64) (fla's chunk_offsets; fixed length:
///   n * ceil(T / 64)): its h[:, i] is the state before the i-th 64-token chunk;
/// - each state is the fp32 (reference: fp64) state of the recurrence rounded once to
///   intermediate_states' dtype;
/// - a padded pool entry (ssm_state_indices[n] < 0) writes no intermediate state;
/// - offsets' values on the GPU are not checked (that would need a sync): on Sm90 they are
///   clamped to [0, S] (and a range to non-negative length), so no access leaves the tensor
///   (bad values give unspecified rows); the reference checks them: 0 <= offsets[0] <= ... <=
///   offsets[N] <= S. Two sequences whose ranges overlap race on Sm90 (the reference writes in
///   sequence order: the last wins).
struct ForwardArgs {
  TensorView q, k, v, g, beta;
  TensorView out;
  TensorView A_log;          ///< optional for SafeSigmoid and Softplus; unused for PreGated
  TensorView dt_bias;        ///< optional; unused for PreGated
  TensorView cu_seqlens;     ///< optional: varlen batch when given (then B must be 1)
  TensorView initial_state;  ///< optional: zero state when absent
  TensorView final_state;    ///< optional: not written when absent
  /// Optional host copy of cu_seqlens's values (int64 or int32 [N + 1], like cu_seqlens),
  /// e.g. the one fla keeps as cu_seqlens_cpu. When given, validate() checks its values
  /// (cu[0] == 0, non-decreasing, cu[N] == T_total) on every target at no cost to the GPU;
  /// the call then trusts that it equals cu_seqlens. Never read by the kernels.
  TensorView cu_seqlens_cpu;
  /// Optional int32 or int64 [N], on the call's device: pool slot of each sequence's state
  /// (negative: padded, skipped); initial_state / final_state are then pools [P, HV, ...].
  /// Semantics in the comment above.
  TensorView ssm_state_indices;
  /// Optional output [S, HV, V, K] (VFirst) or [S, HV, K, V] (KFirst), bf16 or fp32, contiguous:
  /// the states inside each sequence every intermediate_every tokens (the comment above).
  TensorView intermediate_states;
  /// int32 or int64 [N + 1], on the call's device; required with intermediate_states (and only
  /// with it): sequence n's rows of intermediate_states are offsets[n] .. offsets[n + 1] - 1.
  TensorView intermediate_offsets;

  GateMode gate = GateMode::SafeSigmoid;
  StateLayout state_layout = StateLayout::VFirst;
  bool use_qk_l2norm = true;     ///< L2-normalise q and k over K (fp32, eps 1e-6 inside sqrt)
  bool use_beta_sigmoid = true;  ///< b = sigmoid(beta); else b = beta
  bool allow_neg_eigval = false; ///< b = 2 * sigmoid(beta) (needs use_beta_sigmoid)
  std::optional<double> scale;   ///< output scale; default K^-0.5
  double lower_bound = -5.0;     ///< safe-gate floor, natural-log units, in [-5, 0)
  /// Tokens between intermediate states: a positive multiple of 16 when intermediate_states is
  /// given (on Sm90 also < 2^35); unused otherwise.
  int64_t intermediate_every = 0;
  /// Intermediate state j is the state after j * intermediate_every tokens (true: j = 0 is the
  /// start state, fla's form) or after (j + 1) * intermediate_every tokens (false).
  bool intermediate_include_initial = true;
};

/// Sizes derived from a validated call.
struct ProblemShape {
  int64_t batch = 0;        ///< B (1 for varlen)
  int64_t seqlen = 0;       ///< T (T_total for varlen)
  int64_t num_seqs = 0;     ///< N: B, or len(cu_seqlens) - 1
  int64_t heads = 0;        ///< H (q/k heads)
  int64_t value_heads = 0;  ///< HV
  int64_t head_dim_k = 0;   ///< K
  int64_t head_dim_v = 0;   ///< V
  bool varlen = false;
  double scale = 0.0;       ///< the scale actually applied
};

/// Where a call will run; decides which dtypes, devices and sizes are acceptable.
enum class Target : int {
  CpuReference,  ///< reference_forward: host tensors, any K and V, every gate mode and flag
  Sm90,          ///< forward(): CUDA tensors on an sm_90 device, the kernel's supported subset
};

/// Checks every argument of `args` for `target` and returns the derived sizes.
/// Throws flash_kda::Error naming the first bad argument and what was expected. Reads no
/// tensor data except host index tensors: cu_seqlens on the host (the reference) and the host
/// copy cu_seqlens_cpu (any target), whose values are checked; values of a cu_seqlens on the
/// GPU are not. The per-tensor rules come from the call table (flash_kda/call_table.h).
ProblemShape validate(const ForwardArgs& args, Target target);

/// Launch choices a caller may fix instead of leaving them to the launch plan. Every field 0
/// (the default) means "the plan decides"; none changes the function computed, only how it is
/// spread over the GPU. Out-of-range values raise flash_kda::Error naming the field
/// ("launch_options.num_sms", "launch_options.window_slots", "launch_options.segments",
/// "launch_options.recurrence_warps") before any kernel runs.
struct LaunchOptions {
  /// SMs the kernels may occupy, for a device partitioned by a CUDA green context or an MPS
  /// limit (the plan then sizes its grids and waves for that many); 0: the SMs of the context the
  /// stream belongs to (a green context's SM resource where the driver reports it, else the
  /// device's count). Must not exceed that count; a value above 132 (the most of any sm_90
  /// part) is planned as 132.
  int num_sms = 0;
  /// Tuning and test knobs: windows of this many 16-token chunk slots (> 0), S segments per
  /// sequence (>= 1; 1 turns the segment-parallel path off), window-pass blocks of 4 or 8 warps
  /// (the segment passes always take 8). All >= 0; recurrence_warps 0, 4 or 8.
  int64_t window_slots = 0;
  int segments = 0;
  int recurrence_warps = 0;
};

/// Everything forward() checks before it touches the device, without launching anything:
/// validate(args, Target::Sm90), the launch options' ranges, and that this build has the
/// kernels. Returns the derived sizes; throws the flash_kda::Error forward() would throw for
/// the same call (in the same order). What only the device can tell is left to forward(): an
/// sm_90 device behind the stream, options.num_sms against its SM count. Cheap (no plan, no
/// allocation, no CUDA call), so a dispatcher can ask it before every call; fla's backend
/// verifier does (python/flash_kda/_fla_chunk.py).
ProblemShape validate_forward(const ForwardArgs& args, const LaunchOptions& options = {});

/// Bytes of device workspace forward() needs for `args` (a multiple of 256; may be 0). It depends
/// on the shapes alone, not on the device or options.num_sms (it covers the plan of every sm_90
/// part and partition); forced window_slots, segments or recurrence_warps may change it. Throws flash_kda::Error like
/// validate(args, Target::Sm90).
size_t forward_workspace_size(const ForwardArgs& args, const LaunchOptions& options = {});

/// Returns device memory of at least `bytes` bytes (> 0), 256-byte aligned, on the call's device,
/// that stays valid until the work enqueued on the call's stream completes (a stream-ordered
/// allocator such as PyTorch's caching allocator qualifies). Called at most once per forward(),
/// after validation and planning, and not at all when no workspace is needed.
using WorkspaceAllocator = std::function<void*(size_t bytes)>;

/// KDA forward on an sm_90 GPU, asynchronously on `stream`.
///
/// Validates first (throws flash_kda::Error and writes nothing on bad input), then enqueues
/// kernels only (and, for long inputs processed in windows, one memset of the workspace's window
/// counts): no host synchronisation, no allocation (all scratch lives in `workspace`,
/// at least forward_workspace_size(args, options) bytes, 256-byte aligned, on the tensors' device),
/// so the call can be captured in a CUDA graph. Results are bitwise deterministic.
/// Supported subset: K = V = 128; bf16 q, k, v, out; bf16 or fp32 g and beta; every gate mode
/// (SafeSigmoid with or without A_log and dt_bias; Softplus with A_log, dt_bias optional;
/// PreGated) and every flag (use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval); VFirst or
/// KFirst states, bf16 or fp32 each; the state pool (ssm_state_indices); intermediate states
/// (intermediate_offsets values unchecked, clamped as above). Every data pointer 16-byte
/// aligned (beta's and ssm_state_indices': element aligned), strided activations as above.
/// T = 0 is valid. The softplus and pre-gated decays are unbounded: any a <= 0 (down to
/// -1e4 nats a token and below) gives finite results (src/sm90/forward/prepare.cu, "Unbounded
/// gates"); a pre-gated g > 0 (a growing state) is outside the contract. final_state may be
/// exactly initial_state (in-place update). ssm_state_indices values on the GPU are not
/// checked: an entry >= P is skipped like a negative one. The launch runs on q's device
/// (made current for the call, then restored). cu_seqlens values on the GPU are not checked
/// (that would need a sync): they must satisfy the table above (docs/errors.md). Bad values are
/// clamped to [0, T_total] on the device: results are then unspecified (for the bad sequences
/// and any rows their clamped ranges overlap), but nothing outside the tensors and the
/// workspace is read or written.
/// Throws flash_kda::CudaError if a launch fails.
void forward(const ForwardArgs& args, void* workspace, size_t workspace_bytes, Stream stream,
             const LaunchOptions& options = {});

/// forward() with the workspace obtained from `allocate` (validation and the launch plan run
/// once, before the allocation): what the Python binding uses with PyTorch's allocator.
void forward(const ForwardArgs& args, const WorkspaceAllocator& allocate, Stream stream,
             const LaunchOptions& options = {});

/// The exact CPU reference: evaluates the recurrence of docs/kda-spec.md token by token in
/// fp64 (inputs read as given, bf16 widened exactly), using up to `num_threads` threads over
/// (sequence, value head) pairs (0 = hardware concurrency). Host tensors only; every gate
/// mode, flag, GVA, varlen (zero-length sequences pass their state through), any K and V,
/// both state layouts, strided activations, the state pool, intermediate states. cu_seqlens,
/// ssm_state_indices and intermediate_offsets values are checked here (Error on a bad one: an
/// index >= P, offsets decreasing or outside [0, S]).
void reference_forward(const ForwardArgs& args, int num_threads = 0);

}  // namespace flash_kda
