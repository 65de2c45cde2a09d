import pytest

from glm53_flash.tasks import (
    FAMILIES, FAMILY_NAMES, SPLIT_SEEDS, frozen_tasks, make_task, parse_families, pretraining_task,
    pretraining_text, task_by_id,
)

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
    with pytest.raises(ValueError, match="allowed: dev, final, rl, confirm"):
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
