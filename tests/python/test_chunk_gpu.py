"""flash_kda.chunk_kda on an sm_90 GPU against the fp64 reference: relative Frobenius error of
out and of the final state <= 1e-2 (the forward's bound, docs/kda-spec.md "Accuracy contract")
for every gate mode, GVA, both state layouts, mixed state dtypes, strided views, the beta and
l2norm flags, varlen and fla's use_graph padding (chunk_cases.CASES); inside a CUDA graph
(replay equals an eager call bitwise); under torch.compile(fullgraph=True) (equal to eager
bitwise, for chunk_kda and fwd).

Cases the kernels do not serve yet raise flash_kda.Error naming the argument: such a case
fails here, which is what the kernels' branches are measured by.
"""
from __future__ import annotations

import numpy as np
import pytest

from chunk_cases import CASES, ChunkCase, make_call, reference, rel_err

pytestmark = pytest.mark.cuda_sm90

BOUND = 1e-2


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_matches_the_reference(cuda_sm90, case):
    import torch

    import flash_kda

    args, kw, real = make_call(case, cuda_sm90)
    before = [x.clone() for x in args]
    with torch.inference_mode():
        out, final = flash_kda.chunk_kda(*args, **kw)
    torch.cuda.synchronize(cuda_sm90)
    assert out.shape == args[2].shape and out.dtype == args[0].dtype
    N = kw["initial_state"].shape[0] if "initial_state" in kw else args[0].shape[0]
    HV, Kd = args[2].shape[2], args[0].shape[3]
    assert final.dtype == torch.float32
    assert final.shape == ((N, HV, 128, Kd) if kw["state_v_first"] else (N, HV, Kd, 128))
    for x, y in zip(args, before):
        assert torch.equal(x, y), "an input was modified"

    ref_o, ref_s = reference(args, kw, real)
    o = out[:, :real] if kw.get("cu_seqlens") is not None else out
    assert torch.isfinite(o.float()).all() and torch.isfinite(final).all()
    err_o, err_s = rel_err(o, ref_o), rel_err(final, ref_s)
    assert err_o <= BOUND, f"{case.name}: out error {err_o:.3e}"
    assert err_s <= BOUND, f"{case.name}: final_state error {err_s:.3e}"


def test_refuses_what_it_cannot_serve(cuda_sm90):
    import torch

    import flash_kda

    args, kw, _ = make_call(ChunkCase("k64", k_dim=64, state=None), cuda_sm90)
    with torch.inference_mode(), pytest.raises(flash_kda.Error) as e:
        flash_kda.chunk_kda(*args, **kw)
    assert e.value.argument == "q" and "K = 64" in str(e.value)
    args, kw, _ = make_call(ChunkCase("grad"), cuda_sm90)
    v = args[2].clone().requires_grad_()
    with pytest.raises(flash_kda.Error) as e:  # training: the intermediate states have no backward
        flash_kda.chunk_kda(args[0], args[1], v, *args[3:], **kw, intermediate_state_every=16)
    assert e.value.argument == "intermediate_state_every"


def _graph_case():
    return ChunkCase("graph_varlen", lens=(40, 1, 0, 100, 17))


def test_cuda_graph_replay_matches_eager(cuda_sm90):
    import torch

    import flash_kda

    args, kw, real = make_call(_graph_case(), cuda_sm90)
    with torch.inference_mode():
        side = torch.cuda.Stream(cuda_sm90)
        side.wait_stream(torch.cuda.current_stream(cuda_sm90))
        with torch.cuda.stream(side):
            flash_kda.chunk_kda(*args, **kw)  # warm-up on a side stream, as torch.cuda.graph asks
        torch.cuda.current_stream(cuda_sm90).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, final = flash_kda.chunk_kda(*args, **kw)
        fresh_args, fresh_kw, _ = make_call(_graph_case(), cuda_sm90, seed=12345)
        for dst, src in zip(args, fresh_args):
            dst.copy_(src)
        for name in ("A_log", "dt_bias", "initial_state"):
            kw[name].copy_(fresh_kw[name])
        graph.replay()
        torch.cuda.synchronize(cuda_sm90)
        eager_out, eager_final = flash_kda.chunk_kda(*fresh_args, **fresh_kw)
    torch.cuda.synchronize(cuda_sm90)
    assert torch.equal(out, eager_out) and torch.equal(final, eager_final)
    ref_o, ref_s = reference(fresh_args, fresh_kw, real)
    assert rel_err(out, ref_o) <= BOUND and rel_err(final, ref_s) <= BOUND


