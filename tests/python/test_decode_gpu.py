"""flash_kda.fused_recurrent_kda_fwd on an sm_90 GPU against the fp64 reference
(flash_kda.reference_decode) and against fla's own Triton fused_recurrent_kda_fwd on the same
inputs: T = 1..16, every gate, both pool dtypes, padded slots (-1) and accepted-token counts
mixed in one batch, [N] and [N, T] indices, varlen, GVA, k-first and v-first, strided views of
a fused projection. Ours must be within the accuracy contract (relative Frobenius error <=
1e-2) and at most fla's error (2% slack for rounding noise between two fp32 evaluations) where
fla runs. Also: named errors, CUDA-graph capture, torch.compile(fullgraph=True) through the
torch.library op, and fla's dispatch to flash_kda (and its fallback for calls we reject).
"""
from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest

import flash_kda

pytestmark = pytest.mark.cuda_sm90


@pytest.fixture(autouse=True, params=["persistent", "direct"])
def decode_kernel(request, monkeypatch):
    """Every test of this file runs on both decode kernels: a call without launch_options
    (fla's dispatch included) runs the one forced here; torch.compile's traced op keeps the
    plan's choice."""
    from flash_kda import _decode

    forced = int(_decode._KERNELS[request.param])
    real = _decode._kernel_value
    monkeypatch.setattr(_decode, "_kernel_value", lambda o: forced if o is None else real(o))
    return request.param

K = V = 128
BOUND = 1e-2
FLA_SLACK = 1.02
# fp32's unit roundoff: an fp32 pool's error against fp64 is a few of these for ours and fla's
# alike (they differ only in the order of fp32 sums), so "at most fla's" holds to within it.
FP32_ROUNDOFF = 2.0 ** -24
GATES = {
    "safe": dict(use_gate_in_kernel=True, lower_bound=-5.0),
    "softplus": dict(use_gate_in_kernel=True, lower_bound=None),
    "none": dict(use_gate_in_kernel=False, lower_bound=None),
}


def _rel(x, ref):
    import torch

    ref = ref.to(torch.float64)
    den = torch.linalg.vector_norm(ref).item()
    num = torch.linalg.vector_norm(x.to(device=ref.device, dtype=torch.float64) - ref).item()
    return num / den if den else num


@contextlib.contextmanager
def _fla_dispatch(enabled: bool | None):
    """FLA_FLASH_KDA_DECODE "1" (True), "0" (False) or unset (None: the default scope)."""
    old = os.environ.get("FLA_FLASH_KDA_DECODE")
    if enabled is None:
        os.environ.pop("FLA_FLASH_KDA_DECODE", None)
    else:
        os.environ["FLA_FLASH_KDA_DECODE"] = "1" if enabled else "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("FLA_FLASH_KDA_DECODE", None)
        else:
            os.environ["FLA_FLASH_KDA_DECODE"] = old


def _fla_fwd():
    try:
        from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd
    except Exception:  # noqa: BLE001
        return None
    return fused_recurrent_kda_fwd


