"""The compositions suite: distinct behaviours, splits by structure that share nothing they should not,
references that compute what `apply` computes, reward cases that fail near misses, pinned content."""

import builtins
import json

import pytest

from glm53_flash.cli import main
from glm53_flash.tasks import (
    EVAL_SPLITS, SEALED_SPLITS, compositions, suite_of,
)
from glm53_flash.tasks import split_tasks as api_split_tasks
from glm53_flash.tasks.splits import _split_tasks


def split_tasks(split, per_family=None, families=None):
    """Every split's tasks, sealed ones included: these tests read the suite itself (the tasks API asks
    for an opening: test_the_sealed_sets_open_only_through_the_ledger)."""
    return _split_tasks(split, per_family, families)


def task_by_id(task_id):
    from glm53_flash.tasks import splits

    return splits._task_by_id(task_id)  # the suite itself, sealed splits included
from glm53_flash.tasks import grammar
from glm53_flash.tasks.compositions import (
    DEV_SPLIT, NEW_CONSTANTS_SPLIT, PRETRAIN_SPLIT, RL_SPLIT, STRONG_INPUTS, UNSEEN_SPLIT,
)
from glm53_flash.verifier import Verifier
from glm53_flash.verifier.policy import SAFE_CALL_NAMES, check_policy

SUITE = compositions.suite()
ENTRIES = SUITE.entries
BY_SPLIT = {split: SUITE.split(split) for split in compositions.SPLITS}
TRAINED = BY_SPLIT[PRETRAIN_SPLIT] + BY_SPLIT[RL_SPLIT]


def reference_function(entry):
    namespace = {"__builtins__": {name: getattr(builtins, name) for name in grammar.REFERENCE_BUILTINS}}
    exec(compile(f"def f({entry.behaviour.argument}):\n    {entry.behaviour.body()}\n", entry.unit, "exec"), namespace)
    return namespace["f"]


def same(a, b):
    return type(a) is type(b) and a == b


@pytest.mark.slow
def test_a_thousand_distinct_behaviours_at_least():
    summary = compositions.summary()
    assert summary["behaviours"] == len(ENTRIES) >= 1000
    assert sum(row["behaviours"] for row in summary["splits"].values()) == len(ENTRIES)
    for split in compositions.TASK_SPLITS:  # every evaluated or trained split is large enough to say something
        assert summary["splits"][split]["tasks"] == summary["splits"][split]["behaviours"] >= 300
    assert all(count >= compositions.STRONG_MIN for count in summary["strong_cases_per_behaviour"].values())


def test_no_two_behaviours_share_their_outputs_on_the_strong_inputs():
    seen = {}
    for entry in ENTRIES:
        key = (entry.family, repr(entry.outputs))
        assert key not in seen, f"{entry.unit} computes what {seen[key]} computes"
        seen[key] = entry.unit
    # and none returns a constant or its input unchanged
    for entry in ENTRIES:
        assert len({repr(o) for o in entry.outputs}) > 1, entry.unit
        arguments = [compositions._argument(entry.family, v) for v in STRONG_INPUTS[entry.family]]
        assert not all(same(o, a) for o, a in zip(entry.outputs, arguments)), entry.unit


def test_the_original_eight_families_are_behaviours_of_the_suite_and_pretrained_on():
    from glm53_flash.tasks import FAMILIES

    by_unit = {entry.unit: entry for entry in ENTRIES}
    for family in FAMILIES:
        entry = by_unit[compositions.ORIGINAL_BEHAVIOURS[family.name]]
        assert entry.split == PRETRAIN_SPLIT
        namespace = {"__builtins__": {"sum": sum}}
        exec(f"def f({family.argument}):\n    {family.body}\n", namespace)
        arguments = [compositions._argument(entry.family, v) for v in STRONG_INPUTS[entry.family]]
        assert all(same(namespace["f"](a), o) for a, o in zip(arguments, entry.outputs)), family.name


