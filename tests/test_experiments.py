"""Research studies: the compatible task and schedules, the runner's plan/resume rules, and the analysis
on synthetic receipts whose answers are known."""

from __future__ import annotations

import collections
import dataclasses
import json
from pathlib import Path
import random

import pytest

from glm53_flash.cli import main
from glm53_flash.experiments import analysis, pretraining_data as pd, rl_choices
from glm53_flash.experiments.config import StudyConfig
from glm53_flash.experiments.pretraining_data import PretrainingDataStudyConfig
from glm53_flash.experiments.study import Study, plan_hash

# ------------------------------------------------------------------------------------ the task


def test_structures_are_the_originals_shuffle():
    structures = pd.all_structures()
    assert len(structures) == 120 and len(set(structures)) == 120
    assert all(len(set(s)) >= 2 for s in structures)
    # Random(1701).shuffle of the itertools.product order: pinned so a change of stream is caught
    assert structures[:5] == [("add", "add", "abs"), ("mul", "sub", "neg"), ("neg", "abs", "neg"),
                              ("mul", "add", "abs"), ("mul", "abs", "mul")]
    train, held_out = pd.split_structures()
    assert len(train) == 88 and len(held_out) == 32 and not set(train) & set(held_out)


@pytest.mark.parametrize("seed", [11, 22, 110, 220])
def test_held_out_targets_are_585_tokens_per_seed(seed):
    examples = pd.held_out_examples(seed)
    assert len(examples) == 32
    assert sum(len(e.expression) + 2 for e in examples) == 585  # expression bytes + "\n" + EOS


def test_render_matches_the_original_draw_order():
    example = pd.render_example(("add", "mul", "neg"), 0, 11)
    assert example.text == "Task: start with x. Add 5. Multiply by 2. Negate it.\nPython: (-((x + 5) * 2))\n"
    # redo the draw order by hand: constants, the unused start value, then one phrase per op
    structure, index, seed = ("abs", "sub", "sub"), 7, 22
    key = sum((p + 1) * (pd.OPS.index(op) + 1) * 101 for p, op in enumerate(structure))
    rng = random.Random(seed * 1_000_003 + index * 9176 + key)
    constants = [rng.choice((2, 3, 4, 5)) for _ in structure]
    rng.randint(-5, 5)
    phrases = [rng.choice(pd.PHRASES[op]).format(c=c) for op, c in zip(structure, constants)]
    example = pd.render_example(structure, index, seed)
    assert example.prompt == "Task: start with x. " + " ".join(phrases) + "\nPython: "
    assert example.expression == f"((abs(x) - {constants[1]}) - {constants[2]})"
    assert example.prompt_tokens == len(example.prompt.encode()) + 1


def test_expressions_compute_what_the_phrases_say():
    apply = {"add": lambda v, c: v + c, "sub": lambda v, c: v - c, "mul": lambda v, c: v * c,
             "neg": lambda v, c: -v, "abs": lambda v, c: abs(v)}
    for i, structure in enumerate(pd.all_structures()):
        example = pd.render_example(structure, i, 5)
        for x in pd.EXECUTION_POINTS:
            value = x
            for op, c in zip(structure, example.constants):
                value = apply[op](value, c)
            assert pd.expression_value(example.expression, x) == value


def test_expression_interpreter_refuses_anything_but_arithmetic():
    assert pd.expression_value("abs((-x) * 3) - 2", -4) == 10
    for text in ("__import__('os').getcwd()", "x.real", "2 ** 99999", "y + 1", "lambda: 1", "(" * 500 + "x",
                 "abs(x, 1)", "1 / x", "True + x", ""):
        assert pd.expression_value(text, 3) is None
    assert pd.executes_correctly("((x + 2) * 3)", "(x * 3) + 6")
    assert not pd.executes_correctly("((x + 2) * 3)", "((x + 3) * 3)")


# ------------------------------------------------------------------------------------ schedules


