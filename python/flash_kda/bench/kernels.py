"""Per-kernel device time of one call (`--kernels`): which of a call's kernels an A/B moves.

The benchmark's times are a call's, end to end; when two builds differ, this says in which
kernel. torch.profiler (CUDA activity only) records `calls` eager calls after `warmup` untimed
ones; every device event (kernel, memset, memcpy) is summed by its shortened name and divided
by `calls`: the mean device microseconds that kernel takes per call. Off by default: the
profiler's setup adds about a second a case, and its per-kernel times are not the call's time
(launch gaps and overlap are not in them).
"""

from __future__ import annotations

import re
from typing import Callable, Iterable

#: flash_kda's namespaces, dropped from a kernel's name in the tables where they begin a
#: qualified name (the template arguments, which say which variant ran, stay).
_NAMESPACES = re.compile(r"(?<![\w:])(?:flash_kda::sm90::|flash_kda::|\(anonymous namespace\)::)+")


def short_kernel_name(name: str) -> str:
    """A kernel's demangled name without its return type, parameter list and flash_kda's
    namespaces, whitespace collapsed: "void flash_kda::sm90::(anonymous namespace)::k<A, 8>(P)"
    -> "k<A, 8>". The template arguments stay: they name the variant. The runtime's copy and
    fill events (names starting "Memcpy" or "Memset", e.g. "Memset (Device)") keep their
    names."""
    s = " ".join(name.split())
    if s.startswith(("Memcpy", "Memset")):
        return s
    if s.startswith("void "):
        s = s[5:]
    if s.endswith(")"):
        depth = 0
        for i in range(len(s) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(s[i], 0)
            if depth == 0:
                s = s[:i].rstrip() or s
                break
    return _NAMESPACES.sub("", s)


def aggregate(events: Iterable[tuple[str, float]], calls: int) -> dict[str, float]:
    """{short_kernel_name(name): total microseconds / calls} of (name, device microseconds) pairs,
    in the order each label first appears. Raises ValueError for calls < 1."""
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    out: dict[str, float] = {}
    for name, us in events:
        label = short_kernel_name(name)
        out[label] = out.get(label, 0.0) + float(us)
    return {k: v / calls for k, v in out.items()}


def device_events(prof) -> list[tuple[str, float]]:
    """(name, microseconds) of every device-side event of a finished torch.profiler.profile."""
    from torch.autograd import DeviceType

    return [(e.name, e.time_range.elapsed_us()) for e in prof.events() if e.device_type == DeviceType.CUDA]


def kernel_times_us(fn: Callable[[], object], calls: int = 20, warmup: int = 3) -> dict[str, float]:
    """Mean device microseconds per call of each kernel fn launches (aggregate of
    device_events), over `calls` eager calls profiled after `warmup` untimed ones. Raises
    ValueError for calls < 1, RuntimeError when the profiler recorded no device event (CUPTI
    unavailable, or held by another profiler such as nsys), and whatever fn or the profiler
    raises."""
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
    events = device_events(prof)
    if not events:
        raise RuntimeError("torch.profiler recorded no device event (is CUPTI available, and not held by another "
                           "profiler?)")
    return aggregate(events, calls)
