"""flash_kda.chunk_kda: the KDA prefill with the keyword names, defaults and return values of
flash-linear-attention 0.6.0's ``fla.ops.kda.chunk_kda`` (fla/ops/kda/chunk.py), on flash_kda's
sm_90 forward (C++ flash_kda::forward, every gate mode and flag).

What fla's keywords mean here (fla/ops/kda/chunk.py and fla/ops/kda/gate.py, fla-core 0.6.0):
- the gate: ``use_gate_in_kernel=False``: g is already the log decay (natural log);
  with it, ``lower_bound`` given selects the lower-bound ("safe") gate
  ``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`` (without A_log:
  ``lower_bound * sigmoid(g + dt_bias)``), whatever ``safe_gate`` says (fla's gate kernel
  keys on lower_bound alone); ``lower_bound=None`` the softplus gate
  ``-exp(A_log) * softplus(g + dt_bias)``, which needs A_log. ``safe_gate`` picks fla's
  tensor-core path and makes lower_bound required with the fused gate; it does not change
  the function.
- A_log and dt_bias arrive through ``**kwargs`` and are ignored without use_gate_in_kernel.
- the final state is a new fp32 tensor, [N, HV, V, K] with ``state_v_first`` else [N, HV, K, V].

Semantics of the function: docs/kda-spec.md.
"""

from __future__ import annotations

import numbers
import warnings
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from . import _core
from ._forward import FORWARD_TENSORS, _cuda_device, _current_raw_stream, _error, _raw_descriptions, _real, launch

try:
    # Already imported by flash_kda/__init__.py when installed; a module global so that
    # torch.compile traces chunk_kda without a graph break.
    import torch as _torch_module
except ImportError:
    _torch_module = None

if TYPE_CHECKING:
    import torch

#: flash_kda._ops.traced_chunk_kda once the torch.library op is registered (None without torch
#: or without torch.library.custom_op): what chunk_kda runs while torch.compile traces it.
_traced = None
#: flash_kda._ops.train_chunk_kda once the torch.library ops are registered (None without torch
#: or without torch.library.custom_op): what chunk_kda runs for a training call (plan.grad),
#: eagerly and while torch.compile traces it.
_train = None

#: The inputs a training call differentiates, in the order of their gradients
#: (_core.backward_raw's dq, dk, dv, dg, dbeta, dA_log, ddt_bias, d_initial_state).
GRAD_INPUTS = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state")

#: The **kwargs fla's chunk_kda reads; any other keyword is an error here (fla ignores it).
_KWARGS = ("A_log", "dt_bias", "chunk_size", "transpose_state_layout", "intermediate_state_every")


class Plan(NamedTuple):
    """One chunk_kda call after the Python-level checks: what the C++ forward is given.

    inputs: the call's input tensors by call-table name (absent ones missing);
    settings: (scale or None, lower_bound, gate, state_layout, use_qk_l2norm,
    use_beta_sigmoid, allow_neg_eigval) as _core.forward takes them;
    output_final_state: whether a final state is returned; num_seqs: N (B, or
    len(cu_seqlens) - 1), or -1 when q or cu_seqlens is malformed (the C++ validation names it);
    intermediate: None, or the intermediate states asked for: ("fla", chunk_size, True) for
    return_intermediate_states (fla's h), ("every", n, False) for intermediate_state_every=n;
    grad: the names of the inputs (among GRAD_INPUTS; A_log and dt_bias only with the fused
    gate) that require grad while grad is enabled, in `inputs`' order: a training call,
    differentiated by flash_kda's backward; empty for an inference call."""

    inputs: dict
    settings: tuple
    output_final_state: bool
    num_seqs: int
    intermediate: tuple | None = None
    grad: tuple = ()


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise _error(name, f"expected a bool, got {type(value).__name__} {value!r}")


#: chunk_kda's bool arguments, in the order _flags checks them (the first bad one is named).
_FLAGS = ("output_final_state", "use_qk_l2norm_in_kernel", "use_gate_in_kernel", "use_beta_sigmoid_in_kernel",
          "allow_neg_eigval", "safe_gate", "disable_recompute", "return_intermediate_states", "state_v_first",
          "use_graph")
