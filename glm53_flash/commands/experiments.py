"""CLI registration for `glm53 experiment ...` (the research studies) and `glm53 analyze DIR`."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from glm53_flash.core.options import add_arguments, config_record, from_arguments
from glm53_flash.core.receipts import read_json
from glm53_flash.commands.train import add_no_progress_alias


def register(sub) -> None:
    from glm53_flash.experiments.config import (
        GeneralisationStudyConfig, PretrainingDataStudyConfig, PretrainSwitchesStudyConfig, RLChoicesStudyConfig,
        RLSwitchesStudyConfig,
   )

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

    g = studies.add_parser(
        "rl-generalisation", help="does RL on the compositions suite generalise: arms x pretraining seeds x RL "
                                  "seeds x rewards, two sealed splits",
        description="For each arm (faithful, ours) and pretraining seed: pretrain on the compositions suite, select on "
                    "dev, RL on compositions.rl for every RL seed with the three-case and the strong reward (each run "
                    "selected on dev), then open the two sealed splits (unseen compositions, new constants) once per "
                    "arm and seed. Units run in parallel (--workers, one thread each); the plan states its power and "
                    "its time on this machine before the first run. Resumable. Analyse with `glm53 analyze DIR`.")
    add_arguments(g, GeneralisationStudyConfig)
    add_no_progress_alias(g)
    g.set_defaults(func=run_generalisation)

    w = studies.add_parser(
        "rl-switches", help="which RL switch matters: each of the three flipped alone on each arm, from an "
                            "rl-generalisation study's checkpoints, on dev",
        description="From the selected pretraining checkpoints of a finished rl-generalisation study (--source): RL "
                    "with each arm's own switches and with each switch alone set to the other arm's value, for every "
                    "RL seed; each run's last checkpoint evaluated greedy on dev; each flip compared with the arm's "
                    "own at the behaviour and the seed level, Holm over the comparisons. Opens no sealed split. "
                    "Resumable. Analyse with `glm53 analyze DIR`.")
    add_arguments(w, RLSwitchesStudyConfig)
    add_no_progress_alias(w)
    w.set_defaults(func=run_rl_switches)

    f = studies.add_parser(
        "pretrain-switches", help="which pretraining switch matters: a two-level factorial over the three that "
                                  "differ between the arms, on dev, confirmed on a sealed split",
        description="The pretraining switches that differ between the faithful and our arm (three) as the factors "
                    "of a two-level factorial design (--fraction full: every combination, 8 runs per seed), "
                    "every point pretrained from random weights under every seed (the study model, the "
                    "rl-generalisation recipe); each run's last checkpoint evaluated greedy on dev; each switch's "
                    "main effect tested over behaviours and over runs (least squares, a block per seed), Holm over "
                    "the switches. Then the plan's rule picks the defaults (selection.json) and, with "
                    "--open-sealed, every run is evaluated on compositions.unseen_structures, opened once for the "
                    "plan, to confirm what dev showed. Resumable. Analyse with `glm53 analyze DIR`.")
    add_arguments(f, PretrainSwitchesStudyConfig)
    add_no_progress_alias(f)
    f.set_defaults(func=run_pretrain_switches)

    a = sub.add_parser("analyze", help="summary.json, REPORT.md and charts from a study directory's receipts",
                       description="Reads only DIR/plan.json and DIR/runs/*.json; writes DIR/summary.json, "
                                   "DIR/REPORT.md and PNG charts. Refuses to replace them without --force.")
    a.add_argument("directory", help="a study directory written by `glm53 experiment ...`")
    a.add_argument("--force", action="store_true", help="rebuild summary.json / REPORT.md when they exist")
    a.add_argument("--rerun-of", metavar="FIRST", default=None,
                   help="DIR is the rerun of this rl-generalisation, rl-switches, pretrain-switches or compositions "
                        "rl-choices study "
                        "(disjoint pretraining seeds): add whether "
                        "each conclusion holds in both, the rerun spread and both together (default: none)")
    a.set_defaults(func=run_analyze)


def _existing_plan(out: Path, draft: dict) -> dict | None:
    """The plan already in `out` when it has the same design as `draft` (then nothing is re-measured)."""
    from glm53_flash.experiments.study import PLAN_FILE, plan_hash

    path = out / PLAN_FILE
    if path.is_file():
        existing = read_json(path)
        if existing.get("plan_sha256") == plan_hash(draft):
            return existing
    return None


def plan_power_lines(plan: dict) -> list[str]:
    """The power statement of a study's plan, in its own study's words."""
    from glm53_flash.experiments import generalisation
    from glm53_flash.experiments.study import power_lines

    from glm53_flash.experiments import pretrain_switches

    if plan.get("study") == generalisation.STUDY:
        return generalisation.power_lines(plan)
    if plan.get("study") == pretrain_switches.STUDY:
        return pretrain_switches.power_lines(plan)
    return power_lines(plan)


def _start_study(cfg, out: Path, plan: dict) -> bool:
    from glm53_flash.experiments.study import pending_units, prepare_study

    resuming = prepare_study(out, plan, cfg.force)
    recorded = read_json(out / "plan.json")
    lines = plan_power_lines(recorded)
    for line in lines:
        print(line, file=sys.stderr)
    estimate = plan["estimate"]
    units = plan["units"]
    todo = pending_units(out, units, plan["plan_sha256"])
    print(f"{plan['study']}: plan {plan['plan_sha256'][:12]} -> {out / 'plan.json'}; "
          f"{len(units) - len(todo)}/{len(units)} runs done{' (resuming)' if resuming else ''}; "
          f"{_time_left(estimate, len(todo), len(units), getattr(cfg, 'workers', None))}", file=sys.stderr)
    return resuming


def _time_left(estimate: dict, todo: int, total: int, workers: int | None) -> str:
    """The plan's estimate (all its runs, with the workers it was planned for) scaled to the runs still to
    do and the workers this call runs: a resumed plan says what is left, not what the whole took."""
    minutes, planned = estimate.get("expected_minutes"), estimate.get("workers")
    workers = workers or planned
    if minutes is None or not total:
        return "no time estimate"
    if not (planned and workers):
        return f"estimated {minutes} min for all {total} runs"
    left = minutes * todo / total * planned / workers
    return (f"estimated {left:.1f} min left with {workers} worker(s)"
            + (f" (the whole plan: {minutes} min with {planned})" if todo != total or workers != planned else ""))


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
    from glm53_flash.core.runtime import resolve_device
    from glm53_flash.model.precision import resolve_precision

    precision = (resolve_precision(cfg.precision, str(resolve_device(cfg.device))).name if cfg.suite == "compositions"
                 else None)
    draft = build_plan(*options, None, None, cfg.suite, precision)
    _check_rerun(cfg, draft)
    # Every unit on a sealed split (the confirmation and its reference) runs under one opening, granted
    # here, before the study directory is touched: a missing --open-sealed costs no training.
    opening = None if cfg.plan_only else _sealed_opening(cfg, out, draft)
    return _run_study(args, cfg, out, draft,
                      lambda: build_plan(*options, *(round(v, 4) for v in measure_speed(str(checkpoint), cfg.suite,
                                                                                           precision)),
                                         cfg.suite, precision),
                      lambda plan: _run_rl_phases(cfg, out, plan, opening))


def _check_rerun(cfg, draft: dict) -> None:
    """With --rerun-of, the draft plan must be a rerun of that study (reruns.check_planned_rerun)."""
    if cfg.rerun_of is not None:
        from glm53_flash.experiments.reruns import check_planned_rerun

        check_planned_rerun(cfg.rerun_of, draft)


def _sealed_opening(cfg, out: Path, plan: dict):
    """The ledger opening for the plan's pending units on a sealed split, or None when there are none."""
    from glm53_flash.experiments.study import pending_units, plan_hash
    from glm53_flash.evaluation.ledger import is_sealed, require_open

    units = pending_units(out, plan["units"], plan_hash(plan)) if _existing_plan(out, plan) is not None else plan["units"]
    sealed = [u["split"] for u in units if u.get("split") and is_sealed(u["split"])]
    if not sealed:
        return None
    if not cfg.open_sealed:
        raise ValueError(f"this study evaluates the sealed split {sealed[0]}: pass --open-sealed \"<purpose>\" "
                         "(recorded in the ledger; see `glm53 ledger`)")
    return require_open(sealed[0], cfg.open_sealed, plan_sha256=plan_hash(plan), reopen=cfg.reopen,
                        ledger=cfg.ledger, allow_dirty=cfg.allow_dirty, decision=(study_plan(out),),
                        optional_decision=(out / SELECTION_FILE,))


