"""`glm53 analyze DIR`: summary.json, REPORT.md and charts built only from a study's plan and receipts.

The study named in plan.json (experiments/registry.py) computes its summary, its REPORT.md and its charts
(`Study.analyze`) and, with --rerun-of, its comparison with the first study (`Study.compare_rerun`); this
module adds what every study's report has (code versions, the plan's stated time beside the time taken,
an incomplete study said as such), writes the files, and renders the docs' answers of the committed studies.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

from glm53_flash.core.receipts import provenance, read_json, write_json, write_text
from glm53_flash.experiments.paired import wall_minutes
from glm53_flash.experiments.registry import STUDIES, rerunnable, study_of
from glm53_flash.experiments.study import PLAN_FILE, load_receipts

SUMMARY_FILE = "summary.json"
REPORT_FILE = "REPORT.md"
OUTPUT_FILES = (SUMMARY_FILE, REPORT_FILE)


def analyze(directory: str | Path, force: bool = False, argv: list[str] | None = None,
            rerun_of: str | Path | None = None) -> dict:
    """A study directory's summary.json and REPORT.md from its receipts; with `rerun_of`, the directory is
    the rerun of the study there (disjoint pretraining seeds) and both are compared."""
    out = Path(directory)
    plan_path = out / PLAN_FILE
    if not plan_path.is_file():
        raise FileNotFoundError(f"{out} has no {PLAN_FILE}: not a study directory written by `glm53 experiment`")
    plan = read_json(plan_path)
    try:
        study = study_of(plan)
    except ValueError as error:
        raise ValueError(f"{plan_path}: {error}") from None
    if rerun_of is not None and not study.rerunnable:
        raise ValueError(f"--rerun-of compares {', '.join(f'`{name}`' for name in rerunnable())} studies; {out} "
                         f"is a {plan.get('study')!r} study")
    existing = [name for name in OUTPUT_FILES if (out / name).exists()]
    if existing and not force:
        raise FileExistsError(f"{out} already has {', '.join(existing)}; add --force to rebuild them")
    receipts = [r for r in load_receipts(out) if r.get("plan_sha256") == plan["plan_sha256"]]
    if not receipts:
        raise ValueError(f"{out} has no finished runs of this plan yet; run `glm53 experiment {plan['study']}` first")
    if rerun_of is not None:  # refused before anything is written when the two are not a study and its rerun
        from glm53_flash.experiments import reruns

        first_plan, first_receipts = reruns.load(Path(rerun_of))
        comparison = study.compare_rerun(first_plan, first_receipts, plan, receipts)
    summary, lines, charts = study.analyze(out, plan, receipts)
    if rerun_of is not None:
        summary["rerun"] = comparison
        lines += study.rerun_report_lines(comparison, str(rerun_of))
    summary["complete"] = len(receipts) == len(plan["units"])
    versions: dict[str, int] = {}
    for receipt in receipts:
        commit = receipt.get("provenance", {}).get("git_commit") or "unknown"
        versions[commit] = versions.get(commit, 0) + 1
    summary["code_versions"] = versions
    notes = [f"Code: {', '.join(f'{count} runs from `{commit[:12]}{commit[40:]}`' for commit, count in versions.items())}"
             + (" (more than one version: check that the differences do not touch the study)" if len(versions) > 1
                else "") + ".", ""]
    summary["time"] = time_record(plan, receipts)
    notes += time_lines(summary["time"])
    if not summary["complete"]:
        notes = [f"**INCOMPLETE: {len(receipts)} of {len(plan['units'])} planned runs; every answer below may "
                 "change when the rest finish.**", ""] + notes
    lines = lines[:2] + notes + lines[2:]
    summary["charts"] = charts
    summary["provenance"] = provenance(argv)
    summary = json.loads(json.dumps(summary, allow_nan=False, default=_json_default))
    write_json(out / SUMMARY_FILE, summary)
    write_text(out / REPORT_FILE, "\n".join(lines))
    return summary


def shown(summary: dict) -> dict:
    """What `glm53 analyze` prints of a summary: the study, its runs, its answers and, for a rerun, whether
    every row holds in both studies (the study's own verdicts)."""
    printed = {"study": summary["study"], "runs": summary["runs"], "answers": summary["answers"]}
    if "rerun" in summary:
        printed |= STUDIES[summary["study"]].rerun_verdicts(summary["rerun"])
    return printed


def time_record(plan: dict, receipts: list[dict]) -> dict:
    """What the plan said the study would take on this machine, before the first run, beside what it took:
    the plan's estimate; the runs' own seconds summed and shared over the plan's workers (what the estimate
    predicts: a study resumed in several sessions pays no pause here); and the wall time from the first
    run's start to the last one's end (pauses included). So an estimate that misleads shows in the report
    it belongs to."""
    estimate = plan.get("estimate") or {}
    stated, workers = estimate.get("expected_minutes"), estimate.get("workers") or 1
    seconds = [r["elapsed_seconds"] for r in receipts if "elapsed_seconds" in r]
    work = round(sum(seconds) / workers / 60, 1) if seconds else None
    return {"stated_minutes": stated, "workers": workers, "run_minutes_per_worker": work,
            "wall_minutes": wall_minutes(receipts),
            "taken_over_stated": round(work / stated, 2) if stated and work is not None else None}


STUDY_TIMES_FILE = "study-times.json"


def study_times(results: Path) -> dict:
    """Every committed study's time_record (a directory of `results` with plan.json and runs/), as a table:
    what docs/STUDIES.md shows (results/study-times.json; tests/test_results.py rebuilds it)."""
    rows = []
    for plan_path in sorted(Path(results).glob(f"*/{PLAN_FILE}")):
        plan = read_json(plan_path)
        record = time_record(plan, load_receipts(plan_path.parent, plan["plan_sha256"]))
        rows.append([plan_path.parent.name, f"{record['stated_minutes']}", str(record["workers"]),
                     f"{record['run_minutes_per_worker']}",
                     "n/a" if record["taken_over_stated"] is None else f"{record['taken_over_stated']}"])
    return {"headline_table": {"columns": ["study", "stated (min)", "workers", "taken per worker (min)",
                                           "taken / stated"], "rows": rows}}


def time_lines(record: dict) -> list[str]:
    if record["stated_minutes"] is None or record["run_minutes_per_worker"] is None:
        return []
    ratio = "" if record["taken_over_stated"] is None else f" ({record['taken_over_stated']}x the statement)"
    wall = "" if record["wall_minutes"] is None else (f"; {record['wall_minutes']} min of wall time from the first "
                                                      "run's start to the last one's end, pauses included")
    return [f"Time: the plan stated {record['stated_minutes']} min with {record['workers']} worker(s) before the first "
            f"run; the runs took {record['run_minutes_per_worker']} min per worker{ratio}{wall}.", ""]


def study_answer(directory: Path) -> str:
    """A committed study's answer for the docs, rendered from its committed summary.json by its own study
    (`Study.answer`: what holds after its Holm correction at the levels it names), with whether every row
    holds in the first study when it is a rerun."""
    plan, summary = read_json(directory / PLAN_FILE), read_json(directory / SUMMARY_FILE)
    study = study_of(plan)
    sentence = study.answer(plan, summary)
    if "rerun" in summary:
        verdicts = study.rerun_verdicts(summary["rerun"])
        sentence += " Against the first study: " + "; ".join(f"{label}: {'yes' if holds else 'no'}"
                                                             for label, holds in verdicts.items()) + "."
    return sentence


def committed_studies(results: str | Path) -> list[Path]:
    """The study directories of `results` with a plan and a summary, by name."""
    return [plan.parent for plan in sorted(Path(results).glob(f"*/{PLAN_FILE}")) if (plan.parent / SUMMARY_FILE).is_file()]


def study_answers(results: str | Path) -> list[tuple[str, Path, str]]:
    """Every committed study's answer (`study_answer`): [(directory name, its REPORT.md, the sentence)], by name."""
    return [(directory.name, directory / REPORT_FILE, study_answer(directory)) for directory in committed_studies(results)]


def render_study_answers(root: Path) -> str:
    """The docs' block of every committed study's answer, one line each, linking its REPORT.md
    (the README's `study-answers`)."""
    root = Path(root)
    return "\n".join(f"- [{name}]({report.relative_to(root)}): {sentence}"
                     for name, report, sentence in study_answers(root / "results"))


def render_study_answer(root: Path, name: str) -> str:
    """One committed study's answer as docs/STUDIES.md shows it in the study's section, with the link to its
    REPORT.md (the block `study-answer-NAME`)."""
    directory = Path(root) / "results" / name
    if not (directory / SUMMARY_FILE).is_file():
        return f"`results/{name}/` has no {SUMMARY_FILE} yet (`glm53 analyze results/{name}`)."
    return f"**{name}** ([report](../results/{name}/{REPORT_FILE})): {study_answer(directory)}"


def study_answer_blocks(root: Path) -> dict:
    """The blocks `study-answer-NAME`, one per committed study directory of the checkout at `root`."""
    return {f"study-answer-{directory.name}": functools.partial(render_study_answer, name=directory.name)
            for directory in committed_studies(Path(root) / "results")}


def _json_default(value):
    import numpy as np

    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return None if math.isnan(value) else float(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


__all__ = ["OUTPUT_FILES", "REPORT_FILE", "STUDY_TIMES_FILE", "SUMMARY_FILE", "analyze", "committed_studies",
           "render_study_answer", "render_study_answers", "shown", "study_answer", "study_answer_blocks", "study_answers",
           "study_times", "time_lines", "time_record"]