#: The set of argument types of a call whose ten flags are all Python bools (_flags' shortcut).
_BOOL_ONLY = {bool}


def _flags(values: tuple) -> tuple:
    """values (one per name of _FLAGS) as Python bools; the first that is neither a bool nor a
    numpy bool is a flash_kda.Error naming it."""
    if set(map(type, values)) == _BOOL_ONLY:  # the usual call: one type test for all ten
        return values
    return tuple(_flag(n, x) for n, x in zip(_FLAGS, values))


def _transposed_state_layout(v_first: bool, kwargs: dict, stacklevel: int) -> bool:
    """state_v_first from fla 0.6.0's deprecated name of it, kwargs["transpose_state_layout"]
    (a DeprecationWarning pointing `stacklevel` frames above the caller); a flash_kda.Error when
    state_v_first is given too."""
    if v_first:
        raise _error("transpose_state_layout", "cannot be given with state_v_first (its new name)")
    warnings.warn("`transpose_state_layout` is deprecated and renamed to `state_v_first`.",
                  DeprecationWarning, stacklevel=stacklevel + 1)
    return _flag("transpose_state_layout", kwargs["transpose_state_layout"])


def _softplus_gate_error(A_log_missing: bool) -> Exception:
    """fla's refusal of a fused gate without lower_bound: A_log missing (the softplus gate needs
    it), else safe_gate given (it needs lower_bound)."""
    if A_log_missing:
        return _error("A_log", "is required when use_gate_in_kernel=True and lower_bound is not set (the "
                      "softplus gate -exp(A_log) * softplus(g + dt_bias)); pass A_log=... or a lower_bound")
    return _error("lower_bound", "is required when safe_gate=True and use_gate_in_kernel=True")


def _dims(x: Any) -> tuple:
    shape = getattr(x, "shape", None)
    return tuple(shape) if shape is not None else ()


