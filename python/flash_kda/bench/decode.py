"""`python -m flash_kda.bench --decode`: the decode step over a state pool, flash_kda against
fla's fused_recurrent_kda_fwd (Triton), per (sequences N, heads H, tokens T, pool dtype).

Each point: N sequences of T tokens (T = 1 decode, T > 1 speculative verification) over a pool
in a random slot order: T = 1 gives [N] ssm_state_indices into N slots; T > 1 gives [N, T]
indices into N * T slots (the state after every draft token kept, as serving stacks verify a
draft), the start from idx[n, 0]. H = HV heads, K = V = 128, bf16 inputs,
FlashKDA's configuration (safe gate with lower bound -5, q/k L2 norm and the beta sigmoid
fused), v-first states unless --decode-layouts asks for k-first ones (fla's default layout),
the pool updated in place. Both implementations are timed eager and
CUDA-graph captured in the same run, each on its own copy of the pool; fla runs with
FLA_FLASH_KDA_DECODE=0 so that it does not dispatch back to flash_kda. The check compares the
first call of each against the fp64 reference (flash_kda.reference_decode) on a sample of
sequences. The case list and the floor are pure Python (tested on CPU).
"""

from __future__ import annotations

import functools

import math
from dataclasses import asdict, dataclass

from . import check as check_mod
from . import impls

#: The sweep of the issue: sequences, heads, tokens per sequence, pool dtypes.
NUM_SEQS = (1, 8, 32, 128, 256, 512, 1024)
HEADS = (4, 8, 32, 96)
TOKENS = (1, 2, 4)
STATES = ("fp32", "bf16")
#: State layouts of the sweep (state_v_first True / False) and the default list.
LAYOUTS = ("v_first", "k_first")
DEFAULT_LAYOUTS = ("v_first",)
#: Bytes per element of each pool dtype.
STATE_BYTES = {"fp32": 4, "bf16": 2}
#: Sequences of each point checked against the fp64 reference (all when N is smaller).
DEFAULT_SAMPLE = 8
#: fla reads this variable at every dispatch (flash_kda/_fla.py registers the backend with it).
FLA_ENV = "FLA_FLASH_KDA_DECODE"
#: Calls captured back to back in each timed CUDA graph (timing.time_graph): a decode call is
#: microseconds of device work, less than one graph launch's own latency, so one call per graph
#: would time the launch; the table's graph time is the time per call inside a captured step.
GRAPH_CALLS = 20

#: Eager calls whose wall-clock time gives a point's host time per call (host_us): well below
#: the launch queue's depth, so that the host never waits on the GPU.
HOST_CALLS = 200
#: Safe-gate floor of every point.
LOWER_BOUND = -5.0
HEAD_DIM = 128


@dataclass(frozen=True)
class DecodeCase:
    """One decode point: num_seqs sequences of T tokens, H = HV heads, a pool of `state`
    dtype with pool_slots slots in `layout` ("v_first": [P, HV, V, K]; "k_first": [P, HV, K, V])."""

    num_seqs: int
    heads: int
    T: int
    state: str = "fp32"
    head_dim_k: int = HEAD_DIM
    head_dim_v: int = HEAD_DIM
    layout: str = "v_first"

    @property
    def pool_slots(self) -> int:
        """P: N for T = 1 ([N] indices), N * T for T > 1 ([N, T] indices)."""
        return self.num_seqs * self.T

    @property
    def name(self) -> str:
        """n<N>_h<H>_t<T>_<state>, with _kfirst for k-first pools (v-first names carry no suffix)."""
        suffix = "" if self.layout == "v_first" else "_kfirst"
        return f"n{self.num_seqs}_h{self.heads}_t{self.T}_{self.state}{suffix}"

    def to_dict(self) -> dict:
        """JSON-ready description (with the name)."""
        d = asdict(self)
        d["name"] = self.name
        d["pool_slots"] = self.pool_slots
        d["indices"] = "[N]" if self.T == 1 else "[N, T]"
        return d


