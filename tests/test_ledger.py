"""The ledger of sealed-split openings: where it lives, the write-ahead opened line, the hash chain, the
reopen rule, committed code, `glm53 ledger verify`, and the tasks layer's own check (tasks/seal.py),
each layer tested with the one before it broken."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from glm53_flash import tasks
from glm53_flash.cli import main
from glm53_flash.core.receipts import sha256_file, write_json
from glm53_flash.evaluation import ledger
from glm53_flash.evaluation.ledger import (
    LINE_FIELDS, OPENED_FIELDS, Opening, SealedSplitError, format_lines, ledger_lines, ledger_path, opening_for,
    read_ledger, record_opening, report_rows, repository_root, require_open,
)
from glm53_flash.evaluation.ledger_verify import unvouched_receipts, verify_ledger


@pytest.fixture
def receipt(tmp_path):
    return write_json(tmp_path / "receipt.json", {"split": "holdout", "summary": {"pass_at_1": 0.5}})


@pytest.fixture
def decision(tmp_path):
    return write_json(tmp_path / "selection-dev.json", {"selected": {"checkpoint": "c"}})


def _opened(lines):
    return [line for line in lines if line.get("kind") == "opened"]


# --------------------------------------------------------------------------- where the ledger is


def test_the_ledger_path_is_explicit_or_the_checkouts_and_no_environment_moves_it(tmp_path, monkeypatch,
                                                                                  private_ledger):
    assert ledger_path() == private_ledger  # tests never touch the checkout's ledger (conftest)
    assert ledger_path(tmp_path / "x.jsonl") == tmp_path / "x.jsonl"
    monkeypatch.setattr(ledger, "_DEFAULT_OVERRIDE", None)
    root = repository_root()
    assert root is not None and (root / "glm53_flash" / "evaluation" / "ledger.py").is_file()
    assert ledger_path() == root / "results" / "ledger.jsonl"
    monkeypatch.setenv("GLM53_LEDGER", str(tmp_path / "elsewhere.jsonl"))
    assert ledger_path() == root / "results" / "ledger.jsonl"


def test_a_pipeline_run_records_its_openings_in_its_own_ledger_by_default(tmp_path):
    """`make demo` and every user's `glm53 reproduce` leave results/ledger.jsonl as it is: their openings
    go to OUTPUT/ledger.jsonl unless --ledger names another."""
    from glm53_flash.experiments.reproduce import run_ledger

    assert run_ledger(tmp_path / "demo") == tmp_path / "demo" / "ledger.jsonl"
    assert run_ledger(tmp_path / "demo", "results/ledger.jsonl") == Path("results/ledger.jsonl")


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


# --------------------------------------------------------------------------- write-ahead


def test_the_opened_line_is_written_before_any_task_and_the_receipt_line_after(receipt, decision, private_ledger):
    opening = require_open("holdout", "  final check of run A  ", argv=["glm53", "eval", "--split", "holdout"],
                           decision=[decision])
    assert opening.purpose == "final check of run A" and not private_ledger.exists()  # the rules only
    with pytest.raises(SealedSplitError, match="not granted"):
        tasks.split_tasks("holdout", 2, opening=opening)  # not activated: nothing is built
    opening.activate()
    (opened,) = read_ledger()
    assert set(opened) == set(OPENED_FIELDS) and opened["kind"] == "opened" and opened["split"] == "holdout"
    assert opened["decision"] == [{"path": str(decision), "sha256": sha256_file(decision)}]
    assert opened["command"] == ["glm53", "eval", "--split", "holdout"] and opened["vouched"] is True
    assert opened["prev_sha256"] == ledger.hashlib.sha256(b"").hexdigest()
    assert opening.activate() is opening and len(read_ledger()) == 1  # idempotent
    assert len(tasks.split_tasks("holdout", 2, opening=opening)) == 2 * 8
    line = opening.record(receipt)
    assert set(line) == set(LINE_FIELDS) | {"kind", "prev_sha256"} and line["kind"] == "receipt"
    assert line["receipt_sha256"] == sha256_file(receipt) and line["receipt"] == str(receipt.resolve())
    assert line["opening_id"] == opening.opening_id == opened["opening_id"]
    assert record_opening(opening, receipt)["opening_id"] == opening.opening_id  # the function form
    assert [entry.get("kind") for entry in read_ledger()] == ["opened", "receipt", "receipt"]
    assert len(ledger_lines()) == 2  # what reports list: receipts
    with pytest.raises(ValueError, match="does not exist"):
        opening.record(receipt.parent / "missing.json")
    opening.close()
    with pytest.raises(SealedSplitError, match="not granted"):
        tasks.split_tasks("holdout", 2, opening=opening)  # closed: no more tasks


def test_a_decision_that_does_not_exist_opens_nothing(tmp_path, private_ledger):
    opening = require_open("final", "check", decision=[tmp_path / "missing.json"])
    with pytest.raises(SealedSplitError, match="dev decision .* cannot be read"):
        opening.activate()
    assert not private_ledger.exists()
    with pytest.raises(SealedSplitError):
        tasks.frozen_tasks("final", 1, opening=opening)


def test_a_receipt_needs_an_activated_opening(receipt):
    opening = require_open("final", "check")
    with pytest.raises(SealedSplitError, match="never activated"):
        opening.record(receipt)
    opening.close()


@pytest.mark.parametrize("kind", ["device", "symlink", "directory", "unwritable"])
def test_a_ledger_that_cannot_hold_the_line_opens_nothing(tmp_path, kind):
    """A break: `GLM53_LEDGER=/dev/null glm53 eval` judged a sealed split and wrote its receipt. The ledger
    must be a regular file that takes the line, checked before any task is built."""
    target = tmp_path / "real.jsonl"
    if kind == "device":
        where = Path("/dev/null")
    elif kind == "symlink":
        where = tmp_path / "link.jsonl"
        where.symlink_to(target)
    elif kind == "directory":
        where = tmp_path / "dir.jsonl"
        where.mkdir()
    else:
        folder = tmp_path / "readonly"
        folder.mkdir()
        folder.chmod(0o555)
        where = folder / "ledger.jsonl"
        if os.geteuid() == 0:  # root writes anywhere: a read-only file system stands in
            where = Path("/proc/version")
    with pytest.raises((SealedSplitError, OSError)):
        require_open("holdout", "check", ledger=where).activate()
    assert not target.exists()
    with pytest.raises(SealedSplitError):
        tasks.frozen_tasks("holdout", 1, opening=ledger._ACTIVE.get((str(ledger_path(where)), "holdout")))


def test_the_eval_command_with_a_device_for_a_ledger_judges_nothing(tmp_path, capsys):
    from web_helpers import tiny_checkpoint

    checkpoint = tiny_checkpoint(tmp_path / "checkpoint-0000")
    out = tmp_path / "r.json"
    code = main(["eval", "--checkpoint", str(checkpoint), "--split", "holdout", "--per-family", "1", "--output",
                 str(out), "--open-sealed", "an attack", "--ledger", "/dev/null", "--max-new-tokens", "2"])
    assert code == 2 and "not a regular file" in capsys.readouterr().err and not out.exists()


def test_the_tasks_layer_refuses_alone_what_the_ledger_did_not_write(monkeypatch, private_ledger):
    """The second layer alone: with the ledger's write broken (it reports success and writes nothing), the
    tasks layer reads the file back and builds nothing."""
    monkeypatch.setattr(ledger, "_append_line", lambda where, line: "f" * 64)
    opening = require_open("confirm", "check").activate()
    assert not private_ledger.exists()
    with pytest.raises(SealedSplitError, match="cannot be read|holds no opened line"):
        tasks.frozen_tasks("confirm", 1, opening=opening)
    private_ledger.write_text(json.dumps({"kind": "opened", "opening_id": opening.opening_id, "split": "confirm"}) + "\n")
    with pytest.raises(SealedSplitError, match="differs from the one granted"):
        tasks.frozen_tasks("confirm", 1, opening=opening)
    opening.close()


def test_the_tasks_layer_refuses_any_object_with_a_split():
    class Fake:
        split, opening_id, ledger, line_sha256 = "holdout", "x" * 32, "/dev/null", "0" * 64

    hand_made = Opening("holdout", "p", "id" * 16, "t", ("glm53",), None, None, ledger_path())
    for fake in (Fake(), hand_made, "holdout"):
        for call in (lambda o: tasks.frozen_tasks("holdout", 1, opening=o),
                     lambda o: tasks.split_tasks("holdout", 1, opening=o),
                     lambda o: tasks.task_by_id("holdout-double-000", opening=o),
                     lambda o: tasks.compositions.split_tasks("compositions.unseen_structures", opening=o)):
            with pytest.raises(SealedSplitError):
                call(fake)


def test_the_generators_refuse_sealed_splits_without_an_opening():
    """The suites' own modules guard their sealed paths too (they were the way around the API)."""
    from glm53_flash.tasks import compositions, families

    for call in (lambda: families.frozen_tasks("holdout", 1), lambda: families.task_by_id("confirm-double-000"),
                 lambda: compositions.split_tasks("compositions.new_constants")):
        with pytest.raises(SealedSplitError):
            call()
    assert families.frozen_tasks("dev", 1) and families.task_by_id("dev-double-000")


