import json
from pathlib import Path

import pytest

from glm53_flash.experiments.reproduce import reproduce


def sealed_quick():
    """The quick plan with its confirm and holdout stages on the sealed splits themselves (the preset
    evaluates dev in their place, opening nothing): the pipeline's sealed path, for the tests."""
    from dataclasses import replace

    from glm53_flash.experiments.reproduce import PLANS

    plan = PLANS["quick"]
    return replace(plan, **{name: replace(getattr(plan, name), split=split) for name, split in (
        ("confirm_greedy", "confirm"), ("confirm_sampled", "confirm"), ("holdout_greedy", "holdout"),
        ("holdout_sampled", "holdout"))})


@pytest.fixture
def sealed_plans(monkeypatch):
    from glm53_flash.experiments import reproduce as module

    monkeypatch.setitem(module.PLANS, "quick", sealed_quick())


def test_the_quick_preset_is_a_smoke_test_that_opens_no_sealed_split(tmp_path, monkeypatch):
    from glm53_flash.evaluation import ledger
    from glm53_flash.evaluation import evaluate
    from glm53_flash.experiments import reproduce as module

    plan = module.PLANS["quick"]
    assert {cfg.split for cfg in (plan.confirm_greedy, plan.confirm_sampled, plan.holdout_greedy,
                                  plan.holdout_sampled)} == {"dev"}
    run = next(r for r in module.arm_runs(tmp_path / "smoke", "quick") if r.arm == "ours")
    monkeypatch.setattr(ledger, "require_open", lambda *a, **k: pytest.fail("a smoke plan asked for an opening"))
    assert module._require_openings(run, None) == {}
    from glm53_flash.model import lm

    monkeypatch.setattr(evaluate, "run_eval", lambda cfg, **kw: {"split": cfg.split, "opening": kw["opening"]})
    monkeypatch.setattr(lm, "load_pretrained", lambda checkpoint, device: (None, {"weights_sha256": "0" * 64}))
    monkeypatch.setattr(module, "_log", lambda message: None)
    module._evaluate_sealed(tmp_path / "confirm", module.sealed_stages(plan)["confirm"], {"before": "ckpt"}, None,
                            "cpu", "ours")
    written = sorted(p.name for p in (tmp_path / "confirm").iterdir())
    assert written == ["before-greedy.json", "before-pass4.json"]
    assert json.loads((tmp_path / "confirm" / written[0]).read_text()) == {"split": "dev", "opening": None}