def _problem(dev, *, N, T, H=2, HV=2, gate="safe", state=None, v_first=True, index_mode="tokens",
             padded=(), accepted=False, strided=False, act_dtype=None, seed=0):
    """Keywords of one call (initial_state = the pool, not yet cloned) and the valid sequences.

    index_mode: "tokens" ([N, T] indices into N * T + 3 slots), "seqs" ([N] into N + 3),
    "none" (no pool: [N, HV, ...] initial state, inplace). padded: sequences given slot -1.
    strided: q, k, v as views of one fused [N, T, 2H*K + HV*V] projection.
    """
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    act = act_dtype or torch.bfloat16
    state = state or torch.float32

    def randn(*shape, scale=1.0, dtype=act):
        return (scale * torch.randn(*shape, generator=gen)).to(dev, dtype)

    if strided:
        fused = randn(N, T, 2 * H * K + HV * V)
        q = fused[..., : H * K].unflatten(-1, (H, K))
        k = fused[..., H * K: 2 * H * K].unflatten(-1, (H, K))
        v = fused[..., 2 * H * K:].unflatten(-1, (HV, V))
    else:
        q, k, v = randn(N, T, H, K), randn(N, T, H, K), randn(N, T, HV, V)
    g = randn(N, T, HV, K)
    if gate == "none":
        g = (-0.5 * torch.rand(N, T, HV, K, generator=gen)).to(dev, act)
    kw = dict(q=q, k=k, v=v, g=g, beta=randn(N, T, HV), scale=None, state_v_first=v_first,
              use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, **GATES[gate])
    if gate != "none":
        kw["A_log"] = torch.log(torch.empty(HV).uniform_(1.0, 8.0, generator=gen)).to(dev)
        kw["dt_bias"] = randn(HV * K, scale=0.1, dtype=torch.float32)
    dims = (V, K) if v_first else (K, V)
    if index_mode == "none":
        kw["initial_state"] = randn(N, HV, *dims, scale=0.5, dtype=state)
        return kw, list(range(N))
    width = T if index_mode == "tokens" else 1
    P = N * width + 3
    perm = torch.randperm(P, generator=gen)[: N * width].view(N, width)
    for n in padded:
        perm[n] = -1
    kw["initial_state"] = randn(P, HV, *dims, scale=0.5, dtype=state)
    kw["ssm_state_indices"] = (perm if index_mode == "tokens" else perm[:, 0]).to(dev, torch.int32)
    if accepted:
        kw["num_accepted_tokens"] = torch.randint(1, T + 1, (N,), generator=gen).to(dev, torch.int32)
    return kw, [n for n in range(N) if n not in padded]


def _k64(kw):
    """The call with K = 64 throughout (q, k, g, dt_bias, a zero v-first pool of the same slots)."""
    import torch

    hv = kw["v"].shape[2]
    return dict(kw, q=kw["q"][..., :64].contiguous(), k=kw["k"][..., :64].contiguous(),
                g=kw["g"][..., :64].contiguous(), dt_bias=kw["dt_bias"].view(hv, K)[:, :64].contiguous(),
                initial_state=torch.zeros(kw["initial_state"].shape[0], hv, V, 64, device=kw["q"].device))


def _reference(kw):
    ref_kw = {k: v for k, v in kw.items() if k not in ("out", "inplace_final_state", "output_final_state")}
    out, state = flash_kda.reference_decode(**ref_kw)
    import torch

    dev = kw["q"].device
    return torch.from_numpy(out).to(dev), torch.from_numpy(state).to(dev)


def _ours(kw):
    import torch

    call = dict(kw, initial_state=kw["initial_state"].clone())
    with torch.inference_mode():
        out, final = flash_kda.fused_recurrent_kda_fwd(**call)
    assert final is call["initial_state"]  # in place: the pool itself comes back
    return out, final


def _fla(kw, valid):
    """fla's out and pool on the valid sequences alone (fla reads slot -1 of a padded one)."""
    import torch

    fla_fwd = _fla_fwd()
    if fla_fwd is None:
        return None
    sel = torch.tensor(valid, device=kw["q"].device)
    call = dict(kw, initial_state=kw["initial_state"].clone())
    for name in ("q", "k", "v", "g", "beta", "ssm_state_indices", "num_accepted_tokens"):
        if call.get(name) is not None:
            call[name] = call[name][sel]
    with torch.inference_mode(), _fla_dispatch(False):
        out, final = fla_fwd(**call)
    return out, final, sel