def study_plan(out: Path) -> Path:
    """A study's plan file: the dev decision its sealed openings follow (design, units, selection rules).
    Where the study also selects on dev (pretrain-switches, rl-choices), its selection.json is hashed into
    the opened line too when it exists by the time the opening activates, right before a sealed unit runs."""
    from glm53_flash.experiments.study import PLAN_FILE

    return out / PLAN_FILE


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
        selection = read_json(selection_path) if selection_path.exists() else None
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


def run_generalisation(args) -> int:
    from glm53_flash.core.runtime import resolve_device
    from glm53_flash.experiments import generalisation
    from glm53_flash.experiments.config import GeneralisationStudyConfig
    from glm53_flash.model.precision import resolve_precision

    cfg = from_arguments(GeneralisationStudyConfig, args)
    cfg.validate()
    out = Path(cfg.output)
    device = str(resolve_device(cfg.device))
    options = dict(arms=cfg.arms, seeds=cfg.seeds, rl_seeds=cfg.rl_seeds, rewards=cfg.rewards,
                   pretrain=cfg.pretrain_recipe(), rl=cfg.rl_recipe(), dev_tasks=cfg.dev_tasks,
                   sealed_tasks=cfg.sealed_tasks, precision=resolve_precision(cfg.precision, device).name,
                   workers=cfg.workers)
    draft = generalisation.build_plan(**options, speed=None)  # validates the flags before timing anything
    _check_rerun(cfg, draft)
    # Every pending sealed evaluation's opening is granted here, before the study directory is touched: a
    # refused one (a second opening without --reopen) costs no training. Without --open-sealed the study
    # runs up to its sealed evaluations and stops there.
    openings = {} if cfg.plan_only else _generalisation_openings(cfg, out, draft)

    def timed_plan():
        print(f"{generalisation.STUDY}: timing this machine (a few pretraining steps, RL with one and with three groups, 4 and 12 dev tasks; "
              "one thread, as each worker runs)", file=sys.stderr)
        return generalisation.build_plan(**options, speed=generalisation.measure_speed(draft["design"], device))

    try:
        return _run_study(args, cfg, out, draft, timed_plan,
                          lambda plan: _run_generalisation_phases(cfg, out, plan, openings))
    finally:
        for opening in openings.values():
            opening.close()  # a later run (in this process too) asks the ledger again


