"""fla 0.6.0's own chunk_kda dispatches to flash_kda.chunk_kda (the backend of
flash_kda/_fla_chunk.py, in place of fla's built-in FlashKDA backend) for every call flash_kda
serves, and falls back to fla's Triton path, still answering, for the calls it does not.

For each served case (every case of chunk_cases.CASES but fla's graph padding: each gate, the
safe gate without A_log, GVA, k-first, mixed state dtypes, strided views, beta given,
allow_neg_eigval, no fused L2 norm, varlen) and for fla's intermediate states
(return_intermediate_states): a spy
on flash_kda.chunk_kda sees exactly one call, fla's backend logger reports '-> flash_kda', and
out / final state match the fp64 reference (relative Frobenius error <= 1e-2) and are no worse
than twice fla's own Triton result on the same inputs (+2e-3). For an unservable call (K = 64;
fp32 q, k, v; a training call without FLA_FLASH_KDA_TRAIN=1) fla logs the rejection and runs its
own path: its result, which matches the reference, or (fp32 q, k, v, which fla's own kernels
cannot run on the H200) its own error, never a flash_kda.Error. A training call (grad enabled) with
FLA_FLASH_KDA_TRAIN=1 dispatches to flash_kda's forward and backward: its gradients are within the bound of fla's own.
"""
from __future__ import annotations

import inspect
import logging
import re

import pytest

import flash_kda
from chunk_cases import CASES, ChunkCase, make_call, reference, rel_err
from test_chunk_accuracy import fla_triton

pytestmark = pytest.mark.cuda_sm90

BOUND = 1e-2
# use_graph_padded leaves its padding rows undefined, as fla does: no like-for-like comparison.
SERVED = [c for c in CASES if c.graph_pad == 0]


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def fla_chunk_kda(monkeypatch):
    """fla's dispatched chunk_kda, its Triton function, the spy's calls and fla's log."""
    pytest.importorskip("fla", reason="flash-linear-attention is not installed")
    backends = pytest.importorskip("fla.backends")
    from fla.ops.kda import chunk_kda

    from flash_kda import _fla_chunk

    # One Triton configuration per fla kernel, as the accuracy grids: autotuning every flag
    # family of the cases would take minutes each (the dispatch does not depend on it).
    fla_triton()

    assert _fla_chunk.status == "registered", _fla_chunk.status
    registry = backends._function_registries[inspect.unwrap(chunk_kda)]
    assert type(registry._backends["flash_kda"]).__name__ == "FlashKDAChunkBackend"  # the built-in is gone
    for r in backends._function_registries.values():
        r._logged.clear()  # fla logs each dispatch once per process
    calls = []
    real = flash_kda.chunk_kda

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(flash_kda, "chunk_kda", spy)
    logger = logging.getLogger("fla.backends")
    collect = _Collect()
    logger.addHandler(collect)
    old = logger.level
    logger.setLevel(logging.INFO)
    yield chunk_kda, inspect.unwrap(chunk_kda), calls, collect.messages
    logger.setLevel(old)
    logger.removeHandler(collect)


def _fla_inputs(kw):
    """fla's Triton path asserts an fp32 initial_state: the same values in fp32."""
    kw = dict(kw)
    if "initial_state" in kw:
        kw["initial_state"] = kw["initial_state"].float()
    return kw


@pytest.mark.parametrize("case", SERVED, ids=[c.name for c in SERVED])
def test_fla_dispatches_to_flash_kda(cuda_sm90, fla_chunk_kda, case):
    import torch

    chunk_kda, triton, calls, log = fla_chunk_kda
    args, kw, real = make_call(case, cuda_sm90)
    with torch.inference_mode():
        out, final = chunk_kda(*args, **kw)
        fla_out, fla_final = triton(*args, **_fla_inputs(kw))
    torch.cuda.synchronize(cuda_sm90)
    assert len(calls) == 1, f"fla did not dispatch to flash_kda: {log}"
    assert any(m.endswith("chunk_kda -> flash_kda") for m in log), log

    ref_o, ref_s = reference(args, kw, real)
    err = rel_err(out, ref_o), rel_err(final, ref_s)
    fla_err = rel_err(fla_out, ref_o), rel_err(fla_final, ref_s)
    where = f"{case.name}: flash_kda {err[0]:.2e} / {err[1]:.2e}, fla {fla_err[0]:.2e} / {fla_err[1]:.2e}"
    assert max(err) <= BOUND, where
    assert err[0] <= 2 * fla_err[0] + 2e-3 and err[1] <= 2 * fla_err[1] + 2e-3, where


def test_unservable_call_falls_back_to_fla(cuda_sm90, fla_chunk_kda):
    import torch

    chunk_kda, _, calls, log = fla_chunk_kda
    args, kw, real = make_call(ChunkCase("k64", k_dim=64), cuda_sm90)
    with torch.inference_mode():
        out, final = chunk_kda(*args, **kw)
    torch.cuda.synchronize(cuda_sm90)
    assert calls == []
    assert any("-> flash_kda rejected" in m and "K = 64" in m for m in log), log
    ref_o, ref_s = reference(args, kw, real)
    assert rel_err(out, ref_o) <= BOUND and rel_err(final, ref_s) <= BOUND


