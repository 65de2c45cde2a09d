"""The committed results and the docs agree: every study's answer docs/STUDIES.md shows is the block its
summary.json (built from receipts) renders, so no figure there is typed by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def assert_same_results(got, expected, where: str = "") -> None:
    """Two JSON values equal, each float within 1e-9 relative (or 1e-12 absolute): sums, least squares and the
    t distribution round differently in the last bits on another CPU's math library (an AVX2 machine rebuilding
    what an AVX-512 one committed), which changes no figure any report shows."""
    got = json.loads(json.dumps(got))
    if isinstance(expected, dict) and isinstance(got, dict):
        assert sorted(got) == sorted(expected), where
        for key in expected:
            assert_same_results(got[key], expected[key], f"{where}/{key}")
    elif isinstance(expected, list) and isinstance(got, list):
        assert len(got) == len(expected), where
        for i, (a, b) in enumerate(zip(got, expected)):
            assert_same_results(a, b, f"{where}[{i}]")
    elif isinstance(expected, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        assert math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-12), f"{where}: {got} != {expected}"
    else:
        assert got == expected and isinstance(got, bool) == isinstance(expected, bool), f"{where}: {got!r} != {expected!r}"


def _makefile_command(target: str, variables: dict[str, str]) -> list[str]:
    """The arguments after `glm53` of a Makefile target's one recipe command, variables filled in."""
    import re
    import shlex

    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip().rstrip("\\").strip())
    command = re.sub(r"\$\((\w+)\)", lambda m: variables[m.group(1)], " ".join(recipe))
    words = shlex.split(command)
    assert words[0] == "BIN/glm53", command
    return words[1:]


@pytest.mark.parametrize("target, first", [("study-generalisation-rerun", "rl-generalisation"),
                                           ("study-pretrain-switches-rerun", "pretrain-switches")])
@pytest.mark.slow
def test_the_makefiles_reruns_are_reruns_of_the_committed_studies(target, first, tmp_path, monkeypatch):
    """Each rerun target, planned as the Makefile runs it (STUDY_PRECISION's bf16 on any CPU), passes the design
    check against the committed first study: a study default changed since the first study ran would make
    the rerun incomparable, and this fails before anyone spends the hours."""
    import re

    from glm53_flash.cli import main
    from glm53_flash.experiments import generalisation, pretrain_switches

    fake = {"seconds_per_step": 0.01, "seconds_per_rollout": 0.01, "seconds_per_eval_task": 0.01, "probe": "a test's"}
    for module in (generalisation, pretrain_switches):
        monkeypatch.setattr(module, "measure_speed", lambda *args, **kwargs: dict(fake))
    precision = re.search(r"^STUDY_PRECISION \?= (\w+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    args = _makefile_command(target, {"BIN": "BIN", "STUDY_PRECISION": precision, "STUDY_PURPOSE": "test",
                                      "PRETRAIN_SWITCHES_PURPOSE": "test"})
    assert args[args.index("--rerun-of") + 1] == f"results/{first}"
    args[args.index("--rerun-of") + 1] = str(ROOT / "results" / first)
    args[args.index("--output") + 1] = str(tmp_path / "rerun")
    monkeypatch.chdir(tmp_path)
    assert main([*args, "--plan-only", "--quiet"]) == 0
    plan = json.loads((tmp_path / "rerun" / "plan.json").read_text())
    committed = json.loads((ROOT / "results" / first / "plan.json").read_text())
    assert plan["design"]["precision"] == committed["design"]["precision"] == precision
    assert not set(plan["design"]["seeds"]) & set(committed["design"]["seeds"])


def test_the_results_comparison_tolerates_only_the_last_bits_of_floats():
    assert_same_results({"a": [1.0, 2], "b": "x"}, {"a": [1.0 + 1e-13, 2], "b": "x"})
    for got in ({"a": [1.0001, 2], "b": "x"}, {"a": [1.0, 3], "b": "x"}, {"a": [1.0, 2], "b": "y"},
                {"a": [1.0, 2]}, {"a": [1.0], "b": "x"}, {"a": [True, 2], "b": "x"}):
        with pytest.raises(AssertionError):
            assert_same_results(got, {"a": [1.0, 2], "b": "x"})


