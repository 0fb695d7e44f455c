"""flash_kda.chunk_kda's training path on CPU: a call with an input requiring grad runs the
functional op flash_kda::chunk_kda_train, saves its inputs only, and its backward calls
_core.backward_raw with the gradient tensors it allocates (the order, dtypes and shapes of
the raw descriptions; what the C++ writes reaches each input's .grad); torch.compile
(fullgraph=True) traces forward and backward. The kernels are replaced by recorders: the
forward's launch writes constants into out and the final state, and the backward's
_core.backward_raw (a stand-in: this CPU build has none) writes a constant per gradient
through its data pointer. The GPU values are in test_chunk_train_gpu.py. Skips without torch."""
from __future__ import annotations

import ctypes

import pytest

torch = pytest.importorskip("torch")

import flash_kda  # noqa: E402
from flash_kda import _chunk, _core, _forward  # noqa: E402

if not hasattr(torch.ops.flash_kda, "chunk_kda_train"):
    pytest.skip("this torch has no torch.library.custom_op: the ops are not registered", allow_module_level=True)

B, L, H, K = 2, 32, 2, 128
#: The constant the stand-in backward writes into each gradient (by GRAD_TENSORS position).
FILL = {"dq": 1.0, "dk": 2.0, "dv": 3.0, "dg": 4.0, "dbeta": 5.0, "dA_log": 6.0, "ddt_bias": 7.0,
        "d_initial_state": 8.0}
_TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16,
                 "float64": torch.float64}


def _write(raw, value: float) -> None:
    """Write `value` into every element of the contiguous host tensor a raw description names."""
    ptr, code, shape, _, _ = raw
    name = next(n for n, c in _core.dtype_codes.items() if c == code)
    src = torch.full(tuple(shape), value, dtype=_TORCH_DTYPES[name])
    ctypes.memmove(ptr, src.data_ptr(), src.numel() * src.element_size())


@pytest.fixture
def kernels(monkeypatch):
    """Stand-ins for the forward's launch and the backward's _core entry points; yields the
    record of calls: ("forward", named tensors, settings), ("validate", raw, raw grads,
    settings), ("backward", raw, raw grads, settings) with raw descriptions."""
    seen = []

    def forward(tensors, settings, options, torch_module):
        named = dict(zip(_forward.FORWARD_TENSORS, tensors))
        seen.append(("forward", named, settings))
        named["out"].fill_(1.0)
        if named["final_state"] is not None:
            named["final_state"].fill_(2.0)

    def validate(raw, raw_grads, *settings):
        seen.append(("validate", raw, raw_grads, settings))
        return ()

    def backward(raw, raw_grads, scale, lower_bound, alloc, stream, *flags):
        assert callable(alloc) and stream == 0  # host tensors: no CUDA stream
        seen.append(("backward", raw, raw_grads, (scale, lower_bound, *flags)))
        for name, d in zip(_chunk.GRAD_TENSORS, raw_grads):
            if name in FILL and d is not None:
                _write(d, FILL[name])

    monkeypatch.setattr(_forward, "launch", forward)
    monkeypatch.setattr(_chunk, "launch", forward)
    monkeypatch.setattr(_core, "validate_backward_raw", validate, raising=False)
    monkeypatch.setattr(_core, "backward_raw", backward, raising=False)
    return seen


def _inputs(grad=("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state"), hv=H):
    gen = torch.Generator().manual_seed(0)
    x = {"q": torch.randn(B, L, H, K, generator=gen).bfloat16(), "k": torch.randn(B, L, H, K, generator=gen).bfloat16(),
         "v": torch.randn(B, L, hv, K, generator=gen).bfloat16(), "g": torch.randn(B, L, hv, K, generator=gen).bfloat16(),
         "beta": torch.randn(B, L, hv, generator=gen).bfloat16(), "A_log": torch.rand(hv, generator=gen),
         "dt_bias": torch.rand(hv * K, generator=gen), "initial_state": torch.randn(B, hv, K, K, generator=gen)}
    for name in grad:
        x[name].requires_grad_()
    return x