def _check(kw, valid, *, compare_fla=True):
    """Ours vs the reference (and fla's error on the same sequences); returns the errors."""
    import torch

    ref_out, ref_pool = _reference(kw)
    out, pool = _ours(kw)
    torch.cuda.synchronize()
    sel = torch.tensor(valid, device=out.device, dtype=torch.int64)
    pad = [n for n in range(out.shape[0]) if n not in valid]
    if pad:
        assert torch.all(out[pad] == 0)
    e_out, e_state = _rel(out[sel], ref_out[sel]), _rel(pool, ref_pool)
    assert e_out <= BOUND and e_state <= BOUND, (e_out, e_state)
    if "ssm_state_indices" in kw:  # slots no sequence owns are bit-identical to before
        owned = kw["ssm_state_indices"][sel].flatten()
        untouched = torch.ones(pool.shape[0], dtype=torch.bool, device=pool.device)
        untouched[owned[owned >= 0].long()] = False
        assert torch.equal(pool[untouched], kw["initial_state"][untouched])
    result = {"out": e_out, "state": e_state}
    if compare_fla and (fla := _fla(kw, valid)) is not None:
        f_out, f_pool, _ = fla
        result["fla_out"] = _rel(f_out, ref_out[sel])
        result["fla_state"] = _rel(f_pool, ref_pool)
        assert e_out <= FLA_SLACK * result["fla_out"] + 1e-7, result
        assert e_state <= FLA_SLACK * result["fla_state"] + FP32_ROUNDOFF, result
    return result


@pytest.mark.parametrize("gate", sorted(GATES))
@pytest.mark.parametrize("state", ["fp32", "bf16"])
def test_every_T_mixed_batch(cuda_sm90, gate, state):
    """T = 1..16 with [N, T] indices, accepted counts and padded slots in one batch."""
    import torch

    dtype = torch.float32 if state == "fp32" else torch.bfloat16
    for T in range(1, 17):
        kw, valid = _problem(cuda_sm90, N=6, T=T, gate=gate, state=dtype, padded=(1, 4), accepted=True, seed=T)
        _check(kw, valid)


@pytest.mark.parametrize("v_first", [True, False], ids=["v_first", "k_first"])
@pytest.mark.parametrize("index_mode", ["tokens", "seqs", "none"])
def test_layouts_and_index_forms(cuda_sm90, v_first, index_mode):
    for T in (1, 3, 16):
        kw, valid = _problem(cuda_sm90, N=5, T=T, v_first=v_first, index_mode=index_mode,
                             padded=(2,) if index_mode != "none" else ())
        # fla's [N] indices with T > 1 write token t's state to idx[n + t]: not comparable.
        _check(kw, valid, compare_fla=not (index_mode == "seqs" and T > 1))


@pytest.mark.parametrize("state", ["fp32", "bf16"])
@pytest.mark.parametrize("v_first", [True, False], ids=["v_first", "k_first"])
def test_persistent_grid_many_items_per_block(cuda_sm90, state, v_first):
    """More work items than resident blocks (N = 263, an odd prime, x 8 heads x 4 column slices
    = 8416 items over <= 528 blocks), so each block computes 16 or more items with the next
    ones' copies in flight (1 behind for fp32 pools, 2 for bf16), padded slots among them."""
    import torch

    dtype = torch.float32 if state == "fp32" else torch.bfloat16
    for T, index_mode in ((1, "seqs"), (2, "tokens")):
        kw, valid = _problem(cuda_sm90, N=263, T=T, H=8, HV=8, state=dtype, v_first=v_first,
                             index_mode=index_mode, padded=(0, 131, 262), accepted=index_mode == "tokens",
                             seed=7 + T)
        _check(kw, valid)


def test_gva_strided_views_and_fp32_inputs(cuda_sm90):
    import torch

    kw, valid = _problem(cuda_sm90, N=4, T=4, H=2, HV=8, strided=True, padded=(0,))
    assert not kw["q"].is_contiguous()
    _check(kw, valid)
    kw, valid = _problem(cuda_sm90, N=3, T=2, H=1, HV=4, act_dtype=torch.float32, accepted=True)
    _check(kw, valid)


@pytest.mark.parametrize("state", ["fp32", "bf16"])
def test_one_token_gva_strided_views_and_fp32_inputs(cuda_sm90, state):
    """Fixed length T = 1 runs its own direct kernels (a bf16 pool: 16 rows a warp, kept as the
    loaded bf16 vectors): GVA, strided views, fp32 inputs and padded slots through them."""
    import torch

    dtype = torch.float32 if state == "fp32" else torch.bfloat16
    kw, valid = _problem(cuda_sm90, N=5, T=1, H=2, HV=8, state=dtype, strided=True, padded=(1,))
    assert not kw["q"].is_contiguous()
    _check(kw, valid)
    kw, valid = _problem(cuda_sm90, N=3, T=1, H=1, HV=4, state=dtype, act_dtype=torch.float32, accepted=True)
    _check(kw, valid)


