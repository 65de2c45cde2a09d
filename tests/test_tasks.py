import hashlib
import json

import pytest

from glm53_flash.tasks import (
    FAMILIES, FAMILY_NAMES, ORIGINAL_SEALED_SPLITS, SEALED_SPLITS, SPLIT_SEEDS, STRONG_EXTRA_MIN, make_task, parse_families,
    pretraining_task, pretraining_text, split_units, strong_cases, strong_task,
)
# The suite's own module: these tests read every split, sealed ones included (the tasks API asks for an
# opening: test_the_tasks_api_builds_a_sealed_split_only_for_its_opening).
from glm53_flash.tasks.families import _frozen_tasks as frozen_tasks, _task_by_id as task_by_id

DEV_GOLDEN = ["increment_axkyima", "double_hphcjzx", "square_niddeuw", "absolute_tqedzon",
              "nonnegative_daflyjn", "even_ybylgpa", "reverse_psddggh", "list_sum_myckbxp"]
RL_GOLDEN = ["increment_cjaojdr", "double_glloxal", "square_pbkwfxn", "absolute_tzptywy",
             "nonnegative_gcnukgj", "even_gfslyno", "reverse_adfwelo", "list_sum_mjnoyzl"]


def run_in_process(task, source):
    """A plain in-process check (the sandboxed verifier is tested on its own)."""
    namespace = {"__builtins__": {"sum": sum, "len": len, "abs": abs, "min": min, "max": max,
                                  "bool": bool, "int": int, "str": str}}
    exec(compile(source, "<candidate>", "exec"), namespace)
    fn = namespace[task.entry_point]
    passed = 0
    for case in task.cases:
        try:
            result = fn(*case.fresh_arguments())
        except Exception:
            continue
        passed += type(result) is type(case.expected) and result == case.expected
    return passed


def test_family_order_and_contents():
    assert FAMILY_NAMES == ("increment", "double", "square", "absolute", "nonnegative", "even",
                            "reverse", "list_sum")
    assert FAMILIES[3].descriptions == ("Return the absolute value of x.", "Make a negative x positive.")
    assert FAMILIES[7].body == "return sum(values)"
    assert FAMILIES[0].reference_completion == "\n    return x + 1\n"


def test_golden_dev_and_rl_names():
    assert [t.entry_point for t in frozen_tasks("dev", 1)] == DEV_GOLDEN
    assert [t.entry_point for t in frozen_tasks("rl", 1)] == RL_GOLDEN
    dev3 = frozen_tasks("dev", 3)
    assert [t.entry_point for t in dev3[:3]] == ["increment_axkyima", "increment_plrjnnx", "increment_uytztfn"]
    assert "# Increase x by one.\n" in dev3[1].prompt and "# Increase x by one.\n" in dev3[2].prompt
    assert dev3[0].task_id == "dev-increment-000"


def test_prompt_format():
    task = frozen_tasks("dev", 1)[0]
    assert task.prompt == "# Complete this Python function.\n# Return x plus one.\ndef increment_axkyima(x):"
    assert task.reference_source == task.prompt + "\n    return x + 1\n"


def test_pretraining_stream_golden():
    assert [pretraining_task(i).entry_point for i in range(5)] == [
        "double_fofienq", "even_mwywsgi", "square_hgaleuq", "double_mwwhrgp", "increment_vqqvtzy"]
    assert pretraining_text(0).startswith("# Complete this Python function.\n")


def test_tasks_independent_of_per_family():
    assert frozen_tasks("confirm", 8)[:3] == frozen_tasks("confirm", 3)[:3]


def test_splits_pairwise_disjoint():
    names = {s: {t.entry_point for t in frozen_tasks(s, 8)} for s in SPLIT_SEEDS}
    splits = list(names)
    for i, a in enumerate(splits):
        assert len(names[a]) == 64
        for b in splits[i + 1:]:
            assert not names[a] & names[b], (a, b)


@pytest.mark.parametrize("split", sorted(SPLIT_SEEDS))
def test_every_reference_passes_and_pass_body_fails(split):
    for task in frozen_tasks(split, 2):
        assert run_in_process(task, task.reference_source) == 3, task.task_id
        assert run_in_process(task, task.prompt + "\n    pass\n") < 3


def test_cases_are_immutable_and_arguments_fresh():
    task = frozen_tasks("dev", 1, families=("list_sum",))[0]
    case = task.cases[1]
    assert isinstance(case.arguments[0], tuple)
    first, second = case.fresh_arguments()[0], case.fresh_arguments()[0]
    assert first == [1, 2, 3] and first is not second
    first.append(100)
    assert case.fresh_arguments()[0] == [1, 2, 3]
    with pytest.raises(AttributeError):
        case.expected = 7


