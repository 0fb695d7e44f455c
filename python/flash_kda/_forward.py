"""flash_kda.fwd: the FlashKDA-compatible GPU entry point (torch imported lazily), and the
launch choices a caller may fix (flash_kda.LaunchOptions)."""

from __future__ import annotations

import dataclasses
import numbers
import os
from typing import TYPE_CHECKING

from . import _core

try:
    # Already imported by flash_kda/__init__.py when installed; a module global (not an import
    # inside fwd) so that torch.compile traces fwd without a graph break.
    import torch as _torch_module
except ImportError:
    _torch_module = None

if TYPE_CHECKING:
    import torch

#: flash_kda._ops.traced_fwd once the torch.library op is registered (None without torch or
#: without torch.library.custom_op): what fwd runs while torch.compile traces it.
_traced_fwd = None

# The call's tensors in the call table's order (include/flash_kda/call_table.h): fwd and
# reference build their tuples in this order, and the import fails if the table's order differs.
FORWARD_TENSORS = ("q", "k", "v", "g", "beta", "out", "A_log", "dt_bias", "cu_seqlens", "initial_state",
                   "final_state", "cu_seqlens_cpu", "ssm_state_indices", "intermediate_states", "intermediate_offsets")
if tuple(_core.forward_tensors) != FORWARD_TENSORS:
    raise ImportError(f"flash_kda._core's call table {tuple(_core.forward_tensors)} does not match the Python "
                      f"package's {FORWARD_TENSORS}: the package and its extension are from different builds")

# FLASH_KDA_CHECK_CU_SEQLENS=1 turns on fwd's check_cu_seqlens for every call (read once, at
# import), for debugging a caller such as fla that cannot pass the keyword.
_CHECK_CU_SEQLENS_ENV = os.environ.get("FLASH_KDA_CHECK_CU_SEQLENS", "") == "1"


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    """Launch choices for :func:`fwd` that the launch plan otherwise makes itself.

    Every field is an int; 0 (the default) means "the plan decides". None changes the function
    computed, only how the work is spread over the GPU (C++ ``flash_kda::LaunchOptions``).

    Attributes:
        num_sms: SMs the kernels may occupy, for a GPU partitioned by a CUDA green context or
            an MPS limit; at most the device's SM count.
        window_slots: process the input in windows of this many 16-token chunk slots (a tuning
            and test knob).
        segments: cut each sequence into this many segments combined by a scan; 1 turns the
            segment-parallel path off.
        recurrence_warps: warps per recurrence block, 4 or 8.

    Raises:
        flash_kda.Error: a field is not an int >= 0 (named ``launch_options.<field>``), here;
            recurrence_warps other than 0, 4 or 8, and num_sms above the SMs of the call's
            device or green context, are rejected by :func:`fwd` under the same names.
    """

    num_sms: int = 0
    window_slots: int = 0
    segments: int = 0
    recurrence_warps: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "_fields", self._as_tuple())  # checked once: the object is frozen

    def _as_tuple(self) -> tuple[int, int, int, int]:
        """The fields as C++ takes them, each checked: an int (not a bool), 0 <= value < 2^31
        (window_slots < 2^63)."""
        values = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            limit = (1 << 63) if f.name == "window_slots" else (1 << 31)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise _error(f"launch_options.{f.name}",
                             f"expected an int >= 0 (0: the launch plan decides), got {type(value).__name__} {value!r}")
            if not 0 <= value < limit:
                raise _error(f"launch_options.{f.name}",
                             f"expected an int in [0, {limit}) (0: the launch plan decides), got {value}")
            values.append(int(value))
        return tuple(values)


def fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None,
    out: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    lower_bound: float,
    initial_state: torch.Tensor | None = None,
    final_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    *,
    cu_seqlens_cpu: torch.Tensor | None = None,
    check_cu_seqlens: bool = False,
    launch_options: LaunchOptions | None = None,
    ssm_state_indices: torch.Tensor | None = None,
    intermediate_states: torch.Tensor | None = None,
    intermediate_offsets: torch.Tensor | None = None,
    intermediate_every: int = 0,
    intermediate_include_initial: bool = True,
) -> None:
    """KDA forward on an sm_90 GPU; the call and meaning of MoonshotAI FlashKDA's ``fwd``.

    Computes, per sequence and value head, the recurrence of docs/kda-spec.md with q/k L2
    normalisation, the safe gate ``a = lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`` and
    ``b = sigmoid(beta)`` fused in, and writes ``out`` (and ``final_state``) in place.

    Args (B batch, T tokens, H q/k heads, HV value heads, a multiple of H (GVA: value head hv
    reads q/k head hv // (HV / H); HV = H is plain multi-head), K = V = 128; varlen: B = 1,
    T = total tokens, N sequences):
        q, k: bf16 [B, T, H, K], raw (normalised inside).
        v: bf16 [B, T, HV, V].
        g: bf16 or fp32 [B, T, HV, K], raw gate input.
        beta: bf16 or fp32 [B, T, HV], logits.
        scale: output scale; None means K**-0.5.
        out: bf16 [B, T, HV, V], written.
        A_log: fp32 [HV]. dt_bias: fp32 [HV, K] (or flat [HV*K]).
        lower_bound: safe-gate floor in natural-log units, in [-5, 0).
        initial_state: optional bf16 or fp32 [N, HV, V, K] (v-first, i.e. S transposed); zero if None.
        final_state: optional bf16 or fp32 [N, HV, V, K] (its dtype independent of initial_state's;
            may be initial_state itself, updated in place); written.
        cu_seqlens: optional int64/int32 [N + 1] on the GPU, cumulative sequence starts:
            cu[0] = 0, non-decreasing, cu[N] = B*T. Its values are not checked (that would
            need a device-to-host copy and a sync); bad values are clamped to [0, B*T] on the
            device and give unspecified results (for the bad sequences and any rows their
            clamped ranges overlap), never an access outside the tensors. To have them
            checked, pass a host copy (cu_seqlens_cpu) or check_cu_seqlens=True.

    Keyword-only additions (not in FlashKDA's ``fwd``):
        cu_seqlens_cpu: optional host (CPU) int64/int32 [N + 1] copy of cu_seqlens's values,
            as fla keeps one. Its values are checked (cu[0] = 0, non-decreasing,
            cu[N] = T_total) at no cost to the GPU: a bad one raises flash_kda.Error naming
            cu_seqlens. It must equal cu_seqlens (not checked: that would need the sync).
        check_cu_seqlens: debugging aid: copy cu_seqlens to the host (a device-to-host copy
            and a sync per call, so not inside CUDA-graph capture) and check its values as
            above. The environment variable FLASH_KDA_CHECK_CU_SEQLENS=1, read at import,
            turns it on for every call (e.g. calls made by fla).
        launch_options: a :class:`LaunchOptions`, or None for the plan's choices.
        ssm_state_indices: optional int32/int64 [N] on the GPU: prefill on a state pool.
            initial_state and final_state are then pools [P, HV, V, K] (either may be absent,
            and final_state may be initial_state itself); sequence n starts from slot
            ``ssm_state_indices[n]`` and writes its final state back there, so a serving stack
            needs no gather or scatter copies. A negative entry marks a padded sequence: no slot
            is read or written and its out rows are zeros. Entries >= P are treated like
            negative ones on the GPU (their values are not checked on the host: that would need
            a sync); two sequences sharing a slot race (unspecified result). The meaning of
            fla's fused_recurrent_kda_fwd ssm_state_indices ([N] form).
        intermediate_states: optional bf16 or fp32 [S, HV, V, K] (v-first, contiguous), written:
            the states inside each sequence every ``intermediate_every`` tokens (prefix
            caching). Sequence n's states are rows ``intermediate_offsets[n] ..
            intermediate_offsets[n + 1] - 1``; its row ``offsets[n] + j`` is the state after
            ``j * intermediate_every`` tokens (``intermediate_include_initial``: j = 0 is the
            initial state) or after ``(j + 1) * intermediate_every`` tokens (otherwise), for
            every j with that many tokens in the sequence and inside its range; other rows are
            left as they are. fla's ``chunk_kda(return_intermediate_states=True)`` ``h`` is
            every 64 with the initial state and fla's chunk offsets (ceil(len / 64) rows each).
        intermediate_offsets: int32/int64 [N + 1] on the GPU, required with
            intermediate_states. Its values are not checked (that would need a sync): they are
            clamped to [0, S] on the device, so nothing outside the tensor is written.
        intermediate_every: tokens between intermediate states, a positive multiple of 16.
        intermediate_include_initial: whether row j = 0 of a sequence is its initial state.

    All tensors on one CUDA device. q, k, v, g, beta and out may be strided views (any batch,
    token and head strides, unit stride in the last dimension: e.g. slices of a fused qkv
    projection, or ``buf[:, :T]``) with 16-byte aligned rows (data pointer and strides in bytes
    multiples of 16; beta: element aligned); the other tensors are contiguous with 16-byte
    aligned data. Runs asynchronously on
    ``torch.cuda.current_stream(q.device)``; the scratch workspace comes from
    ``torch.empty(..., dtype=torch.uint8, device=q.device)`` (PyTorch's caching allocator), so the
    call may be captured in a CUDA graph. Inputs are never modified. Under torch.compile the
    call is the torch.library op flash_kda::forward (no graph break).

    Raises:
        flash_kda.Error: an argument is invalid or outside the kernel's supported subset (the
            message and ``.argument`` name it: a tensor that is None where one is required or
            not an array, a wrong dtype, rank, shape or device, scale or lower_bound not a
            real number, a bad launch_options field, ...), or this build has no CUDA kernels.
            Nothing is written then.
        RuntimeError: a CUDA launch failed.
        ImportError: PyTorch is not installed.
    """
    torch = _torch_module
    if torch is None:  # not importable when flash_kda was: one more try, for a torch installed since
        try:
            import torch
        except ImportError as e:
            raise ImportError("flash_kda.fwd needs PyTorch with CUDA and an sm_90 GPU; "
                              "without them only flash_kda.reference is available") from e
    if _traced_fwd is not None and torch.compiler.is_compiling():
        if ssm_state_indices is not None:
            raise _error("ssm_state_indices", "is not traced by torch.compile yet (the flash_kda::forward op has "
                         "no state pool); call fwd outside the compiled region")
        if intermediate_states is not None or intermediate_offsets is not None:
            raise _error("intermediate_states", "is not traced by torch.compile yet (the flash_kda::forward op has "
                         "no intermediate states); call fwd outside the compiled region")
        return _traced_fwd(q, k, v, g, beta, scale, out, A_log, dt_bias, lower_bound, initial_state, final_state,
                           cu_seqlens, cu_seqlens_cpu, check_cu_seqlens, launch_options)
    if lower_bound is None:
        raise _error("lower_bound", "a float in [-5, 0) (FlashKDA's safe gate needs one), got None")
    lower_bound = _real("lower_bound", lower_bound)
    if scale is not None:
        scale = _real("scale", scale)
    options = None
    if launch_options is not None:
        if not isinstance(launch_options, LaunchOptions):
            raise _error("launch_options", "expected a flash_kda.LaunchOptions or None, got "
                         f"{type(launch_options).__name__}")
        options = launch_options._fields
    if check_cu_seqlens is not False or _CHECK_CU_SEQLENS_ENV:
        if not isinstance(check_cu_seqlens, bool):
            raise _error("check_cu_seqlens", f"expected a bool, got {type(check_cu_seqlens).__name__}")
        if (check_cu_seqlens or _CHECK_CU_SEQLENS_ENV) and isinstance(cu_seqlens, torch.Tensor) \
                and cu_seqlens_cpu is None:
            cu_seqlens_cpu = cu_seqlens.cpu()  # the device values themselves: one copy and a sync
    device = _cuda_device(q, torch)
    if device is not None:
        stream = _current_raw_stream(torch, device)

        def alloc(nbytes: int) -> torch.Tensor:
            return torch.empty(nbytes, dtype=torch.uint8, device=device)
    else:
        # Not a GPU call: the C++ validation rejects it with a named error before any use of
        # the allocator or the stream.
        stream = 0

        def alloc(nbytes: int) -> torch.Tensor:
            return torch.empty(nbytes, dtype=torch.uint8)

    if type(intermediate_every) is not int and (isinstance(intermediate_every, bool)
                                                or not isinstance(intermediate_every, numbers.Integral)):
        raise _error("intermediate_every", "expected an int (a positive multiple of 16 with intermediate_states), got "
                     f"{type(intermediate_every).__name__}")
    if not -(1 << 63) <= intermediate_every < (1 << 63):
        raise _error("intermediate_every", f"expected a positive multiple of 16, got {intermediate_every}")
    if not isinstance(intermediate_include_initial, bool):
        raise _error("intermediate_include_initial",
                     f"expected a bool, got {type(intermediate_include_initial).__name__}")
    spacing = dict(intermediate_every=int(intermediate_every), intermediate_include_initial=intermediate_include_initial)
    tensors = (q, k, v, g, beta, out, A_log, dt_bias, cu_seqlens, initial_state, final_state, cu_seqlens_cpu,
               ssm_state_indices,
               intermediate_states, intermediate_offsets)
    raw = _raw_descriptions(tensors, torch)
    if raw is not None:
        _core.forward_raw(raw, scale, lower_bound, alloc, stream, options, **spacing)
        return
    # Some argument is not a torch tensor: DLPack reads the others (numpy arrays, ...) and the
    # binding names what cannot be read. DLPack refuses tensors that require grad; detach()
    # shares storage, so out/final_state are still written.
    _core.forward(tuple(t.detach() if getattr(t, "requires_grad", False) else t for t in tensors),
                  scale, lower_bound, alloc, stream, options, **spacing)


