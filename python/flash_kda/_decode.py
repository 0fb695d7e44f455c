"""The decode step over a state pool: flash_kda.fused_recurrent_kda_fwd and
flash_kda.fused_recurrent_kda, with the keyword names, defaults and return values of
flash-linear-attention 0.6.0's functions of the same names (fla/ops/kda/fused_recurrent.py),
and flash_kda.reference_decode, the fp64 CPU reference of the same call.

Semantics: docs/kda-spec.md "Decode and speculative verification" and
include/flash_kda/decode.h (C++ flash_kda::decode). torch is imported only when a GPU call
is made.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _core
from ._forward import _cuda_device, _current_raw_stream, _error, _raw_descriptions, _real

try:
    # Already imported by flash_kda/__init__.py when installed; a module global (not an import
    # inside the functions) so that torch.compile traces fused_recurrent_kda_fwd without a break.
    import torch as _torch_module
except ImportError:
    _torch_module = None

if TYPE_CHECKING:
    import torch

#: flash_kda._ops.traced_fused_recurrent_kda_fwd once the torch.library op is registered (None
#: without torch or without torch.library.custom_op).
_traced = None

# The call's tensors in the order of the binding's decode table (_core.decode_tensors): the
# functions below build their tuples in this order (no locals() per call, as in _forward.py),
# and the import fails if the binding's order differs.
DECODE_TENSORS = ("q", "k", "v", "g", "beta", "out", "A_log", "dt_bias", "cu_seqlens", "initial_state",
                  "final_state", "ssm_state_indices", "num_accepted_tokens")
if tuple(_core.decode_tensors) != DECODE_TENSORS:
    raise ImportError(f"flash_kda._core's decode table {tuple(_core.decode_tensors)} does not match the Python "
                      f"package's {DECODE_TENSORS}: the package and its extension are from different builds")
_GATES = _core.decode_gates
_KERNELS = _core.decode_kernels


@dataclasses.dataclass(frozen=True)
class DecodeLaunchOptions:
    """Launch choices for :func:`fused_recurrent_kda_fwd` that the launch plan otherwise makes
    (C++ ``flash_kda::DecodeLaunchOptions``). None changes the function computed.

    Attributes:
        kernel: "auto" (the plan's choice), "persistent" (a persistent grid staging the state
            slices in shared memory), "direct" (one block per state slice, held in registers;
            k-first pools in row blocks whose warps split the keys, but bf16 pools of more
            than one token over few sequence-heads, 4 N HV below the SM count, in warp
            columns), "direct_columns" (the direct kernel with every k-first pool in its
            warp-column form, each warp all keys of a few value columns; otherwise as
            "direct") or "direct_rows" (the direct kernel with every k-first pool in row
            blocks, bf16 pools of more than one token in their split form, half of a lane's
            fp32 state in shared memory; otherwise as "direct"); the benchmark's
            ``--decode-kernel`` and the tests force each.

    Raises:
        flash_kda.Error: kernel is not one of those names (named ``launch_options.kernel``).
    """

    kernel: str = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.kernel, str) or self.kernel not in _KERNELS:
            raise _error("launch_options.kernel", f"expected one of {', '.join(map(repr, _KERNELS))}, got "
                         f"{self.kernel!r}")
        object.__setattr__(self, "_kernel", int(_KERNELS[self.kernel]))


def _kernel_value(launch_options) -> int:
    """The binding's kernel value of a DecodeLaunchOptions or None."""
    if launch_options is None:
        return 0
    if not isinstance(launch_options, DecodeLaunchOptions):
        raise _error("launch_options", "expected a flash_kda.DecodeLaunchOptions or None, got "
                     f"{type(launch_options).__name__}")
    return launch_options._kernel


