"""The two timed implementations as zero-argument callables on one case's inputs.

flash_kda: for FlashKDA's configuration through fwd (Case.plain) `flash_kda.fwd` writing
preallocated out / final_state (no allocation per call, so the call is capturable); for every
other variant, and for FlashKDA's configuration with --entry chunk_kda (Case.entry),
`flash_kda.chunk_kda`, with the same keyword arguments as fla's. fla: `fla.ops.kda.chunk_kda`
with the case's configuration (chunk_kda_kwargs: the gate, the state layout, the three
*_in_kernel flags as the gate needs them) forced onto its Triton path with FLA_FLASH_KDA=0, the
switch of fla's "flash_kda" backend (which flash_kda's own backend replaces, _fla_chunk.py; fla's
registry reads it on every dispatch, see fla/backends.py BaseBackend.is_enabled), so that it
does not dispatch back to flash_kda.
"""

from __future__ import annotations

import contextlib
import os
from typing import Callable, Iterator

from .inputs import Inputs

FLA_ENV = "FLA_FLASH_KDA"


@contextlib.contextmanager
def env_switch(name: str, enabled: bool) -> Iterator[None]:
    """Set the environment variable `name` to "1"/"0" for the block, then restore it (fla's
    backend registry reads its switches at every dispatch)."""
    old = os.environ.get(name)
    os.environ[name] = "1" if enabled else "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def fla_flash_kda_backend(enabled: bool):
    """FLA_FLASH_KDA set to "1"/"0" for the block (fla dispatches chunk_kda by it), then restored."""
    return env_switch(FLA_ENV, enabled)


@contextlib.contextmanager
def count_calls(owner, name: str) -> Iterator[list[int]]:
    """Count calls of owner.<name> in the block (replaced by a counting wrapper, restored after).

    Yields a one-element list holding the count, so callers can tell which path fla took
    (fla's backends look flash_kda's functions up at call time)."""
    real = getattr(owner, name)
    calls = [0]

    def counted(*a, **kw):
        calls[0] += 1
        return real(*a, **kw)

    setattr(owner, name, counted)
    try:
        yield calls
    finally:
        setattr(owner, name, real)


def count_flash_kda_calls():
    """count_calls of flash_kda.chunk_kda, what fla's chunk_kda backend calls (flash_kda/_fla_chunk.py)."""
    import flash_kda

    return count_calls(flash_kda, "chunk_kda")


def chunk_kda_kwargs(x: Inputs) -> dict:
    """fla 0.6.0 chunk_kda keyword arguments of Inputs x for its case's variant (the safe gate
    for Inputs without a case): q/k/v/g/beta and scale; initial_state with
    output_final_state; use_qk_l2norm_in_kernel and use_beta_sigmoid_in_kernel on;
    use_gate_in_kernel with A_log and dt_bias (flat [HV*K]) for the safe and softplus gates,
    off for the pre-computed one; safe_gate and lower_bound for the safe gate; state_v_first
    per the case's layout; cu_seqlens and its host copy."""
    case = x.case
    gate = "safe" if case is None else case.gate
    kw = dict(q=x.q, k=x.k, v=x.v, g=x.g, beta=x.beta, scale=x.scale,
              initial_state=x.initial_state, output_final_state=x.initial_state is not None,
              use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
              use_gate_in_kernel=gate != "pre", safe_gate=gate == "safe",
              lower_bound=x.lower_bound if gate == "safe" else None,
              state_v_first=case is None or case.state_layout == "v_first",
              cu_seqlens=x.cu_seqlens, cu_seqlens_cpu=x.cu_seqlens_cpu)
    if gate != "pre":
        kw.update(A_log=x.A_log, dt_bias=x.dt_bias.reshape(-1))  # fla takes dt_bias flat [HV*K]
    return kw


def flash_kda_fn(x: Inputs, num_sms: int | None = None) -> tuple[Callable[[], None], Callable[[], tuple]]:
    """(call, outputs): call() runs flash_kda on Inputs x; outputs() returns (out, final_state)
    of the latest call (final_state None without a state). With num_sms, the launch plan is
    told that many SMs (bench --num-sms: a green context).

    FlashKDA's configuration (x.case.plain, or no case) calls flash_kda.fwd writing out and
    final_state in place; they start as NaN (not torch.empty_like), so that an element the
    first, checked call fails to write cannot pass the check on stale memory that happens to
    hold a previous case's result. Other variants, and x.case.entry "chunk_kda", call
    flash_kda.chunk_kda with fla's keyword arguments (chunk_kda_kwargs), which allocates its
    outputs as fla's does (an fp32 final state).

    Raises:
        ValueError: a case chunk_kda cannot express (a bf16 final state with another gate,
            layout, strided inputs or the chunk_kda entry).
    """
    import torch
    import flash_kda

    extra = {} if num_sms is None else {"launch_options": flash_kda.LaunchOptions(num_sms=num_sms)}
    if x.case is None or x.case.plain:
        out = torch.full_like(x.v, float("nan"))
        final = torch.full_like(x.initial_state, float("nan")) if x.initial_state is not None else None

        def call() -> None:
            flash_kda.fwd(x.q, x.k, x.v, x.g, x.beta, x.scale, out, x.A_log, x.dt_bias, x.lower_bound,
                          initial_state=x.initial_state, final_state=final, cu_seqlens=x.cu_seqlens, **extra)

        return call, lambda: (out, final)
    if x.case.final_state_dtype not in ("fp32", "none"):
        raise ValueError(f"{x.case.name}: chunk_kda returns an fp32 final state (as fla's); "
                         f"a {x.case.final_state_dtype} final state needs FlashKDA's configuration through fwd")
    kw = chunk_kda_kwargs(x)
    latest: list = [None, None]

    def call() -> None:
        latest[:] = flash_kda.chunk_kda(**kw, **extra)[:2]

    return call, lambda: tuple(latest)


def fla_fn(x: Inputs) -> tuple[Callable[[], None], dict]:
    """(call, result): call() runs fla chunk_kda (Triton path) with chunk_kda_kwargs(x) and
    stores its (out, final_state) in result["out"], result["final_state"]. fla requires an
    fp32 initial state, so a bf16 state is widened once here (outside the timed call); its
    final state is fp32 whatever the case's state dtype (check.check_case rounds it to that
    dtype before judging), so with bf16 states fla moves fp32 states and its time is not
    like-for-like with ours.
    """
    import torch
    from fla.ops.kda import chunk_kda

    kw = chunk_kda_kwargs(x)
    if kw["initial_state"] is not None:
        kw["initial_state"] = kw["initial_state"].to(torch.float32)
    result: dict = {}

    def call() -> None:
        with fla_flash_kda_backend(False):
            o, ht = chunk_kda(**kw)
        result["out"], result["final_state"] = o, ht

    return call, result