@pytest.mark.parametrize("v_first", [True, False], ids=["v_first", "k_first"])
@pytest.mark.parametrize("T", [1, 3])
@pytest.mark.parametrize("N", [2, 17], ids=["narrow", "wide"])
def test_direct_tile_forms_of_a_bf16_pool(cuda_sm90, v_first, T, N):
    """A bf16 pool takes 8-row (column) warp tiles on few heads (N = 2 x 8: 16 heads) and wide
    ones of 16 from 132 heads on 132 SMs (N = 17 x 8: 136): packed for T = 1, split (half of
    the fp32 state in shared memory) for T = 3; each in both layouts, GVA and padded slots."""
    import torch

    kw, valid = _problem(cuda_sm90, N=N, T=T, H=4, HV=8, state=torch.bfloat16, v_first=v_first,
                         index_mode="tokens" if T > 1 else "seqs", padded=(1,), accepted=T > 1, seed=31 + N + T)
    _check(kw, valid)


def test_varlen_without_pool(cuda_sm90):
    import torch

    lens = [1, 3, 0, 16, 2, 41]  # varlen sequences may be longer than 16 tokens
    dev = cuda_sm90
    kw, _ = _problem(dev, N=1, T=sum(lens), HV=4, index_mode="none")
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int64, device=dev)
    kw["initial_state"] = torch.randn(len(lens), 4, V, K, device=dev) * 0.5
    kw["cu_seqlens"] = cu
    ref_out, ref_state = _reference(kw)
    with torch.inference_mode():
        out, final = flash_kda.fused_recurrent_kda(
            kw["q"], kw["k"], kw["v"], kw["g"], kw["beta"], A_log=kw["A_log"], dt_bias=kw["dt_bias"],
            initial_state=kw["initial_state"], output_final_state=True, use_qk_l2norm_in_kernel=True,
            use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, lower_bound=-5.0, state_v_first=True,
            cu_seqlens=cu)
    assert final.dtype == torch.float32 and final.data_ptr() != kw["initial_state"].data_ptr()
    assert _rel(out, ref_out) <= BOUND and _rel(final, ref_state) <= BOUND


def test_new_final_state_from_a_bf16_start_is_fp32(cuda_sm90):
    import torch

    kw, _ = _problem(cuda_sm90, N=3, T=2, index_mode="none", state=torch.bfloat16)
    before = kw["initial_state"].clone()
    with torch.inference_mode():
        out, final = flash_kda.fused_recurrent_kda_fwd(**dict(kw, inplace_final_state=False, output_final_state=True))
    assert final.dtype == torch.float32 and final.shape == before.shape
    assert torch.equal(kw["initial_state"], before)  # not in place: the start is not modified
    ref_out, ref_state = _reference(kw)
    assert _rel(out, ref_out) <= BOUND and _rel(final, ref_state) <= BOUND