def test_unknown_names_raise_listing_allowed():
    with pytest.raises(ValueError, match="allowed: dev, final, rl, confirm, holdout"):
        frozen_tasks("test")
    with pytest.raises(ValueError, match="allowed: increment"):
        make_task("cube", "dev", 0, 1)
    with pytest.raises(ValueError, match="unknown family"):
        parse_families("double,cube")
    assert parse_families("even,double") == ("double", "even")
    assert parse_families("") == FAMILY_NAMES


def test_task_by_id_round_trip():
    for task in frozen_tasks("confirm", 2):
        assert task_by_id(task.task_id) == task
    with pytest.raises(ValueError):
        task_by_id("nonsense")


# --------------------------------------------------------------------------- splits kept as they were


def split_sha256(split: str, per_family: int = 8) -> str:
    rows = [[t.task_id, t.family, t.entry_point, t.prompt, t.reference_completion,
             [[repr(c.arguments), repr(c.expected), list(c.list_arguments)] for c in t.cases]]
            for t in frozen_tasks(split, per_family)]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def test_existing_splits_keep_their_exact_tasks():
    # Prompts, references and hidden cases of the four original splits, hashed when holdout was added.
    assert {s: split_sha256(s) for s in ("dev", "final", "rl", "confirm")} == {
        "dev": "cec219c3902497753fbbbeea203c00a159752ab5f5d81bdadcdb49e216c4fc85",
        "final": "0b0e2996227fc6111fac407d3e5a869ea547e853da159b44015c944f17a22ce0",
        "rl": "f9042865f07810d94424809741a4abfedad7206c165e7c0dff496805282a1c74",
        "confirm": "587743014b20bf191aee2adccb0cc7a9826854f82a2254fe8eae340cc418433a",
    }


def test_sealed_splits():
    assert ORIGINAL_SEALED_SPLITS == ("final", "confirm", "holdout")
    assert set(ORIGINAL_SEALED_SPLITS) < set(SPLIT_SEEDS) and "dev" not in SEALED_SPLITS and "rl" not in SEALED_SPLITS
    # both suites' sealed splits are opened through the ledger
    assert SEALED_SPLITS == ORIGINAL_SEALED_SPLITS + ("compositions.unseen_structures", "compositions.new_constants")


def test_holdout_is_disjoint_from_every_other_split_and_the_pretraining_stream():
    holdout = frozen_tasks("holdout", 64)
    assert [t.family for t in holdout[::64]] == list(FAMILY_NAMES)
    assert holdout[0].task_id == "holdout-increment-000" and task_by_id("holdout-list_sum-063") == holdout[-1]
    prompts = {t.prompt for t in holdout}
    named = {(t.family, t.entry_point) for t in holdout}
    assert len(prompts) == len(named) == 512
    for split in ("dev", "final", "rl", "confirm"):
        others = frozen_tasks(split, 64)
        assert not prompts & {t.prompt for t in others}, split
        assert not named & {(t.family, t.entry_point) for t in others}, split
    # the examples pretraining reads (400 steps x 32 of the flash recipe, with room to spare)
    assert not prompts & {pretraining_task(i).prompt for i in range(20_000)}


# --------------------------------------------------------------------------- strong tests


def test_strong_cases_are_fixed_and_start_with_the_three_cases():
    rows = {f: [[repr(c.arguments), repr(c.expected), list(c.list_arguments)] for c in strong_cases(f)]
            for f in FAMILY_NAMES}
    assert hashlib.sha256(json.dumps(rows).encode()).hexdigest() == \
        "98d5759c543d413117f9233489ad25a382d5207f7d36856000183452a01efbe4"
    for family in FAMILIES:
        cases = strong_cases(family.name)
        assert cases is strong_cases(family.name) and cases is strong_cases(family)  # one object: encoded once
        assert cases[:3] == family.cases and len(cases) - 3 >= STRONG_EXTRA_MIN
        extra_inputs = [c.arguments for c in cases[3:]]
        assert len(set(map(repr, extra_inputs))) == len(extra_inputs)  # no duplicates
        assert not set(map(repr, extra_inputs)) & {repr(c.arguments) for c in family.cases}


def test_strong_cases_cover_the_edges_each_input_type_allows():
    for family in FAMILIES:
        inputs = [c.arguments[0] for c in strong_cases(family.name)]
        if family.argument == "x":
            assert 0 in inputs and min(inputs) < -2**63 and max(inputs) > 2**64 and all(type(v) is int for v in inputs)
        elif family.argument == "text":
            assert "" in inputs and max(map(len, inputs)) >= 1000 and any(not v.isascii() for v in inputs)
        else:
            assert () in inputs and max(map(len, inputs)) >= 250 and any(min(v, default=0) < -10**17 for v in inputs)


def test_strong_tasks_keep_everything_but_the_cases():
    for task in frozen_tasks("holdout", 1):
        strong = strong_task(task)
        assert (strong.task_id, strong.prompt, strong.entry_point) == (task.task_id, task.prompt, task.entry_point)
        assert strong.cases == strong_cases(task.family) and task.cases == strong.cases[:3]
        assert run_in_process(strong, task.reference_source) == len(strong.cases)