def _settings(use_gate_in_kernel, lower_bound, state_v_first, use_qk_l2norm_in_kernel,
              use_beta_sigmoid_in_kernel, allow_neg_eigval, scale) -> tuple:
    """The settings tuple _core's decode functions take, from fla's keywords.

    fla's gate choice: use_gate_in_kernel=False means g already holds the log decay;
    with it, lower_bound given selects the safe gate lower_bound * sigmoid(exp(A_log) * (g +
    dt_bias)), and lower_bound None the softplus gate -exp(A_log) * softplus(g + dt_bias).
    fla applies allow_neg_eigval only together with the beta sigmoid, so it is dropped without.
    """
    flags = []
    for name, value in (("use_gate_in_kernel", use_gate_in_kernel), ("state_v_first", state_v_first),
                        ("use_qk_l2norm_in_kernel", use_qk_l2norm_in_kernel),
                        ("use_beta_sigmoid_in_kernel", use_beta_sigmoid_in_kernel),
                        ("allow_neg_eigval", allow_neg_eigval)):
        if not isinstance(value, (bool, np.bool_)):
            raise _error(name, f"expected a bool, got {type(value).__name__} {value!r}")
        flags.append(bool(value))
    gate_in_kernel, v_first, l2norm, beta_sigmoid, neg_eigval = flags
    if not gate_in_kernel:
        gate, bound = _GATES["none"], -5.0
    elif lower_bound is None:
        gate, bound = _GATES["softplus"], -5.0
    else:
        gate, bound = _GATES["safe"], _real("lower_bound", lower_bound)
    if scale is not None:
        scale = _real("scale", scale)
    return (gate, v_first, l2norm, beta_sigmoid, neg_eigval and beta_sigmoid, scale, bound)


def _torch():
    """torch, or an ImportError saying what the GPU decode needs."""
    if _torch_module is None:
        raise ImportError("flash_kda.fused_recurrent_kda_fwd needs PyTorch with CUDA and an sm_90 GPU; "
                          "without them only flash_kda.reference_decode is available")
    return _torch_module


def _no_extra(kwargs: dict) -> None:
    """fla's functions take **kwargs and ignore what they do not know; flash_kda names it
    instead, so a misspelt keyword is not silently dropped."""
    if kwargs:
        name = next(iter(kwargs))
        raise _error(name, "is not a keyword of fused_recurrent_kda_fwd / fused_recurrent_kda (fla 0.6.0's)")


def _num_seqs(q, cu_seqlens) -> int:
    return int(cu_seqlens.shape[0]) - 1 if cu_seqlens is not None else int(q.shape[0])


def _new_final_state(q, v, num_seqs: int, state_v_first: bool, torch):
    """fla's freshly allocated final state: fp32 [N, HV, V, K] (v-first) or [N, HV, K, V]."""
    hv, kd, vd = int(v.shape[2]), int(q.shape[3]), int(v.shape[3])
    dims = (vd, kd) if state_v_first else (kd, vd)
    return torch.empty((max(num_seqs, 0), hv, *dims), dtype=torch.float32, device=q.device)


def _grad_check(torch, tensors) -> None:
    if torch.is_grad_enabled():
        for name, t in zip(_core.decode_tensors, tensors):
            if getattr(t, "requires_grad", False):
                raise _error(name, "requires grad: flash_kda's decode is inference only (no backward); "
                             "call it under torch.no_grad() or torch.inference_mode(), or detach the input")