# --------------------------------------------------------------------------- one opening per plan


def test_a_plan_opens_a_split_once_unless_a_reason_is_given(receipt):
    first = require_open("confirm", "headline", plan_sha256="p" * 64)
    assert require_open("confirm", "headline", plan_sha256="p" * 64) is first  # same process, same run
    first.activate()
    first.close()  # an opening that wrote no receipt still counts: its line came first
    with pytest.raises(SealedSplitError, match="already opened for this plan .* 1 time"):
        require_open("confirm", "headline", plan_sha256="p" * 64)
    again = require_open("confirm", "headline", plan_sha256="p" * 64, reopen="the run crashed before its report")
    again.activate()
    line = again.record(receipt)
    assert line["reopen"] == "the run crashed before its report" and line["opening_id"] != first.opening_id
    again.close()
    with pytest.raises(SealedSplitError, match="2 time"):
        require_open("confirm", "headline", plan_sha256="p" * 64)
    require_open("confirm", "another plan", plan_sha256="q" * 64).close()  # a different plan opens freely
    require_open("holdout", "headline", plan_sha256="p" * 64).close()  # and so does another split


def test_two_pending_openings_of_one_plan_cannot_both_activate():
    one = require_open("final", "a", plan_sha256="r" * 64)
    two = require_open("final", "b", plan_sha256="r" * 64)
    one.activate()
    with pytest.raises(SealedSplitError, match="already opened"):
        two.activate()


