"""How `glm53 experiment NAME` runs a study (`run_study`), and what a study's phases run their units with
(`Session`, `sealed_opening`, `unit_openings`).

Every study runs in the same session: the flags checked and the plan drafted (so a mistake costs no
timing), a rerun's design checked against its first study, the sealed openings granted before the study
directory is touched, the directory locked, the plan resumed or timed and written, its power and time
printed, then the study's phases (`Study.run`), with plan.json's status kept (experiments/study.py).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from glm53_flash.core.options import config_record
from glm53_flash.core.receipts import provenance, read_json, sha256_json, write_json
from glm53_flash.experiments.reruns import read_plan
from glm53_flash.experiments.study import (
    PLAN_FILE, SELECTION_FILE, Study, load_receipts, pending_units, plan_hash, prepare_study, run_units, study_session,
)


def run_study(study: Study, cfg, *, command: str, argv: list[str]) -> int:
    """`glm53 experiment NAME` with the flags in `cfg` (the study's config); `command` resumes it (recorded in
    plan.json when interrupted), `argv` goes into the receipts' provenance."""
    cfg.validate()
    out = Path(cfg.output)
    draft = study.plan(cfg, None)  # validates the flags before timing anything
    if getattr(cfg, "rerun_of", None) is not None:
        check_planned_rerun(study, cfg.rerun_of, draft)
    with study.sealed_openings(cfg, out, draft) as openings:
        with study_session(out, command, tensorboard=cfg.tensorboard, wandb=cfg.wandb,
                           plan_only=cfg.plan_only) as (state, mark):
            plan = existing_plan(out, draft)
            if plan is None:
                plan = study.plan(cfg, study.speed(cfg, draft))
            plan["run_config"] = config_record(cfg)  # this session's flags, outside the hashed design
            _start(study, cfg, out, plan)
            if cfg.plan_only:
                return 0
            state["plan"] = plan
            mark("running")
            ran = study.run(Session(cfg, out, plan, openings, list(argv)))
            mark("incomplete" if pending_units(out, plan["units"], plan["plan_sha256"]) else "complete")
    print(f"{plan['study']}: {ran} run(s) finished; next: glm53 analyze {out}", file=sys.stderr)
    return 0


def check_planned_rerun(study: Study, first_directory: str | Path, draft: dict) -> None:
    """Before a study's first run: `draft` (its plan, untimed) may be compared as the rerun of the study in
    `first_directory` (the check `glm53 analyze --rerun-of` makes on the finished studies), or a ValueError
    names what differs, so a mismatch (a precision `auto` resolved otherwise on this machine, a changed
    flag) costs seconds instead of a study's hours."""
    first = read_plan(first_directory)
    if not study.rerunnable:
        raise ValueError(f"--rerun-of: `{study.name}` studies have no rerun comparison")
    try:
        study.check_rerun(first, draft)
    except ValueError as error:
        raise ValueError(f"this study is not a rerun of {first_directory}: {error}") from None


def existing_plan(out: Path, draft: dict) -> dict | None:
    """The plan already in `out` when it has the same design as `draft` (then nothing is re-measured)."""
    path = out / PLAN_FILE
    if path.is_file():
        existing = read_json(path)
        if existing.get("plan_sha256") == plan_hash(draft):
            return existing
    return None


def _start(study: Study, cfg, out: Path, plan: dict) -> None:
    """Write (or reopen) the plan, then say its power and what is left to run."""
    resuming = prepare_study(out, plan, cfg.force)
    for line in study.power_lines(read_json(out / PLAN_FILE)):
        print(line, file=sys.stderr)
    units = plan["units"]
    todo = pending_units(out, units, plan["plan_sha256"])
    print(f"{plan['study']}: plan {plan['plan_sha256'][:12]} -> {out / PLAN_FILE}; "
          f"{len(units) - len(todo)}/{len(units)} runs done{' (resuming)' if resuming else ''}; "
          f"{time_left(plan['estimate'], len(todo), len(units), getattr(cfg, 'workers', None))}", file=sys.stderr)


def time_left(estimate: dict, todo: int, total: int, workers: int | None) -> str:
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