def test_sealed_sets_share_no_structure_with_pretraining_or_rl():
    trained_structures = {e.structure for e in TRAINED}
    trained_groups = {e.group for e in TRAINED}
    unseen = BY_SPLIT[UNSEEN_SPLIT]
    assert unseen and not {e.structure for e in unseen} & trained_structures
    # nor a structure group: no constants of any trained structure compute one of its sampled functions
    assert not {e.group for e in unseen} & trained_groups
    dev_unseen = [e for e in BY_SPLIT[DEV_SPLIT] if e.kind == compositions.UNSEEN_STRUCTURE]
    assert dev_unseen and not {e.group for e in dev_unseen} & (trained_groups | {e.group for e in unseen})
    # the new-constants sets are seen structures (pretraining shows each of them), new behaviours
    for split in (NEW_CONSTANTS_SPLIT, RL_SPLIT):
        assert {e.structure for e in BY_SPLIT[split]} <= {e.structure for e in BY_SPLIT[PRETRAIN_SPLIT]}
    units = {split: {e.unit for e in entries} for split, entries in BY_SPLIT.items()}
    for a in units:
        for b in units:
            assert a == b or not units[a] & units[b]
    # unseen compositions are made of operations pretraining uses
    pretrained_ops = {op for e in BY_SPLIT[PRETRAIN_SPLIT] for op in e.behaviour.structure.operations}
    assert {op for e in unseen for op in e.behaviour.structure.operations} <= pretrained_ops


def test_kinds_and_the_sealed_splits():
    assert {e.kind for e in BY_SPLIT[PRETRAIN_SPLIT]} == {"seen"}
    assert {e.kind for e in BY_SPLIT[RL_SPLIT]} == {"new-constants"}
    assert {e.kind for e in BY_SPLIT[DEV_SPLIT]} == {"new-constants", "unseen-structure"}
    assert {e.kind for e in BY_SPLIT[UNSEEN_SPLIT]} == {"unseen-structure"}
    assert {e.kind for e in BY_SPLIT[NEW_CONSTANTS_SPLIT]} == {"new-constants"}
    assert set(compositions.SEALED) <= set(SEALED_SPLITS)
    assert DEV_SPLIT in EVAL_SPLITS and RL_SPLIT not in EVAL_SPLITS and PRETRAIN_SPLIT not in EVAL_SPLITS


def test_each_reference_computes_its_outputs_and_passes_the_policy():
    assert set(grammar.REFERENCE_BUILTINS) <= SAFE_CALL_NAMES
    for entry in ENTRIES:
        function = reference_function(entry)
        arguments = [compositions._argument(entry.family, v) for v in STRONG_INPUTS[entry.family]]
        outputs = [function(a) for a in arguments]
        assert all(same(a, b) for a, b in zip(outputs, entry.outputs)), entry.unit
        source = f"# x\ndef f({entry.behaviour.argument}):\n    {entry.behaviour.body()}\n"
        assert check_policy(source, "f") is None, entry.unit
    # no operation changed the shared inputs while the suite was built
    assert compositions._ARGUMENTS == {kind: tuple(compositions._argument(kind, v) for v in values)
                                       for kind, values in STRONG_INPUTS.items()}


@pytest.mark.slow
def test_two_descriptions_and_the_context_limits():
    for entry in ENTRIES:
        first, second = entry.behaviour.descriptions()
        assert first != second and first.endswith(".") and second.startswith("Return ")
    for split in compositions.TASK_SPLITS:
        for task in split_tasks(split):
            assert len(task.prompt.encode()) <= compositions.MAX_PROMPT_BYTES
            assert len(task.reference_completion.encode()) <= compositions.MAX_COMPLETION_BYTES
            assert 1 + len(task.prompt.encode()) + compositions.MAX_NEW_TOKENS <= 192
    longest = max(len(compositions.pretraining_text(i).encode()) for i in range(2000))
    assert longest + 2 <= compositions.SEQUENCE_LENGTH + 1  # BOS + text + EOS in one row


