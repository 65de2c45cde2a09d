"""CLI registration for `glm53 experiment ...` (the research studies) and `glm53 analyze DIR`."""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import sys
from pathlib import Path

from ..argtypes import comma_ints
from ..options import add_arguments
from ..runtime import DEVICE_CHOICES
from ..train.config import LiveLoggingConfig
from .train import add_no_progress_alias


def _name_list(text: str) -> tuple[str, ...]:
    values = tuple(part.strip() for part in text.split(",") if part.strip())
    if not values:
        raise argparse.ArgumentTypeError("expected at least one name")
    return values


def _seed_range(text: str) -> tuple[int, ...]:
    """'11,22,33' or 'START:COUNT:STEP' (e.g. 11:20:11 = 11, 22, ..., 220)."""
    if ":" in text:
        try:
            start, count, step = (int(part) for part in text.split(":"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected START:COUNT:STEP, got {text!r}") from None
        if count < 1:
            raise argparse.ArgumentTypeError(f"COUNT must be >= 1, got {count}")
        return tuple(start + i * step for i in range(count))
    return comma_ints(text)


def _shard(text: str) -> tuple[int, int]:
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected I/N such as 0/2, got {text!r}") from None
    if count < 1 or not 0 <= index < count:
        raise argparse.ArgumentTypeError(f"need 0 <= I < N, got {text!r}")
    return index, count


def _common(p) -> None:
    p.add_argument("--output", required=True, help="study directory (resumed when it holds the same plan)")
    p.add_argument("--workers", type=int, default=2, help="runs in parallel, one torch thread each (default 2)")
    p.add_argument("--force", action="store_true", help="replace a study planned with a different design")
    p.add_argument("--plan-only", action="store_true", help="write plan.json (design + time estimate) and stop")
    add_arguments(p, LiveLoggingConfig)  # --quiet, --tensorboard, --wandb: as on every training command
    add_no_progress_alias(p)
    p.add_argument("--shard", type=_shard, default=(0, 1), metavar="I/N",
                   help="run only every N-th unit of the plan starting at I (split a study across machines)")
    p.add_argument("--device", choices=DEVICE_CHOICES, default="cpu",
                   help="where each run trains (default cpu; with cuda, --workers processes share the GPU)")


def register(sub) -> None:
    from ..experiments.pretraining_data import CONDITIONS, DEFAULT_SEEDS
    from ..experiments.rl_choices import (
        ARMS,
        DEFAULT_CONFIRM_SEEDS,
        DEFAULT_SCREEN_SEEDS,
        DEFAULT_TASKS_PER_FAMILY,
    )

    experiment = sub.add_parser("experiment", help="research studies (resumable, planned, with receipts)")
    studies = experiment.add_subparsers(dest="study", metavar="STUDY")
    experiment.set_defaults(func=lambda args: (experiment.print_help(), 2)[1])

    p = studies.add_parser(
        "pretraining-data", help="diversity / order / curriculum of pretraining structures (research-mini)",
        description="The original's miniature study, compatible (120 structures shuffled with seed 1701, 88 train / "
                    "32 held out, research-mini, AdamW 8e-4, batch 24, 200 updates), with every condition paired by "
                    "seed and evaluated at several points of one run. Analyse with `glm53 analyze DIR`.")
    _common(p)
    p.add_argument("--conditions", type=_name_list, default=CONDITIONS, help=f"comma-separated; {', '.join(CONDITIONS)}")
    p.add_argument("--seeds", type=_seed_range, default=DEFAULT_SEEDS,
                   help="comma-separated or START:COUNT:STEP (default 11:20:11 = 20 paired seeds)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=24)
    p.add_argument("--learning-rate", type=float, default=8e-4)
    p.add_argument("--sequence-length", type=int, default=128)
    p.add_argument("--eval-at", type=comma_ints, default=None,
                   help="updates to evaluate at (default 0 and every quarter of --steps)")
    p.set_defaults(func=run_pretraining_data)

    r = studies.add_parser(
        "rl-choices", help="which RLOO choices matter: a screen of arms, then a confirmation on fresh seeds",
        description="The original's eight RL arms (+ group-size arms at matched updates) from one pretraining "
                    "checkpoint, screened on dev over --seeds; the best arm (rule fixed in plan.json) is confirmed "
                    "against the baseline on --confirm-seeds (never a screening seed) and the final split, which no other step of the study opens. "
                    "Resumable: finished (arm, seed) runs are skipped. Analyse with `glm53 analyze DIR`.")
    _common(r)
    r.add_argument("--checkpoint", required=True, help="pretraining checkpoint directory every arm starts from")
    r.add_argument("--arms", type=_name_list, default=tuple(ARMS), help=f"comma-separated; {', '.join(ARMS)}")
    r.add_argument("--seeds", type=_seed_range, default=DEFAULT_SCREEN_SEEDS, help="screening training seeds")
    r.add_argument("--confirm-seeds", type=_seed_range, default=DEFAULT_CONFIRM_SEEDS,
                   help="fresh training seeds for the confirmation (default 1001:10:1)")
    r.add_argument("--tasks", type=int, default=DEFAULT_TASKS_PER_FAMILY,
                   help="evaluation tasks per family (5 families; default 20 = 100 tasks per split)")
    r.add_argument("--confirm-arm", default=None, help="confirm this arm instead of the screen's winner")
    r.add_argument("--open-sealed", metavar="PURPOSE", default=None,
                   help="the confirmation evaluates the sealed split final: say why it is opened (recorded in "
                        "the ledger; `glm53 ledger`)")
    r.add_argument("--reopen", metavar="REASON", default=None,
                   help="open final again for a plan that already opened it (recorded in the ledger)")
    r.set_defaults(func=run_rl_choices)

    a = sub.add_parser("analyze", help="summary.json, REPORT.md and charts from a study directory's receipts",
                       description="Reads only DIR/plan.json and DIR/runs/*.json; writes DIR/summary.json, "
                                   "DIR/REPORT.md and PNG charts. Refuses to replace them without --force.")
    a.add_argument("directory", help="a study directory written by `glm53 experiment ...`")
    a.add_argument("--force", action="store_true", help="rebuild summary.json / REPORT.md when they exist")
    a.set_defaults(func=run_analyze)


def _existing_plan(out: Path, draft: dict) -> dict | None:
    """The plan already in `out` when it has the same design as `draft` (then nothing is re-measured)."""
    from ..experiments.study import PLAN_FILE, plan_hash

    path = out / PLAN_FILE
    if path.is_file():
        existing = json.loads(path.read_text())
        if existing.get("plan_sha256") == plan_hash(draft):
            return existing
    return None


def _start_study(args, out: Path, plan: dict) -> bool:
    from ..experiments.study import pending_units, prepare_study

    resuming = prepare_study(out, plan, args.force)
    estimate = plan["estimate"]
    units = plan["units"]
    todo = pending_units(out, units, plan["plan_sha256"])
    print(f"{plan['study']}: plan {plan['plan_sha256'][:12]} -> {out / 'plan.json'}; "
          f"{len(units) - len(todo)}/{len(units)} runs done{' (resuming)' if resuming else ''}; "
          f"estimated {estimate.get('expected_minutes')} min with {estimate.get('workers')} worker(s)",
          file=sys.stderr)
    return resuming


def _run(args, out: Path, plan: dict, units: list[dict], unit_function, opening=None) -> int:
    from ..experiments.study import run_units

    from ..runtime import resolve_device

    design, device = plan["design"], str(resolve_device(args.device))
    index, count = args.shard
    position = {u["key"]: i for i, u in enumerate(plan["units"])}
    units = [u for u in units if position[u["key"]] % count == index]
    logging = {"tensorboard": args.tensorboard, "wandb": args.wandb}
    return run_units(out, plan, [u | {"design": design, "device": device, "logging": logging} for u in units],
                     unit_function, workers=args.workers, progress=not args.quiet, argv=sys.argv, device=device,
                     opening=opening)


@contextlib.contextmanager
def _study_session(args, out: Path, plan_only: bool = False):
    """The study directory locked for this process (a second writer is refused), and its plan.json
    marked running / complete / incomplete (this shard's part done) / interrupted."""
    from ..train.loop import check_live_logging
    from ..train.rundir import RunLock, interruptible

    check_live_logging(args.tensorboard, args.wandb)
    command = shlex.join(["glm53", *getattr(args, "command_argv", sys.argv[1:])])
    state = {}
    with RunLock(out):
        def mark(status: str) -> None:
            if "plan" in state and not plan_only:
                from ..experiments.study import mark_status

                mark_status(out, state["plan"], status, resume_command=command if status == "interrupted" else None)

        with interruptible(lambda: mark("interrupted"), command + "   (the same command resumes the study)"):
            yield state, mark


def run_pretraining_data(args) -> int:
    from ..experiments.pretraining_data import build_plan, measure_seconds_per_step, run_unit

    if args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    out = Path(args.output)
    eval_at = args.eval_at if args.eval_at is not None else sorted({0, *(args.steps * q // 4 for q in (1, 2, 3, 4))})
    options = (args.conditions, args.seeds, args.steps, args.batch_size, args.learning_rate, args.sequence_length,
               eval_at, args.workers)
    draft = build_plan(*options, None)  # also validates the flags before timing anything
    with _study_session(args, out, args.plan_only) as (state, mark):
        plan = _existing_plan(out, draft)
        if plan is None:
            plan = build_plan(*options, round(measure_seconds_per_step(), 4))
        _start_study(args, out, plan)
        if args.plan_only:
            return 0
        state["plan"] = plan
        mark("running")
        ran = _run(args, out, plan, plan["units"], run_unit)
        mark(_finished_status(out, plan))
    print(f"{plan['study']}: {ran} run(s) finished; next: glm53 analyze {out}", file=sys.stderr)
    return 0


def _finished_status(out: Path, plan: dict) -> str:
    from ..experiments.study import pending_units

    return "incomplete" if pending_units(out, plan["units"], plan["plan_sha256"]) else "complete"


SELECTION_FILE = "selection.json"


def run_rl_choices(args) -> int:
    from ..model.pretrained import read_metadata
    from ..experiments.rl_choices import build_plan, measure_speed

    if args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    out = Path(args.output)
    checkpoint = Path(args.checkpoint)
    if not (checkpoint / "metadata.json").is_file() and not checkpoint.is_dir():
        raise FileNotFoundError(f"--checkpoint {checkpoint} does not exist; make a pretraining checkpoint with "
                                "`glm53 pretrain --output runs/pretrain --steps 100` (or `make demo`)")
    sha = read_metadata(checkpoint)["weights_sha256"]
    options = (str(checkpoint), sha, args.arms, args.seeds, args.confirm_seeds, args.tasks, args.confirm_arm,
               args.workers)
    draft = build_plan(*options, None, None)
    if not args.plan_only and not args.open_sealed:
        from ..experiments.study import pending_units, plan_hash
        from ..ledger import is_sealed

        sealed = [u["split"] for u in pending_units(out, draft["units"], plan_hash(draft)) if is_sealed(u["split"])]
        if sealed:  # refused before the study directory is touched
            raise ValueError(f"this study evaluates the sealed split {sealed[0]}: pass --open-sealed \"<purpose>\" "
                             "(recorded in the ledger; see `glm53 ledger`)")
    with _study_session(args, out, args.plan_only) as (state, mark):
        plan = _existing_plan(out, draft)
        if plan is None:
            plan = build_plan(*options, *(round(v, 4) for v in measure_speed(str(checkpoint))))
        _start_study(args, out, plan)
        if args.plan_only:
            return 0
        state["plan"] = plan
        mark("running")
        ran = _run_rl_phases(args, out, plan)
        mark(_finished_status(out, plan))
    print(f"rl-choices: {ran} run(s) finished; next: glm53 analyze {out}", file=sys.stderr)
    return 0


def _run_rl_phases(args, out: Path, plan: dict) -> int:
    """The screen (and references), then the planned selection, then the confirmation."""
    from ..experiments.rl_choices import run_unit, select_candidate
    from ..experiments.study import load_receipts
    from ..receipts import provenance, write_json

    from ..experiments.study import pending_units
    from ..ledger import is_sealed, require_open

    # Every unit on a sealed split (the confirmation and its reference) runs under one opening, asked
    # for before anything runs, so a missing --open-sealed costs no training.
    sealed = [u for u in pending_units(out, plan["units"], plan["plan_sha256"]) if is_sealed(u["split"])]
    opening = None
    if sealed:
        if not args.open_sealed:
            raise ValueError(f"this study evaluates the sealed split {sealed[0]['split']}: pass --open-sealed "
                             "\"<purpose>\" (recorded in the ledger)")
        opening = require_open(sealed[0]["split"], args.open_sealed, plan_sha256=plan["plan_sha256"],
                               reopen=args.reopen)
    work = out / "work"
    first = [u | {"work_dir": str(work / u["key"])} for u in plan["units"] if u["phase"] != "confirm"]
    ran = _run(args, out, plan, first, run_unit, opening)
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
        ran += _run(args, out, plan, resolved, run_unit, opening)
    if work.is_dir() and not any(work.iterdir()):  # each unit removes its own; another shard may still run
        work.rmdir()
    return ran


def run_analyze(args) -> int:
    from ..experiments.analysis import analyze

    summary = analyze(args.directory, force=args.force, argv=sys.argv)
    print(json.dumps({"study": summary["study"], "runs": summary["runs"],
                      "answers": summary["answers"]}, indent=2))
    print(f"wrote {Path(args.directory) / 'REPORT.md'}", file=sys.stderr)
    return 0