def _call(x, **kw):
    args = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                safe_gate=True, lower_bound=-5.0, state_v_first=True, output_final_state=True,
                initial_state=x["initial_state"], A_log=x["A_log"], dt_bias=x["dt_bias"])
    args.update(kw)
    return flash_kda.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], **args)


def _grad_names(raw_grads) -> list[str]:
    return [n for n, d in zip(_chunk.GRAD_TENSORS, raw_grads) if d is not None]


def test_every_input_gets_what_the_backward_writes(kernels):
    x = _inputs()
    o, s = _call(x)
    assert o.requires_grad and s.requires_grad and bool((o == 1).all()) and bool((s == 2).all())
    (o.float().sum() + 3 * s.sum()).backward()
    for name, grad in zip(_chunk.GRAD_INPUTS, ("dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias",
                                               "d_initial_state")):
        t = x[name]
        assert t.grad is not None and t.grad.shape == t.shape and t.grad.dtype == t.dtype, name
        assert bool((t.grad == FILL[grad]).all()), name
    kinds = [k[0] for k in kernels]
    assert kinds == ["validate", "forward", "backward"]
    _, raw, raw_grads, settings = kernels[2]
    assert settings == (None, -5.0, "safe", "v_first", True, True, False)
    assert _grad_names(raw_grads) == list(_chunk.GRAD_TENSORS)
    # the forward's inputs, its outputs absent
    named = dict(zip(_forward.FORWARD_TENSORS, raw))
    for name in ("out", "final_state", "ssm_state_indices", "intermediate_states", "intermediate_offsets"):
        assert named[name] is None
    for name in _chunk.GRAD_INPUTS:
        assert named[name][0] == x[name].data_ptr()
    d = dict(zip(_chunk.GRAD_TENSORS, raw_grads))
    # d_out: the sum's gradient, made contiguous (autograd hands it as a stride-0 expansion)
    assert d["d_out"][2] == (B, L, H, K) and d["d_out"][3] == (L * H * K, H * K, K, 1)
    assert d["d_final_state"][1] == _core.dtype_codes["float32"] and d["d_final_state"][2] == (B, H, K, K)
    assert d["dq"][1] == _core.dtype_codes["bfloat16"] and d["dA_log"][1] == _core.dtype_codes["float32"]
    assert d["ddt_bias"][2] == (H * K,)  # like dt_bias, flat as fla passes it


def test_only_inputs_that_require_grad_get_one(kernels):
    x = _inputs(grad=("v",))
    o, s = _call(x, output_final_state=False)
    assert s is None
    o.float().pow(2).sum().backward()
    assert bool((x["v"].grad == FILL["dv"]).all())
    assert all(x[n].grad is None for n in _chunk.GRAD_INPUTS if n != "v")
    _, _, raw_grads, _ = kernels[-1]
    # dq .. dbeta are always written; the optional three only when asked for; no final state
    assert _grad_names(raw_grads) == ["d_out", "dq", "dk", "dv", "dg", "dbeta"]


def test_the_forward_saves_its_inputs_only(kernels):
    x = _inputs()
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        o, s = _call(x)
    inputs = {x[n].data_ptr() for n in _chunk.GRAD_INPUTS}
    assert saved and {t.data_ptr() for t in saved} <= inputs
    assert len({t.untyped_storage().data_ptr() for t in saved}) == len(_chunk.GRAD_INPUTS)


def test_without_the_fused_gate_A_log_and_dt_bias_get_no_gradient(kernels):
    x = _inputs()
    o, _ = _call(x, use_gate_in_kernel=False, safe_gate=False, lower_bound=None)
    o.float().sum().backward()
    assert x["A_log"].grad is None and x["dt_bias"].grad is None and bool((x["g"].grad == FILL["dg"]).all())
    _, raw, raw_grads, settings = kernels[-1]
    assert settings[2] == "none" and dict(zip(_forward.FORWARD_TENSORS, raw))["A_log"] is None
    assert "dA_log" not in _grad_names(raw_grads)


