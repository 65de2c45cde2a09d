"""The ledger of sealed-split openings: where it lives, what a line holds, the reopen rule, the CLI."""

from __future__ import annotations

import json
import multiprocessing
import sys
from pathlib import Path

import pytest

from glm53_flash.evaluation import ledger
from glm53_flash.cli import main
from glm53_flash.evaluation.ledger import (
    LINE_FIELDS, Opening, SealedSplitError, format_lines, ledger_lines, ledger_path, opening_for, read_ledger,
    record_opening, report_rows, repository_root, require_open,
)
from glm53_flash.core.receipts import git_commit, sha256_file, write_json


@pytest.fixture
def receipt(tmp_path):
    return write_json(tmp_path / "receipt.json", {"split": "holdout", "summary": {"pass_at_1": 0.5}})


def test_the_ledger_path_is_explicit_then_the_environment_then_the_checkout(tmp_path, monkeypatch,
                                                                            private_ledger):
    assert ledger_path() == private_ledger  # tests never touch the checkout's ledger (conftest)
    assert ledger_path(tmp_path / "x.jsonl") == tmp_path / "x.jsonl"
    monkeypatch.delenv("GLM53_LEDGER")
    root = repository_root()
    assert root is not None and (root / "glm53_flash" / "evaluation" / "ledger.py").is_file()
    assert ledger_path() == root / "results" / "ledger.jsonl"


def test_only_sealed_splits_open_and_purposes_are_one_line():
    with pytest.raises(ValueError, match="'dev' is not sealed"):
        require_open("dev", "a look")
    with pytest.raises(ValueError, match="unknown split"):
        require_open("test", "a look")
    for purpose in ("", "   ", None, "two\nlines", "x" * 501):
        with pytest.raises(ValueError, match="purpose"):
            require_open("holdout", purpose)
    with pytest.raises(ValueError, match="reason to reopen"):
        require_open("holdout", "a look", reopen=" ")


def test_an_opening_writes_nothing_until_a_receipt_is_recorded(receipt, private_ledger):
    opening = require_open("holdout", "  final check of run A  ", argv=["glm53", "eval", "--split", "holdout"])
    assert opening.purpose == "final check of run A" and not private_ledger.exists()
    line = opening.record(receipt)
    assert set(line) == set(LINE_FIELDS)
    assert line["split"] == "holdout" and line["purpose"] == "final check of run A"
    assert line["command"] == ["glm53", "eval", "--split", "holdout"] and line["commit"] == git_commit()
    assert line["receipt_sha256"] == sha256_file(receipt) and line["receipt"] == str(receipt.resolve())
    assert line["opening_id"] == opening.opening_id and line["plan_sha256"] is None and line["reopen"] is None
    assert read_ledger() == [line] and json.loads(private_ledger.read_text()) == line
    assert record_opening(opening, receipt)["opening_id"] == opening.opening_id  # the function form
    assert len(read_ledger()) == 2
    with pytest.raises(ValueError, match="does not exist"):
        opening.record(receipt.parent / "missing.json")
    opening.close()


def test_a_plan_opens_a_split_once_unless_a_reason_is_given(receipt):
    first = require_open("confirm", "headline", plan_sha256="p" * 64)
    assert require_open("confirm", "headline", plan_sha256="p" * 64) is first  # same process, same run
    first.record(receipt)
    first.record(receipt)  # several receipts of one opening are one opening
    first.close()
    with pytest.raises(SealedSplitError, match="already opened for this plan .* 1 time"):
        require_open("confirm", "headline", plan_sha256="p" * 64)
    again = require_open("confirm", "headline", plan_sha256="p" * 64, reopen="the run crashed before its report")
    line = again.record(receipt)
    assert line["reopen"] == "the run crashed before its report" and line["opening_id"] != first.opening_id
    again.close()
    with pytest.raises(SealedSplitError, match="2 time"):
        require_open("confirm", "headline", plan_sha256="p" * 64)
    other = require_open("confirm", "another plan", plan_sha256="q" * 64)  # a different plan opens freely
    other.close()
    require_open("holdout", "headline", plan_sha256="p" * 64).close()  # and so does another split


def test_evaluations_find_their_opening(receipt):
    assert opening_for("dev") is None
    with pytest.raises(SealedSplitError, match="split holdout is sealed: open it first with --open-sealed"):
        opening_for("holdout")
    with require_open("holdout", "check") as opening:
        assert opening_for("holdout") is opening and opening_for("holdout", opening) is opening
        with pytest.raises(SealedSplitError, match="not confirm"):
            opening_for("confirm", opening)
        with pytest.raises(ValueError, match="not sealed"):
            opening_for("dev", opening)
    with pytest.raises(SealedSplitError):  # closed: no longer the default
        opening_for("holdout")


def test_write_receipt_accepts_only_receipts_of_its_opening(tmp_path):
    with require_open("holdout", "check") as opening:
        with pytest.raises(SealedSplitError, match="not evaluated under the opening"):
            opening.write_receipt(tmp_path / "r.json", {"split": "holdout", "sealed_opening": None})
        assert not (tmp_path / "r.json").exists()
        line = opening.write_receipt(tmp_path / "r.json", {"split": "holdout", "sealed_opening": opening.to_dict()})
        assert line["receipt_sha256"] == sha256_file(tmp_path / "r.json")


