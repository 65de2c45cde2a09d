"""The committed results and the README agree: every headline table in the README is the one its
summary.json (built from receipts) renders, so no figure there is typed by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from glm53_flash.report.tables import markdown_table

ROOT = Path(__file__).resolve().parents[1]
SUMMARIES = sorted((ROOT / "results").glob("*/summary.json"))


@pytest.mark.parametrize("path", [p for p in SUMMARIES if "headline_table" in json.loads(p.read_text())],
                         ids=lambda p: p.parent.name)
def test_readme_shows_each_study_table_as_generated(path):
    table = json.loads(path.read_text())["headline_table"]
    rendered = "\n".join(markdown_table(table["columns"], table["rows"]))
    assert rendered in (ROOT / "README.md").read_text(), f"README's table for {path.parent.name} is stale"


@pytest.mark.parametrize("name", ["pretraining-data", "rl-choices"])
def test_study_results_are_committed_with_their_plan_and_receipts(name):
    directory = ROOT / "results" / name
    plan = json.loads((directory / "plan.json").read_text())
    summary = json.loads((directory / "summary.json").read_text())
    receipts = [json.loads(p.read_text()) for p in sorted((directory / "runs").glob("*.json"))]
    assert summary["plan_sha256"] == plan["plan_sha256"]
    assert receipts and all(r["plan_sha256"] == plan["plan_sha256"] for r in receipts)
    assert summary["runs"] == len(receipts) == len(plan["units"])
    assert all(p.stat().st_size < 1_000_000 for p in directory.rglob("*") if p.is_file())