def run_rl_switches(args) -> int:
    from glm53_flash.core.runtime import resolve_device
    from glm53_flash.experiments import rl_switches
    from glm53_flash.experiments.config import RLSwitchesStudyConfig

    cfg = from_arguments(RLSwitchesStudyConfig, args)
    cfg.validate()
    out = Path(cfg.output)
    device = str(resolve_device(cfg.device))
    options = (Path(cfg.source), cfg.rl_seeds, cfg.switches, cfg.dev_tasks, cfg.workers)
    draft = rl_switches.build_plan(*options, None, seeds=cfg.seeds)
    _check_rerun(cfg, draft)

    def run(plan):
        work = (out / "work").resolve()
        ran = _run(cfg, out, plan, [u | {"work_dir": str(work / u["key"])} for u in plan["units"]],
                   rl_switches.run_unit)
        if work.is_dir() and not any(work.iterdir()):
            work.rmdir()
        return ran

    return _run_study(args, cfg, out, draft,
                      lambda: rl_switches.build_plan(*options, rl_switches.measure_speed(draft, device),
                                                         seeds=cfg.seeds), run)


def run_pretrain_switches(args) -> int:
    from glm53_flash.core.runtime import resolve_device
    from glm53_flash.experiments import pretrain_switches
    from glm53_flash.experiments.config import PretrainSwitchesStudyConfig
    from glm53_flash.model.precision import resolve_precision

    cfg = from_arguments(PretrainSwitchesStudyConfig, args)
    cfg.validate()
    out = Path(cfg.output)
    device = str(resolve_device(cfg.device))
    options = dict(seeds=cfg.seeds, fraction=cfg.fraction, pretrain=cfg.pretrain_recipe(), dev_tasks=cfg.dev_tasks,
                   sealed_tasks=cfg.sealed_tasks, precision=resolve_precision(cfg.precision, device).name,
                   workers=cfg.workers)
    draft = pretrain_switches.build_plan(**options, speed=None)  # validates the flags before timing anything
    _check_rerun(cfg, draft)
    # The sealed split's opening is granted here, before the study directory is touched (a refused one costs
    # no training); its units run only after every dev run has finished and the decision is written.
    opening = None if cfg.plan_only or cfg.open_sealed is None else _sealed_opening(cfg, out, draft)

    def timed_plan():
        print(f"{pretrain_switches.STUDY}: timing this machine (pretraining steps, dev tasks; one thread, as each "
              "worker runs)", file=sys.stderr)
        return pretrain_switches.build_plan(**options, speed=pretrain_switches.measure_speed(draft["design"], device))

    try:
        return _run_study(args, cfg, out, draft, timed_plan,
                          lambda plan: _run_pretrain_switches_phases(cfg, out, plan, opening))
    finally:
        if opening is not None:
            opening.close()