def plan_call(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
              use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound,
              disable_recompute, return_intermediate_states, state_v_first, cu_seqlens, cu_seqlens_cpu,
              cp_context, use_graph, max_num_seqs, kwargs: dict, grad_enabled: bool) -> Plan:
    """The Python-level part of chunk_kda: fla's keyword rules and what flash_kda refuses before
    the C++ validation (which judges tensors, shapes, dtypes, strides and devices). Reads no
    tensor data. grad_enabled: torch.is_grad_enabled() of the caller. Raises flash_kda.Error."""
    for name in kwargs:
        if name not in _KWARGS:
            raise _error(name, "is not a keyword of chunk_kda (fla 0.6.0's chunk_kda reads only "
                         "A_log, dt_bias, chunk_size and the deprecated transpose_state_layout)")
    (output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval,
     safe_gate, _, return_intermediate_states, v_first, use_graph) = _flags((
        output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
        allow_neg_eigval, safe_gate, disable_recompute, return_intermediate_states, state_v_first, use_graph))
    if "transpose_state_layout" in kwargs:
        v_first = _transposed_state_layout(v_first, kwargs, stacklevel=3)
    chunk_size = kwargs.get("chunk_size", 64)
    if isinstance(chunk_size, bool) or chunk_size not in (32, 64):
        # fla's tiling (its intermediate states depend on it, the function does not): its own rule.
        raise _error("chunk_size", f"must be 32 or 64 (fla's rule for KDA), got {chunk_size!r}")

    tensors = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "initial_state": initial_state,
               "cu_seqlens": cu_seqlens, "cu_seqlens_cpu": cu_seqlens_cpu,
               "A_log": kwargs.get("A_log"), "dt_bias": kwargs.get("dt_bias")}
    grad = ()
    if grad_enabled:
        for t in tensors.values():  # a plain loop, cheapest for the usual call that has none
            if getattr(t, "requires_grad", False):
                grad = tuple(n for n, x in tensors.items() if getattr(x, "requires_grad", False))
                break
        if grad:
            if not backward_available():
                raise _error(grad[0], "requires grad, but this flash_kda build has no backward "
                             "(flash_kda._core.backward_raw is missing): call chunk_kda under torch.no_grad() "
                             "or torch.inference_mode(), detach the input, or use fla's chunk_kda for training")
            for name in grad:
                if name not in GRAD_INPUTS:
                    raise _error(name, "requires grad, but it has no gradient (sequence boundaries are integers)")
    if cp_context is not None:
        raise _error("cp_context", "context parallelism is not served by flash_kda (pass None, or use fla's "
                     "chunk_kda)")
    intermediate = None
    every = kwargs.get("intermediate_state_every")
    if every is not None:
        if isinstance(every, bool) or not isinstance(every, numbers.Integral) or every <= 0 or every % 16:
            raise _error("intermediate_state_every", f"expected a positive multiple of 16 (tokens between the "
                         f"states returned), got {every!r}")
        if return_intermediate_states:
            raise _error("intermediate_state_every", "cannot be given with return_intermediate_states (fla's "
                         "form of the states every chunk_size tokens); pick one")
        intermediate = ("every", int(every), False)
    elif return_intermediate_states:
        intermediate = ("fla", int(chunk_size), True)
    if intermediate is not None and grad:
        raise _error("return_intermediate_states" if intermediate[0] == "fla" else "intermediate_state_every",
                     f"intermediate states have no backward, and {grad[0]} requires grad: call chunk_kda under "
                     "torch.no_grad() or torch.inference_mode() for prefix caching, or drop the intermediate "
                     "states for training")
    if intermediate is not None and use_graph:
        raise _error("use_graph", "intermediate states need the sequence lengths on the host, which fla's graph "
                     "mode does not give (cu_seqlens padded per replay); pass use_graph=False, or use fla's chunk_kda")
    # disable_recompute decides what fla saves for its backward; a forward-only call saves nothing.

    num_seqs = -1
    if cu_seqlens is not None:
        dims = _dims(cu_seqlens)
        if len(dims) == 1:
            num_seqs = int(dims[0]) - 1
    else:
        dims = _dims(q)
        if len(dims) == 4:
            num_seqs = int(dims[0])
    if use_graph and cu_seqlens is not None:
        # fla's graph mode: cu_seqlens padded with zero-length tail sequences to max_num_seqs + 1
        # entries (initial_state [max_num_seqs, ...]); rows past the last real token are left
        # unwritten, as fla leaves them undefined. The host copy describes one replay only and
        # its last entry may be short of T, so it is not used.
        if max_num_seqs is not None:
            if isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, numbers.Integral):
                raise _error("max_num_seqs", f"expected an int or None, got {type(max_num_seqs).__name__}")
            if num_seqs != int(max_num_seqs):
                raise _error("max_num_seqs", f"cu_seqlens must be padded with zero-length tail sequences to "
                             f"exactly max_num_seqs + 1 = {int(max_num_seqs) + 1} entries under use_graph, "
                             f"got {num_seqs + 1}")
        tensors["cu_seqlens_cpu"] = None

    if not use_gate_in_kernel:
        gate, bound = "none", -5.0
        tensors["A_log"] = tensors["dt_bias"] = None  # fla ignores them with a pre-computed gate
        if grad:
            grad = tuple(n for n in grad if n not in ("A_log", "dt_bias"))  # ignored inputs: no gradient
    elif lower_bound is not None:
        gate, bound = "safe", _real("lower_bound", lower_bound)
    else:
        if tensors["A_log"] is None or safe_gate:
            raise _softplus_gate_error(tensors["A_log"] is None)
        gate, bound = "softplus", -5.0
    if scale is not None:
        scale = _real("scale", scale)
    settings = (scale, bound, gate, "v_first" if v_first else "k_first", use_qk_l2norm_in_kernel,
                use_beta_sigmoid_in_kernel, allow_neg_eigval)
    return Plan({n: t for n, t in tensors.items() if t is not None}, settings, output_final_state,
                num_seqs, intermediate, grad)


def backward_available() -> bool:
    """Whether this build's extension has the backward (_core.backward_raw and
    _core.validate_backward_raw)."""
    return hasattr(_core, "backward_raw") and hasattr(_core, "validate_backward_raw")


def ordered(named: dict) -> tuple:
    """The call's tensors in the call table's order (None where absent)."""
    return tuple(map(named.get, FORWARD_TENSORS))