@pytest.mark.slow
def test_quick_pipeline_end_to_end_both_arms_and_resume(tmp_path, capsys, sealed_plans):
    out = tmp_path / "demo"
    # fp32 is every CPU's default: the plan stays as it is and plan.json records what was asked for;
    # the thread governor is a run-time choice (not in the plan), recorded in the stages' receipts
    summary = reproduce(out, preset="quick", progress=False, precision="fp32", adapt_threads=True)
    assert set(summary["arms"]) == {"faithful", "ours"}
    # the arms differ in exactly the original's switches
    faithful_plan = summary["arms"]["faithful"]["plan"]
    ours_plan = summary["arms"]["ours"]["plan"]
    assert faithful_plan["pretrain"]["model_overrides"] == {
        "stream_mode": "double-residual", "linear_rope": "rope-before-feature-map", "balance_loss": "hard-count"}
    assert faithful_plan["pretrain"]["decay_all_parameters"] is True and ours_plan["pretrain"]["decay_all_parameters"] is False
    assert faithful_plan["rl"]["logprob_source"] == "untempered" and ours_plan["rl"]["logprob_source"] == "sampler"
    differing = {(stage, key) for stage in ours_plan if isinstance(ours_plan[stage], dict)
                 for key in ours_plan[stage] if ours_plan[stage][key] != faithful_plan[stage][key]}
    assert differing == {("pretrain", "model_overrides"), ("pretrain", "decay_all_parameters"),
                         ("rl", "logprob_source"), ("rl", "loss_normalization"), ("rl", "eos_handling")}
    for arm in ("faithful", "ours"):
        s = summary["arms"][arm]
        assert s["confirm_opened_after_selection"] is True and s["holdout"]["opened_after_selection"] is True
        seed = s["seeds"]["31415"]
        assert seed["greedy_trained"]["tasks"] == 12 and "untrained_interference" in seed
        # each sealed split: one opening for this arm's plan, every receipt recorded in the (test's own) ledger
        for lines, split in ((s["ledger"], "confirm"), (s["holdout"]["ledger"], "holdout")):
            assert len(lines) == 4 and len({line["opening_id"] for line in lines}) == 1
            assert {line["split"] for line in lines} == {split}
            assert {Path(line["receipt"]).name for line in lines} == {
                "before-greedy.json", "before-pass4.json", "rl-31415-greedy.json", "rl-31415-pass4.json"}
        report = (out / arm / "REPORT.md").read_text()
        assert "records one opening of the confirm split" in report
        # what the run computed in, and what --precision asked for (kept in plan.json beside the plan)
        assert s["precision"]["name"] == "fp32" and s["precision"]["requested"] == "fp32"
        assert "Precision: fp32 (asked for: fp32;" in report
        recorded = json.loads((out / arm / "plan.json").read_text())
        assert recorded["precision"]["requested"] == "fp32" and recorded["adapt_threads"] is True
        rows = [json.loads(line) for line in (out / arm / "pretrain" / "metrics.jsonl").read_text().splitlines()]
        assert all("threads" in row for row in rows if "loss" in row)  # each step's thread count: the governor ran
        assert "thread_changes" in json.loads((out / arm / "holdout" / "before-greedy.json").read_text())["timing"]
        # the strong set beside the three cases, per checkpoint, from the receipts
        strong = s["holdout"]["strong_tests"]["before"]
        receipt = json.loads((out / arm / "holdout" / "before-greedy.json").read_text())
        assert receipt["split"] == "holdout"
        assert strong["greedy"]["tasks_solved_strong"] == receipt["summary"]["tasks_solved_strong"]
        assert strong["greedy"]["false_passes"] == strong["greedy"]["tasks_solved"] - strong["greedy"]["tasks_solved_strong"]
        assert strong["greedy"]["strong_tests_total"] >= 50 * strong["greedy"]["tasks_total"]
        assert "versus the strong set" in report and "side by side with the original" in report
        assert "Ledger lines (holdout split, this plan)" in report and "## Holdout split" in report
        for chart in ("learning-curves", "dev-selection", "family-before-after", "per-seed-greedy"):
            assert (out / arm / "charts" / f"{chart}.png").stat().st_size > 1000
        # every number in the summary comes from the receipts: recompute from them and compare
        before = json.loads((out / arm / "confirm" / "before-greedy.json").read_text())
        assert seed["greedy_trained"]["before_solved"] == before["summary"]["tasks_solved"]
        row = summary["pretraining_seeds"][arm][0]
        assert row["pretrain_seed"] == 42 and row["holdout"]["before"] == receipt["summary"]["tasks_solved"]
    # the two-arm comparisons, each naming its method
    comparison = summary["comparison"]
    on_holdout = comparison["ours_vs_faithful_holdout"]["rows"]
    assert set(on_holdout) == {"before", "rl-31415"} and "McNemar" in comparison["ours_vs_faithful_holdout"]["method"]
    for row in on_holdout.values():
        assert row["ours_solved"] - row["faithful_solved"] == row["only_ours"] - row["only_faithful"]
        assert row["mcnemar_p_holm"] >= row["mcnemar_p"]
    original = comparison["faithful_reproduces_original"]
    assert original["rows"]["before"]["original"] == 0 and original["rows"]["rl-31415"]["original"] == 16
    assert comparison["over_pretraining_seeds"]["pretrain_seeds"] == [42]
    report = (out / "REPORT.md").read_text()
    assert "Reproduction of the original's 16/24 is not tested" in report and "Holm" in report and "make seeds" in report
    # its openings went to the test's own ledger, so the committed one vouches for none of its receipts
    assert "Not vouched for by the committed ledger" in report
    # one pretraining seed: no spread to test equivalence with, and the plan said so before it ran
    assert comparison["faithful_equivalent_to_original"]["p"] is None
    analysis = json.loads((out / "analysis-plan.json").read_text())
    assert analysis["stated"] == "before the run" and summary["power"]["stated"] == "before the run"
    assert analysis["power"]["questions"]["ours_vs_faithful_holdout"]["mdd_seeds"] is None  # one seed
    assert "## Power of this plan" in report and "cannot detect it" in report
    for row in on_holdout.values():
        assert row["units"] == len({e["unit"] for e in json.loads(
            (out / "ours" / "holdout" / "before-greedy.json").read_text())["episodes"]})
        assert row["unit_sign_flip_p_holm"] >= row["unit_sign_flip_p"]
    # a rerun resumes: no stage runs again, the sealed receipts are untouched
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("*/*/*.json") if p.parent.name in ("confirm", "holdout")}
    assert len(stamps) == 16
    trained = {p: p.read_bytes() for p in out.glob("*/*/training-receipt.json")}
    timed = {p: json.loads(p.read_text())["stage_seconds"] for p in out.glob("*/plan.json")}
    assert len(trained) == 4  # each arm's pretraining and RL seed
    again = reproduce(out, preset="quick", progress=False)
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    # the finished stages' receipts stay as the processes that trained wrote them
    assert {p: p.read_bytes() for p in trained} == trained
    # and their stage times are the work they took, not the rerun's finding them finished
    assert {p: json.loads(p.read_text())["stage_seconds"] for p in timed} == timed
    assert again["arms"]["ours"]["seeds"] == summary["arms"]["ours"]["seeds"]
    assert again["comparison"] == summary["comparison"]


