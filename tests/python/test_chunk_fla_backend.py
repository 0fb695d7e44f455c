"""flash_kda's backend for fla's chunk_kda (flash_kda/_fla_chunk.py) on CPU: registration with a
stand-in fla (its public registry's register and BaseBackend), replacing fla's built-in FlashKDA
backend whichever is imported first, import without fla or with another version, and the
verifier's decisions on stand-in tensors (it asks the C++ validation; it never raises). The GPU
side (fla's own chunk_kda dispatching here) is in test_chunk_fla_dispatch.py."""
from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
import types

import pytest

import flash_kda
from flash_kda import _fla, _fla_chunk

from test_chunk_plan import B, H, K, L, T


class StandInBackend:
    """The parts of fla.backends.BaseBackend the registration relies on."""

    backend_type = "base"
    env_var = None
    verifier = None


def _stand_in_fla(monkeypatch, version="0.6.0"):
    monkeypatch.setattr(_fla_chunk, "status", _fla_chunk.status)  # the real status comes back after
    registered = []
    modules = {name: types.ModuleType(name) for name in ("fla", "fla.backends", "fla.ops", "fla.ops.kda",
                                                         "fla.ops.kda.chunk")}
    for name, m in modules.items():
        m.__spec__ = importlib.machinery.ModuleSpec(name, None)
        monkeypatch.setitem(sys.modules, name, m)
    modules["fla"].__version__ = version
    modules["fla.backends"].BaseBackend = StandInBackend

    def chunk_kda(q, k, v, g, beta, **kw):
        return "fla's result"

    def register(entry_point, **kw):
        def decorator(cls):
            registered.append((entry_point, cls))
            return cls
        return decorator

    modules["fla.backends"].register = register
    modules["fla.ops.kda.chunk"].chunk_kda = chunk_kda
    return registered, chunk_kda


def test_registers_for_fla_chunk_kda_in_place_of_the_builtin(monkeypatch):
    registered, chunk_kda = _stand_in_fla(monkeypatch)
    assert _fla_chunk.register() == "registered"
    (entry_point, cls), = registered
    assert entry_point is chunk_kda
    assert issubclass(cls, StandInBackend)
    # fla's built-in FlashKDA backend's type (the registry keeps one backend per type), switch
    # and priority: ours takes its place.
    assert (cls.backend_type, cls.env_var, cls.package_name, cls.priority) == ("flash_kda", "FLA_FLASH_KDA",
                                                                               "flash_kda", 3)
    assert cls.default_enable is True
    backend = cls()
    assert callable(backend.chunk_kda) and callable(backend.chunk_kda_verifier)


@pytest.mark.parametrize("version", ["0.5.3", "0.7.0"])
def test_other_fla_versions_are_not_registered(monkeypatch, version):
    registered, _ = _stand_in_fla(monkeypatch, version)
    assert _fla_chunk.register() == f"not registered: fla {version} is installed, the backend follows fla 0.6.x"
    assert registered == []


def test_an_error_while_registering_is_kept_not_raised(monkeypatch):
    _stand_in_fla(monkeypatch)

    def broken(*a, **kw):
        raise RuntimeError("registry exploded")

    monkeypatch.setattr(sys.modules["fla.backends"], "register", broken)
    assert _fla_chunk.register() == "not registered: RuntimeError: registry exploded"


