"""grid_report.py on the CPU: cell formatting, the merge of the pytest-xdist workers' row files,
the rendered table and what a GridReport writes into $FLASH_KDA_REPORT_DIR."""
from __future__ import annotations

import json

import pytest

from grid_report import GridReport, fmt_err, merge_rows, render, worker


def test_fmt_err():
    assert fmt_err(None) == "-"
    assert fmt_err("fla raised ValueError") == "fla raised ValueError"
    assert fmt_err(1.23456e-3) == "1.23e-03"
    assert fmt_err(float("nan")) == "nan"


def test_worker(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert worker() == "main"
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    assert worker() == "gw3"


def test_merge_rows_unions_the_workers_files(tmp_path):
    a, b, broken = tmp_path / "x-rows-gw0.json", tmp_path / "x-rows-gw1.json", tmp_path / "x-rows-gw2.json"
    a.write_text(json.dumps({"p1": ["p1", "1"], "p2": ["p2", "old"]}))
    b.write_text(json.dumps({"p2": ["p2", "new"], "p3": ["p3", "3"]}))
    broken.write_text("{not json")
    rows = merge_rows({"p0": ["p0", "0"]}, [str(a), str(b), str(broken), str(tmp_path / "missing.json")])
    assert rows == {"p0": ["p0", "0"], "p1": ["p1", "1"], "p2": ["p2", "new"], "p3": ["p3", "3"]}


def test_render_follows_the_grid_order_and_leaves_out_missing_rows():
    text = render("Title.", ("case", "err"), {"b": ["b", "2"], "a": ["a", "1"]}, ["a", "missing", "b"])
    assert text == "Title.\n\n| case | err |\n|---|---|\n| a | 1 |\n| b | 2 |\n"


def test_keep_checks_the_row_width():
    report = GridReport("x", ("a", "b"))
    with pytest.raises(ValueError, match="1 cells"):
        report.keep("p", ["only one"])


def test_report_without_a_report_dir(monkeypatch):
    monkeypatch.delenv("FLASH_KDA_REPORT_DIR", raising=False)
    report = GridReport("x", ("case", "err"))
    assert report.write("T", ["p"]) is None  # no row kept: nothing to write
    report.keep("p", ["p", 1e-3])
    assert report.write("T", ["p"]) == "T\n\n| case | err |\n|---|---|\n| p | 0.001 |\n"


def test_two_workers_write_the_whole_table(tmp_path, monkeypatch):
    """Each worker keeps its own row file; whichever finishes last writes every worker's rows."""
    monkeypatch.setenv("FLASH_KDA_REPORT_DIR", str(tmp_path / "report"))
    columns = ("case", "err")
    order = ["p1", "p2", "p3"]
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    first = GridReport("chunk-accuracy", columns)
    first.keep("p1", ["p1", "1"])
    first.keep("p3", ["p3", "3"])
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    second = GridReport("chunk-accuracy", columns)
    second.keep("p2", ["p2", "2"])
    other = GridReport("accuracy", columns)  # another grid's files in the same folder stay apart
    other.keep("q", ["q", "9"])
    text = second.write("T", order)
    assert text.splitlines()[-3:] == ["| p1 | 1 |", "| p2 | 2 |", "| p3 | 3 |"]
    files = sorted(p.name for p in (tmp_path / "report").iterdir())
    assert files == ["accuracy-rows-gw1.json", "chunk-accuracy-rows-gw0.json", "chunk-accuracy-rows-gw1.json",
                     "chunk-accuracy.md"]
    assert (tmp_path / "report" / "chunk-accuracy.md").read_text() == text
    assert other.write("A", ["q"]).splitlines()[-1] == "| q | 9 |"
    assert "| p1 |" not in (tmp_path / "report" / "accuracy.md").read_text()


def test_finish_prints_past_capture(capsys, monkeypatch):
    monkeypatch.delenv("FLASH_KDA_REPORT_DIR", raising=False)

    class Config:
        class pluginmanager:
            @staticmethod
            def getplugin(name):
                return None

    class Request:
        config = Config

    report = GridReport("x", ("case",))
    report.keep("p", ["p"])
    report.finish(Request, "T", ["p"])
    assert "| p |" in capsys.readouterr().out