def test_reward_cases_fail_the_near_misses():
    by_unit = {e.unit: e for e in ENTRIES}
    even = by_unit["int:divisible(2)"]
    cases = compositions.reward_cases(even.index)
    inputs = [case.arguments[0] for case in cases]
    # an input that separates x % 2 from x % 4, and one that a sign test gets wrong
    assert any(x % 4 == 2 for x in inputs) and any((x >= 0) != (x % 2 == 0) for x in inputs)
    reverse = by_unit["str:reverse"]
    texts = [case.arguments[0] for case in compositions.reward_cases(reverse.index)]
    assert any(len(t) >= 8 and t[::-1][:5] != t[::-1] for t in texts)  # text[::-1][:5] fails
    # over a dev sample, almost no near miss survives the three cases
    sample = BY_SPLIT[DEV_SPLIT][::10]
    survivors = [compositions.near_miss_survivors(e.index) for e in sample]
    assert sum(s == 0 for s in survivors) >= 0.9 * len(sample)


def test_tasks_carry_units_strong_sets_and_round_trip_by_id():
    for split in compositions.TASK_SPLITS:
        tasks = split_tasks(split)
        assert suite_of(split) == "compositions"
        assert len({t.unit for t in tasks}) == len(tasks) and len({t.task_id for t in tasks}) == len(tasks)
        for task in tasks[:: max(1, len(tasks) // 20)]:
            assert task_by_id(task.task_id) == task
            assert task.split == split and task.task_id.partition("-")[0] == split
            assert len(task.cases) == 3 and task.strong_cases[:3] == task.cases
            assert len(task.strong_cases) >= compositions.STRONG_MIN
    assert [t.family for t in split_tasks(DEV_SPLIT, families=("str",))] == ["str"] * len(
        [t for t in split_tasks(DEV_SPLIT) if t.family == "str"])
    with pytest.raises(ValueError, match="one task per behaviour"):
        split_tasks(DEV_SPLIT, per_family=4)
    with pytest.raises(ValueError, match="unknown split"):
        split_tasks("compositions.test")


def test_references_pass_their_cases_in_the_sandbox_and_near_misses_fail():
    tasks = split_tasks(DEV_SPLIT)[::12] + split_tasks(RL_SPLIT)[::12]
    from glm53_flash.tasks import strong_task

    with Verifier(workers=2) as verifier:
        judged = verifier.evaluate_many([(t, t.reference_source) for t in tasks]
                                        + [(strong_task(t), t.reference_source) for t in tasks])
        assert all(e.passed for e in judged), [e for e in judged if not e.passed][:2]
        # "divisible by c" tasks: a sign test and divisibility by 2c are near misses their cases fail
        divisible = [t for t in split_tasks(RL_SPLIT) + split_tasks(DEV_SPLIT) if t.structure == "int:divisible"]
        assert divisible
        for task in divisible:
            c = int(task.unit.split("(")[1].rstrip(")"))
            near = verifier.evaluate_many([(task, task.prompt + "\n    return x >= 0\n"),
                                           (task, task.prompt + f"\n    return x % {2 * c} == 0\n")])
            assert not any(e.passed for e in near), task.unit


def test_the_pretraining_stream():
    texts = [compositions.pretraining_text(i) for i in range(200)]
    assert texts == [compositions.pretraining_text(i) for i in range(200)]  # a pure function of (index, seed)
    assert texts != [compositions.pretraining_text(i, seed=7) for i in range(200)]
    pretrain_units = {e.unit for e in BY_SPLIT[PRETRAIN_SPLIT]}
    assert {compositions.pretraining_task(i).unit for i in range(2000)} <= pretrain_units
    evaluated = {t.reference_completion for s in compositions.EVALUATION for t in split_tasks(s)}
    assert texts[0].startswith("# ") and "\ndef " in texts[0]
    assert evaluated  # references can coincide in text only across distinct behaviours' splits


@pytest.mark.slow
def test_each_split_is_pinned_and_a_change_is_refused(monkeypatch):
    for split in compositions.SPLITS:
        assert compositions.split_sha256(split) == compositions.PINNED_SHA256[split], split
    monkeypatch.setitem(compositions.PINNED_SHA256, DEV_SPLIT, "0" * 64)
    compositions._split_tasks.cache_clear()
    try:
        with pytest.raises(compositions.SuiteChanged, match="no longer matches its pinned sha256"):
            compositions.split_tasks(DEV_SPLIT)
    finally:
        compositions._split_tasks.cache_clear()


@pytest.mark.slow
def test_tasks_summary_command(capsys):
    assert main(["tasks", "summary", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["behaviours"] >= 1000 and set(summary["splits"]) == set(compositions.SPLITS)
    for split, row in summary["splits"].items():
        assert {"tasks", "behaviours", "structures", "sha256", "sealed"} <= set(row)
        assert row["sealed"] == (split in compositions.SEALED)
        assert row["structure_groups"] <= row["structures"]
        if split in compositions.EVALUATION:  # the power a paired comparison has over the split's groups
            assert row["power"]["units"] == row["structure_groups"] < row["behaviours"]
    assert main(["tasks", "summary", "--suite", "families", "--json"]) == 0
    families = json.loads(capsys.readouterr().out)
    # eight families, each one function whichever description a task carries: 8 units of 64 tasks
    assert families["splits"]["holdout"]["units"] == 8 and families["splits"]["holdout"]["tasks"] == 64
    assert families["splits"]["holdout"]["sealed"] and families["unit"].startswith("a distinct function")
    assert main(["tasks", "summary"]) == 0 and "distinct behaviours" in capsys.readouterr().out
    task = split_tasks(DEV_SPLIT)[0]
    assert main(["tasks", "show", task.task_id]) == 0 and task.prompt in capsys.readouterr().out
    sealed = split_tasks(UNSEEN_SPLIT)[0]
    assert main(["tasks", "show", sealed.task_id]) == 2
    assert "sealed split" in capsys.readouterr().err


@pytest.mark.slow
def test_a_tasks_structure_group_comes_from_the_suite_by_its_id():
    """Every task's group is its behaviour's entry's, read from the id alone (no sealed split opened); an id
    that names no task of the suite is refused in one line."""
    for split in (DEV_SPLIT, UNSEEN_SPLIT):
        tasks = split_tasks(split)
        groups = compositions.structure_groups(t.task_id for t in tasks)
        by_unit = {entry.unit: entry.group for entry in ENTRIES}
        assert groups == {t.task_id: by_unit[t.unit] for t in tasks}
        assert set(groups.values()) == {entry.group for entry in BY_SPLIT[split]}
    task = split_tasks(DEV_SPLIT)[0]
    moved = task.task_id.replace(DEV_SPLIT, UNSEEN_SPLIT)  # a behaviour of dev named as one of another split
    for bad in (moved, "dev-double-000", f"{DEV_SPLIT}-bxyz-000", f"{DEV_SPLIT}-b{len(ENTRIES):04d}-000"):
        with pytest.raises(ValueError, match="is no task of the compositions suite"):
            compositions.structure_group(bad)


@pytest.mark.parametrize("split", compositions.SEALED)
def test_the_sealed_sets_open_only_through_the_ledger(tmp_path, capsys, split):
    from glm53_flash.evaluation import ledger
    from glm53_flash.evaluation.evaluate import split_of

    assert ledger.is_sealed(split) and split_of(split_tasks(split)[:2]) == split
    with pytest.raises(ledger.SealedSplitError, match="is a sealed split"):
        api_split_tasks(split)  # the tasks API builds it only for an opening
    out = tmp_path / "r.json"
    assert main(["eval", "--checkpoint", str(tmp_path / "none"), "--split", split, "--output", str(out)]) == 2
    assert "is sealed" in capsys.readouterr().err and not out.exists()
    assert not ledger.read_ledger()  # refused before anything is opened or written
    # the evaluation itself refuses without an opening, whoever calls it
    from glm53_flash.evaluation.evaluate import evaluate_greedy
    from glm53_flash.evaluation.ledger import SealedSplitError

    with pytest.raises(SealedSplitError):
        evaluate_greedy(None, split_tasks(split)[:1])