def test_a_precision_that_resolves_to_the_default_is_the_same_plan(tmp_path):
    """`glm53 reproduce --precision auto` (what `make demo PRECISION=auto` passes): on a CPU without bf16 it resolves to
    fp32, the CPU's default, so every plan and its identity stay as they are (the committed headline's
    plan); on a CPU with AVX512-BF16 it is bf16 on every stage, a new plan. An explicit bf16 on a CPU
    without it is a new plan too (emulated)."""
    from dataclasses import replace

    from glm53_flash.experiments.reproduce import PLANS, ReproducePlan, arm_runs, plan_sha256, with_precision
    from glm53_flash.model.precision import resolve_precision

    plain = resolve_precision("auto", "cpu", cpuinfo="flags\t\t: fpu avx2 avx512f avx512_vnni")
    bf16 = resolve_precision("auto", "cpu", cpuinfo="flags\t\t: fpu avx2 avx512f avx512_bf16")
    assert (plain.name, bf16.name) == ("fp32", "bf16")
    plan = PLANS["headline"]
    assert with_precision(plan, plain, "cpu") is plan and with_precision(plan, None, "cpu") is plan
    assert with_precision(plan, resolve_precision("fp32", "cpu"), "cpu") is plan
    fast = with_precision(plan, bf16, "cpu")
    assert {getattr(fast, stage).precision for stage in ReproducePlan.STAGES} == {"bf16"}
    assert plan_sha256(fast) != plan_sha256(plan)
    assert ReproducePlan.from_dict(fast.to_dict()) == fast  # the new plan is recorded whole in plan.json
    emulated = with_precision(plan, resolve_precision("bf16", "cpu", cpuinfo="flags\t\t: avx2"), "cpu")
    assert plan_sha256(emulated) == plan_sha256(fast)
    ours = [r for r in arm_runs(tmp_path, "headline") if r.arm == "ours"]
    assert plain.record()["requested"] == "auto"  # what plan.json keeps beside an unchanged plan
    threaded = replace(plan, pretrain=replace(plan.pretrain, adapt_threads=True), rl=replace(plan.rl, adapt_threads=True))
    assert plan_sha256(threaded) == plan_sha256(plan)  # --adapt-threads is how a run runs, not what it is
    same = [r for r in arm_runs(tmp_path, "headline", precision=plain, device="cpu") if r.arm == "ours"]
    new = [r for r in arm_runs(tmp_path, "headline", precision=bf16, device="cpu") if r.arm == "ours"]
    assert [plan_sha256(r.plan) for r in same] == [plan_sha256(r.plan) for r in ours]
    assert all(r.plan.pretrain.precision == "bf16" and r.plan.confirm_greedy.precision == "bf16" for r in new)