def decode_cases(num_seqs=NUM_SEQS, heads=HEADS, tokens=TOKENS, states=STATES,
                 layouts=DEFAULT_LAYOUTS) -> list[DecodeCase]:
    """Every combination, layouts outermost, then states, heads, tokens and sequences (so that
    a partial run has whole tables of one layout and pool dtype first). Raises ValueError on an
    unknown state dtype or layout or a value out of range (T in 1..16, N and H >= 1)."""
    for s in states:
        if s not in STATE_BYTES:
            raise ValueError(f"unknown pool dtype {s!r}; known: {', '.join(STATE_BYTES)}")
    for lay in layouts:
        if lay not in LAYOUTS:
            raise ValueError(f"unknown state layout {lay!r}; known: {', '.join(LAYOUTS)}")
    for what, values, low, high in (("--decode-seqs", num_seqs, 1, None), ("--decode-heads", heads, 1, None),
                                    ("--decode-tokens", tokens, 1, 16)):
        for v in values:
            if v < low or (high is not None and v > high):
                raise ValueError(f"{what} entry {v} out of range (>= {low}" + (f", <= {high})" if high else ")"))
    return [DecodeCase(n, h, t, s, layout=lay) for lay in layouts for s in states for h in heads for t in tokens
            for n in num_seqs]


def floor_bytes(case: DecodeCase) -> int:
    """Fewest bytes one decode call moves through HBM: each sequence's state read once and
    written once per kept state (T = 1: once; T > 1: after each of the T tokens, [N, T]
    indices), HV * K * V elements each at the pool dtype; q, k, v, g, beta read and out
    written (bf16, N * T tokens); A_log and dt_bias (fp32) and the int32 slot indices read."""
    n, h, t, k, v = case.num_seqs, case.heads, case.T, case.head_dim_k, case.head_dim_v
    bf16, fp32, idx = 2, 4, 4
    states = (1 + t) * n * h * k * v * STATE_BYTES[case.state]
    tokens = n * t * h * (k + k + v + k + v + 1) * bf16  # q, k, v, g, out, beta
    params = h * fp32 + h * k * fp32 + n * t * idx
    return states + tokens + params


def floor_ms(case: DecodeCase, copy_bandwidth: float) -> float:
    """floor_bytes / copy bandwidth (bytes/s, read + write), in milliseconds."""
    return floor_bytes(case) / copy_bandwidth * 1e3


def fla_dispatch_to_flash_kda(enabled: bool):
    """FLA_FLASH_KDA_DECODE set to "1"/"0" for the block, then restored."""
    return impls.env_switch(FLA_ENV, enabled)


def sample_indices(num_seqs: int, sample: int) -> list[int]:
    """Up to `sample` sequence indices spread over [0, num_seqs), first and last included."""
    if sample >= num_seqs:
        return list(range(num_seqs))
    if sample == 1:
        return [0]
    return sorted({round(i * (num_seqs - 1) / (sample - 1)) for i in range(sample)})


