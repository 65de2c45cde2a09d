"""The pretraining-switches study (`glm53 experiment pretrain-switches`): its factors are exactly the switches
that differ between the arms, its design is a balanced two-level factorial, its statistics recover a known
effect and let a null one be, its decision and confirmation follow the plan's rule, and it runs end to end
on a tiny model with one opening of the sealed split."""

from __future__ import annotations

import itertools
import json
import math
import random

import pytest

from glm53_flash.cli import main
from glm53_flash.core.stats import factorial_effects
from glm53_flash.evaluation.ledger import ledger_lines, opened_lines, read_ledger
from glm53_flash.experiments import generalisation as gen
from glm53_flash.experiments import pretrain_switches as ps
from glm53_flash.experiments.reproduce import ARMS
from glm53_flash.experiments.study import load_receipts, plan_hash
from glm53_flash.model.config import ModelConfig
from glm53_flash.tasks import compositions

TINY = {"preset": "tiny", "steps": 12, "learning_rate": 3e-3, "warmup": 0, "batch_size": 4}


def _plan(**changes):
    options = dict(seeds=(1, 2, 3), fraction="full", pretrain=TINY, dev_tasks=40, sealed_tasks=30, precision="fp32",
                   workers=1, speed=None)
    return ps.build_plan(**(options | changes))


def test_the_factors_are_the_pretraining_switches_the_arms_differ_in():
    table = ps.factors()
    faithful = ARMS["faithful"]
    named = set(faithful["model_overrides"]) | set(faithful["pretrain"])
    # the faithful arm names the stream mode too, but its value is ours: no factor
    assert ModelConfig().stream_mode == faithful["model_overrides"]["stream_mode"]
    assert set(table) == named - {"stream_mode"} == {"linear_rope", "balance_loss", "decay_all_parameters"}
    for name, values in table.items():
        assert values["ours"] != values["original"]
        assert values["original"] == {**faithful["model_overrides"], **faithful["pretrain"]}[name]
    assert list(table) == sorted(table)  # the bits of a point follow this order, as plan.json's sorted keys do


@pytest.mark.parametrize("fraction,k", [("full", 3), ("full", 4), ("half", 4), ("half", 5)])
def test_the_design_is_balanced_and_orthogonal(fraction, k):
    names = [f"s{i}" for i in range(k)]
    points = ps.design_points(fraction, names)
    assert len(points) == len(set(points)) == 2 ** k // (2 if fraction == "half" else 1)
    assert "0" * k in points
    columns = [[2 * int(p[i]) - 1 for p in points] for i in range(k)]
    for column in columns:
        assert sum(column) == 0  # each switch at each value in half the runs
    for a, b in itertools.combinations(columns, 2):
        assert sum(x * y for x, y in zip(a, b)) == 0  # main effects estimated independently of each other


def test_the_half_fraction_is_refused_where_it_would_alias_main_effects_with_pairs():
    with pytest.raises(ValueError, match="at least four"):
        ps.design_points("half", ["a", "b", "c"])
    with pytest.raises(ValueError, match="fraction"):
        ps.design_points("quarter", ["a", "b", "c"])


def test_every_point_sets_every_switch_and_the_arms_are_points():
    table = ps.factors()
    assert ps.point_switches("000", table) == {"model_overrides": {"balance_loss": "differentiable",
                                                                   "linear_rope": "none"},
                                               "pretrain": {"decay_all_parameters": False}}
    faithful = ARMS["faithful"]
    got = ps.point_switches("111", table)
    assert got["pretrain"] == faithful["pretrain"]
    assert all(faithful["model_overrides"][k] == v for k, v in got["model_overrides"].items())
    with pytest.raises(ValueError, match="bits"):
        ps.point_switches("11", table)