def _run_pretrain_switches_phases(cfg, out: Path, plan: dict, opening) -> int:
    """Every dev run, then the plan's decision (selection.json, written once every dev run has its receipt),
    then, under the sealed split's opening, every run's checkpoint on the sealed split."""
    from glm53_flash.core.receipts import provenance, write_json
    from glm53_flash.experiments import pretrain_switches
    from glm53_flash.experiments.study import load_receipts, pending_units

    work = (out / "work").resolve()
    dev = [u | {"work_dir": str(work / u["key"])} for u in plan["units"] if u["phase"] == "dev"]
    ran = _run(cfg, out, plan, dev, pretrain_switches.run_unit)
    if pending_units(out, dev, plan["plan_sha256"]):
        return ran  # another shard's dev runs are not done yet: no decision, no sealed split
    receipts = load_receipts(out, plan["plan_sha256"])
    selection_path = out / SELECTION_FILE
    selection = read_json(selection_path) if selection_path.exists() else None
    if selection is None or selection.get("plan_sha256") != plan["plan_sha256"]:
        effects = pretrain_switches.main_effects(plan, receipts, "dev")
        selection = pretrain_switches.decision(plan, effects) | {"plan_sha256": plan["plan_sha256"],
                                                                 "provenance": provenance(sys.argv)}
        write_json(selection_path, selection)
    print(f"{pretrain_switches.STUDY}: the dev decision ({selection_path}): "
          + (", ".join(f"{k} = {v}" for k, v in selection["changed"].items()) or "the defaults stay"), file=sys.stderr)
    sealed = [u for u in plan["units"] if u["phase"] == "sealed"]
    if not pending_units(out, sealed, plan["plan_sha256"]):
        return ran
    if opening is None:
        print(f"{pretrain_switches.STUDY}: the dev runs are done; pass --open-sealed \"<purpose>\" to evaluate every "
              f"run on {pretrain_switches.SEALED_SPLIT} (opened once for the plan)", file=sys.stderr)
        return ran
    checkpoints = {(r["point"], r["seed"]): r["checkpoint"] for r in receipts if r["phase"] == "dev"}
    resolved = [u | {"checkpoint": checkpoints[(u["point"], u["seed"])]} for u in sealed]
    return ran + _run(cfg, out, plan, resolved, pretrain_switches.run_unit, opening)


def sealed_identity(plan_sha256: str, key: str) -> str:
    """A sealed unit's plan identity in the ledger: the study's plan and the unit, so each (arm, seed) opens
    each sealed split once."""
    from glm53_flash.core.receipts import sha256_json

    return sha256_json({"study_plan_sha256": plan_sha256, "unit": key})