def test_evaluations_find_their_opening():
    assert opening_for("dev") is None
    with pytest.raises(SealedSplitError, match="split holdout is sealed: open it first with --open-sealed"):
        opening_for("holdout")
    with require_open("holdout", "check") as opening:
        with pytest.raises(SealedSplitError, match="not activated"):
            opening_for("holdout")
        opening.activate()
        assert opening_for("holdout") is opening and opening_for("holdout", opening) is opening
        with pytest.raises(SealedSplitError, match="not confirm"):
            opening_for("confirm", opening)
        with pytest.raises(ValueError, match="not sealed"):
            opening_for("dev", opening)
    with pytest.raises(SealedSplitError):  # closed: no longer the default
        opening_for("holdout")


def test_write_receipt_accepts_only_receipts_of_its_opening(tmp_path):
    with require_open("holdout", "check") as opening:
        opening.activate()
        with pytest.raises(SealedSplitError, match="not evaluated under the opening"):
            opening.write_receipt(tmp_path / "r.json", {"split": "holdout", "sealed_opening": None})
        assert not (tmp_path / "r.json").exists()
        line = opening.write_receipt(tmp_path / "r.json", {"split": "holdout", "sealed_opening": opening.to_dict()})
        assert line["receipt_sha256"] == sha256_file(tmp_path / "r.json")


