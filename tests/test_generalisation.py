"""The RL-generalisation study (`glm53 experiment rl-generalisation`): its plan, its phases end to end on a
tiny model, the ledger's one opening per (arm, seed) and sealed split, and its analysis on receipts whose
answer is known."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from glm53_flash.cli import main
from glm53_flash.evaluation.ledger import ledger_lines, opened_lines, read_ledger
from glm53_flash.experiments import generalisation as gen
from glm53_flash.experiments.study import load_receipts, plan_hash
from glm53_flash.tasks import compositions, split_task_ids
from glm53_flash.train.config import RLConfig

TINY_RL = replace(gen.RL_RECIPE, groups=2, group_size=2, checkpoints=(1,))
TINY_PRETRAIN = {"preset": "tiny", "steps": 12, "checkpoints": (6,), "learning_rate": 3e-3, "warmup": 0,
                 "batch_size": 4}


def _plan(**changes):
    options = dict(arms=("faithful", "ours"), seeds=(1, 2, 3), rl_seeds=(7, 8), rewards=gen.REWARDS,
                   pretrain=TINY_PRETRAIN, rl=TINY_RL, dev_tasks=5, sealed_tasks=6, precision="fp32", workers=1,
                   speed=None)
    return gen.build_plan(**(options | changes))


@pytest.mark.slow
def test_task_subsets_are_fixed_spread_and_need_no_opening():
    ids = split_task_ids(compositions.UNSEEN_SPLIT)
    subset = gen.task_subset(compositions.UNSEEN_SPLIT, 40)
    assert len(subset) == 40 and subset == gen.task_subset(compositions.UNSEEN_SPLIT, 40)
    assert set(subset) <= set(ids) and subset == [i for i in ids if i in set(subset)]  # the split's order
    positions = [ids.index(i) for i in subset]
    assert positions[0] < len(ids) // 4 and positions[-1] > 3 * len(ids) // 4  # spread, not the first 40
    assert gen.task_subset(compositions.DEV_SPLIT, None) == split_task_ids(compositions.DEV_SPLIT)
    with pytest.raises(ValueError, match=">= 1"):
        gen.task_subset(compositions.DEV_SPLIT, 0)


@pytest.mark.slow
def test_plan_has_every_unit_and_states_its_power():
    plan = _plan()
    phases = [u["phase"] for u in plan["units"]]
    assert phases.count("pretrain") == 2 * 3 and phases.count("rl") == 2 * 3 * 2 * 2
    assert phases.count("sealed") == 2 * 3 * 2  # two sealed splits per (arm, seed)
    assert len({u["key"] for u in plan["units"]}) == len(plan["units"])
    assert plan["design"]["sealed_tasks"] == {split: 6 for split in compositions.SEALED}
    assert plan["design"]["arm_switches"]["faithful"]["rl"]["logprob_source"] == "untempered"
    # the power over structure groups: the groups of the six sealed tasks, and all 241 of the split
    power = plan["power"][f"RL gain on {compositions.UNSEEN_SPLIT}"]
    six = compositions.structure_groups(gen.task_subset(compositions.UNSEEN_SPLIT, 6))
    assert power["units"] == len(set(six.values())) and power["seeds"] == 3 and power["mdd_seeds"] > 0
    assert power["unit"] == "structure groups"
    full = _plan(sealed_tasks=None)["power"][f"RL gain on {compositions.UNSEEN_SPLIT}"]
    every = compositions.structure_groups(split_task_ids(compositions.UNSEEN_SPLIT))
    assert full["units"] == len(set(every.values())) < len(every) and full["mdd_units"] < 0.1
    assert plan["estimate"]["expected_minutes"] is None
    timed = _plan(speed={"seconds_per_step": 1.0, "seconds_per_rollout": 0.0, "seconds_per_eval_task": 0.0})
    assert timed["estimate"]["expected_minutes"] == round(6 * 12 / 60, 1)
    assert plan_hash(timed) == plan_hash(plan)  # the estimate is not the design


@pytest.mark.parametrize("change, message", [
    ({"arms": ("ours", "mine")}, "unknown arm"), ({"rewards": ("three", "sample")}, "unknown reward"),
    ({"seeds": (1, 1)}, "without repeats"), ({"rl_seeds": ()}, "without repeats"),
    ({"pretrain": TINY_PRETRAIN | {"checkpoints": (20,)}}, "checkpoints must lie"),
])
def test_plan_refuses_bad_designs(change, message):
    with pytest.raises(ValueError, match=message):
        _plan(**change)


def test_a_sealed_unit_without_its_opening_is_refused():
    unit = {"key": "sealed-unseen-ours-seed-1", "phase": "sealed", "arm": "ours", "seed": 1,
            "split": compositions.UNSEEN_SPLIT, "design": _plan()["design"], "checkpoints": {}}
    with pytest.raises(ValueError, match="needs an opening"):
        gen.run_unit(unit)


def _study_args(out, *extra):
    return ["experiment", "rl-generalisation", "--output", str(out), "--preset", "tiny", "--steps", "12",
            "--checkpoints", "6", "--learning-rate", "3e-3", "--warmup", "0", "--batch-size", "4", "--groups", "2",
            "--group-size", "2", "--rl-checkpoints", "1", "--seeds", "1", "--rl-seeds", "7", "--dev-tasks", "5",
            "--sealed-tasks", "4", "--workers", "1", "--precision", "fp32", "--quiet", *extra]


@pytest.mark.slow
def test_study_end_to_end_opens_each_sealed_split_once_per_arm_and_seed(tmp_path, capsys, private_ledger,
                                                                      one_thread):
    out = tmp_path / "study"
    # without --open-sealed every run trains and is selected, and the study stops before the sealed splits
    assert main(_study_args(out)) == 0
    err = capsys.readouterr().err
    assert "smallest detectable difference" in err and "estimated" in err
    assert "is ready; pass --open-sealed" in err
    plan = json.loads((out / "plan.json").read_text())
    # the estimate comes from timed steps (a tiny config on a fast machine can round to 0.0 minutes)
    estimate = plan["estimate"]
    assert plan["status"] == "incomplete" and estimate["expected_minutes"] is not None
    assert min(estimate["seconds_per_step"], estimate["seconds_per_rollout"], estimate["seconds_per_eval_task"]) > 0
    done = {r["unit"]["key"]: r for r in load_receipts(out)}
    assert len(done) == 6 and not any(k.startswith("sealed") for k in done)
    assert not private_ledger.exists()
    # the design pins the faithful arm's RL switches; ours has RLConfig's defaults, so each RL receipt says which
    # values it trained with (a later change of a default cannot pass unnoticed)
    assert done["rl-faithful-seed-1-three-7"]["switches"] == {"logprob_source": "untempered",
                                                              "loss_normalization": "sequence-mean",
                                                              "eos_handling": "omit"}
    defaults = RLConfig(initial_checkpoint="", output="")
    assert done["rl-ours-seed-1-three-7"]["switches"] == {name: getattr(defaults, name) for name in
                                                          ("logprob_source", "loss_normalization", "eos_handling")}
    rl = done["rl-ours-seed-1-strong-7"]
    assert rl["initial_checkpoint"] == done["pretrain-ours-seed-1"]["selection"]["selected"]["checkpoint"]
    assert rl["training"]["reward_hacking"]["rollouts_passing_reward_cases"] >= 0
    selection = done["pretrain-faithful-seed-1"]["selection"]
    assert [c["step"] for c in selection["checkpoints"]] == [6, 12]  # step 0 is not a candidate
    assert len(selection["outcomes"]) == 5

    assert main(_study_args(out, "--open-sealed", "test of the study")) == 0
    done = {r["unit"]["key"]: r for r in load_receipts(out)}
    assert len(done) == 10 and json.loads((out / "plan.json").read_text())["status"] == "complete"
    sealed = done["sealed-unseen-faithful-seed-1"]
    assert set(sealed["evaluations"]) == {"before", "three-7", "strong-7"}
    assert sealed["evaluations"]["before"]["checkpoint"] == \
        done["pretrain-faithful-seed-1"]["selection"]["selected"]["checkpoint"]
    assert sealed["evaluations"]["before"]["weights_sha256"] == \
        done["pretrain-faithful-seed-1"]["selection"]["selected"]["weights_sha256"]
    assert len(sealed["task_ids"]) == len(sealed["structures"]) == 4
    assert all(len(e["passed"]) == len(e["strong_passed"]) == 4 for e in sealed["evaluations"].values())
    assert sealed["sealed_opening"]["split"] == compositions.UNSEEN_SPLIT
    assert len(gen.sealed_outcomes(sealed, "three-7")) == 4
    lines = ledger_lines(None, private_ledger)
    assert len(lines) == 4 and len({line["plan_sha256"] for line in lines}) == 4  # one per (arm, seed, split)
    assert {line["split"] for line in lines} == set(compositions.SEALED)
    assert len(opened_lines(None, private_ledger)) == 4  # each written before its tasks were built

    # a sealed receipt lost: evaluating it again is a second opening for that unit, refused without a reason
    (out / "runs" / "sealed-unseen-faithful-seed-1.json").unlink()
    assert main(_study_args(out, "--open-sealed", "test of the study")) == 2
    assert "already opened" in capsys.readouterr().err
    assert main(_study_args(out, "--open-sealed", "test of the study", "--reopen", "the receipt was deleted")) == 0
    assert len(ledger_lines(None, private_ledger)) == 5 and ledger_lines(None, private_ledger)[-1]["reopen"]
    assert len(opened_lines(None, private_ledger)) == 5

    assert main(["analyze", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] and len(summary["sealed"]) == 2 * 2 * 2
    report = (out / "REPORT.md").read_text()
    assert "## The sealed splits" in report and "](effects.png)" in report
    assert summary["charts"] == {"effects": "effects.png"} and (out / "effects.png").stat().st_size > 10_000


def _outcomes(ids, passed, strong=None):
    strong = passed if strong is None else strong
    return {t: [t in passed, t in strong] for t in ids}


def _sealed_ids(split):
    """Six tasks of `split`: the first two of one structure group, the other four each of a group of its own."""
    ids = split_task_ids(split)
    groups = compositions.structure_groups(ids)
    members = {}
    for task_id in ids:
        members.setdefault(groups[task_id], []).append(task_id)
    pair = next(tasks for tasks in members.values() if len(tasks) >= 2)[:2]
    return pair + [tasks[0] for group, tasks in members.items() if group != groups[pair[0]]][:4]


def _hand_receipts(plan, gains=lambda seed: 2):
    """Receipts of the one-arm, one-RL-seed, three-case plan written by hand: before RL two of six sealed
    behaviours (one structure group) pass the three cases (one the strong set), after RL `gains(seed)` more
    pass each (each of a group of its own)."""
    sha = plan_hash(plan)
    dev = gen.task_subset(compositions.DEV_SPLIT, 5)
    receipts = []
    for seed in plan["design"]["seeds"]:
        receipts.append({"phase": "pretrain", "arm": "ours", "seed": seed, "plan_sha256": sha, "unit": {},
                         "selection": {"outcomes": _outcomes(dev, dev[:1]),
                                       "selected": {"pass_at_1": 0.2, "step": 12, "weights_sha256": f"pre-{seed}"}}})
        receipts.append({"phase": "rl", "arm": "ours", "seed": seed, "reward": "three", "rl_seed": 7,
                         "plan_sha256": sha, "unit": {}, "training": {},
                         "selection": {"outcomes": _outcomes(dev, dev[:3]), "selected": {"weights_sha256": f"rl-{seed}"}}})
        for split in compositions.SEALED:
            ids = _sealed_ids(split)

            def verdicts(passed, strong, weights):
                return {"passed": gen._bits(t in passed for t in ids), "strong_passed": gen._bits(t in strong for t in ids),
                        "weights_sha256": weights}

            gain = gains(seed)
            receipts.append({"phase": "sealed", "arm": "ours", "seed": seed, "split": split, "plan_sha256": sha,
                             "unit": {}, "task_ids": ids, "structures": ["a", "a", "b", "c", "d", "e"], "evaluations": {
                                 "before": verdicts(ids[:2], ids[:1], f"pre-{seed}"),
                                 "three-7": verdicts(ids[:2 + gain], ids[:1 + gain], f"rl-{seed}")}})
    return receipts


def test_analysis_recovers_a_known_effect_at_both_levels(tmp_path):
    """Receipts built by hand: RL solves two more of six behaviours on every seed (one of them only under
    the three cases), and one before-RL pass is false. The summary must give exactly these effects."""
    plan = _plan(arms=("ours",), seeds=(1, 2, 3, 4, 5, 6), rl_seeds=(7,), rewards=("three",), sealed_tasks=6)
    receipts = _hand_receipts(plan)
    summary = gen.compute(plan, receipts)
    assert len(summary["sealed"]) == 2
    row = summary["sealed"][0]
    three, strong = row["three"]["comparison"], row["strong"]["comparison"]
    # over structure groups (the first holds two behaviours, passed before and after; two others are the gains)
    assert row["groups"] == three["units"]["n"] == 5
    assert three["mean_difference"] == pytest.approx(2 / 5)
    # under the strong set one gain is the pair's second behaviour (its group: half) and one a group of its own
    assert strong["mean_difference"] == pytest.approx(1.5 / 5)
    assert three["units"]["positive"] == 2 and three["units"]["negative"] == 0
    assert three["seeds"]["values"] == [pytest.approx(2 / 5)] * 6
    # over behaviours, the secondary view: two of six
    behaviours = row["three"]["behaviours"]
    assert behaviours["units"]["n"] == 6 and behaviours["mean_difference"] == pytest.approx(2 / 6)
    assert row["three"]["holm"]["comparisons"] == 2 and row["three"]["holm"]["verdict"] == "not shown"
    assert row["three"]["before"] == [pytest.approx(2 / 6)] * 6 and row["strong"]["after"] == [pytest.approx(3 / 6)] * 6
    assert row["false_passes"]["before"] == {"passes": 12, "false_passes": 6, "share": 0.5}
    assert row["false_passes"]["after"]["share"] == pytest.approx(0.25)
    assert summary["dev"][0]["comparison"]["mean_difference"] == pytest.approx(2 / 5)
    assert summary["pretraining_on_dev"]["ours"]["sd"] == pytest.approx(0.0)
    # two of five groups, all seeds alike: groups cannot reach p < 0.05 (floor 2/4), so "not shown"
    assert three["verdict"] == "not shown"
    assert all("not shown after Holm over 2 comparisons, at groups and seeds" in line
               for line in gen.answers(plan, summary))
    # a sealed evaluation of other weights than the selected ones is refused, not analysed
    receipts[-1]["evaluations"]["three-7"]["weights_sha256"] = "rl-1"
    with pytest.raises(ValueError, match="not the selected"):
        gen.compute(plan, receipts)


# --------------------------------------------------------------------------- rl-switches


def test_each_variant_flips_one_switch_to_the_other_arms_value():
    from glm53_flash.experiments import rl_switches as sw

    ours, faithful = sw.switch_values("ours"), sw.switch_values("faithful")
    assert all(ours[name] != faithful[name] for name in sw.SWITCHES)  # the arms differ in all three
    assert sw.variant_switches("ours", sw.OWN, "faithful") == ours
    for name in sw.SWITCHES:
        flipped = sw.variant_switches("ours", f"flip-{name}", "faithful")
        assert flipped[name] == faithful[name] and {k: v for k, v in flipped.items() if k != name} == \
            {k: v for k, v in ours.items() if k != name}
    with pytest.raises(ValueError, match="unknown variant"):
        sw.variant_switches("ours", "flip-temperature", "faithful")


def test_rl_switches_refuses_a_source_that_is_not_a_finished_generalisation_study(tmp_path):
    from glm53_flash.experiments import rl_switches as sw

    with pytest.raises(FileNotFoundError, match="rl-generalisation"):
        sw.build_plan(tmp_path, (1,), sw.SWITCHES, 5, 1, None)
    (tmp_path / "plan.json").write_text(json.dumps(_plan() | {"plan_sha256": plan_hash(_plan())}))
    with pytest.raises(ValueError, match="pretraining not finished for faithful seed 1"):
        sw.build_plan(tmp_path, (1,), sw.SWITCHES, 5, 1, None)
    # with --seeds only those seeds' pretraining must be finished (a source still running the rest can serve)
    with pytest.raises(ValueError, match="pretraining not finished for faithful seed 2, ours seed 2;"):
        sw.build_plan(tmp_path, (1,), sw.SWITCHES, 5, 1, None, seeds=(2,))
    (tmp_path / "plan.json").write_text(json.dumps({"study": "rl-choices"}))
    with pytest.raises(ValueError, match="rl-choices"):
        sw.build_plan(tmp_path, (1,), sw.SWITCHES, 5, 1, None)


def test_a_rerun_on_disjoint_seeds_is_compared_row_by_row_and_both_together(tmp_path, capsys):
    """Hand-built studies whose effect is known: the rerun holds when its seeds give the same effect, its
    spread is 0 and within the margin; a rerun whose RL gains nothing does not hold; plans that differ in
    more than their seeds, or share a seed, are refused before anything is written."""
    from glm53_flash.experiments import reruns
    from glm53_flash.experiments.study import write_json

    one = dict(arms=("ours",), rl_seeds=(7,), rewards=("three",), sealed_tasks=6)
    first = _plan(seeds=tuple(range(1, 7)), **one)
    first["plan_sha256"] = plan_hash(first)
    # seed-level sd > 0: the gain is 2 or 3 of six behaviours by seed parity
    varied = lambda seed: 2 + seed % 2  # noqa: E731
    rerun = _plan(seeds=tuple(range(11, 17)), **one)
    rerun["plan_sha256"] = plan_hash(rerun)
    # six behaviours move a seed's effect by 1/6: equivalence here needs a margin of that order
    same = gen.compare_rerun(first, _hand_receipts(first, varied), rerun, _hand_receipts(rerun, varied), margin=0.3)
    row = same["rows"][0]
    assert len(same["rows"]) == 2 and same["all_hold"] and row["holds"]
    assert row["spread"]["difference"] == pytest.approx(0.0, abs=1e-12) and row["spread"]["equivalent"]
    assert row["pooled"]["seeds"] == list(range(1, 7)) + list(range(11, 17))
    assert row["pooled"]["comparison"]["seeds"]["n"] == 12
    # the rerun's RL gains nothing on its seeds: the seeds' direction is lost, and its size is not reproduced
    flat = gen.compare_rerun(first, _hand_receipts(first, varied), rerun, _hand_receipts(rerun, lambda seed: 0),
                          margin=0.3)
    assert not flat["all_hold"] and not flat["rows"][0]["spread"]["equivalent"]
    assert flat["rows"][0]["rerun"]["verdict"] == "not shown" and flat["rows"][0]["directions"]["seeds"][1] == "0"
    with pytest.raises(ValueError, match="disjoint pretraining seeds; both studies have \\[1\\]"):
        gen.compare_rerun(first, [], _plan(seeds=(1, 20), **one) | {"plan_sha256": "x"}, [])
    other = _plan(seeds=(21, 22), **(one | {"sealed_tasks": 5}))
    with pytest.raises(ValueError, match="more than their pretraining seeds: sealed_task_ids_sha256, sealed_tasks, subset_sizes"):
        gen.compare_rerun(first, [], other | {"plan_sha256": "x"}, [])
    # the command: the rerun's directory analysed against the first's, the table in its REPORT.md
    dirs = {}
    for name, plan, gains in (("first", first, varied), ("rerun", rerun, varied)):
        dirs[name] = tmp_path / name
        write_json(dirs[name] / "plan.json", plan)
        for i, receipt in enumerate(_hand_receipts(plan, gains)):
            write_json(dirs[name] / "runs" / f"{i:03d}.json", receipt)
    assert main(["analyze", str(dirs["rerun"]), "--rerun-of", str(dirs["first"])]) == 0
    assert '"every row holds in the rerun": true' in capsys.readouterr().out
    report = (dirs["rerun"] / "REPORT.md").read_text()
    assert "## Against the first study" in report and "| ours | three | unseen |" in report
    assert json.loads((dirs["rerun"] / "summary.json").read_text())["rerun"]["margin"] == reruns.RERUN_MARGIN
    # a study that is no rl-generalisation study cannot be the first of a rerun
    (dirs["first"] / "plan.json").write_text(json.dumps(first | {"study": "rl-switches"}))
    assert main(["analyze", str(dirs["rerun"]), "--rerun-of", str(dirs["first"]), "--force"]) == 2
    assert "reruns compare `rl-generalisation` studies" in capsys.readouterr().err


def test_an_answer_states_a_result_only_after_the_studys_holm_correction():
    """A direction is stated only as it holds after Holm over the study's comparisons at the levels named,
    never per comparison: the phrase, and every answer of the committed study."""
    from glm53_flash.experiments.study import after_holm

    assert after_holm("RL raises it", 8, "groups and seeds") == \
        "RL raises it, shown after Holm over 8 comparisons, at groups and seeds"
    assert after_holm("not shown", 1, "groups and RL seeds") == \
        "not shown after Holm over 1 comparison, at groups and RL seeds"
    summary = json.loads((Path(__file__).resolve().parents[1] / "results" / "rl-generalisation" / "summary.json")
                         .read_text())
    assert len(summary["answers"]) == 8
    assert all("after Holm over 8 comparisons, at groups and seeds" in line for line in summary["answers"])
    for line, row in zip(summary["answers"], summary["sealed"]):
        assert ("not shown after" in line) == (row["strong"]["holm"]["verdict"] == "not shown")


def test_rl_switches_uses_only_seeds_whose_checkpoints_remain_and_states_power_under_holm(tmp_path):
    """A source study's selected checkpoints live in its uncommitted work directory: a plan that needs one
    that is gone is refused before anything runs, naming the seeds that can still be used."""
    from glm53_flash.experiments import rl_switches as sw

    plan = _plan()
    sha = plan_hash(plan)
    (tmp_path / "plan.json").write_text(json.dumps(plan | {"plan_sha256": sha}))
    (tmp_path / "runs").mkdir()
    for arm in ("faithful", "ours"):
        for seed in (1, 2, 3):
            weights = tmp_path / "work" / f"{arm}-{seed}"
            if seed != 2:  # seed 2's checkpoints were lost
                weights.mkdir(parents=True)
            receipt = {"plan_sha256": sha, "phase": "pretrain", "arm": arm, "seed": seed,
                       "unit": {"key": f"pretrain-{arm}-seed-{seed}"},
                       "selection": {"selected": {"checkpoint": str(weights), "weights_sha256": f"{arm}{seed}",
                                                  "step": 6}}}
            (tmp_path / "runs" / f"pretrain-{arm}-seed-{seed}.json").write_text(json.dumps(receipt))
    with pytest.raises(FileNotFoundError, match=r"faithful-2, ours-2 are no longer on disk.*--seeds 1,3"):
        sw.build_plan(tmp_path, (1,), sw.SWITCHES, 5, 1, None)
    for bad in ((4,), (1, 1), ()):
        with pytest.raises(ValueError, match="--seeds must be distinct pretraining seeds"):
            sw.build_plan(tmp_path, (1,), sw.SWITCHES, 5, 1, None, seeds=bad)
    subset = sw.build_plan(tmp_path, (1,), sw.SWITCHES, 5, 1, None, seeds=(1, 3))
    assert subset["design"]["seeds"] == [1, 3] and sorted(subset["design"]["checkpoints"]) == \
        ["faithful-1", "faithful-3", "ours-1", "ours-3"]
    assert {u["seed"] for u in subset["units"]} == {1, 3} and len(subset["units"]) == 2 * 2 * 4
    # six comparisons: the smallest p must clear 0.05/6, which asks more of the seeds than alpha 0.05 does,
    # and five behaviours' exact sign-flip test (floor 2/32) can detect nothing at that level
    from glm53_flash.experiments.study import level_power

    seeds_level, units_level = subset["power"].values()
    assert seeds_level["alpha"] == units_level["alpha"] == pytest.approx(0.05 / 6)
    assert seeds_level["mdd_in_sd"] > level_power(2, "t")["mdd_in_sd"] > 0
    assert units_level["mdd_in_sd"] is None


def _rl_switches_study(seeds, helped=("faithful", "flip-logprob_source"), gain=15):
    """A synthetic rl-switches plan and receipts on 40 dev behaviours: `helped` (arm, variant) solves `gain`
    more behaviours on every seed; a few behaviours move by seed elsewhere (noise that must not become a
    claim)."""
    from glm53_flash.experiments import rl_switches as sw

    dev = gen.task_subset(compositions.DEV_SPLIT, 40)
    plan = {"study": sw.STUDY, "plan_sha256": f"plan-{seeds[0]}",
            "design": {"arms": ["faithful", "ours"], "seeds": list(seeds), "rl_seeds": [11, 12],
                       "switches": list(sw.SWITCHES), "source": f"study-{seeds[0]}",
                       "variants": {arm: {v: sw.variant_switches(arm, v, other)
                                          for v in [sw.OWN, *(f"flip-{s}" for s in sw.SWITCHES)]}
                                    for arm, other in (("faithful", "ours"), ("ours", "faithful"))}},
            "analysis": {"alpha": 0.05}}
    receipts = []
    for arm in ("faithful", "ours"):
        for seed in seeds:
            for variant in [sw.OWN, *(f"flip-{s}" for s in sw.SWITCHES)]:
                for rl_seed in (11, 12):
                    solved = 10 + (gain if (arm, variant) == helped else 0)
                    wobble = {dev[30 + (seed + rl_seed) % 5]} if variant != sw.OWN else set()
                    passed = set(dev[:solved]) | wobble
                    receipts.append({"arm": arm, "seed": seed, "variant": variant, "rl_seed": rl_seed,
                                     "evaluation": {"outcomes": {t: [t in passed, t in passed] for t in dev}}})
    return plan, receipts


def test_rl_switches_analysis_finds_a_flip_that_helps_and_holm_guards_the_rest():
    from glm53_flash.experiments import rl_switches as sw

    plan, receipts = _rl_switches_study(range(1, 7))
    summary = sw.compute(plan, receipts)
    rows = {(r["arm"], r["switch"]): r for r in summary["comparisons"]}
    assert len(rows) == 6
    helped = rows[("faithful", "logprob_source")]
    # over behaviours (secondary): 15 gained on every seed, and two wobbling behaviours half a pass each
    assert helped["behaviours"]["mean_difference"] == pytest.approx(15 / 40 + 1 / 40)
    # over structure groups (primary): each group the mean of its behaviours' effects, then the mean of groups
    dev = gen.task_subset(compositions.DEV_SPLIT, 40)
    groups = compositions.structure_groups(dev)
    members = {g: [t for t in dev if groups[t] == g] for g in set(groups.values())}
    effect = {t: 1.0 if t in dev[10:25] else 0.0 for t in dev}
    for seed in range(1, 7):
        expected = {t: effect[t] + sum(0.5 for r in (11, 12) if t == dev[30 + (seed + r) % 5]) for t in dev}
        by_group = [sum(expected[t] for t in ts) / len(ts) for ts in members.values()]
        assert helped["comparison"]["seeds"]["values"][seed - 1] == pytest.approx(sum(by_group) / len(by_group))
    assert helped["comparison"]["units"]["n"] == len(members) < 40
    assert helped["verdict"] == "flip better" and helped["holm"]["units_p"] < 0.05
    assert helped["own"] == "untempered" and helped["flipped_to"] == "sampler"
    for key, row in rows.items():
        if key != ("faithful", "logprob_source"):
            assert row["verdict"] == "not shown", key
    lines = sw.answers(summary)
    assert any("flip better, shown after Holm over 6 comparisons, at groups and seeds" in line for line in lines)
    assert sum("not shown after Holm over 6 comparisons, at groups and seeds" in line for line in lines) == 5
    # a row that shows nothing says what its seeds and behaviours could have detected at Holm's first step
    quiet = rows[("ours", "eos_handling")]
    from glm53_flash.core.stats import minimum_detectable_difference
    assert quiet["detectable"]["alpha"] == pytest.approx(0.05 / 6)
    seed_sd = float(np.std(quiet["comparison"]["seeds"]["values"], ddof=1))
    assert quiet["detectable"]["seeds"] == pytest.approx(minimum_detectable_difference(6, seed_sd, 0.05 / 6, 0.8, "t"))
    assert all("detectable at Holm's first step" in line for line in lines if "not shown after" in line)
    table = sw.headline_table(summary)
    assert len(table["rows"]) == 6 and all(len(r) == len(table["columns"]) for r in table["rows"])
    assert table["rows"][0][-1] == "flip better" and table["rows"][0][-2] == "6"


@pytest.mark.slow
def test_an_rl_switches_rerun_holds_where_both_studies_agree_and_refuses_shared_seeds():
    """Two rl-switches studies on disjoint pretraining seeds: a row holds when both give the same verdict and
    the same directions after Holm; a flip shown in one and not the other does not hold; the rerun spread is
    Welch's over the two sets of seed effects; a shared seed or another design is refused."""
    from glm53_flash.experiments import rl_switches as sw

    first_plan, first = _rl_switches_study(range(1, 7))
    same_plan, same = _rl_switches_study(range(11, 17))  # the same seeds mod 5: the same wobble
    quiet_plan, quiet = _rl_switches_study(range(11, 17), gain=0)
    a, b, c = sw.compute(first_plan, first), sw.compute(same_plan, same), sw.compute(quiet_plan, quiet)
    held = sw.compare_rerun(first_plan, a, same_plan, b)
    assert held["all_hold"] and len(held["rows"]) == 6
    helped = next(r for r in held["rows"] if (r["arm"], r["switch"]) == ("faithful", "logprob_source"))
    assert helped["directions"] == {"units": ["+", "+"], "seeds": ["+", "+"]}
    assert helped["spread"]["difference"] == pytest.approx(0.0, abs=1e-12) and helped["spread"]["equivalent"]
    lost = sw.compare_rerun(first_plan, a, quiet_plan, c)
    rows = {(r["arm"], r["switch"]): r for r in lost["rows"]}
    assert not rows[("faithful", "logprob_source")]["holds"] and not lost["all_hold"]
    assert rows[("faithful", "logprob_source")]["rerun"]["verdict"] == "not shown"
    assert all(r["holds"] for k, r in rows.items() if k != ("faithful", "logprob_source"))
    lines = sw.rerun_report_lines(lost, "first")
    assert any("| faithful | logprob_source |" in line and "| NO (+/0, " in line for line in lines)
    with pytest.raises(ValueError, match="disjoint"):
        sw.compare_rerun(first_plan, a, first_plan, a)
    other = json.loads(json.dumps(same_plan))
    other["design"]["rl_seeds"] = [11]
    with pytest.raises(ValueError, match="rl_seeds"):
        sw.check_rerun_design(first_plan, other)


