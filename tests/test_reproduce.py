import json
from pathlib import Path

from glm53_flash.reproduce import reproduce


def test_quick_pipeline_end_to_end_and_resume(tmp_path, capsys):
    out = tmp_path / "demo"
    summary = reproduce(out, preset="quick", progress=False)
    assert summary["confirm_opened_after_selection"] is True
    seed = summary["seeds"]["31415"]
    assert seed["greedy_trained"]["tasks"] == 12 and "untrained_interference" in seed
    # confirm is sealed: one opening for this plan, every receipt recorded in the (test's own) ledger
    assert len(summary["ledger"]) == 4 and len({line["opening_id"] for line in summary["ledger"]}) == 1
    assert {Path(line["receipt"]).name for line in summary["ledger"]} == {
        "before-greedy.json", "before-pass4.json", "rl-31415-greedy.json", "rl-31415-pass4.json"}
    report = (out / "REPORT.md").read_text()
    assert "records one opening of the confirm split" in report
    # the strong set beside the three cases, per arm, from the receipts
    strong = summary["strong_tests"]["before"]
    receipt = json.loads((out / "confirm" / "before-greedy.json").read_text())
    assert strong["greedy"]["tasks_solved_strong"] == receipt["summary"]["tasks_solved_strong"]
    assert strong["greedy"]["tasks_solved"] == receipt["summary"]["tasks_solved"]
    assert strong["greedy"]["false_passes"] == strong["greedy"]["tasks_solved"] - strong["greedy"]["tasks_solved_strong"]
    assert strong["greedy"]["strong_tests_total"] >= 50 * strong["greedy"]["tasks_total"]
    assert "versus the strong set" in report
    assert "side by side with the original" in report and "16/24" in report
    for chart in ("learning-curves", "dev-selection", "family-before-after", "per-seed-greedy"):
        assert (out / "charts" / f"{chart}.png").stat().st_size > 1000
    for path in ("pretrain/selection-dev.json", "rl-31415/selection-dev.json", "confirm/before-greedy.json",
                 "confirm/rl-31415-pass4.json"):
        assert (out / path).is_file(), path
    # every number in the summary comes from the receipts: recompute from them and compare
    before = json.loads((out / "confirm" / "before-greedy.json").read_text())
    assert seed["greedy_trained"]["before_solved"] == before["summary"]["tasks_solved"]
    # a rerun resumes: no stage runs again, the confirm receipts are untouched
    stamp = (out / "confirm" / "before-greedy.json").stat().st_mtime_ns
    again = reproduce(out, preset="quick", progress=False)
    assert (out / "confirm" / "before-greedy.json").stat().st_mtime_ns == stamp
    assert again["seeds"] == summary["seeds"]


def test_a_different_plan_in_the_same_directory_is_refused(tmp_path):
    import pytest

    (tmp_path / "plan.json").write_text(json.dumps({"preset": "quick", "plan": {"model_preset": "other"}}))
    with pytest.raises(ValueError, match="different plan"):
        reproduce(tmp_path, preset="quick", progress=False)


def test_a_plan_is_made_of_the_stage_configs_and_round_trips():
    from glm53_flash.evaluate_config import EvalConfig
    from glm53_flash.reproduce import PLANS, ReproducePlan
    from glm53_flash.train.config import PretrainConfig, RLConfig, SelectConfig

    for plan in PLANS.values():
        # the plan copies no knob: each stage is the config its own command takes
        assert isinstance(plan.pretrain, PretrainConfig) and isinstance(plan.rl, RLConfig)
        assert isinstance(plan.select_rl, SelectConfig) and isinstance(plan.confirm_sampled, EvalConfig)
        record = json.loads(json.dumps(plan.to_dict()))
        assert ReproducePlan.from_dict(record) == plan or ReproducePlan.from_dict(record).to_dict() == plan.to_dict()
        assert "output" not in record["pretrain"] and "device" not in record["rl"] and "seed" not in record["rl"]


def test_the_flat_plan_of_older_runs_still_reads():
    from pathlib import Path

    from glm53_flash.reproduce import PLANS, ReproducePlan

    committed = json.loads((Path(__file__).parents[1] / "results" / "headline" / "plan.json").read_text())["plan"]
    assert "rl_groups" in committed  # written before plans were composed of stage configs
    assert ReproducePlan.from_dict(committed).to_dict() == PLANS["headline"].to_dict()


def test_corrupt_plans_are_one_line_errors(tmp_path):
    import pytest

    from glm53_flash.reproduce import ReproducePlan

    for bad in ([], {"pretrain": []}, {"rl_groups": 1}):
        with pytest.raises(ValueError):
            ReproducePlan.from_dict(bad)
    (tmp_path / "plan.json").write_text("[]")
    with pytest.raises(ValueError, match="not a plan"):
        reproduce(tmp_path, preset="quick", progress=False)


def test_a_second_directory_of_the_same_plan_must_give_a_reason_to_reopen_confirm(tmp_path, monkeypatch):
    """The plan's first run opened confirm (recorded in the ledger); another run of the same plan is
    refused before any stage runs, and goes ahead, recorded, with a reason."""
    import pytest

    from glm53_flash import ledger, reproduce as module

    monkeypatch.setattr(module, "_log", lambda message: None)
    plan = module.PLANS["quick"]
    first = ledger.require_open("confirm", module.CONFIRM_PURPOSE, plan_sha256=module.plan_sha256(plan))
    receipt = tmp_path / "stand-in.json"
    receipt.write_text("{}")
    first.record(receipt)
    first.close()
    with pytest.raises(ledger.SealedSplitError, match="--reopen"):
        reproduce(tmp_path / "second", preset="quick", progress=False)
    assert not (tmp_path / "second").exists()  # refused before anything was written
