"""flash_kda's forward and backward as the backend of flash-linear-attention 0.6.x's ``chunk_kda``.

When fla 0.6.x is installed, importing flash_kda registers FlashKDAChunkBackend for fla's
dispatched ``fla.ops.kda.chunk_kda`` through fla's public registry
(``fla.backends.register(chunk_kda)``), at once when fla.ops.kda is already imported, else
right after it is (an import hook; fla is never imported by flash_kda). fla's chunk_kda (and
its KDA layer in prefill and in training) then runs flash_kda.chunk_kda for every call the
verifier accepts, and its Triton path for the rest (fla logs the verifier's reason once per
process).

fla 0.6.0 ships its own backend for flash_kda ("flash_kda", fla/ops/kda/backends/flash_kda.py),
which accepts only FlashKDA's subset and then calls flash_kda.fwd with arguments fwd refuses
for some calls it accepted (a bf16 initial_state beside the fp32 final state it allocates,
strided views), which would raise to the user. This backend is registered under the same
backend type, so fla's registry replaces that one with it (same switch: FLA_FLASH_KDA=0
turns it off; same priority and place in fla's order).

The verifier decides by the call's real arguments: the Python-level refusals of
flash_kda.chunk_kda (cp_context, intermediate states with grad, fla's keyword rules), a CUDA q
on an sm_90 device of a build with the kernels, then the C++ validation of the very call
(flash_kda::validate_forward) and, for a training call (an input requires grad while grad is
enabled), of its backward (flash_kda::validate_backward), when FLA_FLASH_KDA_TRAIN=1 (read at
each training call): fla's KimiDeltaAttention then trains through flash_kda's forward and
backward with no change to the model. Training dispatch is opt-in because flash_kda's backward
is slower than fla's Triton backward (docs/performance.md "Backward"); unset or any other value
keeps training calls on fla's Triton path while inference calls still dispatch here;
FLA_FLASH_KDA=0 turns the whole backend off. The verifier never raises; neither does a call it
accepted that the forward then rejects: that call runs fla's Triton function instead (nothing
was written; a training call's backward was validated with its forward, before anything ran).
Without fla, with another fla version, or on any error, importing flash_kda still works and
:data:`status` says why nothing was registered.
"""

from __future__ import annotations

import logging
import os
import sys

from . import _chunk, _fla

logger = logging.getLogger(__name__)

#: The backend's type in fla's registry: that of fla's built-in FlashKDA backend, which
#: registering under it replaces.
BACKEND_TYPE = "flash_kda"
#: fla's switch of that backend type ("0": off), kept.
ENV_VAR = "FLA_FLASH_KDA"
#: fla's built-in FlashKDA backend's priority (lower runs first), kept.
PRIORITY = 3
#: The switch of training dispatch ("1": flash_kda serves training calls; unset or any other
#: value: they run fla's Triton path), read at each training call. Opt-in while flash_kda's
#: backward is slower than fla's (docs/performance.md "Backward").
TRAIN_ENV_VAR = "FLA_FLASH_KDA_TRAIN"


def train_enabled() -> bool:
    """Whether training calls may dispatch to flash_kda (TRAIN_ENV_VAR is "1")."""
    return os.environ.get(TRAIN_ENV_VAR, "").strip() == "1"

#: "registered", "pending: ..." (fla installed, fla.ops.kda not imported yet), or why the
#: backend was not registered (fla absent, another version, an error).
status: str = "not attempted"

_capability: dict = {}  # CUDA device index -> (major, minor), asked once per device


def _reject(reason: str) -> tuple[bool, str]:
    return False, f"flash_kda chunk_kda: {reason}"


def _sm90(device) -> bool:
    """Whether the CUDA device `device` (a torch.device) is an sm_90 GPU."""
    torch = sys.modules["torch"]
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _capability:
        _capability[index] = tuple(torch.cuda.get_device_capability(index))
    return _capability[index] == (9, 0)


def verify_call(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
                return_intermediate_states=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
                cp_context=None, use_graph=False, max_num_seqs=None, **kwargs) -> tuple[bool, str | None]:
    """(True, None) when flash_kda.chunk_kda serves this fla chunk_kda call, else (False, the
    reason). A training call (an input requires grad while grad is enabled) is served when
    training dispatch is on (train_enabled) and the backward's C++ validation accepts it too.
    Reads shapes, dtypes, strides and devices (never device data: no sync). Never raises."""
    try:
        if not _fla._kernels():
            return _reject("this flash_kda build has no sm_90 kernels or no sm_90 GPU is visible")
        if not _fla._is_cuda_tensor(q):
            return _reject("q must be a CUDA tensor")
        if not _sm90(q.device):
            return _reject(f"q is on {q.device}, not an sm_90 GPU")

        plan = _chunk.plan_call(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                                use_gate_in_kernel, use_beta_sigmoid_in_kernel, allow_neg_eigval, safe_gate,
                                lower_bound, disable_recompute, return_intermediate_states, state_v_first,
                                cu_seqlens, cu_seqlens_cpu, cp_context, use_graph, max_num_seqs, kwargs,
                                _fla._grad_enabled())
        if plan.grad and not train_enabled():
            return _reject(f"training calls are off ({TRAIN_ENV_VAR}=1 turns them on)")
        _chunk.validate_call(plan)
        if plan.grad:
            _chunk.validate_backward_call(plan)
    except ValueError as err:  # flash_kda.Error: its message names the argument and the reason
        return False, str(err)
    except Exception as err:  # noqa: BLE001 - anything else: fla's path, saying why
        return _reject(f"{type(err).__name__}: {err}")
    return True, None


