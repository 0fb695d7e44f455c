"""The side-by-side tables of the GPU accuracy grids (test_fwd_accuracy.py, test_chunk_accuracy.py).

A grid module keeps one row per grid point in a GridReport. With $FLASH_KDA_REPORT_DIR set, every
row is also kept in <stem>-rows-<worker>.json there (one file per pytest-xdist worker, "main"
without xdist), and each worker's end of module merges all of them and writes <stem>.md, so the
last worker to finish writes the whole grid. The table also goes to the terminal at the end of
the module. Pure Python (no torch): tested on the CPU by test_grid_report.py.
"""
from __future__ import annotations

import glob
import json
import os
from typing import Iterable, Sequence

REPORT_DIR_ENV = "FLASH_KDA_REPORT_DIR"


def fmt_err(e) -> str:
    """An error for the table: "-" for None, a string as given, else 3 significant digits."""
    return "-" if e is None else (e if isinstance(e, str) else f"{e:.2e}")


def worker() -> str:
    """This pytest-xdist worker's id ("gw0", ...), or "main" without xdist."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def merge_rows(own: dict, paths: Iterable[str]) -> dict:
    """own's rows, updated with those of each row file in `paths` (later files win on a name;
    a file being replaced while it is read, or not JSON, is passed over)."""
    rows = dict(own)
    for path in paths:
        try:
            with open(path) as f:
                rows.update(json.load(f))
        except (OSError, ValueError):
            continue
    return rows


def render(title: str, columns: Sequence[str], rows: dict, order: Iterable[str]) -> str:
    """A markdown table: the title, a blank line, the header, then the row of each name in `order`
    that has one (names without a row are left out: points another run did not reach)."""
    lines = [title, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for name in order:
        row = rows.get(name)
        if row is not None:
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


class GridReport:
    """Rows of one grid's table, kept under `stem` (<stem>.md, <stem>-rows-<worker>.json)."""

    def __init__(self, stem: str, columns: Sequence[str]):
        self.stem = stem
        self.columns = tuple(columns)
        self.rows: dict = {}

    @staticmethod
    def report_dir() -> str | None:
        return os.environ.get(REPORT_DIR_ENV) or None

    def keep(self, name: str, row: Sequence[str]) -> None:
        """Records a row (one cell per column), and with a report dir also in this worker's row file."""
        if len(row) != len(self.columns):
            raise ValueError(f"row {name!r} has {len(row)} cells, the table {len(self.columns)} columns")
        self.rows[name] = [str(c) for c in row]
        report_dir = self.report_dir()
        if report_dir:
            os.makedirs(report_dir, exist_ok=True)
            path = os.path.join(report_dir, f"{self.stem}-rows-{worker()}.json")
            with open(path + ".tmp", "w") as f:
                json.dump(self.rows, f)
            os.replace(path + ".tmp", path)

    def table(self, title: str, order: Iterable[str]) -> str:
        """The whole table: this process's rows merged with every worker's row file."""
        report_dir = self.report_dir()
        paths = sorted(glob.glob(os.path.join(report_dir, f"{self.stem}-rows-*.json"))) if report_dir else []
        return render(title, self.columns, merge_rows(self.rows, paths), order)

    def write(self, title: str, order: Iterable[str]) -> str | None:
        """Writes <stem>.md into the report dir (atomically: workers may finish together) and
        returns the table; None when this process kept no row."""
        if not self.rows:
            return None
        text = self.table(title, order)
        report_dir = self.report_dir()
        if report_dir:
            tmp = os.path.join(report_dir, f"{self.stem}.md.{worker()}")
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, os.path.join(report_dir, f"{self.stem}.md"))
        return text

    def finish(self, request, title: str, order: Iterable[str]) -> None:
        """End of a grid module: write() and print the table past pytest's output capture."""
        text = self.write(title, order)
        if text is None:
            return
        capman = request.config.pluginmanager.getplugin("capturemanager")
        if capman is not None:
            with capman.global_and_fixture_disabled():
                print("\n" + text)
        else:
            print("\n" + text)
