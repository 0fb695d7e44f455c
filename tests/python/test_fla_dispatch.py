"""flash-linear-attention's chunk_kda dispatches to flash_kda under torch.inference_mode() (the
backend flash_kda registers in place of fla's built-in one, flash_kda/_fla_chunk.py), and what
comes back matches the fp64 reference: relative Frobenius error of out and of the final state
<= 1e-2 (the issue-3 bound). More cases: test_chunk_fla_dispatch.py.

Dispatch is proved twice: a spy wrapped around flash_kda.chunk_kda (the backend looks it up at
call time) must see exactly one call, and fla's backend logger must report '-> flash_kda'.
"""
from __future__ import annotations

import logging

import numpy as np
import pytest

import flash_kda

pytestmark = pytest.mark.cuda_sm90

TOL = 1e-2
K = V = 128
LOWER_BOUND = -5.0


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _rel(x, ref):
    return float(np.linalg.norm((x - ref).ravel()) / np.linalg.norm(ref.ravel()))


@pytest.mark.parametrize("varlen", [False, True], ids=["fixed", "varlen"])
def test_chunk_kda_dispatches_to_flash_kda(cuda_sm90, monkeypatch, varlen):
    torch = pytest.importorskip("torch")
    pytest.importorskip("fla", reason="flash-linear-attention is not installed")
    backends = pytest.importorskip("fla.backends")
    from fla.ops.kda import chunk_kda

    dev = cuda_sm90
    gen = torch.Generator(device="cpu").manual_seed(int(np.random.SeedSequence().entropy % 2**31))
    H = 4
    if varlen:
        lens = [37, 1, 200, 0, 64]
        cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int64, device=dev)
        B, T, N = 1, int(sum(lens)), len(lens)
    else:
        cu = None
        B, T = 2, 150
        N = B

    def randn(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen)).to(dev)

    q = randn(B, T, H, K).bfloat16()
    k = randn(B, T, H, K).bfloat16()
    v = randn(B, T, H, V).bfloat16()
    g = randn(B, T, H, K).bfloat16()
    beta = randn(B, T, H).bfloat16()
    A_log = torch.log(torch.empty(H).uniform_(1.0, 16.0, generator=gen)).to(dev)
    dt_bias = randn(H * K, scale=0.1)  # fla's layout: flat [HV * K]
    h0 = randn(N, H, V, K, scale=0.5)  # fp32, v-first; fla returns an fp32 final state

    calls = []
    real_chunk_kda = flash_kda.chunk_kda

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real_chunk_kda(*args, **kwargs)

    monkeypatch.setattr(flash_kda, "chunk_kda", spy)
    # fla logs each dispatch once per process: forget earlier ones so this call is logged.
    for registry in backends._function_registries.values():
        registry._logged.clear()
    fla_logger = logging.getLogger("fla.backends")
    collect = _Collect()
    fla_logger.addHandler(collect)
    old_level = fla_logger.level
    fla_logger.setLevel(logging.INFO)  # setLevel, not the attribute: it also clears logging's cache
    try:
        with torch.inference_mode():
            out, final = chunk_kda(
                q, k, v, g, beta, initial_state=h0, output_final_state=True,
                use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                safe_gate=True, lower_bound=LOWER_BOUND, state_v_first=True, cu_seqlens=cu,
                A_log=A_log, dt_bias=dt_bias)
        torch.cuda.synchronize(dev)
    finally:
        fla_logger.setLevel(old_level)
        fla_logger.removeHandler(collect)

    assert len(calls) == 1, "chunk_kda did not dispatch to flash_kda.chunk_kda"
    assert any("-> flash_kda" in m and "rejected" not in m for m in collect.messages), collect.messages

    ref_out, ref_final = flash_kda.reference(
        q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias.view(H, K), lower_bound=LOWER_BOUND, gate="safe",
        initial_state=h0, cu_seqlens=cu, state_layout="v_first", output_final_state=True)
    got_out = out.float().cpu().numpy()
    got_final = final.float().cpu().numpy()
    assert got_out.shape == ref_out.shape and got_final.shape == ref_final.shape
    assert np.isfinite(got_out).all() and np.isfinite(got_final).all()
    assert _rel(got_out, ref_out) <= TOL
    assert _rel(got_final, ref_final) <= TOL
