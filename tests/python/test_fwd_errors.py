"""Bad calls to flash_kda.fwd raise flash_kda.Error naming the offending argument, before any
kernel runs: out and final_state keep their (random, sentinel) contents bit for bit and no
input changes. The good call built here is checked to succeed, so every case differs from a
valid call by exactly the one defect it names.
"""
from __future__ import annotations

import pytest

from fwd_cases import Case, make_inputs, new_outputs

pytestmark = pytest.mark.cuda_sm90  # conftest.py skips these without an sm_90 GPU and CUDA build

FIXED = Case("errors_fixed", heads=4, seqlen=33, batch=2, state="fp32")
VARLEN = Case("errors_varlen", heads=4, seq_lens=(5, 0, 28), state="bf16")
ORDER = ("q", "k", "v", "g", "beta", "scale", "out", "A_log", "dt_bias", "lower_bound")


def _good_call(case: Case) -> dict:
    """Arguments of a valid fwd call on `case`; out/final_state hold random sentinel values."""
    x = make_inputs(case)
    out, final_state = new_outputs(x, fill=0.0)
    out.normal_()
    if final_state is not None:
        final_state.normal_()
    return dict(q=x.q, k=x.k, v=x.v, g=x.g, beta=x.beta, scale=x.scale, out=out, A_log=x.A_log,
                dt_bias=x.dt_bias, lower_bound=x.lower_bound, initial_state=x.initial_state,
                final_state=final_state, cu_seqlens=x.cu_seqlens)


def _call(kw: dict) -> None:
    """fwd with FlashKDA's arguments from kw, plus its keyword-only ones under kw["extra"]."""
    import flash_kda

    flash_kda.fwd(*(kw[n] for n in ORDER), initial_state=kw["initial_state"],
                  final_state=kw["final_state"], cu_seqlens=kw["cu_seqlens"], **kw.get("extra", {}))


def _extra(**options):
    return lambda kw: kw.update(extra=options)


def _bad_host_copy(kw):
    cu = kw["cu_seqlens"].cpu().clone()
    cu[2] = cu[1] - 1  # decreasing
    kw.update(extra=dict(cu_seqlens_cpu=cu))


def _bad_device_values(kw, **options):
    cu = kw["cu_seqlens"].clone()
    cu[-1] += 1  # past T_total
    kw.update(cu_seqlens=cu, extra=options)


def _with_dtype(name, dtype_name):
    def edit(kw):
        import torch

        kw[name] = torch.empty_like(kw[name], dtype=getattr(torch, dtype_name))
    return edit


def _same_bits(a, b) -> bool:
    """Bitwise equality for any dtype (torch.equal lacks kernels for some, such as uint64)."""
    import torch

    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _too_many_sms(kw):
    import flash_kda
    import torch

    sms = torch.cuda.get_device_properties(kw["q"].device).multi_processor_count
    kw.update(extra=dict(launch_options=flash_kda.LaunchOptions(num_sms=sms + 1)))


def _int64():
    import torch

    return torch.int64


