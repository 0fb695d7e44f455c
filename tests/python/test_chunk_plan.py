"""flash_kda.chunk_kda's Python-level part on CPU, no torch needed: fla 0.6.0's keyword rules
(which gate a call selects, what it requires), flash_kda's refusals (grad, cp_context,
intermediate states, unknown keywords), and the C++ validation of the very call
(_chunk.validate_call) on stand-in tensors at made-up CUDA addresses."""
from __future__ import annotations

import pytest

import flash_kda
from flash_kda import _chunk, _core

B, L, H, K = 2, 64, 4, 128


class T:
    """A stand-in CUDA tensor: what plan_call and validate_call read (shape, dtype, strides,
    data_ptr, device, requires_grad), at a made-up address apart from every other one."""

    _next = 1 << 40

    def __init__(self, *shape, dtype="torch.bfloat16", is_cuda=True, requires_grad=False, strides=None):
        self.shape, self.ndim, self.dtype = tuple(shape), len(shape), dtype
        self.is_cuda, self.requires_grad, self.device = is_cuda, requires_grad, "cuda:0"
        packed, n = [], 1
        for d in reversed(shape):
            packed.insert(0, n)
            n *= d
        self._strides = tuple(strides or packed)
        self._ptr = T._next
        T._next += 1 << 32

    def data_ptr(self):
        return self._ptr

    def stride(self):
        return self._strides

    def get_device(self):
        return 0 if self.is_cuda else -1


def call(**change):
    """FlashKDA's call in fla's words (what fla's KDA layer passes with safe_gate)."""
    kw = dict(q=T(B, L, H, K), k=T(B, L, H, K), v=T(B, L, H, K), g=T(B, L, H, K), beta=T(B, L, H),
              scale=None, initial_state=T(B, H, K, K, dtype="torch.float32"), output_final_state=True,
              use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
              allow_neg_eigval=False, safe_gate=True, lower_bound=-5.0, disable_recompute=False,
              return_intermediate_states=False, state_v_first=True, cu_seqlens=None, cu_seqlens_cpu=None,
              cp_context=None, use_graph=False, max_num_seqs=None,
              kwargs=dict(A_log=T(H, dtype="torch.float32"), dt_bias=T(H * K, dtype="torch.float32")),
              grad_enabled=False)
    extra = change.pop("kwargs", None)
    kw.update(change)
    if extra is not None:
        kw["kwargs"] = {**kw["kwargs"], **extra}
        kw["kwargs"] = {n: t for n, t in kw["kwargs"].items() if t is not _DROP}
    return kw


_DROP = object()


def plan(**change):
    return _chunk.plan_call(**call(**change))


def refusal(**change) -> flash_kda.Error:
    with pytest.raises(flash_kda.Error) as e:
        plan(**change)
    return e.value


@pytest.mark.parametrize("change, gate, bound, A_log", [
    (dict(), "safe", -5.0, True),
    (dict(safe_gate=False, lower_bound=-3.0), "safe", -3.0, True),  # fla's gate keys on lower_bound alone
    (dict(kwargs=dict(A_log=_DROP)), "safe", -5.0, False),  # lower_bound * sigmoid(g + dt_bias)
    (dict(safe_gate=False, lower_bound=None), "softplus", -5.0, True),
    (dict(use_gate_in_kernel=False), "none", -5.0, False),  # g is the log decay; A_log, dt_bias ignored
    (dict(use_gate_in_kernel=False, safe_gate=False, lower_bound=None), "none", -5.0, False),
])
def test_the_gate_follows_fla(change, gate, bound, A_log):
    p = plan(**change)
    assert p.settings[2] == gate and p.settings[1] == bound
    assert ("A_log" in p.inputs) is A_log
    assert ("dt_bias" in p.inputs) is (gate != "none")


def test_settings_carry_the_flags_and_layout():
    assert plan().settings == (None, -5.0, "safe", "v_first", True, True, False)
    p = plan(state_v_first=False, use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=True,
             allow_neg_eigval=True, scale=0.25)
    assert p.settings == (0.25, -5.0, "safe", "k_first", False, True, True)
    assert plan(output_final_state=False).output_final_state is False
    assert plan().num_seqs == B and plan(q=T(1, L, H, K), cu_seqlens=T(6, dtype="torch.int64")).num_seqs == 5


