"""flash_kda.autograd_reference: the gradient yardstick, an exact fp64 evaluation of the KDA
forward (docs/kda-spec.md) in torch operations, differentiable by torch.autograd with respect to
every input, on the inputs' device, with the call of fla 0.6.0's ``chunk_kda``.

How it evaluates the recurrence (docs/kda-spec.md "Chunked form"): each sequence is cut into
chunks of C tokens; inside a chunk, with G_i the cumulative log decay and S the state at the
chunk start,

    D_ij = exp(G_i - G_j)  (j < i, per key channel; the exponent a_{j+1} + ... + a_i summed
                            directly, masked to -inf elsewhere before exp; D_ii = 1 apart)
    L    = strictly_lower( diag(b) (k D k^T) )      M = lower_incl_diag( scale q D k^T )
    U    = (I + L)^-1 diag(b) (v - (k exp(G)) S)    (torch.linalg.solve_triangular)
    O    = scale (q exp(G)) S + M U
    S'   = diag(exp(G_C)) S + (k exp(G_C - G))^T U

Every exponent is a sum of log decays (each a_t <= 0, docs/kda-spec.md) over a range of tokens,
so every exp(.) is of a number <= 0: nothing overflows and no gradient is NaN for any decay (an
exp that underflows to 0 has gradient 0). The pairwise D keeps this exact where the chunked
form's factors exp(G_i) and exp(-G_j) would overflow (the softplus gate's tens of nats a token
make exp(-G_j) infinite within a chunk). Chunks of all sequences and value heads at the same position run as one batch
(sequences sorted by length, so the sequences still running are a prefix); each chunk runs
under torch.utils.checkpoint, so the backward keeps the chunk's inputs and the state at its
start, and recomputes the chunk's C x C x K intermediates.
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, Any

import numpy as np

from ._chunk import _flags, _softplus_gate_error, _transposed_state_layout
from ._forward import _error, _real

if TYPE_CHECKING:
    import torch

#: The **kwargs read (fla 0.6.0's chunk_kda reads the first four); any other keyword is an error.
_KWARGS = ("A_log", "dt_bias", "chunk_size", "transpose_state_layout")

#: docs/kda-spec.md "Pre-processing": the L2 norm's epsilon, added inside the square root.
L2NORM_EPS = 1e-6

def _torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError("flash_kda.autograd_reference needs PyTorch; without it only flash_kda.reference "
                          "(forward only) is available") from e
    return torch


def _tensor(torch, name: str, x: Any, required: bool = True):
    if x is None and not required:
        return None
    if not isinstance(x, torch.Tensor):
        raise _error(name, f"expected a torch tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise _error(name, f"expected a floating-point tensor, got {x.dtype}")
    return x


def _lengths(torch, cu_seqlens, cu_seqlens_cpu, B: int, T: int, use_graph: bool) -> list:
    """Each sequence's (start, length) on the host: B sequences of T tokens, or from cu_seqlens
    (its host copy cu_seqlens_cpu when given, else one device-to-host copy). Checks the values."""
    if cu_seqlens is None:
        return [(n * T, T) for n in range(B)]
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1 \
            or cu_seqlens.is_floating_point() or cu_seqlens.dtype == torch.bool:
        raise _error("cu_seqlens", "expected an integer tensor [N + 1]")
    if B != 1:
        raise _error("cu_seqlens", f"needs a batch of 1 (the sequences flattened into q's token axis), got B = {B}")
    host = cu_seqlens_cpu if cu_seqlens_cpu is not None else cu_seqlens
    if not isinstance(host, torch.Tensor) or tuple(host.shape) != tuple(cu_seqlens.shape):
        raise _error("cu_seqlens_cpu", f"expected a tensor of cu_seqlens' shape {tuple(cu_seqlens.shape)}")
    cu = [int(x) for x in host.detach().to("cpu").tolist()]
    if cu[0] != 0 or any(b < a for a, b in zip(cu[:-1], cu[1:])):
        raise _error("cu_seqlens", f"expected 0 = cu[0] <= cu[1] <= ... , got {cu[:8]}{'...' if len(cu) > 8 else ''}")
    if cu[-1] != T and not (use_graph and cu[-1] <= T):
        raise _error("cu_seqlens", f"expected cu[N] = T = {T} (at most T with use_graph), got {cu[-1]}")
    return [(a, b - a) for a, b in zip(cu[:-1], cu[1:])]


def _schedule(lens: list, C: int, total: int):
    """The chunk schedule of the sequences (start, length): sequences sorted by length
    (descending, stable), so that those with a chunk at step j are the first active[j]; each row
    r of the step-major chunk list (step j's rows at offsets[j] .. offsets[j] + active[j]) holds
    the token indices `index[r]` (`total`, a zero pad row, past a sequence's end); `where[t]` is
    row * C + column of token t (`rows * C`, a zero pad row, for a token of no sequence).
    Returns (order, active, offsets, index [rows, C], where [total]) as Python/numpy values."""
    starts = np.array([s for s, _ in lens], dtype=np.int64)
    lengths = np.array([n for _, n in lens], dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    chunks = -(-lengths[order] // C)
    steps = int(chunks.max()) if len(chunks) else 0
    active = [int((chunks > j).sum()) for j in range(steps)]
    offsets = np.concatenate([[0], np.cumsum(active)]).astype(np.int64) if steps else np.zeros(1, np.int64)
    rows = int(offsets[-1])
    seq = np.concatenate([order[:n] for n in active]) if steps else np.zeros(0, np.int64)
    step = np.concatenate([np.full(n, j) for j, n in enumerate(active)]) if steps else np.zeros(0, np.int64)
    first = starts[seq] + step * C
    count = np.minimum(C, lengths[seq] - step * C)
    col = np.arange(C)
    valid = col[None, :] < count[:, None]
    index = np.where(valid, first[:, None] + col[None, :], total)
    where = np.full(total, rows * C, dtype=np.int64)
    where[index[valid]] = (np.arange(rows)[:, None] * C + col[None, :])[valid]
    return order, active, offsets, index, where


def _chunk_step(S, q, k, v, a, b, scale: float):
    """One chunk of every running (sequence, value head): S [n, HV, K, V] the states at the chunk
    start; q, k, a [n, HV, C, K]; v [n, HV, C, V]; b [n, HV, C] (padding tokens: all zero, so
    they neither decay nor write). Returns (O [n, HV, C, V], S' [n, HV, K, V]); the module
    docstring gives the algebra."""
    import torch

    C = q.shape[-2]
    G = a.cumsum(-2)                                        # G_i = a_1 + ... + a_i
    strict = torch.ones(C, C, dtype=torch.bool, device=q.device).tril(-1)[:, :, None]
    # P_ij = a_{j+1} + ... + a_i (i > j; 0 elsewhere), summed directly rather than as G_i - G_j:
    # no cancellation of large |G|, and a gradient reaches a_t only through the sums holding it
    # (G_i - G_j would send it +x and -x, whose rounding swamps the true gradient of a
    # decay of tens of nats a token).
    P = torch.where(strict, a.unsqueeze(-2), 0.0).cumsum(-3)
    D = torch.exp(torch.where(strict, P, float("-inf")))   # exp(G_i - G_j), i > j; 0 elsewhere
    kD = D * k.unsqueeze(-3)                                # k_j exp(G_i - G_j)
    # The diagonal of M (j = i: no decay between write and read) is q_i . k_i, with no gradient to a.
    M = (torch.einsum("...ic,...ijc->...ij", q, kD) + torch.diag_embed((q * k).sum(-1))) * scale
    L = torch.einsum("...ic,...ijc->...ij", k, kD) * b.unsqueeze(-1)  # strictly lower
    eG = torch.exp(G)
    R = b.unsqueeze(-1) * (v - (k * eG) @ S)
    U = torch.linalg.solve_triangular(L, R, upper=False, unitriangular=True)  # (I + L)^-1 R
    O = (q * (scale * eG)) @ S + M @ U
    kr = k * torch.exp(P[..., -1, :, :])                    # k_j exp(G_C - G_j), G_C - G_j = P_Cj
    S_next = eG[..., -1, :].unsqueeze(-1) * S + kr.transpose(-1, -2) @ U
    return O, S_next


def autograd_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    cp_context: Any = None,
    use_graph: bool = False,
    max_num_seqs: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """KDA forward in fp64 torch operations, differentiable by torch.autograd: the gradient yardstick.

    Evaluates the recurrence of docs/kda-spec.md exactly (fp64 rounding only; no bf16, no
    fp32, no re-based exponents) with fla 0.6.0's ``chunk_kda`` call and meaning of every
    keyword (flash_kda.chunk_kda's docstring), on the inputs' device (CPU or CUDA), from the
    inputs cast to fp64. Gradients of a loss on (o, final_state) reach every input that takes
    part: q, k (through the L2 norm), v, g (through the gate), beta (through the sigmoid),
    A_log, dt_bias and initial_state. The chunked evaluation (this module's docstring) runs
    each chunk of C tokens under torch.utils.checkpoint: the backward's memory is the inputs,
    a few fp64 copies of them, and one state per chunk of each sequence.

    Args (B batch, T tokens, H q/k heads, HV value heads (a multiple of H: GVA, value head hv
    reads q/k head hv // (HV / H)), K key and V value head dims, any sizes; varlen: B = 1,
    T = total tokens, N sequences = len(cu_seqlens) - 1, else N = B):
        q, k: [B, T, H, K]; v: [B, T, HV, V]; g: [B, T, HV, K]; beta: [B, T, HV]. Any
            floating dtype; read as fp64 (exact for bf16 and fp32). Gradients reach each
            input in its own dtype (torch casts them): pass fp64 copies for fp64 gradients.
        scale: output scale; None means K**-0.5.
        initial_state: optional [N, HV, V, K] (state_v_first) or [N, HV, K, V], any floating
            dtype; zero if None.
        output_final_state: also return the state after each sequence's last token.
        use_qk_l2norm_in_kernel: q <- q / sqrt(sum(q^2) + 1e-6) over K, likewise k.
        use_gate_in_kernel: the log decay a from the raw g: ``lower_bound * sigmoid(exp(A_log)
            * (g + dt_bias))`` (``lower_bound * sigmoid(g + dt_bias)`` without A_log) when
            lower_bound is given, else ``-exp(A_log) * softplus(g + dt_bias)`` (A_log
            required); dt_bias absent means 0. Without it a = g and A_log, dt_bias are
            ignored (no gradient reaches them), as in fla.
        use_beta_sigmoid_in_kernel: b = sigmoid(beta) (2 * sigmoid(beta) with
            allow_neg_eigval); else b = beta.
        allow_neg_eigval: see use_beta_sigmoid_in_kernel, which it needs (fla's rule).
        safe_gate: with use_gate_in_kernel, makes lower_bound required (fla's rule); does not
            change the function.
        lower_bound: the lower-bound gate's floor (natural log), any real number (fla's
            kernels take [-5, 0); the yardstick evaluates any).
        disable_recompute: accepted and ignored (what fla saves for its backward).
        return_intermediate_states: not served (fla's inference-only form); True raises.
        state_v_first: the states' layout ([.., V, K] when True, [.., K, V] when False).
        cu_seqlens: optional integer [N + 1] (any device): 0 = cu[0] <= ... <= cu[N] = T;
            sequences of length 0 pass their initial state through and write no output.
            Its values are read on the host (cu_seqlens_cpu when given, else one copy).
        cu_seqlens_cpu: optional host copy of cu_seqlens.
        cp_context: context parallelism; not served (raises unless None).
        use_graph: fla's graph mode: cu[N] may be short of T (zero-length tail sequences pad
            cu_seqlens to max_num_seqs + 1 entries); rows of no sequence get o = 0.
        max_num_seqs: with use_graph and cu_seqlens, must equal len(cu_seqlens) - 1 when given.
        **kwargs: A_log ([HV]) and dt_bias ([HV * K] or [HV, K]) for the fused gate;
            chunk_size: the evaluation's chunk length C, any positive int (default 64; fla
            takes 32 or 64; it changes nothing but rounding); transpose_state_layout: fla's
            deprecated name of state_v_first. Any other keyword raises.

    Returns:
        (o, final_state): o fp64 [B, T, HV, V] on q's device; final_state fp64 [N, HV, V, K]
        (state_v_first) or [N, HV, K, V], or None without output_final_state.

    Raises:
        flash_kda.Error (a ValueError; ``.argument`` names the argument): a tensor missing,
            not a torch tensor, not floating point (cu_seqlens: not integer), of a wrong
            shape or on another device than q; bad cu_seqlens values; an unknown keyword; a
            flag that is not a bool; fla's keyword rules (A_log or lower_bound missing for the
            fused gate, allow_neg_eigval without the beta sigmoid, max_num_seqs under
            use_graph); return_intermediate_states or cp_context given.
        ImportError: PyTorch is not installed.

    Math: docs/kda-spec.md ("Pre-processing", "Recurrence", "Chunked form", "Backward").
    """
    torch = _torch()
    from torch.utils.checkpoint import checkpoint

    for name in kwargs:
        if name not in _KWARGS:
            raise _error(name, "is not a keyword of autograd_reference (fla 0.6.0's chunk_kda reads only A_log, "
                         "dt_bias, chunk_size and the deprecated transpose_state_layout)")
    (output_final_state, l2norm, gate_in_kernel, beta_sigmoid, neg_eigval, safe_gate, _, intermediate, v_first,
     use_graph) = _flags((
        output_final_state, use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
        allow_neg_eigval, safe_gate, disable_recompute, return_intermediate_states, state_v_first, use_graph))
    if "transpose_state_layout" in kwargs:
        v_first = _transposed_state_layout(v_first, kwargs, stacklevel=2)
    C = kwargs.get("chunk_size", 64)
    if isinstance(C, bool) or not isinstance(C, numbers.Integral) or C < 1:
        raise _error("chunk_size", f"expected a positive int (the evaluation's chunk length), got {C!r}")
    C = int(C)
    if intermediate:
        raise _error("return_intermediate_states", "is not served by autograd_reference (fla's inference-only "
                     "form); call flash_kda.reference with intermediate_every")
    if cp_context is not None:
        raise _error("cp_context", "context parallelism is not served by autograd_reference (pass None)")
    if neg_eigval and not beta_sigmoid:
        raise _error("allow_neg_eigval", "needs use_beta_sigmoid_in_kernel=True (b = 2 * sigmoid(beta))")

    q, k, v, g, beta = (_tensor(torch, n, x) for n, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)))
    A_log = dt_bias = None
    if gate_in_kernel:
        A_log = _tensor(torch, "A_log", kwargs.get("A_log"), required=False)
        dt_bias = _tensor(torch, "dt_bias", kwargs.get("dt_bias"), required=False)
        if lower_bound is None:
            if A_log is None or safe_gate:
                raise _softplus_gate_error(A_log is None)
        else:
            lower_bound = _real("lower_bound", lower_bound)
            if not math.isfinite(lower_bound):
                raise _error("lower_bound", f"expected a finite number, got {lower_bound}")
    initial_state = _tensor(torch, "initial_state", initial_state, required=False)
    if scale is not None:
        scale = _real("scale", scale)

    if q.dim() != 4:
        raise _error("q", f"expected [B, T, H, K], got shape {tuple(q.shape)}")
    B, T, H, K = q.shape
    if tuple(k.shape) != tuple(q.shape):
        raise _error("k", f"expected q's shape {tuple(q.shape)}, got {tuple(k.shape)}")
    if v.dim() != 4 or tuple(v.shape[:2]) != (B, T) or v.shape[2] < 1 or v.shape[2] % max(H, 1):
        raise _error("v", f"expected [B, T, HV, V] = [{B}, {T}, a multiple of H = {H}, V], got {tuple(v.shape)}")
    HV, V = v.shape[2], v.shape[3]
    if tuple(g.shape) != (B, T, HV, K):
        raise _error("g", f"expected [B, T, HV, K] = {[B, T, HV, K]}, got {list(g.shape)}")
    if tuple(beta.shape) != (B, T, HV):
        raise _error("beta", f"expected [B, T, HV] = {[B, T, HV]}, got {list(beta.shape)}")
    if A_log is not None and tuple(A_log.shape) != (HV,):
        raise _error("A_log", f"expected [HV] = [{HV}], got {list(A_log.shape)}")
    if dt_bias is not None and tuple(dt_bias.shape) not in ((HV * K,), (HV, K)):
        raise _error("dt_bias", f"expected [HV * K] = [{HV * K}] or [HV, K] = [{HV}, {K}], got {list(dt_bias.shape)}")
    if use_graph and cu_seqlens is not None and max_num_seqs is not None:
        if isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, numbers.Integral):
            raise _error("max_num_seqs", f"expected an int or None, got {type(max_num_seqs).__name__}")
        if cu_seqlens.shape[0] - 1 != int(max_num_seqs):
            raise _error("max_num_seqs", f"cu_seqlens must have exactly max_num_seqs + 1 = {int(max_num_seqs) + 1} "
                         f"entries under use_graph, got {cu_seqlens.shape[0]}")
    lens = _lengths(torch, cu_seqlens, cu_seqlens_cpu, B, T, use_graph)
    N = len(lens)
    state_dims = (V, K) if v_first else (K, V)
    if initial_state is not None and tuple(initial_state.shape) != (N, HV, *state_dims):
        raise _error("initial_state", f"expected [N, HV, {'V, K' if v_first else 'K, V'}] = "
                     f"{[N, HV, *state_dims]}, got {list(initial_state.shape)}")
    dev = q.device
    for name, x in (("k", k), ("v", v), ("g", g), ("beta", beta), ("A_log", A_log), ("dt_bias", dt_bias),
                    ("initial_state", initial_state)):
        if x is not None and x.device != dev:
            raise _error(name, f"expected q's device {dev}, got {x.device}")
    if scale is None:
        scale = K ** -0.5

    f64 = torch.float64
    q, k, v, g, beta = (x.to(f64) for x in (q, k, v, g, beta))
    if l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + L2NORM_EPS)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + L2NORM_EPS)
    if gate_in_kernel:
        x = g if dt_bias is None else g + dt_bias.to(f64).reshape(HV, K)
        if lower_bound is not None:
            a = lower_bound * torch.sigmoid(x if A_log is None else torch.exp(A_log.to(f64)).unsqueeze(-1) * x)
        else:
            # softplus(x) = log(1 + e^x) as logaddexp(x, 0): exact for every x (torch's
            # softplus returns x itself above its threshold), gradient sigmoid(x) without NaN.
            a = -torch.exp(A_log.to(f64)).unsqueeze(-1) * torch.logaddexp(x, x.new_zeros(()))
    else:
        a = g
    b = beta
    if beta_sigmoid:
        b = torch.sigmoid(beta) * (2.0 if neg_eigval else 1.0)
    if HV != H:
        q, k = q.repeat_interleave(HV // H, dim=2), k.repeat_interleave(HV // H, dim=2)

    order, active, offsets, index, where = _schedule(lens, C, B * T)
    index = torch.as_tensor(index, device=dev)

    def chunked(x):  # [B, T, HV, ...] -> [rows, HV, C, ...]; padding tokens read a zero row
        x = x.reshape(B * T, *x.shape[2:])
        x = torch.cat([x, x.new_zeros((1, *x.shape[1:]))])[index]
        return x.movedim(1, 2).contiguous()

    qc, kc, vc, ac, bc = (chunked(x) for x in (q, k, v, a, b))
    if initial_state is None:
        S = torch.zeros(N, HV, K, V, dtype=f64, device=dev)
    else:
        S = initial_state.to(f64)
        S = S.transpose(-1, -2) if v_first else S
    S = S[torch.as_tensor(order, device=dev)] if N else S

    checkpointed = torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in (q, k, v, a, b, S))
    outs = []
    for j, n in enumerate(active):
        rows = slice(int(offsets[j]), int(offsets[j]) + n)
        args = (S[:n], qc[rows], kc[rows], vc[rows], ac[rows], bc[rows], scale)
        if checkpointed:
            o, s = checkpoint(_chunk_step, *args, use_reentrant=False,
                                                     preserve_rng_state=False)
        else:
            o, s = _chunk_step(*args)
        outs.append(o)
        S = torch.cat([s, S[n:]]) if n < S.shape[0] else s

    rows = int(offsets[-1])
    o = torch.cat(outs) if outs else torch.zeros(0, HV, C, V, dtype=f64, device=dev)
    o = o.movedim(2, 1).reshape(rows * C, HV, V)
    o = torch.cat([o, o.new_zeros(1, HV, V)])[torch.as_tensor(where, device=dev)].view(B, T, HV, V)
    final_state = None
    if output_final_state:
        final_state = S[torch.as_tensor(np.argsort(order), device=dev)] if N else S
        final_state = final_state.transpose(-1, -2) if v_first else final_state
    return o, final_state
