"""Inputs of chunk_kda calls in fla's words, for the GPU tests of flash_kda.chunk_kda and of fla's
dispatch to it (test_chunk_gpu.py, test_chunk_fla_dispatch.py), and the fp64 reference of each
(flash_kda.reference with the gate and flags the call selects, fla's rules: flash_kda/_chunk.py;
test_autograd_reference.py compares the yardstick with it).

Realistic gate parameters (docs/kda-spec.md "Accuracy contract"): A_log = log U(1, 16), dt_bias
small, lower_bound -5; raw g ~ N(0, 1); beta logits ~ N(0, 1)."""
from __future__ import annotations

import dataclasses

import numpy as np

K = V = 128


@dataclasses.dataclass(frozen=True)
class ChunkCase:
    """One chunk_kda call. gate: "safe" (lower_bound, A_log), "safe_no_A" (lower_bound, no
    A_log), "softplus" (no lower_bound) or "none" (g is the log decay); lens: varlen sequence
    lengths (None: fixed length B x T); state: initial_state dtype (None: no initial state);
    strided: q, k, v, g, beta as views of one fused projection; graph_pad: use_graph with this
    many zero-length tail sequences and as many padding tokens after the last real one. Gate
    laws: A_log = log U(*a_log_range) per value head, raw g ~ N(0, g_std^2) (the pre-computed
    gate, "none", is the softplus gate's log decay of these)."""

    name: str
    gate: str = "safe"
    heads: int = 4
    value_heads: int | None = None
    batch: int = 2
    seqlen: int = 150
    lens: tuple | None = None
    state: str | None = "fp32"
    state_v_first: bool = True
    strided: bool = False
    l2norm: bool = True
    beta_sigmoid: bool = True
    allow_neg_eigval: bool = False
    graph_pad: int = 0
    k_dim: int = K
    a_log_range: tuple = (1.0, 16.0)
    g_std: float = 1.0

    @property
    def hv(self) -> int:
        return self.value_heads or self.heads

    def seed(self) -> int:
        return sum(ord(c) * 131 ** i for i, c in enumerate(self.name)) % (2 ** 31)


def make_call(case: ChunkCase, dev, seed: int | None = None):
    """(args, kwargs) of chunk_kda for `case` on device `dev`, and the number of real tokens
    (rows past it are padding under use_graph)."""
    import torch

    gen = torch.Generator().manual_seed(case.seed() if seed is None else seed)
    H, HV, Kd = case.heads, case.hv, case.k_dim
    if case.lens is not None:
        lens = list(case.lens) + [0] * case.graph_pad
        real = int(sum(case.lens))
        B, T = 1, real + case.graph_pad * 3
        cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int64)
        N = len(lens)
    else:
        B, T, N, real, cu = case.batch, case.seqlen, case.batch, case.batch * case.seqlen, None

    def randn(*shape, scale=1.0):
        return scale * torch.randn(*shape, generator=gen)

    widths = [H * Kd, H * Kd, HV * V, HV * Kd, HV]
    if case.strided:
        assert case.g_std == 1.0, "strided views draw g ~ N(0, 1)"
        # One fused projection [B, T, sum(widths) + pad] split into views: rows of q are
        # sum(widths) + pad elements apart, not H * K; the pad (unused columns, as a projection
        # sized for alignment has) keeps every row start 16-byte aligned, which the Sm90
        # kernels require (an unaligned one is refused with a named error).
        pad = -sum(widths) % 8
        fused = randn(B, T, sum(widths) + pad).bfloat16().to(dev)
        parts = torch.split(fused, widths + [pad], dim=-1)
        q, k = (p.unflatten(-1, (H, Kd)) for p in parts[:2])
        v = parts[2].unflatten(-1, (HV, V))
        g = parts[3].unflatten(-1, (HV, Kd))
        beta = parts[4]
    else:
        q, k = randn(B, T, H, Kd).bfloat16().to(dev), randn(B, T, H, Kd).bfloat16().to(dev)
        v = randn(B, T, HV, V).bfloat16().to(dev)
        g = randn(B, T, HV, Kd, scale=case.g_std).bfloat16().to(dev)
        beta = randn(B, T, HV).bfloat16().to(dev)
    if not case.l2norm:  # unit rows, so that the delta rule stays stable without the fused norm
        q = torch.nn.functional.normalize(q.float(), dim=-1).bfloat16()
        k = torch.nn.functional.normalize(k.float(), dim=-1).bfloat16()
    if not case.beta_sigmoid:
        beta = torch.sigmoid(beta.float()).bfloat16()
    A_log = torch.log(torch.empty(HV).uniform_(*case.a_log_range, generator=gen)).to(dev)
    dt_bias = randn(HV * Kd, scale=0.1).to(dev)  # fla's flat layout
    kw = dict(use_qk_l2norm_in_kernel=case.l2norm, use_beta_sigmoid_in_kernel=case.beta_sigmoid,
              allow_neg_eigval=case.allow_neg_eigval, state_v_first=case.state_v_first, output_final_state=True)
    if case.gate == "none":
        a = -torch.exp(A_log.cpu())[:, None] * torch.nn.functional.softplus(g.float().cpu() + dt_bias.cpu().view(HV, Kd))
        g = a.to(dev)  # the log decay itself, fp32
        kw.update(use_gate_in_kernel=False)
    else:
        kw.update(use_gate_in_kernel=True, dt_bias=dt_bias)
        if case.gate in ("safe", "softplus"):
            kw["A_log"] = A_log
        if case.gate != "softplus":
            kw.update(safe_gate=True, lower_bound=-5.0)
    if case.state is not None:
        dims = (HV, V, Kd) if case.state_v_first else (HV, Kd, V)
        h0 = randn(N, *dims, scale=0.5).to(dev)
        kw["initial_state"] = h0 if case.state == "fp32" else h0.bfloat16()
    if cu is not None:
        kw["cu_seqlens"] = cu.to(dev)
        if case.graph_pad:
            kw.update(use_graph=True, max_num_seqs=N)
    return (q, k, v, g, beta), kw, real