@pytest.mark.parametrize("name", sorted(p.parent.name for p in (ROOT / "results").glob("*/plan.json")))
def test_studies_doc_shows_each_committed_study_as_generated(name):
    """Every committed study (results/*/plan.json) has its answer in docs/STUDIES.md as a block `glm53 docs build`
    renders from its summary (what holds after its Holm correction), with a link to its REPORT.md."""
    from glm53_flash.commands.docs import blocks
    from glm53_flash.report.docs import segments

    text = (ROOT / "docs" / "STUDIES.md").read_text()
    shown = {block: lines for block, lines in segments(text) if block is not None}
    block = f"study-answer-{name}"
    assert block in shown, f"docs/STUDIES.md has no generated block {block!r}"
    assert shown[block] == blocks(ROOT)[block](ROOT).split("\n"), f"{block} is not what `glm53 docs build` renders"
    assert f"](../results/{name}/REPORT.md)" in "\n".join(shown[block])
    assert (ROOT / "results" / name / "REPORT.md").is_file()


@pytest.mark.parametrize("name", ["pretraining-data", "pretraining-data-no-positions", "rl-choices",
                                  "rl-choices-compositions", "rl-choices-compositions-rerun",
                                  "rl-choices-temperature-11", "rl-choices-temperature-12", "pretrain-switches",
                                  "pretrain-switches-rerun"])
def test_study_results_are_committed_with_their_plan_and_receipts(name):
    directory = ROOT / "results" / name
    plan = json.loads((directory / "plan.json").read_text())
    summary = json.loads((directory / "summary.json").read_text())
    receipts = [json.loads(p.read_text()) for p in sorted((directory / "runs").glob("*.json"))]
    assert summary["plan_sha256"] == plan["plan_sha256"]
    assert receipts and all(r["plan_sha256"] == plan["plan_sha256"] for r in receipts)
    assert summary["runs"] == len(receipts) == len(plan["units"])
    assert all(p.stat().st_size < 1_000_000 for p in directory.rglob("*") if p.is_file())


# The committed headlines: the directory under results/ and the one its run wrote (the ledger's receipt paths).
HEADLINES = {"headline": "runs/demo/", "headline-bf16": "runs/demo-bf16/"}


@pytest.mark.parametrize("name", HEADLINES)
def test_the_committed_ledger_records_every_committed_sealed_receipt_once(name):
    """Each sealed-split receipt of a committed headline has exactly one ledger line whose sha256 is
    the committed file's (the run wrote runs/demo/...; its receipts are committed under results/headline/),
    all of them from one opening of its split for its plan; the plan's first opening of a split needed no
    reason and every later one (timing runs, the rerun that made the committed headline) records its
    reason."""
    from glm53_flash.core.receipts import sha256_file

    headline = ROOT / "results" / name
    # the openings of the committed runs' plans, as their summaries recorded them (a user's later
    # `make demo` appends openings of its own to the same file; those are not in the summaries)
    committed = {line["opening_id"] for path in headline.glob("*/summary.json")
                 for summary in [json.loads(path.read_text())]
                 for line in summary["ledger"] + summary["holdout"]["ledger"]}
    lines = [json.loads(line) for line in (ROOT / "results" / "ledger.jsonl").read_text().splitlines() if line]
    lines = [line for line in lines if line["opening_id"] in committed]
    written = [line for line in lines if line.get("kind") != "opened"]  # receipt lines (a write-ahead opening's
    # own line names no receipt)
    receipts = sorted(p for split in ("confirm", "holdout") for p in headline.glob(f"*/{split}/*.json"))
    assert receipts
    openings = {}  # (split, plan) -> opening ids in the ledger's order
    for line in lines:
        ids = openings.setdefault((line["split"], line["plan_sha256"]), [])
        if line["opening_id"] not in ids:
            ids.append(line["opening_id"])
    for line in lines:
        first = openings[(line["split"], line["plan_sha256"])][0]
        assert (line["reopen"] is None) == (line["opening_id"] == first), line
    # the committed receipts are one opening's per (split, plan); later openings (timing runs) kept none
    used = set()
    for path in receipts:
        relative = str(path.relative_to(headline))
        matches = [line for line in written if line["receipt"].removeprefix(HEADLINES[name]) == relative
                   and line["receipt_sha256"] == sha256_file(path)]
        assert len(matches) == 1, f"{relative}: {len(matches)} ledger lines with its sha256"
        assert matches[0]["split"] == path.parent.name
        used.add(matches[0]["opening_id"])
    assert len(used) == len(openings)  # one opening per (split, plan) made the committed receipts
    # every receipt of those openings is committed
    assert len([line for line in written if line["opening_id"] in used]) == len(receipts)


