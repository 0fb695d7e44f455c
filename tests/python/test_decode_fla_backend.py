"""flash_kda's fla backend for operation 'kda' (flash_kda/_fla.py) on CPU: registration with a
stand-in fla (its public registry's register and BaseBackend), import without fla or with
another version, and the verifier's decisions on stand-in tensors (shapes and dtypes only).
The GPU side (fla's own fused_recurrent_kda_fwd dispatching to flash_kda) is in
test_decode_gpu.py.
"""
from __future__ import annotations

import importlib.machinery
import subprocess
import sys
import types

import pytest

import flash_kda
from flash_kda import _fla


class StandInBackend:
    """The parts of fla.backends.BaseBackend the registration relies on."""

    backend_type = "base"
    env_var = None
    verifier = None

    def verify(self, function_name, *args, **kwargs):
        verifier = getattr(self, f"{function_name}_verifier", None)
        return verifier(*args, **kwargs) if verifier else (True, None)


def _stand_in_fla(monkeypatch, version="0.6.0"):
    monkeypatch.setattr(_fla, "status", _fla.status)  # the real registration's status comes back after
    registered = []
    fla = types.ModuleType("fla")
    fla.__version__ = version
    fla.__spec__ = importlib.machinery.ModuleSpec("fla", None)
    backends = types.ModuleType("fla.backends")
    backends.BaseBackend = StandInBackend

    def register(entry_point, **kw):
        def decorator(cls):
            registered.append((entry_point, cls))
            return cls
        return decorator

    backends.register = register
    fla.backends = backends
    monkeypatch.setitem(sys.modules, "fla", fla)
    monkeypatch.setitem(sys.modules, "fla.backends", backends)
    monkeypatch.setattr(_fla, "_fla_version", lambda: None)
    return registered


def test_registers_for_operation_kda_with_its_switch(monkeypatch):
    registered = _stand_in_fla(monkeypatch)
    assert _fla.register() == "registered"
    assert len(registered) == 1
    operation, cls = registered[0]
    assert operation == "kda"
    assert issubclass(cls, StandInBackend)
    assert (cls.backend_type, cls.env_var, cls.package_name) == ("flash_kda_decode", "FLA_FLASH_KDA_DECODE", "flash_kda")
    # On by default for every call the verifier accepts.
    assert cls.default_enable is True
    backend = cls()
    # fla finds both by the dispatched function's name.
    assert callable(backend.fused_recurrent_kda_fwd) and callable(backend.fused_recurrent_kda_fwd_verifier)
    # Another dispatched 'kda' function has neither: fla skips the backend for it.
    assert getattr(backend, "chunk_kda_fwd_intra", None) is None


@pytest.mark.parametrize("version", ["0.5.3", "0.7.0"])
def test_other_fla_versions_are_not_registered(monkeypatch, version):
    registered = _stand_in_fla(monkeypatch, version)
    assert _fla.register() == f"not registered: fla {version} is installed, the backend follows fla 0.6.x"
    assert registered == []


def test_an_error_while_registering_is_kept_not_raised(monkeypatch):
    _stand_in_fla(monkeypatch)

    def broken(*a, **kw):
        raise RuntimeError("registry exploded")

    monkeypatch.setattr(sys.modules["fla.backends"], "register", broken)
    assert _fla.register() == "not registered: RuntimeError: registry exploded"


def test_import_without_fla_works():
    code = ("import sys; sys.modules['fla'] = None\n"  # `import fla` raises, find_spec says absent
            "import flash_kda, flash_kda._fla as f\n"
            "print(f.status)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith("not registered"), r.stdout


STAND_IN_BACKENDS = """
registered = []


class BaseBackend:
    backend_type = "base"


def register(entry_point, **kw):
    def decorator(cls):
        registered.append((entry_point, cls.backend_type, cls.env_var))
        return cls
    return decorator
"""


@pytest.mark.parametrize("fla_first", [False, True], ids=["flash_kda_first", "fla_first"])
def test_registers_when_fla_backends_is_imported_later_or_earlier(tmp_path, fla_first):
    """fla is not imported by `import flash_kda`: the backend is registered once fla.backends
    is imported (or at once when it already was)."""
    pkg = tmp_path / "fla"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('__version__ = "0.6.0"\n')
    (pkg / "backends.py").write_text(STAND_IN_BACKENDS)
    order = ["import fla.backends", "import flash_kda"] if fla_first else ["import flash_kda", "import fla.backends"]
    code = "\n".join([
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})",
        order[0],
        "import flash_kda._fla as f",
        "print('fla imported by flash_kda:', 'fla' in sys.modules)" if not fla_first else "print('-')",
        "print(f.status)",
        order[1],
        "import fla.backends as b",
        "print(f.status)",
        "print(b.registered)",
    ])
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    if fla_first:
        assert lines[1] == "registered"
    else:
        assert lines[0] == "fla imported by flash_kda: False"
        assert lines[1] == "pending: registers when fla.backends is imported"
    assert lines[2] == "registered"
    assert lines[3] == "[('kda', 'flash_kda_decode', 'FLA_FLASH_KDA_DECODE')]"