# --------------------------------------------------------------------------- committed code


def _git(root, *args, when: str | None = None):
    env = {**os.environ, **({"GIT_COMMITTER_DATE": when, "GIT_AUTHOR_DATE": when} if when else {})}
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True,
                          capture_output=True, text=True, env=env)


@pytest.fixture
def checkout(tmp_path):
    """A git checkout with the package's shape: glm53_flash/, pyproject.toml, results/."""
    root = tmp_path / "checkout"
    (root / "glm53_flash").mkdir(parents=True)
    (root / "glm53_flash" / "model.py").write_text("x = 1\n")
    (root / "pyproject.toml").write_text("[project]\n")
    (root / "results").mkdir()
    (root / "results" / "ledger.jsonl").write_text("")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "first")
    return root


def test_code_state_sees_uncommitted_code_and_only_code(checkout):
    from conftest import REAL_CODE_STATE as code_state

    assert code_state(checkout)["clean"] is True and len(code_state(checkout)["commit"]) == 40
    (checkout / "results" / "notes.md").write_text("results change: the code is still clean\n")
    assert code_state(checkout)["clean"] is True
    (checkout / "glm53_flash" / "new.py").write_text("y = 2\n")  # untracked code counts
    state = code_state(checkout)
    assert state["clean"] is False and state["changes"] == ["glm53_flash/new.py"]
    assert code_state(checkout.parent / "nowhere")["clean"] is None


def test_uncommitted_code_is_refused_unless_asked_for_and_then_unvouched(monkeypatch):
    monkeypatch.setattr(ledger, "code_state", lambda root=None: {"commit": "c" * 40, "clean": False,
                                                                  "changes": ["glm53_flash/model/lm.py"]})
    with pytest.raises(SealedSplitError, match="uncommitted changes .*lm.py.*--allow-dirty"):
        require_open("holdout", "check")
    opening = require_open("holdout", "check", allow_dirty=True).activate()
    (line,) = read_ledger()
    assert line["vouched"] is False and line["code_clean"] is False and opening.to_dict()["vouched"] is False
    assert "UNVOUCHED" in format_lines(read_ledger())
    opening.close()


def test_an_emptied_committed_ledger_is_refused(checkout):
    where = checkout / "results" / "ledger.jsonl"
    opening = require_open("holdout", "first look", plan_sha256="a" * 64, ledger=where).activate()
    opening.close()
    _git(checkout, "add", "-A")
    _git(checkout, "commit", "-qm", "the opening")
    where.write_text("")  # emptied: the same plan would open again without a reason
    with pytest.raises(SealedSplitError, match="no longer begins with its committed content"):
        require_open("holdout", "first look", plan_sha256="a" * 64, ledger=where)


def test_a_torn_last_line_is_not_appended_to(tmp_path):
    where = tmp_path / "ledger.jsonl"
    where.write_text('{"kind": "opened"')
    with pytest.raises(SealedSplitError, match="torn line"):
        require_open("final", "check", ledger=where).activate()


# --------------------------------------------------------------------------- reading


def test_a_damaged_ledger_is_an_error_naming_the_line(private_ledger, receipt):
    with require_open("final", "check") as opening:
        opening.activate()
        opening.record(receipt)
    with private_ledger.open("a") as handle:
        handle.write("\n{not json\n")
    with pytest.raises(ValueError, match="line 4 is not valid JSON"):
        read_ledger()
    private_ledger.write_text('{"split": "final"}\n')
    with pytest.raises(ValueError, match="line 1 lacks .*command"):
        read_ledger()
    private_ledger.write_text('{"kind": "opened", "split": "final"}\n')
    with pytest.raises(ValueError, match="line 1 lacks utc"):
        read_ledger()