class Inputs:
    """Device tensors of one point; pool0 is the pool before any call (each implementation
    times on its own clone)."""

    def __init__(self, case: DecodeCase, seed: int, device: str = "cuda"):
        import torch

        gen = torch.Generator(device=device).manual_seed(seed)
        n, h, t, kd, vd = case.num_seqs, case.heads, case.T, case.head_dim_k, case.head_dim_v

        def randn(*shape, dtype=torch.bfloat16):
            return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

        self.q, self.k, self.v = randn(n, t, h, kd), randn(n, t, h, kd), randn(n, t, h, vd)
        self.g, self.beta = randn(n, t, h, kd), randn(n, t, h)
        self.A_log = torch.rand(h, generator=gen, device=device)
        self.dt_bias = torch.rand(h, kd, generator=gen, device=device)
        dtype = torch.float32 if case.state == "fp32" else torch.bfloat16
        self.v_first = case.layout == "v_first"
        self.pool0 = randn(case.pool_slots, h, *((vd, kd) if self.v_first else (kd, vd)), dtype=dtype)
        order = torch.randperm(case.pool_slots, generator=gen, device=device).to(torch.int32)
        self.indices = order if t == 1 else order.view(n, t)
        self.scale = kd ** -0.5

    def kwargs(self, pool, out) -> dict:
        """fused_recurrent_kda_fwd's keywords for this point on `pool`, writing `out`."""
        return dict(q=self.q, k=self.k, v=self.v, g=self.g, beta=self.beta, A_log=self.A_log,
                    dt_bias=self.dt_bias, initial_state=pool, scale=self.scale, inplace_final_state=True,
                    state_v_first=self.v_first, ssm_state_indices=self.indices, use_qk_l2norm_in_kernel=True,
                    use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, lower_bound=LOWER_BOUND, out=out)


#: --decode-kernel's names (flash_kda.DecodeLaunchOptions.kernel) and the default list.
KERNELS = ("auto", "persistent", "direct", "direct_columns", "direct_rows")
DEFAULT_KERNELS = ("auto",)


def kernel_label(kernel: str) -> str:
    """The implementation label of a decode kernel: "flash_kda" for the plan's choice (auto),
    else "flash_kda_<kernel>"."""
    return "flash_kda" if kernel == "auto" else f"flash_kda_{kernel}"


def parse_kernels(text: str) -> list[str]:
    """"auto,direct" -> ["auto", "direct"] (names of KERNELS, each once, in the given order);
    ValueError naming the bad entry."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError(f"--decode-kernel wants a comma list of {', '.join(KERNELS)}; got {text!r}")
    for n in names:
        if n not in KERNELS:
            raise ValueError(f"--decode-kernel: unknown kernel {n!r} (want {', '.join(KERNELS)})")
    if len(set(names)) != len(names):
        raise ValueError(f"--decode-kernel: a kernel is listed twice in {text!r}")
    return names


def flash_kda_call(x: Inputs, kernel: str = "auto"):
    """(call, out, pool): call() runs flash_kda.fused_recurrent_kda_fwd with `kernel` forced
    (DecodeLaunchOptions; "auto": no options) on its own pool."""
    import torch
    import flash_kda

    pool, out = x.pool0.clone(), torch.full_like(x.v, float("nan"))
    kw = x.kwargs(pool, out)
    if kernel != "auto":
        kw["launch_options"] = flash_kda.DecodeLaunchOptions(kernel=kernel)

    def call() -> None:
        flash_kda.fused_recurrent_kda_fwd(**kw)

    return call, out, pool


def fla_call(x: Inputs):
    """(call, out, pool): call() runs fla's fused_recurrent_kda_fwd (Triton, dispatch to
    flash_kda off) on its own pool."""
    import torch
    from fla.ops.kda.fused_recurrent import fused_recurrent_kda_fwd

    pool, out = x.pool0.clone(), torch.full_like(x.v, float("nan"))
    kw = x.kwargs(pool, out)

    def call() -> None:
        with fla_dispatch_to_flash_kda(False):
            fused_recurrent_kda_fwd(**kw)

    return call, out, pool


def count_flash_kda_decode_calls():
    """Count calls of flash_kda.fused_recurrent_kda_fwd in the block (fla's backend looks it
    up at call time), to prove that fla's timed path is its own."""
    import flash_kda

    return impls.count_calls(flash_kda, "fused_recurrent_kda_fwd")


