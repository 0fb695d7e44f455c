"""The torch.library op of the decode, flash_kda::fused_recurrent_kda_fwd, so that
torch.compile(fullgraph=True) traces flash_kda.fused_recurrent_kda_fwd without a graph break.

Imported by flash_kda/__init__.py only when torch imports. The op returns nothing: it writes
`out` and the final state in place (custom ops may not return an alias of an input, and with
a pool the final state is the pool itself), and its fake implementation does nothing, since
every output exists before the call. fused_recurrent_kda_fwd routes through it while
torch.compiler.is_compiling(); eager calls go straight to _core (a torch.ops call adds
dispatcher time to a step of a few microseconds).
"""

from typing import Optional

import torch

from . import _decode

OP_NAME = "flash_kda::fused_recurrent_kda_fwd"


@torch.library.custom_op(OP_NAME, mutates_args=("out", "initial_state", "final_state"))
def fused_recurrent_kda_fwd_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    out: torch.Tensor,
    A_log: Optional[torch.Tensor],
    dt_bias: Optional[torch.Tensor],
    cu_seqlens: Optional[torch.Tensor],
    initial_state: Optional[torch.Tensor],
    final_state: Optional[torch.Tensor],
    ssm_state_indices: Optional[torch.Tensor],
    num_accepted_tokens: Optional[torch.Tensor],
    gate: int,
    state_v_first: bool,
    use_qk_l2norm: bool,
    use_beta_sigmoid: bool,
    allow_neg_eigval: bool,
    scale: Optional[float],
    lower_bound: float,
    inplace: bool,
) -> None:
    """One decode call (C++ flash_kda::decode) writing out and the final state; with
    inplace, final_state must be None and the states are written into initial_state (the
    pool). gate is a flash_kda._core.decode_gates value; the other settings as
    flash_kda.fused_recurrent_kda_fwd's."""
    if inplace:
        final_state = initial_state
    settings = (gate, state_v_first, use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval, scale, lower_bound)
    _decode.run_decode(q, k, v, g, beta, out, A_log, dt_bias, cu_seqlens, initial_state, final_state,
                       ssm_state_indices, num_accepted_tokens, settings, torch)


@fused_recurrent_kda_fwd_op.register_fake
def _fake(q, k, v, g, beta, out, A_log, dt_bias, cu_seqlens, initial_state, final_state, ssm_state_indices,
          num_accepted_tokens, gate, state_v_first, use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval, scale,
          lower_bound, inplace) -> None:
    return None


def traced_fused_recurrent_kda_fwd(q, k, v, g, beta, A_log, dt_bias, initial_state, scale, output_final_state,
                                   inplace_final_state, state_v_first, cu_seqlens, ssm_state_indices,
                                   num_accepted_tokens, use_qk_l2norm_in_kernel, use_gate_in_kernel,
                                   use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, out):
    """fused_recurrent_kda_fwd as torch.compile traces it: the same outputs allocated with
    torch ops, then the op. Returns (out, final_state) like the eager function."""
    settings = _decode._settings(use_gate_in_kernel, lower_bound, state_v_first, use_qk_l2norm_in_kernel,
                                 use_beta_sigmoid_in_kernel, allow_neg_eigval, scale)
    if settings[0] == _decode._GATES["none"]:
        A_log = dt_bias = None
    final_state = _decode._final_state(q, v, initial_state, output_final_state, inplace_final_state,
                                       state_v_first, cu_seqlens, ssm_state_indices, torch)
    inplace = bool(inplace_final_state)
    if not inplace and final_state is not None and initial_state is not None \
            and final_state.dtype != initial_state.dtype:
        initial_state = initial_state.float()
    if out is None:
        out = _decode._new_out(v, cu_seqlens, torch)
    fused_recurrent_kda_fwd_op(q, k, v, g, beta, out, A_log, dt_bias, cu_seqlens, initial_state,
                               None if inplace else final_state, ssm_state_indices, num_accepted_tokens,
                               *settings, inplace)
    return out, final_state


_decode._traced = traced_fused_recurrent_kda_fwd
