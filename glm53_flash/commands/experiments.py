"""CLI registration for `glm53 experiment ...` (the research studies) and `glm53 analyze DIR`."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from glm53_flash.core.options import add_arguments, config_record, from_arguments
from glm53_flash.commands.train import add_no_progress_alias


def register(sub) -> None:
    from glm53_flash.experiments.config import PretrainingDataStudyConfig, RLChoicesStudyConfig

    experiment = sub.add_parser("experiment", help="research studies (resumable, planned, with receipts)")
    studies = experiment.add_subparsers(dest="study", metavar="STUDY")
    experiment.set_defaults(func=lambda args: (experiment.print_help(), 2)[1])

    p = studies.add_parser(
        "pretraining-data", help="diversity / order / curriculum of pretraining structures (research-mini)",
        description="The original's miniature study, compatible (120 structures shuffled with seed 1701, 88 train / "
                    "32 held out, research-mini, AdamW 8e-4, batch 24, 200 updates), with every condition paired by "
                    "seed and evaluated at several points of one run. Analyse with `glm53 analyze DIR`.")
    add_arguments(p, PretrainingDataStudyConfig)  # --quiet, --tensorboard, --wandb as on every training command
    add_no_progress_alias(p)
    p.set_defaults(func=run_pretraining_data)

    r = studies.add_parser(
        "rl-choices", help="which RLOO choices matter: a screen of arms, then a confirmation on fresh seeds",
        description="The original's eight RL arms (+ group-size arms at matched updates) from one pretraining "
                    "checkpoint, screened on dev over --seeds; the best arm (rule fixed in plan.json) is confirmed "
                    "against the baseline on --confirm-seeds (never a screening seed) and the final split, which no other step of the study opens. "
                    "Resumable: finished (arm, seed) runs are skipped. Analyse with `glm53 analyze DIR`.")
    add_arguments(r, RLChoicesStudyConfig)
    add_no_progress_alias(r)
    r.set_defaults(func=run_rl_choices)

    a = sub.add_parser("analyze", help="summary.json, REPORT.md and charts from a study directory's receipts",
                       description="Reads only DIR/plan.json and DIR/runs/*.json; writes DIR/summary.json, "
                                   "DIR/REPORT.md and PNG charts. Refuses to replace them without --force.")
    a.add_argument("directory", help="a study directory written by `glm53 experiment ...`")
    a.add_argument("--force", action="store_true", help="rebuild summary.json / REPORT.md when they exist")
    a.set_defaults(func=run_analyze)


def _existing_plan(out: Path, draft: dict) -> dict | None:
    """The plan already in `out` when it has the same design as `draft` (then nothing is re-measured)."""
    from glm53_flash.experiments.study import PLAN_FILE, plan_hash

    path = out / PLAN_FILE
    if path.is_file():
        existing = json.loads(path.read_text())
        if existing.get("plan_sha256") == plan_hash(draft):
            return existing
    return None


def _start_study(cfg, out: Path, plan: dict) -> bool:
    from glm53_flash.experiments.study import pending_units, power_lines, prepare_study

    resuming = prepare_study(out, plan, cfg.force)
    recorded = json.loads((out / "plan.json").read_text())
    for line in power_lines(recorded):
        print(line, file=sys.stderr)
    estimate = plan["estimate"]
    units = plan["units"]
    todo = pending_units(out, units, plan["plan_sha256"])
    print(f"{plan['study']}: plan {plan['plan_sha256'][:12]} -> {out / 'plan.json'}; "
          f"{len(units) - len(todo)}/{len(units)} runs done{' (resuming)' if resuming else ''}; "
          f"estimated {estimate.get('expected_minutes')} min with {estimate.get('workers')} worker(s)",
          file=sys.stderr)
    return resuming


def _run(cfg, out: Path, plan: dict, units: list[dict], unit_function, opening=None) -> int:
    from glm53_flash.experiments.study import run_units

    from glm53_flash.core.runtime import resolve_device

    design, device = plan["design"], str(resolve_device(cfg.device))
    index, count = cfg.shard
    position = {u["key"]: i for i, u in enumerate(plan["units"])}
    units = [u for u in units if position[u["key"]] % count == index]
    logging = {"tensorboard": cfg.tensorboard, "wandb": cfg.wandb}
    return run_units(out, plan, [u | {"design": design, "device": device, "logging": logging} for u in units],
                     unit_function, workers=cfg.workers, progress=not cfg.quiet, argv=sys.argv, device=device,
                     opening=opening)


def run_pretraining_data(args) -> int:
    from glm53_flash.experiments.config import PretrainingDataStudyConfig
    from glm53_flash.experiments.pretraining_data import build_plan, measure_seconds_per_step, run_unit

    cfg = from_arguments(PretrainingDataStudyConfig, args)
    cfg.validate()
    out = Path(cfg.output)
    options = (cfg.conditions, cfg.seeds, cfg.steps, cfg.batch_size, cfg.learning_rate, cfg.sequence_length,
               cfg.eval_at, cfg.workers)
    draft = build_plan(*options, None)  # also validates the flags before timing anything
    return _run_study(args, cfg, out, draft, lambda: build_plan(*options, round(measure_seconds_per_step(), 4)),
                      lambda plan: _run(cfg, out, plan, plan["units"], run_unit))


def _run_study(args, cfg, out: Path, draft: dict, timed_plan, run) -> int:
    """The session every study runs in: the directory locked, the existing plan resumed (or a new one
    timed by `timed_plan()`), then `run(plan)` -> number of runs finished, with the plan's status kept."""
    from glm53_flash.experiments.study import study_session

    command = shlex.join(["glm53", *getattr(args, "command_argv", sys.argv[1:])])
    with study_session(out, command, tensorboard=cfg.tensorboard, wandb=cfg.wandb,
                       plan_only=cfg.plan_only) as (state, mark):
        plan = _existing_plan(out, draft)
        if plan is None:
            plan = timed_plan()
        plan["run_config"] = config_record(cfg)  # this session's flags, outside the hashed design
        _start_study(cfg, out, plan)
        if cfg.plan_only:
            return 0
        state["plan"] = plan
        mark("running")
        ran = run(plan)
        mark(_finished_status(out, plan))
    print(f"{plan['study']}: {ran} run(s) finished; next: glm53 analyze {out}", file=sys.stderr)
    return 0