@pytest.mark.parametrize("change, argument", [
    ("host_q", "q"),
    ("k64", "q"),
    ("t17", "q"),
    ("grad", "v"),
    ("no_pool_inplace", "initial_state"),
    ("indices_not_inplace", "inplace_final_state"),
    ("accepted_without_tokens", "num_accepted_tokens"),
    ("fp16_beta", "beta"),
    ("bad_lower_bound", "lower_bound"),
    ("softplus_without_A_log", "A_log"),
    ("short_out", "out"),
    ("unknown_keyword", "chunk_size"),
])
def test_errors_name_the_argument(cuda_sm90, change, argument):
    import torch

    kw, _ = _problem(cuda_sm90, N=2, T=2, index_mode="seqs")
    extra = {}
    if change == "host_q":
        kw["q"] = kw["q"].cpu()
    elif change == "k64":
        kw = _k64(kw)
    elif change == "t17":
        kw, _ = _problem(cuda_sm90, N=2, T=17, index_mode="seqs")
    elif change == "grad":
        kw["v"] = kw["v"].float().requires_grad_()
    elif change == "no_pool_inplace":
        kw.pop("ssm_state_indices")
        kw["initial_state"] = None
    elif change == "indices_not_inplace":
        kw["inplace_final_state"] = False
    elif change == "accepted_without_tokens":
        kw["num_accepted_tokens"] = torch.ones(2, dtype=torch.int32, device=cuda_sm90)
    elif change == "fp16_beta":
        kw["beta"] = kw["beta"].half()
    elif change == "bad_lower_bound":
        kw["lower_bound"] = -7.0
    elif change == "softplus_without_A_log":
        kw["lower_bound"], kw["A_log"] = None, None
    elif change == "short_out":
        kw["out"] = torch.empty_like(kw["v"])[:1]
    elif change == "unknown_keyword":
        extra["chunk_size"] = 64
    before = kw["initial_state"].clone() if kw.get("initial_state") is not None else None
    with pytest.raises(flash_kda.Error) as e:
        flash_kda.fused_recurrent_kda_fwd(**kw, **extra)
    assert e.value.argument == argument, str(e.value)
    if before is not None:
        torch.cuda.synchronize()
        assert torch.equal(kw["initial_state"], before)  # nothing written on error


def test_cuda_graph_capture_replays_the_step(cuda_sm90):
    import torch

    kw, valid = _problem(cuda_sm90, N=8, T=1, index_mode="seqs", padded=(3,))
    pool = kw["initial_state"].clone()
    out = torch.empty_like(kw["v"])
    call = dict(kw, initial_state=pool, out=out)
    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            flash_kda.fused_recurrent_kda_fwd(**call)  # warm-up outside capture
        torch.cuda.current_stream().wait_stream(side)
        pool.copy_(kw["initial_state"])
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            flash_kda.fused_recurrent_kda_fwd(**call)
        pool.copy_(kw["initial_state"])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
    ref_out, ref_pool = _reference(kw)
    sel = torch.tensor(valid, device=out.device)
    assert torch.all(out[3] == 0)
    assert _rel(out[sel], ref_out[sel]) <= BOUND and _rel(pool, ref_pool) <= BOUND


def test_torch_compile_fullgraph_through_the_op(cuda_sm90):
    import torch

    assert hasattr(torch.ops.flash_kda, "fused_recurrent_kda_fwd")
    kw, valid = _problem(cuda_sm90, N=4, T=2, index_mode="tokens", accepted=True)
    pool = kw["initial_state"].clone()

    def step(q, k, v, g, beta, pool):
        out, final = flash_kda.fused_recurrent_kda_fwd(
            q, k, v, g, beta, A_log=kw["A_log"], dt_bias=kw["dt_bias"], initial_state=pool,
            ssm_state_indices=kw["ssm_state_indices"], num_accepted_tokens=kw["num_accepted_tokens"],
            state_v_first=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
            use_beta_sigmoid_in_kernel=True, lower_bound=-5.0)
        return out * 1.0, final

    compiled = torch.compile(step, fullgraph=True)
    with torch.inference_mode():
        out, final = compiled(kw["q"], kw["k"], kw["v"], kw["g"], kw["beta"], pool)
    torch.cuda.synchronize()
    ref_out, ref_pool = _reference(kw)
    assert _rel(out, ref_out) <= BOUND and _rel(pool, ref_pool) <= BOUND
    assert final.data_ptr() == pool.data_ptr()


@contextlib.contextmanager
def _count_ours(monkeypatch):
    calls = [0]
    real = flash_kda.fused_recurrent_kda_fwd

    def counted(*a, **kw):
        calls[0] += 1
        return real(*a, **kw)

    monkeypatch.setattr(flash_kda, "fused_recurrent_kda_fwd", counted)
    yield calls