# Wrong programs that pass the three cases; the strong set catches every one.
FALSE_PASSES = {
    "increment": "return x + 1 if x < 50 else x",
    "double": "return x * 2 if x < 10 else x + 6",
    "square": "return x * x if x < 6 else 25",
    "absolute": "return -x if x < -5 else x",
    "nonnegative": "return x if x > 0 else 0 if x > -1000 else x",
    "even": "return x % 2 == 0 if x < 10 else True",
    "reverse": "return text[::-1] if len(text) < 6 else text",
    "list_sum": "return sum(values[:3])",
}


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_strong_cases_catch_programs_that_pass_the_three(family):
    task = frozen_tasks("confirm", 1, (family,))[0]
    source = task.prompt + "\n    " + FALSE_PASSES[family] + "\n"
    assert run_in_process(task, source) == 3
    strong = strong_task(task)
    assert run_in_process(strong, source) < len(strong.cases)


def test_a_family_is_one_function_whichever_description_a_task_carries():
    """Recomputed from the task functions themselves (each task's reference run on its family's strong
    inputs): the two descriptions of a family compute the same function and no two families do, so the 24
    confirm and 96 holdout tasks of the headline's three trained families are 3 units, not 6, and every
    task's unit is its function's."""
    from glm53_flash.tasks.families import function_of

    trained = ("increment", "double", "even")
    for split, per_family in (("confirm", 8), ("holdout", 32)):
        tasks = frozen_tasks(split, per_family, trained)
        descriptions = {(t.family, t.prompt.splitlines()[1]) for t in tasks}
        functions = {function_of(t) for t in tasks}
        assert len(tasks) == 3 * per_family and len(descriptions) == 6  # both descriptions of every family
        assert len(functions) == len({t.unit for t in tasks}) == 3
        assert all(function_of(a) == function_of(b) for a in tasks for b in tasks if a.family == b.family)
        assert split_units(split, per_family, trained) == 3
    every = frozen_tasks("dev", 4)
    assert len({function_of(t) for t in every}) == len(FAMILIES) == len({t.unit for t in every})


HEADLINE_DOCS = ("README.md", "docs/*.md", "results/*/REPORT.md")


def test_no_document_claims_more_units_for_the_headlines_benchmark_than_its_functions_give():
    """Every unit count that README, a doc or a study report states in a sentence about the confirm or
    holdout split of the trained families is at most the count recomputed from the task functions (3)."""
    from pathlib import Path

    from glm53_flash.tasks.families import function_of
    from unit_claims import claimed_unit_counts

    repo = Path(__file__).resolve().parents[1]
    trained = ("increment", "double", "even")
    units = max(len({function_of(t) for t in frozen_tasks(split, n, trained)}) for split, n in (("confirm", 8),
                                                                                                  ("holdout", 32)))
    assert units == 3
    assert claimed_unit_counts("On the confirm split 6 of 6 units went up (sign-flip p 0.0312).")[0][0] > units
    claims = [(path.relative_to(repo), count, sentence) for pattern in HEADLINE_DOCS for path in sorted(repo.glob(pattern))
              for count, sentence in claimed_unit_counts(path.read_text(encoding="utf-8"))]
    assert claims, "the headline's report states its unit count"
    assert [claim for claim in claims if claim[1] > units] == []


def test_the_tasks_api_builds_a_sealed_split_only_for_its_opening(tmp_path, monkeypatch):
    """Through glm53_flash.tasks a sealed split's tasks (prompts and tests) need an opening of that split,
    granted by the ledger; its task ids and unit count need none; other splits need none."""
    from glm53_flash import tasks
    from glm53_flash.evaluation import ledger

    for call in (lambda **kw: tasks.frozen_tasks("confirm", 2, **kw), lambda **kw: tasks.split_tasks("holdout", 2, **kw),
                 lambda **kw: tasks.task_by_id("final-double-000", **kw),
                 lambda **kw: tasks.split_tasks("compositions.new_constants", **kw)):
        with pytest.raises(tasks.SealedSplitError, match="is a sealed split: its tasks are built only for an opening"):
            call()
    with ledger.require_open("holdout", "a test of the tasks api") as opening:
        opening.activate()
        with pytest.raises(tasks.SealedSplitError):
            tasks.frozen_tasks("confirm", 2, opening=opening)  # an opening of another split
        assert tasks.split_tasks("holdout", 2, opening=opening) == frozen_tasks("holdout", 2)
    assert tasks.split_task_ids("holdout", 2) == [t.task_id for t in frozen_tasks("holdout", 2)]
    assert tasks.split_units("confirm", 2) == len({t.unit for t in frozen_tasks("confirm", 2)})
    assert tasks.frozen_tasks("dev", 2) == frozen_tasks("dev", 2)  # unsealed: no opening needed
