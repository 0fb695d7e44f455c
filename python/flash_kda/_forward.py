"""flash_kda.fwd: the FlashKDA-compatible GPU entry point (torch imported lazily)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _core

if TYPE_CHECKING:
    import torch


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
        final_state: optional [N, HV, V, K], same dtype as initial_state when both given; written.
        cu_seqlens: optional int64/int32 [N + 1] on the GPU, cumulative sequence starts:
            cu[0] = 0, non-decreasing, cu[N] = B*T. Its values are not checked (that would
            need a device-to-host copy and a sync); bad values are clamped to [0, B*T] on the
            device and give unspecified results (for the bad sequences and any rows their
            clamped ranges overlap), never an access outside the tensors.

    All tensors contiguous, on one CUDA device, with 16-byte aligned data (a view that starts
    mid-row of a larger tensor may not be). Runs asynchronously on
    ``torch.cuda.current_stream(q.device)``; the scratch workspace comes from
    ``torch.empty(..., dtype=torch.uint8, device=q.device)`` (PyTorch's caching allocator), so the
    call may be captured in a CUDA graph. Inputs are never modified.

    Raises:
        flash_kda.Error: an argument is invalid or outside the kernel's supported subset (the
            message names it), the tensors are not on a CUDA device, or this build has no CUDA
            kernels. Nothing is written then.
        RuntimeError: a CUDA launch failed.
        TypeError: a tensor argument is not a torch tensor (or other DLPack array).
        ImportError: PyTorch is not installed.
    """
    try:
        import torch
    except ImportError as e:
        raise ImportError("flash_kda.fwd needs PyTorch with CUDA and an sm_90 GPU; "
                          "without them only flash_kda.reference is available") from e

    if lower_bound is None:
        raise _error("lower_bound", "a float in [-5, 0) (FlashKDA's safe gate needs one), got None")
    device = getattr(q, "device", None)
    on_cuda = getattr(device, "type", None) == "cuda"
    if on_cuda:
        stream = _current_raw_stream(torch, device)

        def alloc(nbytes: int) -> torch.Tensor:
            return torch.empty(nbytes, dtype=torch.uint8, device=device)
    else:
        # Not a GPU call: the C++ validation rejects it with a named error before any use of
        # the allocator or the stream.
        stream = 0

        def alloc(nbytes: int) -> torch.Tensor:
            return torch.empty(nbytes, dtype=torch.uint8)

    tensors = (q, k, v, g, beta, out, A_log, dt_bias, cu_seqlens, initial_state, final_state)
    if on_cuda:
        raw = _raw_descriptions(tensors, torch)
        if raw is not None:
            _core.forward_raw(raw, None if scale is None else float(scale), float(lower_bound), alloc, stream)
            return
    # DLPack refuses tensors that require grad; nn.Parameters (A_log, dt_bias of fla's layer) do
    # even under inference_mode. detach() shares storage, so out/final_state are still written.
    q, k, v, g, beta, out, A_log, dt_bias, cu_seqlens, initial_state, final_state = (
        t.detach() if getattr(t, "requires_grad", False) else t for t in tensors)
    _core.forward(
        q, k, v, g, beta, out, A_log, dt_bias, cu_seqlens, initial_state, final_state,
        None if scale is None else float(scale), float(lower_bound), alloc, stream,
    )


_DTYPE_CODES: dict = {}  # torch.dtype -> flash_kda DType code (_core.dtype_codes), on first use


def _raw_descriptions(tensors, torch) -> tuple | None:
    """(data_ptr, dtype code, shape, strides, device index) of each tensor (None stays None) for
    _core.forward_raw, or None when one of them is not a CUDA torch tensor of a dtype the library
    names: that call takes the DLPack path, whose errors say what is wrong.

    Why: importing a torch tensor through DLPack runs torch's Python __dlpack__ (~5 us); eleven
    of them made flash_kda.fwd's host time ~60 us a call, more than the whole GPU time of small
    problems (docs/perf-notes.md, v6)."""
    if not _DTYPE_CODES:
        for name, code in _core.dtype_codes.items():
            _DTYPE_CODES[getattr(torch, name)] = code
    raw = []
    for t in tensors:
        if t is None:
            raw.append(None)
            continue
        if not isinstance(t, torch.Tensor) or not t.is_cuda:
            return None
        code = _DTYPE_CODES.get(t.dtype)
        if code is None:
            return None
        raw.append((t.data_ptr(), code, t.shape, t.stride(), t.get_device()))  # torch.Size is a tuple
    return tuple(raw)


def _current_raw_stream(torch, device) -> int:
    """The cudaStream_t of torch's current stream on ``device`` (a CUDA torch.device), as an int.

    torch._C._cuda_getCurrentRawStream (what Triton's launcher calls) returns it without building
    a torch.cuda.Stream object per call; torch.cuda.current_stream is the fallback where a torch
    build lacks it. Both give the capturing stream under CUDA-graph capture."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None:
        return torch.cuda.current_stream(device).cuda_stream
    return raw(device.index if device.index is not None else torch.cuda.current_device())


def _error(argument: str, expected: str) -> Exception:
    """A flash_kda.Error worded like the C++ ones ('flash_kda: <argument>: <expected>')."""
    e = _core.Error(f"flash_kda: {argument}: {expected}")
    e.argument = argument
    return e
