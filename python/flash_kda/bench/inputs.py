"""Random inputs of one case, as FlashKDA's own benchmark makes them.

q, k, v, g, beta: bf16 standard normal; A_log ~ U(0, 1) fp32 [H]; dt_bias ~ U(0, 1) fp32
[H, K]; lower_bound -5; initial_state standard normal [N, H, V, K] (v-first; [N, H, K, V]
k-first) in the case's state dtype (absent for state "none"); scale K**-0.5.

Variants (cases.Case): the pre-computed gate's g is the softplus gate of those inputs,
-exp(A_log) * softplus(g + dt_bias), evaluated once here in fp32 (so "pre" and "softplus" are
the same function of the same draws); strided cases draw q, k, v as one [B, T, 3, H, K]
tensor and pass its three views (token stride 3 H K), as a fused qkv projection gives them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .cases import Case

#: Safe-gate floor used by every case (FlashKDA's benchmark and the anchors).
LOWER_BOUND = -5.0


@dataclass
class Inputs:
    """Device tensors of one case (shapes as in docs/kda-spec.md, B = 1 for varlen).

    cu_seqlens is int64 on the device (None for fixed length); cu_seqlens_cpu is its host
    copy, handed to fla so that its chunk indexing does not synchronise (graph capture).
    """

    q: object
    k: object
    v: object
    g: object
    beta: object
    A_log: object
    dt_bias: object
    initial_state: object | None
    cu_seqlens: object | None
    cu_seqlens_cpu: object | None
    scale: float
    lower_bound: float = LOWER_BOUND
    case: Case | None = None


def make_inputs(case: Case, seed: int = 0, device: str = "cuda") -> Inputs:
    """Fresh random inputs for `case` on `device`, reproducible from `seed`."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    b = 1 if case.varlen else case.batch
    t = case.total_tokens if case.varlen else case.T
    h, kd, vd = case.heads, case.head_dim_k, case.head_dim_v
    bf16 = torch.bfloat16

    def randn(*shape, dtype=bf16):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

    def rand(*shape):
        return torch.rand(*shape, generator=gen, device=device, dtype=torch.float32)

    state = None
    if case.state != "none":
        dtype = torch.float32 if case.state == "fp32" else bf16
        shape = (case.num_seqs, h, vd, kd) if case.state_layout == "v_first" else (case.num_seqs, h, kd, vd)
        state = randn(*shape, dtype=dtype)
    cu = cu_cpu = None
    if case.varlen:
        cu_cpu = torch.tensor(case.cu_seqlens(), dtype=torch.int64)
        cu = cu_cpu.to(device)
    if case.strided:
        if kd != vd:
            raise ValueError("strided cases split one fused [B, T, 3, H, K] projection: K must equal V")
        qkv = randn(b, t, 3, h, kd)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    else:
        q, k, v = randn(b, t, h, kd), randn(b, t, h, kd), randn(b, t, h, vd)
    g, beta = randn(b, t, h, kd), randn(b, t, h)
    A_log, dt_bias = rand(h), rand(h, kd)
    if case.gate == "pre":
        g = -torch.exp(A_log)[:, None] * torch.nn.functional.softplus(g.float() + dt_bias)
    return Inputs(
        q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias,
        initial_state=state, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu,
        scale=kd ** -0.5, case=case,
    )