def fused_recurrent_kda_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
    output_final_state: bool = False,
    inplace_final_state: bool = True,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    ssm_state_indices: torch.Tensor | None = None,
    num_accepted_tokens: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    lower_bound: float | None = None,
    out: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """KDA decode / speculative verification on an sm_90 GPU, with fla 0.6.0's call.

    Runs the recurrence of docs/kda-spec.md token by token (fp32 inside) for T = 1..16 tokens
    per sequence (varlen: any number), with the states in a pool (C++ flash_kda::decode; include/flash_kda/decode.h).
    Keyword names, defaults and return values are those of fla's fused_recurrent_kda_fwd
    (fla/ops/kda/fused_recurrent.py, fla-core 0.6.0).

    Args (B batch, T tokens per sequence, H q/k heads, HV value heads (a multiple of H: GVA),
    K = V = 128, N sequences (B, or len(cu_seqlens) - 1), P pool slots):
        q, k: bf16 or fp32 [B, T, H, K]. v: bf16 or fp32 [B, T, HV, V].
        g: bf16 or fp32 [B, T, HV, K]: the log decay itself when use_gate_in_kernel is False,
            else the raw gate input.
        beta: bf16 or fp32 [B, T, HV] (a per-head scalar; fla's headwise [B, T, HV, V] beta is
            not served): logits when use_beta_sigmoid_in_kernel, else b itself.
        A_log: optional fp32 [HV]; required by the softplus gate. dt_bias: optional fp32
            [HV, K] or [HV*K], added to g before the gate. Both are ignored (as by fla)
            when use_gate_in_kernel is False.
        initial_state: bf16 or fp32. With ssm_state_indices: the state pool [P, HV, V, K]
            (state_v_first) or [P, HV, K, V], any stride between slots. Without: [N, HV, ...],
            or None for zero states.
        scale: output scale; None means K**-0.5.
        output_final_state: with inplace_final_state False, return a new fp32 final state.
        inplace_final_state: write the final states into initial_state (the pool) and return
            it; needs initial_state.
        state_v_first: the states' layout ([.., V, K] when True, [.., K, V] when False).
        cu_seqlens: optional int32/int64 [N + 1] on the GPU: a varlen batch (B = 1) whose
            sequences may have any number of tokens. Its values are not checked (that would
            need a sync); bad ones give unspecified results, never an access outside the tensors.
        ssm_state_indices: optional int32/int64 [N] or [N, T] (fixed length only): the pool
            slot of each sequence (and token). Sequence n starts from pool[idx[n,
            num_accepted_tokens[n] - 1]] (with num_accepted_tokens) or pool[idx[n, 0]]; the
            state after token t goes to pool[idx[n, t]] ([N]: after the last token, to
            pool[idx[n]]). A negative index (padding) skips the sequence: no slot read or
            written, its out rows zero. Needs inplace_final_state.
        num_accepted_tokens: optional int32/int64 [N], needs [N, T] indices.
        use_qk_l2norm_in_kernel: L2-normalise q and k over K. use_gate_in_kernel: compute the
            log decay from g (safe gate with lower_bound, else softplus). lower_bound: the safe
            gate's floor, in [-5, 0). use_beta_sigmoid_in_kernel: b = sigmoid(beta).
            allow_neg_eigval: b = 2 sigmoid(beta) (only with the sigmoid, as in fla).
        out: optional [B, T, HV, V] (bf16 or fp32), written; None allocates one like v.
        launch_options: a :class:`DecodeLaunchOptions` (flash_kda's own keyword, taken from
            **kwargs so that the signature stays fla's: which decode kernel runs), or None for
            the plan's choice. Not under torch.compile.

    Differences from fla, on purpose (decode.h): a negative slot index skips the sequence
    with zero output rows (fla reads slot -1); with [N] indices and T > 1 only the last token's
    state is written; with ssm_state_indices the final state is always the pool.

    Returns:
        (out, final_state): final_state is initial_state (in place) with inplace_final_state,
        a new fp32 [N, HV, ...] tensor with output_final_state, else None.

    Raises:
        flash_kda.Error: an argument is invalid or outside what the GPU decode serves (the
            message and ``.argument`` name it): K or V other than 128, more than 16 tokens per
            sequence of a fixed-length batch, an input requiring grad while grad is enabled, headwise beta, a tensor
            on the host, misaligned rows, an unknown keyword, ... Nothing is written then.
        RuntimeError: the CUDA launch failed. ImportError: PyTorch is not installed.
    """
    launch_options = kwargs.pop("launch_options", None)
    _no_extra(kwargs)
    torch = _torch()
    kernel = _kernel_value(launch_options)
    if _traced is not None and torch.compiler.is_compiling():
        if launch_options is not None:
            raise _error("launch_options", "is not served under torch.compile (the traced op runs the plan's "
                         "kernel); pass None")
        return _traced(
            q, k, v, g, beta, A_log, dt_bias, initial_state, scale, output_final_state, inplace_final_state,
            state_v_first, cu_seqlens, ssm_state_indices, num_accepted_tokens, use_qk_l2norm_in_kernel,
            use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, out)
    settings = _settings(use_gate_in_kernel, lower_bound, state_v_first, use_qk_l2norm_in_kernel,
                         use_beta_sigmoid_in_kernel, allow_neg_eigval, scale)
    if settings[0] == _GATES["none"]:
        A_log = dt_bias = None  # fla ignores them without use_gate_in_kernel
    final_state = _final_state(q, v, initial_state, output_final_state, inplace_final_state, state_v_first,
                               cu_seqlens, ssm_state_indices, torch)
    if final_state is not None and initial_state is not None and final_state.dtype != initial_state.dtype:
        initial_state = initial_state.float()  # fla's new final state is fp32 whatever the start's dtype
    if out is None:
        out = _new_out(v, cu_seqlens, torch)
    run_decode(q, k, v, g, beta, out, A_log, dt_bias, cu_seqlens, initial_state, final_state,
               ssm_state_indices, num_accepted_tokens, settings, torch, kernel)
    return out, final_state