def test_the_plan_states_power_before_the_runs_and_names_its_rule():
    plan = _plan()
    design = plan["design"]
    assert list(design["points"]) == ps.design_points("full", sorted(design["factors"]))
    assert design["points"]["000"] == "ours" and design["points"]["111"] == "faithful"
    assert len(plan["units"]) == 2 * 8 * 3
    assert {u["split"] for u in plan["units"] if u["phase"] == "sealed"} == {ps.SEALED_SPLIT}
    runs = next(v for k, v in plan["power"].items() if k.startswith("over runs"))
    assert runs["runs"] == 24 and runs["df"] == 24 - 3 - 3 and runs["alpha"] == pytest.approx(0.05 / 3)
    assert runs["mdd_points"] == pytest.approx(100 * runs["mdd_in_sd"] * ps.ASSUMED_RUN_SD)
    assert "default of glm53 pretrain" in plan["analysis"]["default_rule"]
    with pytest.raises(ValueError, match="seeds"):
        _plan(seeds=(1, 1))


def test_factorial_effects_recover_an_additive_model_and_its_standard_error():
    rng = random.Random(4)
    runs = []
    for block, (a, b, c) in itertools.product(range(4), itertools.product((0, 1), repeat=3)):
        runs.append({"block": block, "levels": {"a": a, "b": b, "c": c},
                     "value": 10 * block + 3 * a - 2 * c + rng.gauss(0, 0.5)})
    fitted = factorial_effects(runs, ["a", "b", "c"])
    assert fitted["df"] == 32 - 4 - 3
    for name, true in (("a", 3), ("b", 0), ("c", -2)):
        effect = fitted["effects"][name]
        # balanced: the difference of the two groups' means, whatever the blocks add
        high = [r["value"] for r in runs if r["levels"][name]]
        low = [r["value"] for r in runs if not r["levels"][name]]
        assert effect["estimate"] == pytest.approx(sum(high) / 16 - sum(low) / 16)
        assert effect["se"] == pytest.approx(2 * fitted["residual_sd"] / math.sqrt(32))
        assert effect["interval"][0] < true < effect["interval"][1]
    assert fitted["effects"]["a"]["p"] < 1e-10 and fitted["effects"]["b"]["p"] > 0.01
    with pytest.raises(ValueError, match="level of 0 or 1"):
        factorial_effects([{"block": 0, "levels": {"a": 2}, "value": 1.0}], ["a"])


def _hand_receipts(plan, effect_of_rope: int, sealed_effect: int | None = None):
    """Dev (and sealed) receipts of every run: a behaviour passes when its index is below a threshold
    that rises by `effect_of_rope` behaviours for runs with the original's linear_rope, plus a little
    noise per run; the other switches do nothing."""
    design = plan["design"]
    names = sorted(design["factors"])
    rope = names.index("linear_rope")
    dev = gen.task_subset(gen.DEV_SPLIT, design["subset_sizes"]["dev"])
    sealed = gen.task_subset(ps.SEALED_SPLIT, design["subset_sizes"]["sealed"])
    rng = random.Random(0)
    receipts = []
    sha = plan_hash(plan)
    for seed in design["seeds"]:
        for point in design["points"]:
            noise = rng.choice([-1, 0, 1])
            passing = 10 + noise + (effect_of_rope if point[rope] == "1" else 0)
            receipts.append({"phase": "dev", "point": point, "seed": seed, "plan_sha256": sha,
                             "checkpoint": {"path": f"ckpt-{point}-{seed}", "weights_sha256": "x"},
                             "evaluation": {"outcomes": {t: [i < passing, i < passing] for i, t in enumerate(dev)}}})
            if sealed_effect is not None:
                passing = 8 + noise + (sealed_effect if point[rope] == "1" else 0)
                receipts.append({"phase": "sealed", "point": point, "seed": seed, "plan_sha256": sha,
                                 "task_ids": sealed, "passed": gen._bits(i < passing for i in range(len(sealed))),
                                 "strong_passed": gen._bits(i < passing for i in range(len(sealed)))})
    return receipts