def test_a_refused_backward_raises_before_the_forward_runs(kernels, monkeypatch):
    def refuse(raw, raw_grads, *settings):
        e = _core.Error("flash_kda: g: the backward does not serve this")
        e.argument = "g"
        raise e

    monkeypatch.setattr(_core, "validate_backward_raw", refuse)
    with pytest.raises(flash_kda.Error) as e:
        _call(_inputs())
    assert e.value.argument == "g" and kernels == []


@pytest.mark.parametrize("kw, argument", [
    (dict(return_intermediate_states=True), "return_intermediate_states"),
    (dict(intermediate_state_every=16), "intermediate_state_every"),
    (dict(cp_context=object()), "cp_context"),
])
def test_training_calls_the_backward_does_not_serve_raise(kernels, kw, argument):
    with pytest.raises(flash_kda.Error) as e:
        _call(_inputs(), **kw)
    assert e.value.argument == argument and kernels == []
    with torch.no_grad():  # the same call for inference
        if argument != "cp_context":
            _call(_inputs(), **kw)


def test_without_a_backward_in_the_build_grad_raises(monkeypatch):
    monkeypatch.delattr(_core, "backward_raw", raising=False)
    with pytest.raises(flash_kda.Error) as e:
        _call(_inputs(grad=("k",)))
    assert e.value.argument == "k" and "has no backward" in str(e.value)


def test_inference_calls_do_not_go_through_the_training_op(kernels, monkeypatch):
    from flash_kda import _ops

    monkeypatch.setattr(_ops, "train_op", lambda *a, **kw: pytest.fail("inference call went through the op"))
    x = _inputs()
    with torch.no_grad():
        o, _ = _call(x)
    assert not o.requires_grad
    o, _ = _call(_inputs(grad=()))  # grad enabled, nothing requires it
    assert not o.requires_grad and [k[0] for k in kernels] == ["forward", "forward"]


def _loss(q, k, v, g, beta, A_log, dt_bias, h0):
    """What the torch.compile tests compile: a chunk_kda training call with fla's defaults
    (softplus gate, k-first state) and a loss on out and the final state."""
    o, s = flash_kda.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                               use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                               use_beta_sigmoid_in_kernel=True, A_log=A_log, dt_bias=dt_bias)
    return (o.float() * 2).sum() + s.sum()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_training_compiles_without_a_graph_break(kernels, backend):
    x = _inputs()
    args = [x[n] for n in _chunk.GRAD_INPUTS]
    torch._dynamo.reset()
    assert torch._dynamo.explain(_loss)(*args).graph_break_count == 0
    kernels.clear()
    loss = torch.compile(_loss, fullgraph=True, backend=backend)(*args)
    loss.backward()
    for name, grad in zip(_chunk.GRAD_INPUTS, FILL):
        assert bool((x[name].grad == FILL[grad]).all()), name
    assert [k[0] for k in kernels] == ["forward", "backward"]
    _, _, raw_grads, settings = kernels[-1]
    # softplus: use_gate_in_kernel without lower_bound; k-first: state_v_first=False (fla's defaults)
    assert settings == (None, -5.0, "softplus", "k_first", True, True, False)
    assert _grad_names(raw_grads) == list(_chunk.GRAD_TENSORS)


def test_gva_gradients_have_the_inputs_shapes(kernels):
    x = _inputs(hv=2 * H)
    o, s = _call(x)
    assert o.shape == (B, L, 2 * H, K) and s.shape == (B, 2 * H, K, K)
    (o.float().sum() + s.sum()).backward()
    assert x["q"].grad.shape == (B, L, H, K) and x["beta"].grad.shape == (B, L, 2 * H)


def test_training_compiles_with_a_dynamic_sequence_length(kernels):
    """torch.compile(fullgraph=True) with T marked dynamic (torch._dynamo.mark_dynamic): out's
    shape follows the symbolic T instead of specialising it, so one graph serves every length."""
    x = _inputs()
    args = [x[n] for n in _chunk.GRAD_INPUTS]
    for a in args[:5]:
        torch._dynamo.mark_dynamic(a, 1)
    torch._dynamo.reset()
    kernels.clear()
    loss = torch.compile(_loss, fullgraph=True, backend="aot_eager")(*args)
    loss.backward()
    assert [k[0] for k in kernels] == ["forward", "backward"]
