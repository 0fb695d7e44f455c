"""The collection order under pytest-xdist (_ordering.py, conftest.py), on the CPU."""
import pytest

from _ordering import deal_heavy_first, part_sizes


def test_part_sizes_are_worksteals_first_distribution():
    assert part_sizes(1141, 10) == [114] * 9 + [115]
    assert part_sizes(5, 3) == [1, 2, 2]
    assert sum(part_sizes(97, 7)) == 97


def test_heavy_items_start_every_part_dealt_from_the_last():
    n, workers = 1141, 10
    heavy = lambda x: 7 <= x < 51  # noqa: E731 (44 items, as the backward grid)
    out = deal_heavy_first(list(range(n)), heavy, workers)
    assert sorted(out) == list(range(n))
    starts = []
    pos = 0
    for size in part_sizes(n, workers):
        part = out[pos:pos + size]
        pos += size
        k = sum(map(heavy, part))
        assert k in (4, 5) and all(map(heavy, part[:k]))  # the part's heavy items come first
        starts.append(part[0])
    assert starts == list(range(50, 40, -1))  # the last 10 heavy items open the 10 parts
    light = [x for x in out if not heavy(x)]
    assert light == [x for x in range(n) if not heavy(x)]


@pytest.mark.parametrize("n", [0, 1, 2, 7, 30])
@pytest.mark.parametrize("workers", [1, 2, 3, 8])
def test_every_item_stays_once_and_light_ones_keep_their_order(n, workers):
    for m in range(n + 1):
        heavy = lambda x: x >= n - m  # noqa: E731
        out = deal_heavy_first(list(range(n)), heavy, workers)
        assert sorted(out) == list(range(n))
        assert [x for x in out if not heavy(x)] == [x for x in range(n) if not heavy(x)]
        if workers == 1:
            assert out == list(range(n))


def test_the_session_marks_the_gradient_grid_heavy(request):
    grid = [it for it in request.session.items if it.get_closest_marker("heavy") is not None]
    names = {it.name.split("[")[0] for it in grid}
    assert names <= {"test_backward_vs_yardstick_and_fla"}
    if not grid:
        pytest.skip("the backward grid is not in this selection")
    assert len(grid) == 44
