"""The cheat suite and the strict set: the wrong programs are real programs the verifier judges as the
suite computes; the strict set lets no kind of them through on more than 1% of tasks (a fixed sample
here, every task split in the slow test against the committed receipt) where the strong set let some
through; it extends the strong set with long inputs on which each predicate holds and fails; the
committed receipt, `glm53 tasks summary` and docs/VERIFIER.md show what the suite measures."""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest

from glm53_flash.cli import main
from glm53_flash.tasks import cheats, compositions, grammar, strict
from glm53_flash.tasks.families import CodingTask
from glm53_flash.tasks.grammar import BOOL, LIST, REFERENCE_BUILTINS, STR
from glm53_flash.verifier import Verifier
from glm53_flash.verifier.policy import check_policy

ROOT = Path(__file__).resolve().parents[1]
RECEIPT = json.loads((ROOT / "results/tasks/cheats.json").read_text())
SUITE = compositions.suite()
DEV, RL = SUITE.split(compositions.DEV_SPLIT), SUITE.split(compositions.RL_SPLIT)
SAMPLE = DEV[::10] + RL[::10]  # 101 behaviours of every type


def same(a, b):
    return type(a) is type(b) and a == b


@pytest.fixture(scope="module")
def measured():
    return {entry.index: cheats.measure_entry(entry.index) for entry in SAMPLE}


def test_the_strict_set_lets_no_kind_of_wrong_program_through_on_more_than_one_percent(measured):
    for kind in cheats.KINDS:
        through = [SUITE.entries[i].unit for i, sets in measured.items() if kind in sets["strict"]]
        assert len(through) <= cheats.BOUND * len(SAMPLE), (kind, through)
    # where the strong set let programs right on small inputs only through, and the three reward cases
    # let a lookup of their inputs through everywhere
    strong = sum("small-inputs" in sets["strong"] for sets in measured.values())
    assert strong >= 0.05 * len(SAMPLE)
    assert all("lookup" in sets["reward"] for sets in measured.values())


def test_a_wrong_program_is_one_an_input_tells_from_the_reference():
    by_unit = {entry.unit: entry for entry in SUITE.entries}
    entry = by_unit["str:head(5)>contains('o')"]
    reward, sets = cheats.entry_sets(entry.index)
    through = cheats.let_through(entry.behaviour, reward, sets)
    # text[:6] passes the strong set and fails the strict one ("o" at the sixth place of a long string)
    assert through["strong"]["near-miss"] == "str:head(6)>contains('o')" and not through["strict"]
    # a program the battery cannot tell from the reference is not wrong: the reference itself
    right = cheats.Cheat("near-miss", "reference", "", entry.behaviour.apply)
    assert not any(cheats.let_through(entry.behaviour, reward, sets, programs=[right]).values())


def test_every_cheat_is_a_program_the_policy_accepts_and_the_sandbox_judges_as_computed():
    picked = [entry for entry in SAMPLE[::9]]
    jobs, expected = [], []
    for entry in picked:
        reward, sets = cheats.entry_sets(entry.index)
        argument = entry.behaviour.argument
        tasks = {name: CodingTask(task_id=f"cheat-{name}", family=entry.family, entry_point="f",
                                  prompt=f"# x\ndef f({argument}):", reference_completion="",
                                  cases=tuple(compositions._case(entry.family, v, e) for v, e in cases))
                 for name, cases in sets.items()}
        by_kind = {}
        for cheat in cheats.cheats(entry.behaviour, reward):
            source = f"# x\ndef f({argument}):\n{cheat.body}"
            assert check_policy(source, "f") is None, (entry.unit, cheat.label)
            by_kind.setdefault(cheat.kind, []).append(cheat)
        for kind, found in by_kind.items():  # the first and the last of each kind
            for cheat in {id(c): c for c in (found[0], found[-1])}.values():
                for name, task in tasks.items():
                    jobs.append((task, f"{task.prompt}\n{cheat.body}"))
                    expected.append(all(same(cheat.compute(v), e) for v, e in sets[name]))
    with Verifier(workers=2) as verifier:
        verdicts = [e.passed for e in verifier.evaluate_many(jobs)]
    assert verdicts == expected and any(expected) and not all(expected)


