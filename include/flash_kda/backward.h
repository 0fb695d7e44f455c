// The KDA backward: the gradients of a scalar loss with respect to every input of a forward
// call (include/flash_kda/forward.h), given the gradients with respect to its outputs.
// Math: docs/kda-spec.md "Backward" and "Chunked form"; the chunk-level derivation is in
// src/sm90/backward/chunk_algebra.cuh.
#pragma once

#include <cstddef>

#include "flash_kda/forward.h"
#include "flash_kda/tensor.h"

namespace flash_kda {

/// One KDA backward call: the forward call it differentiates and the tensors of the
/// gradients. Shapes and letters as in forward.h (B batch, T tokens, H q/k heads, HV value
/// heads, K = V = 128 on Sm90, N sequences).
///
/// `forward` describes the forward call exactly as it was made, with these differences: its
/// outputs (out, final_state, intermediate_states, intermediate_offsets) and ssm_state_indices
/// must be absent (the backward recomputes what it needs from the inputs; the state pool is a
/// serving feature with no gradient). Every input keeps its forward meaning: q, k, v, g, beta,
/// A_log, dt_bias, cu_seqlens (and cu_seqlens_cpu), initial_state, the gate mode and flags,
/// scale, lower_bound and state_layout.
///
/// | field            | dtype         | shape                        | when                         |
/// |------------------|---------------|------------------------------|------------------------------|
/// | d_out            | bf16 or fp32  | like out [B, T, HV, V]       | required                     |
/// | d_final_state    | bf16 or fp32  | like final_state             | optional (absent: zero)      |
/// | dq, dk           | like q, k     | like q, k                    | required (written in full)   |
/// | dv               | like v        | like v                       | required                     |
/// | dg               | like g        | like g                       | required                     |
/// | dbeta            | like beta     | like beta                    | required                     |
/// | dA_log           | fp32          | [HV]                         | optional; only with A_log    |
/// | ddt_bias         | fp32          | like dt_bias                 | optional; only with dt_bias  |
/// | d_initial_state  | bf16 or fp32  | like initial_state           | optional; only with it       |
///
/// Dtype rule: every gradient of an input has that input's dtype (dq like q, ..., ddt_bias like
/// dt_bias, d_initial_state like initial_state); dA_log and ddt_bias are therefore fp32. On
/// the Sm90 target (backward()) d_out and d_final_state are bf16 or fp32; reference_backward
/// also takes fp64 for d_out, d_final_state and every gradient output. Every gradient tensor is
/// on q's device, element aligned; on the Sm90 target d_out, dq, dk, dv and dg also have
/// 16-byte aligned data and rows (the rule of the forward's activations), and HV is at most
/// 16383.
///
/// dq and dk are the gradients of the raw q and k (through the L2 norm when use_qk_l2norm),
/// summed over the HV / H value heads that share each q/k head (GVA); dg of the raw g (through
/// the gate activation; for PreGated dg = d a); dbeta of the raw beta (through the sigmoid when
/// use_beta_sigmoid); dA_log and ddt_bias summed over every token (and, for dA_log, channel) of
/// every sequence. Every output is written in full, also where its true value is zero (tokens
/// of no sequence, heads of empty sequences); d_initial_state of an empty sequence is
/// d_final_state's slice (zero without it). The gradient tensors are contiguous; d_out may be
/// strided like out. Nothing is written on a validation error; inputs are never modified.
struct BackwardArgs {
  ForwardArgs forward;
  TensorView d_out;
  TensorView d_final_state;
  TensorView dq, dk, dv, dg, dbeta;
  TensorView dA_log;
  TensorView ddt_bias;
  TensorView d_initial_state;
};

/// Checks every argument of `args` for the Sm90 backward and returns the forward's derived
/// sizes: validate(args.forward, Target::Sm90) first (with the forward's outputs absent), then
/// each gradient tensor against the input it belongs to. Throws flash_kda::Error naming the
/// first bad argument ("d_out", "dq", ...) and what was expected, before anything runs. Also
/// throws for a build without the CUDA kernels. Cheap: no CUDA call, no allocation.
ProblemShape validate_backward(const BackwardArgs& args);

/// Bytes of device workspace backward() needs for `args` (a multiple of 256). Depends on the
/// shapes alone. Throws like validate_backward. Dominated by two fp32 states per 16-token chunk
/// and value head (the recomputed chunk-start states and their gradients): about
/// 8 (N + T_total / 16) HV K V bytes, plus 36,416 (N + T_total / 16) HV bytes of chunk records
/// (src/sm90/backward/records.h), plus ~26 T_total HV K bytes of per-token fp32 scratch
/// (H = HV) and forward_workspace_size; the exact layout is src/sm90/backward/layout.h.
size_t backward_workspace_size(const BackwardArgs& args);

/// KDA backward on an sm_90 GPU, asynchronously on `stream`: recomputes the forward's chunk
/// states from the inputs (nothing is saved by the forward beyond its inputs), then the state
/// gradients chunk by chunk in reverse and every input gradient. Validates first (throws
/// flash_kda::Error and writes nothing on bad input); then enqueues kernels only: no host
/// synchronisation, no allocation (scratch in `workspace`, at least
/// backward_workspace_size(args) bytes, 256-byte aligned, on the tensors' device), so the call
/// can be captured in a CUDA graph. Results are bitwise deterministic (no floating-point
/// atomics; every sum in a fixed order). Supports what forward() supports except the state
/// pool and intermediate states. Throws flash_kda::CudaError if a launch fails.
void backward(const BackwardArgs& args, void* workspace, size_t workspace_bytes, Stream stream);

/// backward() with the workspace obtained from `allocate` (once, after validation).
void backward(const BackwardArgs& args, const WorkspaceAllocator& allocate, Stream stream);

/// The exact CPU reference of the backward: reverse-mode differentiation of the recurrence of
/// docs/kda-spec.md token by token in fp64 (inputs read as given, bf16 widened exactly; each
/// result rounded once to its tensor's dtype), using up to `num_threads` threads over
/// (sequence, value head) pairs (0 = hardware concurrency). Host tensors only; every gate mode,
/// flag, GVA, varlen (empty sequences pass d_final_state through), any K and V, both state
/// layouts; no state pool and no intermediate states (as backward()). Keeps every state of a
/// sequence (T K V fp64 values per pair in flight), so it is meant for test-sized problems.
/// Throws flash_kda::Error like validate_backward but for Target::CpuReference.
void reference_backward(const BackwardArgs& args, int num_threads = 0);

}  // namespace flash_kda
