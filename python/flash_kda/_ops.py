"""The torch.library ops of flash_kda's GPU calls, so that torch.compile(fullgraph=True) traces
flash_kda.fwd, flash_kda.chunk_kda and flash_kda.fused_recurrent_kda_fwd without a graph break:

- flash_kda::forward, the forward (C++ flash_kda::forward) with every gate, layout and flag:
  fwd routes through it, and chunk_kda after allocating its outputs with torch ops;
- flash_kda::fused_recurrent_kda_fwd, the decode;
- flash_kda::chunk_kda_train and flash_kda::chunk_kda_backward, chunk_kda's training path: a
  functional forward (it returns new out and final state) with the backward registered as its
  autograd formula (torch.library.register_autograd), so that a training call differentiates
  eagerly and torch.compile(fullgraph=True) traces forward and backward.

Imported by flash_kda/__init__.py only when torch imports. The inference ops return nothing:
they write their outputs in place (custom ops may not return an alias of an input, and an
in-place state update is one), and their fake implementations do nothing, since every output
exists before the call. The Python functions route through an inference op while
torch.compiler.is_compiling(); eager inference calls go straight to _core (a torch.ops call
adds dispatcher time to every call). Training calls (an input requires grad while grad is
enabled) always go through chunk_kda_train, eager or traced: autograd needs the op.
"""

from typing import Optional

import torch

from . import _chunk, _decode, _forward

OP_NAME = "flash_kda::fused_recurrent_kda_fwd"
FORWARD_OP_NAME = "flash_kda::forward"
TRAIN_OP_NAME = "flash_kda::chunk_kda_train"
BACKWARD_OP_NAME = "flash_kda::chunk_kda_backward"


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


def _train_named(q, k, v, g, beta, A_log, dt_bias, cu_seqlens, initial_state, cu_seqlens_cpu) -> dict:
    return {"q": q, "k": k, "v": v, "g": g, "beta": beta, "A_log": A_log, "dt_bias": dt_bias,
            "cu_seqlens": cu_seqlens, "initial_state": initial_state, "cu_seqlens_cpu": cu_seqlens_cpu}


def _train_plan(named: dict, settings: tuple, output_final_state: bool) -> _chunk.Plan:
    """The Plan new_outputs reads (shapes, layout, whether a final state is returned)."""
    cu, q = named.get("cu_seqlens"), named["q"]
    num_seqs = int(cu.shape[0]) - 1 if cu is not None else int(q.shape[0])
    return _chunk.Plan({n: t for n, t in named.items() if t is not None}, settings, output_final_state, num_seqs)


def _train_outputs(named: dict, settings: tuple, output_final_state: bool):
    """(out, final_state): out like v in q's dtype; the fp32 final state, or an empty fp32 tensor
    standing for None (a custom op returns tensors only)."""
    out, final_state = _chunk.new_outputs(_train_plan(named, settings, output_final_state), torch)
    if final_state is None:
        final_state = torch.empty(0, dtype=torch.float32, device=out.device)
    return out, final_state


@torch.library.custom_op(TRAIN_OP_NAME, mutates_args=())
def train_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    A_log: Optional[torch.Tensor],
    dt_bias: Optional[torch.Tensor],
    cu_seqlens: Optional[torch.Tensor],
    initial_state: Optional[torch.Tensor],
    cu_seqlens_cpu: Optional[torch.Tensor],
    scale: Optional[float],
    lower_bound: float,
    gate: str,
    state_layout: str,
    use_qk_l2norm: bool,
    use_beta_sigmoid: bool,
    allow_neg_eigval: bool,
    output_final_state: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """chunk_kda's forward as a functional op (the C++ flash_kda::forward into new tensors):
    returns (out [B, T, HV, V] in q's dtype, the fp32 final state [N, HV, V, K] (v_first) or
    [N, HV, K, V], or an empty fp32 tensor without output_final_state). Settings as
    _core.forward takes them. Its autograd formula (_train_backward) runs chunk_kda_backward."""
    named = _train_named(q, k, v, g, beta, A_log, dt_bias, cu_seqlens, initial_state, cu_seqlens_cpu)
    settings = (scale, lower_bound, gate, state_layout, use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval)
    out, final_state = _train_outputs(named, settings, output_final_state)
    _forward.launch(_chunk.ordered({**named, "out": out, "final_state": final_state if output_final_state else None}),
                    settings, None, torch)
    return out, final_state


@train_op.register_fake
def _train_fake(q, k, v, g, beta, A_log, dt_bias, cu_seqlens, initial_state, cu_seqlens_cpu, scale, lower_bound,
                gate, state_layout, use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval, output_final_state):
    named = _train_named(q, k, v, g, beta, A_log, dt_bias, cu_seqlens, initial_state, cu_seqlens_cpu)
    settings = (scale, lower_bound, gate, state_layout, use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval)
    return _train_outputs(named, settings, output_final_state)


