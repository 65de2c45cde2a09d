"""Paired comparison of two evaluation receipts on the same tasks (replaces the original's analysers).

The unit of analysis is what varies independently (`episode_unit`): on the families suite a distinct
function, its family (a family's two descriptions compute the same function, so 32 holdout tasks of one
family are one unit), on the compositions suite a structure group (behaviours of one group are
correlated). Tasks that share a unit are averaged into one paired difference, and the exact sign-flip
test over units is the comparison's test (`units`). The task-level
numbers stay beside it, labelled as pooled over tasks: solved before/after (greedy, or any-of-k when
sampled) gives gains, losses and the exact McNemar p, which treats tasks as independent; the per-task
pass rate gives a task-bootstrap CI of the rate difference. Overall and per family (Holm-adjusted
across families), as JSON and a markdown table. Works on the original's receipts too.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from glm53_flash.core.receipts import read_json

from glm53_flash.core.stats import bootstrap_ci, format_p, holm, mcnemar_exact, paired_bootstrap_ci, paired_counts, sign_flip_floor, sign_flip_p
from glm53_flash.tasks import FAMILY_NAMES, compositions, family_order, parse_families, suite_of

DEFAULT_RESAMPLES = 10_000
DEFAULT_SEED = 20260826  # the original analyser's bootstrap seed


def load_receipt(path: str | Path) -> dict:
    """An evaluation receipt from disk, with a one-line error for a missing or malformed file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"receipt {path} does not exist")
    receipt = read_json(path, corrupt="receipt {path} is not valid JSON")
    if not isinstance(receipt, dict) or not isinstance(receipt.get("episodes"), list) or not receipt["episodes"]:
        raise ValueError(f"receipt {path} has no episodes; is it an evaluation receipt?")
    return receipt


def receipt_kind(receipt: dict) -> str:
    """'greedy' (one completion per task) or 'sampled' (a list of samples per task)."""
    first = receipt["episodes"][0]
    if "samples" in first:
        return "sampled"
    if "evaluation" in first:
        return "greedy"
    raise ValueError("episodes have neither 'evaluation' (greedy) nor 'samples' (sampled)")


def episode_unit(episode: dict) -> str:
    """The unit an episode's task belongs to, derived from the suite (whatever unit the receipt recorded):
    on the families suite its family, the function both of its descriptions compute; on the compositions
    suite its behaviour's structure group (compositions.structure_group); otherwise the recorded `unit`,
    else the task id."""
    split = episode["task_id"].partition("-")[0]
    if split in compositions.TASK_SPLITS:
        return compositions.structure_group(episode["task_id"])
    try:
        families_suite = suite_of(split) == "families"
    except ValueError:
        families_suite = False
    if families_suite and episode.get("family") in FAMILY_NAMES:
        return episode["family"]
    return episode.get("unit") or episode["task_id"]


def task_outcomes(receipt: dict, families: Sequence[str] | None = None) -> dict[str, dict]:
    """task_id -> {family, unit, prompt, passed (count), n (samples)} for the chosen families."""
    kind = receipt_kind(receipt)
    outcomes: dict[str, dict] = {}
    for episode in receipt["episodes"]:
        if families is not None and episode["family"] not in families:
            continue
        if kind == "greedy":
            passed, n = int(bool(episode["evaluation"]["passed"])), 1
        else:
            passed = sum(bool(s["evaluation"]["passed"]) for s in episode["samples"])
            n = len(episode["samples"])
        task_id = episode["task_id"]
        if task_id in outcomes:
            raise ValueError(f"task {task_id} appears twice in one receipt")
        outcomes[task_id] = {"family": episode["family"], "unit": episode_unit(episode),
                             "prompt": episode.get("prompt"), "passed": passed, "n": n}
    return outcomes


def _describe(ids: set[str], limit: int = 3) -> str:
    shown = sorted(ids)[:limit]
    return ", ".join(shown) + (f", ... ({len(ids)} in all)" if len(ids) > limit else "")