def test_fla_dispatches_to_flash_kda_and_falls_back(cuda_sm90, monkeypatch):
    import torch

    fla_fwd = _fla_fwd()
    if fla_fwd is None:
        pytest.skip("fla is not importable")
    assert flash_kda._fla.status == "registered"
    kw, valid = _problem(cuda_sm90, N=4, T=2, index_mode="tokens", accepted=True)
    ref_out, ref_pool = _reference(kw)
    with _count_ours(monkeypatch) as calls, torch.inference_mode(), _fla_dispatch(True):
        out, pool = fla_fwd(**dict(kw, initial_state=kw["initial_state"].clone()))
        assert calls[0] == 1  # dispatched to flash_kda
        assert _rel(out, ref_out) <= BOUND and _rel(pool, ref_pool) <= BOUND
        # K = 64: the verifier rejects it and fla's Triton path runs (our function is not called)
        small = _k64(kw)
        ref64, _ = _reference(small)  # before fla's call, which updates small's pool in place
        out64, _ = fla_fwd(**small)
        torch.cuda.synchronize()
        assert calls[0] == 1
        assert _rel(out64, ref64) <= BOUND
    with _count_ours(monkeypatch) as calls, torch.inference_mode(), _fla_dispatch(False):
        fla_fwd(**dict(kw, initial_state=kw["initial_state"].clone()))
        assert calls[0] == 0  # FLA_FLASH_KDA_DECODE=0 turns the backend off
    # Unset: the default scope, every call flash_kda serves: the v-first call above and k-first
    # bf16 pools with two tokens a sequence in both forms the H200 plan gives them, 4 x 16 heads
    # (the row blocks' split form) and 2 x 16 (the warp columns); K = 64 still runs fla's kernel.
    kf, _ = _problem(cuda_sm90, N=4, T=2, H=16, HV=16, state=torch.bfloat16, index_mode="tokens", accepted=True,
                     v_first=False, seed=3)
    kc, _ = _problem(cuda_sm90, N=2, T=2, H=16, HV=16, state=torch.bfloat16, index_mode="tokens", accepted=True,
                     v_first=False, seed=4)
    ref_kf, ref_kf_pool = _reference(kf)
    ref_kc, ref_kc_pool = _reference(kc)
    with _count_ours(monkeypatch) as calls, torch.inference_mode(), _fla_dispatch(None):
        out, pool = fla_fwd(**dict(kw, initial_state=kw["initial_state"].clone()))
        assert calls[0] == 1
        assert _rel(out, ref_out) <= BOUND and _rel(pool, ref_pool) <= BOUND
        out, pool = fla_fwd(**dict(kf, initial_state=kf["initial_state"].clone()))
        torch.cuda.synchronize()
        assert calls[0] == 2
        assert _rel(out, ref_kf) <= BOUND and _rel(pool, ref_kf_pool) <= BOUND
        out, pool = fla_fwd(**dict(kc, initial_state=kc["initial_state"].clone()))
        torch.cuda.synchronize()
        assert calls[0] == 3
        assert _rel(out, ref_kc) <= BOUND and _rel(pool, ref_kc_pool) <= BOUND
        small = _k64(kw)
        ref64, _ = _reference(small)
        out64, _ = fla_fwd(**small)
        torch.cuda.synchronize()
        assert calls[0] == 3  # fla's own kernel
        assert _rel(out64, ref64) <= BOUND


def test_launch_options_force_each_kernel(cuda_sm90, decode_kernel):
    """Each kernel (and k-first form) forced through flash_kda.DecodeLaunchOptions matches the
    fp64 reference, in each layout."""
    import torch

    for v_first in (True, False):
        kw, valid = _problem(cuda_sm90, N=3, T=2, HV=4, v_first=v_first, padded=(1,), accepted=True)
        ref_out, ref_pool = _reference(kw)
        sel = torch.tensor(valid, device=cuda_sm90, dtype=torch.int64)
        for kernel in ("auto", "persistent", "direct", "direct_columns", "direct_rows"):
            call = dict(kw, initial_state=kw["initial_state"].clone())
            with torch.inference_mode():
                out, pool = flash_kda.fused_recurrent_kda_fwd(**call,
                                                              launch_options=flash_kda.DecodeLaunchOptions(kernel))
            torch.cuda.synchronize()
            assert torch.all(out[1] == 0)
            assert _rel(out[sel], ref_out[sel]) <= BOUND, (kernel, v_first)
            assert _rel(pool, ref_pool) <= BOUND, (kernel, v_first)
