"""torch.compile(fullgraph=True) traces flash_kda.fwd and flash_kda.chunk_kda into the
torch.library op flash_kda::forward without a graph break, on CPU tensors: the op's launch
(flash_kda._forward.launch, which chunk_kda's eager path also calls) is replaced by a recorder, so what is checked is the trace, the
fake implementation and what the op hands to the launch, not the kernels (those are in
test_chunk_gpu.py). Skips without torch."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import flash_kda  # noqa: E402
from flash_kda import _chunk, _forward  # noqa: E402

if not hasattr(torch.ops.flash_kda, "forward"):
    pytest.skip("this torch has no torch.library.custom_op: the op is not registered", allow_module_level=True)

B, L, H, K = 1, 32, 2, 128


@pytest.fixture
def launches(monkeypatch):
    seen = []

    def record(tensors, settings, options, torch_module):
        named = dict(zip(_forward.FORWARD_TENSORS, tensors))
        seen.append((named, settings, options))
        named["out"].fill_(1.0)  # what the op writes must reach the caller's tensor
        if named["final_state"] is not None:
            named["final_state"].fill_(2.0)

    monkeypatch.setattr(_forward, "launch", record)
    monkeypatch.setattr(_chunk, "launch", record)  # chunk_kda's eager path
    return seen


def _inputs():
    gen = torch.Generator().manual_seed(0)
    q, k, v, g = (torch.randn(B, L, H, K, generator=gen).bfloat16() for _ in range(4))
    beta = torch.randn(B, L, H, generator=gen).bfloat16()
    return q, k, v, g, beta, torch.zeros(H), torch.zeros(H * K), torch.zeros(B, H, K, K)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_chunk_kda_compiles_without_a_graph_break(launches, backend):
    def f(q, k, v, g, beta, A_log, dt_bias, h0):
        o, s = flash_kda.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                   use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                   use_beta_sigmoid_in_kernel=True, A_log=A_log, dt_bias=dt_bias)
        return o + 1, s

    x = _inputs()
    torch._dynamo.reset()
    with torch.no_grad():
        assert torch._dynamo.explain(f)(*x).graph_break_count == 0
        launches.clear()
        o, s = torch.compile(f, fullgraph=True, backend=backend)(*x)
    assert o.shape == (B, L, H, K) and o.dtype == torch.bfloat16 and bool((o == 2).all())
    assert s.shape == (B, H, K, K) and s.dtype == torch.float32 and bool((s == 2).all())
    (named, settings, options), = launches
    # softplus: use_gate_in_kernel without lower_bound; k-first: state_v_first=False (fla's defaults)
    assert settings == (None, -5.0, "softplus", "k_first", True, True, False) and options is None
    assert named["initial_state"].data_ptr() == x[7].data_ptr()


def test_fwd_compiles_without_a_graph_break_and_updates_in_place(launches):
    def f(q, k, v, g, beta, A_log, dt_bias, h0):
        out = torch.empty_like(v)
        flash_kda.fwd(q, k, v, g, beta, None, out, A_log, dt_bias, -5.0, h0, h0,
                      launch_options=flash_kda.LaunchOptions(segments=1))
        return out * 2

    x = _inputs()
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(f, fullgraph=True, backend="aot_eager")(*x)
    assert bool((out == 2).all())
    assert bool((x[7] == 2).all())  # the in-place state update reached the caller's h0
    (named, settings, options), = launches
    assert settings == (None, -5.0, "safe", "v_first", True, True, False)
    assert named["initial_state"] is named["final_state"]
    assert options == (0, 0, 1, 0)


def test_eager_calls_do_not_go_through_the_op(launches, monkeypatch):
    """Outside torch.compile, chunk_kda goes straight to the launch (the dispatcher would cost
    host time on every call)."""
    from flash_kda import _ops

    monkeypatch.setattr(_ops, "forward_op", lambda *a, **kw: pytest.fail("eager call went through the op"))
    x = _inputs()
    with torch.no_grad():
        o, s = flash_kda.chunk_kda(*x[:5], use_gate_in_kernel=True, lower_bound=-5.0, A_log=x[5], dt_bias=x[6])
    assert s is None and bool((o == 1).all()) and len(launches) == 1


def test_grad_without_a_backward_is_refused_before_anything_runs(launches, monkeypatch):
    monkeypatch.delattr(flash_kda._core, "backward_raw", raising=False)
    x = list(_inputs())
    x[2] = x[2].float().requires_grad_()
    with pytest.raises(flash_kda.Error) as e:
        flash_kda.chunk_kda(*x[:5])
    assert e.value.argument == "v" and "has no backward" in str(e.value)
    with torch.no_grad():
        flash_kda.chunk_kda(*x[:5])
    assert len(launches) == 1
