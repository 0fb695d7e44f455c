"""flash_kda.reference: the exact fp64 CPU reference on host arrays."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from . import _core
from ._forward import _error, _real


def _host(x: Any, name: str) -> Any:
    """A contiguous host array for DLPack: numpy as is (made contiguous), torch tensors detached,
    copied to the host if on a GPU (bf16 stays bf16), made contiguous; lists and tuples through
    numpy; other DLPack arrays as given (the binding judges them). None stays None; anything
    else is a flash_kda.Error naming `name`."""
    if x is None:
        return None
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x)
    if hasattr(x, "detach") and hasattr(x, "device"):  # torch.Tensor, without importing torch
        return x.detach().to("cpu").contiguous()
    if isinstance(x, (list, tuple)):
        return np.ascontiguousarray(np.asarray(x))
    if hasattr(x, "__dlpack__"):
        return x
    raise _error(name, f"expected an array (numpy array or torch tensor), got {type(x).__name__}")


def _widen_state(x: Any) -> Any:
    """bf16/fp32 initial_state -> fp64 (exact), so the fp64 final state may share its dtype, as
    the C++ validation requires of the pair. Other dtypes pass through to be rejected by name."""
    if isinstance(x, np.ndarray):
        return x.astype(np.float64) if x.dtype == np.float32 else x
    if str(getattr(x, "dtype", "")) in ("torch.bfloat16", "torch.float32"):
        return x.double()
    return x


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in getattr(x, "shape", ()))


def _flag(name: str, value: Any) -> bool:
    """A bool argument: Python or numpy bool, else a flash_kda.Error naming it."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise _error(name, f"expected a bool, got {type(value).__name__} {value!r}")


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if isinstance(value, str):
        return value  # an unknown string is named by the binding with the accepted ones
    raise _error(name, "expected one of " + ", ".join(repr(c) for c in choices) + f", got {type(value).__name__}")