class T:
    """A stand-in tensor: what the verifier reads (shape, ndim, dtype name, is_cuda, requires_grad)."""

    def __init__(self, *shape, dtype="torch.bfloat16", is_cuda=True, requires_grad=False):
        self.shape, self.ndim, self.dtype = tuple(shape), len(shape), dtype
        self.is_cuda, self.requires_grad = is_cuda, requires_grad


def _call(N=4, T_=1, H=2, HV=2, K=128, V=128, P=8, **change):
    kw = dict(q=T(N, T_, H, K), k=T(N, T_, H, K), v=T(N, T_, HV, V), g=T(N, T_, HV, K), beta=T(N, T_, HV),
              A_log=T(HV, dtype="torch.float32"), dt_bias=T(HV * K, dtype="torch.float32"),
              initial_state=T(P, HV, K, V, dtype="torch.float32"), ssm_state_indices=T(N, dtype="torch.int32"),
              use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
              lower_bound=-5.0)
    kw.update(change)
    return kw


@pytest.fixture
def gpu_build(monkeypatch):
    """A build with the kernels, every servable call in scope (FLA_FLASH_KDA_DECODE=1)."""
    monkeypatch.setattr(_fla, "_kernels", lambda: True)
    monkeypatch.setenv("FLA_FLASH_KDA_DECODE", "1")


@pytest.mark.parametrize("change", [
    dict(state_v_first=True),                                             # 4 sequences, T = 1
    dict(state_v_first=True, N=1),                                        # one sequence of one token
    dict(state_v_first=True, N=1, T_=2, ssm_state_indices=T(1, 2)),       # one sequence, a draft of 2
    dict(state_v_first=True, N=1, T_=5, ssm_state_indices=T(2), cu_seqlens=T(3)),  # varlen, 2 sequences
    dict(),                                                               # k-first, fp32 pool
    dict(N=1, HV=96, H=96, ssm_state_indices=T(1, 2), T_=2,
         initial_state=T(4, 96, 128, 128, dtype="torch.float32")),        # k-first fp32, 96 heads, T = 2
    # k-first bf16 pools: one token; more tokens on either side of the plan's switch from the
    # warp columns to the row blocks' split form (33 sequence-heads on the H200)
    dict(N=32, HV=4, H=4, ssm_state_indices=T(32), initial_state=T(40, 4, 128, 128)),
    dict(N=16, T_=2, ssm_state_indices=T(16, 2), initial_state=T(40, 2, 128, 128)),     # 32 heads
    dict(N=17, T_=2, ssm_state_indices=T(17, 2), initial_state=T(40, 2, 128, 128)),     # 34 heads
    dict(N=1, H=96, HV=96, T_=4, ssm_state_indices=T(1, 4), initial_state=T(4, 96, 128, 128)),
    dict(N=66, T_=2, ssm_state_indices=T(66, 2), initial_state=T(140, 2, 128, 128)),    # 132 heads
    dict(N=1, H=8, HV=8, T_=24, ssm_state_indices=T(8), cu_seqlens=T(9),
         initial_state=T(9, 8, 128, 128)),                                # varlen, 8 x 8 heads
])
def test_default_scope_is_every_servable_call(monkeypatch, change):
    """FLA_FLASH_KDA_DECODE unset serves what =1 serves (FASTER_THAN_FLA: flash_kda measured
    faster or level at every point of the H200 sweep): no call shape is left to fla by
    default, k-first bf16 pools of more tokens included."""
    monkeypatch.setattr(_fla, "_kernels", lambda: True)
    monkeypatch.delenv("FLA_FLASH_KDA_DECODE", raising=False)
    assert _fla.verify_call(**_call(**change)) == (True, None)
    monkeypatch.setenv("FLA_FLASH_KDA_DECODE", "1")
    assert _fla.verify_call(**_call(**change)) == (True, None)


