"""The collection order's spreading of heavy items (_ordering.py, conftest.py), on the CPU."""
import pytest

from _ordering import spread_evenly


def test_heavy_items_land_at_even_intervals_in_their_order():
    items = list(range(20))
    out = spread_evenly(items, lambda x: 5 <= x < 9)
    assert [i for i, x in enumerate(out) if 5 <= x < 9] == [2, 7, 12, 17]
    assert [x for x in out if 5 <= x < 9] == [5, 6, 7, 8]
    assert [x for x in out if not 5 <= x < 9] == [0, 1, 2, 3, 4] + list(range(9, 20))


@pytest.mark.parametrize("n", [0, 1, 2, 7, 30])
def test_every_item_stays_once_and_each_kind_keeps_its_order(n):
    for m in range(n + 1):
        heavy = lambda x: x >= n - m  # noqa: E731
        out = spread_evenly(list(range(n)), heavy)
        assert sorted(out) == list(range(n))
        assert [x for x in out if heavy(x)] == [x for x in range(n) if heavy(x)]
        assert [x for x in out if not heavy(x)] == [x for x in range(n) if not heavy(x)]


def test_the_gradient_grid_is_spread_through_the_session(request):
    items = request.session.items
    grid = [i for i, it in enumerate(items) if it.get_closest_marker("heavy") is not None]
    if len(grid) < 2 or len(items) < 4 * len(grid):
        pytest.skip("run with the whole suite: this selection holds too few items to spread the grid")
    gaps = [b - a for a, b in zip(grid, grid[1:])]
    assert min(gaps) >= len(items) // len(grid) - 1