def test_import_without_fla_works():
    code = ("import sys; sys.modules['fla'] = None\n"
            "import flash_kda, flash_kda._fla_chunk as f\n"
            "print(f.status)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "not registered: fla is not installed", r.stdout


# A stand-in fla package on disk with fla 0.6.0's registry rules: one backend per type in a
# dict (a later registration of a type replaces the earlier one in its place), candidates in
# priority order, the default function when every verifier declines; fla.ops.kda imports its
# chunk module, then its built-in FlashKDA backend last.
STAND_IN = {
    "__init__.py": '__version__ = "0.6.0"\n',
    "backends.py": '''
import inspect
registries = {}


class BaseBackend:
    backend_type = "base"
    priority = 5
    verifier = None


def register(entry_point, **kw):
    def decorator(cls):
        registries[inspect.unwrap(entry_point)][cls.backend_type] = cls()
        return cls
    return decorator


def dispatch(fn):
    registries[fn] = {}

    def wrapper(*args, **kwargs):
        for b in sorted(registries[fn].values(), key=lambda b: b.priority):
            ok, why = getattr(b, fn.__name__ + "_verifier")(*args, **kwargs)
            if ok:
                return getattr(b, fn.__name__)(*args, **kwargs)
            print("rejected:", why)
        return fn(*args, **kwargs)
    wrapper.__wrapped__ = fn
    return wrapper
''',
    "ops/__init__.py": "",
    "ops/kda/__init__.py": "from .chunk import chunk_kda\nfrom fla.ops.kda.backends import flash_kda\n",
    "ops/kda/chunk.py": '''
from fla.backends import dispatch


@dispatch
def chunk_kda(q, k, v, g, beta, **kwargs):
    return "fla's triton result"
''',
    "ops/kda/backends/__init__.py": "",
    "ops/kda/backends/flash_kda.py": '''
from fla.backends import BaseBackend, register
from fla.ops.kda.chunk import chunk_kda


@register(chunk_kda)
class FlashKDABackend(BaseBackend):
    backend_type = "flash_kda"
    priority = 3

    def chunk_kda_verifier(self, *a, **kw):
        return True, None

    def chunk_kda(self, *a, **kw):
        raise AssertionError("fla's built-in FlashKDA backend ran")
''',
}


@pytest.mark.parametrize("order", ["flash_kda_first", "fla_first", "fla_chunk_first"])
def test_replaces_the_builtin_backend_whichever_is_imported_first(tmp_path, order):
    for rel, text in STAND_IN.items():
        path = tmp_path / "fla" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    imports = {"flash_kda_first": ["import flash_kda", "import fla.ops.kda"],
               "fla_first": ["import fla.ops.kda", "import flash_kda"],
               "fla_chunk_first": ["import fla.ops.kda.chunk", "import flash_kda"]}[order]
    code = "\n".join([
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})",
        imports[0],
        "import flash_kda._fla_chunk as f",
        "print(f.status)",
        imports[1],
        "import fla.backends as b, fla.ops.kda.chunk as c",
        "print(f.status)",
        "print({t: type(x).__name__ for t, x in b.registries[c.chunk_kda.__wrapped__].items()})",
        # No visible GPU: the verifier declines and fla's own function answers.
        "print(c.chunk_kda(1, 2, 3, 4, 5))",
    ])
    # No GPU for the child, so that the verifier declines on a GPU machine too.
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    if order == "flash_kda_first":
        assert lines[0] == "pending: registers when fla.ops.kda is imported"
    else:
        assert lines[0] == "registered"
    assert lines[1] == "registered"
    assert lines[2] == "{'flash_kda': 'FlashKDAChunkBackend'}"
    assert lines[3].startswith("rejected: flash_kda chunk_kda: ") and "no sm_90 kernels" in lines[3]
    assert lines[4] == "fla's triton result"


def _fla_call(**change):
    kw = dict(initial_state=T(B, H, K, K, dtype="torch.float32"), output_final_state=True,
              use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
              safe_gate=True, lower_bound=-5.0, state_v_first=True,
              A_log=T(H, dtype="torch.float32"), dt_bias=T(H * K, dtype="torch.float32"))
    kw.update(change)
    args = [kw.pop(n) if n in kw else T(*shape) for n, shape in
            (("q", (B, L, H, K)), ("k", (B, L, H, K)), ("v", (B, L, H, K)), ("g", (B, L, H, K)), ("beta", (B, L, H)))]
    return args, kw


@pytest.fixture
def gpu(monkeypatch):
    """As on an sm_90 machine with the kernels built."""
    monkeypatch.setattr(_fla, "_kernels", lambda: True)
    monkeypatch.setattr(_fla_chunk, "_sm90", lambda device: True)


def test_verifier_accepts_flashkdas_call(gpu, kernels_built):
    args, kw = _fla_call()
    assert _fla_chunk.verify_call(*args, **kw) == (True, None)
    assert _fla_chunk.verify_call(*args, **{**kw, "output_final_state": False, "initial_state": None}) == (True, None)
    assert _fla_chunk.verify_call(*args, **{**kw, "return_intermediate_states": True}) == (True, None)


