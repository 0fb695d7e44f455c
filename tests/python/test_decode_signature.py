"""flash_kda.fused_recurrent_kda_fwd and fused_recurrent_kda take fla 0.6.0's keyword names and
defaults (fla/ops/kda/fused_recurrent.py), in fla's order, so a call written for fla runs
unchanged. Compared with a recorded list, and with fla's own functions (through inspect)
when fla 0.6.x is importable. CPU only."""
from __future__ import annotations

import inspect

import pytest

import flash_kda

_EMPTY = inspect.Parameter.empty

# (name, default) in order, then **kwargs; recorded from fla-core 0.6.0.
FLA_FWD = [
    ("q", _EMPTY), ("k", _EMPTY), ("v", _EMPTY), ("g", _EMPTY), ("beta", _EMPTY), ("A_log", None),
    ("dt_bias", None), ("initial_state", None), ("scale", None), ("output_final_state", False),
    ("inplace_final_state", True), ("state_v_first", False), ("cu_seqlens", None), ("ssm_state_indices", None),
    ("num_accepted_tokens", None), ("use_qk_l2norm_in_kernel", False), ("use_gate_in_kernel", False),
    ("use_beta_sigmoid_in_kernel", False), ("allow_neg_eigval", False), ("lower_bound", None), ("out", None),
]
FLA_RECURRENT = [
    ("q", _EMPTY), ("k", _EMPTY), ("v", _EMPTY), ("g", _EMPTY), ("beta", _EMPTY), ("A_log", None),
    ("dt_bias", None), ("scale", None), ("initial_state", None), ("output_final_state", False),
    ("use_qk_l2norm_in_kernel", False), ("use_gate_in_kernel", False), ("use_beta_sigmoid_in_kernel", False),
    ("allow_neg_eigval", False), ("lower_bound", None), ("state_v_first", False), ("cu_seqlens", None),
]


def _params(fn):
    sig = inspect.signature(inspect.unwrap(fn))
    named = [(p.name, p.default) for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    var_kw = [p.name for p in sig.parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    kinds = {p.kind for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD}
    return named, var_kw, kinds


@pytest.mark.parametrize("ours, recorded", [
    (flash_kda.fused_recurrent_kda_fwd, FLA_FWD),
    (flash_kda.fused_recurrent_kda, FLA_RECURRENT),
], ids=["fused_recurrent_kda_fwd", "fused_recurrent_kda"])
def test_matches_the_recorded_fla_signature(ours, recorded):
    named, var_kw, kinds = _params(ours)
    assert named == recorded
    assert var_kw == ["kwargs"]
    assert kinds == {inspect.Parameter.POSITIONAL_OR_KEYWORD}


@pytest.mark.parametrize("name", ["fused_recurrent_kda_fwd", "fused_recurrent_kda"])
def test_matches_fla_when_installed(name):
    try:
        import fla
        from fla.ops.kda import fused_recurrent
    except Exception as e:  # noqa: BLE001 - fla (and its torch/triton) absent or broken here
        pytest.skip(f"fla is not importable: {type(e).__name__}")
    if not str(getattr(fla, "__version__", "")).startswith("0.6."):
        pytest.skip(f"fla {getattr(fla, '__version__', '?')} is not 0.6.x")
    assert _params(getattr(flash_kda, name)) == _params(getattr(fused_recurrent, name))


def test_unknown_keywords_are_named_not_ignored():
    with pytest.raises(flash_kda.Error) as e:
        flash_kda.fused_recurrent_kda(None, None, None, None, None, transpose_state_layout=True)
    assert e.value.argument == "transpose_state_layout"
    with pytest.raises(flash_kda.Error) as e:
        flash_kda.fused_recurrent_kda_fwd(None, None, None, None, None, chunk_size=64)
    assert e.value.argument == "chunk_size"


def test_exported_from_the_package():
    for name in ("fused_recurrent_kda_fwd", "fused_recurrent_kda", "reference_decode"):
        assert name in flash_kda.__all__ and callable(getattr(flash_kda, name))
        assert getattr(flash_kda, name).__doc__


def test_launch_options_is_a_keyword_beside_flas_signature():
    """flash_kda's own keyword comes through **kwargs (the signature stays fla's) and is checked:
    a bad kernel name or a wrong type is named before anything runs."""
    with pytest.raises(flash_kda.Error) as e:
        flash_kda.DecodeLaunchOptions(kernel="fastest")
    assert e.value.argument == "launch_options.kernel"
    with pytest.raises(flash_kda.Error) as e:
        flash_kda.DecodeLaunchOptions(kernel=2)
    assert e.value.argument == "launch_options.kernel"
    assert flash_kda.DecodeLaunchOptions().kernel == "auto"
    assert flash_kda.DecodeLaunchOptions("direct")._kernel == flash_kda._core.decode_kernels["direct"]
    assert flash_kda.DecodeLaunchOptions("direct_rows")._kernel == flash_kda._core.decode_kernels["direct_rows"] == 4
    pytest.importorskip("torch")
    with pytest.raises(flash_kda.Error) as e:
        flash_kda.fused_recurrent_kda_fwd(None, None, None, None, None, launch_options="direct")
    assert e.value.argument == "launch_options"