@pytest.mark.parametrize("case", [CASES[0], CASES[2]], ids=lambda c: c.name)
def test_torch_compile_fullgraph_equals_eager(cuda_sm90, case):
    import torch

    import flash_kda

    args, kw, _ = make_call(case, cuda_sm90)

    def prefill(q, k, v, g, beta):
        o, s = flash_kda.chunk_kda(q, k, v, g, beta, **kw)
        return o * 1, s

    with torch.inference_mode():
        eager = prefill(*args)
        torch._dynamo.reset()
        compiled = torch.compile(prefill, fullgraph=True)(*args)
    torch.cuda.synchronize(cuda_sm90)
    assert torch.equal(compiled[0], eager[0]) and torch.equal(compiled[1], eager[1])


def test_torch_compile_fwd_fullgraph_equals_eager(cuda_sm90):
    import torch

    import flash_kda

    args, kw, _ = make_call(CASES[0], cuda_sm90)
    q, k, v, g, beta = args
    H, Kd = v.shape[2], q.shape[3]
    dt = kw["dt_bias"].view(H, Kd)

    def step(q, k, v, g, beta, h0):
        out = torch.empty_like(v)
        final = torch.empty_like(h0)
        flash_kda.fwd(q, k, v, g, beta, None, out, kw["A_log"], dt, -5.0, h0, final)
        return out, final

    with torch.inference_mode():
        eager = step(*args, kw["initial_state"])
        torch._dynamo.reset()
        compiled = torch.compile(step, fullgraph=True)(*args, kw["initial_state"])
        # The in-place state update (final_state is initial_state) through the op.
        h = kw["initial_state"].clone()

        def inplace(q, k, v, g, beta, h):
            out = torch.empty_like(v)
            flash_kda.fwd(q, k, v, g, beta, None, out, kw["A_log"], dt, -5.0, h, h)
            return out

        torch._dynamo.reset()
        out_inplace = torch.compile(inplace, fullgraph=True)(*args, h)
    torch.cuda.synchronize(cuda_sm90)
    assert torch.equal(compiled[0], eager[0]) and torch.equal(compiled[1], eager[1])
    assert torch.equal(out_inplace, eager[0]) and torch.equal(h, eager[1])


@pytest.mark.parametrize("gate", ["none", "softplus"])
def test_a_nan_gate_gives_nan_where_the_reference_does(cuda_sm90, gate):
    """A NaN in the log decay (pre-computed g) or in the gate input (softplus) of one token,
    channel and value head of sequence 0 makes that (sequence, head)'s final state NaN, as the
    fp64 reference's and fla's: it must not turn into the decay floor (a state reset) or leak
    into the other head or sequence, which stay within the bound of the reference."""
    import torch

    import flash_kda

    case = ChunkCase(f"nan_{gate}", gate=gate, heads=2, lens=(70, 50))
    args, kw, _ = make_call(case, cuda_sm90)
    q, k, v, g, beta = args
    g = g.clone()
    g[0, 33, 1, 5] = float("nan")  # sequence 0, token 33, value head 1, channel 5
    args = (q, k, v, g, beta)
    with torch.inference_mode():
        out, final = flash_kda.chunk_kda(*args, **kw)
    torch.cuda.synchronize(cuda_sm90)
    ref_o, ref_s = reference(args, kw)
    assert np.isnan(ref_s[0, 1]).any(), "the reference itself should carry the NaN"
    assert torch.isnan(final[0, 1]).any(), "a NaN gate must leave a NaN state, as the reference does"
    assert torch.isfinite(final[0, 0]).all() and torch.isfinite(final[1]).all()
    assert rel_err(final[1], ref_s[1]) <= BOUND and rel_err(final[0, 0], ref_s[0, 0]) <= BOUND
    # Chunks of sequence 0 before token 33's 16-token chunk, and all of sequence 1, are untouched.
    assert torch.isfinite(out[0, :32]).all() and torch.isfinite(out[0, 70:]).all()
    assert rel_err(out[0, 70:], ref_o[0, 70:]) <= BOUND