def _check_pairing(before: dict, after: dict, b: dict[str, dict], a: dict[str, dict]) -> None:
    kind_b, kind_a = receipt_kind(before), receipt_kind(after)
    if kind_b != kind_a:
        raise ValueError(f"cannot compare a {kind_b} receipt with a {kind_a} one")
    split_b, split_a = before.get("split"), after.get("split")
    if split_b != split_a:
        raise ValueError(f"receipts are on different splits: {split_b!r} vs {split_a!r}")
    only_b, only_a = set(b) - set(a), set(a) - set(b)
    if only_b or only_a:
        parts = [f"{len(only_b)} only in BEFORE ({_describe(only_b)})" if only_b else "",
                 f"{len(only_a)} only in AFTER ({_describe(only_a)})" if only_a else ""]
        raise ValueError("receipts cover different tasks: " + "; ".join(p for p in parts if p))
    if not b:
        raise ValueError("no tasks to compare (check --families)")
    for task_id in sorted(b):
        if b[task_id]["prompt"] is not None and a[task_id]["prompt"] is not None \
                and b[task_id]["prompt"] != a[task_id]["prompt"]:
            raise ValueError(f"task {task_id} has different prompts in the two receipts")
        if b[task_id]["n"] != a[task_id]["n"]:
            raise ValueError(f"task {task_id} has {b[task_id]['n']} samples in BEFORE and {a[task_id]['n']} in "
                             f"AFTER; compare runs with the same samples per task")


def unit_rates(task_ids: list[str], outcomes: dict) -> dict[str, float]:
    """unit -> the fraction of passing samples over the unit's tasks."""
    passed: dict[str, int] = {}
    trials: dict[str, int] = {}
    for task_id in task_ids:
        unit = outcomes[task_id]["unit"]
        passed[unit] = passed.get(unit, 0) + outcomes[task_id]["passed"]
        trials[unit] = trials.get(unit, 0) + outcomes[task_id]["n"]
    return {unit: passed[unit] / trials[unit] for unit in sorted(passed)}


def unit_comparison(task_ids: list[str], b: dict, a: dict, level: float, resamples: int, seed: int) -> dict:
    """The paired comparison at the unit that varies: one difference per unit (its tasks' pass rate
    after minus before), the exact sign-flip test over units and a bootstrap CI over units."""
    before, after = unit_rates(task_ids, b), unit_rates(task_ids, a)
    differences = [after[u] - before[u] for u in before]
    low, high = bootstrap_ci(differences, level=level, resamples=resamples, seed=seed)
    return {"units": len(differences), "tasks": len(task_ids),
            "better": sum(d > 0 for d in differences), "worse": sum(d < 0 for d in differences),
            "same": sum(d == 0 for d in differences),
            "rate_difference": sum(differences) / len(differences), "rate_difference_ci": [low, high],
            "sign_flip_p": sign_flip_p(differences, seed=seed), "sign_flip_floor": sign_flip_floor(len(differences)),
            "test": "exact sign-flip over units (each unit's pass-rate difference over its tasks)"}


def _row(task_ids: list[str], b: dict, a: dict, level: float, resamples: int, seed: int) -> dict:
    """Paired statistics over the given tasks: at the unit level (`units`) and pooled over tasks."""
    solved_b = [b[t]["passed"] > 0 for t in task_ids]
    solved_a = [a[t]["passed"] > 0 for t in task_ids]
    rate_b = [b[t]["passed"] / b[t]["n"] for t in task_ids]
    rate_a = [a[t]["passed"] / a[t]["n"] for t in task_ids]
    counts = paired_counts(solved_b, solved_a)
    low, high = paired_bootstrap_ci(rate_b, rate_a, level=level, resamples=resamples, seed=seed)
    n = len(task_ids)
    return {
        "tasks": n, "before_solved": sum(solved_b), "after_solved": sum(solved_a),
        "gains": counts["gains"], "losses": counts["losses"], "both": counts["both"], "neither": counts["neither"],
        "mcnemar_p": mcnemar_exact(counts["gains"], counts["losses"]),
        "before_exact": sum(b[t]["passed"] for t in task_ids), "after_exact": sum(a[t]["passed"] for t in task_ids),
        "rollouts": sum(b[t]["n"] for t in task_ids),
        "before_rate": sum(rate_b) / n, "after_rate": sum(rate_a) / n,
        "rate_difference": (sum(rate_a) - sum(rate_b)) / n, "rate_difference_ci": [low, high],
        "units": unit_comparison(task_ids, b, a, level, resamples, seed),
    }