def test_a_real_effect_is_shown_at_both_levels_decides_the_default_and_is_confirmed():
    plan = _plan()
    receipts = _hand_receipts(plan, effect_of_rope=8, sealed_effect=6)
    summary = ps.compute(plan, receipts)
    rows = {row["switch"]: row for row in summary["dev"]["switches"]}
    assert rows["linear_rope"]["verdict"] == "original better"
    assert rows["linear_rope"]["effect"] == pytest.approx(8 / 40, abs=0.02)  # the runs' noise aside
    # tested over the dev tasks' structure groups (each the mean of its behaviours); behaviours a secondary view
    dev = gen.task_subset(gen.DEV_SPLIT, 40)
    groups = compositions.structure_groups(dev)
    assert rows["linear_rope"]["groups"]["n"] == len(set(groups.values())) and rows["linear_rope"]["behaviours"]["n"] == 40
    assert set(rows["linear_rope"]["holm"]) == {"groups_p", "runs_p"}
    assert rows["balance_loss"]["verdict"] == rows["decay_all_parameters"]["verdict"] == "not shown"
    assert summary["selection"]["changed"] == {"linear_rope": "rope-before-feature-map"}
    assert summary["selection"]["defaults"]["balance_loss"] == "differentiable"
    assert summary["confirmation"]["directions"]["linear_rope"]["confirmed"]
    assert summary["complete"]
    # the same direction absent on the sealed split: not confirmed
    summary = ps.compute(plan, _hand_receipts(plan, effect_of_rope=8, sealed_effect=0))
    assert not summary["confirmation"]["directions"]["linear_rope"]["confirmed"]


def test_no_effect_changes_no_default_and_an_incomplete_phase_answers_nothing():
    plan = _plan()
    receipts = _hand_receipts(plan, effect_of_rope=0)
    summary = ps.compute(plan, receipts)
    assert all(row["verdict"] == "not shown" for row in summary["dev"]["switches"])
    assert summary["selection"]["changed"] == {} and summary["sealed"] is None and not summary["complete"]
    assert ps.compute(plan, receipts[:-1])["dev"] is None


def test_a_rerun_of_the_factorial_holds_where_both_agree_and_measures_the_difference_of_main_effects():
    """Two factorial studies on disjoint seeds: the row of a switch both show holds, with the difference of its
    main effects near zero and its interval from one fit over both; a rerun without the effect does not hold
    and its difference is the first's effect; the spread's arithmetic equals the two studies' own effects."""
    first = _plan()
    first["plan_sha256"] = plan_hash(first)
    same, absent = _plan(seeds=(4, 5, 6)), _plan(seeds=(4, 5, 6))
    same["plan_sha256"] = absent["plan_sha256"] = plan_hash(same)
    a = _hand_receipts(first, effect_of_rope=8, sealed_effect=6)
    held = ps.compare_rerun(first, a, same, _hand_receipts(same, effect_of_rope=8, sealed_effect=6))
    assert set(held["phases"]) == {"dev", "sealed"} and held["phases"]["dev"]["all_hold"]
    rope = next(r for r in held["phases"]["dev"]["rows"] if r["switch"] == "linear_rope")
    assert rope["directions"] == {"groups": ["+", "+"], "runs": ["+", "+"]}
    # the spread is exactly the rerun's main effect minus the first's (a balanced design), with an interval
    assert rope["spread"]["difference"] == pytest.approx(rope["rerun"]["effect"] - rope["first"]["effect"], abs=1e-12)
    low, high = rope["spread"]["interval"]
    assert low < rope["spread"]["difference"] < high and rope["spread"]["df"] == 48 - 6 - 3 - 3
    assert rope["pooled"]["verdict"] == "original better"
    lost = ps.compare_rerun(first, a, absent, _hand_receipts(absent, effect_of_rope=0))
    assert set(lost["phases"]) == {"dev"}  # the rerun has not opened its sealed split
    rope = next(r for r in lost["phases"]["dev"]["rows"] if r["switch"] == "linear_rope")
    assert not rope["holds"] and rope["rerun"]["verdict"] == "not shown"
    assert rope["spread"]["difference"] == pytest.approx(rope["rerun"]["effect"] - rope["first"]["effect"], abs=1e-12)
    assert rope["spread"]["difference"] < -0.1 and not rope["spread"]["equivalent"]
    lines = ps.rerun_report_lines(lost, "first")
    assert any(line.startswith("| linear_rope |") and "| NO (+/0, +/0) |" in line for line in lines)
    with pytest.raises(ValueError, match="disjoint"):
        ps.compare_rerun(first, a, first, a)
    with pytest.raises(ValueError, match="subset_sizes"):
        ps.check_rerun_design(first, _plan(seeds=(4, 5, 6), dev_tasks=30))


