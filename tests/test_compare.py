"""Paired comparison of receipts: golden statistics, refusals of mismatched receipts, the CLI."""

from __future__ import annotations

import json

import pytest

from glm53_flash.cli import main
from glm53_flash.evaluation.compare import episode_unit, compare_receipts, format_markdown, load_receipt
from glm53_flash.core.stats import holm, mcnemar_exact, paired_bootstrap_ci
from glm53_flash.tasks.families import _frozen_tasks as frozen_tasks  # the generator itself: sealed splits without an opening, for tests of the verifier and suites

EVAL = {"status": "failed", "passed": False, "tests_passed": 0, "tests_total": 3, "pass_fraction": 0.0, "message": ""}
PASS = {"status": "passed", "passed": True, "tests_passed": 3, "tests_total": 3, "pass_fraction": 1.0, "message": ""}


def greedy(tasks, solved: set[str], split: str = "confirm") -> dict:
    return {"split": split, "inference": {"greedy": True}, "episodes": [
        {"task_id": t.task_id, "family": t.family, "prompt": t.prompt,
         "evaluation": PASS if t.task_id in solved else EVAL} for t in tasks]}


def sampled(tasks, passes: dict[str, int], n: int = 8, split: str = "confirm") -> dict:
    return {"split": split, "inference": {"samples_per_task": n}, "episodes": [
        {"task_id": t.task_id, "family": t.family, "prompt": t.prompt,
         "samples": [{"sample": i, "evaluation": PASS if i < passes.get(t.task_id, 0) else EVAL} for i in range(n)]}
        for t in tasks]}


TARGETS = ("increment", "double", "even")


def test_golden_original_greedy_confirmation_sixteen_gains_no_losses():
    # The original's headline: 0/24 -> 16/24 on increment, double, even (8 each), McNemar p = 2 / 2^16.
    tasks = frozen_tasks("confirm", 8, TARGETS)
    after = {t.task_id for t in tasks if t.family in ("increment", "double")}
    result = compare_receipts(greedy(tasks, set()), greedy(tasks, after))
    overall = result["overall"]
    assert (overall["gains"], overall["losses"], overall["before_solved"], overall["after_solved"]) == (16, 0, 0, 16)
    assert overall["mcnemar_p"] == 2 / 2**16 == pytest.approx(3.0517578125e-05)
    assert overall["rate_difference"] == pytest.approx(16 / 24)
    assert result["by_family"]["increment"]["mcnemar_p"] == 2 / 2**8
    assert result["by_family"]["even"]["mcnemar_p"] == 1.0
    assert [result["by_family"][f]["mcnemar_p_holm"] for f in TARGETS] == holm([2 / 2**8, 2 / 2**8, 1.0])


def test_golden_sampled_rate_difference_and_its_task_bootstrap():
    # The original's targeted sampled result (seed-core 9.4): exact rollouts 13/192 -> 88/192 (+39.1
    # points; increment 6 -> 40, double 4 -> 45, even 3 -> 3) and pass@8 9/24 -> 19/24.
    tasks = frozen_tasks("confirm", 8, TARGETS)
    before_counts = [2, 0, 2, 0, 1, 0, 1, 0] + [2, 0, 0, 2, 0, 0, 0, 0] + [0, 1, 0, 1, 0, 1, 0, 0]
    after_counts = [8, 5, 6, 2, 7, 4, 3, 5] + [8, 8, 7, 8, 6, 5, 2, 1] + [0, 1, 0, 1, 0, 1, 0, 0]
    before = {t.task_id: c for t, c in zip(tasks, before_counts)}
    after = {t.task_id: c for t, c in zip(tasks, after_counts)}
    result = compare_receipts(sampled(tasks, before), sampled(tasks, after), resamples=2000, seed=5)
    overall = result["overall"]
    assert (overall["before_exact"], overall["after_exact"], overall["rollouts"]) == (13, 88, 192)
    assert (overall["before_solved"], overall["after_solved"]) == (9, 19)
    assert overall["rate_difference"] == pytest.approx(75 / 192)
    assert round(100 * overall["rate_difference"], 1) == 39.1
    assert [result["by_family"][f]["after_exact"] for f in TARGETS] == [40, 45, 3]
    ids = sorted(before)
    expected = paired_bootstrap_ci([before[i] / 8 for i in ids], [after[i] / 8 for i in ids], resamples=2000, seed=5)
    assert overall["rate_difference_ci"] == list(expected)
    assert expected[0] < 75 / 192 < expected[1]
    assert overall["mcnemar_p"] == mcnemar_exact(overall["gains"], overall["losses"])
    assert result["kind"] == "sampled" and result["samples_per_task"] == 8


def test_family_filter_restricts_every_statistic():
    tasks = frozen_tasks("confirm", 4)
    before = greedy(tasks, {tasks[0].task_id})
    after = greedy(tasks, {t.task_id for t in tasks[:3]} | {tasks[-1].task_id})
    result = compare_receipts(before, after, families=("increment",))
    assert result["families"] == ["increment"] and result["tasks"] == 4
    assert (result["overall"]["gains"], result["overall"]["losses"]) == (2, 0)
    with pytest.raises(ValueError, match="unknown family"):
        compare_receipts(before, after, families=("nope",))


