"""flash_kda's decode as a backend of flash-linear-attention 0.6.x.

When fla 0.6.x is installed, importing flash_kda registers its backend (FlashKDADecodeBackend)
for fla's operation 'kda' through fla's public registry (fla.backends.register), at once when
fla is already imported, else as soon as fla.backends is (see register): fla's own
fused_recurrent_kda_fwd (decorated ``@dispatch('kda')``) and everything built on it
(fused_recurrent_kda, fla's KDA layer in decode) then run flash_kda's decode for the calls the
backend's verifier accepts, and fla's Triton kernel for the rest (fla logs the verifier's
reason once per process). FLA_FLASH_KDA_DECODE, read by fla at every dispatch, sets the
scope:
- unset (the default) or "1": every call flash_kda can serve (on the H200 faster than fla's
  Triton decode, or level, at every point of the sweep: FASTER_THAN_FLA below;
  docs/performance.md, "Decode"; parts with other SM counts are not measured);
- "0": none (fla's own kernel for every call).

Registration never raises: without fla, with another fla version, or on any error, importing
flash_kda still works and :data:`status` says why nothing was registered.
"""

from __future__ import annotations

import importlib.metadata
import logging
import threading

logger = logging.getLogger(__name__)

#: fla versions whose fused_recurrent_kda_fwd signature and registry this backend follows.
SUPPORTED_FLA = "0.6."
#: The environment variable fla reads to enable or disable this backend ("0": off).
ENV_VAR = "FLA_FLASH_KDA_DECODE"
#: The backend's type in fla's registry (distinct from fla's own "flash_kda" chunk backend,
#: whose FLA_FLASH_KDA switch would otherwise also force this one on).
BACKEND_TYPE = "flash_kda_decode"
#: The operation whose registry fla's fused_recurrent_kda_fwd dispatches through.
OPERATION = "kda"

#: "registered", "pending: ..." (fla installed, not imported yet), or why the backend was not
#: registered (fla absent, another version, an error).
status: str = "not attempted"

_local = threading.local()


#: str() of the torch dtypes the decode reads and writes (compared as names, so that the
#: verifier's decisions can be tested on stand-in tensors without torch).
_FLOATS = ("torch.bfloat16", "torch.float32")


def _is_cuda_tensor(t) -> bool:
    """A torch tensor (or a stand-in with its attributes) on a CUDA device. is_cuda is all
    that is read: the verifier runs before every dispatched decode step, a few microseconds
    of GPU time, so it reads as little as it can."""
    return getattr(t, "is_cuda", False) is True


def _grad_enabled() -> bool:
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and torch.is_grad_enabled()


_kernels_seen: list[bool] = []


def _kernels() -> bool:
    """flash_kda.cuda_available(), asked once per process (a device does not appear or change
    its architecture while a process runs)."""
    if not _kernels_seen:
        import flash_kda

        _kernels_seen.append(bool(flash_kda.cuda_available()))
    return _kernels_seen[0]


def _reject(reason: str) -> tuple[bool, str]:
    return False, f"flash_kda decode: {reason}"


#: Where flash_kda's decode is faster than fla's Triton kernel on the H200 (BENCHMARK_H200.md
#: "Decode": the whole sweep, N = 1 to 1024 sequences x 4 to 96 heads x T = 1, 2, 4, both pool
#: dtypes and layouts, 336 points, fla in the same run): every point but two ties at 1 x 96
#: heads (v-first bf16 T = 1, k-first bf16 T = 2), so the default scope is every call flash_kda
#: can serve. k-first bf16 pools with more than one token owe it to the row blocks' split form
#: from 33 sequence-heads (plan.h, kfirst_rows_serves), where the warp columns' narrow tiles are
#: slower than fla's kernel.
FASTER_THAN_FLA = "every call flash_kda serves"