def test_deprecated_transpose_state_layout_is_state_v_first():
    with pytest.warns(DeprecationWarning):
        assert plan(state_v_first=False, kwargs=dict(transpose_state_layout=True)).settings[3] == "v_first"
    assert refusal(kwargs=dict(transpose_state_layout=True)).argument == "transpose_state_layout"


@pytest.mark.parametrize("change, argument, words", [
    (dict(cp_context=object()), "cp_context", "context parallelism"),
    (dict(return_intermediate_states=True, use_graph=True), "use_graph", "intermediate states need the sequence"),
    (dict(return_intermediate_states=True, kwargs=dict(intermediate_state_every=64)), "intermediate_state_every",
     "pick one"),
    (dict(kwargs=dict(intermediate_state_every=24)), "intermediate_state_every", "positive multiple of 16"),
    (dict(kwargs=dict(intermediate_state_every=True)), "intermediate_state_every", "positive multiple of 16"),
    (dict(kwargs=dict(head_first=False)), "head_first", "is not a keyword of chunk_kda"),
    (dict(kwargs=dict(chunk_size=16)), "chunk_size", "32 or 64"),
    (dict(safe_gate=False, lower_bound=None, kwargs=dict(A_log=_DROP)), "A_log", "softplus gate"),
    (dict(lower_bound=None), "lower_bound", "safe_gate=True"),
    (dict(safe_gate=1), "safe_gate", "expected a bool"),
    (dict(lower_bound="-5"), "lower_bound", "real number"),
    (dict(q=T(1, L, H, K), cu_seqlens=T(4, dtype="torch.int64"), use_graph=True, max_num_seqs=8), "max_num_seqs",
     "max_num_seqs + 1 = 9 entries"),
])
def test_refusals_name_the_argument(change, argument, words):
    e = refusal(**change)
    assert e.argument == argument and words in str(e), str(e)


def test_intermediate_state_forms():
    assert plan().intermediate is None
    assert plan(return_intermediate_states=True).intermediate == ("fla", 64, True)
    assert plan(return_intermediate_states=True, kwargs=dict(chunk_size=32)).intermediate == ("fla", 32, True)
    assert plan(kwargs=dict(intermediate_state_every=48)).intermediate == ("every", 48, False)
    assert plan(return_intermediate_states=True).settings == plan().settings


def test_grad_flags_are_read_only_while_grad_is_enabled(monkeypatch):
    assert plan(q=T(B, L, H, K, requires_grad=True), grad_enabled=False).inputs["q"].requires_grad
    assert plan(q=T(B, L, H, K, requires_grad=True), grad_enabled=False).grad == ()
    monkeypatch.delattr(_core, "backward_raw", raising=False)
    assert plan(q=T(B, L, H, K, requires_grad=True), grad_enabled=False).grad == ()


@pytest.fixture
def with_backward(monkeypatch):
    """As with a build whose extension has the backward."""
    monkeypatch.setattr(_core, "backward_raw", lambda *a: None, raising=False)
    monkeypatch.setattr(_core, "validate_backward_raw", lambda *a: (), raising=False)


def test_a_training_call_names_the_inputs_that_require_grad(with_backward):
    p = plan(v=T(B, L, H, K, requires_grad=True), kwargs=dict(A_log=T(H, dtype="torch.float32", requires_grad=True)),
             initial_state=T(B, H, K, K, dtype="torch.float32", requires_grad=True), grad_enabled=True)
    assert p.grad == ("v", "initial_state", "A_log")
    assert plan(grad_enabled=True).grad == ()
    # without the fused gate A_log and dt_bias are ignored: no gradient either
    p = plan(use_gate_in_kernel=False, kwargs=dict(A_log=T(H, dtype="torch.float32", requires_grad=True)),
             g=T(B, L, H, K, requires_grad=True), grad_enabled=True)
    assert p.grad == ("g",) and "A_log" not in p.inputs


@pytest.mark.parametrize("change, argument, words", [
    (dict(return_intermediate_states=True), "return_intermediate_states", "intermediate states have no backward"),
    (dict(kwargs=dict(intermediate_state_every=64)), "intermediate_state_every", "intermediate states have no backward"),
    (dict(cp_context=object()), "cp_context", "context parallelism"),
])
def test_training_refusals_name_the_argument(with_backward, change, argument, words):
    e = refusal(q=T(B, L, H, K, requires_grad=True), grad_enabled=True, **change)
    assert e.argument == argument and words in str(e), str(e)
    if argument != "cp_context":
        assert plan(q=T(B, L, H, K, requires_grad=True), grad_enabled=False, **change).intermediate is not None


