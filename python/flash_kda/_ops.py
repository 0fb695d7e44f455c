"""The torch.library ops of flash_kda's GPU calls, so that torch.compile(fullgraph=True) traces
flash_kda.fwd, flash_kda.chunk_kda and flash_kda.fused_recurrent_kda_fwd without a graph break:

- flash_kda::forward, the forward (C++ flash_kda::forward) with every gate, layout and flag:
  fwd routes through it, and chunk_kda after allocating its outputs with torch ops;
- flash_kda::fused_recurrent_kda_fwd, the decode.

Imported by flash_kda/__init__.py only when torch imports. The ops return nothing: they write
their outputs in place (custom ops may not return an alias of an input, and an in-place state
update is one), and their fake implementations do nothing, since every output exists before
the call. The Python functions route through an op while torch.compiler.is_compiling(); eager
calls go straight to _core (a torch.ops call adds dispatcher time to every call).
"""

from typing import Optional

import torch

from . import _chunk, _decode, _forward

OP_NAME = "flash_kda::fused_recurrent_kda_fwd"
FORWARD_OP_NAME = "flash_kda::forward"


@torch.library.custom_op(FORWARD_OP_NAME, mutates_args=("out", "final_state"))
def forward_op(
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
    cu_seqlens_cpu: Optional[torch.Tensor],
    scale: Optional[float],
    lower_bound: float,
    gate: str,
    state_layout: str,
    use_qk_l2norm: bool,
    use_beta_sigmoid: bool,
    allow_neg_eigval: bool,
    inplace: bool,
    launch_options: Optional[list[int]],
) -> None:
    """One forward call (C++ flash_kda::forward) writing out and final_state. With inplace,
    initial_state is None and the state is read from final_state and written back there (an
    in-place update: one mutated argument, not two aliasing ones). gate, state_layout and the
    flags as _core.forward takes them; launch_options: LaunchOptions' four fields or None."""
    if inplace:
        initial_state = final_state
    named = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "out": out, "A_log": A_log, "dt_bias": dt_bias,
             "cu_seqlens": cu_seqlens, "initial_state": initial_state, "final_state": final_state,
             "cu_seqlens_cpu": cu_seqlens_cpu}
    settings = (scale, lower_bound, gate, state_layout, use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval)
    options = tuple(launch_options) if launch_options is not None else None
    _forward.launch(_chunk.ordered(named), settings, options, torch)


@forward_op.register_fake
def _forward_fake(q, k, v, g, beta, out, A_log, dt_bias, cu_seqlens, initial_state, final_state, cu_seqlens_cpu,
                  scale, lower_bound, gate, state_layout, use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval, inplace,
                  launch_options) -> None:
    return None


def _same_view(a, b) -> bool:
    """True when tensors a and b are two view objects of the same elements (what the C++ call
    accepts as an in-place update): the op must then see one mutated tensor, not an unmutated
    input aliasing a mutated one. While torch.compile traces, data pointers cannot be compared
    (dynamo refuses it: a graph break), so there only the same tensor object counts as in place
    (final_state=initial_state), which is how an in-place call is written."""
    if b is None or torch.compiler.is_compiling():
        return False
    return a.data_ptr() == b.data_ptr() and a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()


def _call_forward_op(named: dict, settings: tuple, options) -> None:
    """forward_op on the call's tensors by name (absent ones missing), with an exact in-place
    state update (final_state is initial_state) passed as final_state alone."""
    initial_state, final_state = named.get("initial_state"), named.get("final_state")
    inplace = final_state is not None and (final_state is initial_state or _same_view(final_state, initial_state))
    forward_op(named["q"], named["k"], named["v"], named["g"], named["beta"], named["out"], named.get("A_log"),
               named.get("dt_bias"), named.get("cu_seqlens"), None if inplace else initial_state, final_state,
               named.get("cu_seqlens_cpu"), *settings, inplace, None if options is None else list(options))


def traced_fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state, cu_seqlens,
               cu_seqlens_cpu, check_cu_seqlens, launch_options) -> None:
    """flash_kda.fwd as torch.compile traces it: the same argument checks, then the op (the
    safe gate, v-first states, FlashKDA's flags)."""
    if lower_bound is None:
        raise _forward._error("lower_bound", "a float in [-5, 0) (FlashKDA's safe gate needs one), got None")
    lower_bound = _forward._real("lower_bound", lower_bound)
    if scale is not None:
        scale = _forward._real("scale", scale)
    options = None
    if launch_options is not None:
        if not isinstance(launch_options, _forward.LaunchOptions):
            raise _forward._error("launch_options", "expected a flash_kda.LaunchOptions or None, got "
                                  f"{type(launch_options).__name__}")
        options = launch_options._fields
    if (check_cu_seqlens is True or _forward._CHECK_CU_SEQLENS_ENV) and isinstance(cu_seqlens, torch.Tensor) \
            and cu_seqlens_cpu is None:
        cu_seqlens_cpu = cu_seqlens.cpu()
    named = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "out": out, "A_log": A_log, "dt_bias": dt_bias,
             "cu_seqlens": cu_seqlens, "initial_state": initial_state, "final_state": final_state,
             "cu_seqlens_cpu": cu_seqlens_cpu}
    _call_forward_op(named, (scale, lower_bound, "safe", "v_first", True, True, False), options)


def traced_chunk_kda(plan):
    """flash_kda.chunk_kda as torch.compile traces it, after its Python-level checks: the
    outputs allocated with torch ops, then the op. Returns (o, final_state) like the eager
    function."""
    out, final_state = _chunk.new_outputs(plan, torch)
    _call_forward_op({**plan.inputs, "out": out, "final_state": final_state}, plan.settings, None)
    return out, final_state


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
_forward._traced_fwd = traced_fwd
_chunk._traced = traced_chunk_kda