def test_committed_plans_and_runs_use_the_current_option_names():
    """The committed files were migrated once to the option values named by behaviour (the code keeps
    no table of old spellings): no plan, receipt or run record under results/ spells them, every
    reproduce plan reads back as itself, and a migrated study plan says what was renamed."""
    import re

    from glm53_flash.train.plan import ReproducePlan

    old = re.compile(r'"(logprob_source|eos_handling|stream_mode|balance_loss)": "original"|'
                     r'"linear_rope": "before_feature"|"rl_groups"')
    spelled = [str(p.relative_to(ROOT)) for p in (ROOT / "results").rglob("*.json") if old.search(p.read_text())]
    assert spelled == []
    plans = sorted(path for name in HEADLINES for path in (ROOT / "results" / name).glob("*/plan.json"))
    assert len(plans) == 12
    for path in plans:
        recorded = json.loads(path.read_text())["plan"]
        assert ReproducePlan.from_dict(recorded).to_dict() == recorded, path
    migrated = json.loads((ROOT / "results" / "rl-choices" / "plan.json").read_text())["migrated"]
    assert set(migrated["renamed_values"]) == {"design.recipe.logprob_source", "design.recipe.eos_handling"}


def test_committed_run_summaries_read_as_their_type_and_back():
    """Every headline run's summary.json reads as a RunSummary (every field checked) and writes back as
    the same JSON; a summary with a missing or mistyped field is a one-line error naming it."""
    from glm53_flash.report.summary import RunSummary

    paths = sorted(path for name in HEADLINES for path in (ROOT / "results" / name).glob("*/summary.json"))
    assert len(paths) == 12  # six runs of each headline (three pretraining seeds per arm)
    for path in paths:
        recorded = json.loads(path.read_text())
        summary = RunSummary.read(path)
        assert summary.to_dict() == recorded
        assert summary.rl_seeds == [str(s) for s in recorded["plan"]["rl_seeds"]]
    recorded = json.loads(paths[0].read_text())
    for spoil, rule in ((lambda d: d.pop("seeds"), "missing seeds"),
                        (lambda d: d.update(confirm_opened_after_selection="yes"), "'confirm_opened_after_selection'"),
                        (lambda d: d.update(extra=1), "unknown fields extra"),
                        (lambda d: d["holdout"].pop("ledger"), "'holdout' must hold"),
                        (lambda d: d["plan"].pop("rl"), "its plan does not read")):
        spoilt = json.loads(json.dumps(recorded))
        spoil(spoilt)
        with pytest.raises(ValueError, match=rule):
            RunSummary.from_dict(spoilt, source="x")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rl-generalisation", "rl-generalisation-rerun"])