def launch(tensors: tuple, settings: tuple, options: tuple | None, torch) -> None:
    """_core.forward_raw (or, when some argument is not a torch tensor, _core.forward, whose
    errors name it) on torch's current stream of q's device, with the workspace from torch's
    allocator: what fwd does, for any gate, layout and flags.

    tensors: one per name of FORWARD_TENSORS (None where absent); settings: (scale or None,
    lower_bound, gate, state_layout, use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval) as
    _core.forward takes them; options: LaunchOptions._fields or None. Raises flash_kda.Error
    before anything is written."""
    q = tensors[0]
    device = _cuda_device(q, torch)
    if device is not None:
        stream = _current_raw_stream(torch, device)
    else:
        device = getattr(q, "device", None)
        stream = 0  # the C++ validation rejects a host q by name before using the stream

    def alloc(nbytes: int):
        return torch.empty(nbytes, dtype=torch.uint8, device=device)

    scale, lower_bound, *flags = settings
    raw = _raw_descriptions(tensors, torch)
    if raw is not None:
        _core.forward_raw(raw, scale, lower_bound, alloc, stream, options, *flags)
        return
    _core.forward(tuple(t.detach() if getattr(t, "requires_grad", False) else t for t in tensors),
                  scale, lower_bound, alloc, stream, options, *flags)