def chunk_call(*args, **kwargs):
    """The backend's implementation: flash_kda.chunk_kda (looked up at call time, so a wrapper
    installed on it sees fla's calls). A call the forward rejects after the verifier accepted
    it runs fla's own Triton function instead; nothing was written by the rejected call."""
    import flash_kda

    return _fla.run_or_hand_back(flash_kda.chunk_kda, _fla_triton_function, "chunk_kda", logger, args, kwargs)


def _fla_triton_function():
    """fla's chunk_kda behind its dispatch wrapper (no backend lookup: Triton), or None."""
    return _fla.fla_function("fla.ops.kda.chunk", "chunk_kda")


def register() -> str:
    """Register the backend with fla 0.6.x; sets and returns :data:`status`. Never raises.

    fla is not imported here (importing it loads its layers and models, seconds of work). When
    fla.ops.kda is already imported the backend is registered at once (replacing fla's built-in
    one, which fla.ops.kda registers on import); otherwise, if fla is installed, right after
    fla.ops.kda is first imported (fla's chunk_kda lives there, so the backend is in place
    before any call). A flash_kda imported while fla.ops.kda itself is being imported registers
    after fla's built-in backend module, the last thing fla.ops.kda imports.
    """
    global status
    try:
        status = _register()
    except Exception as err:  # noqa: BLE001 - importing flash_kda must never fail because of fla
        status = f"not registered: {type(err).__name__}: {err}"
    return status


def _initializing(module) -> bool:
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def _register() -> str:
    kda = sys.modules.get("fla.ops.kda")
    if kda is not None:
        if not _initializing(kda):
            return _register_with_fla()
        builtin = sys.modules.get("fla.ops.kda.backends.flash_kda")
        if builtin is not None and not _initializing(builtin):
            return _register_with_fla()
        if builtin is None:
            _fla.after_import("fla.ops.kda.backends.flash_kda", _after_import)
            return "pending: registers when fla's built-in FlashKDA backend is imported"
        return "not registered: imported while fla's built-in FlashKDA backend was being imported"
    if (problem := _fla.installed_fla_problem()) is not None:
        return problem
    _fla.after_import("fla.ops.kda", _after_import)
    return "pending: registers when fla.ops.kda is imported"


def _after_import(module) -> None:
    """Run by the import hook once fla.ops.kda (or its built-in backend module) has executed."""
    global status
    try:
        status = _register_with_fla()
    except Exception as err:  # noqa: BLE001 - fla's import must not fail because of flash_kda
        status = f"not registered: {type(err).__name__}: {err}"


def _register_with_fla() -> str:
    """Register on the imported fla.backends for fla.ops.kda.chunk.chunk_kda, after checking
    fla's version."""
    if (problem := _fla.imported_fla_problem()) is not None:
        return problem
    backends = sys.modules.get("fla.backends")
    chunk = sys.modules.get("fla.ops.kda.chunk")
    if backends is None or chunk is None or not hasattr(chunk, "chunk_kda"):
        return "not registered: fla.ops.kda.chunk.chunk_kda or fla.backends is missing"
    backends.register(chunk.chunk_kda)(_backend_class(backends.BaseBackend))
    return "registered"


def _backend_class(base):
    """The backend class on fla's BaseBackend: fla finds the implementation and the verifier by
    the dispatched function's name (chunk_kda, chunk_kda_verifier)."""

    class FlashKDAChunkBackend(base):
        """flash_kda's sm_90 forward, and for training calls its backward, for fla's chunk_kda
        (whatever the C++ validations accept: gate modes, GVA, state layouts and dtypes,
        strides); replaces fla's built-in FlashKDA backend (module docstring of
        flash_kda._fla_chunk)."""

        backend_type = BACKEND_TYPE
        package_name = "flash_kda"
        env_var = ENV_VAR
        default_enable = True
        priority = PRIORITY

        def chunk_kda_verifier(self, *args, **kwargs):
            return verify_call(*args, **kwargs)

        def chunk_kda(self, *args, **kwargs):
            return chunk_call(*args, **kwargs)

    return FlashKDAChunkBackend