def test_strict_sets_add_long_inputs_on_which_each_predicate_holds_and_fails():
    namespace_builtins = {name: getattr(builtins, name) for name in REFERENCE_BUILTINS}
    predicates = 0
    for entry in SAMPLE[::2]:
        strong, strict_cases = compositions.strong_cases(entry.index), strict.strict_cases(entry.index)
        assert strict_cases[:len(strong)] == strong and len(strict_cases) > len(strong)
        namespace = {"__builtins__": namespace_builtins}
        exec(f"def f({entry.behaviour.argument}):\n    {entry.behaviour.body()}\n", namespace)
        for case in strict_cases[len(strong):]:
            assert same(namespace["f"](*case.fresh_arguments()), case.expected), entry.unit
        if entry.family in (STR, LIST) and entry.behaviour.structure.gives() == BOOL:
            reachable = {entry.behaviour.apply(list(v) if entry.family == LIST else v)
                         for v in strict.candidates(entry.behaviour) if strict.size(v) >= 16}
            long = {case.expected for case in strict_cases if strict.size(case.arguments[0]) >= 16}
            assert reachable <= long, entry.unit
            predicates += reachable == {True, False}
    assert predicates >= 3
    assert strict.AFFIXES == grammar._AFFIXES  # the pool frames palindromes with the grammar's affixes
    assert set(grammar._CHARACTERS) | set("".join(grammar._AFFIXES)) <= set(strict.TEXT_ALPHABET)
    # a strict task is the task with the strict set as its cases
    task = compositions._split_tasks(compositions.DEV_SPLIT)[0]
    assert strict.applies(task) and strict.strict_task(task).cases == strict.strict_cases(DEV[0].index)
    assert strict.strict_task(task).prompt == task.prompt


@pytest.mark.slow
def test_the_strict_sets_are_pinned():
    assert {split: strict.split_sha256(split) for split in compositions.TASK_SPLITS} == strict.PINNED_SHA256


def test_the_committed_receipt_is_what_the_cheat_suite_gives_on_a_sample(measured):
    assert RECEIPT["version"] == compositions.VERSION and RECEIPT["strict_version"] == strict.VERSION
    assert {split: row["strict_sha256"] for split, row in RECEIPT["splits"].items()} == strict.PINNED_SHA256
    for split, entries in ((compositions.DEV_SPLIT, DEV), (compositions.RL_SPLIT, RL)):
        bits = RECEIPT["splits"][split]["let_through"]
        for position in range(0, len(entries), 10):
            sets = measured[entries[position].index]
            for name in cheats.SETS:
                for kind in cheats.KINDS:
                    assert (bits[name][kind][position] == "1") == (kind in sets[name]), (split, position, name, kind)
        assert RECEIPT["splits"][split]["rates"] == cheats.rates(bits, len(entries))
    assert RECEIPT["table"] == cheats.table(RECEIPT)
    for row in RECEIPT["splits"].values():  # every split within the bound on the strict set
        assert all(row["rates"]["strict"][kind]["rate"] <= cheats.BOUND for kind in cheats.KINDS)
    assert RECEIPT["families"] == json.loads(json.dumps(cheats.measure_families()))


@pytest.mark.slow
def test_the_full_measurement_is_the_committed_receipt():
    fresh = json.loads(json.dumps(cheats.measurement()))
    committed = {key: value for key, value in RECEIPT.items() if key != "provenance"}
    assert fresh == committed


def test_tasks_summary_shows_the_cheat_suite(capsys):
    from glm53_flash.commands.tasks import _cheat_rates, committed_cheats

    assert main(["tasks", "summary", "--suite", "families"]) == 0
    out = capsys.readouterr().out
    assert "cheat suite (results/tasks/cheats.json)" in out and "strong set" in out and "near miss" in out
    assert main(["tasks", "summary", "--suite", "families", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cheat_suite"]["rates"] == RECEIPT["families"]["rates"]
    shown = _cheat_rates(committed_cheats(), "compositions")  # what the compositions summary adds
    assert shown["all"] == RECEIPT["all"] and set(shown["splits"]) == set(compositions.TASK_SPLITS)
    assert shown["splits"][compositions.DEV_SPLIT]["rates"]["strict"]["any"]["rate"] <= cheats.BOUND


def test_the_verifier_doc_shows_the_receipts_table():
    """docs/VERIFIER.md shows the committed receipt's table in a block `glm53 docs build` renders from it."""
    from glm53_flash.commands.docs import blocks
    from glm53_flash.report import docs
    from glm53_flash.report.tables import markdown_table

    text = (ROOT / "docs/VERIFIER.md").read_text()
    shown = {name: lines for name, lines in docs.segments(text) if name is not None}
    assert "cheat-suite" in shown
    assert not docs.check_text(text, ROOT, "docs/VERIFIER.md", blocks(ROOT))
    table = markdown_table(RECEIPT["table"]["columns"], RECEIPT["table"]["rows"])
    assert "\n".join(table) in "\n".join(shown["cheat-suite"])