@pytest.mark.parametrize("change, argument", [
    (dict(q=T(B, L, H, K, requires_grad=True)), "q"),
    (dict(kwargs=dict(A_log=T(H, dtype="torch.float32", requires_grad=True))), "A_log"),
])
def test_grad_without_a_backward_in_the_build_is_refused(monkeypatch, change, argument):
    monkeypatch.delattr(_core, "backward_raw", raising=False)
    e = refusal(grad_enabled=True, **change)
    assert e.argument == argument and "has no backward" in str(e), str(e)


def test_accepted_without_effect():
    assert plan(disable_recompute=True).settings == plan().settings
    assert plan(kwargs=dict(chunk_size=32)).settings == plan().settings
    assert plan(max_num_seqs=3).settings == plan().settings  # ignored without use_graph, as by fla


def test_use_graph_takes_padded_cu_seqlens_without_its_host_copy():
    cu, host = T(9, dtype="torch.int64"), T(9, dtype="torch.int64", is_cuda=False)
    p = plan(q=T(1, L, H, K), cu_seqlens=cu, cu_seqlens_cpu=host, use_graph=True, max_num_seqs=8)
    assert p.inputs["cu_seqlens"] is cu and "cu_seqlens_cpu" not in p.inputs
    assert plan(q=T(1, L, H, K), cu_seqlens=cu, cu_seqlens_cpu=host).inputs["cu_seqlens_cpu"] is host


def test_validation_accepts_flashkdas_call_and_returns_its_sizes(kernels_built):
    assert _chunk.validate_call(plan())[:8] == (B, L, B, H, H, K, K, False)
    assert _chunk.validate_call(plan(output_final_state=False, initial_state=None))[2] == B


@pytest.mark.parametrize("change, argument", [
    (dict(q=T(B, L, H, 64), k=T(B, L, H, 64), g=T(B, L, H, 64), initial_state=None, output_final_state=False,
          kwargs=dict(dt_bias=T(H * 64, dtype="torch.float32"))), "q"),
    (dict(q=T(B, L, H, K, is_cuda=False)), "q"),
    (dict(beta=T(B, L)), "beta"),
    (dict(initial_state=T(B + 1, H, K, K, dtype="torch.float32")), "initial_state"),
    (dict(cu_seqlens=T(3, dtype="torch.int64")), "cu_seqlens"),  # B = 2 with cu_seqlens
    (dict(q="not a tensor"), "q"),
])
def test_validation_names_what_the_kernels_cannot_take(change, argument):
    with pytest.raises(flash_kda.Error) as e:
        _chunk.validate_call(plan(**change))
    assert e.value.argument == argument, str(e.value)


def test_validation_is_the_cpp_one_with_the_calls_settings(monkeypatch):
    """Nothing about what the GPU serves is decided in Python: the settings and every tensor go
    to _core.validate_forward_raw, and its answer is the answer."""
    seen = []

    def fake(tensors, *settings):
        seen.append((tensors, settings))
        return "sizes"

    monkeypatch.setattr(_core, "validate_forward_raw", fake)
    p = plan(safe_gate=False, lower_bound=None, state_v_first=False, use_qk_l2norm_in_kernel=False)
    assert _chunk.validate_call(p) == "sizes"
    (tensors, settings), = seen
    assert settings == (None, -5.0, "softplus", "k_first", False, True, False)
    named = dict(zip(_core.forward_tensors, tensors))
    assert named["q"][0] == p.inputs["q"].data_ptr() and named["q"][2] == (B, L, H, K)
    # The outputs: described at low, aligned, disjoint addresses on q's device; fp32 final state.
    out, final = named["out"], named["final_state"]
    assert out[2] == (B, L, H, K) and out[1] == _core.dtype_codes["bfloat16"] and out[4] == 0
    assert final[2] == (B, H, K, K) and final[1] == _core.dtype_codes["float32"]
    assert out[0] % 256 == 0 and final[0] % 256 == 0
    assert final[0] >= out[0] + B * L * H * K * 2
    assert final[0] + B * H * K * K * 4 < min(t.data_ptr() for t in p.inputs.values())


def test_k_first_final_state_shape():
    p = plan(state_v_first=False, q=T(B, L, H, 64), k=T(B, L, H, 64), g=T(B, L, H, 64))
    assert _chunk.output_shapes(p) == ((B, L, H, K), (B, H, 64, K))
    assert _chunk.output_shapes(plan(q=T(B, L, H, 64)))[1] == (B, H, K, 64)
