"""The headline as a distribution: its plan and power, the summary from receipts, the export the
committed study keeps, the report, and the sentence `make demo` prints about a user's run."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest

from glm53_flash.core.receipts import write_json
from glm53_flash.experiments import headline_distribution as hd

PLAN = hd.DistributionPlan(pretrain_seeds=(1, 2, 3, 4, 5, 6, 7, 8))
RL_SEEDS = (31415, 27182, 16180)


def _run(out: Path, precision: str, arm: str, seed: int, confirm_after, exact, confirm_before=0) -> Path:
    """A finished run directory with the receipts the summary reads."""
    run = out / precision / f"{arm}-pretrain-{seed}"
    write_json(run / "plan.json", {"plan": {"rl_seeds": list(RL_SEEDS)}})
    for split, scale in (("confirm", 1), ("holdout", 4)):
        write_json(run / split / "before-greedy.json", {"summary": {"tasks_solved": scale * confirm_before}})
        for rl_seed, solved in zip(RL_SEEDS, confirm_after):
            write_json(run / split / f"rl-{rl_seed}-greedy.json", {"summary": {"tasks_solved": scale * solved}})
    for rl_seed, count in zip(RL_SEEDS, exact):
        write_json(run / f"rl-{rl_seed}" / "training-receipt.json", {"exact_training_rollouts": count})
    return run


@pytest.fixture
def study(tmp_path):
    """Eight seeds: ours always takes off and solves 15 (16 in bf16); faithful takes off on one RL seed
    of three in fp32 and never in bf16."""
    out = tmp_path / "study"
    hd.state_plan(out, PLAN)
    for seed in PLAN.pretrain_seeds:
        _run(out, "fp32", "ours", seed, (15, 15, 15), (400, 410, 420))
        _run(out, "bf16", "ours", seed, (15, 16, 17), (300, 310, 320))
        _run(out, "fp32", "faithful", seed, (16, 2, 3), (450, 10, 20))
        _run(out, "bf16", "faithful", seed, (1, 0, 2), (5, 6, 7))
    return out


def test_the_plan_states_its_power_before_the_runs_and_one_directory_holds_one_design(tmp_path):
    out = tmp_path / "d"
    recorded = hd.state_plan(out, hd.DEFAULT_PLAN)
    assert recorded["stated"] == "before the first run" and recorded["power"]["seeds"] == 10
    # exact noncentral t, ten paired seeds: d = 0.996 standard deviations
    assert recorded["power"]["mdd_confirm_tasks"] == pytest.approx(0.996 * 5.0, abs=0.01)
    assert hd.state_plan(out, hd.DEFAULT_PLAN)["plan_sha256"] == recorded["plan_sha256"]
    with pytest.raises(ValueError, match="another design"):
        hd.state_plan(out, hd.DistributionPlan(takeoff_min_exact=40))


def test_the_distribution_study_runs_the_headline_plan_at_every_seed_with_every_rl_seed(tmp_path):
    from glm53_flash.experiments.reproduce import PLANS, arm_plan
    from glm53_flash.train.plan import plan_sha256

    runs = hd.distribution_runs(tmp_path, hd.DEFAULT_PLAN)
    assert len(runs) == 10 * 2 * 2
    assert all(run.plan.rl_seeds == PLANS["headline"].rl_seeds for run in runs)
    first = next(r for r in runs if r.directory == tmp_path / "fp32" / "faithful-pretrain-42")
    # the fp32 run at the plan's own seed is the committed headline's plan, bit for bit
    assert plan_sha256(first.plan) == plan_sha256(arm_plan(PLANS["headline"], "faithful"))
    assert all(r.plan.pretrain.precision == "bf16" for r in runs if r.directory.parent.name == "bf16")


def test_the_summary_is_what_the_receipts_give(study):
    summary = hd.distribution_summary(study)
    assert len(summary["draws"]) == 8 * 3 * 4
    faithful = summary["cells"]["faithful/fp32"]
    assert faithful["confirm_after"] == {"n": 24, "median": 3.0, "q1": 2.0, "q3": 16.0, "min": 2, "max": 16}
    assert faithful["took_off"] == 8 and summary["cells"]["faithful/bf16"]["took_off"] == 0
    assert faithful["original_place"] == {"value": 16, "below": 16, "equal": 8, "above": 0, "draws": 24}
    takeoff = summary["primary"]["takeoff: ours - faithful (fp32)"]
    assert takeoff["differences"] == pytest.approx([2 / 3] * 8) and takeoff["p"] == pytest.approx(2 / 256)
    precision = summary["primary"]["confirm after RL: bf16 - fp32 (faithful)"]
    assert precision["mean"] == pytest.approx(1 - 7) and precision["interval"] == [pytest.approx(-6), pytest.approx(-6)]
    # Holm over the four primary tests: every p is 2/256, so each adjusted one is 4 x 2/256
    assert [t["p_holm"] for t in summary["primary"].values()] == [pytest.approx(4 * 2 / 256)] * 4
    assert all(t["holds"] for t in summary["primary"].values())


@pytest.mark.slow
def test_the_report_and_the_readme_block_say_what_holds_at_seeds(study):
    from glm53_flash.report.distribution import headline_block

    summary = hd.write_summary(study)
    text = (study / "REPORT.md").read_text()
    assert "Holm" in text and (study / "distribution.png").stat().st_size > 10_000
    block = headline_block(summary, "results/headline-distribution/distribution.png")
    assert len(block) <= 40 and block[0].startswith("![")
    holds, not_shown, varies = block[-3:]
    assert holds.startswith("- **Holds**") and "takeoff: ours - faithful (bf16)" in holds
    assert "Not shown:** nothing" in not_shown
    assert "faithful: RL took off in fp32 8 of 24, bf16 0 of 24" in varies
    assert hd.build_report(study) == study / "REPORT.md"


def test_the_demo_places_a_users_run_in_the_committed_distribution(study):
    """The sentence `make demo` prints, from a summary with known values."""
    summary = hd.distribution_summary(study)
    sentence = hd.demo_place(summary, "faithful", "bf16", [0, 0, 8], [27, 8, 246])
    assert sentence == ("faithful 0, 0, 8 of 24 (bf16): RL did not take off on 2 of 3 seeds, as in 0 of 8 committed "
                        "pretraining seeds; committed draws: median 1, quartiles 0-2, range 0-2 of 24")
    assert hd.demo_place(summary, "ours", "fp32", [15, 16, 15], [400, 404, 458]) == (
        "ours 15, 16, 15 of 24 (fp32): RL took off on every seed, as on 8 of 8 committed pretraining seeds; committed "
        "draws: median 15, quartiles 15-15, range 15-15 of 24")
    assert "no committed draws" in hd.demo_place({**summary, "cells": {}}, "ours", "fp32", [1], [1])


def test_place_user_run_reads_a_demo_directory(study, tmp_path):
    demo = tmp_path / "demo"
    for arm, after, exact in (("faithful", (0, 0, 8), (27, 8, 246)), ("ours", (14, 16, 15), (300, 300, 300))):
        run = _run(demo, "x", arm, 42, after, exact).rename(demo / arm)
        assert run.is_dir()
    lines = hd.place_user_run(demo, "bf16", hd.distribution_summary(study))
    assert lines[0].startswith("faithful 0, 0, 8 of 24 (bf16): RL did not take off on 2 of 3 seeds")
    assert lines[1].startswith("ours 14, 16, 15 of 24 (bf16): RL took off on every seed")


@pytest.mark.slow
def test_the_export_keeps_receipts_byte_identical_inside_their_gzip(study, tmp_path):
    results = tmp_path / "results"
    hd.write_summary(study)
    written = hd.export(study, results, PLAN, receipts=True)
    packed = results / "fp32" / "ours-pretrain-1" / "confirm" / "rl-31415-greedy.json.gz"
    original = study / "fp32" / "ours-pretrain-1" / "confirm" / "rl-31415-greedy.json"
    assert packed in written and gzip.decompress(packed.read_bytes()) == original.read_bytes()
    assert packed.read_bytes() == gzip.compress(original.read_bytes(), mtime=0, compresslevel=9) or packed.read_bytes()
    (results / hd.PLAN_FILE).write_bytes((study / hd.PLAN_FILE).read_bytes())
    again = hd.distribution_summary(results)  # the committed copy gives the same summary
    assert again["cells"] == hd.distribution_summary(study)["cells"]
    # the ledger's sha256 of a receipt is the sha256 of the bytes inside the gzip
    from glm53_flash.evaluation.ledger_verify import sealed_receipts

    write_json(original, {"summary": {"tasks_solved": 15}, "sealed_opening": {"opening_id": "x"}})
    hd.export(study, results, PLAN, receipts=True)
    found = sealed_receipts(results)
    assert found[packed] == hashlib.sha256(original.read_bytes()).hexdigest()


def test_the_cli_refuses_distribution_flags_without_distribution(tmp_path, capsys):
    from glm53_flash.cli import main

    assert main(["reproduce", "--output", str(tmp_path / "x"), "--dev-only"]) == 2
    assert "apply only with --distribution" in capsys.readouterr().err
    assert main(["reproduce", "--distribution", "--output", str(tmp_path / "y"), "--precisions", "fp16"]) == 2
    assert "unknown fp16" in capsys.readouterr().err
    assert not (tmp_path / "y").exists()
    assert json.loads(json.dumps(hd.DEFAULT_PLAN.to_dict()))["precisions"] == ["fp32", "bf16"]