def reference(args, kw, real: int | None = None):
    """The fp64 reference (out, final_state) of a chunk_kda call made by make_call; with `real`
    (a varlen call's real tokens), of its first `real` tokens (use_graph's padding rows have no
    reference: fla leaves them undefined)."""
    import flash_kda

    q, k, v, g, beta = args
    if real is not None and kw.get("cu_seqlens") is not None:
        q, k, v, g, beta = (x[:, :real] for x in args)
    gate = "none" if not kw["use_gate_in_kernel"] else ("softplus" if kw.get("lower_bound") is None else "safe")
    HV, Kd = v.shape[2], q.shape[3]
    return flash_kda.reference(
        q, k, v, g, beta, A_log=kw.get("A_log") if gate != "none" else None,
        dt_bias=kw["dt_bias"].reshape(HV, Kd) if gate != "none" else None,
        lower_bound=kw.get("lower_bound") or -5.0, gate=gate, use_qk_l2norm=kw["use_qk_l2norm_in_kernel"],
        use_beta_sigmoid=kw["use_beta_sigmoid_in_kernel"], allow_neg_eigval=kw["allow_neg_eigval"],
        initial_state=kw.get("initial_state"), cu_seqlens=kw.get("cu_seqlens"),
        state_layout="v_first" if kw["state_v_first"] else "k_first", output_final_state=True)


def rel_err(x, ref) -> float:
    """Relative Frobenius error of x (torch tensor or array) against the fp64 ref."""
    x = x.float().cpu().numpy() if hasattr(x, "cpu") else np.asarray(x)
    return float(np.linalg.norm((x - ref).ravel()) / np.linalg.norm(ref.ravel()))


#: One case per gate mode, layout, dtype mix and input form the forward may serve.
CASES = [
    ChunkCase("safe"),  # fla's KDA layer with safe_gate, FlashKDA's call
    ChunkCase("safe_no_A_log", gate="safe_no_A"),
    ChunkCase("softplus", gate="softplus", seqlen=300),  # Kimi-Linear-48B's gate, long enough to decay far
    ChunkCase("pre_gated", gate="none"),
    ChunkCase("gva", heads=2, value_heads=8),
    ChunkCase("k_first", state_v_first=False),
    ChunkCase("mixed_states_bf16_initial", state="bf16"),  # fp32 final state beside a bf16 start
    ChunkCase("strided_views", strided=True),
    ChunkCase("beta_post_sigmoid", beta_sigmoid=False),
    ChunkCase("allow_neg_eigval", allow_neg_eigval=True),
    ChunkCase("l2norm_off", l2norm=False),
    ChunkCase("varlen", lens=(37, 1, 200, 0, 64)),
    ChunkCase("softplus_gva_k_first_varlen", gate="softplus", heads=2, value_heads=4, state_v_first=False,
              lens=(100, 0, 17, 250)),
    ChunkCase("use_graph_padded", lens=(37, 1, 120), graph_pad=3),
]