def _last_dim_strided(t):
    """Same shape and values as t, the last dimension not of unit stride."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def _misaligned_rows(t):
    """Same shape and values as t, rows 8 bytes apart from 16-byte alignment (a slice of a
    buffer whose rows have 4 more bf16 elements)."""
    buf = t.new_zeros((*t.shape[:-1], t.shape[-1] + 4))
    buf[..., :t.shape[-1]] = t
    return buf[..., :t.shape[-1]]


# (id, base case, edit(kw) -> None, argument the error must name)
BAD = [
    ("q_fp32", FIXED, lambda kw: kw.update(q=kw["q"].float()), "q"),
    ("k_fp16", FIXED, lambda kw: kw.update(k=kw["k"].half()), "k"),
    ("v_rank3", FIXED, lambda kw: kw.update(v=kw["v"][0]), "v"),
    ("g_short_T", FIXED, lambda kw: kw.update(g=kw["g"][:, :-1].contiguous()), "g"),
    ("beta_rank4", FIXED, lambda kw: kw.update(beta=kw["beta"][..., None]), "beta"),
    ("beta_fp16", FIXED, lambda kw: kw.update(beta=kw["beta"].half()), "beta"),
    ("k_other_heads", FIXED, lambda kw: kw.update(k=kw["k"][:, :, :2].contiguous()), "k"),
    ("qk_head_dim_64", FIXED, lambda kw: kw.update(  # g and dt_bias follow K, so K = 64 is the one defect
        q=kw["q"][..., :64].contiguous(), k=kw["k"][..., :64].contiguous(), g=kw["g"][..., :64].contiguous(),
        dt_bias=kw["dt_bias"][:, :64].contiguous(), initial_state=None, final_state=None), "q"),
    ("q_last_dim_strided", FIXED, lambda kw: kw.update(q=_last_dim_strided(kw["q"])), "q"),
    ("k_rows_misaligned", FIXED, lambda kw: kw.update(k=_misaligned_rows(kw["k"])), "k"),
    ("v_on_host", FIXED, lambda kw: kw.update(v=kw["v"].cpu()), "v"),
    ("out_fp32", FIXED, lambda kw: kw.update(out=kw["out"].float()), "out"),
    ("out_wrong_shape", FIXED, lambda kw: kw.update(out=kw["out"][:, :-1].contiguous()), "out"),
    ("out_last_dim_strided", FIXED, lambda kw: kw.update(out=_last_dim_strided(kw["out"])), "out"),
    ("out_rows_misaligned", FIXED, lambda kw: kw.update(out=_misaligned_rows(kw["out"])), "out"),
    ("initial_state_not_contiguous", FIXED,
     lambda kw: kw.update(initial_state=kw["initial_state"].transpose(0, 1).contiguous().transpose(0, 1)),
     "initial_state"),
    ("out_is_q", FIXED, lambda kw: kw.update(out=kw["q"]), "out"),
    ("out_is_v", FIXED, lambda kw: kw.update(out=kw["v"]), "out"),
    ("scale_negative", FIXED, lambda kw: kw.update(scale=-1.0), "scale"),
    ("lower_bound_zero", FIXED, lambda kw: kw.update(lower_bound=0.0), "lower_bound"),
    ("lower_bound_below_minus5", FIXED, lambda kw: kw.update(lower_bound=-5.5), "lower_bound"),
    ("A_log_wrong_shape", FIXED, lambda kw: kw.update(A_log=kw["A_log"][:-1].contiguous()), "A_log"),
    ("A_log_bf16", FIXED, lambda kw: kw.update(A_log=kw["A_log"].bfloat16()), "A_log"),
    ("dt_bias_wrong_shape", FIXED, lambda kw: kw.update(dt_bias=kw["dt_bias"][:, :64].contiguous()), "dt_bias"),
    ("initial_state_wrong_N", FIXED, lambda kw: kw.update(initial_state=kw["initial_state"][:1].contiguous()),
     "initial_state"),
    ("initial_state_fp16", FIXED,
     lambda kw: kw.update(initial_state=kw["initial_state"].half(), final_state=None), "initial_state"),
    ("final_state_fp16", FIXED, lambda kw: kw.update(final_state=kw["final_state"].half()), "final_state"),
    ("final_state_wrong_shape", FIXED, lambda kw: kw.update(final_state=kw["final_state"][:, :2].contiguous()),
     "final_state"),
    ("cu_seqlens_with_batch_2", FIXED,
     lambda kw: kw.update(cu_seqlens=kw["q"].new_tensor([0, 33, 66], dtype=_int64())), "cu_seqlens"),
    ("cu_seqlens_float", VARLEN, lambda kw: kw.update(cu_seqlens=kw["cu_seqlens"].float()), "cu_seqlens"),
    ("cu_seqlens_on_host", VARLEN, lambda kw: kw.update(cu_seqlens=kw["cu_seqlens"].cpu()), "cu_seqlens"),
    ("cu_seqlens_rank2", VARLEN, lambda kw: kw.update(cu_seqlens=kw["cu_seqlens"][None]), "cu_seqlens"),
    ("varlen_initial_state_wrong_N", VARLEN,
     lambda kw: kw.update(initial_state=kw["initial_state"][:2].contiguous()), "initial_state"),
    # Arguments that are not what they should be at all, and dtypes the library has no name for.
    ("q_none", FIXED, lambda kw: kw.update(q=None), "q"),
    ("g_none", FIXED, lambda kw: kw.update(g=None), "g"),
    ("beta_none", FIXED, lambda kw: kw.update(beta=None), "beta"),
    ("q_string", FIXED, lambda kw: kw.update(q="hello"), "q"),
    ("initial_state_list", FIXED, lambda kw: kw.update(initial_state=[1.0]), "initial_state"),
    ("q_rank5", FIXED, lambda kw: kw.update(q=kw["q"][None]), "q"),
    ("beta_bool", FIXED, _with_dtype("beta", "bool"), "beta"),
    ("g_uint64", FIXED, _with_dtype("g", "uint64"), "g"),
    ("lower_bound_string", FIXED, lambda kw: kw.update(lower_bound="x"), "lower_bound"),
    ("scale_string", FIXED, lambda kw: kw.update(scale="x"), "scale"),
    # cu_seqlens values: checked on a host copy, or on request (one sync).
    ("cu_seqlens_cpu_decreasing", VARLEN, _bad_host_copy, "cu_seqlens"),
    ("cu_seqlens_cpu_wrong_length", VARLEN,
     lambda kw: kw.update(extra=dict(cu_seqlens_cpu=kw["cu_seqlens"].cpu()[:-1].clone())), "cu_seqlens_cpu"),
    ("cu_seqlens_cpu_on_gpu", VARLEN, lambda kw: kw.update(extra=dict(cu_seqlens_cpu=kw["cu_seqlens"].clone())),
     "cu_seqlens_cpu"),
    ("check_cu_seqlens_past_end", VARLEN, lambda kw: _bad_device_values(kw, check_cu_seqlens=True), "cu_seqlens"),
    # launch_options: its type here, its ranges by the C++ plan (the device's SM count).
    ("launch_options_dict", FIXED, _extra(launch_options={"num_sms": 1}), "launch_options"),
    ("launch_options_num_sms_above_device", FIXED, _too_many_sms, "launch_options.num_sms"),
]


@pytest.mark.parametrize("case", [FIXED, VARLEN], ids=lambda c: c.name)
def test_good_call_succeeds(case):
    """The base calls are valid: the bad ones below fail for their one defect only."""
    import torch

    kw = _good_call(case)
    out_before = kw["out"].clone()
    _call(kw)
    torch.cuda.synchronize()
    assert not torch.equal(kw["out"], out_before), "a valid call must write out"
    assert torch.isfinite(kw["out"]).all()


@pytest.mark.parametrize("name,case,edit,argument", BAD, ids=[b[0] for b in BAD])
def test_bad_call_raises_and_writes_nothing(name, case, edit, argument):
    import torch
    import flash_kda

    kw = _good_call(case)
    edit(kw)
    torch.cuda.synchronize()
    before = {n: (t.clone() if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
    with pytest.raises(flash_kda.Error) as info:
        _call(kw)
    torch.cuda.synchronize()
    assert isinstance(info.value, ValueError)
    assert getattr(info.value, "argument", None) == argument, \
        f"{name}: error names {getattr(info.value, 'argument', None)!r}, expected {argument!r}: {info.value}"
    assert argument in str(info.value), f"{name}: message does not name {argument!r}: {info.value}"
    for n, t in kw.items():
        if isinstance(t, torch.Tensor):
            assert _same_bits(t, before[n]), f"{name}: {n} changed although the call was rejected"


def test_cu_seqlens_checks_accept_good_values_and_change_nothing():
    """A correct host copy, and the opt-in check, pass and give the unchecked call's bits."""
    import torch

    kw = _good_call(VARLEN)
    _call(kw)
    plain = (kw["out"].clone(), kw["final_state"].clone())
    for extra in (dict(cu_seqlens_cpu=kw["cu_seqlens"].cpu()), dict(check_cu_seqlens=True),
                  dict(cu_seqlens_cpu=kw["cu_seqlens"].cpu().int())):
        kw["out"].normal_()
        kw["final_state"].normal_()
        _call({**kw, "extra": extra})
        torch.cuda.synchronize()
        assert torch.equal(kw["out"], plain[0]) and torch.equal(kw["final_state"], plain[1]), extra


def test_in_place_state_must_be_the_same_buffer():
    """final_state may be initial_state itself (in-place update), but not a partial overlap."""
    import torch
    import flash_kda

    kw = _good_call(FIXED)
    big = torch.randn((3, *kw["initial_state"].shape[1:]), dtype=torch.float32, device="cuda")
    kw["initial_state"] = big[:2]
    kw["final_state"] = big[1:]
    before = big.clone()
    out_before = kw["out"].clone()
    with pytest.raises(flash_kda.Error) as info:
        _call(kw)
    torch.cuda.synchronize()
    assert info.value.argument == "final_state", str(info.value)
    assert torch.equal(big, before) and torch.equal(kw["out"], out_before)
