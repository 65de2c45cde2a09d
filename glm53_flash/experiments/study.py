"""What a study is: the declaration every study makes (`Study`), and its directory: a plan written before
anything runs, resumable units.

A study declares, in its own module (experiments/<study>.py), a `Study` subclass: its config (its flags),
plan, units, phases, analysis, charts, rerun comparison and the sentence the docs show of its result;
experiments/registry.py holds one of each, and the CLI, `glm53 analyze`, the course deck and the Makefile
read them there. A study directory holds `plan.json` (the design, hashed; written by the CLI before the first unit
runs) and one receipt per finished unit under `runs/`. Rerunning with the same design skips finished
units; a different design is refused unless --force, so nothing is overwritten by accident. Units
run in worker processes (one torch thread each: on a small CPU two single-threaded runs beat one
two-threaded run), and a receipt is written atomically only when its unit has finished.
"""

from __future__ import annotations

import abc
import contextlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from glm53_flash.core.receipts import peak_rss_bytes, provenance, read_json, sha256_json, utc_now, write_json
from glm53_flash.train.rundir import holds_a_run

PLAN_FILE = "plan.json"
RUNS_DIR = "runs"
WORK_DIR = "work"
SELECTION_FILE = "selection.json"  # a study's decision on dev, written before its sealed units run
DERIVED_FILES = (SELECTION_FILE, "summary.json", "REPORT.md")


@dataclass(frozen=True)
class DeckEntry:
    """A committed study directory the course deck shows (report/slides.py reads these fields): its slide id,
    title, the command that produces it, its summary.json under the results directory, and its charts drawn
    at the deck's sizes, `figures(slide_id, summary, directory) -> ([(figure, element id, alt text)], stacked)`
    (stacked: wide charts, one above the other; else side by side)."""

    slide_id: str
    title: str
    command: str
    summary: str
    figures: Callable[[str, dict, Path], tuple[list, bool]] | None = None


@dataclass(frozen=True)
class MakeTarget:
    """A Makefile target of a study: its name and its rule as the Makefile holds it (variables, comment,
    prerequisites, recipe), written into the Makefile's block of study targets (registry.makefile_block)."""

    name: str
    rule: str


class Study(abc.ABC):
    """What a study declares in its own module; every method has the study's plan (or its flags) and returns
    plain data. The runner (experiments/runner.py) calls them in this order for `glm53 experiment NAME`:
    `plan(cfg, None)` (the draft: the flags checked before anything is timed), `check_rerun` (with
    --rerun-of), `sealed_openings` (granted before the directory is touched), `plan(cfg, speed(cfg, draft))`
    (a new plan only), `power_lines`, then `run(session)`, the phases. `glm53 analyze` calls `analyze` and,
    with --rerun-of, `compare_rerun` and `rerun_report_lines`; the docs call `answer`."""

    name: str = ""                      # `glm53 experiment NAME` and plan.json's "study"
    config: type | None = None          # its run config: options.py fields, each a flag and in plan.json's run_config
    help: str = ""                      # its line in `glm53 experiment --help`
    description: str = ""               # `glm53 experiment NAME --help`
    deck: tuple[DeckEntry, ...] = ()    # its committed results in the course deck
    make_targets: tuple[MakeTarget, ...] = ()
    rerunnable: bool = False            # `--rerun-of`: compare_rerun and its kin are defined

    # the plan
    @abc.abstractmethod
    def plan(self, cfg, speed) -> dict:
        """The plan of these flags: design, units, analysis, power and the time estimate from `speed` (what
        `speed` measured on this machine; None for the draft, which validates the flags)."""
        ...

    @abc.abstractmethod
    def speed(self, cfg, draft: dict):
        """This machine's speed for the plan's estimate, measured as each worker runs (one thread)."""
        ...

    def power_lines(self, plan: dict) -> list[str]:
        """The plan's power, as `glm53 experiment` prints it before the first run."""
        return power_lines(plan)

    # the units and their phases
    @contextlib.contextmanager
    def sealed_openings(self, cfg, out: Path, draft: dict):
        """The ledger's openings this call's sealed units run under, granted before the study directory is
        touched (a refused one costs no training); none by default."""
        yield None

    @abc.abstractmethod
    def run(self, session) -> int:
        """The phases: every pending unit of this shard through the study's worker function, in the order
        its decisions need (a decision on dev before a sealed split, units that need another's receipt);
        returns how many ran."""
        ...

    # the analysis
    @abc.abstractmethod
    def analyze(self, out: Path, plan: dict, receipts: list[dict]) -> tuple[dict, list[str], dict]:
        """(summary, REPORT.md's lines, {chart: PNG file}) from the plan and the receipts alone; the summary
        holds `answers` and `headline_table`."""
        ...

    @abc.abstractmethod
    def answer(self, plan: dict, summary: dict) -> str:
        """The study's result in a sentence or two for the docs, from its summary: what holds after its own
        Holm correction at the levels it names (`after_holm_sentence`)."""
        ...

    # the rerun on disjoint seeds (rerunnable studies)
    def check_rerun(self, first_plan: dict, plan: dict) -> None:
        """Raises ValueError naming what differs when `plan` cannot be compared as a rerun of `first_plan`."""
        raise ValueError(f"`{self.name}` studies have no rerun comparison")

    def compare_rerun(self, first_plan: dict, first_receipts: list[dict], plan: dict, receipts: list[dict]) -> dict:
        raise ValueError(f"`{self.name}` studies have no rerun comparison")

    def rerun_report_lines(self, comparison: dict, first_name: str) -> list[str]:
        raise ValueError(f"`{self.name}` studies have no rerun comparison")

    def rerun_verdicts(self, comparison: dict) -> dict:
        """What `glm53 analyze --rerun-of` prints of the comparison."""
        return {"every row holds in the rerun": comparison["all_hold"]}