def reference_sample(x: Inputs, seqs: list[int]):
    """fp64 reference of the sampled sequences on their own slots: (out [S, T, H, V], the
    slots after the call [S (* T), H, V, K] (v-first) or [S (* T), H, K, V], sel, slots),
    float64 torch tensors on the inputs' device; slots are the pool rows those sequences own,
    in the order of the returned states."""
    import torch
    import flash_kda

    sel = torch.tensor(seqs, dtype=torch.int64, device=x.q.device)
    own = x.indices.to(torch.int64)[sel]  # [S] or [S, T]
    slots = own.reshape(-1)
    local = torch.arange(slots.numel(), dtype=torch.int64).view(own.shape)
    out, state = flash_kda.reference_decode(
        x.q[sel], x.k[sel], x.v[sel], x.g[sel], x.beta[sel], A_log=x.A_log, dt_bias=x.dt_bias,
        initial_state=x.pool0[slots], scale=x.scale, state_v_first=x.v_first, ssm_state_indices=local,
        use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
        lower_bound=LOWER_BOUND)
    dev = x.q.device
    return torch.from_numpy(out).to(dev, torch.float64), torch.from_numpy(state).to(dev), sel, slots


def errors_of(out, pool, ref_out, ref_state, sel, slots) -> tuple[float, float]:
    """(out error, state error): relative Frobenius errors of the sampled sequences' rows of
    out and slots of the pool against the reference."""
    return check_mod.rel_err(out[sel], ref_out), check_mod.rel_err(pool[slots], ref_state)


def verdict(c: dict) -> bool:
    """Ours finite and <= check.REF_BOUND on out and state, and, where fla ran, at most
    check.FLA_RATIO_BOUND times fla's error (as the forward's check)."""
    for what in ("out", "state"):
        ours = c.get(f"{what}_err")
        if ours is None:
            continue
        if not math.isfinite(ours) or ours > check_mod.REF_BOUND:
            return False
        fla = c.get(f"fla_{what}_err")
        if fla is not None and math.isfinite(fla) and ours > check_mod.FLA_RATIO_BOUND * fla:
            return False
    return True