def test_extra_pretraining_seeds_and_arms_are_checked_before_anything_runs(tmp_path):
    import pytest

    from glm53_flash.experiments.reproduce import arm_runs

    runs = arm_runs(tmp_path, "headline", extra_pretrain_seeds=(1, 2))
    assert [(r.arm, r.pretrain_seed, r.plan.rl_seeds, r.directory.name) for r in runs] == [
        ("faithful", 42, (31415, 27182, 16180), "faithful"), ("ours", 42, (31415, 27182, 16180), "ours"),
        ("faithful", 1, (31415,), "faithful-pretrain-1"), ("ours", 1, (31415,), "ours-pretrain-1"),
        ("faithful", 2, (31415,), "faithful-pretrain-2"), ("ours", 2, (31415,), "ours-pretrain-2")]
    for bad in (dict(extra_pretrain_seeds=(42,)), dict(extra_pretrain_seeds=(3, 3)), dict(arms=("mine",)),
                dict(arms=()), dict(rl_seeds=())):
        with pytest.raises(ValueError):
            reproduce(tmp_path / "x", preset="quick", progress=False, **bad)
    assert not (tmp_path / "x").exists()
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "plan.json").write_text("{}")
    with pytest.raises(ValueError, match="older version"):
        reproduce(tmp_path / "old", preset="quick", progress=False)


def test_a_different_plan_in_the_same_directory_is_refused(tmp_path):
    import pytest

    (tmp_path / "ours").mkdir()
    (tmp_path / "ours" / "plan.json").write_text(json.dumps({"preset": "quick", "plan": {"model_preset": "other"}}))
    with pytest.raises(ValueError, match="different plan"):
        reproduce(tmp_path, preset="quick", progress=False, arms=("ours",))


def test_a_plan_is_made_of_the_stage_configs_and_round_trips():
    from glm53_flash.evaluation.config import EvalConfig
    from glm53_flash.experiments.reproduce import PLANS, ReproducePlan
    from glm53_flash.train.config import PretrainConfig, RLConfig, SelectConfig

    for plan in PLANS.values():
        # the plan copies no knob: each stage is the config its own command takes
        assert isinstance(plan.pretrain, PretrainConfig) and isinstance(plan.rl, RLConfig)
        assert isinstance(plan.select_rl, SelectConfig) and isinstance(plan.confirm_sampled, EvalConfig)
        record = json.loads(json.dumps(plan.to_dict()))
        assert ReproducePlan.from_dict(record) == plan or ReproducePlan.from_dict(record).to_dict() == plan.to_dict()
        assert "output" not in record["pretrain"] and "device" not in record["rl"] and "seed" not in record["rl"]