@pytest.mark.slow
def test_rl_switches_end_to_end_from_a_generalisation_study(tmp_path, capsys, one_thread):
    source = tmp_path / "study"
    assert main(_study_args(source)) == 0  # pretraining and RL finished; the sealed evaluations wait
    out = tmp_path / "switches"
    args = ["experiment", "rl-switches", "--source", str(source), "--output", str(out), "--rl-seeds", "3",
            "--switches", "eos_handling", "--dev-tasks", "5", "--workers", "1", "--quiet"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "power, over pretraining seeds" in err and "estimated" in err
    done = {r["unit"]["key"]: r for r in load_receipts(out)}
    assert sorted(done) == ["faithful-seed-1-flip-eos_handling-3", "faithful-seed-1-own-3",
                            "ours-seed-1-flip-eos_handling-3", "ours-seed-1-own-3"]
    assert done["ours-seed-1-flip-eos_handling-3"]["switches"]["eos_handling"] == "omit"
    assert done["faithful-seed-1-flip-eos_handling-3"]["switches"]["eos_handling"] == "append"
    assert all(len(r["evaluation"]["outcomes"]) == 5 for r in done.values())
    assert not (out / "work").exists()  # every run's weights removed, their hashes kept
    assert main(args) == 0 and "0 run(s) finished" in capsys.readouterr().err  # resumes: nothing to do
    assert main(["analyze", str(out)]) == 0
    assert len(json.loads((out / "summary.json").read_text())["comparisons"]) == 2


# --------------------------------------------------------------------------- the receipts that chose the defaults


def test_the_study_budget_rebuilds_from_its_receipts_and_pins_the_studys_defaults(tmp_path):
    """results/study-budget/ holds the dev pilot that chose the study's pretraining budget and RL recipe
    (its receipts gzip-compressed: each is over 1 MB as JSON). The summary must rebuild from them, and the
    study's defaults must be what they chose."""
    import gzip
    from pathlib import Path

    from glm53_flash.model.config import ModelConfig
    from glm53_flash.report.budget import budget_summary

    directory = Path(__file__).resolve().parents[1] / "results" / "study-budget"
    for packed in directory.glob("*.json.gz"):
        (tmp_path / packed.name.removesuffix(".gz")).write_bytes(gzip.decompress(packed.read_bytes()))
    rebuilt = budget_summary(tmp_path / "training-receipt.json", sorted(tmp_path.glob("dev-step*-greedy.json")))
    committed = json.loads((directory / "summary.json").read_text())
    assert rebuilt["checkpoints"] == committed["checkpoints"] and rebuilt["budget"] == committed["budget"]
    assert rebuilt["training"] == committed["training"]  # the receipts' hashes are the uncompressed files'

    training = json.loads((tmp_path / "training-receipt.json").read_text())
    assert training["config"] == ModelConfig.preset(gen.PRETRAIN_DEFAULTS["preset"]).to_dict()
    assert training["data"]["tasks"] == compositions.SUITE
    defaults = gen.PRETRAIN_DEFAULTS
    assert defaults["steps"] == committed["budget"]["step"] == max(defaults["checkpoints"])
    assert (defaults["learning_rate"], defaults["warmup"], defaults["batch_size"]) == \
        (training["learning_rate"], training["warmup"], training["batch_size"])

    # the RL recipe's learning rate and scope: the pilot run whose best dev checkpoint solved the most
    pilots = {path.name.removesuffix("-selection.json"): json.loads(path.read_text())
              for path in directory.glob("rl-*-selection.json")}
    assert len(pilots) == 5
    best = max(pilots, key=lambda name: max(c["score"] for c in pilots[name]["checkpoints"]))
    assert best == f"rl-lr{gen.RL_RECIPE.learning_rate:g}-{gen.RL_RECIPE.train_scope}-g192"
    assert gen.RL_RECIPE.groups == pilots[best]["selected"]["step"]  # where that run peaked on dev


# --------------------------------------------------------------------------- rl-choices on the compositions suite


def test_rl_choices_on_compositions_scales_every_arm_and_adds_the_strong_reward():
    from glm53_flash.experiments import rl_choices as rc

    families = {arm: rc.arm_settings(arm) for arm in rc.ARMS}
    assert all("reward_cases" not in s for s in families.values())  # the families screen is the original's
    arms = list(rc.arms_of("compositions"))
    assert arms == [*rc.ARMS, "reward-strong"]
    for arm in rc.ARMS:
        settings = rc.arm_settings(arm, "compositions")
        assert settings["groups"] == families[arm]["groups"] * rc.COMPOSITIONS_SCALE
        assert settings["group_size"] == families[arm]["group_size"] and settings["reward_cases"] == "three"
    assert rc.arm_settings("reward-strong", "compositions")["reward_cases"] == "strong"
    with pytest.raises(ValueError, match="unknown arm"):
        rc.arm_settings("reward-strong")  # not an arm of the families screen

    plan = rc.build_plan("ckpt", "sha", arms, (1, 2), (3,), 7, None, 2, 0.1, 0.01, suite="compositions")
    design = plan["design"]
    assert (design["screen_split"], design["confirm_split"]) == (compositions.DEV_SPLIT, compositions.UNSEEN_SPLIT)
    assert design["suite"] == "compositions" and design["max_new_tokens"] == compositions.MAX_NEW_TOKENS
    assert design["recipe"]["learning_rate"] == rc.COMPOSITIONS_RECIPE.learning_rate and design["precision"] == "fp32"
    assert rc.build_plan("ckpt", "sha", arms, (1,), (), 7, None, 2, None, None, suite="compositions",
                         precision="bf16")["design"]["precision"] == "bf16"
    assert design["task_ids_sha256"][compositions.DEV_SPLIT] == gen._ids_sha256(gen.task_subset(compositions.DEV_SPLIT, 7))
    assert plan["estimate"]["evaluated_tasks"] == 7 * (2 + len(arms) * 2 + 2)
    families_plan = rc.build_plan("ckpt", "sha", list(rc.ARMS), (1, 2), (3,), None, None, 2, None, None)
    assert "suite" not in families_plan["design"] and families_plan["design"]["tasks_per_family"] == 20
    with pytest.raises(ValueError, match="unknown suite"):
        rc.build_plan("ckpt", "sha", ["baseline"], (1,), (), None, None, 1, None, None, suite="grammar")


def test_rl_choices_reference_unit_on_compositions_evaluates_the_subset(tmp_path, one_thread):
    from web_helpers import tiny_checkpoint

    from glm53_flash.experiments import rl_choices as rc

    checkpoint = tiny_checkpoint(tmp_path / "checkpoint-0000")
    plan = rc.build_plan(str(checkpoint), "sha", ["baseline"], (1,), (), 5, "partial", 1, None, None,
                         suite="compositions")
    result = rc.run_unit({"phase": "reference", "split": compositions.DEV_SPLIT, "design": plan["design"]})
    assert [o["task_id"] for o in result["evaluation"]["outcomes"]] == gen.task_subset(compositions.DEV_SPLIT, 5)
    assert result["evaluation"]["split"] == compositions.DEV_SPLIT



def test_rl_choices_on_compositions_times_marginal_costs(monkeypatch):
    """The compositions plan's time comes from the marginal-cost probe (three RL groups minus one, twelve
    dev tasks minus four) at the screen's group size and temperature, in the plan's precision."""
    from glm53_flash.experiments import rl_choices as rc

    seen = []

    def probe(checkpoint, rl, precision, device="cpu"):
        seen.append((checkpoint, rl, precision))
        return {"seconds_per_rollout": 0.02, "seconds_per_eval_task": 0.03}

    monkeypatch.setattr(gen, "probe_rl_and_evaluation", probe)
    assert rc.measure_speed("ckpt", "compositions", "bf16") == (0.02, 0.03)
    assert seen == [("ckpt", {"group_size": rc.BASE_ARM["group_size"], "temperature": rc.BASE_ARM["temperature"],
                              "train_scope": rc.COMPOSITIONS_RECIPE.train_scope}, "bf16")]


def test_the_pretraining_probe_leaves_the_first_steps_one_off_cost_out(monkeypatch, tmp_path):
    """A plan's stated time comes from seconds per step: the median of the probe run's steps after the first.
    A difference of two runs' totals does not remove the first step's one-off costs (the first run in a
    process pays them, the second does not) and once stated a study's time twelve times too short."""
    import glm53_flash.train.pretrain as pretrain_module

    def fake_pretrain(cfg):
        curve = [5.0, 0.31, 0.40, 0.29, 0.33, 0.35][: cfg.steps]
        return {"training_curve": [{"seconds": s} for s in curve], "checkpoints": [{"path": f"{cfg.output}/ck"}]}

    monkeypatch.setattr(pretrain_module, "pretrain", fake_pretrain)
    recipe = {"batch_size": 4, "sequence_length": 64, "learning_rate": 1e-3, "tasks": "compositions", "preset": "tiny"}
    step, checkpoint = gen.probe_pretraining_step(recipe, "fp32", "cpu", str(tmp_path / "probe"))
    assert step == 0.33 and checkpoint == str(tmp_path / "probe" / "ck")


def test_the_evaluation_probe_times_tasks_only_after_a_warm_up(monkeypatch):
    """The first evaluation in a process pays one-off costs (the verifier's start, the first generation); the
    probe runs one untimed, then takes twelve tasks minus four, so those costs count for neither."""
    import glm53_flash.verifier as verifier_module

    calls, clock = [], [0.0]

    class FakeVerifier:
        def __init__(self, workers):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def fake_evaluate(model, tasks, options, verifier):
        clock[0] += (3.0 if not calls else 0.0) + 0.05 * len(tasks)  # a one-off cost on the first call only
        calls.append(len(tasks))
        return {}

    monkeypatch.setattr(verifier_module, "Verifier", FakeVerifier)
    monkeypatch.setattr(gen, "_evaluate", fake_evaluate)
    monkeypatch.setattr(gen.time, "perf_counter", lambda: clock[0])
    assert gen.probe_evaluation(object(), "fp32") == pytest.approx(0.05)
    assert calls == [2, 4, 12]


def test_rl_choices_takes_its_precision_on_compositions_only(tmp_path, monkeypatch, capsys):
    """--precision is part of the compositions screen's design (a rerun pins the first study's, whatever
    `auto` would pick on this CPU); the families screen, the original's, refuses it."""
    from web_helpers import tiny_checkpoint

    from glm53_flash.cli import main
    from glm53_flash.experiments import rl_choices as rc

    checkpoint = tiny_checkpoint(tmp_path / "checkpoint-0000")
    monkeypatch.setattr(rc, "measure_speed", lambda *args, **kwargs: (0.01, 0.01))
    for precision in ("fp32", "bf16"):
        out = tmp_path / precision
        assert main(["experiment", "rl-choices", "--suite", "compositions", "--checkpoint", str(checkpoint),
                     "--output", str(out), "--precision", precision, "--plan-only", "--quiet"]) == 0
        assert json.loads((out / "plan.json").read_text())["design"]["precision"] == precision
    assert main(["experiment", "rl-choices", "--checkpoint", str(checkpoint), "--output", str(tmp_path / "families"),
                 "--precision", "bf16", "--plan-only", "--quiet"]) == 2
    assert "only the compositions suite's screen takes a precision" in capsys.readouterr().err
    assert not (tmp_path / "families").exists()