def _final_state(q, v, initial_state, output_final_state, inplace_final_state, state_v_first, cu_seqlens,
                 ssm_state_indices, torch):
    """fla's choice of final state: the pool in place, a new fp32 one, or None; flash_kda.Error
    for the combinations the decode does not serve."""
    for name, value in (("output_final_state", output_final_state), ("inplace_final_state", inplace_final_state)):
        if not isinstance(value, (bool, np.bool_)):
            raise _error(name, f"expected a bool, got {type(value).__name__} {value!r}")
    if inplace_final_state:
        if initial_state is None:
            raise _error("initial_state", "is required with inplace_final_state=True (fla's default): the final "
                         "states are written into it; pass inplace_final_state=False for a zero start")
        return initial_state
    if ssm_state_indices is not None:
        raise _error("inplace_final_state", "must be True with ssm_state_indices: the states are written back "
                     "into the pool (fla's per-token final-state tensor is not served)")
    if output_final_state:
        if not hasattr(q, "shape") or not hasattr(v, "shape") or len(q.shape) != 4 or len(v.shape) != 4:
            return None  # the C++ validation names the malformed tensor
        return _new_final_state(q, v, _num_seqs(q, cu_seqlens), state_v_first, torch)
    return None


def _new_out(v, cu_seqlens, torch):
    """out like fla's (v's shape and dtype). The kernel writes every row of a fixed-length
    batch (skipped sequences as zeros); varlen rows past cu_seqlens[N] are not written, so
    that out starts zeroed as fla's does."""
    if not isinstance(v, torch.Tensor):
        raise _error("v", f"expected a torch tensor [B, T, HV, V], got {type(v).__name__}")
    return torch.zeros_like(v) if cu_seqlens is not None else torch.empty_like(v)


def run_decode(q, k, v, g, beta, out, A_log, dt_bias, cu_seqlens, initial_state, final_state,
               ssm_state_indices, num_accepted_tokens, settings, torch, kernel: int = 0) -> None:
    """_core.decode_raw on the current stream of q's device (the DLPack path when some
    argument is not a torch tensor, so that the binding names it); kernel: a
    _core.decode_kernels value."""
    tensors = (q, k, v, g, beta, out, A_log, dt_bias, cu_seqlens, initial_state, final_state,
               ssm_state_indices, num_accepted_tokens)
    _grad_check(torch, tensors)
    device = _cuda_device(q, torch)
    stream = _current_raw_stream(torch, device) if device is not None else 0
    raw = _raw_descriptions(tensors, torch)
    if raw is not None:
        _core.decode_raw(raw, settings, stream, kernel)
        return
    _core.decode(tensors, settings, stream, kernel)