def compare_receipts(
    before: dict,
    after: dict,
    *,
    families: Sequence[str] | None = None,
    level: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    labels: tuple[str, str] = ("before", "after"),
) -> dict:
    """Paired per-task comparison; raises ValueError when the receipts do not cover the same tasks.

    `solved` is pass/fail per task (greedy), or any of the k samples passed (sampled); the rate is the
    per-task fraction of passing samples (= solved for greedy). The bootstrap resamples tasks.
    """
    if families is not None:
        families = parse_families(",".join(families), _suite(before))
    b, a = task_outcomes(before, families), task_outcomes(after, families)
    _check_pairing(before, after, b, a)
    by_family_ids: dict[str, list[str]] = {}
    for task_id in sorted(b):
        by_family_ids.setdefault(b[task_id]["family"], []).append(task_id)
    if families is not None:
        missing = [f for f in families if f not in by_family_ids]
        if missing:
            raise ValueError(f"families not in the receipts: {', '.join(missing)}")
    ordered = family_order(by_family_ids)
    rows = {f: _row(by_family_ids[f], b, a, level, resamples, seed) for f in ordered}
    for family, adjusted in zip(ordered, holm([rows[f]["mcnemar_p"] for f in ordered])):
        rows[family]["mcnemar_p_holm"] = adjusted
    return {
        "kind": receipt_kind(before), "split": before.get("split"), "tasks": len(b),
        "samples_per_task": next(iter(b.values()))["n"], "families": ordered,
        "before": _side(before, labels[0]), "after": _side(after, labels[1]),
        "overall": _row(sorted(b), b, a, level, resamples, seed), "by_family": rows,
        "settings": {"level": level, "resamples": resamples, "seed": seed,
                     "solved": "pass (greedy) or any of k samples passed (sampled)",
                     "rate": "per-task fraction of passing samples", "ci": "percentile bootstrap over tasks",
                     "family_p_adjustment": "holm",
                     "unit": "what varies independently (a distinct function on the families suite, a structure "
                             "group on the compositions suite): the test is the exact sign-flip over units "
                             "(`units`); McNemar and the task bootstrap pool tasks and treat them as independent"},
    }


def _suite(receipt: dict) -> str:
    try:
        return suite_of(receipt.get("split") or "dev")
    except ValueError:
        return "families"


def _side(receipt: dict, label: str) -> dict:
    return {"label": label, "checkpoint": receipt.get("checkpoint"),
            "checkpoint_sha256": receipt.get("checkpoint_sha256"), "inference": receipt.get("inference")}


def format_markdown(result: dict) -> str:
    """The comparison as a markdown section: what was compared, then one row per family and overall,
    the unit-level test first, then the numbers pooled over tasks."""
    sampled = result["kind"] == "sampled"
    k = result["samples_per_task"]
    solved = f"solved@{k}" if sampled else "solved"
    level = round(100 * result["settings"]["level"])
    units = result["overall"]["units"]["units"]
    lines = [
        f"## {result['before']['label']} -> {result['after']['label']}",
        "",
        f"{result['kind']} receipts on split `{result['split']}`, {result['tasks']} paired tasks in {units} units "
        f"(distinct functions on the families suite, structure groups on the compositions suite)"
        + (f", {k} samples each" if sampled else "") + ".",
        "",
        f"| family | units | units better / worse | sign-flip p (units) | rate diff (pts, units) | {level}% CI (unit "
        f"bootstrap) | tasks | {solved} before | {solved} after | gains | losses | McNemar p (tasks pooled) | Holm p | "
        + ("exact before | exact after | " if sampled else "") + "",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if sampled else ""),
    ]
    rows = [(name, row, format_p(row["mcnemar_p_holm"])) for name, row in result["by_family"].items()]
    rows.append(("**all**", result["overall"], "-"))
    for name, row, holm_p in rows:
        unit = row["units"]
        low, high = unit["rate_difference_ci"]
        cells = [name, str(unit["units"]), f"{unit['better']} / {unit['worse']}", format_p(unit["sign_flip_p"]),
                 f"{100 * unit['rate_difference']:+.1f}", f"[{100 * low:+.1f}, {100 * high:+.1f}]",
                 str(row["tasks"]), str(row["before_solved"]), str(row["after_solved"]), str(row["gains"]),
                 str(row["losses"]), format_p(row["mcnemar_p"]), holm_p]
        if sampled:
            cells += [f"{row['before_exact']}/{row['rollouts']}", f"{row['after_exact']}/{row['rollouts']}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "A unit is what varies independently (tasks that share one are averaged into one difference); the sign-flip "
              "test over units is the comparison's test (its smallest possible p is 2/2^units). Gains/losses: "
              "tasks that went fail -> pass / pass -> fail" + (" (any of the samples passing)" if sampled else "")
              + "; McNemar pools tasks as if they were independent, which they are not within a unit."]
    return "\n".join(lines) + "\n"


__all__ = ["compare_receipts", "format_markdown", "load_receipt", "receipt_kind", "task_outcomes"]