def plan_hash(plan: dict) -> str:
    """Hash of the design only (not of the time estimate or provenance), so a resume can compare it."""
    return sha256_json({key: plan[key] for key in ("study", "design", "units", "analysis")})


def level_power(n: int, test: str, alpha: float = 0.05, power: float = 0.8) -> dict:
    """What a paired test over `n` independent values can detect, in standard deviations of the paired
    differences (so it needs no assumed spread): None when it can detect nothing (the exact sign-flip
    test's floor 2/2^n is above alpha, or fewer than two values)."""
    from glm53_flash.core.stats import minimum_detectable_difference, sign_flip_floor

    return {"n": n, "test": test, "alpha": alpha, "power": power,
            "sign_flip_floor": sign_flip_floor(n),
            "mdd_in_sd": minimum_detectable_difference(n, 1.0, alpha, power, test)}


def after_holm(verdict: str, comparisons: int, levels: str) -> str:
    """How an answer states a result: a direction only as it holds after the study's Holm correction over
    its `comparisons` at the `levels` named (e.g. "groups and seeds"), never per comparison."""
    family = f"Holm over {comparisons} comparison{'s' if comparisons != 1 else ''}, at {levels}"
    return f"not shown after {family}" if verdict == "not shown" else f"{verdict}, shown after {family}"


def after_holm_sentence(subject: str, rows: list[tuple[str, bool]], comparisons: int, levels: str) -> str:
    """`subject`, then which of `rows` ((text, shown after Holm)) are shown after the study's Holm correction
    over its `comparisons` at the `levels` named, and which are not: how a study's answer reads in the docs."""
    family = f"Holm over {comparisons} comparison{'s' if comparisons != 1 else ''}, at {levels}"
    shown = [text for text, holds in rows if holds]
    other = [text for text, holds in rows if not holds]
    if not shown:
        return f"{subject}: not shown after {family} ({'; '.join(other)})."
    return f"{subject}: shown after {family}: {'; '.join(shown)}" + (f"; not shown: {'; '.join(other)}." if other
                                                                      else ".")


def power_lines(plan: dict) -> list[str]:
    """The plan's power, as `glm53 experiment` prints it before the first run."""
    lines = []
    for name, level in (plan.get("power") or {}).items():
        mdd = level["mdd_in_sd"]
        lines.append(f"power, {name}: {level['n']} independent values ({level['test']} test): "
                     + ("cannot detect any difference at alpha " f"{level['alpha']}" if mdd is None else
                        f"detects {mdd:.2f} standard deviations of the paired differences with "
                        f"{round(100 * level['power'])}% power"))
    return lines


def prepare_study(out: Path, plan: dict, force: bool) -> bool:
    """Create or reopen `out` for `plan`. Returns True when resuming a study with the same design."""
    plan["plan_sha256"] = plan_hash(plan)
    plan_path = out / PLAN_FILE
    if plan_path.exists():
        existing = read_json(plan_path)
        if existing.get("plan_sha256") == plan["plan_sha256"]:
            return True
        if not force:
            changed = sorted(k for k in ("study", "design", "units", "analysis") if existing.get(k) != plan.get(k))
            raise FileExistsError(f"{out} holds a study planned with a different {', '.join(changed) or 'design'}; "
                                  "rerun with the same flags to resume, or add --force to replace it")
        # everything derived from the old design goes with it: receipts, RL work and selection, analysis
        for name in (RUNS_DIR, WORK_DIR):
            shutil.rmtree(out / name, ignore_errors=True)
        for name in DERIVED_FILES:
            (out / name).unlink(missing_ok=True)
        for chart in out.glob("*.png"):
            chart.unlink()
    elif holds_a_run(out) and not force:
        raise FileExistsError(f"{out} exists and is not a study directory (no {PLAN_FILE}); "
                              "choose a new --output or add --force")
    out.mkdir(parents=True, exist_ok=True)
    write_json(plan_path, plan)
    return False


STATUSES = ("running", "complete", "incomplete", "interrupted")


def mark_status(out: Path, plan: dict, status: str, resume_command: str | None = None) -> None:
    """Record in plan.json how the last session ended (outside the hashed design): running, complete,
    incomplete (this shard's runs are done, others are not) or interrupted (with the command that
    resumes it)."""
    if status not in STATUSES:
        raise ValueError(f"unknown study status {status!r}")
    plan["status"] = status
    plan["status_utc"] = utc_now()
    plan.pop("resume_command", None)
    if resume_command:
        plan["resume_command"] = resume_command
    write_json(Path(out) / PLAN_FILE, plan)