def test_the_rl_generalisation_results_rebuild_from_their_receipts_and_each_sealed_one_is_in_the_ledger_once(name):
    """results/rl-generalisation/ and its rerun: every receipt is of the committed plan, the summary is what the analysis
    computes from them, every sealed receipt is the newest ledger line with its sha256 under its own (arm, seed)
    identity (a second line only with its reason), and every file is under 1 MB."""
    from glm53_flash.experiments.runner import sealed_identity
    from glm53_flash.core.receipts import sha256_file
    from glm53_flash.evaluation.ledger import read_ledger
    from glm53_flash.experiments import generalisation

    directory = ROOT / "results" / name
    plan = json.loads((directory / "plan.json").read_text())
    receipts = [json.loads(p.read_text()) for p in sorted((directory / "runs").glob("*.json"))]
    assert receipts and all(r["plan_sha256"] == plan["plan_sha256"] for r in receipts)
    summary = json.loads((directory / "summary.json").read_text())
    rebuilt = generalisation.compute(plan, receipts)
    for key in ("sealed", "dev", "pretraining_on_dev"):
        assert_same_results(rebuilt[key], summary[key], key)
    assert summary["headline_table"] == generalisation.headline_table(rebuilt)
    assert summary["complete"] == (len(receipts) == len(plan["units"]))
    lines = read_ledger(ROOT / "results" / "ledger.jsonl")
    for path in sorted((directory / "runs").glob("sealed-*.json")):
        receipt = json.loads(path.read_text())
        identity = sealed_identity(plan["plan_sha256"], path.stem)
        assert receipt["sealed_opening"]["plan_sha256"] == identity
        mine = [line for line in lines if line["plan_sha256"] == identity]
        # the committed receipt is the newest opening's; an earlier one is allowed only when this one
        # gives the reason (its receipt was lost unread), and there is at most one earlier
        assert mine and mine[-1]["receipt_sha256"] == sha256_file(path), path.name
        assert all(line["split"] == receipt["split"] for line in mine)
        assert mine[0]["reopen"] is None and len(mine) <= 2, path.name
        if len(mine) == 2:
            assert mine[1]["reopen"] and "lost" in mine[1]["reopen"], path.name
            assert mine[0]["receipt_sha256"] != mine[1]["receipt_sha256"]
    # every opening of the plan in the ledger has its committed receipt (none lost unrecorded)
    sealed_units = {sealed_identity(plan["plan_sha256"], u["key"]) for u in plan["units"] if u["phase"] == "sealed"}
    opened = {line["plan_sha256"] for line in lines} & sealed_units
    assert opened == {sealed_identity(plan["plan_sha256"], p.stem) for p in (directory / "runs").glob("sealed-*.json")}
    assert all(p.stat().st_size < 1_000_000 for p in directory.rglob("*") if p.is_file())


@pytest.mark.slow
def test_the_rerun_comparison_is_what_both_studies_receipts_give():
    from glm53_flash.experiments import generalisation, reruns

    rerun = ROOT / "results" / "rl-generalisation-rerun"
    first_plan, first_receipts = reruns.load(ROOT / "results" / "rl-generalisation")
    plan, receipts = reruns.load(rerun)
    summary = json.loads((rerun / "summary.json").read_text())
    assert_same_results(generalisation.compare_rerun(first_plan, first_receipts, plan, receipts), summary["rerun"],
                        "rerun")


@pytest.mark.slow
def test_the_rl_choices_rerun_comparison_is_what_both_studies_receipts_give():
    """The compositions RL-choices screen and its rerun from another pretraining seed's checkpoint: the
    committed comparison rebuilds from the receipts; a rerun from the same weights, or of another design,
    is refused."""
    from glm53_flash.experiments import reruns, rl_choices

    rerun = ROOT / "results" / "rl-choices-compositions-rerun"
    first_plan, first_receipts = reruns.load(ROOT / "results" / "rl-choices-compositions")
    plan, receipts = reruns.load(rerun)
    summary = json.loads((rerun / "summary.json").read_text())
    first, second = (rl_choices.compute(Path("."), p, r) for p, r in ((first_plan, first_receipts), (plan, receipts)))
    assert_same_results(rl_choices.compare_rerun(first_plan, first, plan, second), summary["rerun"], "rerun")
    assert summary["rerun"]["first"]["candidate"] == summary["rerun"]["rerun"]["candidate"]
    with pytest.raises(ValueError, match="same weights"):
        rl_choices.compare_rerun(first_plan, first, first_plan, first)
    other = json.loads(json.dumps(plan))
    other["design"]["arms"] = other["design"]["arms"][:2]
    with pytest.raises(ValueError, match="arms"):
        rl_choices.check_rerun_design(first_plan, other)
    with pytest.raises(ValueError, match="arms"):
        rl_choices.compare_rerun(first_plan, first, other, second)


def test_a_confirmed_difference_below_the_baseline_is_answered_as_worse():
    """The temperature-0.20 plan from seed 12 confirmed a difference the other way, at structure groups and RL
    seeds after Holm: its answer says the candidate is worse and the baseline's choice better, from this one
    checkpoint, never that the candidate beats the baseline."""
    summary = json.loads((ROOT / "results" / "rl-choices-temperature-12" / "summary.json").read_text())
    confirmation = summary["confirmation"]
    assert confirmation["groups"]["mean_difference"] < 0 and confirmation["result"] == "worse"
    answer = [a for a in summary["answers"] if a.startswith("Answer:")]
    assert answer and "is worse than the baseline" in answer[0] and "beats" not in answer[0]
    assert "from this one pretrained checkpoint" in answer[0] and "the baseline's choice is the better one" in answer[0]
    question = [a for a in summary["answers"] if a.startswith("Confirmation on")][0]
    assert "worse, shown after Holm over 1 comparison, at groups and RL seeds" in question