def output_shapes(plan: Plan) -> tuple[tuple, tuple | None] | None:
    """(out's shape, the final state's shape or None), or None when q or v is malformed (the C++
    validation names it). out is [B, T, HV, V] (v's); the state [N, HV, V, K] (v-first) or
    [N, HV, K, V]."""
    q, v = plan.inputs.get("q"), plan.inputs.get("v")
    dq, dv = _dims(q), _dims(v)
    if len(dq) != 4 or len(dv) != 4:
        return None
    out = tuple(dv)  # as given: under torch.compile a dynamic length stays symbolic
    if not plan.output_final_state:
        return out, None
    kd, vd = int(dq[3]), int(dv[3])
    dims = (vd, kd) if plan.settings[3] == "v_first" else (kd, vd)
    return out, (max(plan.num_seqs, 0), int(dv[2]), *dims)


def chunk_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    cp_context: Any = None,
    use_graph: bool = False,
    max_num_seqs: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """KDA prefill on an sm_90 GPU with fla 0.6.0's ``chunk_kda`` call, differentiable.

    Computes, per sequence and value head, the recurrence of docs/kda-spec.md with the
    pre-processing the flags select, on flash_kda's forward kernels. Keyword names, defaults
    and return values are those of ``fla.ops.kda.chunk_kda`` (fla-core 0.6.0); fla also
    dispatches its own chunk_kda here when flash_kda is installed (flash_kda/_fla_chunk.py),
    for training calls too when FLA_FLASH_KDA_TRAIN=1.

    Training: with grad enabled and an input requiring grad, o and final_state carry autograd
    history (the torch.library op flash_kda::chunk_kda_train, eager and under torch.compile).
    The forward saves its inputs only; the backward (C++ flash_kda::backward, math in
    docs/kda-spec.md "Backward": dL/d of the raw inputs, through the fused L2 norm, gate and
    beta sigmoid) recomputes the rest from them, on torch's current stream with its workspace
    and gradients from torch's allocator, and gives every input that requires grad among q, k,
    v, g, beta, A_log, dt_bias and initial_state its gradient (each in its input's dtype and
    shape; A_log and dt_bias only with use_gate_in_kernel, fp32); cu_seqlens gets none. The
    backward's C++ validation of the call runs before the forward (eagerly; under torch.compile
    with the backward); intermediate states
    (return_intermediate_states, intermediate_state_every) have no backward. Inference calls
    (grad off, or nothing requiring it) never touch autograd or the dispatcher.

    Args (B batch, T tokens, H q/k heads, HV value heads (a multiple of H: GVA, value head hv
    reads q/k head hv // (HV / H)), K key and V value head dims; varlen: B = 1, T = total
    tokens, N sequences = len(cu_seqlens) - 1, else N = B):
        q, k: [B, T, H, K]; v: [B, T, HV, V]; g: [B, T, HV, K]; beta: [B, T, HV].
        scale: output scale; None means K**-0.5.
        initial_state: optional [N, HV, V, K] (state_v_first) or [N, HV, K, V]; zero if None.
            fla requires fp32; flash_kda takes what its kernels keep (bf16 or fp32).
        output_final_state: also return the state after each sequence's last token, a new
            fp32 tensor [N, HV, V, K] (state_v_first) or [N, HV, K, V].
        use_qk_l2norm_in_kernel: L2-normalise q and k over K (fp32, eps 1e-6 inside the sqrt).
        use_gate_in_kernel: compute the log decay from the raw g: the lower-bound gate
            ``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`` (``lower_bound *
            sigmoid(g + dt_bias)`` without A_log) when lower_bound is given, else the
            softplus gate ``-exp(A_log) * softplus(g + dt_bias)`` (A_log required). Without
            it g is the log decay itself (natural log, <= 0) and A_log, dt_bias are ignored.
        use_beta_sigmoid_in_kernel: b = sigmoid(beta); else beta is b itself.
        allow_neg_eigval: b = 2 * sigmoid(beta); needs use_beta_sigmoid_in_kernel.
        safe_gate: fla's tensor-core path for bounded gates; with use_gate_in_kernel it makes
            lower_bound required. It does not change the function computed.
        lower_bound: the lower-bound gate's floor in natural-log units, in [-5, 0).
        disable_recompute: what fla saves for its backward; accepted and ignored (flash_kda's
            forward saves its inputs only and the backward recomputes the rest).
        return_intermediate_states: also return fla's ``h``: the state before each chunk of
            ``chunk_size`` (64) tokens of each sequence, [B, NT, HV, V, K] (state_v_first) or
            [B, NT, HV, K, V] in k's dtype, NT = ceil(T / 64) (fixed length); varlen: B = 1 and
            NT = sum over sequences of ceil(len_n / 64), sequence n's entries starting at
            sum over m < n of ceil(len_m / 64) (fla's chunk_offsets); entry 0 of a sequence is
            its initial state. Needs the sequence lengths on the host: cu_seqlens_cpu when
            given, else one device-to-host copy of cu_seqlens (a synchronisation, as fla makes).
            fla also asserts torch.inference_mode() and disable_recompute=False for it; this
            function serves it under any no-grad mode and either disable_recompute.
        state_v_first: the states' layout ([.., V, K] when True, [.., K, V] when False).
        cu_seqlens: optional int64/int32 [N + 1] on the GPU, cumulative sequence starts
            (cu[0] = 0, non-decreasing, cu[N] = T); values not checked on the GPU (no sync).
        cu_seqlens_cpu: optional host copy of cu_seqlens; its values are checked.
        cp_context: context parallelism; not served (raises unless None).
        use_graph: fla's CUDA-graph mode: cu_seqlens may be padded with zero-length tail
            sequences (to max_num_seqs + 1 entries; initial_state then has max_num_seqs rows);
            output rows past the last real token are left unwritten (fla: undefined), and
            cu_seqlens_cpu is not used (it describes one replay only). Every call is
            graph-capturable with or without it.
        max_num_seqs: with use_graph and cu_seqlens, must equal len(cu_seqlens) - 1 when given.
        **kwargs: A_log (fp32 [HV]) and dt_bias (fp32 [HV * K] or [HV, K]) for the fused gate;
            chunk_size (32 or 64: fla's tiling, accepted); transpose_state_layout (fla's
            deprecated name of state_v_first); intermediate_state_every=n (flash_kda's
            addition, a positive multiple of 16; not with return_intermediate_states): also
            return the states after n, 2n, ... tokens of each sequence (len_n // n of them), in
            initial_state's dtype (fp32 without one) and the states' layout, packed by sequence,
            with their int64 offsets [N + 1] on the GPU (sequence n's states are rows
            offsets[n] .. offsets[n + 1] - 1); sequence lengths on the host as for
            return_intermediate_states. Any other keyword raises.

    Which dtypes, shapes, layouts (strides) and gates run is decided by the C++ validation of
    flash_kda::forward (docs/errors.md), never here: today bf16 q, k, v, K = V = 128,
    16-byte aligned data. All tensors on one CUDA device; runs asynchronously on torch's current
    stream of q's device; CUDA-graph capturable; under torch.compile, the torch.library op
    flash_kda::forward (no graph break). Inputs are never modified.

    Returns:
        (o, final_state): o like v ([B, T, HV, V]) in q's dtype; final_state as above, or
        None without output_final_state. With return_intermediate_states: (o, final_state, h)
        (fla's return); with intermediate_state_every: (o, final_state, states, offsets).

    Raises:
        flash_kda.Error (a ValueError; ``.argument`` names the argument): cp_context given,
            intermediate states with grad (no backward), with use_graph or under torch.compile,
            a training call in a build without the backward or one the backward's validation
            refuses (named by it, before the forward runs), an unknown keyword, a flag that is not a bool, fla's
            keyword rules (A_log or lower_bound missing for the fused gate, chunk_size,
            max_num_seqs under use_graph), or anything the C++ validation rejects (the
            kernel's supported subset, shapes, dtypes, devices, strides, alignment).
            Nothing is written then.
        RuntimeError: a CUDA launch failed. ImportError: PyTorch is not installed.
    """
    torch = _torch_module
    if torch is None:  # not importable when flash_kda was: one more try, for a torch installed since
        try:
            import torch
        except ImportError as e:
            raise ImportError("flash_kda.chunk_kda needs PyTorch with CUDA and an sm_90 GPU; "
                              "without them only flash_kda.reference is available") from e
    plan = plan_call(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                     use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate, lower_bound,
                     disable_recompute, return_intermediate_states, state_v_first, cu_seqlens, cu_seqlens_cpu,
                     cp_context, use_graph, max_num_seqs, kwargs, torch.is_grad_enabled())
    if plan.grad:
        if _train is None:
            raise _error(plan.grad[0], "requires grad, but flash_kda's training path needs torch.library.custom_op "
                         "(PyTorch >= 2.4); call chunk_kda under torch.no_grad() or use fla's chunk_kda")
        return _train(plan)
    if _traced is not None and torch.compiler.is_compiling():
        if plan.intermediate is not None:
            raise _error("return_intermediate_states" if plan.intermediate[0] == "fla" else "intermediate_state_every",
                         "intermediate states are not traced by torch.compile yet (they need the sequence lengths "
                         "on the host); call chunk_kda outside the compiled region")
        return _traced(plan)
    out, final_state = new_outputs(plan, torch)
    if plan.intermediate is None:
        launch(ordered({**plan.inputs, "out": out, "final_state": final_state}), plan.settings, None, torch)
        return out, final_state
    states, offsets = new_intermediate(plan, torch)
    form, every, include_initial = plan.intermediate
    launch(ordered({**plan.inputs, "out": out, "final_state": final_state, "intermediate_states": states,
                    "intermediate_offsets": offsets}), plan.settings + (every, include_initial), None, torch)
    if form == "fla":  # h [B, NT, HV, ..]: NT chunks per batch entry (fixed length), all of them (varlen)
        batch = 1 if cu_seqlens is not None else int(_dims(q)[0])
        return out, final_state, states.view(batch, states.shape[0] // max(batch, 1), *states.shape[1:])
    return out, final_state, states, offsets


def sequence_lengths(plan: Plan, torch) -> list[int]:
    """The token count of each sequence, on the host: B times T, or the differences of
    cu_seqlens_cpu when given, else of cu_seqlens copied from the device (one device-to-host
    copy and a synchronisation, as fla's chunk_kda makes for its chunk indices)."""
    q = plan.inputs["q"]
    cu = plan.inputs.get("cu_seqlens")
    if cu is None:
        return [int(_dims(q)[1])] * int(_dims(q)[0]) if len(_dims(q)) == 4 else []
    host = plan.inputs.get("cu_seqlens_cpu")
    values = (host if host is not None else cu).detach().to("cpu").tolist()
    return [max(int(b) - int(a), 0) for a, b in zip(values[:-1], values[1:])]


def new_intermediate(plan: Plan, torch):
    """(states, offsets) for plan.intermediate, states uninitialised. fla's form: one state per
    started chunk of each sequence, the state before it (ceil(len / chunk_size) rows, fla's
    chunk_offsets), in k's dtype, [S, HV, V, K] (state_v_first) or [S, HV, K, V]; the every-n
    form: the states after n, 2n, ... tokens (len // n rows), in initial_state's dtype (fp32
    without one). offsets: int64 [N + 1] on q's device."""
    form, every, _ = plan.intermediate
    q, k, v = plan.inputs["q"], plan.inputs["k"], plan.inputs["v"]
    lens = sequence_lengths(plan, torch)
    counts = [-(-n // every) for n in lens] if form == "fla" else [n // every for n in lens]
    offsets = [0]
    for c in counts:
        offsets.append(offsets[-1] + c)
    init = plan.inputs.get("initial_state")
    dtype = getattr(k, "dtype", q.dtype) if form == "fla" else (init.dtype if init is not None else torch.float32)
    dq, dv = _dims(q), _dims(v)
    kd, vd, hv = (int(dq[3]), int(dv[3]), int(dv[2])) if len(dq) == 4 and len(dv) == 4 else (1, 1, 1)
    dims = (vd, kd) if plan.settings[3] == "v_first" else (kd, vd)
    states = torch.empty((offsets[-1], hv, *dims), dtype=dtype, device=q.device)
    return states, torch.tensor(offsets, dtype=torch.int64, device=q.device)


def new_outputs(plan: Plan, torch):
    """(out, final_state or None), uninitialised: out like v in q's dtype, the final state fp32
    (fla's). A malformed q or v gets an out of v's shape (or a 1-element stand-in) so that the
    C++ validation names the bad tensor."""
    q = plan.inputs.get("q")
    if not isinstance(q, torch.Tensor):
        raise _error("q", f"expected a torch tensor [B, T, H, K], got {type(q).__name__}")
    shapes = output_shapes(plan)
    out_shape = shapes[0] if shapes is not None else tuple(_dims(plan.inputs.get("v"))) or (1,)
    device = q.device
    out = torch.empty(out_shape, dtype=q.dtype, device=device)
    final_state = None
    if shapes is not None and shapes[1] is not None:
        final_state = torch.empty(shapes[1], dtype=torch.float32, device=device)
    return out, final_state


def describe(t, name: str):
    """The raw description _core.validate_forward_raw takes of a torch tensor (or of anything
    with its data_ptr(), dtype, shape, stride() and get_device()): (data_ptr, dtype code or
    name, shape, strides, device index or -1 for the host); None stays None. Anything else is
    a flash_kda.Error naming `name`."""
    if t is None:
        return None
    try:
        dtype = str(t.dtype).removeprefix("torch.")
        return (int(t.data_ptr()), _core.dtype_codes.get(dtype, dtype), tuple(int(d) for d in t.shape),
                tuple(int(d) for d in t.stride()), int(t.get_device()))
    except (AttributeError, TypeError) as e:
        raise _error(name, f"expected a torch tensor, got {type(t).__name__}") from e


def validate_call(plan: Plan) -> tuple:
    """The C++ validation of this call (flash_kda::validate_forward) without allocating its
    outputs or launching: out and final_state are described at low 256-byte aligned addresses,
    which no device allocation occupies, on q's device; validation reads nothing of them but
    where they are. Returns the problem's sizes (_core.validate_forward_raw: batch, seqlen,
    num_seqs, heads, value_heads, K, V, varlen, scale); raises flash_kda.Error."""
    raw, shapes = _described_inputs(plan)
    q = raw[FORWARD_TENSORS.index("q")]
    fp32 = _core.dtype_codes["float32"]
    placed = _placed([(q[1], shapes[0]), (fp32, shapes[1]) if shapes[1] is not None else None], q[4])
    for name, described in zip(("out", "final_state"), placed):
        if described is not None:
            raw[FORWARD_TENSORS.index(name)] = described
    return _core.validate_forward_raw(tuple(raw), *plan.settings)


def _described_inputs(plan: Plan) -> tuple[list, tuple]:
    """(the raw descriptions of the call's tensors in FORWARD_TENSORS order, output_shapes(plan));
    a flash_kda.Error naming q when q or v is not 4-dimensional."""
    raw = [describe(plan.inputs.get(name), name) for name in FORWARD_TENSORS]
    shapes = output_shapes(plan)
    if shapes is None:
        raise _error("q", "expected q [B, T, H, K] and v [B, T, HV, V] (4 dimensions each), got shapes "
                     f"{_dims(plan.inputs.get('q'))} and {_dims(plan.inputs.get('v'))}")
    return raw, shapes


def _placed(specs: list, device: int) -> list:
    """Raw descriptions of contiguous tensors (dtype code, shape) on `device`, one after another at
    low 256-byte aligned addresses from 256 on, which no device allocation occupies (validation
    reads nothing of them but where they are); None stays None."""
    address, placed = 256, []
    for spec in specs:
        if spec is None:
            placed.append(None)
            continue
        dtype, shape = spec
        strides, numel = [], 1
        for d in reversed(shape):
            strides.append(numel)
            numel *= max(int(d), 1)
        placed.append((address, dtype, tuple(shape), tuple(reversed(strides)), device))
        address += (numel * _ELEMENT_BYTES.get(dtype, 8) + 255) // 256 * 256
    return placed


_ELEMENT_BYTES = {_core.dtype_codes[n]: b for n, b in (("bfloat16", 2), ("float16", 2), ("float32", 4),
                                                       ("float64", 8))}


#: The gradient tensors of one backward call, in _core.backward_raw's order; the import fails if
#: the extension's table (_core.backward_tensors) differs, as _forward.py's does for the forward.
GRAD_TENSORS = ("d_out", "d_final_state", "dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias", "d_initial_state")
if hasattr(_core, "backward_tensors") and tuple(_core.backward_tensors) != GRAD_TENSORS:
    raise ImportError(f"flash_kda._core's backward table {tuple(_core.backward_tensors)} does not match the Python "
                      f"package's {GRAD_TENSORS}: the package and its extension are from different builds")


def new_gradients(named: dict, need: tuple, torch) -> tuple:
    """The input gradients of one backward call, uninitialised and contiguous (the backward
    writes every element): dq, dk, dv, dg, dbeta like q, k, v, g, beta (shape and dtype), and
    dA_log, ddt_bias (fp32) and d_initial_state (initial_state's dtype) like their inputs where
    `need` (three bools: dA_log, ddt_bias, d_initial_state wanted) says so and the input is
    present; None for the others. named: the call's input tensors by name."""
    grads = [torch.empty(named[n].shape, dtype=named[n].dtype, device=named[n].device)
             for n in ("q", "k", "v", "g", "beta")]
    for name, wanted, dtype in (("A_log", need[0], torch.float32), ("dt_bias", need[1], torch.float32),
                                ("initial_state", need[2], None)):
        t = named.get(name)
        grads.append(torch.empty(t.shape, dtype=dtype or t.dtype, device=t.device)
                     if wanted and t is not None else None)
    return tuple(grads)


def launch_backward(forward: tuple, grads: tuple, settings: tuple, torch) -> None:
    """_core.backward_raw on torch's current stream of q's device, with its workspace from
    torch's allocator (the forward's allocator callback, _forward.launch).

    forward: the forward call's inputs, one per name of FORWARD_TENSORS (its outputs, the pool
    and intermediate states None); grads: one tensor or None per name of GRAD_TENSORS;
    settings: as Plan.settings. Raises flash_kda.Error (nothing written) when the backward
    refuses the call, or when this build has no backward."""
    if not backward_available():
        raise _error("q", "this flash_kda build has no backward (flash_kda._core.backward_raw is missing)")
    q = forward[0]
    device = _cuda_device(q, torch)
    if device is not None:
        stream = _current_raw_stream(torch, device)
    else:
        device = q.device
        stream = 0  # the C++ validation rejects a host q by name before using the stream

    def alloc(nbytes: int):
        return torch.empty(nbytes, dtype=torch.uint8, device=device)

    scale, lower_bound, *flags = settings
    raw = _raw_descriptions(forward, torch)
    raw_grads = _raw_descriptions(grads, torch)
    if raw is None or raw_grads is None:
        raise _error("q", "the backward takes torch tensors (CUDA, and the host copy cu_seqlens_cpu) only")
    _core.backward_raw(raw, raw_grads, scale, lower_bound, alloc, stream, *flags)


def validate_backward_call(plan: Plan) -> tuple:
    """The C++ validation of the backward of this call (flash_kda::validate_backward) without
    allocating anything: every gradient tensor a training call gets (d_out like out, d_final_state
    fp32 when the call returns the final state, dq .. dbeta like their inputs, dA_log, ddt_bias
    and d_initial_state for the inputs in plan.grad) is described contiguous at low 256-byte
    aligned addresses on q's device, as validate_call does. Returns the problem's sizes; raises
    flash_kda.Error naming the first bad argument."""
    if not backward_available():
        raise _error(plan.grad[0] if plan.grad else "q",
                     "this flash_kda build has no backward (flash_kda._core.backward_raw is missing)")
    raw, shapes = _described_inputs(plan)
    q = raw[FORWARD_TENSORS.index("q")]
    fp32 = _core.dtype_codes["float32"]

    def like(name):
        d = raw[FORWARD_TENSORS.index(name)]
        return None if d is None else (d[1], d[2])

    wanted = {"d_out": (q[1], shapes[0]), "d_final_state": (fp32, shapes[1]) if shapes[1] is not None else None,
              "dq": like("q"), "dk": like("k"), "dv": like("v"), "dg": like("g"), "dbeta": like("beta")}
    for grad, name in (("dA_log", "A_log"), ("ddt_bias", "dt_bias"), ("d_initial_state", "initial_state")):
        d = like(name)
        wanted[grad] = None if d is None or name not in plan.grad else (fp32 if name != "initial_state" else d[0], d[1])
    grads = _placed([wanted[name] for name in GRAD_TENSORS], q[4])
    return _core.validate_backward_raw(tuple(raw), tuple(grads), *plan.settings)
