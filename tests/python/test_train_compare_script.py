"""scripts/train_compare.py's host-side pieces on CPU (the training runs themselves need an sm_90
GPU and fla's KimiDeltaAttention): it imports without fla or a GPU; the associative-recall
batches say what the task is (every query's target is the value paired with its key, the
context positions are ignored, the same seed gives the same batches); the moving average, the
learning-rate schedule, the tail mean of the accuracies, the spread verdict, the flags (the
defaults are a task the model learns within the run) and the chart."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "train_compare.py"


@pytest.fixture(scope="module")
def tc():
    spec = importlib.util.spec_from_file_location("train_compare", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_batches_are_associative_recall(tc):
    tokens, targets = tc.make_batch(torch.Generator().manual_seed(0), 8, pairs=10, queries=6, vocab=64)
    assert tokens.shape == targets.shape == (8, 26) and tokens.dtype == torch.int64
    assert bool((targets[:, :20] == tc.IGNORE).all())
    for b in range(8):
        keys, values = tokens[b, 0:20:2].tolist(), tokens[b, 1:20:2].tolist()
        assert len(set(keys)) == 10 and all(1 <= x < 32 for x in keys) and all(32 <= x < 64 for x in values)
        pair = dict(zip(keys, values))
        queries = tokens[b, 20:].tolist()
        assert len(set(queries)) == 6 and targets[b, 20:].tolist() == [pair[q] for q in queries]
    again = tc.make_batch(torch.Generator().manual_seed(0), 8, pairs=10, queries=6, vocab=64)
    assert torch.equal(again[0], tokens) and torch.equal(again[1], targets)
    default = tc.make_batch(torch.Generator().manual_seed(1), 2)
    assert default[0].shape == (2, 2 * tc.PAIRS + tc.QUERIES) and int(default[0].max()) < tc.VOCAB
    with pytest.raises(ValueError, match="pairs <= vocab / 2"):
        tc.make_batch(torch.Generator(), 1, pairs=32, queries=4, vocab=64)  # 31 keys (0 is the filler)


def test_filler_between_pairs_and_queries(tc):
    """With seq_len, FILLER tokens separate the pairs from the queries, so that recall crosses
    more chunks; the pairs and the answers are those of the same batch without filler."""
    plain = tc.make_batch(torch.Generator().manual_seed(3), 4, pairs=8, queries=8, vocab=128)
    tokens, targets = tc.make_batch(torch.Generator().manual_seed(3), 4, pairs=8, queries=8, vocab=128, seq_len=96)
    assert tokens.shape == targets.shape == (4, 96)
    assert torch.equal(tokens[:, :16], plain[0][:, :16]) and torch.equal(tokens[:, 88:], plain[0][:, 16:])
    assert bool((tokens[:, 16:88] == tc.FILLER).all()) and bool((tokens[:, :16] != tc.FILLER).all())
    assert bool((targets[:, :88] == tc.IGNORE).all()) and torch.equal(targets[:, 88:], plain[1][:, 16:])
    with pytest.raises(ValueError, match="seq_len"):
        tc.make_batch(torch.Generator(), 1, pairs=8, queries=8, vocab=128, seq_len=23)


def test_smooth_and_schedule(tc):
    assert tc.smooth([1.0, 3.0, 5.0, 7.0], window=2) == [1.0, 2.0, 4.0, 6.0]
    assert tc.lr_at(0, 100, 1e-3, 10) == pytest.approx(1e-4)
    assert tc.lr_at(9, 100, 1e-3, 10) == pytest.approx(1e-3)
    assert tc.lr_at(10, 100, 1e-3, 10) == pytest.approx(1e-3)
    assert tc.lr_at(100, 100, 1e-3, 10) == pytest.approx(1e-4)


def test_compare_is_within_the_spread_when_closer_than_another_seed(tc):
    ref = [3.0 - 0.01 * i for i in range(100)]
    close = [x + 0.01 for x in ref]
    other = [x + 0.05 for x in ref]
    v = tc.compare(ref, close, other, skip=10)
    assert v["within_spread"] and v["steps_compared"] == 90
    assert v["mean_abs_diff_flash_kda"] == pytest.approx(0.01) and v["mean_abs_diff_seed"] == pytest.approx(0.05)
    assert not tc.compare(ref, other, close, skip=10)["within_spread"]


def test_tail_mean(tc):
    assert tc.tail_mean([0.0] * 10 + [1.0] * tc.TAIL) == 1.0
    assert tc.tail_mean([0.2, 0.4], window=5) == pytest.approx(0.3)


def test_flags(tc):
    a = tc.parse_args([])
    assert (a.steps, a.layers, a.seed, a.spread_seed) == (300, 2, 0, 1)
    # The defaults are a task the model learns within the run (the module docstring says why).
    assert (a.pairs, a.queries, a.vocab, a.seq_len) == (tc.PAIRS, tc.QUERIES, tc.VOCAB, None) == (8, 8, 128, None)
    assert 2 * a.pairs + a.queries > 16  # the queries read the pairs across flash_kda's 16-token chunks
    assert (a.lr, a.warmup, a.batch) == (3e-3, 20, 64)
    assert 2 / a.vocab < a.min_accuracy == tc.MIN_ACCURACY < 1
    assert a.png == tc.REPO / "docs" / "train-compare.png"
    b = tc.parse_args(["--pairs", "16", "--queries", "12", "--vocab", "256", "--min-accuracy", "0.3"])
    assert (b.pairs, b.queries, b.vocab, b.min_accuracy) == (16, 12, 256, 0.3)
    with pytest.raises(SystemExit):
        tc.parse_args(["--pairs", "8", "--queries", "9"])
    with pytest.raises(SystemExit):
        tc.parse_args(["--pairs", "64", "--vocab", "128"])
    with pytest.raises(SystemExit):
        tc.parse_args(["--pairs", "40", "--queries", "20", "--seq-len", "96"])
    with pytest.raises(SystemExit):
        tc.parse_args(["--layers", "5"])
    with pytest.raises(SystemExit):
        tc.parse_args(["--steps", "20"])


def test_plot(tc, tmp_path):
    pytest.importorskip("matplotlib")
    runs = [{"label": name, "losses": [3.0 - 0.01 * i for i in range(50)]} for name in ("a", "b")]
    assert tc.plot(runs, tmp_path / "c.png") and (tmp_path / "c.png").stat().st_size > 1000
    for r in runs:
        r["accuracies"] = [0.02 * i for i in range(50)]
    assert tc.plot(runs, tmp_path / "d.png") and (tmp_path / "d.png").stat().st_size > 1000