@dataclass
class Session:
    """One call's study: its flags, directory, plan and sealed openings, and what its phases run units with."""

    cfg: object
    out: Path
    plan: dict
    openings: object = None
    argv: list[str] = field(default_factory=list)

    def run(self, units: list[dict], function, opening=None) -> int:
        """This shard's units among `units` that have no receipt yet, through `function` (a module-level
        function: it runs in worker processes, one torch thread each) with the design, the device and the
        live logging; units on `opening`'s split run under it. Returns how many ran."""
        from glm53_flash.core.runtime import resolve_device

        cfg = self.cfg
        design, device = self.plan["design"], str(resolve_device(cfg.device))
        index, count = cfg.shard
        position = {u["key"]: i for i, u in enumerate(self.plan["units"])}
        units = [u for u in units if position[u["key"]] % count == index]
        logging = {"tensorboard": cfg.tensorboard, "wandb": cfg.wandb}
        return run_units(self.out, self.plan, [u | {"design": design, "device": device, "logging": logging}
                                               for u in units],
                         function, workers=cfg.workers, progress=not cfg.quiet, argv=self.argv, device=device,
                         opening=opening)

    def receipts(self) -> list[dict]:
        """The receipts of this plan written so far (by any shard)."""
        return load_receipts(self.out, self.plan["plan_sha256"])

    def pending(self, units: list[dict]) -> list[dict]:
        return pending_units(self.out, units, self.plan["plan_sha256"])

    def decide(self, rule) -> dict:
        """The plan's dev decision, selection.json: the one on disk when it was made for this plan, else
        `rule(receipts)` written now with the plan's hash and provenance, before any sealed unit runs."""
        path = self.out / SELECTION_FILE
        selection = read_json(path) if path.exists() else None
        if selection is None or selection.get("plan_sha256") != self.plan["plan_sha256"]:  # none yet, or stale
            selection = rule(self.receipts()) | {"plan_sha256": self.plan["plan_sha256"],
                                                 "provenance": provenance(self.argv)}
            write_json(path, selection)
        return selection

    def work_dir(self, resolve: bool = True) -> Path:
        """Where the units keep what they train until their receipt is written (each removes its own)."""
        work = self.out / "work"
        return work.resolve() if resolve else work

    def remove_empty_work_dir(self) -> None:
        work = self.work_dir()
        if work.is_dir() and not any(work.iterdir()):  # another shard may still be running in it
            work.rmdir()


def sealed_opening(cfg, out: Path, plan: dict):
    """The ledger opening for the plan's pending units on a sealed split (one opening for the plan), or None
    when there are none; refused without --open-sealed. The plan file is the dev decision the opening
    follows; where the study also decides on dev (selection.json), that file is hashed into the opened
    line too when it exists by the time the opening activates, right before a sealed unit runs."""
    from glm53_flash.evaluation.ledger import is_sealed, require_open

    units = pending_units(out, plan["units"], plan_hash(plan)) if existing_plan(out, plan) is not None else plan["units"]
    sealed = [u["split"] for u in units if u.get("split") and is_sealed(u["split"])]
    if not sealed:
        return None
    if not cfg.open_sealed:
        raise ValueError(f"this study evaluates the sealed split {sealed[0]}: pass --open-sealed \"<purpose>\" "
                         "(recorded in the ledger; see `glm53 ledger`)")
    return require_open(sealed[0], cfg.open_sealed, plan_sha256=plan_hash(plan), reopen=cfg.reopen,
                        ledger=cfg.ledger, allow_dirty=cfg.allow_dirty, decision=(out / PLAN_FILE,),
                        optional_decision=(out / SELECTION_FILE,))


def sealed_identity(plan_sha256: str, key: str) -> str:
    """A sealed unit's plan identity in the ledger: the study's plan and the unit, so each unit (an arm and
    seed) opens its sealed split once."""
    return sha256_json({"study_plan_sha256": plan_sha256, "unit": key})


def unit_openings(cfg, out: Path, plan: dict, phase: str = "sealed") -> dict:
    """One ledger opening per pending unit of `phase` in this shard, each under its own identity
    (sealed_identity), by unit key; none without --open-sealed (the study then stops before them)."""
    from glm53_flash.evaluation.ledger import plan_openings, require_open

    sha = plan_hash(plan)
    index, count = cfg.shard
    sealed = [u for position, u in enumerate(plan["units"]) if u["phase"] == phase and position % count == index]
    # receipts count only in a directory of this plan: another plan's (replaced by --force) are not this one's
    pending = pending_units(out, sealed, sha) if existing_plan(out, plan) is not None else sealed
    if not pending or cfg.open_sealed is None:
        return {}
    openings = {}
    for unit in pending:
        identity = sealed_identity(sha, unit["key"])
        earlier = cfg.reopen is not None and plan_openings(unit["split"], identity, cfg.ledger)
        openings[unit["key"]] = require_open(unit["split"], cfg.open_sealed, plan_sha256=identity,
                                             reopen=cfg.reopen if earlier else None, ledger=cfg.ledger,
                                             allow_dirty=cfg.allow_dirty, decision=(out / PLAN_FILE,))
    return openings


__all__ = ["Session", "check_planned_rerun", "existing_plan", "run_study", "sealed_identity", "sealed_opening",
           "time_left", "unit_openings"]