def reference(
    q: Any,
    k: Any,
    v: Any,
    g: Any,
    beta: Any,
    *,
    scale: float | None = None,
    A_log: Any = None,
    dt_bias: Any = None,
    lower_bound: float = -5.0,
    gate: Literal["safe", "softplus", "none"] = "safe",
    use_qk_l2norm: bool = True,
    use_beta_sigmoid: bool = True,
    allow_neg_eigval: bool = False,
    initial_state: Any = None,
    cu_seqlens: Any = None,
    state_layout: Literal["v_first", "k_first"] = "v_first",
    output_final_state: bool = False,
    num_threads: int = 0,
    intermediate_every: int | None = None,
    intermediate_include_initial: bool = True,
    intermediate_offsets: Any = None,
) -> tuple:
    """KDA forward evaluated token by token in fp64 on the CPU (C++ flash_kda::reference_forward).

    The recurrence of docs/kda-spec.md, per sequence and value head, state S (K x V) from
    initial_state or 0:  S <- diag(exp(a_t)) S;  S <- S + b_t k_t (v_t - S^T k_t)^T;
    o_t = scale * S^T q_t.  Inputs are read as given (bf16 widened exactly) and never modified.

    Args (B batch, T tokens, H q/k heads, HV value heads (a multiple of H: GVA), N sequences):
        q, k: [B, T, H, K]; v: [B, T, HV, V]; g: [B, T, HV, K]; beta: [B, T, HV].
            bf16 (torch) or fp32; fp64 is rejected (the inputs model what the kernels read,
            and the reference computes in fp64 whatever they are). numpy arrays or torch
            tensors (CUDA tensors are copied to the host first); varlen batches use B = 1 and
            cu_seqlens.
        scale: output scale; None means K**-0.5.
        A_log: fp32 [HV] (optional for "safe" and "softplus"). dt_bias: fp32 [HV, K] or [HV*K].
        lower_bound: safe-gate floor (natural log), in [-5, 0).
        gate: "safe": a = lower_bound * sigmoid(exp(A_log) * (g + dt_bias));
            "softplus": a = -exp(A_log) * softplus(g + dt_bias); "none": a = g.
        use_qk_l2norm: L2-normalise q and k over K (eps 1e-6 inside the sqrt).
        use_beta_sigmoid: b = sigmoid(beta), else b = beta; allow_neg_eigval: b = 2 sigmoid(beta).
        initial_state: bf16, fp32 or fp64 [N, HV, V, K] ("v_first") or [N, HV, K, V]
            ("k_first"); fp64 so that a final state this function returned can start the
            next call.
        cu_seqlens: int64 or int32 [N + 1], 0 = cu[0] <= ... <= cu[N] = T.
        state_layout: layout of initial_state and of the returned final state.
        output_final_state: also return the final state.
        num_threads: worker threads over (sequence, head) pairs, >= 0; 0 = all cores.
        intermediate_every: also return the states inside each sequence every this many
            tokens (a positive multiple of 16; C++ ForwardArgs::intermediate_*): row
            offsets[n] + j is sequence n's state after j * every tokens
            (intermediate_include_initial: j = 0 is the initial state) or after (j + 1) * every
            tokens, for every j with that many tokens in the sequence and inside its range.
        intermediate_include_initial: see intermediate_every.
        intermediate_offsets: int32/int64 [N + 1], where each sequence's rows start; None: one
            row per state the sequence reaches (len // every, plus 1 with the initial state),
            packed in sequence order. fla's h is every 64 with the initial state and offsets
            cumsum(ceil(len / 64)).

    Returns:
        (out, final_state): float64 numpy arrays; out has v's shape; final_state is
        [N, HV, V, K] or [N, HV, K, V] per state_layout when output_final_state, else None.
        With intermediate_every: (out, final_state, states, offsets), states float64
        [S, HV, V, K] or [S, HV, K, V] (rows no state reaches are NaN), offsets int64 [N + 1].

    Raises:
        flash_kda.Error: an argument is invalid (a tensor that is None or not an array, a
            wrong dtype, rank or shape, bad cu_seqlens values, an unknown gate or layout, a
            flag that is not a bool, scale or lower_bound not a real number, num_threads not
            an int >= 0, ...); the message and ``.argument`` name it.
    """
    q, k, v, g, beta = (_host(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (g, "g"), (beta, "beta")))
    A_log, dt_bias = _host(A_log, "A_log"), _host(dt_bias, "dt_bias")
    initial_state, cu_seqlens = _host(initial_state, "initial_state"), _host(cu_seqlens, "cu_seqlens")
    scale = None if scale is None else _real("scale", scale)
    lower_bound = _real("lower_bound", lower_bound)
    gate = _choice("gate", gate, ("safe", "softplus", "none"))
    state_layout = _choice("state_layout", state_layout, ("v_first", "k_first"))
    flags = [_flag(n, x) for n, x in (("use_qk_l2norm", use_qk_l2norm), ("use_beta_sigmoid", use_beta_sigmoid),
                                      ("allow_neg_eigval", allow_neg_eigval),
                                      ("output_final_state", output_final_state))]
    if isinstance(num_threads, (bool, np.bool_)) or not isinstance(num_threads, (int, np.integer)):
        raise _error("num_threads", f"expected an int >= 0 (0 = all cores), got {type(num_threads).__name__}")
    if not 0 <= num_threads < (1 << 31):
        raise _error("num_threads", f"must be >= 0 (0 = all cores) and < 2^31, got {num_threads}")

    if output_final_state and initial_state is not None:
        initial_state = _widen_state(initial_state)

    out = np.empty(_shape(v), dtype=np.float64) if v is not None else None
    final_state = None
    if output_final_state and len(_shape(q)) == 4 and len(_shape(v)) == 4:
        # Sizes only; a malformed call still reaches the C++ validation for its named error.
        n = _shape(cu_seqlens)[0] - 1 if len(_shape(cu_seqlens)) == 1 else _shape(q)[0]
        hv, kdim, vdim = _shape(v)[2], _shape(q)[3], _shape(v)[3]
        dims = (vdim, kdim) if state_layout == "v_first" else (kdim, vdim)
        final_state = np.empty((max(n, 0), hv, *dims), dtype=np.float64)
    cu_seqlens_cpu = None  # cu_seqlens is already on the host: its values are checked as given

    states = offsets = None
    every = 0
    if intermediate_every is not None:
        if isinstance(intermediate_every, (bool, np.bool_)) or not isinstance(intermediate_every, (int, np.integer)):
            raise _error("intermediate_every", f"expected an int, got {type(intermediate_every).__name__}")
        every = int(intermediate_every)
        include = _flag("intermediate_include_initial", intermediate_include_initial)
        offsets = _intermediate_offsets(intermediate_offsets, q, cu_seqlens, every, include)
        if len(_shape(v)) == 4 and len(_shape(q)) == 4 and offsets.ndim == 1 and offsets.size > 0:
            hv, kdim, vdim = _shape(v)[2], _shape(q)[3], _shape(v)[3]
            dims = (vdim, kdim) if state_layout == "v_first" else (kdim, vdim)
            states = np.full((max(int(offsets[-1]), 0), hv, *dims), np.nan)
        else:  # malformed: the C++ validation names the argument
            states = np.zeros((0,))
    elif intermediate_offsets is not None:
        raise _error("intermediate_offsets", "is given without intermediate_every")
    tensors = (q, k, v, g, beta, out, A_log, dt_bias, cu_seqlens, initial_state, final_state, cu_seqlens_cpu,
               None,  # ssm_state_indices
               states, offsets)
    _core.reference_forward(tensors, scale, lower_bound, gate, state_layout, *flags[:3],
                            int(num_threads), every,
                            bool(intermediate_include_initial) if intermediate_every is not None else True)
    if intermediate_every is not None:
        return out, final_state, states, offsets
    return out, final_state


def _intermediate_offsets(given: Any, q: Any, cu_seqlens: Any, every: int, include_initial: bool) -> np.ndarray:
    """The offsets of reference()'s intermediate states: `given` on the host, or one row per state
    each sequence reaches, from its length (cu_seqlens, else B sequences of q's T tokens)."""
    if given is not None:
        return np.ascontiguousarray(np.asarray(_host(given, "intermediate_offsets")))
    if every <= 0 or every % 16:
        raise _error("intermediate_every", f"expected a positive multiple of 16 (tokens between intermediate "
                     f"states), got {every}")
    if cu_seqlens is not None:
        lens = np.diff(np.asarray(cu_seqlens).astype(np.int64))
    else:
        shape = _shape(q)
        lens = np.full(shape[0] if len(shape) == 4 else 0, shape[1] if len(shape) == 4 else 0, dtype=np.int64)
    counts = np.maximum(lens, 0) // every + (1 if include_initial else 0)
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
