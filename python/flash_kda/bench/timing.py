"""GPU timing with CUDA events: eager calls, CUDA-graph replays, copy bandwidth.

Every timed call sits between its own pair of torch.cuda.Event records on the current
stream, so a host-bound call (many small launches) shows its launch gaps while a device-bound
call shows device time. No cache flush between calls, as in FlashKDA's and the anchors'
measurements. Results are lists of milliseconds summarised by `summarize`.
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import Callable


def summarize(times_ms: list[float]) -> dict:
    """{"median", "min", "max", "n"} of a list of milliseconds (median is what tables show)."""
    return {
        "median": statistics.median(times_ms),
        "min": min(times_ms),
        "max": max(times_ms),
        "n": len(times_ms),
    }


def _event_times(step: Callable[[], object], iters: int) -> list[float]:
    import torch

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for s, e in zip(starts, ends):
        s.record()
        step()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def time_eager(fn: Callable[[], object], warmup: int, iters: int) -> list[float]:
    """Milliseconds of `iters` eager calls of fn after `warmup` untimed ones."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return _event_times(fn, iters)


def time_graph(fn: Callable[[], object], warmup: int, iters: int, calls_per_graph: int = 1) -> list[float]:
    """Milliseconds per call of fn over `iters` replays of one torch.cuda.CUDAGraph holding
    `calls_per_graph` back-to-back calls of fn (each replay's time divided by that count).

    fn is first called `warmup` times on a side stream (autotuning and lazy allocations must
    happen outside capture, as torch.cuda.graphs requires), then captured. Output tensors fn
    writes are the captured ones, so a replay recomputes the same results. With one call per
    graph a replay's time includes the graph launch's own latency (~several us on an H200),
    which dominates microsecond-scale calls; several calls per graph measure the call as it
    runs inside a larger captured step (a serving stack's decode step), the launch latency
    spread over them.
    Raises whatever capture raises (e.g. a host synchronisation inside fn).
    """
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(max(warmup, 1)):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls_per_graph):
            fn()
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    times = _event_times(graph.replay, iters)
    del graph
    return [t / calls_per_graph for t in times]


def host_us_per_call(fn: Callable[[], object], calls: int, sync: Callable[[], object] | None = None,
                     clock: Callable[[], float] = time.perf_counter) -> float:
    """Host microseconds per eager call of fn: wall-clock time of `calls` back-to-back calls
    with no synchronisation between them (Python, binding and launch; the GPU runs behind),
    divided by `calls`. sync (default torch.cuda.synchronize) runs before the first call, so
    that earlier work does not hold the launch queue, and after the last, outside the timed
    span. `calls` must stay below the launch queue's depth (~1000), else a device-bound call
    shows its device time. Raises ValueError for calls < 1.
    """
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    if sync is None:
        import torch

        sync = torch.cuda.synchronize
    sync()
    start = clock()
    for _ in range(calls):
        fn()
    elapsed = clock() - start
    sync()
    return elapsed / calls * 1e6


def copy_bandwidth(nbytes: int = 1 << 30, warmup: int = 5, iters: int = 50) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting read + write (2 * nbytes per copy).

    Uses the median of `iters` event-timed tensor.copy_ calls of `nbytes` bytes (default
    1 GiB, far above the 50 MB L2 of an H200 so the copy streams through HBM).
    """
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    ms = statistics.median(time_eager(functools.partial(dst.copy_, src), warmup, iters))
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / (ms * 1e-3)