def _args(out, *extra):
    return ["experiment", "pretrain-switches", "--output", str(out), "--preset", "tiny", "--steps", "12",
            "--learning-rate", "3e-3", "--warmup", "0", "--batch-size", "4", "--seeds", "1", "--dev-tasks", "5",
            "--sealed-tasks", "4", "--workers", "1", "--precision", "fp32", "--quiet", *extra]


@pytest.mark.slow
def test_end_to_end_dev_decision_then_one_opening_of_the_sealed_split(tmp_path, capsys, private_ledger, one_thread):
    out = tmp_path / "study"
    assert main(_args(out)) == 0
    err = capsys.readouterr().err
    assert "over runs" in err and "estimated" in err and "pass --open-sealed" in err
    done = {r["unit"]["key"]: r for r in load_receipts(out)}
    assert sorted(done) == [f"dev-{p}-seed-1" for p in ps.design_points("full", sorted(ps.factors()))]
    assert done["dev-010-seed-1"]["switches"] == ps.point_switches("010", ps.factors())
    assert not private_ledger.exists()
    selection = json.loads((out / "selection.json").read_text())
    assert selection["plan_sha256"] == json.loads((out / "plan.json").read_text())["plan_sha256"]
    kept = done["dev-111-seed-1"]["checkpoint"]
    assert (tmp_path / "study" / "checkpoints" / "dev-111-seed-1").is_dir() and kept["step"] == 12

    assert main(_args(out, "--open-sealed", "test of the study")) == 0
    done = {r["unit"]["key"]: r for r in load_receipts(out)}
    assert len(done) == 16 and json.loads((out / "plan.json").read_text())["status"] == "complete"
    sealed = done["sealed-111-seed-1"]
    assert sealed["checkpoint"] == kept and len(sealed["passed"]) == 4
    assert sealed["sealed_opening"]["split"] == ps.SEALED_SPLIT
    lines = ledger_lines(None, private_ledger)
    assert len(lines) == 8 and len({line["plan_sha256"] for line in lines}) == 1  # one opening for the plan
    (opened,) = opened_lines(None, private_ledger)
    assert [d["path"].rsplit("/", 1)[-1] for d in opened["decision"]] == ["plan.json", "selection.json"]

    (out / "runs" / "sealed-000-seed-1.json").unlink()  # a lost receipt: evaluating it again is a reopening
    assert main(_args(out, "--open-sealed", "test of the study")) == 2
    assert "already opened" in capsys.readouterr().err
    assert main(["analyze", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dev"] is not None and summary["sealed"] is None  # one sealed run is missing
    assert (out / "effects.png").stat().st_size > 5_000 and "## Main effects on dev" in (out / "REPORT.md").read_text()


def test_a_planned_rerun_is_checked_against_the_first_study_before_anything_runs(tmp_path, capsys, monkeypatch):
    """--rerun-of refuses a rerun whose design differs from the first study's (here: the precision that `auto`
    would resolve otherwise on another machine) or whose seeds overlap, before the machine is timed or the
    study directory is written; a true rerun is planned as usual."""
    first = tmp_path / "first"
    first.mkdir()
    draft = ps.build_plan(seeds=(1,), fraction="full", pretrain=TINY, dev_tasks=5, sealed_tasks=4, precision="fp32",
                          workers=1, speed=None)
    (first / "plan.json").write_text(json.dumps(draft))
    timed = []
    monkeypatch.setattr(ps, "measure_speed", lambda design, device="cpu": timed.append(design) or
                        {"seconds_per_step": 0.01, "seconds_per_eval_task": 0.01, "probe": "a test's"})
    rerun = tmp_path / "rerun"

    def plan(*extra):  # a later flag overrides _args' own (--seeds 1, --precision fp32)
        return main(_args(rerun, "--plan-only", "--rerun-of", str(first), *extra))

    assert plan("--precision", "bf16", "--seeds", "2") == 2
    err = capsys.readouterr().err
    assert f"not a rerun of {first}" in err and "differ in more than their pretraining seeds: precision" in err
    assert plan("--seeds", "1") == 2
    assert "disjoint pretraining seeds; both studies have [1]" in capsys.readouterr().err
    assert not rerun.exists() and not timed
    assert plan("--seeds", "2") == 0
    assert json.loads((rerun / "plan.json").read_text())["design"]["seeds"] == [2] and len(timed) == 1
    from glm53_flash.experiments.registry import STUDIES
    from glm53_flash.experiments.runner import check_planned_rerun

    with pytest.raises(FileNotFoundError, match="no plan.json"):
        check_planned_rerun(STUDIES[ps.STUDY], tmp_path / "nowhere", draft)
    with pytest.raises(ValueError, match="`pretraining-data` studies have no rerun comparison"):
        check_planned_rerun(STUDIES["pretraining-data"], first, {**draft, "study": "pretraining-data"})
    with pytest.raises(ValueError, match="is a 'pretrain-switches' study; reruns compare `rl-generalisation`"):
        check_planned_rerun(STUDIES["rl-generalisation"], first, {**draft, "study": "rl-generalisation"})


@pytest.mark.slow
def test_rl_switches_take_the_arms_runs_of_a_pretrain_switches_study(tmp_path, capsys, monkeypatch, one_thread):
    """The RL-switch study on disjoint pretraining seeds: its source may be this study, whose ours (000) and
    faithful (111) runs are the arms' pretraining; the RL recipe is the rl-generalisation study's."""
    from dataclasses import replace

    source = tmp_path / "study"
    assert main(_args(source)) == 0
    monkeypatch.setattr(gen, "RL_RECIPE", replace(gen.RL_RECIPE, groups=2, group_size=2, checkpoints=(1,)))
    out = tmp_path / "switches"
    assert main(["experiment", "rl-switches", "--source", str(source), "--output", str(out), "--rl-seeds", "3",
                 "--switches", "eos_handling", "--dev-tasks", "5", "--workers", "1", "--quiet"]) == 0
    plan = json.loads((out / "plan.json").read_text())
    arms = {r["unit"]["key"]: r for r in load_receipts(source)}
    assert plan["design"]["source"]["study"] == ps.STUDY and plan["design"]["rl"]["groups"] == 2
    assert plan["design"]["checkpoints"]["ours-1"]["weights_sha256"] == arms["dev-000-seed-1"]["checkpoint"]["weights_sha256"]
    assert plan["design"]["checkpoints"]["faithful-1"]["checkpoint"] == arms["dev-111-seed-1"]["checkpoint"]["path"]
    assert len(load_receipts(out)) == 4
    capsys.readouterr()
    bad = tmp_path / "not-a-study"
    bad.mkdir()
    assert main(["experiment", "rl-switches", "--source", str(bad), "--output", str(tmp_path / "x"), "--quiet"]) == 2
    assert "pretrain-switches" in capsys.readouterr().err
