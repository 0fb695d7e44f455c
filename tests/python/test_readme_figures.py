"""The figures the README and docs/testing.md show come from one generated place each: the
README's benchmark table equals BENCHMARK_H200.json (written by `python -m flash_kda.bench
--write-record`) cell for cell, and the accuracy ratio against fla is stated only in
docs/accuracy-h200.md (written by the GPU run), which the others link to."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
RECORD = ROOT / "BENCHMARK_H200.json"


def _ms(v):
    """The bench report's millisecond format (python/flash_kda/bench/report.py)."""
    return "-" if v is None else (f"{v:.4f}" if v < 0.1 else f"{v:.3f}")


def _readme_table() -> dict[str, list[str]]:
    rows = {}
    for line in README.read_text().splitlines():
        if line.startswith("| ") and not line.startswith("| case") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


@pytest.mark.skipif(not RECORD.exists(), reason="no BENCHMARK_H200.json in this checkout")
def test_readme_benchmark_table_is_the_record():
    record = json.loads(RECORD.read_text())
    table = _readme_table()
    # The README's table is FlashKDA's configuration (the safe gate); the record's other cases
    # (the softplus gate) are in BENCHMARK_H200.md only.
    cases = [c for c in record["cases"] if c["case"].get("gate", "safe") == "safe"]
    assert len(cases) == 13
    assert {c["case"].get("gate", "safe") for c in record["cases"]} == {"safe", "softplus"}
    for c in cases:
        t = c["times"]
        expected = [_ms(t["flash_kda"]["eager"]["median"]), _ms(t["flash_kda"]["graph"]["median"]),
                    _ms(t["fla"]["eager"]["median"]), _ms(t["fla"]["graph"]["median"]),
                    _ms(c["anchor"]["flash_kda_ms"]), _ms(c["floor_ms"])]
        assert table.get(c["case"]["name"]) == expected, c["case"]["name"]
    geo = lambda xs: math.exp(sum(math.log(x) for x in xs) / len(xs))  # noqa: E731
    means = [_ms(geo([c["times"]["flash_kda"]["eager"]["median"] for c in cases])), "",
             _ms(geo([c["times"]["fla"]["eager"]["median"] for c in cases])), "",
             _ms(geo([c["anchor"]["flash_kda_ms"] for c in cases])), ""]
    assert table.get("geometric mean (eager)") == means


def test_readme_labels_the_columns():
    header = next(line for line in README.read_text().splitlines() if line.startswith("| case"))
    assert "fla ms (same run)" in header
    assert "FlashKDA ms (anchor" in header


@pytest.mark.parametrize("doc", ["README.md", "docs/testing.md", "docs/errors.md", "docs/benchmark.md"])
def test_accuracy_ratio_only_in_the_generated_table(doc):
    text = (ROOT / doc).read_text()
    ratios = re.findall(r"\d\.\d\d\s*-\s*\d\.\d\dx", text)
    assert not ratios, f"{doc} states the accuracy ratio {ratios}; link docs/accuracy-h200.md instead"
    if doc in ("README.md", "docs/testing.md"):
        assert "accuracy-h200.md" in text
