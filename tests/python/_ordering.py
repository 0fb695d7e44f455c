"""The collection order the test session runs in (conftest.py's pytest_collection_modifyitems).

pytest-xdist's `--dist worksteal` (scripts/gpu-check.sh) first hands each worker an equal
contiguous part of the collected items, and a worker that runs out steals half of what the
busiest has left. The backward's gradient grid (44 items of seconds to minutes each, marked
`heavy`) sits together in file order, so one worker's part held all of it and the run's time
limit cut the grid's last points (three of them in two GPU runs). Spread evenly through the
order, the heavy items start on every worker from the beginning.
"""
from __future__ import annotations

from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


def spread_evenly(items: Sequence[T], heavy: Callable[[T], bool]) -> list[T]:
    """items with those for which heavy(item) is true spread evenly through the order: the
    j-th of m heavy items lands at about position (j + 1/2) n / m of the n; the others keep
    their order in the gaps, and so do the heavy ones among themselves."""
    hv = [x for x in items if heavy(x)]
    light = [x for x in items if not heavy(x)]
    n, m = len(items), len(hv)
    if m == 0 or not light:
        return list(items)
    out: list[T] = []
    j = 0
    for pos in range(n):
        if j < m and (len(out) - j >= len(light) or pos >= int((j + 0.5) * n / m)):
            out.append(hv[j])
            j += 1
        else:
            out.append(light[pos - j])
    return out
