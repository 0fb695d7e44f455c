"""The two timed implementations as zero-argument callables on one case's inputs.

flash_kda: `flash_kda.fwd` writing preallocated out / final_state (no allocation per call,
so the call is capturable). fla: `fla.ops.kda.chunk_kda` with FlashKDA's configuration (safe
gate, the three *_in_kernel flags, state_v_first=True) forced onto its Triton path with
FLA_FLASH_KDA=0 (fla's backend registry reads the variable on every dispatch, see
fla/backends.py BaseBackend.is_enabled), so that it does not dispatch back to flash_kda.
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


def flash_kda_fn(x: Inputs, num_sms: int | None = None) -> tuple[Callable[[], None], object, object | None]:
    """(call, out, final_state): call() runs flash_kda.fwd writing out/final_state in place;
    with num_sms, its launch plan is told that many SMs (bench --num-sms: a green context).

    out and final_state start as NaN (not torch.empty_like), so that an element the first,
    checked call fails to write cannot pass the check on stale memory that happens to hold a
    previous case's result.
    """
    import torch
    import flash_kda

    out = torch.full_like(x.v, float("nan"))
    final = torch.full_like(x.initial_state, float("nan")) if x.initial_state is not None else None
    extra = {} if num_sms is None else {"launch_options": flash_kda.LaunchOptions(num_sms=num_sms)}

    def call() -> None:
        flash_kda.fwd(x.q, x.k, x.v, x.g, x.beta, x.scale, out, x.A_log, x.dt_bias, x.lower_bound,
                      initial_state=x.initial_state, final_state=final, cu_seqlens=x.cu_seqlens, **extra)

    return call, out, final


def fla_fn(x: Inputs) -> tuple[Callable[[], None], dict]:
    """(call, result): call() runs fla chunk_kda (Triton path) and stores its (out, final_state)
    in result["out"], result["final_state"]. fla requires an fp32 initial state, so a bf16
    state is widened once here (outside the timed call); its final state is fp32 whatever
    the case's state dtype (check.check_case rounds it to that dtype before judging), so with
    --state bf16 fla moves fp32 states and its time is not like-for-like with ours.
    """
    import torch
    from fla.ops.kda import chunk_kda

    h0 = x.initial_state.to(torch.float32) if x.initial_state is not None else None
    dt_bias = x.dt_bias.reshape(-1)  # fla takes dt_bias flat [HV*K]
    result: dict = {}

    def call() -> None:
        with fla_flash_kda_backend(False):
            o, ht = chunk_kda(
                q=x.q, k=x.k, v=x.v, g=x.g, beta=x.beta, scale=x.scale,
                initial_state=h0, output_final_state=h0 is not None,
                use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                safe_gate=True, lower_bound=x.lower_bound, state_v_first=True,
                cu_seqlens=x.cu_seqlens, cu_seqlens_cpu=x.cu_seqlens_cpu,
                A_log=x.A_log, dt_bias=dt_bias,
            )
        result["out"], result["final_state"] = o, ht

    return call, result
