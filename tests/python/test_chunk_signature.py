"""flash_kda.chunk_kda takes fla 0.6.0's keyword names and defaults (fla/ops/kda/chunk.py), in
fla's order, so a call written for fla runs unchanged; the fla backend's verifier takes the
same. Compared with a recorded list, and with fla's own chunk_kda (through inspect) when fla
0.6.x is importable. CPU only."""
from __future__ import annotations

import inspect

import pytest

import flash_kda
from flash_kda import _fla_chunk

_EMPTY = inspect.Parameter.empty

# (name, default) in order, then **kwargs; recorded from fla-core 0.6.0.
FLA_CHUNK_KDA = [
    ("q", _EMPTY), ("k", _EMPTY), ("v", _EMPTY), ("g", _EMPTY), ("beta", _EMPTY), ("scale", None),
    ("initial_state", None), ("output_final_state", False), ("use_qk_l2norm_in_kernel", False),
    ("use_gate_in_kernel", False), ("use_beta_sigmoid_in_kernel", False), ("allow_neg_eigval", False),
    ("safe_gate", False), ("lower_bound", None), ("disable_recompute", False),
    ("return_intermediate_states", False), ("state_v_first", False), ("cu_seqlens", None),
    ("cu_seqlens_cpu", None), ("cp_context", None), ("use_graph", False), ("max_num_seqs", None),
]


def _params(fn):
    sig = inspect.signature(inspect.unwrap(fn))
    named = [(p.name, p.default) for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    var_kw = [p.name for p in sig.parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    kinds = {p.kind for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD}
    return named, var_kw, kinds


@pytest.mark.parametrize("fn", [flash_kda.chunk_kda, _fla_chunk.verify_call], ids=["chunk_kda", "verifier"])
def test_matches_the_recorded_fla_signature(fn):
    named, var_kw, kinds = _params(fn)
    assert named == FLA_CHUNK_KDA
    assert var_kw == ["kwargs"]
    assert kinds == {inspect.Parameter.POSITIONAL_OR_KEYWORD}


def test_matches_fla_when_installed():
    try:
        import fla
        from fla.ops.kda import chunk
    except Exception as e:  # noqa: BLE001 - fla (and its torch/triton) absent or broken here
        pytest.skip(f"fla is not importable: {type(e).__name__}")
    if not str(getattr(fla, "__version__", "")).startswith("0.6."):
        pytest.skip(f"fla {getattr(fla, '__version__', '?')} is not 0.6.x")
    assert _params(flash_kda.chunk_kda) == _params(chunk.chunk_kda)


def test_exported_from_the_package():
    assert "chunk_kda" in flash_kda.__all__ and callable(flash_kda.chunk_kda)
    doc = flash_kda.chunk_kda.__doc__
    for word in ("use_gate_in_kernel", "lower_bound", "state_v_first", "use_graph", "Raises", "Returns"):
        assert word in doc, word