def test_the_compositions_study_answers_state_results_only_after_holm_at_the_units_that_vary():
    """Every generated answer of a committed compositions study that states a result names the Holm
    correction and the levels it holds at; none calls a per-comparison result shown."""
    import re

    levels = {"rl-generalisation": "groups and seeds", "rl-generalisation-rerun": "groups and seeds",
              "rl-switches": "groups and seeds", "rl-switches-rerun": "groups and seeds",
              "pretrain-switches": "groups and runs", "pretrain-switches-rerun": "groups and runs",
              "rl-choices-compositions": "groups and RL seeds", "rl-choices-compositions-rerun": "groups and RL seeds",
              "rl-choices-temperature-11": "groups and RL seeds", "rl-choices-temperature-12": "groups and RL seeds"}
    for name, named in levels.items():
        answers = json.loads((ROOT / "results" / name / "summary.json").read_text())["answers"]
        stated = [a for a in answers if re.search(r"\bshown\b", a)]
        assert stated, name
        for answer in stated:
            assert re.search(rf"shown after Holm over \d+ (comparisons?|directions?), at {named}", answer) or \
                "confirmed at groups and runs after Holm" in answer, (name, answer)


def test_the_committed_study_times_are_what_the_plans_and_receipts_give():
    """results/study-times.json (docs/STUDIES.md's table of stated against taken time) is rebuilt from every
    committed study's plan.json and runs/: a new study, or a changed receipt, needs `glm53 docs times`."""
    from glm53_flash.experiments.analysis import STUDY_TIMES_FILE, study_times

    committed = json.loads((ROOT / "results" / STUDY_TIMES_FILE).read_text())
    assert committed == study_times(ROOT / "results")
    studies = [row[0] for row in committed["headline_table"]["rows"]]
    assert studies == sorted(p.parent.name for p in (ROOT / "results").glob("*/plan.json"))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["pretrain-switches", "pretrain-switches-rerun"])
def test_the_pretrain_switches_results_rebuild_from_their_receipts_and_opened_the_sealed_split_once(name):
    """results/pretrain-switches/ and its rerun: every receipt is of the committed plan, the summary's dev and sealed
    effects are what the analysis computes from them, the dev decision (selection.json) was written before the first
    sealed receipt, and every sealed receipt is in the ledger once, all under one opening of the plan."""
    from datetime import datetime

    from glm53_flash.core.receipts import sha256_file
    from glm53_flash.evaluation.ledger import read_ledger
    from glm53_flash.experiments import pretrain_switches as ps

    directory = ROOT / "results" / name
    plan = json.loads((directory / "plan.json").read_text())
    selection = json.loads((directory / "selection.json").read_text())
    receipts = [json.loads(p.read_text()) for p in sorted((directory / "runs").glob("*.json"))]
    assert len(receipts) == len(plan["units"]) and all(r["plan_sha256"] == plan["plan_sha256"] for r in receipts)
    summary = json.loads((directory / "summary.json").read_text())
    rebuilt = json.loads(json.dumps(ps.compute(plan, receipts, selection)))
    for key in ("dev", "sealed", "selection", "confirmation"):
        assert_same_results(rebuilt[key], summary[key], key)
    lines = [line for line in read_ledger(ROOT / "results" / "ledger.jsonl") if line["plan_sha256"] == plan["plan_sha256"]]
    sealed = sorted((directory / "runs").glob("sealed-*.json"))
    assert len(sealed) == len(lines) == len([u for u in plan["units"] if u["phase"] == "sealed"])
    assert len({line["opening_id"] for line in lines}) == 1 and all(line["reopen"] is None for line in lines)
    assert {line["receipt_sha256"] for line in lines} == {sha256_file(p) for p in sealed}
    decided = datetime.fromisoformat(selection["provenance"]["created_utc"])
    assert all(decided <= datetime.fromisoformat(line["utc"]) for line in lines)
    assert all(p.stat().st_size < 1_000_000 for p in directory.rglob("*") if p.is_file())