def _generalisation_openings(cfg, out: Path, plan: dict) -> dict:
    from glm53_flash.evaluation.ledger import plan_openings, require_open
    from glm53_flash.experiments.study import pending_units, plan_hash

    sha = plan_hash(plan)
    index, count = cfg.shard
    sealed = [u for position, u in enumerate(plan["units"]) if u["phase"] == "sealed" and position % count == index]
    # receipts count only in a directory of this plan: another plan's (replaced by --force) are not this one's
    pending = pending_units(out, sealed, sha) if _existing_plan(out, plan) is not None else sealed
    if not pending or cfg.open_sealed is None:
        return {}
    openings = {}
    for unit in pending:
        identity = sealed_identity(sha, unit["key"])
        earlier = cfg.reopen is not None and plan_openings(unit["split"], identity, cfg.ledger)
        openings[unit["key"]] = require_open(unit["split"], cfg.open_sealed, plan_sha256=identity,
                                             reopen=cfg.reopen if earlier else None, ledger=cfg.ledger,
                                             allow_dirty=cfg.allow_dirty, decision=(study_plan(out),))
    return openings


def _run_generalisation_phases(cfg, out: Path, plan: dict, openings: dict) -> int:
    """One pretraining seed at a time (so a study stopped early has whole seeds to analyse): that seed's
    pretraining runs (each then selected on dev), its RL runs from each selected checkpoint (each selected
    on dev), then its sealed evaluations, each under its opening, once all its runs are done."""
    from glm53_flash.experiments.generalisation import run_unit
    from glm53_flash.experiments.study import load_receipts

    work = (out / "work").resolve()
    ran = 0
    for seed in plan["design"]["seeds"]:
        units = [u for u in plan["units"] if u["seed"] == seed]

        def done() -> dict:
            return {r["unit"]["key"]: r for r in load_receipts(out, plan["plan_sha256"])}

        ran += _run(cfg, out, plan, [u | {"work_dir": str(work / u["key"])} for u in units
                                     if u["phase"] == "pretrain"], run_unit)
        receipts = done()
        rl = []
        for unit in units:
            start = receipts.get(f"pretrain-{unit['arm']}-seed-{seed}") if unit["phase"] == "rl" else None
            if start is not None:
                selected = start["selection"]["selected"]
                rl.append(unit | {"work_dir": str(work / unit["key"]), "initial_checkpoint": selected["checkpoint"],
                                  "initial_checkpoint_sha256": selected["weights_sha256"]})
        ran += _run(cfg, out, plan, rl, run_unit)
        receipts = done()
        sealed = []
        for unit in (u for u in units if u["phase"] == "sealed" and u["key"] not in receipts):
            arm = unit["arm"]
            runs = {"before": f"pretrain-{arm}-seed-{seed}"}
            runs |= {f"{reward}-{r}": f"rl-{arm}-seed-{seed}-{reward}-{r}"
                     for reward in plan["design"]["rewards"] for r in plan["design"]["rl_seeds"]}
            if not all(key in receipts for key in runs.values()):
                continue  # its runs are not all done (another shard's, or failed): it waits
            if unit["key"] not in openings:
                print(f"rl-generalisation: {unit['key']} is ready; pass --open-sealed \"<purpose>\" to evaluate it",
                      file=sys.stderr)
                continue
            selected = {name: receipts[key]["selection"]["selected"] for name, key in runs.items()}
            sealed.append(unit | {"checkpoints": {name: s["checkpoint"] for name, s in selected.items()},
                                  "checkpoint_sha256": {name: s["weights_sha256"] for name, s in selected.items()},
                                  "opening": openings[unit["key"]]})
        ran += _run(cfg, out, plan, sealed, run_unit)
    return ran


def run_analyze(args) -> int:
    from glm53_flash.experiments.analysis import analyze

    summary = analyze(args.directory, force=args.force, argv=sys.argv, rerun_of=args.rerun_of)
    shown = {"study": summary["study"], "runs": summary["runs"], "answers": summary["answers"]}
    if "rerun" in summary:
        rerun = summary["rerun"]
        if "phases" in rerun:  # pretrain-switches: a verdict per phase both studies finished
            for phase, result in rerun["phases"].items():
                shown[f"every row holds in the rerun ({phase})"] = result["all_hold"]
        else:
            shown["every row holds in the rerun"] = rerun["all_hold"]
    print(json.dumps(shown, indent=2))
    print(f"wrote {Path(args.directory) / 'REPORT.md'}", file=sys.stderr)
    return 0