def verify_call(q, k, v, g, beta, A_log=None, dt_bias=None, initial_state=None, scale=None,
                output_final_state=False, inplace_final_state=True, state_v_first=False, cu_seqlens=None,
                ssm_state_indices=None, num_accepted_tokens=None, use_qk_l2norm_in_kernel=False,
                use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                lower_bound=None, out=None, **kwargs) -> tuple[bool, str | None]:
    """(True, None) when flash_kda's decode serves this fused_recurrent_kda_fwd call, else
    (False, the reason). Reads shapes, dtypes and devices only (never tensor data: no sync).
    A fixed-length batch may have up to 16 tokens per sequence; varlen sequences any number
    (the kernel runs them in rounds of tokens), where the H200 sweep measured flash_kda faster
    or level (FASTER_THAN_FLA)."""
    if getattr(_local, "fallback", False):
        return _reject("a call flash_kda handed back to fla")
    if kwargs:
        return _reject(f"unknown keyword(s) {', '.join(sorted(kwargs))}")
    if not _kernels():
        return _reject("this flash_kda build has no sm_90 kernels or no sm_90 GPU is visible")
    named = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
    for name, t in named.items():
        if not _is_cuda_tensor(t):
            return _reject(f"{name} must be a CUDA tensor")
        if str(t.dtype) not in _FLOATS:
            return _reject(f"{name} must be bf16 or fp32, got {t.dtype}")
    optional = {"A_log": A_log, "dt_bias": dt_bias, "initial_state": initial_state, "cu_seqlens": cu_seqlens,
                "ssm_state_indices": ssm_state_indices, "num_accepted_tokens": num_accepted_tokens, "out": out}
    for name, t in optional.items():
        if t is not None and not _is_cuda_tensor(t):
            return _reject(f"{name} must be a CUDA tensor or None")
    if _grad_enabled() and any(t is not None and t.requires_grad for t in (*named.values(), *optional.values())):
        return _reject("inference only (an input requires grad)")
    if q.ndim != 4 or v.ndim != 4:
        return _reject("q and v must be 4-d")
    if q.shape[-1] != 128 or v.shape[-1] != 128:
        return _reject(f"needs K = V = 128, got K = {q.shape[-1]}, V = {v.shape[-1]}")
    if beta.ndim != 3:
        return _reject("needs beta [B, T, HV] (headwise beta is not served)")
    if v.shape[2] % q.shape[2] != 0:
        return _reject(f"value heads HV = {v.shape[2]} must be a multiple of H = {q.shape[2]}")
    if initial_state is not None and str(initial_state.dtype) not in _FLOATS:
        return _reject(f"initial_state must be bf16 or fp32, got {initial_state.dtype}")
    if out is not None and (tuple(out.shape) != tuple(v.shape) or str(out.dtype) not in _FLOATS):
        return _reject("out must be bf16 or fp32 of v's shape")
    if cu_seqlens is None and q.shape[1] > 16:
        return _reject(f"at most 16 tokens per sequence in a fixed-length batch, got T = {q.shape[1]}")
    if inplace_final_state and initial_state is None:
        return _reject("inplace_final_state without initial_state")
    if ssm_state_indices is not None:
        if not inplace_final_state:
            return _reject("ssm_state_indices needs inplace_final_state=True")
        if ssm_state_indices.ndim == 2 and cu_seqlens is not None:
            return _reject("[N, T] ssm_state_indices with cu_seqlens")
        if ssm_state_indices.ndim == 1 and cu_seqlens is None and q.shape[1] > 1:
            # flash_kda writes only the last token's state to the sequence's slot, where fla's
            # kernel indexes the pool per token: a fixed-length batch of several tokens with [N]
            # slots is left to fla. (A varlen batch's lengths are unknown without a sync; its
            # usual decode form, one token a sequence, means the same on both.)
            return _reject("[N] ssm_state_indices with T > 1 tokens a sequence (fla's own pool indexing)")
    if num_accepted_tokens is not None and (ssm_state_indices is None or ssm_state_indices.ndim != 2):
        return _reject("num_accepted_tokens needs [N, T] ssm_state_indices")
    if use_gate_in_kernel and lower_bound is None and A_log is None:
        return _reject("the softplus gate needs A_log")
    return True, None


def decode_call(*args, **kwargs):
    """The backend's implementation: flash_kda.fused_recurrent_kda_fwd (looked up at call time,
    so a wrapper installed on it sees fla's calls). A call the C++ validation rejects (a case
    the verifier cannot see from shapes, e.g. a misaligned view) runs fla's own Triton
    function instead; nothing was written by the rejected call."""
    import flash_kda

    return run_or_hand_back(flash_kda.fused_recurrent_kda_fwd, _fla_triton_function, "decode", logger, args, kwargs)


def run_or_hand_back(call, fla_fallback, what: str, log: logging.Logger, args: tuple, kwargs: dict):
    """call(*args, **kwargs); when it raises flash_kda.Error (a rejected call writes nothing),
    fla's own function (fla_fallback(), or None to re-raise) on the same arguments instead,
    logged on `log`. While that runs, flash_kda's backends decline fla's dispatch (verify_call
    reads the flag), so the handed-back call cannot come back here."""
    import flash_kda

    try:
        return call(*args, **kwargs)
    except flash_kda.Error as err:
        fallback = fla_fallback()
        if fallback is None:
            raise
        log.info("flash_kda %s handed a call back to fla: %s", what, err)
        _local.fallback = True
        try:
            return fallback(*args, **kwargs)
        finally:
            _local.fallback = False


def _fla_triton_function():
    """fla's undecorated fused_recurrent_kda_fwd (behind its dispatch wrapper), or None."""
    return fla_function("fla.ops.kda.fused_recurrent", "fused_recurrent_kda_fwd")


def fla_function(module: str, name: str):
    """fla's function `name` of `module` behind its dispatch wrapper (fla's own Triton path, no
    backend lookup), or None when it cannot be imported (the caller then re-raises its error)."""
    import importlib
    import inspect

    try:
        return inspect.unwrap(getattr(importlib.import_module(module), name))
    except Exception:  # noqa: BLE001 - no fallback then
        return None