def test_a_damaged_ledger_is_an_error_naming_the_line(private_ledger, receipt):
    with require_open("final", "check") as opening:
        opening.record(receipt)
    with private_ledger.open("a") as handle:
        handle.write("\n{not json\n")
    with pytest.raises(ValueError, match="line 3 is not valid JSON"):
        read_ledger()
    private_ledger.write_text('{"split": "final"}\n')
    with pytest.raises(ValueError, match="line 1 lacks command"):
        read_ledger()


def test_lines_by_split_and_for_reports(receipt):
    for split in ("final", "holdout", "final"):
        with require_open(split, f"look at {split}") as opening:
            opening.record(receipt)
    assert [line["split"] for line in ledger_lines()] == ["final", "holdout", "final"]
    assert [line["purpose"] for line in ledger_lines("holdout")] == ["look at holdout"]
    assert ledger_lines("dev") == []
    with pytest.raises(ValueError, match="unknown split"):
        ledger_lines("test")
    columns, rows = report_rows(ledger_lines("final"))
    assert len(columns) == len(rows[0]) == 7 and rows[0][3] == "look at final"
    assert "purpose: look at holdout" in format_lines(ledger_lines())
    assert format_lines([]) == "(no sealed split has been opened)"


def _append_many(path: str, worker: int) -> None:
    line = {name: None for name in LINE_FIELDS} | {"split": "final", "purpose": f"worker {worker} " + "x" * 3000,
                                                    "command": [], "receipt_sha256": "0" * 64}
    for number in range(40):
        ledger._append_line(Path(path), line | {"utc": str(number)})


def test_concurrent_writers_never_interleave_lines(tmp_path):
    path = tmp_path / "ledger.jsonl"
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    workers = [context.Process(target=_append_many, args=(str(path), i)) for i in range(3)]
    for process in workers:
        process.start()
    for process in workers:
        process.join(60)
    lines = read_ledger(path)
    assert len(lines) == 120 and sorted({line["purpose"][:8] for line in lines}) == ["worker 0", "worker 1",
                                                                                       "worker 2"]


def test_cli_lists_the_ledger(receipt, capsys):
    with require_open("holdout", "the CLI test") as opening:
        opening.record(receipt)
    assert main(["ledger"]) == 0
    out = capsys.readouterr().out
    assert "1 receipt(s)" in out and "purpose: the CLI test" in out
    assert main(["ledger", "--split", "final"]) == 0
    assert "0 receipt(s) from split final" in capsys.readouterr().out
    assert main(["ledger", "--split", "holdout", "--json"]) == 0
    assert [line["purpose"] for line in json.loads(capsys.readouterr().out)] == ["the CLI test"]
    with pytest.raises(SystemExit):
        main(["ledger", "--split", "dev"])  # only sealed splits have openings


def test_opening_is_frozen():
    opening = Opening("final", "p", "id", "t", ("glm53",), None, None, ledger_path())
    with pytest.raises(AttributeError):
        opening.purpose = "other"


def test_every_committed_sealed_receipt_is_vouched_for_by_the_committed_ledger():
    """Reports, the deck and the docs read results/: each sealed-split receipt there is one the committed
    ledger recorded, byte for byte."""
    from glm53_flash.evaluation.ledger import committed_ledger, repository_root, unvouched_receipts

    root = repository_root()
    assert committed_ledger() == root / "results" / "ledger.jsonl"
    assert unvouched_receipts(root / "results") == []


def test_a_receipt_the_ledger_does_not_hold_is_named(tmp_path):
    from glm53_flash.evaluation.ledger import unvouched_receipts

    receipt = tmp_path / "arm" / "confirm" / "x.json"
    receipt.parent.mkdir(parents=True)
    receipt.write_text(json.dumps({"split": "confirm", "sealed_opening": {"opening_id": "abc"}}))
    (tmp_path / "dev.json").write_text(json.dumps({"split": "dev"}))
    other = tmp_path / "other-ledger.jsonl"
    other.write_text("")
    assert unvouched_receipts(tmp_path, other) == [receipt]


def test_a_pipeline_run_records_its_openings_in_its_own_ledger_by_default(tmp_path, monkeypatch):
    """`make demo` and every user's `glm53 reproduce` leave results/ledger.jsonl (a tracked file) as it
    is: their openings go to OUTPUT/ledger.jsonl unless --ledger (or $GLM53_LEDGER) names another."""
    from glm53_flash.experiments.reproduce import run_ledger

    monkeypatch.delenv("GLM53_LEDGER")
    assert run_ledger(tmp_path / "demo") == tmp_path / "demo" / "ledger.jsonl"
    assert run_ledger(tmp_path / "demo", "results/ledger.jsonl") == Path("results/ledger.jsonl")
    monkeypatch.setenv("GLM53_LEDGER", str(tmp_path / "mine.jsonl"))
    assert run_ledger(tmp_path / "demo") == tmp_path / "mine.jsonl"