def fused_recurrent_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    lower_bound: float | None = None,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fla 0.6.0's fused_recurrent_kda on flash_kda's decode: no pool, initial_state read
    (never modified), the final state returned as a new fp32 tensor when output_final_state.

    Args: as :func:`fused_recurrent_kda_fwd` (same shapes, dtypes and flags); initial_state is
    [N, HV, V, K] (state_v_first) or [N, HV, K, V], or None for zero states. fla's checks come
    first: B must be 1 with cu_seqlens, initial_state must hold N states, allow_neg_eigval
    needs use_beta_sigmoid_in_kernel.

    Returns:
        (o, final_state): o [B, T, HV, V] like v; final_state fp32 [N, HV, ...] when
        output_final_state, else None.

    Raises:
        flash_kda.Error: as :func:`fused_recurrent_kda_fwd`, and for fla's checks above
            (named cu_seqlens, initial_state, allow_neg_eigval).
    """
    _no_extra(kwargs)
    if cu_seqlens is not None:
        if getattr(q, "shape", (None,))[0] != 1:
            raise _error("cu_seqlens", f"needs batch size 1 (a flattened varlen batch), got q of shape "
                         f"{tuple(getattr(q, 'shape', ()))}")
        n = int(cu_seqlens.shape[0]) - 1
        if initial_state is not None and int(initial_state.shape[0]) != n:
            raise _error("initial_state", f"expected one state per sequence (N = len(cu_seqlens) - 1 = {n}), "
                         f"got shape {tuple(initial_state.shape)}")
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise _error("allow_neg_eigval", "needs use_beta_sigmoid_in_kernel=True (b = 2 * sigmoid(beta))")
    return fused_recurrent_kda_fwd(
        q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias, scale=scale,
        initial_state=initial_state, inplace_final_state=False, output_final_state=output_final_state,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_gate_in_kernel=use_gate_in_kernel,
        use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel, allow_neg_eigval=allow_neg_eigval,
        lower_bound=lower_bound, cu_seqlens=cu_seqlens, state_v_first=state_v_first,
    )


def _host_array(x: Any, name: str, writable: bool = False) -> Any:
    """x as a contiguous host array for the reference: numpy as a (copied when writable)
    contiguous array, torch tensors detached and copied to the host; None stays None."""
    if x is None:
        return None
    if isinstance(x, np.ndarray):
        return np.array(x, copy=True, order="C") if writable else np.ascontiguousarray(x)
    if hasattr(x, "detach") and hasattr(x, "device"):  # torch.Tensor, without importing torch
        t = x.detach().to("cpu")
        return t.clone().contiguous() if writable else t.contiguous()
    if isinstance(x, (list, tuple)):
        return np.ascontiguousarray(np.asarray(x))
    raise _error(name, f"expected an array (numpy array or torch tensor), got {type(x).__name__}")


def _dims(x: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in getattr(x, "shape", ()))


def reference_decode(
    q: Any,
    k: Any,
    v: Any,
    g: Any,
    beta: Any,
    *,
    A_log: Any = None,
    dt_bias: Any = None,
    initial_state: Any = None,
    scale: float | None = None,
    state_v_first: bool = False,
    cu_seqlens: Any = None,
    ssm_state_indices: Any = None,
    num_accepted_tokens: Any = None,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    lower_bound: float | None = None,
    num_threads: int = 0,
) -> tuple[np.ndarray, np.ndarray | None]:
    """The exact fp64 CPU reference of :func:`fused_recurrent_kda_fwd` (C++
    flash_kda::reference_decode): the same keywords and semantics, any K, V and T, on host
    copies of the inputs (CUDA tensors are copied to the host; nothing given is modified).

    The state is carried in fp64 from initial_state widened exactly. With ssm_state_indices,
    initial_state is the pool and the returned state is an fp64 copy of the pool after the
    call (slots written as fused_recurrent_kda_fwd writes them, the others unchanged); without,
    it is the fp64 [N, HV, ...] final state (initial_state may be None: zero states).

    Returns:
        (out, state): out a float32 numpy array of v's shape (the reference writes its fp64
        results rounded to fp32, far below any kernel's error); state a float64 numpy array
        (the pool after the call, or the N final states).

    Raises:
        flash_kda.Error: an argument is invalid (named), including slot indices at or above P,
            num_accepted_tokens outside [1, T] and bad cu_seqlens values.
    """
    settings = _settings(use_gate_in_kernel, lower_bound, state_v_first, use_qk_l2norm_in_kernel,
                         use_beta_sigmoid_in_kernel, allow_neg_eigval, scale)
    if settings[0] == _GATES["none"]:
        A_log = dt_bias = None  # as fused_recurrent_kda_fwd: unused by the pre-computed gate
    if isinstance(num_threads, (bool, np.bool_)) or not isinstance(num_threads, (int, np.integer)):
        raise _error("num_threads", f"expected an int >= 0 (0 = all cores), got {type(num_threads).__name__}")
    if not 0 <= num_threads < (1 << 31):
        raise _error("num_threads", f"must be >= 0 (0 = all cores) and < 2^31, got {num_threads}")
    q, k, v, g, beta = (_host_array(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (g, "g"), (beta, "beta")))
    A_log, dt_bias = _host_array(A_log, "A_log"), _host_array(dt_bias, "dt_bias")
    cu_seqlens = _host_array(cu_seqlens, "cu_seqlens")
    ssm_state_indices = _host_array(ssm_state_indices, "ssm_state_indices")
    num_accepted_tokens = _host_array(num_accepted_tokens, "num_accepted_tokens")
    state = _host_array(initial_state, "initial_state")
    if state is not None:
        state = np.asarray(state.float() if hasattr(state, "float") else state, dtype=np.float64)
        state = np.array(state, dtype=np.float64, copy=True, order="C")
    out = np.empty(_dims(v), dtype=np.float32) if len(_dims(v)) == 4 else None
    if ssm_state_indices is not None:
        initial_state = final_state = state  # the fp64 pool, updated in place
    else:
        initial_state = state
        final_state = None
        if len(_dims(q)) == 4 and len(_dims(v)) == 4:
            n = _dims(cu_seqlens)[0] - 1 if len(_dims(cu_seqlens)) == 1 else _dims(q)[0]
            kd, vd = _dims(q)[3], _dims(v)[3]
            dims = (vd, kd) if settings[1] else (kd, vd)
            final_state = np.empty((max(n, 0), _dims(v)[2], *dims), dtype=np.float64)
    tensors = (q, k, v, g, beta, out, A_log, dt_bias, cu_seqlens, initial_state, final_state,
               ssm_state_indices, num_accepted_tokens)
    _core.reference_decode(tensors, settings, int(num_threads))
    return out, final_state