@pytest.mark.parametrize("change, message", [
    (lambda b, a: a["episodes"].pop(), "only in BEFORE \\(confirm-list_sum-001\\)"),
    (lambda b, a: b.__setitem__("split", "dev"), "different splits"),
    (lambda b, a: a["episodes"][0].__setitem__("prompt", "other"), "different prompts"),
    (lambda b, a: a["episodes"][0].__setitem__("task_id", "confirm-increment-009"),
     "only in BEFORE \\(confirm-increment-000\\); 1 only in AFTER \\(confirm-increment-009\\)"),
])
def test_mismatched_receipts_are_refused(change, message):
    tasks = frozen_tasks("confirm", 2)
    before, after = greedy(tasks, set()), greedy(tasks, set())
    change(before, after)
    with pytest.raises(ValueError, match=message):
        compare_receipts(before, after)


def test_kinds_and_sample_counts_must_match():
    tasks = frozen_tasks("confirm", 1)
    with pytest.raises(ValueError, match="greedy receipt with a sampled"):
        compare_receipts(greedy(tasks, set()), sampled(tasks, {}))
    with pytest.raises(ValueError, match="8 samples in BEFORE and 4 in AFTER"):
        compare_receipts(sampled(tasks, {}), sampled(tasks, {}, n=4))
    duplicated = greedy(tasks, set())
    duplicated["episodes"].append(duplicated["episodes"][0])
    with pytest.raises(ValueError, match="appears twice"):
        compare_receipts(duplicated, greedy(tasks, set()))


def test_markdown_has_one_row_per_family_and_overall():
    tasks = frozen_tasks("confirm", 2, ("double", "square"))
    text = format_markdown(compare_receipts(sampled(tasks, {}), sampled(tasks, {tasks[0].task_id: 8})))
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| family")]
    assert [r.split(" | ")[0] for r in rows] == ["| double", "| square", "| **all**"]
    assert rows[0].endswith("| 0/16 | 8/16 |")
    assert "units (distinct functions on the families suite" in text and "McNemar p (tasks pooled)" in text


def test_the_unit_is_the_function_not_the_task_nor_the_description():
    # 32 holdout tasks of one family carry two descriptions of one function: one unit, whatever the number of
    # tasks, and two families are two units that cannot show anything (the sign-flip floor is 2/2^2)
    tasks = frozen_tasks("holdout", 32, ("double", "even"))
    units = {episode_unit({"family": t.family, "prompt": t.prompt, "task_id": t.task_id}) for t in tasks}
    assert units == {"double", "even"} == {t.unit for t in tasks}
    solved = {t.task_id for t in tasks if t.family == "double"}  # one function solved everywhere
    result = compare_receipts(greedy(tasks, set()), greedy(tasks, solved))["overall"]
    assert result["gains"] == 32 and result["mcnemar_p"] < 1e-3  # pooled over tasks
    unit = result["units"]
    assert (unit["units"], unit["better"], unit["worse"], unit["same"]) == (2, 1, 0, 1)
    assert unit["sign_flip_p"] == 1.0 and unit["sign_flip_floor"] == 0.5
    assert unit["rate_difference"] == pytest.approx(0.5)


@pytest.mark.slow
def test_a_recorded_unit_gives_way_to_the_suites_unit():
    """A families receipt that recorded a family and its description as the unit (as receipts did before the
    unit was the function) still counts one unit per family; a compositions task's unit is its behaviour's
    structure group, read from the suite by its id; a task of neither suite keeps its recorded unit."""
    from glm53_flash.tasks import compositions, split_tasks

    tasks = frozen_tasks("dev", 4, ("double",))
    receipts = [greedy(tasks, solved) for solved in (set(), {tasks[0].task_id})]
    for receipt in receipts:
        for episode, task in zip(receipt["episodes"], tasks):
            episode["unit"] = f"double:{task.prompt.count('Double')}"
    assert compare_receipts(*receipts)["overall"]["units"]["units"] == 1
    dev = split_tasks(compositions.DEV_SPLIT)[:40]
    groups = compositions.structure_groups(t.task_id for t in dev)
    assert len(set(groups.values())) < len(dev)  # some behaviours share a group
    episodes = [{"task_id": t.task_id, "family": t.family, "unit": t.unit} for t in dev]
    assert [episode_unit(e) for e in episodes] == [groups[t.task_id] for t in dev]
    assert episode_unit({"task_id": "other-task-1", "family": "x", "unit": "mine"}) == "mine"
    assert episode_unit({"task_id": "other-task-1", "family": "x"}) == "other-task-1"


def test_cli_compare_prints_and_writes(tmp_path, capsys):
    tasks = frozen_tasks("confirm", 2)
    paths = {}
    for name, solved in (("before", set()), ("after", {tasks[0].task_id})):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(greedy(tasks, solved)))
    out, md = tmp_path / "cmp.json", tmp_path / "cmp.md"
    assert main(["compare", str(paths["before"]), str(paths["after"]), "--output", str(out), "--markdown",
                 str(md)]) == 0
    printed = capsys.readouterr().out
    assert "**all**" in printed and md.read_text() in printed
    result = json.loads(out.read_text())
    assert result["overall"]["gains"] == 1 and "provenance" in result
    assert main(["compare", str(paths["before"]), str(paths["after"]), "--output", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err

    short = tmp_path / "short.json"
    short.write_text(json.dumps(greedy(tasks[:3], set())))
    assert main(["compare", str(paths["before"]), str(short)]) == 2
    assert "cover different tasks" in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "missing.json"), str(short)]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_load_receipt_rejects_non_receipts(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_receipt(bad)
    bad.write_text(json.dumps({"summary": {}}))
    with pytest.raises(ValueError, match="no episodes"):
        load_receipt(bad)