def run_point(case: DecodeCase, args, copy_bw: float, use_fla: bool, timed) -> dict:
    """Check and time one point; returns its JSON entry (see report.decode_rows): "times"
    (eager and CUDA-graph event timings per implementation: one per --decode-kernel kernel,
    kernel_label's names, and fla) and "host_us" (host microseconds per eager call,
    timing.host_us_per_call over HOST_CALLS calls, per implementation). The check's out_err /
    state_err are the first kernel's; with several kernels check["kernels"] holds each one's
    errors and verdict, and "passed" needs them all."""
    import torch

    from . import timing

    kernels = list(getattr(args, "decode_kernels", None) or DEFAULT_KERNELS)
    x = Inputs(case, args.seed)
    result: dict = {"case": case.to_dict(), "floor_bytes": floor_bytes(case), "floor_ms": floor_ms(case, copy_bw),
                    "times": {}, "host_us": {}, "errors": {}, "check": None}
    ours = {}  # label -> (call or None, out, pool)
    for kernel in kernels:
        ours[kernel_label(kernel)] = flash_kda_call(x, kernel)
    fla, fla_out, fla_pool = fla_call(x) if use_fla else (None, None, None)
    with torch.inference_mode():
        chk: dict = {"sampled_seqs": 0, "bound": check_mod.REF_BOUND, "fla_ratio_bound": check_mod.FLA_RATIO_BOUND}
        for label, (fn, out, pool) in list(ours.items()):
            try:
                fn()
                torch.cuda.synchronize()
            except Exception as e:
                result["errors"]["check" if label == kernel_label(kernels[0]) else f"{label} check"] = \
                    f"{type(e).__name__}: {e}"
                ours[label] = (None, out, pool)
        if fla is not None:
            try:
                with count_flash_kda_decode_calls() as calls:
                    fla()
                torch.cuda.synchronize()
                if calls[0]:
                    raise RuntimeError(f"fla dispatched to flash_kda although {FLA_ENV}=0; not timed")
            except Exception as e:
                result["errors"]["fla check"] = f"{type(e).__name__}: {e}"
                fla = None
        runnable = [(label, out, pool) for label, (fn, out, pool) in ours.items() if fn is not None]
        if runnable and not args.no_check:
            try:
                seqs = sample_indices(case.num_seqs, args.check_seqs)
                ref_out, ref_state, sel, slots = reference_sample(x, seqs)
                chk["sampled_seqs"] = len(seqs)
                if fla is not None:
                    chk["fla_out_err"], chk["fla_state_err"] = errors_of(fla_out, fla_pool, ref_out, ref_state,
                                                                         sel, slots)
                per = {}
                for label, out, pool in runnable:
                    o_err, s_err = errors_of(out, pool, ref_out, ref_state, sel, slots)
                    one = {"out_err": o_err, "state_err": s_err}
                    for key in ("fla_out_err", "fla_state_err"):
                        if key in chk:
                            one[key] = chk[key]
                    one["passed"] = verdict(one)
                    per[label] = {k: one[k] for k in ("out_err", "state_err", "passed")}
                first = per[runnable[0][0]]
                chk["out_err"], chk["state_err"] = first["out_err"], first["state_err"]
                if len(kernels) > 1:
                    chk["kernels"] = per
                chk["passed"] = all(v["passed"] for v in per.values()) and len(runnable) == len(ours)
                result["check"] = chk
            except Exception as e:
                result["errors"]["check"] = f"{type(e).__name__}: {e}"
        timed_fns = [(label, fn) for label, (fn, _, _) in ours.items()] + [("fla", fla)]
        for label, fn in timed_fns:
            if fn is None:
                continue
            result["times"][label], errs = timed(label, fn, args)
            result["errors"].update(errs)
            try:
                result["host_us"][label] = timing.host_us_per_call(fn, HOST_CALLS)
            except Exception as e:
                result["errors"][f"{label} host"] = f"{type(e).__name__}: {e}"
    del x, ours, fla_out, fla_pool
    torch.cuda.empty_cache()
    return result


def run_decode_suite(args, meta: dict, on_point=None) -> dict:
    """The whole --decode sweep: copy bandwidth, then every point of args.decode_cases.

    Returns {"meta", "copy_bandwidth", "settings", "planned_decode", "cases": [], "decode":
    [run_point results]}; on_point(results) after each point, when given.
    """
    import torch

    from . import suite, timing

    use_fla = not args.no_fla and meta.get("fla") not in (None, "not installed")
    suite.progress("measuring device-to-device copy bandwidth")
    copy_bw = timing.copy_bandwidth()
    suite.progress(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s (read + write)")
    torch.manual_seed(args.seed)
    results = {"meta": meta, "copy_bandwidth": copy_bw,
               "settings": {"iters": args.iters, "warmup": args.warmup, "seed": args.seed, "fla": use_fla,
                            "check_seqs": args.check_seqs, "graph_calls": GRAPH_CALLS,
                            "kernels": list(getattr(args, "decode_kernels", None) or DEFAULT_KERNELS)},
               "planned_decode": len(args.decode_cases), "cases": [], "decode": []}
    for i, case in enumerate(args.decode_cases, 1):
        suite.progress(f"[{i}/{len(args.decode_cases)}] decode {case.name}")
        r = run_point(case, args, copy_bw, use_fla, functools.partial(suite._timed, graph_calls=GRAPH_CALLS))
        for k, msg in r["errors"].items():
            suite.progress(f"{case.name}: {k} failed: {msg}")
        results["decode"].append(r)
        if on_point is not None:
            on_point(results)
    return results


def point_failed(r: dict) -> bool:
    """A point fails when its check failed or errored, or flash_kda's own timing raised."""
    if r.get("check") is not None and not r["check"].get("passed", False):
        return True
    return any(what == "check" or what.startswith("flash_kda") for what in r.get("errors", {}))