def test_lines_by_split_and_for_reports(receipt):
    for split in ("final", "holdout", "final"):
        with require_open(split, f"look at {split}") as opening:
            opening.activate()
            opening.record(receipt)
    assert [line["split"] for line in ledger_lines()] == ["final", "holdout", "final"]
    assert [line["purpose"] for line in ledger_lines("holdout")] == ["look at holdout"]
    assert ledger_lines("dev") == []
    with pytest.raises(ValueError, match="unknown split"):
        ledger_lines("test")
    columns, rows = report_rows(read_ledger())  # opened lines are not receipt rows
    assert len(columns) == len(rows[0]) == 7 and len(rows) == 3 and rows[0][3] == "look at final"
    assert "purpose: look at holdout" in format_lines(read_ledger())
    assert format_lines([]) == "(no sealed split has been opened)"


def _append_many(path: str, worker: int) -> None:
    line = {name: None for name in OPENED_FIELDS} | {"kind": "opened", "split": "final", "command": [],
                                                      "purpose": f"worker {worker} " + "x" * 3000, "decision": [],
                                                      "vouched": False}
    for number in range(40):
        ledger._append_line(Path(path), line | {"utc": str(number), "opening_id": f"{worker}-{number}"})


def test_concurrent_writers_never_interleave_lines_and_keep_the_chain(tmp_path):
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
    assert verify_ledger(path, results=None, root=tmp_path)["problems"] == []


def test_cli_lists_the_ledger(receipt, capsys):
    with require_open("holdout", "the CLI test") as opening:
        opening.activate()
        opening.record(receipt)
    assert main(["ledger"]) == 0
    out = capsys.readouterr().out
    assert "1 write-ahead opening(s), 1 receipt line(s)" in out and "purpose: the CLI test" in out
    assert main(["ledger", "--split", "final"]) == 0
    assert "0 write-ahead opening(s), 0 receipt line(s) of split final" in capsys.readouterr().out
    assert main(["ledger", "--split", "holdout", "--json"]) == 0
    assert [line["purpose"] for line in json.loads(capsys.readouterr().out)] == ["the CLI test"] * 2
    with pytest.raises(SystemExit):
        main(["ledger", "--split", "dev"])  # only sealed splits have openings


def test_opening_is_frozen():
    opening = Opening("final", "p", "id", "t", ("glm53",), None, None, ledger_path())
    with pytest.raises(AttributeError):
        opening.purpose = "other"


# --------------------------------------------------------------------------- verify


def test_verify_finds_a_changed_removed_or_unchained_line(tmp_path, receipt):
    where = tmp_path / "ledger.jsonl"
    for split in ("final", "holdout", "final"):
        with require_open(split, f"look at {split}", ledger=where) as opening:
            opening.activate()
            opening.record(receipt)
    assert verify_ledger(where, results=None, root=tmp_path)["problems"] == []
    good = where.read_bytes()
    lines = good.split(b"\n")
    where.write_bytes(b"\n".join([lines[0].replace(b"look at final", b"look at FINAL")] + lines[1:]))
    assert any("chain breaks" in p for p in verify_ledger(where, results=None, root=tmp_path)["problems"])
    where.write_bytes(b"\n".join(lines[:1] + lines[2:]))
    assert any("chain breaks" in p for p in verify_ledger(where, results=None, root=tmp_path)["problems"])
    legacy = {name: None for name in LINE_FIELDS} | {"split": "final", "command": [], "receipt_sha256": "0" * 64}
    where.write_bytes(good + json.dumps(legacy).encode() + b"\n")
    assert any("legacy (unchained) line after" in p for p in verify_ledger(where, results=None, root=tmp_path)["problems"])


def _sealed_receipt(opening, path):
    return opening.write_receipt(path, {"split": opening.split, "sealed_opening": opening.to_dict()})


