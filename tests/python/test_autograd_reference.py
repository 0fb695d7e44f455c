"""flash_kda.autograd_reference, the gradient yardstick, on the CPU.

- Its forward equals flash_kda.reference (the C++ token-by-token fp64 reference) to 1e-12
  (relative Frobenius) over the gate modes, flags, GVA, varlen with empty sequences, initial
  states, both state layouts and several evaluation chunk lengths.
- Its gradients equal those of the literal token-by-token recurrence of docs/kda-spec.md written
  here (token_loop: autograd through the spec's loop, tiny shapes) to 1e-10, for every input
  (q, k, v, g, beta, A_log, dt_bias, initial_state), including decays of -50 nats a token and
  the softplus gate with A_log = log 16 (where exp(G_i) exp(-G_j) would overflow).
- torch.autograd.gradcheck on tiny cases; the chunk length changes nothing but rounding; the
  keyword rules raise flash_kda.Error naming the argument; the package imports without torch.
Needs torch (CPU) and the CPU reference (FLASH_KDA_CUDA=OFF builds it); no GPU.
"""
from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flash_kda  # noqa: E402
from chunk_cases import reference  # noqa: E402

FWD_TOL = 1e-12   # vs the C++ fp64 reference: two exact evaluations, different rounding
GRAD_TOL = 1e-10  # vs the token loop's autograd gradients


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """The tensors here are tiny: torch's intra-op thread pool costs more than it saves (the
    module took over twice as long with 2 threads on the 2-core development machine). Restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@dataclasses.dataclass(frozen=True)
class Call:
    """One small chunk_kda call. gate: "safe" (lower_bound -5 with A_log), "safe_no_A" (without
    A_log), "softplus" or "none" (g is the log decay: the softplus gate's decay of the draw);
    lens: varlen lengths (None: B x T); state: initial_state dtype or None; dtype: of q, k, v,
    g, beta; decay: "realistic" (A_log = log U(1, 16), g ~ N(0, 1)) or "extreme" (A_log =
    log 16 and g ~ N(2, 3^2): tens of nats a token; with gate "none": -50 nats a token, +-5)."""

    gate: str = "safe"
    B: int = 2
    T: int = 21
    lens: tuple | None = None
    H: int = 2
    HV: int = 2
    K: int = 8
    V: int = 4
    state: str | None = "fp32"
    v_first: bool = True
    l2norm: bool = True
    beta_sigmoid: bool = True
    neg_eigval: bool = False
    dtype: str = "float32"
    decay: str = "realistic"
    chunk_size: int = 16
    flat_dt_bias: bool = True


def draw(c: Call, seed: int = 0):
    """(args, kwargs) of the chunk_kda call `c` on the CPU, in c.dtype (A_log, dt_bias, the
    initial state: fp32 or bf16 as c.state says)."""
    gen = torch.Generator().manual_seed(seed)
    dt = getattr(torch, c.dtype)
    if c.lens is not None:
        B, T = 1, sum(c.lens)
        N = len(c.lens)
    else:
        B, T, N = c.B, c.T, c.B

    def randn(*shape, mean=0.0, std=1.0):
        return mean + std * torch.randn(*shape, generator=gen)

    q, k = randn(B, T, c.H, c.K), randn(B, T, c.H, c.K)
    if not c.l2norm:  # unit rows: the delta rule stays contractive without the fused norm
        q, k = (torch.nn.functional.normalize(x, dim=-1) for x in (q, k))
    v = randn(B, T, c.HV, c.V)
    extreme = c.decay == "extreme"
    g = randn(B, T, c.HV, c.K, mean=2.0 if extreme else 0.0, std=3.0 if extreme else 1.0)
    beta = randn(B, T, c.HV)
    if not c.beta_sigmoid:
        beta = torch.sigmoid(beta)
    A_log = torch.full((c.HV,), math.log(16.0)) if extreme else torch.log(
        torch.empty(c.HV).uniform_(1.0, 16.0, generator=gen))
    dt_bias = randn(c.HV * c.K, std=0.1)
    kw = dict(use_qk_l2norm_in_kernel=c.l2norm, use_beta_sigmoid_in_kernel=c.beta_sigmoid,
              allow_neg_eigval=c.neg_eigval, state_v_first=c.v_first, output_final_state=True,
              chunk_size=c.chunk_size)
    if c.gate == "none":
        if extreme:
            g = randn(B, T, c.HV, c.K, mean=-50.0, std=5.0).clamp(max=-30.0)
        else:
            g = -torch.exp(A_log)[:, None] * torch.nn.functional.softplus(g + dt_bias.view(c.HV, c.K))
        kw["use_gate_in_kernel"] = False
    else:
        kw.update(use_gate_in_kernel=True, dt_bias=dt_bias if c.flat_dt_bias else dt_bias.view(c.HV, c.K))
        if c.gate != "safe_no_A":
            kw["A_log"] = A_log
        if c.gate != "softplus":
            kw.update(safe_gate=True, lower_bound=-5.0)
    if c.state is not None:
        dims = (c.HV, c.V, c.K) if c.v_first else (c.HV, c.K, c.V)
        kw["initial_state"] = randn(N, *dims, std=0.5).to({"fp32": torch.float32, "bf16": torch.bfloat16}[c.state])
    if c.lens is not None:
        kw["cu_seqlens"] = torch.tensor(np.concatenate([[0], np.cumsum(c.lens)]), dtype=torch.int64)
    return tuple(x.to(dt) for x in (q, k, v, g, beta)), kw


def rel(x, ref) -> float:
    x = x.detach().double().numpy() if hasattr(x, "detach") else np.asarray(x, dtype=np.float64)
    ref = ref.detach().double().numpy() if hasattr(ref, "detach") else np.asarray(ref, dtype=np.float64)
    assert x.shape == ref.shape, (x.shape, ref.shape)
    den = np.linalg.norm(ref)
    return float(np.linalg.norm(x - ref) / den) if den > 0 else float(np.linalg.norm(x))


def token_loop(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
               use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
               allow_neg_eigval=False, safe_gate=False, lower_bound=None, state_v_first=False, cu_seqlens=None,
               A_log=None, dt_bias=None, chunk_size=None):
    """The spec's recurrence (docs/kda-spec.md "Pre-processing", "Recurrence") token by token in
    fp64 torch operations, literally: per sequence, for each token, S <- diag(exp(a_t)) S;
    S <- S + b_t k_t (v_t - S^T k_t)^T; o_t = scale S^T q_t (all value heads at once). Same
    keywords as chunk_kda; returns (o, final_state) like autograd_reference."""
    del safe_gate, chunk_size  # neither changes the function
    f64 = torch.float64
    q, k, v, g, beta = (x.to(f64) for x in (q, k, v, g, beta))
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if use_qk_l2norm_in_kernel:
        q = q / torch.sqrt((q ** 2).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k ** 2).sum(-1, keepdim=True) + 1e-6)
    if use_gate_in_kernel:
        x = g + (0.0 if dt_bias is None else dt_bias.to(f64).reshape(HV, K))
        if lower_bound is not None:
            rate = 1.0 if A_log is None else torch.exp(A_log.to(f64))[:, None]
            a = lower_bound / (1.0 + torch.exp(-rate * x))
        else:
            a = -torch.exp(A_log.to(f64))[:, None] * torch.log1p(torch.exp(x))
    else:
        a = g
    b = beta
    if use_beta_sigmoid_in_kernel:
        b = (2.0 if allow_neg_eigval else 1.0) / (1.0 + torch.exp(-beta))
    scale = K ** -0.5 if scale is None else scale
    heads = torch.arange(HV) // (HV // H)  # value head hv reads q/k head hv // (HV / H)
    if cu_seqlens is None:
        seqs = [(n, n, 0, T) for n in range(B)]  # (state row, batch row, first token, length)
    else:
        cu = cu_seqlens.tolist()
        seqs = [(n, 0, cu[n], cu[n + 1] - cu[n]) for n in range(len(cu) - 1)]
    rows = {}
    finals = []
    for n, bi, start, length in seqs:
        if initial_state is None:
            S = torch.zeros(HV, K, V, dtype=f64)
        else:
            S = initial_state[n].to(f64)
            S = S.transpose(-1, -2) if state_v_first else S
        for t in range(start, start + length):
            qt, kt, vt = q[bi, t, heads], k[bi, t, heads], v[bi, t]
            S = torch.exp(a[bi, t])[:, :, None] * S
            pred = torch.einsum("hkv,hk->hv", S, kt)
            S = S + b[bi, t][:, None, None] * kt[:, :, None] * (vt - pred)[:, None, :]
            rows[(bi, t)] = scale * torch.einsum("hkv,hk->hv", S, qt)
        finals.append(S.transpose(-1, -2) if state_v_first else S)
    zero = torch.zeros(HV, V, dtype=f64)
    o = torch.stack([torch.stack([rows.get((bi, t), zero) for t in range(T)]) for bi in range(B)])
    final = torch.stack(finals) if output_final_state and finals else None
    return o, final


def leaves(args, kw):
    """fp64 copies (requires_grad) of every input that takes part in the call: q, k, v, g, beta,
    and A_log, dt_bias (with the fused gate), initial_state (when given). Returns (args, kw,
    names, tensors): the call on the copies, and the copies by name."""
    args = [x.detach().double().requires_grad_() for x in args]
    kw = dict(kw)
    names = ["q", "k", "v", "g", "beta"]
    tensors = list(args)
    for name in ("A_log", "dt_bias", "initial_state"):
        if kw.get(name) is not None and (name == "initial_state" or kw["use_gate_in_kernel"]):
            kw[name] = kw[name].detach().double().requires_grad_()
            names.append(name)
            tensors.append(kw[name])
    return args, kw, names, tensors


def gradients(fn, args, kw, tensors, do, dht):
    """d/d tensors of sum(o * do) + sum(final_state * dht) for (o, final_state) = fn(*args, **kw)."""
    o, ht = fn(*args, **kw)
    return torch.autograd.grad((o, ht), tensors, (do, dht))


FORWARD_CALLS = {
    "safe": Call(),
    "safe_no_A_log_2d_dt_bias": Call(gate="safe_no_A", flat_dt_bias=False),
    "softplus_bf16": Call(gate="softplus", dtype="bfloat16", state="bf16"),
    "none_kfirst": Call(gate="none", v_first=False),
    "safe_gva_varlen_empty": Call(gate="safe", H=2, HV=6, lens=(0, 17, 1, 0, 40, 16), state="bf16"),
    "softplus_gva_kfirst_varlen": Call(gate="softplus", H=1, HV=4, lens=(33, 0, 64), v_first=False),
    "none_varlen_no_state": Call(gate="none", lens=(5, 0, 70), state=None),
    "safe_no_l2norm_beta_activated": Call(l2norm=False, beta_sigmoid=False),
    "softplus_neg_eigval": Call(gate="softplus", neg_eigval=True, T=50),
    "safe_chunk_1": Call(chunk_size=1, T=9),
    "safe_chunk_64_long": Call(chunk_size=64, T=150, B=1, H=1, HV=2),
    "softplus_chunk_5_extreme": Call(gate="softplus", chunk_size=5, decay="extreme", T=30),
    "none_extreme": Call(gate="none", decay="extreme", T=40),
    "kimi_dims": Call(gate="softplus", B=1, T=40, H=1, HV=2, K=128, V=128, dtype="bfloat16", chunk_size=16),
}


@pytest.mark.parametrize("name", list(FORWARD_CALLS))
def test_forward_equals_the_cpp_reference(name):
    args, kw = draw(FORWARD_CALLS[name], seed=11)
    o, ht = flash_kda.autograd_reference(*args, **kw)
    ref_o, ref_ht = reference(args, kw)
    assert o.dtype == ht.dtype == torch.float64
    assert o.shape == args[2].shape and ht.shape == ref_ht.shape
    assert rel(o, ref_o) <= FWD_TOL and rel(ht, ref_ht) <= FWD_TOL, (rel(o, ref_o), rel(ht, ref_ht))


GRAD_CALLS = {
    "safe_varlen_empty": Call(gate="safe", lens=(0, 9, 1, 0, 13), chunk_size=4),
    "safe_no_A_log_fixed": Call(gate="safe_no_A", B=2, T=10, chunk_size=4),
    "softplus_gva_kfirst": Call(gate="softplus", H=1, HV=3, T=11, B=1, v_first=False, state="bf16", chunk_size=4),
    "none_no_state_chunk_3": Call(gate="none", T=12, B=2, state=None, chunk_size=3),
    "safe_no_l2norm_beta_activated": Call(l2norm=False, beta_sigmoid=False, T=9, chunk_size=4),
    "softplus_neg_eigval_chunk_64": Call(gate="softplus", neg_eigval=True, T=14, B=1, chunk_size=64),
    # Extremes: -50 nats a token (pre-computed), softplus with A_log = log 16 (tens of nats).
    "none_minus_50_a_token": Call(gate="none", decay="extreme", T=20, B=1, chunk_size=8),
    "softplus_A_log_16": Call(gate="softplus", decay="extreme", T=20, B=1, chunk_size=16),
    "safe_extreme_varlen": Call(gate="safe", decay="extreme", lens=(7, 0, 12), chunk_size=8),
}


@pytest.mark.parametrize("name", list(GRAD_CALLS))
def test_gradients_equal_the_token_loop(name):
    c = GRAD_CALLS[name]
    args, kw = draw(dataclasses.replace(c, K=6, V=5), seed=5)
    args, kw, names, tensors = leaves(args, kw)
    gen = torch.Generator().manual_seed(6)
    o, ht = flash_kda.autograd_reference(*args, **kw)
    do = torch.randn(o.shape, generator=gen, dtype=torch.float64)
    dht = torch.randn(ht.shape, generator=gen, dtype=torch.float64)
    ours = torch.autograd.grad((o, ht), tensors, (do, dht))
    ref_o, ref_ht = token_loop(*args, **kw)
    assert rel(o, ref_o) <= FWD_TOL and rel(ht, ref_ht) <= FWD_TOL
    ref = torch.autograd.grad((ref_o, ref_ht), tensors, (do, dht))
    for n, x, r in zip(names, ours, ref):
        assert torch.isfinite(x).all(), n
        assert float(r.abs().max()) > 0, n  # every input takes part: a zero gradient would test nothing
        assert rel(x, r) <= GRAD_TOL, (n, rel(x, r))
    if c.decay == "extreme":  # the draw is what the name says
        a = log_decay(args, kw)
        if c.gate == "none":
            assert float(a.max()) <= -30.0
        elif c.gate == "softplus":
            assert float(a.median()) < -10.0 and float(a.min()) < -100.0
        else:  # the safe gate saturated at its floor
            assert float(a.min()) < -4.99 and float((a < -4.9).double().mean()) > 0.5


def log_decay(args, kw):
    """The call's per-token log decay a [B, T, HV, K] (the gate of the fused-gate calls)."""
    g = args[3].detach().double()
    if not kw["use_gate_in_kernel"]:
        return g
    x = g + kw["dt_bias"].detach().double().reshape(g.shape[2], g.shape[3])
    rate = torch.exp(kw["A_log"].detach().double())[:, None] if kw.get("A_log") is not None else 1.0
    if kw.get("lower_bound") is not None:
        return kw["lower_bound"] * torch.sigmoid(rate * x)
    return -rate * torch.nn.functional.softplus(x)


def test_extreme_decays_stay_finite_where_the_factorised_form_overflows():
    """At -50 nats a token, a 64-token chunk's exp(-G_i) is exp(3200) (inf in fp64): the pairwise
    exponents keep every value and gradient finite, for the pre-computed gate and the softplus
    gate with A_log = log 16."""
    for gate in ("none", "softplus"):
        c = Call(gate=gate, decay="extreme", B=1, T=130, H=1, HV=2, K=8, V=4, chunk_size=64)
        args, kw = draw(c, seed=3)
        args, kw, names, tensors = leaves(args, kw)
        G = args[3].detach().cumsum(1) if gate == "none" else None
        if G is not None:
            assert float(torch.exp(-G[:, :64]).max()) == math.inf  # what exp(G_i) exp(-G_j) would need
        o, ht = flash_kda.autograd_reference(*args, **kw)
        grads = torch.autograd.grad((o, ht), tensors, (torch.ones_like(o), torch.ones_like(ht)))
        assert torch.isfinite(o).all() and torch.isfinite(ht).all(), gate
        for n, x in zip(names, grads):
            assert torch.isfinite(x).all(), (gate, n)
        ref_o, ref_ht = reference([x.detach().float() for x in args],
                                  {**kw, **{n: kw[n].detach().float() for n in ("A_log", "dt_bias", "initial_state")
                                            if n in kw}})
        # fp32 copies of the fp64 leaves are exact: the draws were fp32.
        assert rel(o, ref_o) <= FWD_TOL and rel(ht, ref_ht) <= FWD_TOL, gate


def test_the_chunk_length_changes_nothing_but_rounding():
    c = Call(gate="softplus", lens=(0, 23, 5, 40), H=1, HV=2, K=6, V=5)
    args, kw = draw(c, seed=9)
    args, kw, _, tensors = leaves(args, kw)
    results = []
    for C in (1, 3, 16, 64):
        o, ht = flash_kda.autograd_reference(*args, **{**kw, "chunk_size": C})
        grads = torch.autograd.grad((o, ht), tensors, (torch.ones_like(o), torch.ones_like(ht)))
        results.append((o, ht, *grads))
    for other in results[1:]:
        for x, r in zip(other, results[0]):
            assert rel(x, r) <= 1e-12


@pytest.mark.parametrize("gate", ["softplus", "safe"])
def test_gradcheck(gate):
    if gate == "softplus":  # varlen with an empty sequence, GVA, v-first state, a chunk boundary inside
        c = Call(gate="softplus", lens=(3, 0, 2), H=1, HV=2, K=3, V=2, chunk_size=2)
    else:  # fixed length, k-first, allow_neg_eigval
        c = Call(gate="safe", B=2, T=3, H=1, HV=1, K=3, V=2, chunk_size=2, v_first=False, neg_eigval=True)
    args, kw = draw(c, seed=1)
    args, kw, names, tensors = leaves(args, kw)
    assert len(tensors) == 8

    def fn(*xs):
        named = dict(zip(names, xs))
        return flash_kda.autograd_reference(*xs[:5], **{**kw, **{n: named[n] for n in names[5:]}})

    assert torch.autograd.gradcheck(fn, tuple(tensors), eps=1e-6, atol=1e-8, rtol=1e-6)


def test_rows_of_no_sequence_under_use_graph():
    """fla's graph mode: cu_seqlens padded with zero-length tail sequences, the last token rows
    in no sequence: their output is 0 and no gradient reaches their inputs."""
    c = Call(gate="safe", lens=(5, 7), K=4, V=3)
    args, kw = draw(c, seed=2)
    pad = 3
    args = [torch.cat([x, torch.randn(1, pad, *x.shape[2:]).to(x.dtype)], 1) for x in args]
    kw["cu_seqlens"] = torch.tensor([0, 5, 12, 12, 12])
    kw["initial_state"] = torch.cat([kw["initial_state"], torch.randn(2, *kw["initial_state"].shape[1:])])
    args, kw, names, tensors = leaves(args, kw)
    o, ht = flash_kda.autograd_reference(*args, **kw, use_graph=True, max_num_seqs=4)
    assert float(o.detach()[:, 12:].abs().max()) == 0.0
    grads = dict(zip(names, torch.autograd.grad((o, ht), tensors, (torch.ones_like(o), torch.ones_like(ht)))))
    for n in ("q", "k", "v", "g", "beta"):
        assert float(grads[n][:, 12:].abs().max()) == 0.0 and float(grads[n][:, :12].abs().max()) > 0, n
    assert torch.equal(ht[2:], kw["initial_state"][2:].detach())  # empty sequences pass their state through
    assert torch.equal(grads["initial_state"][2:], torch.ones_like(grads["initial_state"][2:]))


def test_no_final_state_and_no_grad():
    args, kw = draw(Call(), seed=4)
    o, ht = flash_kda.autograd_reference(*args, **{**kw, "output_final_state": False})
    assert ht is None and not o.requires_grad
    with torch.no_grad():
        o2, _ = flash_kda.autograd_reference(*[x.requires_grad_() for x in args], **kw)
    assert torch.equal(o, o2)


def test_transpose_state_layout_is_state_v_first():
    args, kw = draw(Call(v_first=True), seed=8)
    o, ht = flash_kda.autograd_reference(*args, **kw)
    kw = {**kw, "state_v_first": False}
    with pytest.warns(DeprecationWarning):
        o2, ht2 = flash_kda.autograd_reference(*args, **kw, transpose_state_layout=True)
    assert torch.equal(o, o2) and torch.equal(ht, ht2)


@pytest.mark.parametrize("change,argument", [
    (dict(allow_neg_eigval=True, use_beta_sigmoid_in_kernel=False), "allow_neg_eigval"),
    (dict(lower_bound=None, A_log=None), "A_log"),
    (dict(lower_bound=None), "lower_bound"),        # safe_gate=True with the fused gate
    (dict(bogus=1), "bogus"),
    (dict(chunk_size=0), "chunk_size"),
    (dict(return_intermediate_states=True), "return_intermediate_states"),
    (dict(cp_context=object()), "cp_context"),
    (dict(output_final_state=1), "output_final_state"),
    (dict(cu_seqlens=torch.tensor([0, 21, 42])), "cu_seqlens"),  # B = 2
    (dict(initial_state=torch.zeros(2, 2, 8, 4)), "initial_state"),  # k-first shape, v-first asked
    (dict(dt_bias=torch.zeros(3)), "dt_bias"),
    (dict(A_log=torch.zeros(3)), "A_log"),
    (dict(lower_bound=float("nan")), "lower_bound"),
    (dict(transpose_state_layout=True), "transpose_state_layout"),  # with state_v_first=True
])
def test_errors_name_the_argument(change, argument):
    args, kw = draw(Call(), seed=0)
    kw = {k: v for k, v in {**kw, **change}.items() if v is not None}
    with pytest.raises(flash_kda.Error) as err:
        flash_kda.autograd_reference(*args, **kw)
    assert err.value.argument == argument


@pytest.mark.parametrize("which,argument", [("v", "v"), ("g", "g"), ("beta", "beta"), ("k", "k")])
def test_shape_errors_name_the_tensor(which, argument):
    args, kw = draw(Call(), seed=0)
    args = list(args)
    i = "qkvgb".index(which[0]) if which != "beta" else 4
    args[i] = args[i][:, :-1]
    with pytest.raises(flash_kda.Error) as err:
        flash_kda.autograd_reference(*args, **kw)
    assert err.value.argument == argument


def test_varlen_cu_seqlens_values_are_checked():
    args, kw = draw(Call(lens=(3, 4)), seed=0)
    for bad in ([0, 5, 4], [1, 3, 7], [0, 3, 6]):
        with pytest.raises(flash_kda.Error) as err:
            flash_kda.autograd_reference(*args, **{**kw, "cu_seqlens": torch.tensor(bad)})
        assert err.value.argument == "cu_seqlens"


def test_package_imports_without_torch_and_the_call_says_why():
    code = ("import sys; sys.modules['torch'] = None; import flash_kda\n"
            "try:\n    flash_kda.autograd_reference(None, None, None, None, None)\n"
            "except ImportError as e:\n    print('ImportError', e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ImportError") and "PyTorch" in done.stdout


def test_checkpointing_bounds_what_the_backward_keeps():
    """What autograd keeps outside the per-chunk checkpoints: the fp64 inputs and their chunked
    copies, and one state per chunk, never a chunk's C x C x K pairwise decays (C = 64, K = 32:
    16x an input chunk's size)."""
    c = Call(gate="softplus", B=1, T=256, H=1, HV=2, K=32, V=32, chunk_size=64, state="fp32")
    args, kw = draw(c, seed=0)
    args, kw, _, tensors = leaves(args, kw)
    kept = []

    def pack(t):
        kept.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        flash_kda.autograd_reference(*args, **kw)
    inputs = sum(x.numel() * 8 for x in tensors)
    pairwise = c.T * c.chunk_size * c.K * c.HV * 8  # one C x C x K tensor per chunk, all chunks
    assert sum(kept) < 20 * inputs < pairwise * 2, (sum(kept), inputs, pairwise)
