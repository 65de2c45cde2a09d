"""`glm53 reproduce`: the headline experiment in one resumable command.

pretrain -> select a pretraining checkpoint on dev -> RL from it for each seed -> select each RL run's
checkpoint on dev -> only then open the confirm split (greedy on the trained families, sampled
pass@8 on all eight) -> paired statistics -> REPORT.md and charts. Every stage writes its receipt
into the output directory and is skipped when rerun, so an interrupted run continues where it was.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from glm53_flash.model.config import ORIGINAL_MODEL_SWITCHES
from glm53_flash.evaluation.config import SAMPLING_TEMPERATURE, EvalConfig
from glm53_flash.core.receipts import provenance, read_json, write_json
from glm53_flash.report.summary import SCHEMA_VERSION as SUMMARY_SCHEMA
from glm53_flash.report.summary import RunSummary, SealedSplit
from glm53_flash.tasks import FAMILY_NAMES, parse_families
from glm53_flash.train.config import RLConfig, SelectConfig
from glm53_flash.train.plan import (  # noqa: F401 - the plan's names, re-exported for the pipeline's callers
    GREEDY_SEED, RUN_FIELDS, SAMPLED_SEED, ReproducePlan, make_plan, plan_sha256,
)

SUMMARY_FILE = "summary.json"


# The headline's RL budget and hyperparameters are the original's (seed-README "Result"), shared by
# both arms; the arms differ only in the switches below.
_HEADLINE_RL = RLConfig(initial_checkpoint="", output="", groups=96, checkpoints=(24, 48, 72, 96), group_size=16,
                        tasks_per_family=32, temperature=SAMPLING_TEMPERATURE, learning_rate=5e-5,
                        train_scope="last-block-head", reward_mode="binary", prompts_per_update=1)

# The headline's two arms. "ours" is every stage config at its default (our fixes); "faithful" turns
# every switch back to the original miniature's: the stream residual, RoPE before the feature map in
# the linear layers, the hard-count balance loss (no gradient), weight decay on every parameter, and
# RL's untempered log-probs, per-sequence mean and no EOS token in the loss.
ARMS: dict[str, dict] = {
    "faithful": {
        "model_overrides": dict(ORIGINAL_MODEL_SWITCHES),
        "pretrain": {"decay_all_parameters": True},
        "rl": {"logprob_source": "untempered", "loss_normalization": "sequence-mean", "eos_handling": "omit"},
    },
    "ours": {"model_overrides": {}, "pretrain": {}, "rl": {}},
}


def arm_plan(plan: "ReproducePlan", arm: str, pretrain_seed: int | None = None,
             rl_seeds: tuple[int, ...] | None = None) -> "ReproducePlan":
    """`plan` with the switches of `arm` (ARMS), optionally another pretraining (initialisation) seed
    and other RL seeds."""
    if arm not in ARMS:
        raise ValueError(f"unknown arm {arm!r}; allowed: {', '.join(ARMS)}")
    switches = ARMS[arm]
    pretrain = replace(plan.pretrain, model_overrides={**plan.pretrain.model_overrides, **switches["model_overrides"]},
                       **switches["pretrain"])
    if pretrain_seed is not None:
        pretrain = replace(pretrain, seed=pretrain_seed)
    return replace(plan, pretrain=pretrain, rl=replace(plan.rl, **switches["rl"]),
                   rl_seeds=plan.rl_seeds if rl_seeds is None else tuple(rl_seeds))


PLANS: dict[str, ReproducePlan] = {
    # The original's headline run (seed-README "Result"), on the CPU, with our defaults; ARMS make the
    # faithful and our arm of it.
    "headline": make_plan(
        preset="flash", pretrain=dict(steps=100, checkpoints=(25, 50, 75, 100), batch_size=32, sequence_length=128,
                                      learning_rate=3e-4),
        rl=_HEADLINE_RL, rl_seeds=(31415, 27182, 16180), families="increment,double,even", max_new_tokens=48,
        eval_temperature=SAMPLING_TEMPERATURE, dev_per_family=4, dev_samples=8, confirm_greedy_per_family=8,
        confirm_sampled_per_family=8, confirm_samples=8, holdout_greedy_per_family=32,
        holdout_sampled_per_family=8),
    # A small model and few steps: the test suite's end-to-end run and a first look in about a minute.
    "quick": make_plan(
        preset="tiny", pretrain=dict(steps=300, checkpoints=(150, 300), batch_size=16, sequence_length=128,
                                     learning_rate=3e-3),
        rl=replace(_HEADLINE_RL, groups=8, checkpoints=(4, 8), group_size=8, tasks_per_family=4, learning_rate=1e-3),
        rl_seeds=(31415,), families="increment,double,even", max_new_tokens=24, eval_temperature=SAMPLING_TEMPERATURE,
        dev_per_family=2, dev_samples=4, confirm_greedy_per_family=4, confirm_sampled_per_family=2,
        confirm_samples=4, holdout_greedy_per_family=4, holdout_sampled_per_family=2,
        sealed_stand_in="dev"),  # a smoke test: its "confirm" and "holdout" stages evaluate dev, opening nothing
}


def _log(message: str) -> None:
    print(f"[reproduce {time.strftime('%H:%M:%S')}] {message}", flush=True)


@contextmanager
def _timed(stages: dict, name: str, done: bool = False):
    """Add the block's seconds to stages[name] (across resumed runs) when it completes; nothing when
    the stage was `done` before the block (a rerun only finds it finished: not the stage's work)."""
    start = time.perf_counter()
    yield
    if not done:
        stages[name] = stages.get(name, 0.0) + time.perf_counter() - start


CONFIRM_PURPOSE = "the headline's confirmation, after all dev selection (glm53 reproduce)"
HOLDOUT_PURPOSE = "the headline's held-out result, after all dev selection (glm53 reproduce)"
PURPOSES = {"confirm": CONFIRM_PURPOSE, "holdout": HOLDOUT_PURPOSE}


@dataclass(frozen=True)
class ArmRun:
    """One run of the pipeline: an arm's plan at one pretraining seed, in its own directory."""

    arm: str
    plan: ReproducePlan
    directory: Path

    @property
    def pretrain_seed(self) -> int:
        return self.plan.pretrain.seed


def with_precision(plan: ReproducePlan, precision, device: str) -> ReproducePlan:
    """`plan` computing in `precision` (a resolved model/precision.Precision) on `device`. A precision that
    resolves to what the device computes in by default (fp32 on a CPU without bf16, bf16 autocast on
    CUDA) changes nothing, so the plan and its identity stay as they are: the same computation is the
    same plan. Any other (bf16 on an AVX512-BF16 or AMX CPU) is set on every stage and so is a new
    plan, with its own sealed openings."""
    from glm53_flash.model.precision import resolve_precision

    if precision is None or precision.name == resolve_precision(None, device).name:
        return plan
    return replace(plan, **{stage: replace(getattr(plan, stage), precision=precision.name)
                            for stage in ReproducePlan.STAGES})


def arm_runs(output: str | Path, preset: str = "headline", rl_seeds: tuple[int, ...] | None = None,
             extra_pretrain_seeds: tuple[int, ...] = (), arms: tuple[str, ...] = tuple(ARMS),
             precision=None, device: str = "cpu") -> list[ArmRun]:
    """The runs of a headline directory: each arm at the plan's own pretraining seed (with every RL
    seed) in OUT/ARM, and at each extra pretraining seed (with the first RL seed only) in
    OUT/ARM-pretrain-SEED; `precision` (resolved) as `with_precision` applies it on `device`."""
    if preset not in PLANS:
        raise ValueError(f"unknown preset {preset!r}; allowed: {', '.join(PLANS)}")
    base = PLANS[preset] if rl_seeds is None else replace(PLANS[preset], rl_seeds=tuple(rl_seeds))
    base = with_precision(base, precision, device)
    if not base.rl_seeds:
        raise ValueError("--rl-seeds needs at least one seed")
    unknown = [arm for arm in arms if arm not in ARMS]
    if unknown or not arms:
        raise ValueError(f"unknown arm(s) {', '.join(unknown) or '(none given)'}; allowed: {', '.join(ARMS)}")
    if base.pretrain.seed in extra_pretrain_seeds or len(set(extra_pretrain_seeds)) != len(extra_pretrain_seeds):
        raise ValueError(f"--extra-pretrain-seeds must be distinct and differ from the plan's own seed "
                         f"{base.pretrain.seed}")
    out = Path(output)
    runs = [ArmRun(arm, arm_plan(base, arm), out / arm) for arm in arms]
    runs += [ArmRun(arm, arm_plan(base, arm, pretrain_seed=seed, rl_seeds=base.rl_seeds[:1]),
                    out / f"{arm}-pretrain-{seed}")
             for seed in extra_pretrain_seeds for arm in arms]
    return runs


def reproduce(output: str | Path, preset: str = "headline", rl_seeds: tuple[int, ...] | None = None,
              device: str = "auto", progress: bool = True, reopen: str | None = None,
              extra_pretrain_seeds: tuple[int, ...] = (), arms: tuple[str, ...] = tuple(ARMS),
              ledger: str | Path | None = None, precision: str | None = None, adapt_threads: bool = False,
              allow_dirty: bool = False) -> dict:
    """Run (or resume) both arms of `preset` in `output` (see `arm_runs`), then the two-arm summary
    and report. Each sealed split (confirm, holdout) is opened once per run's plan, and every receipt is
    recorded in the ledger (`run_ledger`: by default the run's own); a plan that already opened one
    there is refused unless `reopen` gives the reason. Every opening is asked for before any stage runs.
    `precision` (fp32, bf16, auto; None: the device's default) is resolved once, here (`with_precision`).
    `adapt_threads`: pretraining, RL and the sealed evaluations run with the thread governor (a run
    time choice, not part of the plan: on a quiet machine the threads never change and the results are
    the fixed-thread run's; on a busy one they follow the free cores, recorded in the receipts)."""
    from glm53_flash.core.runtime import resolve_device
    from glm53_flash.model.precision import resolve_precision

    device = str(resolve_device(device))
    resolved = None if precision is None else resolve_precision(precision, device)
    if resolved is not None:
        _log(f"precision {resolved.name} ({resolved.reason})")
    out = Path(output)
    if (out / "plan.json").exists():
        raise ValueError(f"{out} holds a one-arm run of an older version (plan.json at its top); "
                         "use a new --output")
    runs = arm_runs(out, preset, rl_seeds, tuple(extra_pretrain_seeds), tuple(arms), resolved, device)
    where = run_ledger(out, ledger)
    openings = {run.directory: _require_openings(run, reopen, where, allow_dirty) for run in runs}
    state_analysis(out, runs)
    for run in runs:
        _log(f"arm {run.arm}, pretraining seed {run.pretrain_seed}: {run.directory}")
        reproduce_arm(run, preset, device=device, progress=progress, openings=openings[run.directory],
                      precision=resolved, adapt_threads=adapt_threads)
    from glm53_flash.report.arms import build_headline_report

    summary = build_headline_summary(out)
    write_json(out / SUMMARY_FILE, summary)
    report_path = build_headline_report(out)
    _log(f"report: {report_path}")
    return summary


def rebuild_reports(output: str | Path) -> dict:
    """Every run's summary.json and REPORT.md, then the two-arm summary and report, from the receipts
    already in `output` (a finished headline directory); nothing runs and no split is opened."""
    from glm53_flash.report.arms import build_headline_report
    from glm53_flash.report.headline import build_report

    out = Path(output)
    runs = [path for path in sorted(out.iterdir()) if path.is_dir() and (path / "plan.json").is_file()]
    if not runs:
        raise ValueError(f"{out} holds no run of the pipeline (ARM/plan.json)")
    for path in runs:
        write_json(path / SUMMARY_FILE, build_summary(path).to_dict())
        build_report(path)
    summary = build_headline_summary(out)
    write_json(out / SUMMARY_FILE, summary)
    build_headline_report(out)
    return summary


def state_analysis(out: Path, runs: list[ArmRun]) -> dict:
    """Before any stage runs: write OUT/analysis-plan.json (the analysis settings and the plan's power at
    the pretraining seeds this call runs) and print the power. A directory that already states one keeps
    it (a resumed or extended run does not restate its analysis)."""
    from glm53_flash.evaluation.headline_stats import ANALYSIS_FILE, HEADLINE_ANALYSIS, plan_power, power_lines

    path = out / ANALYSIS_FILE
    if path.is_file():
        recorded = read_json(path)
    else:
        seeds = len({run.pretrain_seed for run in runs})
        recorded = {"stated": "before the run", "analysis": HEADLINE_ANALYSIS.to_dict(),
                    "power": plan_power(runs[0].plan, seeds, HEADLINE_ANALYSIS), "provenance": provenance()}
        out.mkdir(parents=True, exist_ok=True)
        write_json(path, recorded)
    for line in power_lines(recorded["power"]):
        _log(line)
    return recorded


def sealed_stages(plan: ReproducePlan) -> dict[str, tuple[EvalConfig, EvalConfig]]:
    """The plan's evaluations of sealed splits, in the order they run: split -> (greedy, sampled)."""
    return {"confirm": (plan.confirm_greedy, plan.confirm_sampled),
            "holdout": (plan.holdout_greedy, plan.holdout_sampled)}


def checkpoint_names(plan: ReproducePlan) -> list[str]:
    """The evaluated checkpoints of a run: before RL, then each RL seed's selected one."""
    return ["before", *(f"rl-{seed}" for seed in plan.rl_seeds)]


def receipt_pair(split_directory: Path, name: str, samples: int) -> tuple[Path, Path]:
    """Checkpoint `name`'s greedy and sampled (pass@`samples`) receipts in a sealed split's directory."""
    return split_directory / f"{name}-greedy.json", split_directory / f"{name}-pass{samples}.json"


def _receipt_paths(directory: Path, plan: ReproducePlan, split: str) -> list[Path]:
    k = sealed_stages(plan)[split][1].samples
    return [path for name in checkpoint_names(plan) for path in receipt_pair(directory / split, name, k)]


def run_ledger(output: str | Path, chosen: str | Path | None = None) -> Path:
    """Where a pipeline run records its openings: `chosen` (`--ledger`), else a ledger of the run's own
    (OUTPUT/ledger.jsonl), so a user's runs never add lines to the committed results/ledger.jsonl unless
    they ask to (`--ledger results/ledger.jsonl`)."""
    return Path(chosen) if chosen is not None else Path(output) / "ledger.jsonl"


def dev_decision(run: ArmRun) -> tuple[Path, ...]:
    """The dev decisions a run's sealed openings follow: its pretraining checkpoint's selection and each RL
    seed's (hashed into the opened lines when the openings activate, after every selection)."""
    return (run.directory / "pretrain" / "selection-dev.json",
            *(run.directory / f"rl-{seed}" / "selection-dev.json" for seed in run.plan.rl_seeds))


def _require_openings(run: ArmRun, reopen: str | None, where: Path | None = None, allow_dirty: bool = False) -> dict:
    """An opening of each sealed split whose receipts are not all written yet, recorded in ledger `where`:
    every rule is checked before any stage runs (a refusal costs nothing and writes nothing); each opened
    line is written when its split's evaluation starts, after the dev selections it names."""
    from glm53_flash.evaluation import ledger

    openings = {}
    identity = plan_sha256(run.plan)
    for split, configs in sealed_stages(run.plan).items():
        if not ledger.is_sealed(configs[0].split):
            continue  # a smoke plan's stand-in for the sealed split: nothing to open
        if not all(path.exists() for path in _receipt_paths(run.directory, run.plan, split)):
            # a reason to reopen is recorded only where there is something to reopen
            earlier = reopen is not None and ledger.plan_openings(split, identity, where)
            openings[split] = ledger.require_open(split, PURPOSES[split], plan_sha256=identity,
                                                  reopen=reopen if earlier else None, ledger=where,
                                                  decision=dev_decision(run), allow_dirty=allow_dirty)
    return openings


def reproduce_arm(run: ArmRun, preset: str, device: str = "cpu", progress: bool = True,
                  openings: dict | None = None, precision=None, adapt_threads: bool = False,
                  sealed: bool = True) -> RunSummary | None:
    """One run in `run.directory`: pretrain -> dev selection -> RL per seed -> dev selection -> the
    sealed splits (confirm, then holdout) -> its summary.json and REPORT.md. `precision` (the resolved
    --precision, already applied to the plan by `with_precision`) is recorded in plan.json beside the
    plan, so the summary says what was asked for even where it left the plan as it was. With
    `sealed=False` the run stops after its dev selections (returns None; nothing sealed is opened)."""
    from glm53_flash.train.pretrain import pretrain
    from glm53_flash.train.rl_run import train_rl
    from glm53_flash.train.select import select_from_config

    plan, out = run.plan, run.directory
    openings = ({} if not sealed else _require_openings(run, None)) if openings is None else openings
    out.mkdir(parents=True, exist_ok=True)
    plan_path = out / "plan.json"
    recorded = {}
    if plan_path.exists():
        recorded = read_json(plan_path)
        if not isinstance(recorded, dict):
            raise ValueError(f"{plan_path} is not a plan (a JSON object with 'plan'); use a new --output")
        try:
            same = ReproducePlan.from_dict(recorded.get("plan")).to_dict() == plan.to_dict()
        except (ValueError, TypeError):
            same = False
        if not same:
            raise ValueError(f"{out} was started with a different plan (preset, --rl-seeds or a changed "
                             "default); use the same flags or a new --output")
    stages = recorded.get("stage_seconds", {})
    asked = precision.record() if precision is not None else recorded.get("precision")
    # a resume keeps the run's own --adapt-threads (its stages refuse to resume with another)
    adapt_threads = adapt_threads or bool(recorded.get("adapt_threads"))

    def save_stage_times():
        write_json(plan_path, {"preset": preset, "arm": run.arm, "plan": plan.to_dict(), "stage_seconds": stages,
                               **({"precision": asked} if asked is not None else {}),
                               **({"adapt_threads": True} if adapt_threads else {})})

    save_stage_times()

    def run_selection(template: SelectConfig, run_dir: Path) -> None:
        select_from_config(replace(template, run=str(run_dir), device=device, quiet=not progress))

    # 1. pretraining
    _log(f"[{run.arm}] pretraining the {plan.pretrain.preset} model for {plan.pretrain.steps} steps "
         f"(seed {plan.pretrain.seed})")
    with _timed(stages, "pretrain", done=_finished(out / "pretrain")):
        pretrain(replace(plan.pretrain, output=str(out / "pretrain"), device=device, resume=True, quiet=not progress,
                         adapt_threads=adapt_threads))
    save_stage_times()

    # 2. pretraining checkpoint selection on dev (all families)
    selection_path = out / "pretrain" / "selection-dev.json"
    if not selection_path.exists():
        _log(f"[{run.arm}] selecting the pretraining checkpoint on dev")
        with _timed(stages, "select_pretrain"):
            run_selection(plan.select_pretrain, out / "pretrain")
        save_stage_times()
    start_checkpoint = read_json(selection_path)["selected"]["checkpoint"]
    _log(f"[{run.arm}] selected {start_checkpoint}")

    # 3-4. RL for each seed, then selection of its checkpoint on dev (trained families)
    rl_selected = {}
    for seed in plan.rl_seeds:
        run_dir = out / f"rl-{seed}"
        _log(f"[{run.arm}] RL seed {seed}: {plan.rl.groups} groups x {plan.rl.group_size}")
        with _timed(stages, f"rl_{seed}", done=_finished(run_dir)):
            train_rl(replace(plan.rl, initial_checkpoint=start_checkpoint, output=str(run_dir), seed=seed,
                             device=device, resume=True, quiet=not progress, adapt_threads=adapt_threads))
        selection = run_dir / "selection-dev.json"
        if not selection.exists():
            with _timed(stages, f"select_rl_{seed}"):
                run_selection(plan.select_rl, run_dir)
        save_stage_times()
        rl_selected[seed] = read_json(selection)["selected"]["checkpoint"]
        _log(f"[{run.arm}] RL seed {seed}: selected {rl_selected[seed]}")
    if not sealed:
        return None

    # 5. all selection is done: open the sealed splits (every receipt is recorded in the ledger)
    checkpoints = dict(zip(checkpoint_names(plan), [start_checkpoint, *rl_selected.values()]))
    for split, configs in sealed_stages(plan).items():
        done = all(path.exists() for path in _receipt_paths(out, plan, split))
        with _timed(stages, split, done=done):
            _evaluate_sealed(out / split, configs, checkpoints, openings.get(split), device, run.arm, adapt_threads)
        save_stage_times()
    for opening in openings.values():
        opening.close()

    # 6-7. statistics and the report, from the receipts alone
    from glm53_flash.report.headline import build_report

    summary = build_summary(out)
    write_json(out / SUMMARY_FILE, summary.to_dict())
    build_report(out)
    return summary


def _finished(run_dir: Path) -> bool:
    """Whether a pretraining or RL run directory holds a finished run (its `complete` receipt; pretraining
    and RL name it alike)."""
    from glm53_flash.train.pretrain import RECEIPT_FILE
    from glm53_flash.train.rundir import finished_receipt

    return finished_receipt(run_dir / RECEIPT_FILE) is not None


def _evaluate_sealed(directory: Path, configs: tuple[EvalConfig, EvalConfig], checkpoints: dict[str, str],
                     opening, device: str, arm: str, adapt_threads: bool = False) -> None:
    """Greedy and sampled receipts of every checkpoint on one sealed split, written under `opening`
    (evaluate.run_eval: every field of the plan's EvalConfigs is honoured)."""
    from glm53_flash.evaluation.evaluate import eval_tasks, run_eval
    from glm53_flash.model.lm import load_pretrained
    from glm53_flash.verifier import Verifier

    greedy_cfg, sampled_cfg = configs
    if all(path.exists() for name in checkpoints for path in receipt_pair(directory, name, sampled_cfg.samples)):
        return  # every receipt is there: nothing to evaluate, and no opening was asked for
    stages = [(cfg, eval_tasks(cfg, opening)) for cfg in configs]  # the tasks built once, for every checkpoint
    with Verifier(workers=sampled_cfg.workers) as verifier:
        for name, checkpoint in checkpoints.items():
            greedy_path, sampled_path = receipt_pair(directory, name, sampled_cfg.samples)
            if greedy_path.exists() and sampled_path.exists():
                continue
            _log(f"[{arm}] {greedy_cfg.split} split: evaluating {name} ({checkpoint})")
            model, meta = load_pretrained(checkpoint, device)
            for path, (cfg, tasks) in zip((greedy_path, sampled_path), stages):
                if not path.exists():
                    receipt = run_eval(replace(cfg, checkpoint=str(checkpoint), device=device,
                                               adapt_threads=adapt_threads), model=model,
                                       checkpoint_sha256=meta["weights_sha256"], verifier=verifier,
                                       opening=opening, progress=False, tasks=tasks)
                    if opening is None:  # a smoke plan's stand-in split: not sealed, not in any ledger
                        write_json(path, receipt)
                    else:
                        opening.write_receipt(path, receipt)


def strong_test_summary(out: Path, plan: ReproducePlan, split: str = "confirm") -> dict | None:
    """Per checkpoint (before RL, each RL seed), the results on `split` under the three original cases
    and under the strong set (50+ cases per task), and the false passes: programs that pass the three
    but not the strong set. None when the receipts predate the strong set."""
    k = sealed_stages(plan)[split][1].samples
    arms = {}
    for arm in checkpoint_names(plan):
        greedy, sampled = (read_json(path)["summary"] for path in receipt_pair(out / split, arm, k))
        if "tasks_solved_strong" not in greedy or "exact_rollouts_strong" not in sampled:
            return None
        arms[arm] = {
            "greedy": {key: greedy[key] for key in ("tasks_total", "tasks_solved", "tasks_solved_strong", "false_passes",
                                                    "strong_tests_total")},
            "sampled": {key: sampled[key] for key in ("rollouts_total", "exact_rollouts", "exact_rollouts_strong",
                                                      "false_pass_rollouts", "strong_tests_total")},
        }
    return arms


def ledger_lines_for(plan: ReproducePlan, split: str = "confirm", directory: Path | None = None) -> list[dict]:
    """The ledger lines of `plan`'s openings of `split`: from the run's own ledger when the run (an arm
    directory or the run above it) has one, else from the default ledger (run_ledger)."""
    from glm53_flash.evaluation.ledger import ledger_lines

    own = [d / "ledger.jsonl" for d in ((directory, directory.parent) if directory is not None else ())]
    where = next((path for path in own if path.is_file()), None)
    identity = plan_sha256(plan)
    return [line for line in ledger_lines(split, where) if line["plan_sha256"] == identity]


def split_results(out: Path, plan: ReproducePlan, split: str) -> dict:
    """Paired statistics (before RL vs each RL seed's selected checkpoint) on one sealed split, from its
    receipts in OUT/SPLIT."""
    from glm53_flash.evaluation.compare import compare_receipts, load_receipt

    trained = list(parse_families(plan.families))
    untrained = [f for f in FAMILY_NAMES if f not in trained]
    k = sealed_stages(plan)[split][1].samples
    before_greedy, before_sampled = map(load_receipt, receipt_pair(out / split, "before", k))
    seeds = {}
    for seed in plan.rl_seeds:
        arm = f"rl-{seed}"
        after_greedy, after_sampled = map(load_receipt, receipt_pair(out / split, arm, k))
        greedy = compare_receipts(before_greedy, after_greedy, labels=("before RL", arm))
        sampled = compare_receipts(before_sampled, after_sampled, labels=("before RL", arm))
        trained_sampled = compare_receipts(before_sampled, after_sampled, families=trained, labels=("before RL", arm))
        interference = {}
        for family in untrained:
            row = sampled["by_family"][family]
            low, high = row["rate_difference_ci"]
            interference[family] = {"before_exact": row["before_exact"], "after_exact": row["after_exact"],
                                    "rollouts": row["rollouts"], "rate_difference": row["rate_difference"],
                                    "ci": [low, high], "significant_drop": high < 0}
        selection = read_json(out / arm / "selection-dev.json")
        seeds[str(seed)] = {
            "selected_checkpoint": selection["selected"]["checkpoint"],
            "greedy_trained": greedy["overall"], "greedy_by_family": greedy["by_family"],
            "sampled_trained": trained_sampled["overall"], "sampled_all": sampled["overall"],
            "sampled_by_family": sampled["by_family"], "untrained_interference": interference,
            "losses_on_trained_greedy": greedy["overall"]["losses"],
        }
    return seeds


def build_summary(out: Path) -> RunSummary:
    """One run's paired statistics for every RL seed on each sealed split, computed only from the
    receipts in `out` (report/summary.py's RunSummary: the confirm split's at the top, the holdout
    split's under `holdout`)."""
    meta = read_json(out / "plan.json")
    plan = ReproducePlan.from_dict(meta["plan"])
    trained = list(parse_families(plan.families))
    untrained = [f for f in FAMILY_NAMES if f not in trained]
    pre_selection = read_json(out / "pretrain" / "selection-dev.json")
    selections = [pre_selection] + [read_json(out / f"rl-{s}" / "selection-dev.json")
                                    for s in plan.rl_seeds]
    last_selection = max(s["provenance"]["created_utc"] for s in selections)
    first_opened = {}
    for split in sealed_stages(plan):
        receipts = [read_json(p) for p in _receipt_paths(out, plan, split)]
        first_opened[split] = min(r["provenance"]["created_utc"] for r in receipts)
    return RunSummary(
        schema_version=SUMMARY_SCHEMA, preset=meta["preset"], arm=meta.get("arm"), plan=plan,
        stage_seconds=meta["stage_seconds"], trained_families=tuple(trained), untrained_families=tuple(untrained),
        pretrain_seed=plan.pretrain.seed,
        pretrain_selection={"rule": pre_selection["rule"], "selected": pre_selection["selected"]["checkpoint"],
                            "checkpoints": [{"step": e["step"], "score": e["score"]}
                                            for e in pre_selection["checkpoints"]]},
        seeds=split_results(out, plan, "confirm"), provenance=provenance(),
        strong_tests=strong_test_summary(out, plan),
        # Checked from the receipts' own timestamps, not asserted.
        confirm_opened_after_selection=first_opened["confirm"] >= last_selection,
        last_selection_utc=last_selection, first_confirm_utc=first_opened["confirm"],
        # Every opening of the confirm split for this plan, from the ledger (any directory, any machine
        # whose ledger this is): more than one opening means the split was not held out for this plan.
        ledger=ledger_lines_for(plan, directory=out),
        holdout=SealedSplit(
            seeds=split_results(out, plan, "holdout"), strong_tests=strong_test_summary(out, plan, "holdout"),
            opened_after_selection=first_opened["holdout"] >= last_selection,
            first_opened_utc=first_opened["holdout"], ledger=ledger_lines_for(plan, "holdout", directory=out)),
        # a smoke plan's sealed stages evaluated a stand-in
        sealed_stand_in=plan.confirm_greedy.split if plan.confirm_greedy.split != "confirm" else None,
        # what --precision asked for (plan.json), else what the pretraining receipt recorded
        precision=meta.get("precision") or read_json(out / "pretrain" / "training-receipt.json").get("precision"))


# --------------------------------------------------------------------------- both arms


def _run_directories(out: Path) -> list[Path]:
    """The run directories of a headline directory (each holds a plan.json with its arm)."""
    found = []
    for path in sorted(out.iterdir()):
        plan = path / "plan.json"
        if path.is_dir() and plan.is_file() and (path / SUMMARY_FILE).is_file():
            found.append(path)
    return found


def build_headline_summary(out: str | Path) -> dict:
    """The two-arm summary of a headline directory, from its runs' summaries (and so from their
    receipts): each arm's main run, every pretraining seed's before/after scores, and the paired
    comparisons between the arms."""
    from glm53_flash.evaluation.headline_stats import compare_arms, plan_power, read_analysis, seed_table
    from glm53_flash.report.arms import arm_rows

    out = Path(out)
    runs = [(path, RunSummary.read(path / SUMMARY_FILE)) for path in _run_directories(out)]
    if not runs:
        raise ValueError(f"{out} holds no finished run (ARM/summary.json)")
    main = {summary.arm: summary for path, summary in runs if path.name == summary.arm}
    arms = {arm: summary.to_dict() for arm, summary in main.items()}
    seeds = seed_table(out, runs)
    analysis, stated = read_analysis(out)
    first = next(iter(main.values()))
    power = plan_power(first.plan, len({s.pretrain_seed for _, s in runs}), analysis)
    summary = {
        "schema_version": "2.0", "preset": runs[0][1].preset, "arms": arms,
        "arm_switches": {arm: ARMS[arm] for arm in arms},
        "pretraining_seeds": seeds,
        "comparison": compare_arms(out, arms, seeds),
        "power": {**power, "stated": stated},
        # seconds of stages per run directory, and of the main arms together (what `make demo` runs)
        "run_seconds": {path.name: sum(s.stage_seconds.values()) for path, s in runs},
        "demo_seconds": sum(sum(s.stage_seconds.values()) for s in main.values()),
        "provenance": provenance(),
    }
    columns, rows = arm_rows(summary)
    summary["headline_table"] = {"columns": columns, "rows": rows}  # the README's table, rendered here
    from glm53_flash.report.arms import readme_seed_table, readme_statements

    summary["readme"] = {"statements": readme_statements(summary), "seed_table": readme_seed_table(summary)}
    return summary