def test_schedules_of_each_condition():
    train, _ = pd.split_structures()
    steps, batch = 200, 24
    total = steps * batch
    schedules = {c: pd.condition_schedule(c, steps, batch) for c in pd.CONDITIONS}
    for condition, schedule in schedules.items():
        assert len(schedule) == total, condition
        assert sorted(i for _, i in schedule) == list(range(total)), condition  # every render index once
    assert {s for s, _ in schedules["repeated-8"]} == set(train[:8])
    assert [s for s, _ in schedules["diverse-88"][:176]] == train * 2  # interleaved round-robin
    blocked = [s for s, _ in schedules["diverse-blocked"]]
    runs = [(s, len(list(group))) for s, group in __import__("itertools").groupby(blocked)]
    assert [s for s, _ in runs] == train  # one contiguous block per structure, in pool order
    assert collections.Counter(n for _, n in runs) == {55: 48, 54: 40}
    curriculum = schedules["curriculum-8-to-88"]
    switch = (steps // 2) * batch
    assert {s for s, _ in curriculum[:switch]} == set(train[:8])
    assert [s for s, _ in curriculum[switch:]] == [train[i % 88] for i in range(switch, total)]
    with pytest.raises(ValueError, match="unknown condition"):
        pd.condition_schedule("shuffled", 2, 2)


# ------------------------------------------------------------------------------------ the study CLI


def _study(tmp_path, *extra):
    return ["experiment", "pretraining-data", "--output", str(tmp_path / "study"), "--steps", "2", "--seeds", "3,4",
            "--conditions", "repeated-8,diverse-88", "--eval-at", "0,2", "--workers", "1", "--no-progress", *extra]


@pytest.mark.slow
def test_pretraining_study_runs_resumes_and_refuses_to_overwrite(tmp_path, capsys, one_thread):
    out = tmp_path / "study"
    assert main(_study(tmp_path)) == 0
    receipts = sorted((out / "runs").glob("*.json"))
    assert [p.stem for p in receipts] == ["diverse-88-seed-3", "diverse-88-seed-4", "repeated-8-seed-3",
                                         "repeated-8-seed-4"]
    plan = json.loads((out / "plan.json").read_text())
    assert plan["plan_sha256"] == plan_hash(plan)
    # every flag of the session, outside the hashed design
    assert set(plan["run_config"]) == {f.name for f in dataclasses.fields(PretrainingDataStudyConfig)}
    assert plan["run_config"]["seeds"] == [3, 4] and plan["run_config"]["workers"] == 1
    runs = {p.stem: json.loads(p.read_text()) for p in receipts}
    for seed in (3, 4):  # pairing: both conditions start from the same weights at a seed
        a, b = runs[f"repeated-8-seed-{seed}"], runs[f"diverse-88-seed-{seed}"]
        assert a["initial_weights_sha256"] == b["initial_weights_sha256"]
        assert a["final_weights_sha256"] != b["final_weights_sha256"]
        assert [e["step"] for e in a["evaluations"]] == [0, 2]
        assert a["plan_sha256"] == plan["plan_sha256"] and a["provenance"]["argv"]
        before = a["evaluations"][0]["summary"]
        assert before["target_tokens"] == 585 and before["examples"] == 32
    assert runs["repeated-8-seed-3"]["initial_weights_sha256"] != runs["repeated-8-seed-4"]["initial_weights_sha256"]

    mtimes = {p: p.stat().st_mtime_ns for p in receipts}
    capsys.readouterr()
    assert main(_study(tmp_path)) == 0  # same design: resumes, nothing reruns
    assert "4/4 runs done (resuming)" in capsys.readouterr().err
    assert {p: p.stat().st_mtime_ns for p in receipts} == mtimes

    plan_text = (out / "plan.json").read_text()
    assert main(_study(tmp_path, "--learning-rate", "1e-3")) == 2  # a different design is refused
    assert "different design" in capsys.readouterr().err
    assert (out / "plan.json").read_text() == plan_text and all(p.exists() for p in receipts)

    assert main(["analyze", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pairing_verified"] and summary["runs"] == 4
    assert summary["headline_table"]["rows"][0][0] == "diversity"
    report = (out / "REPORT.md").read_text()
    assert (out / "learning-curves.png").stat().st_size > 1000
    assert main(["analyze", str(out)]) == 2  # never overwrites without --force
    assert "--force" in capsys.readouterr().err
    assert (out / "REPORT.md").read_text() == report
    assert main(["analyze", str(out), "--force"]) == 0

    assert main(_study(tmp_path, "--learning-rate", "1e-3", "--force")) == 0  # replaces the study and its analysis
    assert not (out / "summary.json").exists() and not (out / "REPORT.md").exists()
    assert not list(out.glob("*.png"))
    new_plan = json.loads((out / "plan.json").read_text())
    assert new_plan["plan_sha256"] != plan["plan_sha256"]
    assert all(json.loads(p.read_text())["plan_sha256"] == new_plan["plan_sha256"] for p in (out / "runs").glob("*.json"))


def test_analyze_help_writes_nothing(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["analyze", "--help"])
    assert exit_info.value.code == 0
    assert "usage: glm53 analyze" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []
    assert main(["analyze", str(tmp_path)]) == 2
    assert "no plan.json" in capsys.readouterr().err


def test_plan_rejects_bad_designs():
    args = (["diverse-88"], [1], 10, 4, 1e-3, 128, [0, 10], 1, None)
    assert pd.build_plan(*args)["analysis"]["comparisons"] == []
    # the plan names the model it trains, positions included: runs of another model are another plan
    assert pd.build_plan(*args)["design"]["model"]["linear_rope"] == "rope-before-feature-map"
    with pytest.raises(ValueError, match="unknown condition"):
        pd.build_plan(["diverse-99"], *args[1:])
    with pytest.raises(ValueError, match="eval-at"):
        pd.build_plan(["diverse-88"], [1], 10, 4, 1e-3, 128, [0, 11], 1, None)
    rl = ("ckpt", "0" * 64, ["baseline", "temp-low"], [1, 2], [2, 3], 4, None, 1, None, None)
    with pytest.raises(ValueError, match="fresh"):
        rl_choices.build_plan(*rl)
    with pytest.raises(ValueError, match="baseline"):
        rl_choices.build_plan("ckpt", "0" * 64, ["temp-low"], [1], [3], 4, None, 1, None, None)
    with pytest.raises(ValueError, match="unknown arm"):
        rl_choices.build_plan("ckpt", "0" * 64, ["baseline", "greedy"], [1], [3], 4, None, 1, None, None)


def test_rl_arms_keep_the_budget_or_the_updates():
    budget = {arm: rl_choices.arm_settings(arm) for arm in rl_choices.ARMS}
    for arm, s in budget.items():
        if "matched" in arm:
            assert s["groups"] == budget["baseline"]["groups"] and s["group_size"] != 8
        else:
            assert s["groups"] * s["group_size"] == 128, arm
    assert {budget[a]["temperature"] for a in budget} == {0.2, 0.35, 0.8}
    assert {budget[a]["invalid_penalty"] for a in budget} == {0.0, -0.1, -1.0}


# ------------------------------------------------------------------------------------ analysis, known answers


def _write_study(directory, plan, receipts):
    (directory / "runs").mkdir(parents=True)
    plan["plan_sha256"] = plan_hash(plan)
    (directory / "plan.json").write_text(json.dumps(plan))
    for receipt in receipts:
        receipt["plan_sha256"] = plan["plan_sha256"]
        (directory / "runs" / f"{receipt['key']}.json").write_text(json.dumps(receipt))
    return plan


def _pretraining_receipt(condition, seed, accuracy, execution):
    examples = [{"structure": f"s{i}", "target": "(x + 1)", "teacher_forced_argmax": "(x + 2)", "generated": "(x+1)",
                 "correct_tokens": round(accuracy * 20), "target_tokens": 20, "loss_sum": 1.0,
                 "teacher_forced_exact": False, "free_run_exact": False, "execution_correct": i < execution}
                for i in range(32)]
    summary = {"target_byte_accuracy": accuracy, "target_loss": 1.0 - accuracy, "execution_accuracy": execution / 32,
               "free_run_exact": 0.0, "teacher_forced_exact": 0.0}
    return {"key": f"{condition}-seed-{seed}", "condition": condition, "seed": seed, "elapsed_seconds": 1.0,
            "initial_weights_sha256": f"init-{seed}",
            "evaluations": [{"step": 0, "summary": summary | {"target_byte_accuracy": 0.1}, "examples": examples},
                            {"step": 10, "summary": summary, "examples": examples}]}


def test_pretraining_analysis_on_synthetic_receipts(tmp_path):
    plan = pd.build_plan(["repeated-8", "diverse-88"], list(range(1, 11)), 10, 4, 1e-3, 128, [0, 10], 1, None)
    receipts = []
    for seed in range(1, 11):
        receipts.append(_pretraining_receipt("repeated-8", seed, 0.5, 4))
        # diverse is 5 points better on 9 seeds and 5 points worse on one; execution +2 items everywhere
        receipts.append(_pretraining_receipt("diverse-88", seed, 0.55 if seed != 10 else 0.45, 6))
    _write_study(tmp_path, plan, receipts)
    summary = analysis.analyze(tmp_path)
    row = summary["comparisons"]["target_byte_accuracy"][0]
    assert row["name"] == "diversity" and row["n"] == 10
    assert row["mean"] == pytest.approx(4.0)
    assert (row["wins"], row["ties"], row["losses"]) == (9, 0, 1)
    # exact sign-flip over +-5 x 10: |sum| >= 40 needs 0, 1, 9 or 10 plus signs: (1 + 10 + 10 + 1) / 1024
    assert row["sign_flip_p"] == pytest.approx(22 / 1024)
    assert row["holm_p"] == row["sign_flip_p"]  # one comparison
    execution = summary["comparisons"]["execution_accuracy"][0]
    assert execution["mean"] == pytest.approx(100 * 2 / 32)
    assert execution["sign_flip_p"] == pytest.approx(2 / 1024)
    assert execution["pooled_items"]["gains"] == 20 and execution["pooled_items"]["losses"] == 0
    assert summary["untrained_byte_accuracy"] == [0.1]
    assert summary["correct_generations_at_primary_step"] == 10 * (4 + 6)
    assert summary["examples"][0]["target"] == "(x + 1)"
    assert not any("Does any condition teach" in a for a in summary["answers"])  # some generations are right
    assert summary["answers"][0].startswith("Does training on 88 structures")
    assert "Holm p 0.0215" in summary["answers"][0]


def _rl_receipt(phase, arm, seed, passed, role=None):
    outcomes = [{"task_id": f"dev-x-{i:03d}", "family": "x", "passed": p, "status": "passed" if p else "failed",
                 "pass_fraction": float(p), "completion": ""} for i, p in enumerate(passed)]
    key = f"{phase}-{role or arm}-seed-{seed}"
    return {"key": key, "phase": phase, "arm": arm, "role": role, "seed": seed, "elapsed_seconds": 2.0,
            "training": {"updated_groups": 5, "exact_training_rollouts": 3, "rollouts": 128},
            "evaluation": {"split": "final" if phase == "confirm" else "dev", "outcomes": outcomes,
                           "summary": {"pass_at_1": sum(passed) / len(passed), "tasks_solved": sum(passed),
                                       "tasks_total": len(passed)}}}


def test_rl_analysis_on_synthetic_receipts(tmp_path):
    plan = rl_choices.build_plan("ckpt", "a" * 64, ["baseline", "temp-low"], [1, 2], list(range(11, 21)), 2, None, 1,
                                 None, None)
    receipts = [{"key": "pretrained-dev", "phase": "reference", "evaluation": {
        "split": "dev", "summary": {"pass_at_1": 0.1, "tasks_solved": 1, "tasks_total": 10}}},
                {"key": "pretrained-final", "phase": "reference", "evaluation": {
                    "split": "final", "summary": {"pass_at_1": 0.3, "tasks_solved": 3, "tasks_total": 10}}}]
    for seed in (1, 2):
        receipts.append(_rl_receipt("screen", "baseline", seed, [True] * 2 + [False] * 8))
        receipts.append(_rl_receipt("screen", "temp-low", seed, [True] * 4 + [False] * 6))
    for seed in range(11, 21):
        receipts.append(_rl_receipt("confirm", "baseline", seed, [True] * 3 + [False] * 7, role="baseline"))
        # the candidate gains tasks 3 and 4 on every seed and loses task 0 on seed 20
        cand = [seed != 20, True, True, True, True] + [False] * 5
        receipts.append(_rl_receipt("confirm", "temp-low", seed, cand, role="candidate"))
    _write_study(tmp_path, plan, receipts)
    summary = analysis.analyze(tmp_path)
    screen = summary["screen_comparisons"][0]
    assert screen["mean"] == pytest.approx(20.0) and screen["pooled_tasks"]["gains"] == 4
    assert screen["pooled_tasks"]["p"] == pytest.approx(2 / 16)  # 4 discordant pairs: exact
    confirmation = summary["confirmation"]
    assert confirmation["candidate"] == "temp-low" and confirmation["n"] == 10
    assert confirmation["mean"] == pytest.approx(19.0)
    assert confirmation["sign_flip_p"] == pytest.approx(2 / 1024)
    per_seed = {r["seed"]: r for r in confirmation["per_seed"]}
    assert (per_seed[11]["gains"], per_seed[11]["losses"]) == (2, 0)
    assert per_seed[11]["mcnemar_p"] == pytest.approx(0.5)
    assert (per_seed[20]["gains"], per_seed[20]["losses"]) == (2, 1)
    assert summary["pretrained"]["dev"]["solved"] == 1
    baseline_vs, candidate_vs = summary["versus_pretrained"]
    assert baseline_vs["mean"] == pytest.approx(0.0) and baseline_vs["ties"] == 10
    assert candidate_vs["mean"] == pytest.approx(19.0) and candidate_vs["wins"] == 10
    assert candidate_vs["sign_flip_p"] == pytest.approx(2 / 1024)
    assert candidate_vs["holm_p"] == pytest.approx(4 / 1024)  # two comparisons, Holm
    assert [row[1] for row in summary["headline_table"]["rows"]] == ["temp-low", "temp-low", "baseline", "temp-low"]
    assert "final split (opened by no other step" in summary["answers"][1]
    assert summary["answers"][2].startswith("Answer: temp-low beats the baseline")
    # every task of a family computes one function: the ten tasks of each split are one unit
    assert summary["units"] == {"dev": {"tasks": 10, "units": 1}, "final": {"tasks": 10, "units": 1}}
    assert "the 10 dev tasks are 1 unit and the 10 final tasks are 1 unit" in (tmp_path / "REPORT.md").read_text()


def test_rl_selection_follows_the_planned_rule():
    plan = rl_choices.build_plan("ckpt", "a" * 64, ["baseline", "temp-low", "partial"], [1], [2], 2, None, 1, None,
                                 None)
    receipts = [_rl_receipt("screen", "baseline", 1, [True, False]),
                _rl_receipt("screen", "temp-low", 1, [True, False]),
                _rl_receipt("screen", "partial", 1, [True, False])]
    assert rl_choices.select_candidate(plan, receipts)["candidate"] == "temp-low"  # tie: arm order
    receipts[2] = _rl_receipt("screen", "partial", 1, [True, True])
    assert rl_choices.select_candidate(plan, receipts)["candidate"] == "partial"
    with pytest.raises(ValueError, match="not finished"):
        rl_choices.select_candidate(plan, receipts[:2])


@pytest.mark.slow
def test_rl_study_end_to_end_on_a_tiny_checkpoint(tmp_path, capsys, one_thread):
    ckpt_run = tmp_path / "pretrain"
    assert main(["pretrain", "--preset", "tiny", "--steps", "1", "--sequence-length", "128", "--batch-size", "2",
                 "--output", str(ckpt_run), "--checkpoints", "1", "--no-progress"]) == 0
    out = tmp_path / "rl"
    args = ["experiment", "rl-choices", "--output", str(out), "--checkpoint", str(ckpt_run / "checkpoint-0001"),
            "--arms", "baseline,group-16", "--seeds", "1", "--confirm-seeds", "2", "--tasks", "1", "--workers", "1",
            "--no-progress"]
    assert main(args) == 2  # the confirmation opens the sealed final split: refused without a purpose
    assert "--open-sealed" in capsys.readouterr().err and not out.exists()
    assert main([*args, "--open-sealed", "test of the study pipeline"]) == 0
    from glm53_flash.evaluation.ledger import ledger_lines

    lines = ledger_lines("final")
    assert sorted(Path(line["receipt"]).stem for line in lines) == [
        "confirm-baseline-seed-2", "confirm-candidate-seed-2", "pretrained-final"]
    assert {line["purpose"] for line in lines} == {"test of the study pipeline"}
    names = sorted(p.stem for p in (out / "runs").glob("*.json"))
    assert names == ["confirm-baseline-seed-2", "confirm-candidate-seed-2", "pretrained-dev", "pretrained-final",
                     "screen-baseline-seed-1", "screen-group-16-seed-1"]
    candidate = json.loads((out / "runs" / "confirm-candidate-seed-2.json").read_text())
    assert candidate["arm"] == "group-16" and candidate["evaluation"]["split"] == "final"
    assert candidate["training"]["rollouts"] == 128 and len(candidate["evaluation"]["outcomes"]) == 5
    assert not (out / "work").exists()  # checkpoints are removed once evaluated
    assert json.loads((out / "selection.json").read_text())["candidate"] == "group-16"
    assert main(["analyze", str(out)]) == 0
    assert "Which RL choices matter" in (out / "REPORT.md").read_text()


@pytest.mark.slow
def test_shards_split_the_units_of_one_plan(tmp_path, one_thread):
    out = tmp_path / "study"
    base = ["experiment", "pretraining-data", "--output", str(out), "--steps", "1", "--seeds", "5,6",
            "--conditions", "diverse-88", "--eval-at", "1", "--workers", "1", "--no-progress"]
    assert main([*base, "--shard", "1/2"]) == 0
    assert sorted(p.stem for p in (out / "runs").glob("*.json")) == ["diverse-88-seed-6"]
    assert main([*base, "--shard", "0/2"]) == 0  # same plan: the other half joins it
    assert sorted(p.stem for p in (out / "runs").glob("*.json")) == ["diverse-88-seed-5", "diverse-88-seed-6"]
    with pytest.raises(SystemExit):
        main([*base, "--shard", "2/2"])


def test_pretraining_data_time_estimate_is_positive():
    # The plan's estimate once came out at 0.0 minutes: the process's one-time costs landed in the
    # shorter probe run and cancelled the difference.
    from glm53_flash.experiments.pretraining_data import measure_seconds_per_step

    assert measure_seconds_per_step(probe_steps=2) > 0


@pytest.mark.slow
def test_study_directory_is_locked_and_an_interrupted_study_says_so(tmp_path, capsys, monkeypatch, one_thread):
    from glm53_flash.train.rundir import RunLock

    out = tmp_path / "study"
    assert main(_study(tmp_path, "--plan-only")) == 0
    assert "status" not in json.loads((out / "plan.json").read_text())
    with RunLock(out):
        assert main(_study(tmp_path)) == 2
    assert "in use by another run" in capsys.readouterr().err

    def interrupted(cfg, sink=None):
        raise KeyboardInterrupt

    real = pd.train_condition
    monkeypatch.setattr(pd, "train_condition", interrupted)
    assert main(_study(tmp_path)) == 130
    plan = json.loads((out / "plan.json").read_text())
    assert plan["status"] == "interrupted" and plan["plan_sha256"] == plan_hash(plan)
    assert plan["resume_command"].startswith("glm53 experiment pretraining-data --output")
    assert "interrupted; resume with: glm53 experiment pretraining-data" in capsys.readouterr().err
    monkeypatch.setattr(pd, "train_condition", real)
    assert main(_study(tmp_path, "--quiet")) == 0
    plan = json.loads((out / "plan.json").read_text())
    assert plan["status"] == "complete" and "resume_command" not in plan
    assert not (out / ".lock").exists()


@pytest.mark.slow
def test_a_study_plan_states_its_power_before_it_runs(tmp_path, capsys, one_thread):
    assert main(_study(tmp_path, "--plan-only")) == 0
    plan = json.loads((tmp_path / "study" / "plan.json").read_text())
    over_seeds = plan["power"]["comparison over seeds"]
    # two seeds: the sign-flip test's smallest p is 0.5, so nothing can be detected, and it says so
    assert over_seeds["n"] == 2 and over_seeds["mdd_in_sd"] is None and over_seeds["sign_flip_floor"] == 0.5
    assert plan["power"]["pooled over (seed, held-out item)"]["mdd_in_sd"] > 0
    assert "cannot detect any difference" in capsys.readouterr().err
    # the power is outside the hashed design, like the estimate
    from glm53_flash.experiments.study import plan_hash

    assert plan["plan_sha256"] == plan_hash({k: v for k, v in plan.items() if k != "power"})


def test_a_resumed_plan_says_the_time_left_with_the_workers_it_runs():
    """The plan's estimate is for all its runs with the workers it was planned with: a resumed call with
    other workers hears what is left for it, and the whole plan's figure beside it."""
    from glm53_flash.experiments.runner import time_left as _time_left

    estimate = {"expected_minutes": 120.0, "workers": 2}
    assert _time_left(estimate, 48, 48, 2) == "estimated 120.0 min left with 2 worker(s)"
    assert _time_left(estimate, 12, 48, 1) == ("estimated 60.0 min left with 1 worker(s) "
                                               "(the whole plan: 120.0 min with 2)")
    assert _time_left(estimate, 12, 48, None).startswith("estimated 30.0 min left with 2 worker(s)")
    assert _time_left({"expected_minutes": None}, 3, 4, 1) == "no time estimate"
    assert _time_left({"expected_minutes": 9.0}, 3, 4, None) == "estimated 9.0 min for all 4 runs"


def test_a_report_sets_the_plans_stated_time_beside_the_time_the_runs_took(tmp_path):
    """The plan states its time before the first run; the report puts beside it the runs' own time per worker
    (what the estimate predicts) and the wall time (first start to last end), so an estimate that misleads is
    visible where the study is read."""
    plan = pd.build_plan(["repeated-8", "diverse-88"], [1, 2], 10, 4, 1e-3, 128, [0, 10], 2, 0.5)
    stated = plan["estimate"]["expected_minutes"]
    receipts = []
    for index, (condition, seed) in enumerate([(c, s) for s in (1, 2) for c in ("repeated-8", "diverse-88")]):
        receipt = _pretraining_receipt(condition, seed, 0.5, 4)
        receipt["elapsed_seconds"] = 60.0  # four runs, each a minute; they end 0, 1, 2 and 3 minutes after 12:01
        receipt["provenance"] = {"finished_utc": f"2026-12-05T12:0{1 + index}:00+00:00"}
        receipts.append(receipt)
    _write_study(tmp_path, plan, receipts)
    summary = analysis.analyze(tmp_path)
    # four minutes of runs over two workers: two minutes each, against four of wall time
    assert summary["time"] == {"stated_minutes": stated, "workers": 2, "run_minutes_per_worker": 2.0,
                               "wall_minutes": 4.0, "taken_over_stated": round(2.0 / stated, 2)}
    report = (tmp_path / "REPORT.md").read_text()
    assert (f"Time: the plan stated {stated} min with 2 worker(s) before the first run; the runs took 2.0 min per "
            f"worker ({round(2.0 / stated, 2)}x the statement); 4.0 min of wall time") in report


def _compositions_receipt(phase, arm, seed, split, passed: dict, role=None):
    outcomes = [{"task_id": t, "family": "int", "passed": p, "status": "passed" if p else "failed",
                 "pass_fraction": float(p), "completion": ""} for t, p in passed.items()]
    key = f"{phase}-{role or arm}-seed-{seed}" if phase != "reference" else f"pretrained-{split}"
    solved = sum(passed.values())
    return {"key": key, "phase": phase, "arm": arm, "role": role, "seed": seed, "elapsed_seconds": 2.0,
            "training": {"updated_groups": 5, "exact_training_rollouts": 3, "rollouts": 1024},
            "evaluation": {"split": split, "outcomes": outcomes,
                           "summary": {"pass_at_1": solved / len(passed), "tasks_solved": solved,
                                       "tasks_total": len(passed)}}}


@pytest.mark.slow
def test_a_compositions_rl_analysis_tests_over_structure_groups_and_training_seeds(tmp_path):
    """On the compositions suite every comparison is made over structure groups (each the mean of its
    behaviours) and training seeds: the candidate solves every behaviour of half the groups the baseline
    fails, on every seed but one, and the confirmation's result is stated after Holm over its one
    comparison, with the seeds and groups both random beside it; the comparisons with the checkpoint are
    Holm-adjusted over two."""
    from glm53_flash.core.stats import crossed_comparison, group_means
    from glm53_flash.tasks import compositions

    plan = rl_choices.build_plan("ckpt", "a" * 64, ["baseline", "temp-high"], [1, 2], list(range(11, 21)), 60, None,
                                 1, None, None, suite="compositions")
    dev = rl_choices.eval_task_ids("compositions", compositions.DEV_SPLIT, 60)
    unseen = rl_choices.eval_task_ids("compositions", compositions.UNSEEN_SPLIT, 60)
    groups = compositions.structure_groups(dev + unseen)
    gaining = {group for ids in (dev, unseen) for group in sorted({groups[t] for t in ids})[::2]}  # every other group

    def base(ids):
        return {t: i % 4 == 0 for i, t in enumerate(ids)}

    def better(ids, seed):
        return {t: p or groups[t] in gaining and not (seed == 20 and t == ids[1]) for t, p in base(ids).items()}

    receipts = [_compositions_receipt("reference", "pretrained", None, split, base(ids))
                for split, ids in ((compositions.DEV_SPLIT, dev), (compositions.UNSEEN_SPLIT, unseen))]
    for seed in (1, 2):
        receipts.append(_compositions_receipt("screen", "baseline", seed, compositions.DEV_SPLIT, base(dev)))
        receipts.append(_compositions_receipt("screen", "temp-high", seed, compositions.DEV_SPLIT, better(dev, seed)))
    for seed in range(11, 21):
        receipts.append(_compositions_receipt("confirm", "baseline", seed, compositions.UNSEEN_SPLIT, base(unseen),
                                              role="baseline"))
        receipts.append(_compositions_receipt("confirm", "temp-high", seed, compositions.UNSEEN_SPLIT,
                                              better(unseen, seed), role="candidate"))
    _write_study(tmp_path, plan, receipts)
    summary = analysis.analyze(tmp_path)
    confirmation = summary["confirmation"]
    differences = {str(s): {t: float(better(unseen, s)[t]) - float(base(unseen)[t]) for t in unseen}
                   for s in range(11, 21)}
    by_group = group_means(differences, groups)
    assert confirmation["groups"]["units"]["n"] == len({groups[t] for t in unseen}) < 60
    assert confirmation["groups"]["seeds"]["values"] == [pytest.approx(sum(v.values()) / len(v))
                                                         for v in by_group.values()]
    assert confirmation["groups"]["crossed"] == crossed_comparison(by_group)
    assert confirmation["holm"]["comparisons"] == 1 and confirmation["result"] == "better"
    assert "holm_p" not in confirmation  # no decision over the seeds' pass rates alone
    answer = next(a for a in summary["answers"] if a.startswith("Confirmation on"))
    assert "better, shown after Holm over 1 comparison, at groups and RL seeds" in answer
    assert "from this one pretrained checkpoint" in answer and "with RL seeds and structure groups both random p" in answer
    assert next(a for a in summary["answers"] if a.startswith("Answer:")).startswith(
        "Answer: from this one pretrained checkpoint, temp-high beats the baseline on fresh RL seeds")
    baseline_vs, candidate_vs = summary["versus_pretrained"]
    assert baseline_vs["result"] == "not shown" and baseline_vs["groups"]["mean_difference"] == 0
    assert candidate_vs["holm"]["comparisons"] == 2 and candidate_vs["result"] == "better"
    # the screen flags by the groups' test, Holm across the arms
    screen = summary["screen_comparisons"][0]
    assert screen["holm_p"] == screen["groups"]["units"]["sign_flip_p"]  # one arm
    assert summary["headline_table"]["columns"][6:8] == ["groups p", "RL seeds p"]
    assert [row[-1] for row in summary["headline_table"]["rows"]] == ["flagged", "better", "not shown", "better"]


# ------------------------------------------------------------------------------------ the study registry


def _toy_unit(unit: dict) -> dict:
    return {"value": unit["seed"] * 10, "elapsed_seconds": 0.0}


class _Toy(Study):
    """A study declared by its module alone: what a new study writes (tests/test_experiments.py registers it)."""

    name = "toy"
    config = dataclasses.make_dataclass("ToyConfig", [], bases=(StudyConfig,), kw_only=True)
    help = "a toy study"
    description = "Ten times each seed."

    def plan(self, cfg, speed):
        units = [{"key": f"seed-{seed}", "seed": seed} for seed in (1, 2)]
        return {"study": self.name, "design": {"seeds": [1, 2]}, "units": units, "analysis": {"alpha": 0.05},
                "power": {}, "estimate": {"workers": cfg.workers, "expected_minutes": speed}}

    def speed(self, cfg, draft):
        return 0.1

    def run(self, session):
        return session.run(session.plan["units"], _toy_unit)

    def analyze(self, out, plan, receipts):
        total = sum(r["value"] for r in receipts)
        return ({"study": self.name, "runs": len(receipts), "total": total, "answers": [f"total {total}"]},
                ["# toy", "", f"total {total}"], {})

    def answer(self, plan, summary):
        return f"The toy's total is {summary['total']}."


def test_a_study_is_its_declaration_and_one_registry_line(tmp_path, monkeypatch, capsys):
    """A study declared in its own module and added to the registry gets `glm53 experiment NAME` with its
    config's flags, the runner's plan, resume and status, and `glm53 analyze` and the docs' answer from its
    own analysis: nothing else changes."""
    from glm53_flash.experiments import registry

    monkeypatch.setitem(registry.STUDIES, "toy", _Toy())
    out = tmp_path / "toy"
    assert main(["experiment", "toy", "--output", str(out), "--workers", "1", "--quiet"]) == 0
    plan = json.loads((out / "plan.json").read_text())
    assert plan["status"] == "complete" and plan["plan_sha256"] == plan_hash(plan)
    assert plan["run_config"]["workers"] == 1 and plan["estimate"]["expected_minutes"] == 0.1
    assert "toy: 2 run(s) finished" in capsys.readouterr().err
    assert main(["analyze", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["answers"] == ["total 30"]
    assert (out / "REPORT.md").read_text().startswith("# toy")
    assert analysis.study_answers(tmp_path) == [("toy", out / "REPORT.md", "The toy's total is 30.")]
    assert main(["analyze", str(out), "--force", "--rerun-of", str(out)]) == 2  # a toy has no rerun comparison
    assert "--rerun-of compares" in capsys.readouterr().err


def test_the_registry_names_each_study_once_with_its_flags_deck_and_make_targets():
    from glm53_flash.cli import build_parser
    from glm53_flash.experiments.config import RerunnableStudyConfig
    from glm53_flash.experiments.registry import STUDIES, deck_entries

    assert list(STUDIES) == ["pretraining-data", "rl-choices", "rl-generalisation", "rl-switches", "pretrain-switches"]
    parser = build_parser()
    for name, study in STUDIES.items():
        assert study.name == name and issubclass(study.config, StudyConfig)
        assert study.rerunnable == issubclass(study.config, RerunnableStudyConfig), name
        args = parser.parse_args(["experiment", name, "--output", "o", *(["--checkpoint", "c"] if name == "rl-choices"
                                                                          else ["--source", "s"] if name == "rl-switches"
                                                                          else [])])
        assert args.study == name
    slides = [entry.slide_id for entry in deck_entries()]
    assert len(slides) == len(set(slides)) and slides[0] == "vision"
    targets = [t.name for study in STUDIES.values() for t in study.make_targets]
    assert len(targets) == len(set(targets)) and all(t.startswith("study-") for t in targets)


def test_the_makefiles_study_targets_are_the_registrys():
    """The Makefile's block of study targets is what the registry renders (`glm53 docs makefile` writes it)."""
    from glm53_flash.experiments.registry import MAKEFILE_BEGIN, with_makefile_block

    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    assert MAKEFILE_BEGIN in makefile and with_makefile_block(makefile) == makefile


def test_each_committed_studys_answer_states_its_result_after_its_holm_correction():
    """The docs' sentence of every committed study, rendered from its summary.json by its own study: it names
    the Holm correction and the levels its result holds at."""
    import re

    results = Path(__file__).resolve().parents[1] / "results"
    answers = {name: (report, sentence) for name, report, sentence in analysis.study_answers(results)}
    assert sorted(answers) == sorted(p.parent.name for p in results.glob("*/plan.json"))
    levels = {"pretraining-data": "seeds", "rl-choices": "RL seeds", "rl-generalisation": "groups and seeds",
              "rl-switches": "groups and seeds", "pretrain-switches": "groups and runs",
              "rl-choices-compositions": "groups and RL seeds", "rl-choices-temperature": "groups and RL seeds"}
    for name, (report, sentence) in answers.items():
        assert report == results / name / "REPORT.md" and report.is_file()
        named = next(level for prefix, level in sorted(levels.items(), key=lambda kv: -len(kv[0]))
                     if name.startswith(prefix))
        assert re.search(rf"shown after Holm over \d+ comparisons?, at {named}", sentence), (name, sentence)
    assert "linear_rope -6.5 points" in answers["pretrain-switches"][1].split("not shown")[0]
    assert answers["rl-switches-rerun"][1].endswith("Against the first study: every row holds in the rerun: yes.")
    block = analysis.render_study_answers(results.parent)
    assert block.splitlines()[0].startswith("- [pretrain-switches](results/pretrain-switches/REPORT.md): ")