def test_intermediate_states_dispatch_to_flash_kda(cuda_sm90, fla_chunk_kda):
    import torch

    chunk_kda, triton, calls, log = fla_chunk_kda
    case = ChunkCase("intermediate_varlen", lens=(70, 0, 1, 130))
    args, kw, real = make_call(case, cuda_sm90)
    with torch.inference_mode():  # fla asserts it for intermediate states
        out, final, h = chunk_kda(*args, **kw, return_intermediate_states=True)
        fla_out, fla_final, fla_h = triton(*args, **_fla_inputs(kw), return_intermediate_states=True)
    torch.cuda.synchronize(cuda_sm90)
    assert len(calls) == 1, f"fla did not dispatch to flash_kda: {log}"
    assert any(m.endswith("chunk_kda -> flash_kda") for m in log), log
    assert h.shape == fla_h.shape and h.dtype == fla_h.dtype
    ref_o, ref_s = reference(args, kw, real)
    assert rel_err(out, ref_o) <= BOUND and rel_err(final, ref_s) <= BOUND
    diff = rel_err(h, fla_h.double().cpu().numpy())
    assert diff <= 2e-2, f"intermediate states vs fla's: {diff:.2e}"


def test_fp32_inputs_fall_back_to_fla(cuda_sm90, fla_chunk_kda):
    """flash_kda declines fp32 q, k, v (its kernels take bf16) and fla's own path runs: its
    result where fla serves the call, fla's own error where it cannot (on the H200 fla 0.6.0's
    Triton kernels need more shared memory than there is for fp32 inputs); never a
    flash_kda.Error."""
    import torch

    import flash_kda

    chunk_kda, triton, calls, log = fla_chunk_kda
    args, kw, real = make_call(CASES[0], cuda_sm90)
    args = tuple(a.float() for a in args)
    with torch.inference_mode():
        try:
            triton(*args, **_fla_inputs(kw))
            fla_err = None
        except Exception as err:  # noqa: BLE001 (fla's own limit, whatever it raises)
            fla_err = err
        if fla_err is None:
            out, final = chunk_kda(*args, **kw)
        else:
            first = str(fla_err).splitlines()[0] if str(fla_err) else ""
            with pytest.raises(type(fla_err), match=re.escape(first)) as raised:
                chunk_kda(*args, **kw)
            assert not isinstance(raised.value, flash_kda.Error), raised.value
    torch.cuda.synchronize(cuda_sm90)
    assert calls == []
    assert any("-> flash_kda rejected" in m for m in log), log
    if fla_err is None:
        ref_o, ref_s = reference(args, kw, real)
        assert rel_err(out, ref_o) <= BOUND and rel_err(final, ref_s) <= BOUND


def _train_step(fn, args, kw, seed=1):
    """(out, gradients of q, k, v, g, beta) of one forward + backward through fn with a fixed
    random d_out."""
    import torch

    leaves = [a.clone().requires_grad_() for a in args]
    out, _ = fn(*leaves, **kw)
    d_out = torch.randn(out.shape, generator=torch.Generator(out.device).manual_seed(seed), device=out.device,
                        dtype=out.dtype)
    grads = torch.autograd.grad(out, leaves, d_out)
    return out.detach(), grads


def test_training_call_dispatches_to_flash_kda(cuda_sm90, fla_chunk_kda, monkeypatch):
    chunk_kda, triton, calls, log = fla_chunk_kda
    args, kw, real = make_call(CASES[0], cuda_sm90)
    monkeypatch.setenv("FLA_FLASH_KDA_TRAIN", "1")
    out, grads = _train_step(chunk_kda, args, kw)
    assert len(calls) == 1 and any(m.endswith("chunk_kda -> flash_kda") for m in log), log
    ref_o, _ = reference(args, kw, real)
    assert rel_err(out, ref_o) <= BOUND
    _, fla_grads = _train_step(triton, args, _fla_inputs(kw))
    for name, ours, theirs in zip(("dq", "dk", "dv", "dg", "dbeta"), grads, fla_grads):
        diff = rel_err(ours, theirs.double().cpu().numpy())
        assert diff <= 5e-2, f"{name}: flash_kda vs fla's Triton gradient {diff:.2e}"


def test_training_call_falls_back_to_fla_when_switched_off(cuda_sm90, fla_chunk_kda, monkeypatch):
    import torch

    chunk_kda, _, calls, log = fla_chunk_kda
    monkeypatch.setenv("FLA_FLASH_KDA_TRAIN", "0")
    args, kw, real = make_call(CASES[0], cuda_sm90)
    out, grads = _train_step(chunk_kda, args, kw)
    assert calls == []
    assert any("-> flash_kda rejected" in m and "FLA_FLASH_KDA_TRAIN=1 turns them on" in m for m in log), log
    ref_o, _ = reference(args, kw, real)
    assert rel_err(out, ref_o) <= BOUND
    assert all(torch.isfinite(g).all() for g in grads)