@torch.library.custom_op(BACKWARD_OP_NAME, mutates_args=())
def backward_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    A_log: Optional[torch.Tensor],
    dt_bias: Optional[torch.Tensor],
    cu_seqlens: Optional[torch.Tensor],
    initial_state: Optional[torch.Tensor],
    cu_seqlens_cpu: Optional[torch.Tensor],
    d_out: torch.Tensor,
    d_final_state: Optional[torch.Tensor],
    scale: Optional[float],
    lower_bound: float,
    gate: str,
    state_layout: str,
    use_qk_l2norm: bool,
    use_beta_sigmoid: bool,
    allow_neg_eigval: bool,
    need_dA_log: bool,
    need_ddt_bias: bool,
    need_d_initial_state: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
           torch.Tensor]:
    """The backward of one chunk_kda forward (C++ flash_kda::backward, _core.backward_raw):
    given the forward's inputs and settings (as chunk_kda_train's) and d_out (like out) and
    d_final_state (like the final state, or None: zero), returns (dq, dk, dv, dg, dbeta,
    dA_log, ddt_bias, d_initial_state), each new and contiguous, dq .. dbeta in their inputs'
    dtypes and shapes, dA_log and ddt_bias fp32 like A_log and dt_bias, d_initial_state like
    initial_state; an empty fp32 tensor for each of the last three that is not needed (need_*)
    or whose input is absent. Math: docs/kda-spec.md "Backward"."""
    named = _train_named(q, k, v, g, beta, A_log, dt_bias, cu_seqlens, initial_state, cu_seqlens_cpu)
    settings = (scale, lower_bound, gate, state_layout, use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval)
    grads = _chunk.new_gradients(named, (need_dA_log, need_ddt_bias, need_d_initial_state), torch)
    _chunk.launch_backward(_chunk.ordered(named), (d_out, d_final_state, *grads), settings, torch)
    return _placeholders(grads, q)


def _placeholders(grads: tuple, q: torch.Tensor) -> tuple:
    return tuple(t if t is not None else torch.empty(0, dtype=torch.float32, device=q.device) for t in grads)


@backward_op.register_fake
def _backward_fake(q, k, v, g, beta, A_log, dt_bias, cu_seqlens, initial_state, cu_seqlens_cpu, d_out,
                   d_final_state, scale, lower_bound, gate, state_layout, use_qk_l2norm, use_beta_sigmoid,
                   allow_neg_eigval, need_dA_log, need_ddt_bias, need_d_initial_state):
    named = _train_named(q, k, v, g, beta, A_log, dt_bias, cu_seqlens, initial_state, cu_seqlens_cpu)
    return _placeholders(_chunk.new_gradients(named, (need_dA_log, need_ddt_bias, need_d_initial_state), torch), q)


#: chunk_kda_train's positional inputs: the ten tensors, then the seven settings and output_final_state.
_TRAIN_TENSORS = 10


def _train_setup_context(ctx, inputs, output) -> None:
    """Saves the forward's input tensors only (the backward recomputes the rest, as fla's does)
    and its settings."""
    ctx.save_for_backward(*inputs[:_TRAIN_TENSORS])
    ctx.settings = tuple(inputs[_TRAIN_TENSORS:_TRAIN_TENSORS + 7])
    ctx.output_final_state = inputs[_TRAIN_TENSORS + 7]


def _train_backward(ctx, d_out, d_final_state):
    """Gradients of chunk_kda_train's inputs: chunk_kda_backward's for q, k, v, g, beta,
    A_log, dt_bias and initial_state where autograd needs them, None for the rest. d_out and
    d_final_state are made contiguous (autograd hands e.g. a sum's gradient as a stride-0
    expansion); the empty final state's gradient, without output_final_state, is dropped."""
    tensors = ctx.saved_tensors
    need = ctx.needs_input_grad
    out_like = tensors[2]  # v: out has v's shape in q's dtype
    if d_out is None:
        d_out = torch.zeros(out_like.shape, dtype=tensors[0].dtype, device=out_like.device)
    if not ctx.output_final_state or d_final_state is None:
        d_final_state = None
    else:
        d_final_state = d_final_state.contiguous()
    grads = backward_op(*tensors, d_out.contiguous(), d_final_state, *ctx.settings, bool(need[5]), bool(need[6]),
                        bool(need[8]))
    dq, dk, dv, dg, dbeta, dA_log, ddt_bias, d_initial_state = grads
    picked = [dq, dk, dv, dg, dbeta, dA_log, ddt_bias, None, d_initial_state, None]
    return tuple(t if need[i] else None for i, t in enumerate(picked)) + (None,) * 8


train_op.register_autograd(_train_backward, setup_context=_train_setup_context)


def train_chunk_kda(plan):
    """flash_kda.chunk_kda for a training call (plan.grad: some input requires grad while grad
    is enabled), eager or traced: chunk_kda_train, whose autograd formula is the backward.
    Eagerly, the backward's C++ validation of this call runs first, so that a call the backward
    would refuse raises here, before the forward. Returns (o, final_state or None)."""
    named = plan.inputs
    if not torch.compiler.is_compiling():
        _chunk.validate_backward_call(plan)
    out, final_state = train_op(named["q"], named["k"], named["v"], named["g"], named["beta"], named.get("A_log"),
                                named.get("dt_bias"), named.get("cu_seqlens"), named.get("initial_state"),
                                named.get("cu_seqlens_cpu"), *plan.settings, plan.output_final_state)
    return out, (final_state if plan.output_final_state else None)


_decode._traced = traced_fused_recurrent_kda_fwd
_forward._traced_fwd = traced_fwd
_chunk._traced = traced_chunk_kda
_chunk._train = train_chunk_kda