@contextlib.contextmanager
def study_session(out: Path, command: str, *, tensorboard: str | None = None, wandb: str | None = None,
                  plan_only: bool = False):
    """The study directory locked for this process (a second writer is refused), and its plan.json
    marked running / complete / incomplete (this shard's part done) / interrupted by `mark(status)`;
    yields (state, mark): the caller puts the plan in state["plan"]. `command` resumes the study."""
    from glm53_flash.train.engine import check_live_logging
    from glm53_flash.train.rundir import RunLock, interruptible

    check_live_logging(tensorboard, wandb)
    state: dict = {}
    with RunLock(out):
        def mark(status: str) -> None:
            if "plan" in state and not plan_only:
                mark_status(out, state["plan"], status, resume_command=command if status == "interrupted" else None)

        with interruptible(lambda: mark("interrupted"), command + "   (the same command resumes the study)"):
            yield state, mark


def receipt_path(out: Path, key: str) -> Path:
    return out / RUNS_DIR / f"{key}.json"


def pending_units(out: Path, units: list[dict], plan_sha256: str | None = None) -> list[dict]:
    """Units without a receipt. A receipt from another plan (e.g. merged in by hand) is an error, not
    a finished run: it would be skipped here but ignored by the analysis."""
    pending = []
    for unit in units:
        path = receipt_path(out, unit["key"])
        if not path.exists():
            pending.append(unit)
        elif plan_sha256 is not None and read_json(path).get("plan_sha256") != plan_sha256:
            raise ValueError(f"{path} belongs to a different plan; remove it (or rerun with --force)")
    return pending


def _run_unit(function: Callable[[dict], dict], unit: dict) -> dict:
    result = function(unit)
    result["peak_rss_bytes"] = peak_rss_bytes()
    return result


def run_units(out: Path, plan: dict, units: list[dict], function: Callable[[dict], dict], *,
              workers: int = 1, progress: bool = True, argv: list[str] | None = None, device: str = "cpu",
              opening=None) -> int:
    """Run every unit without a receipt; returns how many ran. `function` must be a module-level function.
    Units on a sealed split run under `opening` (ledger.require_open): it travels with the unit to the
    worker, and each such receipt is recorded in the ledger once written."""
    todo = pending_units(out, units, plan["plan_sha256"])
    if not todo:
        return 0
    if opening is not None:
        todo = [u | {"opening": opening} if u.get("split") == opening.split else u for u in todo]
    # the code that runs is the code loaded now: record its commit once, not at each (later) write
    started_with = provenance(argv, device=device)
    from glm53_flash.core.progress import progress_bar

    bar = progress_bar(len(units), quiet=not progress, initial=len(units) - len(todo), desc=plan["study"],
                       unit="run")

    def finish(unit: dict, result: dict) -> None:
        result.update(unit={k: v for k, v in unit.items() if k not in ("design", "device", "logging", "opening")},
                      plan_sha256=plan["plan_sha256"],
                      provenance=started_with | {"finished_utc": utc_now()})
        write_json(receipt_path(out, unit["key"]), result)
        if unit.get("opening") is not None:
            unit["opening"].record(receipt_path(out, unit["key"]))
        if bar is not None:
            bar.update(1)
            bar.set_postfix_str(unit["key"])

    try:
        if workers <= 1:
            for unit in todo:
                finish(unit, _run_unit(function, unit))
        else:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor, as_completed

            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
                futures = {pool.submit(_run_unit, function, unit): unit for unit in todo}
                try:
                    for future in as_completed(futures):
                        finish(futures[future], future.result())
                except BaseException:
                    for future in futures:
                        future.cancel()
                    # Interrupted (Ctrl-C, SIGTERM) or failed: stop the runs in flight too, rather than
                    # waiting for them; their results would be discarded. (ProcessPoolExecutor has
                    # no public way to do this before Python 3.14's terminate_workers.)
                    for process in list((getattr(pool, "_processes", None) or {}).values()):
                        process.terminate()
                    raise
    finally:
        if bar is not None:
            bar.close()
    return len(todo)


def load_receipts(out: Path, plan_sha256: str | None = None) -> list[dict]:
    """The finished runs' receipts (only those of `plan_sha256` when given)."""
    directory = Path(out) / RUNS_DIR
    if not directory.is_dir():
        return []
    receipts = [read_json(path) for path in sorted(directory.glob("*.json"))]
    return [r for r in receipts if plan_sha256 is None or r.get("plan_sha256") == plan_sha256]


__all__ = [
    "DERIVED_FILES",
    "DeckEntry",
    "MakeTarget",
    "Study",
    "after_holm",
    "after_holm_sentence",
    "PLAN_FILE",
    "WORK_DIR",
    "RUNS_DIR",
    "SELECTION_FILE",
    "load_receipts",
    "pending_units",
    "level_power",
    "plan_hash",
    "power_lines",
    "prepare_study",
    "receipt_path",
    "run_units",
]
