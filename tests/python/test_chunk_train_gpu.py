"""flash_kda.chunk_kda's training path on an sm_90 GPU: the gradients of q, k, v, g, beta, A_log,
dt_bias and initial_state of one forward + backward against autograd through the fp64
evaluation of the recurrence (flash_kda.autograd_reference, docs/kda-spec.md "Backward"),
relative Frobenius error <= GRAD_BOUND for each, per gate mode, GVA, layout and varlen
(chunk_cases.CASES that the backward serves); eager and torch.compile(fullgraph=True) give
bitwise equal gradients; two runs give bitwise equal gradients (the backward is
deterministic). Skips without the GPU, and the reference comparison without
flash_kda.autograd_reference."""
from __future__ import annotations

import dataclasses

import pytest

from chunk_cases import CASES, make_call

pytestmark = pytest.mark.cuda_sm90

#: Gradients carry the forward's bf16 rounding through the backward's chunked algebra: a
#: relative Frobenius bound of 2e-2 per gradient (twice the forward's 1e-2).
GRAD_BOUND = 2e-2
#: The cases compared with the yardstick (use_graph padding is an inference form; strided views
#: have their own test below, against contiguous copies of the same values).
TRAINED = [c for c in CASES if c.name in ("safe", "safe_no_A_log", "softplus", "pre_gated", "gva", "k_first",
                                          "mixed_states_bf16_initial")]
#: Few heads and long sequences: the backward's reverse chain runs in segments (its transition
#: and input maps, the segment scan, each segment from its end; src/sm90/backward/layout.h
#: chain_segments: 8 segments of 32 chunks here), which shorter cases never take.
CHAIN_SEGMENTS = [dataclasses.replace(c, name=c.name + "_T4096_H2_chain_segments", seqlen=4096, batch=1, heads=2)
                  for c in CASES if c.name in ("safe", "k_first", "mixed_states_bf16_initial")]
NAMES = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state")


def _leaves(args, kw):
    """Copies of the call's inputs that require grad: (args, kw, {name: leaf})."""
    args = [a.detach().clone().requires_grad_() for a in args]
    kw = dict(kw)
    leaves = dict(zip(NAMES[:5], args))
    for name in NAMES[5:]:
        if kw.get(name) is not None and (name == "initial_state" or kw["use_gate_in_kernel"]):
            kw[name] = kw[name].detach().clone().requires_grad_()
            leaves[name] = kw[name]
    return args, kw, leaves


def _step(fn, args, kw, seed=7):
    """Gradients {name: tensor} of <out, R1> + <final_state, R2> through fn, R1, R2 fixed random."""
    import torch

    args, kw, leaves = _leaves(args, kw)
    out, final = fn(*args, **{**kw, "output_final_state": True})
    # Drawn on the host, whatever fn's device: the same R1, R2 for the GPU and the CPU call.
    gen = torch.Generator().manual_seed(seed)
    r1 = torch.randn(out.shape, generator=gen, dtype=torch.float32).to(out.device)
    r2 = torch.randn(final.shape, generator=gen, dtype=torch.float32).to(final.device)
    loss = (out.float() * r1).sum() + (final.float() * r2).sum()
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return dict(zip(leaves, grads))


@pytest.mark.parametrize("case", TRAINED + CHAIN_SEGMENTS, ids=[c.name for c in TRAINED + CHAIN_SEGMENTS])
def test_gradients_match_the_fp64_reference(cuda_sm90, case):
    import torch

    import flash_kda

    reference = getattr(flash_kda, "autograd_reference", None)
    if reference is None:
        pytest.skip("flash_kda.autograd_reference (the fp64 autograd yardstick) is not in this build")
    args, kw, _ = make_call(case, cuda_sm90)
    ours = _step(flash_kda.chunk_kda, args, kw)
    host = lambda x: x.detach().to("cpu", torch.float64) if isinstance(x, torch.Tensor) and x.is_floating_point() \
        else (x.cpu() if isinstance(x, torch.Tensor) else x)
    ref = _step(reference, [host(a) for a in args], {n: host(x) for n, x in kw.items()})
    assert set(ours) == set(ref)
    for name, g in ours.items():
        assert torch.isfinite(g).all(), name
        err = float(torch.linalg.vector_norm((g.double().cpu() - ref[name]).flatten())
                    / torch.linalg.vector_norm(ref[name].flatten()))
        assert err <= GRAD_BOUND, f"{case.name}: d{name} error {err:.3e}"


def test_compiled_training_equals_eager_and_is_deterministic(cuda_sm90):
    import torch

    import flash_kda

    args, kw, _ = make_call(CASES[0], cuda_sm90)
    eager = _step(flash_kda.chunk_kda, args, kw)
    again = _step(flash_kda.chunk_kda, args, kw)
    torch._dynamo.reset()
    compiled = _step(torch.compile(flash_kda.chunk_kda, fullgraph=True), args, kw)
    for name in eager:
        assert torch.equal(eager[name], again[name]), f"d{name} differs between two runs"
        assert torch.equal(eager[name], compiled[name]), f"d{name} differs under torch.compile"


def test_strided_views_train_like_contiguous_copies(cuda_sm90):
    """A training call on views of one fused projection (q, k, v, g and beta rows a whole
    projection apart, as a model's fused qkv layer hands them over) with the zero-stride d_out
    of a .sum(): every gradient equals, bit for bit, the one of contiguous copies of the same
    values, and the projection's unused (alignment) columns get zero."""
    import torch

    import flash_kda

    case = next(c for c in CASES if c.name == "strided_views")
    args, kw, _ = make_call(case, cuda_sm90)
    base = args[0]._base
    assert base is not None and all(a._base is base for a in args), "make_call's views share one projection"
    fused = base.detach().clone().requires_grad_()
    views = [fused.as_strided(a.shape, a.stride(), a.storage_offset()) for a in args]
    assert not any(v.is_contiguous() for v in views)
    copies = [a.detach().contiguous().requires_grad_() for a in args]

    def grads(inputs, leaves):
        out, final = flash_kda.chunk_kda(*inputs, **kw)
        r2 = torch.randn(final.shape, generator=torch.Generator().manual_seed(3)).to(final.device)
        return torch.autograd.grad(out.sum() + (final * r2).sum(), leaves)  # out.sum(): a zero-stride d_out

    (d_fused,) = grads(views, [fused])
    d_copies = grads(copies, copies)
    used = torch.zeros_like(fused, dtype=torch.bool)
    for name, v, d in zip(("q", "k", "v", "g", "beta"), views, d_copies):
        assert torch.equal(d_fused.as_strided(v.shape, v.stride(), v.storage_offset()), d), f"d{name} differs"
        used.as_strided(v.shape, v.stride(), v.storage_offset()).fill_(True)
    assert bool((d_fused[~used] == 0).all()), "an unused column got a gradient"