def _finished_status(out: Path, plan: dict) -> str:
    from glm53_flash.experiments.study import pending_units

    return "incomplete" if pending_units(out, plan["units"], plan["plan_sha256"]) else "complete"


SELECTION_FILE = "selection.json"


def run_rl_choices(args) -> int:
    from glm53_flash.model.pretrained import read_metadata
    from glm53_flash.experiments.config import RLChoicesStudyConfig
    from glm53_flash.experiments.rl_choices import build_plan, measure_speed

    cfg = from_arguments(RLChoicesStudyConfig, args)
    cfg.validate()
    out = Path(cfg.output)
    checkpoint = Path(cfg.checkpoint)
    if not (checkpoint / "metadata.json").is_file() and not checkpoint.is_dir():
        raise FileNotFoundError(f"--checkpoint {checkpoint} does not exist; make a pretraining checkpoint with "
                                "`glm53 pretrain --output runs/pretrain --steps 100` (or `make demo`)")
    sha = read_metadata(checkpoint)["weights_sha256"]
    options = (str(checkpoint), sha, cfg.arms, cfg.seeds, cfg.confirm_seeds, cfg.tasks, cfg.confirm_arm, cfg.workers)
    draft = build_plan(*options, None, None)
    # Every unit on a sealed split (the confirmation and its reference) runs under one opening, granted
    # here, before the study directory is touched: a missing --open-sealed costs no training.
    opening = None if cfg.plan_only else _sealed_opening(cfg, out, draft)
    return _run_study(args, cfg, out, draft,
                      lambda: build_plan(*options, *(round(v, 4) for v in measure_speed(str(checkpoint)))),
                      lambda plan: _run_rl_phases(cfg, out, plan, opening))


def _sealed_opening(cfg, out: Path, plan: dict):
    """The ledger opening for the plan's pending units on a sealed split, or None when there are none."""
    from glm53_flash.experiments.study import pending_units, plan_hash
    from glm53_flash.evaluation.ledger import is_sealed, require_open

    sealed = [u["split"] for u in pending_units(out, plan["units"], plan_hash(plan)) if is_sealed(u["split"])]
    if not sealed:
        return None
    if not cfg.open_sealed:
        raise ValueError(f"this study evaluates the sealed split {sealed[0]}: pass --open-sealed \"<purpose>\" "
                         "(recorded in the ledger; see `glm53 ledger`)")
    return require_open(sealed[0], cfg.open_sealed, plan_sha256=plan_hash(plan), reopen=cfg.reopen)


def _run_rl_phases(cfg, out: Path, plan: dict, opening=None) -> int:
    """The screen (and references), then the planned selection, then the confirmation; units on a
    sealed split run under `opening`."""
    from glm53_flash.experiments.rl_choices import run_unit, select_candidate
    from glm53_flash.experiments.study import load_receipts
    from glm53_flash.core.receipts import provenance, write_json

    work = out / "work"
    first = [u | {"work_dir": str(work / u["key"])} for u in plan["units"] if u["phase"] != "confirm"]
    ran = _run(cfg, out, plan, first, run_unit, opening)
    confirm = [u for u in plan["units"] if u["phase"] == "confirm"]
    if confirm:
        selection_path = out / SELECTION_FILE
        selection = json.loads(selection_path.read_text()) if selection_path.exists() else None
        if selection is None or selection.get("plan_sha256") != plan["plan_sha256"]:  # none yet, or stale
            selection = select_candidate(plan, load_receipts(out, plan["plan_sha256"])) | {
                "plan_sha256": plan["plan_sha256"], "provenance": provenance(sys.argv)}
            write_json(selection_path, selection)
        print(f"rl-choices: confirmation candidate = {selection['candidate']} ({selection['rule']})", file=sys.stderr)
        resolved = [u | {"arm": "baseline" if u["role"] == "baseline" else selection["candidate"],
                         "work_dir": str(work / u["key"])} for u in confirm]
        ran += _run(cfg, out, plan, resolved, run_unit, opening)
    if work.is_dir() and not any(work.iterdir()):  # each unit removes its own; another shard may still run
        work.rmdir()
    return ran


def run_analyze(args) -> int:
    from glm53_flash.experiments.analysis import analyze

    summary = analyze(args.directory, force=args.force, argv=sys.argv)
    print(json.dumps({"study": summary["study"], "runs": summary["runs"],
                      "answers": summary["answers"]}, indent=2))
    print(f"wrote {Path(args.directory) / 'REPORT.md'}", file=sys.stderr)
    return 0