def test_corrupt_plans_are_one_line_errors(tmp_path):
    import pytest

    from glm53_flash.experiments.reproduce import ReproducePlan

    for bad in ([], {"pretrain": []}, {"rl_groups": 1}, {k: {} for k in ("pretrain", "rl")}):
        with pytest.raises(ValueError):
            ReproducePlan.from_dict(bad)
    (tmp_path / "ours").mkdir()
    (tmp_path / "ours" / "plan.json").write_text("[]")
    with pytest.raises(ValueError, match="not a plan"):
        reproduce(tmp_path, preset="quick", progress=False, arms=("ours",))


def test_a_second_directory_of_the_same_plan_must_give_a_reason_to_reopen_confirm(tmp_path, monkeypatch,
                                                                                   sealed_plans, private_ledger):
    """The plan's first run opened confirm (recorded in the ledger); another run of the same plan is
    refused before any stage runs, and goes ahead, recorded, with a reason."""
    import pytest

    from glm53_flash.evaluation import ledger

    from glm53_flash.experiments import reproduce as module

    monkeypatch.setattr(module, "_log", lambda message: None)
    plan = module.PLANS["quick"]
    first = ledger.require_open("confirm", module.CONFIRM_PURPOSE, plan_sha256=module.plan_sha256(plan))
    receipt = tmp_path / "stand-in.json"
    receipt.write_text("{}")
    first.activate()
    first.record(receipt)
    first.close()
    with pytest.raises(ledger.SealedSplitError, match="--reopen"):
        reproduce(tmp_path / "second", preset="quick", progress=False, ledger=private_ledger)
    assert not (tmp_path / "second").exists()  # refused before anything was written
    # with a reason, it goes ahead: the reason is recorded where the plan opened the split before, and
    # nowhere else (the holdout split was never opened for it)
    run = next(r for r in module.arm_runs(tmp_path / "second", "quick") if r.arm == "ours")
    openings = module._require_openings(run, "rerunning the committed plan", private_ledger)
    assert openings["confirm"].reopen == "rerunning the committed plan" and openings["holdout"].reopen is None
    for opening in openings.values():
        opening.close()
    assert not (tmp_path / "second").exists()


def test_reports_say_when_the_holdout_split_was_first_opened_and_how_often_since():
    """A reopened holdout split is not described as never opened: the reports give the plan's first
    opening (date and commit) and the count of openings, from the ledger lines in the summary."""
    from glm53_flash.report.arms import holdout_history
    from glm53_flash.report.headline import holdout_lines

    def line(opening, utc, commit, reopen=None):
        return {"opening_id": opening, "utc": utc, "commit": commit, "reopen": reopen, "split": "holdout",
                "receipt": f"runs/x/holdout/{opening}.json", "receipt_sha256": "0" * 64, "plan_sha256": "1" * 64,
                "purpose": "p", "command": ["glm53"]}

    lines = [line("a", "2026-12-01T02:56:43+00:00", "22b479e5"), line("a", "2026-12-01T02:56:45+00:00", "22b479e5"),
             line("b", "2026-12-02T01:00:00+00:00", "54a3da41", reopen="regenerating the headline")]
    summary = {"arms": {"faithful": {"holdout": {"ledger": lines}}, "ours": {"holdout": {"ledger": lines[:2]}}}}
    history = holdout_history(summary)
    assert history == ("faithful: first opened 2026-12-01 at commit 22b479e, 2 opening(s) in all, the later ones "
                       "each with its reason; ours: first opened 2026-12-01 at commit 22b479e, 1 opening(s) in all")
    assert holdout_history({"arms": {"ours": {}}}) == "no opening recorded in the ledger"
    from glm53_flash.report.summary import RunSummary

    committed = json.loads((Path(__file__).resolve().parents[1] / "results/headline/ours/summary.json").read_text())
    committed["holdout"]["ledger"] = lines
    text = "\n".join(holdout_lines(RunSummary.from_dict(committed)))
    assert "never" not in text
    assert "2 opening(s) of the holdout split for this plan, the first at 2026-12-01T02:56:43+00:00 (commit 22b479e)" in text
    assert "regenerating the headline" in text  # the reason, in the ledger table