def test_verify_vouches_only_for_committed_code_and_decisions_committed_first(checkout, monkeypatch):
    where, results = checkout / "results" / "ledger.jsonl", checkout / "results"
    monkeypatch.setattr(ledger, "code_state", lambda root=None: {"commit": _git(checkout, "rev-parse", "HEAD").stdout.strip(),
                                                                  "clean": True, "changes": []})
    monkeypatch.setattr(ledger, "repository_root", lambda: checkout)
    committed = write_json(results / "study" / "selection-dev.json", {"selected": "a"})
    _git(checkout, "add", "-A")
    _git(checkout, "commit", "-qm", "the dev decision, before the opening", when="2000-01-01T00:00:00+00:00")
    with require_open("holdout", "vouched", ledger=where, decision=[committed]) as opening:
        opening.activate()
        _sealed_receipt(opening, results / "study" / "holdout.json")
    result = verify_ledger(where, results, checkout)
    assert result["problems"] == [] and result["counts"]["openings"] == 1 and result["counts"]["receipts_checked"] == 1
    # a decision committed only after the opening, and a receipt no line holds
    late = write_json(results / "late" / "selection-dev.json", {"selected": "b"})
    with require_open("final", "decided late", ledger=where, decision=[late]) as opening:
        opening.activate()
        _sealed_receipt(opening, results / "late" / "final.json")
    write_json(results / "stray" / "confirm.json", {"split": "confirm", "sealed_opening": {"opening_id": "x"}})
    _git(checkout, "add", "-A")
    _git(checkout, "commit", "-qm", "late", when="2090-01-01T00:00:00+00:00")
    problems = verify_ledger(where, results, checkout)["problems"]
    assert any("late/selection-dev.json was not committed under results/ before it" in p for p in problems)
    assert any("stray/confirm.json: a sealed receipt no receipt line vouches for" in p for p in problems)
    # uncommitted code: refused, then asked for, then named by verify
    monkeypatch.setattr(ledger, "code_state", lambda root=None: {"commit": "d" * 40, "clean": False, "changes": ["x"]})
    with require_open("confirm", "dirty", ledger=where, decision=[committed], allow_dirty=True) as opening:
        opening.activate()
        _sealed_receipt(opening, results / "dirty" / "confirm.json")
    problems = verify_ledger(where, results, checkout)["problems"]
    assert any("dirty/confirm.json: comes from an unvouched opening" in p for p in problems)
    assert any("commit dddddddddddd is not in the repository" in p for p in problems)


def test_verify_finds_a_rewritten_committed_ledger(checkout):
    where = checkout / "results" / "ledger.jsonl"
    with require_open("final", "one", ledger=where) as opening:
        opening.activate()
    _git(checkout, "add", "-A")
    _git(checkout, "commit", "-qm", "one opening")
    where.write_text("")
    _git(checkout, "add", "-A")
    _git(checkout, "commit", "-qm", "emptied")
    problems = verify_ledger(where, checkout / "results", checkout)["problems"]
    assert any("was rewritten" in p for p in problems)


@pytest.mark.slow
def test_every_committed_sealed_receipt_is_vouched_for_by_the_committed_ledger(capsys):
    """Reports, the deck and the docs read results/: each sealed-split receipt there is one the committed
    ledger recorded, byte for byte, and the committed ledger verifies (`glm53 ledger verify`)."""
    from glm53_flash.evaluation.ledger import committed_ledger

    root = repository_root()
    assert committed_ledger() == root / "results" / "ledger.jsonl"
    assert unvouched_receipts(root / "results") == []
    assert main(["ledger", "verify", "--ledger", str(committed_ledger())]) == 0
    assert "verified: no problem" in capsys.readouterr().out


def test_a_receipt_the_ledger_does_not_hold_is_named(tmp_path):
    receipt = tmp_path / "arm" / "confirm" / "x.json"
    receipt.parent.mkdir(parents=True)
    receipt.write_text(json.dumps({"split": "confirm", "sealed_opening": {"opening_id": "abc"}}))
    (tmp_path / "dev.json").write_text(json.dumps({"split": "dev"}))
    other = tmp_path / "other-ledger.jsonl"
    other.write_text("")
    assert unvouched_receipts(tmp_path, other) == [receipt]