def _fla_version() -> str | None:
    """fla's version from the installed distribution's metadata (no import), else None."""
    for dist in ("fla-core", "flash-linear-attention"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def installed_fla_problem() -> str | None:
    """Why no backend can wait for fla's import ("not registered: ..."), from the installed
    distribution alone (fla is not imported): fla absent, or a version other than 0.6.x; None
    when the backend may register once fla is imported."""
    import importlib.util
    import sys

    if sys.modules.get("fla", False) is None or importlib.util.find_spec("fla") is None:
        return "not registered: fla is not installed"
    return version_problem(_fla_version(), unknown_ok=True)


def imported_fla_problem() -> str | None:
    """installed_fla_problem's check on the imported fla (its __version__), None when 0.6.x."""
    import sys

    version = getattr(sys.modules.get("fla"), "__version__", None)
    if version is None:
        return "not registered: the importable fla has no version (not flash-linear-attention's package?)"
    return version_problem(str(version))


def version_problem(version: str | None, unknown_ok: bool = False) -> str | None:
    """"not registered: ..." for an fla version the backends do not follow, else None."""
    if (version is None and unknown_ok) or (version is not None and version.startswith(SUPPORTED_FLA)):
        return None
    return f"not registered: fla {version} is installed, the backend follows fla {SUPPORTED_FLA}x"


def register() -> str:
    """Register the backend with fla 0.6.x; sets and returns :data:`status`. Never raises.

    fla is not imported here (with flash-linear-attention installed, importing fla loads its
    layers and models, seconds of work `import flash_kda` should not pay): when fla.backends is
    already imported the backend is registered at once; otherwise, if fla is installed, an
    import hook registers it right after fla.backends is first imported (fla's
    fused_recurrent_kda_fwd imports it to dispatch, so the backend is there before any call).
    """
    global status
    try:
        status = _register()
    except Exception as err:  # noqa: BLE001 - importing flash_kda must never fail because of fla
        status = f"not registered: {type(err).__name__}: {err}"
    return status


def _register() -> str:
    import sys

    if sys.modules.get("fla.backends") is not None:
        return _register_with(sys.modules["fla.backends"])
    if (problem := installed_fla_problem()) is not None:
        return problem
    after_import("fla.backends", _after_import)
    return "pending: registers when fla.backends is imported"


def _register_with(backends) -> str:
    """Register on the imported fla.backends module, after checking fla's version."""
    if (problem := imported_fla_problem()) is not None:
        return problem
    backends.register(OPERATION)(_backend_class(backends.BaseBackend))
    return "registered"


def _after_import(module) -> None:
    """Run by the import hook (after_import) once fla.backends has executed."""
    global status
    try:
        status = _register_with(module)
    except Exception as err:  # noqa: BLE001 - fla's import must not fail because of flash_kda
        status = f"not registered: {type(err).__name__}: {err}"


def after_import(fullname: str, callback) -> None:
    """Runs callback(module) right after the module `fullname` is first imported (it must not
    be imported yet), through a sys.meta_path finder; once per name."""
    import sys

    if not any(isinstance(f, _AfterImport) and f.fullname == fullname for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(fullname, callback))


class _AfterImport:
    """A sys.meta_path finder that lets the normal finders locate one module and wraps its
    loader so that a callback runs right after the module executes; it removes itself then."""

    def __init__(self, fullname: str, callback):
        self.fullname, self.callback = fullname, callback
        self.finding = threading.local()

    def find_spec(self, fullname, path=None, target=None):
        import importlib.util
        import sys

        if fullname != self.fullname or getattr(self.finding, "on", False):
            return None
        self.finding.on = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.finding.on = False
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _RegisteringLoader(spec.loader, self.callback)
        return spec


class _RegisteringLoader:
    """The module's own loader, with the callback after its exec_module."""

    def __init__(self, loader, callback):
        self._loader, self._callback = loader, callback

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._callback(module)

    def __getattr__(self, name):  # get_source, is_package, ...: the real loader's
        return getattr(self._loader, name)


def _backend_class(base):
    """The backend class on fla's BaseBackend: fla finds the implementation and the verifier
    by the dispatched function's name (fused_recurrent_kda_fwd, fused_recurrent_kda_fwd_verifier)."""

    class FlashKDADecodeBackend(base):
        """flash_kda's sm_90 decode for fla's fused_recurrent_kda_fwd (inference only, K = V =
        128, at most 16 tokens per sequence of a fixed-length batch); on by default for every
        call it serves, FLA_FLASH_KDA_DECODE=0 off (see the module docstring)."""

        backend_type = BACKEND_TYPE
        package_name = "flash_kda"
        env_var = ENV_VAR
        default_enable = True
        priority = 3

        def fused_recurrent_kda_fwd_verifier(self, *args, **kwargs):
            return verify_call(*args, **kwargs)

        def fused_recurrent_kda_fwd(self, *args, **kwargs):
            return decode_call(*args, **kwargs)

    return FlashKDADecodeBackend