@pytest.mark.parametrize("change, reason", [
    (dict(q=T(B, L, H, K, is_cuda=False)), "q must be a CUDA tensor"),
    (dict(cp_context=object()), "cp_context"),
    (dict(return_intermediate_states=True, use_graph=True), "intermediate states need the sequence lengths"),
    (dict(chunk_size=128), "chunk_size"),
    (dict(head_first=True), "head_first: is not a keyword"),
    (dict(q=T(B, L, H, 64), k=T(B, L, H, 64), g=T(B, L, H, 64), dt_bias=T(H * 64, dtype="torch.float32"),
          initial_state=None, output_final_state=False), "head dim K = 64"),  # the C++ validation's words
    (dict(q=T(B, L, H, K, dtype="torch.float16")), "q: expected dtype bf16"),
    (dict(beta=T(B, L, H, K)), "beta"),
    (dict(q=None), "q must be a CUDA tensor"),
    (dict(v=object()), "v"),
])
def test_verifier_declines_with_the_reason(gpu, change, reason):
    args, kw = _fla_call(**change)
    accepted, why = _fla_chunk.verify_call(*args, **kw)
    assert not accepted and reason in why, why


@pytest.fixture
def validations(monkeypatch):
    """The C++ validations (forward and backward) as stand-ins that accept every call and record
    which ran; a build whose extension has the backward."""
    from flash_kda import _core

    ran = []
    monkeypatch.setattr(_core, "validate_forward_raw", lambda tensors, *settings: ran.append("forward") or ())
    monkeypatch.setattr(_core, "validate_backward_raw",
                        lambda tensors, grads, *settings: ran.append("backward") or (), raising=False)
    monkeypatch.setattr(_core, "backward_raw", lambda *a: None, raising=False)
    monkeypatch.setenv(_fla_chunk.TRAIN_ENV_VAR, "1")
    return ran


def test_verifier_accepts_training_calls_the_backward_serves(gpu, monkeypatch, validations):
    args, kw = _fla_call(v=T(B, L, H, K, requires_grad=True))
    monkeypatch.setattr(_fla, "_grad_enabled", lambda: True)
    assert _fla_chunk.verify_call(*args, **kw) == (True, None)
    assert validations == ["forward", "backward"]
    # fla's KDA layer in training: softplus gate, k-first, beta already activated, no state
    args, kw = _fla_call(q=T(B, L, H, K, requires_grad=True), safe_gate=False, lower_bound=None,
                         state_v_first=False, use_beta_sigmoid_in_kernel=False, initial_state=None,
                         output_final_state=False)
    assert _fla_chunk.verify_call(*args, **kw) == (True, None)
    validations.clear()
    monkeypatch.setattr(_fla, "_grad_enabled", lambda: False)  # no_grad / inference_mode: the forward alone
    assert _fla_chunk.verify_call(*args, **kw) == (True, None) and validations == ["forward"]


def test_verifier_declines_training_calls_the_backward_refuses(gpu, monkeypatch, validations):
    from flash_kda import _core

    monkeypatch.setattr(_fla, "_grad_enabled", lambda: True)
    args, kw = _fla_call(v=T(B, L, H, K, requires_grad=True))

    def refuse(tensors, grads, *settings):
        e = _core.Error("flash_kda: dg: unsupported by the backward")
        e.argument = "dg"
        raise e

    monkeypatch.setattr(_core, "validate_backward_raw", refuse)
    assert _fla_chunk.verify_call(*args, **kw) == (False, "flash_kda: dg: unsupported by the backward")


@pytest.mark.parametrize("change, reason", [
    (dict(return_intermediate_states=True), "intermediate states have no backward"),
    (dict(cp_context=object()), "cp_context"),
])
def test_verifier_declines_training_calls_with_what_has_no_backward(gpu, monkeypatch, validations, change, reason):
    monkeypatch.setattr(_fla, "_grad_enabled", lambda: True)
    args, kw = _fla_call(v=T(B, L, H, K, requires_grad=True), **change)
    accepted, why = _fla_chunk.verify_call(*args, **kw)
    assert not accepted and reason in why, why


