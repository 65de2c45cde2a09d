"""Every figure in the docs' tables comes from a committed receipt, and this test checks it.

A table with figures (a number in any cell after the first column, outside `code`) must be preceded
by a marker naming the committed receipts it was read from:

    <!-- receipts: results/bench/scaling.json, results/headline/summary.json -->

(a directory stands for every .json file under it). Each number in the table's body must then be a
value of one of those receipts, as displayed: rounded to the digits shown, possibly in percent,
milli-, kilo- or mega-units, or GiB. A table whose numbers are definitions rather than measurements
(the methods table) says so with `<!-- not-measured: REASON -->`.
"""

from __future__ import annotations

import bisect
import json
import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("docs/BENCHMARKS-HISTORY.md",)
MARKER = re.compile(r"<!--\s*(receipts|not-measured):\s*(.*?)\s*-->")
# a number, with a unit or x after it allowed (12.4x, 46.6ms), but not a digit or a decimal point
NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?:e([-+]?\d+))?(?![\d.,]\d|\d)")
SCALES = (1.0, 100.0, 1e3, 1e-3, 1e-6, 1e-9, 2.0 ** -30, 2.0 ** -20)


def tables(path: Path):
    """(line number, marker kind, marker text, rows) for each markdown table in `path`."""
    lines = path.read_text().splitlines()
    marker = None
    i = 0
    while i < len(lines):
        found = MARKER.search(lines[i])
        if found:
            marker = (found.group(1), found.group(2), i + 1)
        if lines[i].startswith("|"):
            start = i
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                rows.append([cell.strip() for cell in lines[i].strip().strip("|").split("|")])
                i += 1
            yield start + 1, marker, rows
            marker = None
            continue
        i += 1


def figures(cell: str) -> list[tuple[float, float]]:
    """(absolute value, half of the last shown digit) of every number in a cell, outside `code`."""
    text = re.sub(r"`[^`]*`", " ", cell).replace("**", "")
    found = []
    for match in NUMBER.finditer(text):
        whole, fraction, exponent = match.groups()
        digits = len(fraction) - 1 if fraction else 0
        value = float(whole.replace(",", "") + (fraction or ""))
        half = 0.5 * 10.0 ** -digits
        if exponent is not None:
            value *= 10.0 ** int(exponent)
            half *= 10.0 ** int(exponent)
        found.append((value, half))
    return found


def receipt_values(paths: list[Path]) -> list[float]:
    """Every number in the receipts; in the text of a `headline_table` (a table the code rendered
    from the receipts' counts), the numbers as written."""
    values: set[float] = set()

    def walk(node, rendered=False):
        if isinstance(node, bool) or node is None:
            return
        if isinstance(node, (int, float)):
            if math.isfinite(node):
                values.add(abs(float(node)))
        elif isinstance(node, str) and rendered:
            values.update(value for value, _ in figures(node))
        elif isinstance(node, dict):
            for key, value in node.items():
                walk(value, rendered or key == "headline_table")
        elif isinstance(node, list):
            for value in node:
                walk(value, rendered)

    for path in paths:
        files = sorted(path.rglob("*.json")) if path.is_dir() else [path]
        for file in files:
            walk(json.loads(file.read_text()))
    return sorted(values)


def shown_in(value: float, half: float, sorted_values: list[float]) -> bool:
    tolerance = half * (1 + 1e-9) + 1e-12
    for scale in SCALES:
        low = bisect.bisect_left(sorted_values, (value - tolerance) / scale)
        if low < len(sorted_values) and sorted_values[low] * scale <= value + tolerance:
            return True
    return False


def table_cases():
    for doc in DOCS:
        for line, marker, rows in tables(ROOT / doc):
            yield pytest.param(doc, line, marker, rows, id=f"{doc}:{line}")


CASES = list(table_cases())


def test_the_walk_finds_the_tables():
    assert len(CASES) >= 10
    found = figures("**15/24** (p 3.05e-05), 1,218 and `code 99`, +2.3, 80.9x")
    expected = [(15.0, 0.5), (24.0, 0.5), (3.05e-05, 0.5e-07), (1218.0, 0.5), (2.3, 0.05), (80.9, 0.05)]
    assert [value for value, _ in found] == pytest.approx([value for value, _ in expected])
    assert [half for _, half in found] == pytest.approx([half for _, half in expected])


@pytest.mark.parametrize("doc, line, marker, rows", CASES)
def test_every_figure_in_a_table_is_in_the_receipt_it_cites(doc, line, marker, rows):
    body = rows[2:]  # header and separator rows name things; they are not figures
    numbers = [(value, half, cell) for row in body for cell in row[1:] for value, half in figures(cell)]
    if not numbers:
        return
    assert marker is not None, (f"{doc}:{line}: a table with figures needs a <!-- receipts: PATH --> marker naming "
                                "the committed receipts it comes from")
    kind, text, marker_line = marker
    if kind == "not-measured":
        assert text, f"{doc}:{marker_line}: say why the table's numbers are not measurements"
        return
    paths = [ROOT / part.strip() for part in text.split(",") if part.strip()]
    missing = [str(p.relative_to(ROOT)) for p in paths if not p.exists()]
    assert not missing, f"{doc}:{marker_line}: cited receipts are not in the repository: {', '.join(missing)}"
    values = receipt_values(paths)
    absent = sorted({cell for value, half, cell in numbers if not shown_in(value, half, values)})
    assert not absent, f"{doc}:{line}: figures not found in {text}: {absent}"


def test_a_figure_that_is_not_in_the_receipt_fails(tmp_path):
    receipt = tmp_path / "r.json"
    receipt.write_text(json.dumps({"seconds": 0.0422, "rate": 0.609, "solved": 15, "tasks": 24}))
    values = receipt_values([receipt])
    for shown in ("42.2", "60.9", "15", "24", "0.0422"):
        ((value, half),) = figures(shown)
        assert shown_in(value, half, values), shown
    for wrong in ("42.3", "61.0", "16", "0.0423"):
        ((value, half),) = figures(wrong)
        assert not shown_in(value, half, values), wrong
