"""flash_kda.fwd on strided views, read and written in place: q, k, v as slices of one fused
projection ``qkv = x.view(B, T, 3, H, K)`` (token stride 3*H*K), g as ``buf[:, 3:3 + T]`` of a
longer buffer or as a slot of a fused ``[B, T, 2, HV, K]`` one, beta as ``buf[..., :HV]`` of a
wider one, out as ``buf[:, :T]`` of a longer one. The two g views take the prepare kernel's two
strided row forms on fixed length (src/sm90/common/row_layout.h): the longer buffer's sequences
are T + 6 tokens apart (General), the fused one's batch folds into the token index (Flat).
Each must give the contiguous call's bits exactly (the same function; only addresses differ),
on the window path (small forced windows, carried state) and the segment-parallel path, fixed
length and varlen; rows of the buffers outside the views stay untouched.

The bf16 -> fp32 state pair that fla's FlashKDA backend passes is checked against the fp64
reference (relative Frobenius error <= 1e-2).
"""
from __future__ import annotations

import pytest

from fwd_cases import Case, check_against_reference, make_inputs, new_outputs

from flash_kda import LaunchOptions

pytestmark = pytest.mark.cuda_sm90

CASES = [
    Case("strided_fixed_B2_T100_H2_fp32", heads=2, seqlen=100, batch=2, state="fp32"),
    Case("strided_varlen_H2_bf16", heads=2, seq_lens=(40, 0, 1, 70, 33), state="bf16"),
]
PATHS = {"plan": None, "windows3": LaunchOptions(window_slots=3), "segments3": LaunchOptions(segments=3)}


def _g_view(g, kind):
    """g ([B, T, HV, K]) as a view: of a buffer of T + 6 tokens a sequence ("longer"), or slot 1
    of a fused [B, T, 2, HV, K] buffer ("fused"); the rest of either buffer is NaN."""
    import torch

    B, T, HV, K = g.shape
    if kind == "longer":
        buf = torch.full((B, T + 6, HV, K), float("nan"), dtype=g.dtype, device=g.device)
        buf[:, 3:3 + T] = g
        return buf[:, 3:3 + T]
    buf = torch.full((B, T, 2, HV, K), float("nan"), dtype=g.dtype, device=g.device)
    buf[:, :, 1] = g
    view = buf[:, :, 1]
    assert view.stride(0) == T * view.stride(1) and not view.is_contiguous()
    return view


def _fwd(x, q, k, v, g, beta, out, final_state, options):
    import flash_kda

    flash_kda.fwd(q, k, v, g, beta, x.scale, out, x.A_log, x.dt_bias, x.lower_bound,
                  initial_state=x.initial_state, final_state=final_state, cu_seqlens=x.cu_seqlens,
                  launch_options=options)


@pytest.mark.parametrize("g_view", ["longer", "fused"])
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_strided_views_equal_contiguous(case, path, g_view):
    import torch

    x = make_inputs(case)
    options = PATHS[path]
    out, final_state = new_outputs(x)
    _fwd(x, x.q, x.k, x.v, x.g, x.beta, out, final_state, options)

    B, T, H, K = x.q.shape
    HV = x.v.shape[2]
    assert HV == H
    qkv = torch.stack([x.q, x.k, x.v], dim=2)  # [B, T, 3, H, K], one buffer
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    assert q.stride(1) == 3 * H * K and not q.is_contiguous()
    beta_buf = torch.full((B, T, HV + 8), float("nan"), dtype=x.beta.dtype, device=x.beta.device)
    beta_buf[..., :HV] = x.beta
    out_buf = torch.full((B, T + 5, HV, K), -7.0, dtype=out.dtype, device=out.device)
    out_view = out_buf[:, :T]
    final2 = None if final_state is None else torch.full_like(final_state, float("nan"))
    _fwd(x, q, k, v, _g_view(x.g, g_view), beta_buf[..., :HV], out_view, final2, options)
    torch.cuda.synchronize()

    assert torch.equal(out_view, out), f"{case.name} {path} g {g_view}: strided out differs from the contiguous call"
    assert (out_buf[:, T:] == -7.0).all(), "a row past the out view was written"
    if final_state is not None:
        assert torch.equal(final2, final_state), f"{case.name} {path} g {g_view}: final_state differs"


@pytest.mark.parametrize("path", list(PATHS))
def test_bf16_initial_fp32_final(path):
    """fla's FlashKDA backend: a bf16 initial_state with an fp32 final_state."""
    import torch

    case = Case("mixed_state_bf16_to_fp32", heads=2, seq_lens=(300, 0, 17, 129), state="bf16")
    x = make_inputs(case)
    out, final_bf16 = new_outputs(x)
    final_state = torch.full(final_bf16.shape, float("nan"), dtype=torch.float32, device=out.device)
    _fwd(x, x.q, x.k, x.v, x.g, x.beta, out, final_state, PATHS[path])
    torch.cuda.synchronize()
    check_against_reference(x, out, final_state, bound=1e-2)


@pytest.mark.parametrize("path", list(PATHS))
def test_prefill_on_a_state_pool(path):
    """fwd(ssm_state_indices=...): each sequence starts from its pool slot and writes its final
    state back there, in place; bit for bit the call on the gathered states; a padded (-1)
    sequence reads and writes no slot and gets zero out rows; the other slots stay as they were."""
    import torch

    import flash_kda

    case = Case("pool_prefill_varlen_fp32", heads=2, seq_lens=(40, 70, 0, 33), state="fp32")
    x = make_inputs(case)
    dev = x.v.device
    P = 6
    pool = torch.randn(P, case.hv, 128, 128, device=dev, dtype=torch.float32)
    idx = torch.tensor([4, -1, 0, 2], dtype=torch.int32, device=dev)
    valid = [n for n in range(4) if int(idx[n]) >= 0]
    # The same call on gathered start states (slot of each sequence; zeros for the padded one).
    gathered = torch.zeros(4, case.hv, 128, 128, device=dev, dtype=torch.float32)
    for n in valid:
        gathered[n] = pool[int(idx[n])]
    out_ref, final_ref = new_outputs(x)
    flash_kda.fwd(x.q, x.k, x.v, x.g, x.beta, x.scale, out_ref, x.A_log, x.dt_bias, x.lower_bound,
                  initial_state=gathered, final_state=final_ref, cu_seqlens=x.cu_seqlens, launch_options=PATHS[path])

    work = pool.clone()
    out, _ = new_outputs(x)
    flash_kda.fwd(x.q, x.k, x.v, x.g, x.beta, x.scale, out, x.A_log, x.dt_bias, x.lower_bound,
                  initial_state=work, final_state=work, cu_seqlens=x.cu_seqlens, launch_options=PATHS[path],
                  ssm_state_indices=idx)
    torch.cuda.synchronize()

    cu = x.cu_seqlens.tolist()
    for n in range(4):
        rows = slice(cu[n], cu[n + 1])
        if n in valid:
            assert torch.equal(out[:, rows], out_ref[:, rows]), f"sequence {n}: out differs from the gathered call"
            assert torch.equal(work[int(idx[n])], final_ref[n]), f"sequence {n}: its slot is not its final state"
        else:
            assert (out[:, rows] == 0).all(), "the padded sequence's out rows are not zero"
    untouched = [s for s in range(P) if s not in {int(idx[n]) for n in valid}]
    assert torch.equal(work[untouched], pool[untouched]), "a slot no sequence owns was written"