def test_verifier_accepts_a_serving_decode_step(gpu_build):
    assert _fla.verify_call(**_call()) == (True, None)
    assert _fla.verify_call(**_call(T_=16, ssm_state_indices=T(4, 16, dtype="torch.int64"),
                                    num_accepted_tokens=T(4, dtype="torch.int32"))) == (True, None)
    # fla's call order, positionally
    kw = _call()
    args = [kw.pop(n) for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state")]
    assert _fla.verify_call(*args, **kw) == (True, None)
    # GVA, fp32 activations, the pre-computed gate and fla's own fused_recurrent_kda call (no pool)
    assert _fla.verify_call(**_call(H=1, HV=4, A_log=T(4, dtype="torch.float32"))) == (True, None)
    assert _fla.verify_call(**_call(q=T(4, 1, 2, 128, dtype="torch.float32"))) == (True, None)
    assert _fla.verify_call(**_call(use_gate_in_kernel=False, A_log=None, dt_bias=None, lower_bound=None))[0]
    assert _fla.verify_call(**_call(ssm_state_indices=None, initial_state=None, inplace_final_state=False,
                                    output_final_state=True)) == (True, None)
    # varlen: any number of tokens (the 16-token limit is a fixed-length batch's)
    one_each = _call(N=1, T_=64, ssm_state_indices=T(64, dtype="torch.int32"), cu_seqlens=T(65, dtype="torch.int64"))
    assert _fla.verify_call(**one_each) == (True, None)
    assert _fla.verify_call(**_call(N=1, T_=300, ssm_state_indices=T(3), cu_seqlens=T(4))) == (True, None)


@pytest.mark.parametrize("change, reason", [
    (dict(q=T(4, 1, 2, 64), k=T(4, 1, 2, 64), g=T(4, 1, 2, 64)), "K = V = 128"),
    (dict(v=T(4, 1, 2, 256)), "K = V = 128"),
    (dict(T_=17), "at most 16 tokens"),
    (dict(T_=2), "[N] ssm_state_indices with T > 1"),
    (dict(beta=T(4, 1, 2, 128)), "headwise beta"),
    (dict(q=T(4, 1, 2, 128, dtype="torch.float16")), "q must be bf16 or fp32"),
    (dict(initial_state=T(8, 2, 128, 128, dtype="torch.float64")), "initial_state must be bf16 or fp32"),
    (dict(q=T(4, 1, 2, 128, is_cuda=False)), "q must be a CUDA tensor"),
    (dict(ssm_state_indices=T(4, is_cuda=False)), "ssm_state_indices must be a CUDA tensor"),
    (dict(inplace_final_state=False), "needs inplace_final_state=True"),
    (dict(initial_state=None, ssm_state_indices=None), "inplace_final_state without initial_state"),
    (dict(num_accepted_tokens=T(4)), "num_accepted_tokens needs [N, T]"),
    (dict(N=1, T_=4, ssm_state_indices=T(4, 1), cu_seqlens=T(5)), "[N, T] ssm_state_indices with cu_seqlens"),
    (dict(lower_bound=None, A_log=None), "softplus gate needs A_log"),
    (dict(out=T(4, 1, 2, 64)), "out must be"),
    (dict(transpose_state_layout=True), "unknown keyword(s) transpose_state_layout"),
])
def test_verifier_rejects_with_the_reason(gpu_build, change, reason):
    accepted, why = _fla.verify_call(**_call(**change))
    assert not accepted
    assert reason in why and why.startswith("flash_kda decode: "), why


def test_verifier_rejects_everything_without_the_kernels(monkeypatch):
    monkeypatch.setattr(_fla, "_kernels_seen", [])
    monkeypatch.setattr(flash_kda, "cuda_available", lambda: False)
    accepted, why = _fla.verify_call(**_call())
    assert not accepted and "no sm_90 kernels" in why
    monkeypatch.setattr(flash_kda, "cuda_available", lambda: True)  # asked once per process
    assert not _fla.verify_call(**_call())[0]


def test_verifier_rejects_grad_when_torch_tracks_it(gpu_build, monkeypatch):
    monkeypatch.setattr(_fla, "_grad_enabled", lambda: True)
    accepted, why = _fla.verify_call(**_call(v=T(4, 1, 2, 128, requires_grad=True)))
    assert not accepted and "inference only" in why
    monkeypatch.setattr(_fla, "_grad_enabled", lambda: False)  # no_grad / inference_mode
    assert _fla.verify_call(**_call(v=T(4, 1, 2, 128, requires_grad=True))) == (True, None)


def test_verifier_hands_back_a_call_being_fallen_back(gpu_build, monkeypatch):
    monkeypatch.setattr(_fla._local, "fallback", True, raising=False)
    accepted, why = _fla.verify_call(**_call())
    assert not accepted and "handed back" in why


def test_implementation_falls_back_to_fla_on_a_rejected_call(monkeypatch):
    seen = {}

    def ours(*a, **kw):
        raise flash_kda._core.Error("flash_kda: q: rows must be 16-byte aligned")

    def triton(*a, **kw):
        seen["fallback"] = getattr(_fla._local, "fallback", False)
        return "fla's result"

    monkeypatch.setattr(flash_kda, "fused_recurrent_kda_fwd", ours)
    monkeypatch.setattr(_fla, "_fla_triton_function", lambda: triton)
    assert _fla.decode_call(1, x=2) == "fla's result"
    assert seen["fallback"] is True and getattr(_fla._local, "fallback", False) is False
    monkeypatch.setattr(_fla, "_fla_triton_function", lambda: None)
    with pytest.raises(flash_kda.Error):
        _fla.decode_call(1)