_DTYPE_CODES: dict = {}  # torch.dtype -> flash_kda DType code (_core.dtype_codes), on first use


def _raw_descriptions(tensors, torch) -> tuple | None:
    """(data_ptr, dtype, shape, strides, device index) of each tensor (None stays None) for
    _core.forward_raw, or None when one of them is not a CUDA or host torch tensor: that call
    takes the DLPack path, whose errors say what is wrong. dtype is the library's code, or the
    torch name of a dtype it has none for (the binding names it in its error). The device index
    is -1 for host tensors (cu_seqlens_cpu; any other is rejected by name).

    Why: importing a torch tensor through DLPack runs torch's Python __dlpack__ (~5 us); a
    dozen of them would make flash_kda.fwd's host time ~60 us a call, more than the whole GPU
    time of small problems."""
    codes = _DTYPE_CODES or _fill_dtype_codes(torch)
    tensor_type = torch.Tensor
    raw = []
    for t in tensors:
        if t is None:
            raw.append(None)
            continue
        # is_cpu, not device.type == "cpu": the same test without building a torch.device.
        if not isinstance(t, tensor_type) or not (t.is_cuda or t.is_cpu):
            return None
        dtype = t.dtype
        code = codes.get(dtype)
        if code is None:
            code = str(dtype).removeprefix("torch.")
        raw.append((t.data_ptr(), code, t.shape, t.stride(), t.get_device()))  # torch.Size is a tuple
    return tuple(raw)


def _fill_dtype_codes(torch) -> dict:
    """_DTYPE_CODES filled from _core.dtype_codes (once)."""
    for name, code in _core.dtype_codes.items():
        _DTYPE_CODES[getattr(torch, name)] = code
    return _DTYPE_CODES


def _cuda_device(q, torch):
    """q.device when it is a CUDA device, else None. A torch tensor answers with is_cuda, which
    builds no torch.device; anything else is asked for device.type."""
    if isinstance(q, torch.Tensor):
        return q.device if q.is_cuda else None
    device = getattr(q, "device", None)
    return device if getattr(device, "type", None) == "cuda" else None


def _current_raw_stream(torch, device) -> int:
    """The cudaStream_t of torch's current stream on ``device`` (a CUDA torch.device), as an int.

    torch._C._cuda_getCurrentRawStream (what Triton's launcher calls) returns it without building
    a torch.cuda.Stream object per call; torch.cuda.current_stream is the fallback where a torch
    build lacks it. Both give the capturing stream under CUDA-graph capture."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None:
        return torch.cuda.current_stream(device).cuda_stream
    return raw(device.index if device.index is not None else torch.cuda.current_device())


def _real(argument: str, value) -> float:
    """float(value) for a real number (int, float, numpy scalar; not bool or str), else a
    flash_kda.Error naming `argument`."""
    if type(value) is float:  # the usual call: no numbers.Real (an ABC) test
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _error(argument, f"expected a real number, got {type(value).__name__} {value!r}")
    return float(value)


def _error(argument: str, expected: str) -> Exception:
    """A flash_kda.Error worded like the C++ ones ('flash_kda: <argument>: <expected>')."""
    e = _core.Error(f"flash_kda: {argument}: {expected}")
    e.argument = argument
    return e
