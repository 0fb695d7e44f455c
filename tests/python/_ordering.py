"""The collection order the test session runs in (conftest.py's pytest_collection_modifyitems).

pytest-xdist's `--dist worksteal` (scripts/gpu-check.sh) first hands each of its W workers a
contiguous part of the collected items (part k: the next (n - items already handed out) //
(W - k) of them), and a worker that runs out steals the tail of the longest queue left. The
backward's gradient grid (44 items of seconds to minutes each, marked `heavy`) sits together in
file order, inside one worker's part, which then runs them one after another and leaves the
grid's last points to a time limit. So the heavy items are dealt round-robin to the W parts and
put at the start of each: every worker starts on some of them. They are dealt from the last:
the grid's last points are its flag variants (GVA, k-first, beta given, ...), each a new family
of fla's Triton backward to compile (minutes), which so go to different workers first.
"""
from __future__ import annotations

from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


def part_sizes(n: int, workers: int) -> list[int]:
    """The sizes of the contiguous parts worksteal's first distribution hands `workers` idle
    workers out of n items."""
    sizes, left = [], n
    for k in range(workers):
        sizes.append(left // (workers - k))
        left -= sizes[-1]
    return sizes


def deal_heavy_first(items: Sequence[T], heavy: Callable[[T], bool], workers: int) -> list[T]:
    """items reordered for `workers` xdist workers: the heavy ones (heavy(item) true) dealt
    round-robin from the last to the parts of part_sizes, at the start of each, the others in
    their order after them. One worker (or none heavy): the order unchanged."""
    hv = [x for x in items if heavy(x)]
    if workers <= 1 or not hv:
        return list(items)
    light = [x for x in items if not heavy(x)]
    dealt: list[list[T]] = [[] for _ in range(workers)]
    for j, x in enumerate(reversed(hv)):
        dealt[j % workers].append(x)
    out: list[T] = []
    for part, size in zip(dealt, part_sizes(len(items), workers)):
        take = max(size - len(part), 0)
        out += part + light[:take]
        light = light[take:]
    return out + light