def test_verifier_declines_training_calls_when_switched_off(gpu, monkeypatch, validations):
    monkeypatch.setattr(_fla, "_grad_enabled", lambda: True)
    args, kw = _fla_call(v=T(B, L, H, K, requires_grad=True))
    for off in (None, "0", " 0", "yes"):
        if off is None:
            monkeypatch.delenv(_fla_chunk.TRAIN_ENV_VAR, raising=False)  # opt-in: off by default
        else:
            monkeypatch.setenv(_fla_chunk.TRAIN_ENV_VAR, off)
        assert _fla_chunk.verify_call(*args, **kw) == (False, "flash_kda chunk_kda: training calls are off "
                                                              "(FLA_FLASH_KDA_TRAIN=1 turns them on)")
    monkeypatch.setenv(_fla_chunk.TRAIN_ENV_VAR, "1")
    assert _fla_chunk.verify_call(*args, **kw) == (True, None)
    monkeypatch.setenv(_fla_chunk.TRAIN_ENV_VAR, "0")  # inference calls are not affected
    monkeypatch.setattr(_fla, "_grad_enabled", lambda: False)
    assert _fla_chunk.verify_call(*args, **kw) == (True, None)


def test_verifier_declines_training_calls_without_a_backward_in_the_build(gpu, monkeypatch, validations):
    from flash_kda import _core

    monkeypatch.delattr(_core, "backward_raw")
    monkeypatch.setattr(_fla, "_grad_enabled", lambda: True)
    args, kw = _fla_call(v=T(B, L, H, K, requires_grad=True))
    accepted, why = _fla_chunk.verify_call(*args, **kw)
    assert not accepted and "has no backward" in why, why


def test_verifier_declines_without_kernels_or_on_another_gpu(monkeypatch):
    args, kw = _fla_call()
    monkeypatch.setattr(_fla, "_kernels", lambda: False)
    assert "no sm_90 kernels" in _fla_chunk.verify_call(*args, **kw)[1]
    monkeypatch.setattr(_fla, "_kernels", lambda: True)
    monkeypatch.setattr(_fla_chunk, "_sm90", lambda device: False)
    assert "not an sm_90 GPU" in _fla_chunk.verify_call(*args, **kw)[1]


def test_verifier_never_raises(gpu, monkeypatch):
    def explode(*a, **kw):
        raise RuntimeError("boom")

    monkeypatch.setattr(_fla_chunk._chunk, "validate_call", explode)
    args, kw = _fla_call()
    assert _fla_chunk.verify_call(*args, **kw) == (False, "flash_kda chunk_kda: RuntimeError: boom")


def test_verifier_follows_the_cpp_validation(gpu, monkeypatch):
    """A call the C++ validation accepts is served, whatever its gate or layout (so the kernels'
    branches widen it without a change here); one it rejects is declined with its message."""
    from flash_kda import _core

    args, kw = _fla_call(safe_gate=False, lower_bound=None, state_v_first=False)
    monkeypatch.setattr(_core, "validate_forward_raw", lambda tensors, *settings: ())
    assert _fla_chunk.verify_call(*args, **kw) == (True, None)

    def refuse(tensors, *settings):
        e = _core.Error("flash_kda: gate: unsupported here")
        e.argument = "gate"
        raise e

    monkeypatch.setattr(_core, "validate_forward_raw", refuse)
    assert _fla_chunk.verify_call(*args, **kw) == (False, "flash_kda: gate: unsupported here")


def test_implementation_falls_back_to_fla_on_a_rejected_call(monkeypatch):
    def ours(*a, **kw):
        raise flash_kda._core.Error("flash_kda: q: rows must be 16-byte aligned")

    monkeypatch.setattr(flash_kda, "chunk_kda", ours)
    monkeypatch.setattr(_fla_chunk, "_fla_triton_function", lambda: lambda *a, **kw: ("fla's result", a, kw))
    assert _fla_chunk.chunk_call(1, x=2) == ("fla's result", (1,), {"x": 2})
    monkeypatch.setattr(_fla_chunk, "_fla_triton_function", lambda: None)
    with pytest.raises(flash_kda.Error):
        _fla_chunk.chunk_call(1)
    monkeypatch.setattr(flash_kda, "chunk_kda", lambda *a, **kw: "ours")
    assert _fla_chunk.chunk_call(1) == "ours"
