"""Per-kernel device time of one call (`--kernels`): which of a call's kernels an A/B moves.

The benchmark's times are a call's, end to end; when two builds differ, this says in which
kernel. torch.profiler (CUDA activity only) records `calls` eager calls after `warmup` untimed
ones; every device event (kernel, memset, memcpy) is summed by its shortened name and divided
by `calls`: the mean device microseconds that kernel takes per call. Off by default: the
profiler's setup adds about a second a case, and its per-kernel times are not the call's time
(launch gaps and overlap are not in them).
"""

from __future__ import annotations

from typing import Callable, Iterable

#: Namespaces dropped from a kernel's name in the tables (the full name stays in the JSON key
#: only as far as kernel_label leaves it: the template arguments that say which variant ran).
_DROPPED = ("(anonymous namespace)::", "flash_kda::sm90::", "flash_kda::")


def kernel_label(name: str) -> str:
    """A kernel's demangled name without its return type, parameter list and flash_kda's
    namespaces, whitespace collapsed: "void flash_kda::sm90::(anonymous namespace)::k<A, 8>(P)"
    -> "k<A, 8>". The template arguments stay: they name the variant. A name that is not a
    C++ signature (e.g. "Memset (Device)") is returned stripped."""
    s = " ".join(name.split())
    if s.startswith("void "):
        s = s[5:]
    if s.endswith(")"):
        depth = 0
        for i in range(len(s) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(s[i], 0)
            if depth == 0:
                head = s[:i].rstrip()
                # A parameter list follows a qualified or templated name; "(Device)" after a
                # plain word (Memset, Memcpy) is part of the name.
                if "::" in head or "<" in head:
                    s = head
                break
    for ns in _DROPPED:
        s = s.replace(ns, "")
    return s


def aggregate(events: Iterable[tuple[str, float]], calls: int) -> dict[str, float]:
    """{kernel_label(name): total microseconds / calls} of (name, device microseconds) pairs,
    in the order each label first appears. Raises ValueError for calls < 1."""
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    out: dict[str, float] = {}
    for name, us in events:
        label = kernel_label(name)
        out[label] = out.get(label, 0.0) + float(us)
    return {k: v / calls for k, v in out.items()}


def device_events(prof) -> list[tuple[str, float]]:
    """(name, microseconds) of every device-side event of a finished torch.profiler.profile."""
    from torch.autograd import DeviceType

    return [(e.name, e.time_range.elapsed_us()) for e in prof.events() if e.device_type == DeviceType.CUDA]


def kernel_times_us(fn: Callable[[], object], calls: int = 20, warmup: int = 3) -> dict[str, float]:
    """Mean device microseconds per call of each kernel fn launches (aggregate of
    device_events), over `calls` eager calls profiled after `warmup` untimed ones. Raises
    ValueError for calls < 1, and whatever fn or the profiler raises."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return aggregate(device_events(prof), calls)
