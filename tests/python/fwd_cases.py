"""Input makers and error measures shared by the GPU forward tests (tests/python/test_fwd_*.py)
and scripts/sanitize.py.

Everything here follows docs/kda-spec.md: q, k, v, g, beta are bf16 [B, T, H, 128] (beta
[B, T, H]); varlen batches are B = 1 with int64 cu_seqlens [N+1]; states are v-first
[N, H, V, K]. Accuracy is the relative Frobenius error against flash_kda.reference (fp64 on the
CPU). Importing this module needs numpy only; torch, flash_kda and fla are imported on use, so
test modules can be collected (and skipped) on a machine without them.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import zlib
from typing import Optional, Sequence

import numpy as np

HEAD_DIM = 128  # K = V = 128: the only head size the sm_90 kernel supports


@functools.lru_cache(maxsize=None)
def sm90_skip_reason() -> Optional[str]:
    """Why the GPU forward cannot run here, or None when it can (for scripts/sanitize.py;
    the tests use conftest.py's `cuda_sm90` marker, which asks the same questions).

    It needs torch with a visible CUDA device of compute capability 9.0 (Hopper) and a
    flash_kda build with its CUDA kernels.
    """
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device is visible to torch"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return f"needs an sm_90 (Hopper) GPU, found compute capability {major}.{minor}"
    try:
        import flash_kda
    except ImportError as err:
        return f"flash_kda is not importable: {err}"
    if not flash_kda.cuda_available():
        return "flash_kda was built without its CUDA kernels (FLASH_KDA_CUDA=OFF)"
    return None


@functools.lru_cache(maxsize=None)
def base_seed() -> int:
    """Seed of this test run: $FLASH_KDA_TEST_SEED when set (to reproduce a failure), else
    fresh from the OS, so every run draws new inputs. Failure messages print it."""
    env = os.environ.get("FLASH_KDA_TEST_SEED")
    return int(env) if env else int.from_bytes(os.urandom(4), "little")


@dataclasses.dataclass(frozen=True)
class Case:
    """One forward problem, described by its sizes and the laws its random inputs follow.

    seqlen/batch give a fixed-length batch [batch, seqlen, heads, 128]; seq_lens (when not
    None) gives a varlen batch [1, sum(seq_lens), heads, 128] with those sequence lengths
    (zeros allowed). state: None (no initial_state, no final_state), "bf16" or "fp32" (the
    dtype of both); with_initial=False keeps final_state but starts from the zero state.
    Gate parameters: A_log = log(U(*decay_range)), dt_bias ~ U(*dt_bias_range) per channel,
    or, with dt_bias_signs, exactly +-dt_bias_range[1] with random signs; g ~ N(0, g_std^2).
    """

    name: str
    heads: int
    seqlen: int = 0
    batch: int = 1
    seq_lens: Optional[tuple] = None
    state: Optional[str] = None
    with_initial: bool = True
    lower_bound: float = -5.0
    decay_range: tuple = (1.0, 16.0)
    dt_bias_range: tuple = (-1.0, 1.0)
    dt_bias_signs: bool = False
    g_std: float = 1.0
    cu_dtype: str = "int64"
    value_heads: int = 0          # HV (GVA: a multiple of heads); 0 means HV = heads
    gate_dtype: str = "bf16"      # dtype of g and beta: "bf16" or "fp32"

    @property
    def hv(self) -> int:
        return self.value_heads or self.heads

    @property
    def varlen(self) -> bool:
        return self.seq_lens is not None

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens) if self.varlen else self.batch

    @property
    def total_tokens(self) -> int:
        return sum(self.seq_lens) if self.varlen else self.batch * self.seqlen

    def seed(self) -> int:
        """Per-case seed derived from the run seed, so cases differ but a run replays."""
        return (base_seed() ^ zlib.crc32(self.name.encode())) & 0x7FFFFFFF


@dataclasses.dataclass
class Inputs:
    """Device tensors of one forward call (see Case), plus host copies of the sequence starts."""

    case: Case
    q: "object"
    k: "object"
    v: "object"
    g: "object"
    beta: "object"
    A_log: "object"
    dt_bias: "object"
    scale: float
    lower_bound: float
    cu_seqlens: "object"            # int64/int32 [N+1] on the device, or None
    initial_state: "object"         # [N, H, V, K] bf16/fp32, or None
    starts: list                    # host list of N+1 token offsets into the flattened token axis

    @property
    def state_dtype(self):
        import torch
        return {None: None, "bf16": torch.bfloat16, "fp32": torch.float32}[self.case.state]


def make_inputs(case: Case, device: str = "cuda", seed: Optional[int] = None) -> Inputs:
    """Draws fresh random inputs for `case` on `device` (never zeros: normal and uniform draws).

    q, k, v ~ N(0, 1), g ~ N(0, g_std^2) (raw gate), beta ~ N(0, 1) (logits), initial_state
    ~ N(0, 1), all bf16 except A_log, dt_bias (fp32), fp32 states and, with gate_dtype="fp32",
    g and beta. q and k have case.heads heads, everything else case.hv (GVA). Deterministic in
    `seed` (default case.seed()) on a given device.
    """
    import torch

    # Drawn on `device` itself: a 1M-token x 96-head input must not pass through host memory.
    gen = torch.Generator(device=device).manual_seed(case.seed() if seed is None else seed)
    H, HV, D = case.heads, case.hv, HEAD_DIM
    gate_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[case.gate_dtype]
    if case.varlen:
        lead = (1, case.total_tokens)
        starts = [0]
        for n in case.seq_lens:
            starts.append(starts[-1] + int(n))
        cu_dtype = {"int64": torch.int64, "int32": torch.int32}[case.cu_dtype]
        cu_seqlens = torch.tensor(starts, dtype=cu_dtype, device=device)
    else:
        lead = (case.batch, case.seqlen)
        starts = [n * case.seqlen for n in range(case.batch + 1)]
        cu_seqlens = None

    def randn(shape, std=1.0, dtype=torch.bfloat16):
        t = torch.randn(shape, generator=gen, dtype=dtype, device=device)
        return t.mul_(std) if std != 1.0 else t

    def uniform(shape, lo, hi):
        return torch.rand(shape, generator=gen, dtype=torch.float64, device=device) * (hi - lo) + lo

    q = randn((*lead, H, D))
    k = randn((*lead, H, D))
    v = randn((*lead, HV, D))
    g = randn((*lead, HV, D), std=case.g_std, dtype=gate_dtype)
    beta = randn((*lead, HV), dtype=gate_dtype)
    A_log = torch.log(uniform((HV,), *case.decay_range)).to(device=device, dtype=torch.float32)
    if case.dt_bias_signs:
        signs = torch.randint(0, 2, (HV, D), generator=gen, device=device).to(torch.float64) * 2 - 1
        dt_bias = signs * case.dt_bias_range[1]
    else:
        dt_bias = uniform((HV, D), *case.dt_bias_range)
    dt_bias = dt_bias.to(device=device, dtype=torch.float32)
    initial_state = None
    if case.state is not None and case.with_initial:
        sdtype = torch.bfloat16 if case.state == "bf16" else torch.float32
        initial_state = randn((case.num_seqs, HV, D, D), dtype=sdtype)
    return Inputs(case=case, q=q, k=k, v=v, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias,
                  scale=D ** -0.5, lower_bound=case.lower_bound, cu_seqlens=cu_seqlens,
                  initial_state=initial_state, starts=starts)


def new_outputs(x: Inputs, fill: float = float("nan")):
    """(out, final_state) buffers for `x`, filled with `fill` (NaN by default) so a test can
    tell whether every element was written. final_state is None when the case has no state."""
    import torch

    out = torch.full_like(x.v, fill)
    final_state = None
    if x.case.state is not None:
        final_state = torch.full((x.case.num_seqs, x.case.hv, HEAD_DIM, HEAD_DIM), fill,
                                 dtype=x.state_dtype, device=x.v.device)
    return out, final_state


def call_fwd(x: Inputs, out, final_state, initial_state="same", launch_options=None) -> None:
    """flash_kda.fwd on `x`, writing `out` and `final_state` in place. initial_state="same"
    passes x.initial_state; anything else is passed as given (in-place state tests).
    launch_options: a flash_kda.LaunchOptions forcing launch paths, or None."""
    import flash_kda

    init = x.initial_state if isinstance(initial_state, str) and initial_state == "same" else initial_state
    flash_kda.fwd(x.q, x.k, x.v, x.g, x.beta, x.scale, out, x.A_log, x.dt_bias, x.lower_bound,
                  initial_state=init, final_state=final_state, cu_seqlens=x.cu_seqlens,
                  launch_options=launch_options)


def run_fwd(x: Inputs, launch_options=None):
    """Allocates NaN-poisoned outputs, runs flash_kda.fwd and returns (out, final_state)."""
    out, final_state = new_outputs(x)
    call_fwd(x, out, final_state, launch_options=launch_options)
    return out, final_state


@dataclasses.dataclass(frozen=True)
class Sample:
    """Which part of a problem to compare: value heads and sequences (None = all).

    Heads are independent and so are sequences, so the reference evaluated on the sliced
    inputs equals the slice of the reference on the whole problem; that keeps the fp64 CPU
    cost of H = 96 or 1M-token cases small. Head slices need HV = H (no GVA)."""

    heads: Optional[tuple] = None
    seqs: Optional[tuple] = None


def _token_slice(x: Inputs, t, sample: Sample):
    """Slice of a token-major tensor t [B, T, H, ...] (or [B, T, H]) for `sample`."""
    import torch

    if sample.heads is not None:
        t = t[:, :, torch.tensor(sample.heads, device=t.device)]
    if sample.seqs is None:
        return t
    if not x.case.varlen:
        return t[torch.tensor(sample.seqs, device=t.device)]
    parts = [t[:, x.starts[n]:x.starts[n + 1]] for n in sample.seqs]
    return torch.cat(parts, dim=1)


def _state_slice(s, sample: Sample):
    """Slice of a state tensor s [N, H, V, K] for `sample`."""
    import torch

    if s is None:
        return None
    if sample.seqs is not None:
        s = s[torch.tensor(sample.seqs, device=s.device)]
    if sample.heads is not None:
        s = s[:, torch.tensor(sample.heads, device=s.device)]
    return s


def sliced_outputs(x: Inputs, out, final_state, sample: Sample = Sample()):
    """(out, final_state) of a device run cut to `sample`, as float64 numpy arrays."""
    o = to_f64(_token_slice(x, out, sample))
    s = None if final_state is None else to_f64(_state_slice(final_state, sample))
    return o, s


def reference(x: Inputs, sample: Sample = Sample(), num_threads: int = 0):
    """fp64 CPU reference (flash_kda.reference) on the part of `x` chosen by `sample`.

    Returns (out [.., len(heads), V], final_state [n, len(heads), V, K] or None) as float64
    numpy arrays, in the same layout as sliced_outputs()."""
    import torch
    import flash_kda

    def host(t):
        return None if t is None else t.detach().to("cpu").contiguous()

    heads = None if sample.heads is None else torch.tensor(sample.heads, device=x.A_log.device)
    A_log = x.A_log if heads is None else x.A_log[heads]
    dt_bias = x.dt_bias if heads is None else x.dt_bias[heads]
    cu = None
    if x.case.varlen:
        seqs = range(x.case.num_seqs) if sample.seqs is None else sample.seqs
        lens = [x.starts[n + 1] - x.starts[n] for n in seqs]
        cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]).astype(np.int64))
    out, final_state = flash_kda.reference(
        host(_token_slice(x, x.q, sample)), host(_token_slice(x, x.k, sample)),
        host(_token_slice(x, x.v, sample)), host(_token_slice(x, x.g, sample)),
        host(_token_slice(x, x.beta, sample)),
        scale=x.scale, A_log=host(A_log), dt_bias=host(dt_bias), lower_bound=x.lower_bound,
        gate="safe", use_qk_l2norm=True, use_beta_sigmoid=True,
        initial_state=host(_state_slice(x.initial_state, sample)), cu_seqlens=cu,
        state_layout="v_first", output_final_state=x.case.state is not None,
        num_threads=num_threads)
    out = np.asarray(out, dtype=np.float64)
    final_state = None if final_state is None or x.case.state is None else np.asarray(final_state, dtype=np.float64)
    return out, final_state


def reference_errors(x: Inputs, out, final_state, sample: Sample = Sample()) -> tuple:
    """(out error, final_state error or None) of a finished device run against the fp64
    reference on `sample`, as relative Frobenius errors, after a synchronisation."""
    import torch

    torch.cuda.synchronize()
    ref_o, ref_s = reference(x, sample)
    o, s = sliced_outputs(x, out, final_state, sample)
    return rel_err(o, ref_o), (None if s is None else rel_err(s, ref_s))


def check_against_reference(x: Inputs, out, final_state, sample: Sample = Sample(), bound: float = 1e-2) -> None:
    """Asserts that out (and final_state, when not None) of a finished device run match the fp64
    reference on `sample` within `bound` (relative Frobenius error); the failure message names
    the case and the run's seed."""
    where = f"{x.case.name} (seed {base_seed()})"
    err_o, err_s = reference_errors(x, out, final_state, sample)
    assert err_o <= bound, f"{where}: out rel. error {err_o:.3e} > {bound}"
    if err_s is not None:
        assert err_s <= bound, f"{where}: final_state rel. error {err_s:.3e} > {bound}"


def to_f64(t) -> np.ndarray:
    """A torch tensor (any device, bf16/fp32) as a float64 numpy array."""
    import torch

    return t.detach().to("cpu", dtype=torch.float64).numpy()


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """||got - ref||_F / ||ref||_F (plain ||got - ref||_F when ref is exactly zero)."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, f"shape {got.shape} != reference shape {ref.shape}"
    den = float(np.linalg.norm(ref))
    num = float(np.linalg.norm(got - ref))
    return num / den if den > 0 else num


def all_finite(t, rows: int = 1 << 14) -> bool:
    """True when every element of the device tensor t is finite; walks dim 1 (tokens) in
    blocks so a 25 GB tensor needs no 25 GB temporary."""
    import torch

    if t.dim() < 2:
        return bool(torch.isfinite(t).all())
    for i in range(0, t.shape[1], rows):
        if not bool(torch.isfinite(t[:, i:i + rows]).all()):
            return False
    return True


@functools.lru_cache(maxsize=None)
def fla_skip_reason() -> Optional[str]:
    """Why fla's chunk_kda cannot be run here, or None."""
    try:
        import fla.ops.kda  # noqa: F401
    except Exception as err:  # ImportError, or a Triton/einops import failure inside fla
        return f"fla.ops.kda is not importable: {err!r}"
    return None


FLA_CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fla_configs.json")


@functools.lru_cache(maxsize=None)
def pin_fla_configs() -> int:
    """Pins fla's autotuned Triton kernels named in fla_configs.json to that one configuration
    (scripts/pin_fla_configs.py says where they come from); returns how many were pinned.

    fla autotunes ~100 configurations for every new head count and flag combination, which
    made the GPU suite outlast a 10-minute device call; a one-configuration Autotuner skips
    tuning (triton.runtime.autotuner.Autotuner.run). fla's numerics do not depend on its tile
    configuration, so the comparison is unchanged. FLASH_KDA_TEST_FLA_AUTOTUNE=1 keeps fla's
    own autotuning. Call after importing fla.ops.kda (its kernels are module attributes)."""
    import json

    if os.environ.get("FLASH_KDA_TEST_FLA_AUTOTUNE") == "1" or not os.path.exists(FLA_CONFIGS):
        return 0
    with open(FLA_CONFIGS) as f:
        configs = json.load(f)["kernels"]
    return pin_fla_kernels(configs)


def pin_fla_kernels(configs: dict, only_autotuning: bool = False) -> int:
    """Pins each of fla's autotuned Triton kernels named in `configs` (kernel name -> {"kwargs",
    "num_warps", "num_stages", optional "num_ctas", "maxnreg"}, fla_configs.json's form) to that
    one configuration; with only_autotuning, only those that still have more than one (a pin
    from fla_configs.json stays). Returns how many were pinned. Call after importing fla.ops.kda."""
    import sys

    import triton
    from triton.runtime.autotuner import Autotuner

    def autotuner(obj):  # @triton.heuristics wraps many of fla's autotuners: follow .fn
        for _ in range(4):
            if isinstance(obj, Autotuner):
                return obj
            obj = getattr(obj, "fn", None)
        return None

    pinned = set()
    for name, module in list(sys.modules.items()):
        if not name.startswith("fla.") or module is None:  # fla.ops.* and fla.modules.* (l2norm)
            continue
        for obj in list(vars(module).values()):
            tuner = autotuner(obj)
            if tuner is None or id(tuner) in pinned or tuner.base_fn.__name__ not in configs:
                continue
            if only_autotuning and len(tuner.configs) <= 1:
                continue
            c = configs[tuner.base_fn.__name__]
            tuner.configs = [triton.Config(c["kwargs"], num_warps=c["num_warps"], num_stages=c["num_stages"],
                                           num_ctas=c.get("num_ctas", 1), maxnreg=c.get("maxnreg"))]
            pinned.add(id(tuner))
    return len(pinned)


@contextlib.contextmanager
def fla_triton_only():
    """Inside: fla's chunk_kda takes its own Triton path (its FlashKDA backend off,
    FLA_FLASH_KDA=0), and on leaving, an assertion that no call reached flash_kda.chunk_kda: a
    comparison with ourselves would make the bounds relative to fla vacuous."""
    from flash_kda.bench.impls import count_flash_kda_calls, fla_flash_kda_backend

    with count_flash_kda_calls() as calls, fla_flash_kda_backend(False):
        yield
    assert not calls[0], "fla dispatched to flash_kda although its backend was off: no Triton reference"


def run_fla(x: Inputs):
    """fla chunk_kda, Triton path, on the same inputs and gate as flash_kda.fwd.

    FLA_FLASH_KDA=0 turns off fla's FlashKDA backend (which would otherwise dispatch to a
    package named flash_kda under no_grad), so this measures fla's own kernels. fla's
    Triton path takes fp32 initial states only; a bf16 initial state is widened exactly.
    Returns (out bf16 [.., H, V], final_state fp32 [N, H, V, K] or None) on the device."""
    import torch
    from fla.ops.kda import chunk_kda

    pin_fla_configs()
    init = x.initial_state
    if init is not None:
        init = init.float()
    with fla_triton_only(), torch.no_grad():
        out, final_state = chunk_kda(
            x.q, x.k, x.v, x.g, x.beta, scale=x.scale, initial_state=init,
            output_final_state=x.case.state is not None,
            use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
            safe_gate=True, lower_bound=x.lower_bound, state_v_first=True,
            cu_seqlens=None if x.cu_seqlens is None else x.cu_seqlens.long(),
            A_log=x.A_log, dt_bias=x.dt_bias)
    if final_state is not None and x.case.state == "bf16":
        # fla always returns fp32; ours is stored in the caller's bf16, so compare like with like.
        final_state = final_state.to(torch.bfloat16)
    return out, final_state


def spread_heads(H: int, n: int) -> Optional[tuple]:
    """n value heads spread over 0..H-1 (first and last included), or None (all) if H <= n."""
    if H <= n:
        return None
    return tuple(sorted({round(i * (H - 1) / (n - 1)) for i in range(n)}))


def random_lengths(rng: np.random.Generator, count: int, lo: int, hi: int,
                   force: Sequence[int] = ()) -> tuple:
    """count sequence lengths ~ U{lo..hi}, with the values in `force` placed at random positions."""
    lens = rng.integers(lo, hi + 1, size=count)
    pos = rng.choice(count, size=len(force), replace=False)
    lens[pos] = list(force)
    return tuple(int(n) for n in lens)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)