@pytest.mark.slow
def test_the_pretrain_switches_rerun_comparison_is_what_both_studies_receipts_give():
    """results/pretrain-switches-rerun/ (pretraining seeds 24 and 25) against results/pretrain-switches/ (21 and
    22): the committed comparison, per phase and switch, rebuilds from both studies' receipts; the seeds are
    disjoint, and the same study compared with itself is refused."""
    from glm53_flash.experiments import pretrain_switches, reruns

    first_plan, first_receipts = reruns.load(ROOT / "results" / "pretrain-switches")
    plan, receipts = reruns.load(ROOT / "results" / "pretrain-switches-rerun")
    assert len(receipts) == len(plan["units"])
    assert not set(first_plan["design"]["seeds"]) & set(plan["design"]["seeds"])
    summary = json.loads((ROOT / "results" / "pretrain-switches-rerun" / "summary.json").read_text())
    assert_same_results(pretrain_switches.compare_rerun(first_plan, first_receipts, plan, receipts),
                        summary["rerun"], "rerun")
    assert set(summary["rerun"]["phases"]) == {"dev", "sealed"}
    with pytest.raises(ValueError):
        pretrain_switches.compare_rerun(first_plan, first_receipts, first_plan, first_receipts)


@pytest.mark.slow
def test_the_rl_switches_rerun_comparison_is_what_both_studies_receipts_give():
    """results/rl-switches-rerun/ (from the pretrain-switches study's arms, seeds 21 and 22) against
    results/rl-switches/ (seeds 6-8): the committed comparison rebuilds from both studies' receipts."""
    from glm53_flash.experiments import reruns, rl_switches

    rerun = ROOT / "results" / "rl-switches-rerun"
    first_plan, first_receipts = reruns.load(ROOT / "results" / "rl-switches")
    plan, receipts = reruns.load(rerun)
    assert len(receipts) == len(plan["units"])
    summary = json.loads((rerun / "summary.json").read_text())
    again = rl_switches.compare_rerun(first_plan, rl_switches.compute(first_plan, first_receipts),
                                  plan, rl_switches.compute(plan, receipts))
    assert_same_results(again, summary["rerun"], "rerun")
    assert_same_results(rl_switches.compute(plan, receipts)["comparisons"], summary["comparisons"], "comparisons")


@pytest.mark.slow
def test_analyze_prints_the_pretrain_switches_rerun_per_phase(tmp_path, capsys):
    """`glm53 analyze RERUN --rerun-of FIRST` on a copy of the committed pretrain-switches rerun: its verdict
    comes per phase (the comparison has no single all_hold), as the committed summary has it."""
    import shutil

    from glm53_flash.cli import main

    source = ROOT / "results" / "pretrain-switches-rerun"
    copy = tmp_path / "rerun"
    (copy / "runs").mkdir(parents=True)
    for name in ("plan.json", "selection.json"):
        shutil.copy(source / name, copy / name)
    for receipt in (source / "runs").glob("*.json"):
        shutil.copy(receipt, copy / "runs" / receipt.name)
    assert main(["analyze", str(copy), "--rerun-of", str(ROOT / "results" / "pretrain-switches")]) == 0
    shown = json.loads(capsys.readouterr().out)
    committed = json.loads((source / "summary.json").read_text())["rerun"]["phases"]
    assert {key: value for key, value in shown.items() if key.startswith("every row holds")} == {
        f"every row holds in the rerun ({phase})": result["all_hold"] for phase, result in committed.items()}


def test_the_one_call_decode_step_left_what_rl_learns_unchanged():
    """BENCHMARKS says so: `glm53 bench rl` at the commit before the one-call decode step and at its
    commit ended every run (each precision, each round) with the same weights, bit for bit."""
    receipts = [json.loads((ROOT / "results" / "bench" / name).read_text())
                for name in ("rl-xeon-before-one-call.json", "rl-xeon.json")]
    before, after = ([run["final_weights_sha256"] for precision in ("fp32", "bf16") for run in r["runs"][precision]]
                     for r in receipts)
    assert len(before) == 4 and before == after
    assert receipts[0]["provenance"]["git_commit"] != receipts[1]["provenance"]["git_commit"]
