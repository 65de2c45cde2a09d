"""`glm53 analyze DIR`: summary.json, REPORT.md and charts built only from a study's plan and receipts.

Statistics (all from glm53_flash.core.stats): the unit of analysis is the training seed; each comparison
gets the mean paired difference, a seeded percentile bootstrap CI, an exact two-sided sign-flip
p-value, wins/ties/losses, Holm across the study's comparisons, and the minimum detectable effect at
the number of seeds run. Pass/fail metrics also get a pooled test over (seed, item) pairs, and the
RL study a per-seed exact McNemar. Every number in the report is formatted from these values.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from glm53_flash.core import stats
from glm53_flash.model.config import ORIGINAL_MODEL_SWITCHES
from glm53_flash.core.receipts import provenance, read_json, write_json, write_text
from glm53_flash.report import figures, study_charts
from glm53_flash.report.format import format_interval, format_p, format_signed
from glm53_flash.report.tables import markdown_table
from glm53_flash.experiments.study import PLAN_FILE, load_receipts

SUMMARY_FILE = "summary.json"
REPORT_FILE = "REPORT.md"
OUTPUT_FILES = (SUMMARY_FILE, REPORT_FILE)

MIN_SEEDS_FOR_CI = 8  # below this the percentile bootstrap is little more than [min, max]

# The percentile bootstrap over n seeds is known to under-cover at small n; the report says so.
BOOTSTRAP_NOTE = ("Bootstrap CIs resample seeds (percentile method). With n below about 20 they are too "
                  "narrow (coverage of a nominal 95% interval is closer to 90% at n = 10), so decisions use "
                  "the exact sign-flip test, and the CI only describes the size of an effect; below "
                  f"{MIN_SEEDS_FOR_CI} seeds no CI is shown, only the range of the per-seed differences. "
                  "MDE = minimum detectable effect at 80% power and alpha / (number of comparisons), normal "
                  "approximation (optimistic at small n). wins/ties/losses count seeds where right > / = / < left "
                  "(for a loss, lower is better).")


# --------------------------------------------------------------------------- shared statistics


def paired_comparison(left: dict, right: dict, *, resamples: int, seed: int, scale: float = 1.0,
                      family_size: int = 1) -> dict:
    """Compare right - left over the seeds both have; values are scaled (100 turns rates into points)."""
    seeds = sorted(set(left) & set(right))
    differences = [scale * (right[s] - left[s]) for s in seeds]
    result = {"seeds": seeds, "n": len(seeds), "differences": differences, "mean": None, "ci95": None,
              "sign_flip_p": None, "wins": sum(d > 0 for d in differences), "ties": sum(d == 0 for d in differences),
              "losses": sum(d < 0 for d in differences), "sd": None, "mde": None,
              "left_mean": None, "right_mean": None}
    if not seeds:
        return result
    result["left_mean"] = scale * float(np.mean([left[s] for s in seeds]))
    result["right_mean"] = scale * float(np.mean([right[s] for s in seeds]))
    result["mean"] = float(np.mean(differences))
    result["range"] = [float(min(differences)), float(max(differences))]
    if len(seeds) >= MIN_SEEDS_FOR_CI:
        result["ci95"] = list(stats.bootstrap_ci(differences, resamples=resamples, seed=seed))
    result["sign_flip_p"] = stats.sign_flip_p(differences, seed=seed)
    result["sign_flip_exact"] = sum(d != 0 for d in differences) <= 20  # beyond that sign_flip_p samples
    if len(seeds) >= 2:
        result["sd"] = float(np.std(differences, ddof=1))
        if result["sd"] > 0:  # at the first Holm step's level (alpha / m): the bar a difference must clear
            result["mde"] = stats.minimum_detectable_effect(len(seeds), result["sd"], alpha=0.05 / family_size)
    return result


def apply_holm(comparisons: list[dict], key: str = "sign_flip_p", out_key: str = "holm_p") -> None:
    tested = [c for c in comparisons if c.get(key) is not None]
    for comparison, adjusted in zip(tested, stats.holm([c[key] for c in tested])):
        comparison[out_key] = adjusted


def pooled_pair_test(pairs: list[tuple[float, float]], seed: int) -> dict:
    """Sign-flip over (seed, item) pairs: swapping the two conditions within each pair is the only
    exchangeability assumed, i.e. a permutation test stratified by seed and item. Items that share a
    structure or a task family are not independent, so treat this as supporting evidence."""
    differences = [b - a for a, b in pairs]
    if not differences:
        return {"pairs": 0, "p": None, "gains": 0, "losses": 0}
    return {"pairs": len(differences), "gains": sum(d > 0 for d in differences),
            "losses": sum(d < 0 for d in differences),
            "p": stats.sign_flip_p(differences, seed=seed, samples=20000) if any(differences) else 1.0}


def verdict(comparison: dict, alpha: float, unit: str, what: str = "") -> str:
    p = comparison.get("holm_p")
    if p is None:
        return "not testable (no paired seeds)"
    direction = "higher" if comparison["mean"] > 0 else "lower"
    if p <= alpha:
        subject = f"{comparison['right']}'s {what}" if what else comparison["right"]
        return f"yes: {subject} is {direction} by {abs(comparison['mean']):.1f} {unit} (Holm p {format_p(p)})"
    mde = comparison.get("mde")
    detail = f"; this design detects about {mde:.1f} {unit} with 80% power" if mde else ""
    interval = format_interval(comparison["ci95"], spread=comparison.get("range"))
    interval = f"CI {interval}" if comparison["ci95"] else interval
    return f"no reliable difference: {format_signed(comparison['mean'])} {unit}, {interval}, Holm p {format_p(p)}{detail}"


# --------------------------------------------------------------------------- pretraining-data study


# The original's recorded 200-update differences in points (seed-research §4.3, 10 paired seeds),
# shown beside ours for comparison; they are inputs, not results of this code.
ORIGINAL_DELTAS = {"diversity": 3.2, "order": 9.7, "curriculum": -0.6, "curriculum-vs-repeated": 2.6}

PERCENT_METRICS = {"target_byte_accuracy", "execution_accuracy", "free_run_exact", "teacher_forced_exact"}


def _evaluation_at(receipt: dict, step: int) -> dict | None:
    for evaluation in receipt["evaluations"]:
        if evaluation["step"] == step:
            return evaluation
    return None


def compute_pretraining(plan: dict, receipts: list[dict]) -> dict:
    """Every number of the pretraining-data study (no text): curves, comparisons, trajectories."""
    design, analysis = plan["design"], plan["analysis"]
    boot = analysis["bootstrap"]
    step, primary = analysis["primary_step"], analysis["primary_metric"]
    by_condition: dict[str, dict[int, dict]] = {}
    for receipt in receipts:
        by_condition.setdefault(receipt["condition"], {})[receipt["seed"]] = receipt

    # pairing check: every condition at a seed started from the same weights
    initial = {}
    unpaired = []
    for condition, runs in by_condition.items():
        for seed, receipt in runs.items():
            if initial.setdefault(seed, receipt["initial_weights_sha256"]) != receipt["initial_weights_sha256"]:
                unpaired.append(f"{condition}-seed-{seed}")

    def values(condition: str, metric: str, at: int) -> dict[int, float]:
        result = {}
        for seed, receipt in by_condition.get(condition, {}).items():
            evaluation = _evaluation_at(receipt, at)
            if evaluation is not None:
                result[seed] = evaluation["summary"][metric]
        return result

    conditions = [c for c in design["conditions"] if c in by_condition]
    curves = {}
    for metric in analysis["metrics"]:
        scale = 100.0 if metric in PERCENT_METRICS else 1.0
        curves[metric] = {}
        for condition in conditions:
            points = []
            for at in design["eval_at"]:
                vals = values(condition, metric, at)
                if not vals:
                    continue
                data = [scale * v for v in vals.values()]
                ci = (stats.bootstrap_ci(data, resamples=boot["resamples"], seed=boot["seed"])
                      if len(data) >= MIN_SEEDS_FOR_CI else None)
                points.append({"step": at, "n": len(data), "mean": float(np.mean(data)),
                               "ci95": list(ci) if ci else None})
            curves[metric][condition] = points

    comparisons = {}
    for metric in analysis["metrics"]:
        scale = 100.0 if metric in PERCENT_METRICS else 1.0
        rows = []
        for index, spec in enumerate(analysis["comparisons"]):
            row = dict(spec) | paired_comparison(values(spec["left"], metric, step), values(spec["right"], metric, step),
                                                 resamples=boot["resamples"], seed=boot["seed"] + index, scale=scale,
                                                 family_size=len(analysis["comparisons"]))
            if metric in PERCENT_METRICS - {"target_byte_accuracy"}:
                key = {"execution_accuracy": "execution_correct", "free_run_exact": "free_run_exact",
                       "teacher_forced_exact": "teacher_forced_exact"}[metric]
                pairs = []
                for seed in row["seeds"]:
                    left = _evaluation_at(by_condition[spec["left"]][seed], step)["examples"]
                    right = _evaluation_at(by_condition[spec["right"]][seed], step)["examples"]
                    pairs += [(float(a[key]), float(b[key])) for a, b in zip(left, right)]
                row["pooled_items"] = pooled_pair_test(pairs, seed=boot["seed"] + index)
            rows.append(row)
        apply_holm(rows)
        comparisons[metric] = rows

    # each comparison's difference at every evaluated step (descriptive, uncorrected)
    trajectory = {}
    for index, spec in enumerate(analysis["comparisons"]):
        points = []
        for at in design["eval_at"]:
            row = paired_comparison(values(spec["left"], primary, at), values(spec["right"], primary, at),
                                    resamples=boot["resamples"], seed=boot["seed"] + index, scale=100.0)
            if row["n"]:
                points.append({"step": at, "mean": row["mean"], "ci95": row["ci95"], "sign_flip_p": row["sign_flip_p"]})
        trajectory[spec["name"]] = points

    # per held-out structure, primary metric at the primary step (mean over seeds)
    per_structure: dict[str, dict[str, float]] = {}
    for condition in conditions:
        totals: dict[str, list[int]] = {}
        for receipt in by_condition[condition].values():
            evaluation = _evaluation_at(receipt, step)
            if evaluation is None:
                continue
            for example in evaluation["examples"]:
                entry = totals.setdefault(example["structure"], [0, 0])
                entry[0] += example["correct_tokens"]
                entry[1] += example["target_tokens"]
        for structure, (correct, total) in totals.items():
            per_structure.setdefault(structure, {})[condition] = 100.0 * correct / total

    final = [_evaluation_at(r, step) for r in receipts if _evaluation_at(r, step) is not None]
    correct_programs = sum(bool(x["execution_correct"]) for e in final for x in e["examples"])
    exact_programs = sum(bool(x["free_run_exact"]) for e in final for x in e["examples"])
    seeds_done = sorted({r["seed"] for r in receipts})
    summary = {
        "study": plan["study"], "plan_sha256": plan["plan_sha256"], "primary_metric": primary, "primary_step": step,
        "runs": len(receipts), "runs_planned": len(plan["units"]), "seeds_completed": seeds_done,
        "pairing_verified": not unpaired, "unpaired_runs": unpaired,
        "generations_at_primary_step": sum(len(e["examples"]) for e in final),
        "correct_generations_at_primary_step": int(correct_programs),
        "exact_generations_at_primary_step": int(exact_programs),
        "examples": _examples(by_condition, step),
        "untrained_byte_accuracy": sorted({round(_evaluation_at(r, 0)["summary"]["target_byte_accuracy"], 6)
                                          for r in receipts if _evaluation_at(r, 0)}),
        "seconds_per_run": float(np.mean([r["elapsed_seconds"] for r in receipts])) if receipts else None,
        "wall_minutes": wall_minutes(receipts),
        "curves": curves, "comparisons": comparisons, "trajectory": trajectory, "per_structure": per_structure,
    }
    return summary


def pretraining_answers(plan: dict, summary: dict) -> tuple[list[str], dict]:
    """The study's answers (sentences) and its headline table, formatted from the computed numbers."""
    analysis = plan["analysis"]
    alpha, step, primary = analysis["alpha"], summary["primary_step"], summary["primary_metric"]
    comparisons = summary["comparisons"]
    primary_rows = comparisons[primary]
    unit = "points"
    answers = []
    loss_rows = comparisons.get("target_loss", [])
    for index, row in enumerate(primary_rows):
        text = f"{row['question']} {verdict(row, alpha, unit, what='teacher-forced byte accuracy')}."
        if index < len(loss_rows) and loss_rows[index]["n"]:
            loss = loss_rows[index]
            text += (f" Target loss (lower is better): {format_signed(loss['mean'], 2)} nats, Holm p "
                     f"{format_p(loss.get('holm_p'))}.")
        answers.append(text)
    execution_rows = comparisons.get("execution_accuracy", [])
    if summary["generations_at_primary_step"] and summary["correct_generations_at_primary_step"] == 0:
        answers.append(f"Does any condition teach the model to write the held-out expressions? No: none of the "
                       f"{summary['generations_at_primary_step']} greedy generations at update {step} "
                       f"(every condition and seed) computes the right values, so the byte-accuracy gains are "
                       f"gains in predicting the expression's form, not in solving the task.")
    else:
        for row in execution_rows:
            answers.append(f"Execution accuracy, {row['name']}: {format_signed(row['mean'])} points "
                           f"(Holm p {format_p(row.get('holm_p'))}; {row['right']} {row['right_mean']:.1f}% vs "
                           f"{row['left']} {row['left_mean']:.1f}%)." if row["n"] else
                           f"Execution accuracy, {row['name']}: no paired seeds.")
    columns = ["Comparison", "Left", "Right", "Left %", "Right %", "Δ points", "95% CI", "sign-flip p",
               "Holm p", "wins/ties/losses", "exec Δ points", "original Δ (10 seeds)"]
    table_rows = []
    for row, execution in zip(primary_rows, execution_rows or [None] * len(primary_rows)):
        if not row["n"]:
            continue
        table_rows.append([
            row["name"], row["left"], row["right"], f"{row['left_mean']:.1f}", f"{row['right_mean']:.1f}",
            format_signed(row["mean"]), format_interval(row["ci95"]), format_p(row["sign_flip_p"]), format_p(row.get("holm_p")),
            f"{row['wins']}/{row['ties']}/{row['losses']}",
            format_signed(execution["mean"]) if execution and execution["n"] else "n/a",
            format_signed(ORIGINAL_DELTAS.get(row["name"])),
        ])
    return answers, {"columns": columns, "rows": table_rows}


def analyze_pretraining(out: Path, plan: dict, receipts: list[dict]) -> tuple[dict, list[str], dict]:
    summary = compute_pretraining(plan, receipts)
    answers, table = pretraining_answers(plan, summary)
    summary["headline_table"], summary["answers"] = table, answers
    charts = _pretraining_charts(out, summary, plan["design"])
    return summary, _pretraining_report(plan, summary, charts), charts


def _code(text: str) -> str:
    """Model output as inline code in a table cell: newlines and pipes shown, not obeyed."""
    return "`" + text.replace("\n", "\\n").replace("|", "\\|").replace("`", "'") + "`"


def wall_minutes(receipts: list[dict]) -> float | None:
    """From the first run's start to the last run's end: each receipt's write time minus its run time."""
    from datetime import datetime, timedelta

    spans = []
    for receipt in receipts:
        written = receipt.get("provenance", {}).get("finished_utc") or receipt.get("provenance", {}).get("created_utc")
        if written is None or "elapsed_seconds" not in receipt:
            return None
        end = datetime.fromisoformat(written)
        spans.append((end - timedelta(seconds=receipt["elapsed_seconds"]), end))
    if not spans:
        return None
    return round((max(e for _, e in spans) - min(s for s, _ in spans)).total_seconds() / 60, 1)


def _examples(by_condition: dict, step: int, count: int = 4) -> list[dict]:
    """The first held-out examples of the lowest seed at the primary step, for each condition."""
    rows = []
    for condition, runs in by_condition.items():
        evaluation = _evaluation_at(runs[min(runs)], step)
        for example in (evaluation["examples"] if evaluation else [])[:count]:
            rows.append({"condition": condition, "seed": min(runs), "target": example["target"],
                         "teacher_forced_argmax": example["teacher_forced_argmax"],
                         "generated": example["generated"], "execution_correct": example["execution_correct"]})
    return rows


def _pretraining_charts(out: Path, summary: dict, design: dict) -> dict[str, str]:
    charts = {}
    for key, name, draw in (("learning_curves", "learning-curves.png", study_charts.draw_learning_curves),
                            ("paired_differences", "paired-differences.png", study_charts.draw_paired_differences)):
        fig = draw(summary)
        if fig is not None:
            charts[key] = name
            figures.save_png(fig, out / name, dpi=100)
    return charts


def _pretraining_report(plan: dict, summary: dict, charts: dict) -> list[str]:
    design, analysis = plan["design"], plan["analysis"]
    n = len(summary["seeds_completed"])
    lines = [
        "# Pretraining data: diversity, order and curriculum",
        "",
        (f"Research miniature (`{design['preset']}`), {design['steps']} updates x batch {design['batch_size']}, "
        f"lr {design['learning_rate']}, {len(design['conditions'])} conditions x {n} paired seeds "
        f"({summary['runs']}/{summary['runs_planned']} runs done). Plan `{summary['plan_sha256'][:12]}` "
        f"(plan.json) was written before the first run. Metric: {analysis['primary_metric']} on the 32 held-out "
        f"structures at update {summary['primary_step']}; differences are right - left, paired by seed. "
        f"Wall time {summary['wall_minutes']} min ({summary['seconds_per_run']:.0f} s per run in one thread)."),
        "",
        f"Pairing verified (same initial weights per seed in every condition): {summary['pairing_verified']}.",
        "",
        "## Answers",
        "",
        *[f"- {answer}" for answer in summary["answers"]],
        "",
        "## Held-out target-byte accuracy (primary) and execution accuracy",
        "",
        *markdown_table(summary["headline_table"]["columns"], summary["headline_table"]["rows"]),
        "",
        f"Tests: {analysis['test']}; {analysis['multiplicity']}. {BOOTSTRAP_NOTE}",
        "",
    ]
    for chart in charts.values():
        lines += [f"![{chart}]({chart})", ""]
    lines += ["## Every metric at the final update", ""]
    for metric, rows in summary["comparisons"].items():
        unit = "points" if metric in PERCENT_METRICS else "nats"
        table = [[r["name"], format_signed(r["mean"], 2), format_interval(r["ci95"], 2), format_p(r["sign_flip_p"]),
                  format_p(r.get("holm_p")), f"{r['wins']}/{r['ties']}/{r['losses']}",
                  "n/a" if r["mde"] is None else f"{r['mde']:.2f}",
                  format_p(r["pooled_items"]["p"]) if "pooled_items" in r else "-"] for r in rows if r["n"]]
        lines += [f"### {metric} ({unit})", "",
                  *markdown_table(["Comparison", "Δ", "95% CI", "sign-flip p", "Holm p", "wins/ties/losses",
                           "MDE (80% power)", "pooled item p"], table), ""]
    lines += ["## Per held-out structure (accuracy %, mean over seeds)", ""]
    conditions = [c for c in design["conditions"] if any(c in v for v in summary["per_structure"].values())]
    structure_rows = [[s, *[f"{summary['per_structure'][s].get(c, float('nan')):.1f}" for c in conditions]]
                      for s in sorted(summary["per_structure"])]
    lines += [*markdown_table(["structure", *conditions], structure_rows), ""]
    lines += ["## What the model writes (lowest seed, first held-out structures)", "",
              *markdown_table(["condition", "target", "teacher-forced argmax", "greedy generation", "executes"],
                              [[e["condition"], _code(e["target"]), _code(e["teacher_forced_argmax"]),
                                _code(e["generated"]), "yes" if e["execution_correct"] else "no"]
                               for e in summary["examples"]]), ""]
    lines += ["## Limits", "",
              (f"- The untrained model scores {', '.join(f'{100 * v:.1f}%' for v in summary['untrained_byte_accuracy'])} "
              "byte accuracy: with tied embeddings it copies its input, and repeated characters such as `((` "
              "score. Byte accuracy is dominated by punctuation, which is why execution accuracy is also reported."),
              ("- The 8-structure condition uses one fixed subset (the first 8 of the pool); 'blocked' is the most "
              "extreme ordering; the curriculum has one switch point. One learning rate, one width."),
              "- The miniature has 3 layers, so it contains no sparse-attention layer.",
              *miniature_differences(design),
              ("- The pooled item test treats held-out items as exchangeable within a seed; items share structures "
              "across seeds, so it supports, but does not replace, the seed-level test."), ""]
    return lines


def miniature_differences(design: dict) -> list[str]:
    """What the plan's model shares with the original miniature and where it still differs."""
    model = design.get("model")
    if model is None:
        return ["- Positions: this plan predates the model config in plans, and its runs trained `research-mini` "
                "without RoPE in its linear layers: the model had no positional information at all, unlike the "
                "original miniature (RoPE before the feature map). A rerun with positions is a new plan."]
    lines = []
    if model.get("linear_rope") == ORIGINAL_MODEL_SWITCHES["linear_rope"]:
        lines.append("- Positions: RoPE before the feature map in the three linear layers, as in the original "
                     "miniature; with no sparse layer it is the model's only positional signal. What changed: "
                     "earlier runs of this study (plans without the model config) trained the preset without "
                     "it, so their model saw no positions at all.")
    differing = [f"{key} `{model.get(key)}` (the original: `{value}`)" for key, value in ORIGINAL_MODEL_SWITCHES.items()
                 if model.get(key) != value]
    if differing:
        lines.append("- Differences from the original miniature's model: " + "; ".join(differing) + ". The "
                     "original's hard-count balance term has no gradient, so it balances nothing.")
    lines.append("- Differences in the protocol: every condition is evaluated at several updates of one run "
                 "(the original evaluated before and after training only), 20 paired seeds instead of 10, and "
                 "execution accuracy and free-run exact match beside the original's teacher-forced metrics.")
    return lines


# --------------------------------------------------------------------------- rl-choices study


def _outcome_map(receipt: dict) -> dict[str, bool]:
    return {o["task_id"]: bool(o["passed"]) for o in receipt["evaluation"]["outcomes"]}


def _task_pairs(left: dict[int, dict], right: dict[int, dict]) -> list[tuple[float, float]]:
    pairs = []
    for seed in sorted(set(left) & set(right)):
        a, b = _outcome_map(left[seed]), _outcome_map(right[seed])
        if set(a) != set(b):
            raise ValueError(f"seed {seed}: the two arms were evaluated on different tasks")
        pairs += [(float(a[t]), float(b[t])) for t in sorted(a)]
    return pairs


def _task_differences(left: dict[int, dict], right: dict[int, dict]) -> dict[str, dict[str, float]]:
    """{seed: {task id: right's pass minus left's}} over the seeds both have."""
    out = {}
    for seed in sorted(set(left) & set(right)):
        a, b = _outcome_map(left[seed]), _outcome_map(right[seed])
        if set(a) != set(b):
            raise ValueError(f"seed {seed}: the two arms were evaluated on different tasks")
        out[str(seed)] = {t: float(b[t]) - float(a[t]) for t in sorted(a)}
    return out


def group_comparison(differences: dict, groups: dict, alpha: float, resamples: int, seed: int) -> dict:
    """A compositions comparison at the units that vary (`differences[seed][task]`): over structure groups
    (each the mean of its behaviours) and over seeds (stats.two_level_comparison, the primary), what each level
    could detect with the spread it measured, with seeds and groups both random at once
    (stats.crossed_comparison; None below two seeds), and over behaviours as a secondary view."""
    by_group = stats.group_means(differences, groups)
    result = stats.two_level_comparison(by_group, alpha=alpha, resamples=resamples, seed=seed)
    result["crossed"] = stats.crossed_comparison(by_group, alpha) if len(by_group) >= 2 else None
    result["detectable"] = stats.detectable_differences(by_group, alpha)
    behaviours = stats.two_level_comparison(differences, alpha=alpha, resamples=resamples, seed=seed)
    result["behaviours"] = {"mean": behaviours["mean_difference"], **behaviours["units"]}
    return result


def compute_rl_choices(out: Path, plan: dict, receipts: list[dict]) -> dict:
    """Every number of the rl-choices study (no text); `out` holds the study's selection.json. On the
    compositions suite every comparison is also made at the units that vary (`groups`: structure groups and
    training seeds, group_comparison), and that is the primary one: Holm over the screen's arms at the groups,
    the confirmation's result after Holm (one comparison) at groups and seeds, Holm over the two comparisons
    with the starting checkpoint."""
    design, analysis = plan["design"], plan["analysis"]
    boot = analysis["bootstrap"]
    alpha = analysis["alpha"]
    reference = {r["evaluation"]["split"]: r["evaluation"]["summary"] for r in receipts if r["phase"] == "reference"}
    reference_runs = {r["evaluation"]["split"]: r for r in receipts if r["phase"] == "reference"}
    compositions_suite = design.get("suite", "families") != "families"
    groups = None
    if compositions_suite:
        from glm53_flash.tasks.compositions import structure_groups

        groups = structure_groups({o["task_id"] for r in receipts for o in r["evaluation"].get("outcomes", [])})
    screen: dict[str, dict[int, dict]] = {}
    confirm: dict[str, dict[int, dict]] = {}
    for receipt in receipts:
        if receipt["phase"] == "screen":
            screen.setdefault(receipt["arm"], {})[receipt["seed"]] = receipt
        elif receipt["phase"] == "confirm":
            confirm.setdefault(receipt["role"], {})[receipt["seed"]] = receipt

    def rates(runs: dict[int, dict]) -> dict[int, float]:
        return {seed: r["evaluation"]["summary"]["pass_at_1"] for seed, r in runs.items()}

    arms = []
    for arm in design["arms"]:
        runs = screen.get(arm, {})
        if not runs:
            continue
        arms.append({
            "arm": arm, "settings": design["arm_settings"][arm], "seeds": sorted(runs),
            "pass_rates": [100.0 * rates(runs)[s] for s in sorted(runs)],
            "mean_pass_rate": 100.0 * float(np.mean(list(rates(runs).values()))),
            "solved": sum(r["evaluation"]["summary"]["tasks_solved"] for r in runs.values()),
            "tasks": sum(r["evaluation"]["summary"]["tasks_total"] for r in runs.values()),
            "updates": float(np.mean([r["training"]["updated_groups"] for r in runs.values()])),
            "exact_training_rollouts": float(np.mean([r["training"]["exact_training_rollouts"] for r in runs.values()])),
            "rollouts": runs[min(runs)]["training"]["rollouts"],
            "seconds": float(np.mean([r["elapsed_seconds"] for r in runs.values()])),
        })
    screen_rows = []
    baseline = screen.get("baseline", {})
    for index, arm in enumerate(a["arm"] for a in arms if a["arm"] != "baseline"):
        row = {"name": arm, "left": "baseline", "right": arm}
        row |= paired_comparison(rates(baseline), rates(screen[arm]), resamples=boot["resamples"],
                                 seed=boot["seed"] + index, scale=100.0)
        row["pooled_tasks"] = pooled_pair_test(_task_pairs(baseline, screen[arm]), seed=boot["seed"] + index)
        row["pooled_p"] = row["pooled_tasks"]["p"]
        if compositions_suite:
            row["groups"] = group_comparison(_task_differences(baseline, screen[arm]), groups, alpha,
                                             boot["resamples"], boot["seed"] + index)
            row["groups_p"] = row["groups"]["units"]["sign_flip_p"]
        screen_rows.append(row)
    apply_holm(screen_rows, key="groups_p" if compositions_suite else "pooled_p", out_key="holm_p")

    selection_path = out / "selection.json"
    selection = read_json(selection_path) if selection_path.exists() else None
    if selection is not None and selection.get("plan_sha256") != plan["plan_sha256"]:
        raise ValueError(f"{selection_path} was made for another plan; rerun `glm53 experiment rl-choices` to redo it")
    candidates = {r["arm"] for r in confirm.get("candidate", {}).values()}
    if len(candidates) > 1 or (selection and candidates and candidates != {selection["candidate"]}):
        raise ValueError(f"confirmation receipts train {sorted(candidates)} as the candidate but the selection names "
                         f"{selection and selection['candidate']}; the study directory is inconsistent")
    confirmation = None
    if confirm.get("baseline") and confirm.get("candidate"):
        base_runs, cand_runs = confirm["baseline"], confirm["candidate"]
        candidate = next(iter(cand_runs.values()))["arm"]
        row = {"name": f"{candidate} vs baseline", "left": "baseline", "right": candidate}
        row |= paired_comparison(rates(base_runs), rates(cand_runs), resamples=boot["resamples"], seed=boot["seed"],
                                 scale=100.0)
        row["holm_p"] = row["sign_flip_p"]  # one confirmatory comparison: nothing to correct
        row["pooled_tasks"] = pooled_pair_test(_task_pairs(base_runs, cand_runs), seed=boot["seed"])
        per_seed = []
        for seed in row["seeds"]:
            a, b = _outcome_map(base_runs[seed]), _outcome_map(cand_runs[seed])
            counts = stats.paired_counts([a[t] for t in sorted(a)], [b[t] for t in sorted(a)])
            per_seed.append({"seed": seed, "baseline_solved": sum(a.values()), "candidate_solved": sum(b.values()),
                             "tasks": len(a), "gains": counts["gains"], "losses": counts["losses"],
                             "mcnemar_p": stats.mcnemar_exact(counts["gains"], counts["losses"])})
        row["per_seed"] = per_seed
        row["candidate"] = candidate
        if compositions_suite:  # the primary test: groups and seeds, one comparison
            row["groups"] = group_comparison(_task_differences(base_runs, cand_runs), groups, alpha,
                                             boot["resamples"], boot["seed"])
            row["holm"] = stats.holm_verdicts([row["groups"]], alpha)[0]
            row["result"] = row["holm"]["verdict"]
            del row["holm_p"]
        confirmation = row

    # Does RL help at all? Each confirmation run against the starting checkpoint on the same split
    # (the checkpoint is one fixed value, so the sign-flip tests whether the runs' mean moved from it).
    versus_pretrained = []
    final_reference = reference.get(design["confirm_split"])
    if final_reference is not None:
        for index, role in enumerate(("baseline", "candidate")):
            runs = confirm.get(role, {})
            if not runs:
                continue
            arm = next(iter(runs.values()))["arm"]
            row = {"name": f"{arm} vs pretrained", "left": "pretrained", "right": arm}
            row |= paired_comparison({s: final_reference["pass_at_1"] for s in runs}, rates(runs),
                                     resamples=boot["resamples"], seed=boot["seed"] + 100 + index, scale=100.0)
            if compositions_suite:
                start = {s: reference_runs[design["confirm_split"]] for s in runs}
                row["groups"] = group_comparison(_task_differences(start, runs), groups, alpha, boot["resamples"],
                                                 boot["seed"] + 100 + index)
            versus_pretrained.append(row)
        if compositions_suite:
            for row, adjusted in zip(versus_pretrained, stats.holm_verdicts([r["groups"] for r in versus_pretrained],
                                                                            alpha)):
                row["holm"], row["result"] = adjusted, adjusted["verdict"]
        else:
            apply_holm(versus_pretrained)

    summary = {
        "study": plan["study"], "plan_sha256": plan["plan_sha256"], "checkpoint": design["checkpoint"],
        "checkpoint_sha256": design["checkpoint_sha256"], "runs": len(receipts), "runs_planned": len(plan["units"]),
        "wall_minutes": wall_minutes(receipts),
        "pretrained": {split: {"pass_rate": 100.0 * s["pass_at_1"], "solved": s["tasks_solved"],
                               "tasks": s["tasks_total"]} for split, s in reference.items()},
        "arms": arms, "screen_comparisons": screen_rows, "selection": selection, "confirmation": confirmation,
        "versus_pretrained": versus_pretrained,
    }
    if not compositions_suite:  # the units that vary: a family's tasks compute one function
        for split in (design["screen_split"], design["confirm_split"]):
            outcomes = next((r["evaluation"]["outcomes"] for r in receipts
                             if r["evaluation"]["split"] == split and r["evaluation"].get("outcomes")), [])
            if outcomes:
                summary.setdefault("units", {})[split] = {"tasks": len(outcomes),
                                                          "units": len({o["family"] for o in outcomes})}
    return summary


def _points(value: float) -> str:
    """A fraction of the pass rate as signed points: +1.7."""
    return format_signed(100 * value)


def _crossed_text(crossed: dict | None) -> str:
    if crossed is None:
        return "with one seed no test takes seeds and groups random at once"
    low, high = crossed["interval"]
    return (f"with RL seeds and structure groups both random p {format_p(crossed['t_test_p'])}, "
            f"{round(100 * (1 - crossed['alpha']))}% CI {_points(low)} to {_points(high)}")


def _detectable(detectable: dict) -> str:
    def points(value):
        return "nothing" if value is None else f"{100 * value:.1f} points"

    return (f"{points(detectable['units'])} over groups and {points(detectable['seeds'])} over RL seeds with "
            f"{round(100 * detectable['power'])}% power")


def compositions_rl_choices_answers(plan: dict, summary: dict) -> tuple[list[str], dict]:
    """The answers and headline table of an rl-choices study on the compositions suite: every comparison at
    structure groups and training (RL) seeds, from one pretrained checkpoint, its result stated only after the
    study's Holm correction at those levels; the pass rates describe, behaviours are a secondary view."""
    from glm53_flash.experiments.study import after_holm

    design, alpha = plan["design"], plan["analysis"]["alpha"]
    screen_rows, confirmation = summary["screen_comparisons"], summary["confirmation"]
    versus_pretrained = [v for v in summary["versus_pretrained"] if v["n"]]
    answers = []
    flagged = [r for r in screen_rows if r.get("holm_p") is not None and r["holm_p"] <= alpha]
    if screen_rows:
        best = max(screen_rows, key=lambda r: r["mean"])
        groups = best["groups"]
        answers.append(
            f"Screen ({design['screen_split']}, {best['n']} seed{'s' if best['n'] != 1 else ''} per arm from one "
            f"pretrained checkpoint; it selects, it does not decide): the best arm was {best['right']}, "
            f"{format_signed(best['mean'])} points of pass rate over the baseline ({_points(groups['mean_difference'])} "
            f"over {groups['units']['n']} structure groups, sign-flip p {format_p(groups['units']['sign_flip_p'])}, "
            f"Holm across {len(screen_rows)} arm{'s' if len(screen_rows) != 1 else ''} {format_p(best.get('holm_p'))})."
            + (f" After Holm across the arms the groups' test flags "
               + ", ".join(f"{r['right']} ({_points(r['groups']['mean_difference'])})" for r in flagged)
               + "; over the screen's few seeds of one checkpoint, only a confirmation on new seeds can back them."
               if flagged else ""))
    if confirmation is not None:
        groups = confirmation["groups"]
        seeds = groups["seeds"]
        answers.append(
            f"Confirmation on {confirmation['n']} fresh RL seeds from this one pretrained checkpoint and the "
            f"{design['confirm_split']} split (opened by no other step of this study): does {confirmation['candidate']} "
            f"differ from the baseline (two-sided)? Over {groups['units']['n']} structure groups (each the mean of its "
            f"behaviours) {_points(groups['mean_difference'])} points: "
            f"{after_holm(confirmation['result'], confirmation['holm']['comparisons'], 'groups and RL seeds')} "
            f"(groups p {format_p(confirmation['holm']['units'])}, RL seeds p {format_p(confirmation['holm']['seeds'])}; "
            f"with the spreads measured it detects {_detectable(groups['detectable'])}); "
            f"{_crossed_text(groups['crossed'])}. Pass rate {confirmation['left_mean']:.1f}% against "
            f"{confirmation['right_mean']:.1f}% ({format_signed(confirmation['mean'])} points, {confirmation['wins']} of "
            f"{confirmation['n']} seeds higher); over behaviours, a secondary view, "
            f"{_points(groups['behaviours']['mean'])} points (p {format_p(groups['behaviours']['sign_flip_p'])}).")
        shown = confirmation["result"] != "not shown"
        crossed = groups["crossed"]
        both_random = crossed is not None and crossed["t_test_p"] < alpha \
            and (crossed["mean"] > 0) == (groups["mean_difference"] > 0)
        untested = [r["right"] for r in flagged if r["right"] != confirmation["candidate"]]
        others = (f"the screen's other flags ({', '.join(untested)}) were not confirmed." if untested
                  else "no other arm was flagged.")
        direction = "beats the baseline" if confirmation["result"] == "better" else "is worse than the baseline"
        family = after_holm(confirmation["result"], confirmation["holm"]["comparisons"], "groups and RL seeds")
        if shown:
            answers.append(
                f"Answer: from this one pretrained checkpoint, {confirmation['candidate']} {direction} on fresh RL "
                f"seeds ({family})"
                + (f", and with RL seeds and structure groups both random (p {format_p(crossed['t_test_p'])})"
                   if both_random else
                   f", but not with RL seeds and structure groups both random (p "
                   f"{format_p(None if crossed is None else crossed['t_test_p'])})")
                + ("; the baseline's choice is the better one" if confirmation["result"] == "worse" else "")
                + "; it says nothing of other pretraining seeds' checkpoints; " + others)
        else:
            answers.append(f"Answer: from this one pretrained checkpoint, {confirmation['candidate']}"
                           + (" (fixed in advance)" if design.get("confirm_arm", "screen-winner") != "screen-winner"
                              else "") + f" is not shown to differ from the baseline on fresh RL seeds ({family})"
                           + (f"; {', '.join(untested)} (flagged by the screen) was never confirmed."
                              if untested else "."))
    for v in versus_pretrained:
        groups = v["groups"]
        answers.append(
            f"Does RL with this recipe beat the starting checkpoint on {design['confirm_split']}? {v['right']}: pass "
            f"rate {v['right_mean']:.1f}% against {v['left_mean']:.1f}% before RL ({format_signed(v['mean'])} points, "
            f"{v['wins']} of {v['n']} seeds higher); over {groups['units']['n']} structure groups "
            f"{_points(groups['mean_difference'])} points: "
            f"{after_holm(v['result'], v['holm']['comparisons'], 'groups and RL seeds')} (Holm p groups "
            f"{format_p(v['holm']['units'])}, RL seeds {format_p(v['holm']['seeds'])}); {_crossed_text(groups['crossed'])}.")
    columns = ["Phase", "Arm", "Baseline %", "Arm %", "Δ pass rate (points)", "Δ over groups (points)", "groups p",
               "RL seeds p", "Holm p (groups / RL seeds)", "RL seeds and groups random p", "wins/ties/losses",
               "seeds", "result"]

    def row_cells(phase, r, holm, result, left_label=None):
        groups = r["groups"]
        crossed = groups["crossed"]
        return [phase, r["right"], left_label or f"{r['left_mean']:.1f}", f"{r['right_mean']:.1f}",
                format_signed(r["mean"]), _points(groups["mean_difference"]), format_p(groups["units"]["sign_flip_p"]),
                format_p(groups["seeds"]["t_test_p"]), holm, format_p(None if crossed is None else crossed["t_test_p"]),
                f"{r['wins']}/{r['ties']}/{r['losses']}", r["n"], result]

    table_rows = [row_cells(f"screen ({design['screen_split']})", r, f"{format_p(r.get('holm_p'))} / -",
                            "flagged" if r in flagged else "-") for r in screen_rows if r["n"]]
    if confirmation is not None and confirmation["n"]:
        holm = confirmation["holm"]
        table_rows.append(row_cells(f"confirm ({design['confirm_split']})", confirmation,
                                    f"{format_p(holm['units'])} / {format_p(holm['seeds'])}", confirmation["result"]))
    for v in versus_pretrained:
        table_rows.append(row_cells(f"RL vs pretrained ({design['confirm_split']})", v,
                                    f"{format_p(v['holm']['units'])} / {format_p(v['holm']['seeds'])}", v["result"],
                                    f"{v['left_mean']:.1f} (pretrained)"))
    return answers, {"columns": columns, "rows": table_rows}


def rl_choices_answers(plan: dict, summary: dict) -> tuple[list[str], dict]:
    """The study's answers (sentences) and its headline table, formatted from the computed numbers."""
    if plan["design"].get("suite", "families") != "families":
        return compositions_rl_choices_answers(plan, summary)
    design, alpha = plan["design"], plan["analysis"]["alpha"]
    screen_rows, confirmation = summary["screen_comparisons"], summary["confirmation"]
    versus_pretrained = summary["versus_pretrained"]
    answers = []
    flagged = [r for r in screen_rows if r.get("holm_p") is not None and r["holm_p"] <= alpha]
    flag_list = ", ".join(f"{r['right']} ({format_signed(r['mean'])})" for r in flagged)
    if screen_rows:
        best = max(screen_rows, key=lambda r: r["mean"])
        answers.append(
            f"Screen ({design['screen_split']}, {best['n']} seed{'s' if best['n'] != 1 else ''} per arm; it selects, it "
            "does not decide): the best "
            f"arm was {best['right']}, {format_signed(best['mean'])} points over the baseline (seed-level sign-flip p "
            f"{format_p(best['sign_flip_p'])}; task-pooled p {format_p(best['pooled_p'])}, Holm across "
            f"{len(screen_rows)} arm{'s' if len(screen_rows) != 1 else ''} {format_p(best.get('holm_p'))})."
            + (f" Task-pooled tests flag {flag_list}; they condition on these particular runs, so only a "
               "confirmation on new seeds can back them." if flagged else ""))
    if confirmation is not None:
        answers.append(f"Confirmation on {confirmation['n']} fresh seeds and the {design['confirm_split']} split "
                       f"(opened by no other step of this study): does {confirmation['candidate']} differ from the "
                       f"baseline (two-sided)? {verdict(confirmation, alpha, 'points')}.")
        shown = confirmation.get("holm_p") is not None and confirmation["holm_p"] <= alpha
        untested = [r["right"] for r in flagged if r["right"] != confirmation["candidate"]]
        others = (f"the screen's other flags ({', '.join(untested)}) were not confirmed." if untested
                  else "no other arm was flagged.")
        if shown and confirmation["mean"] > 0:
            answers.append(f"Answer: {confirmation['candidate']} beats the baseline on fresh seeds; " + others)
        elif shown:  # a confirmed difference the other way: the baseline's choice is the better one
            answers.append(f"Answer: {confirmation['candidate']} is worse than the baseline on fresh seeds "
                           f"({format_signed(confirmation['mean'])} points): the baseline's choice is the better one; "
                           + others)
        elif design.get("confirm_arm", "screen-winner") != "screen-winner":
            answers.append(f"Answer: {confirmation['candidate']}, fixed in advance, was not shown to beat the baseline "
                           "on fresh seeds"
                           + (f"; {', '.join(untested)} (flagged by the screen) was never confirmed." if untested
                              else "."))
        else:
            answers.append(f"Answer: no RL choice was shown to beat the baseline. The screen's "
                           f"{confirmation['candidate']} signal did not replicate on fresh seeds"
                           + (f", and {', '.join(untested)} (flagged by the screen) was never confirmed." if untested
                              else "."))
    for v in versus_pretrained:
        if v["n"]:
            answers.append(f"Does RL with this recipe beat the starting checkpoint on {design['confirm_split']}? "
                           f"{v['right']}: {v['right_mean']:.1f}% vs {v['left_mean']:.1f}% before RL, "
                           f"{format_signed(v['mean'])} points; {v['wins']} of {v['n']} seeds higher, {v['losses']} lower "
                           f"(sign test against the fixed checkpoint: p {format_p(v['sign_flip_p'])}, "
                           f"Holm p {format_p(v.get('holm_p'))}).")
    columns = ["Phase", "Arm", "Baseline %", "Arm %", "Δ points", "95% CI (or range)", "seed sign-flip p",
               "task-pooled p", "Holm p", "wins/ties/losses", "seeds"]

    def row_cells(phase, r, pooled, left_label=None):
        return [phase, r["right"], left_label or f"{r['left_mean']:.1f}", f"{r['right_mean']:.1f}",
                format_signed(r["mean"]), format_interval(r["ci95"], spread=r.get("range")), format_p(r["sign_flip_p"]),
                format_p(pooled), format_p(r.get("holm_p")), f"{r['wins']}/{r['ties']}/{r['losses']}", r["n"]]

    table_rows = [row_cells(f"screen ({design['screen_split']})", r, r["pooled_p"]) for r in screen_rows if r["n"]]
    if confirmation is not None and confirmation["n"]:
        table_rows.append(row_cells(f"confirm ({design['confirm_split']})", confirmation,
                                    confirmation["pooled_tasks"]["p"]))
    for v in versus_pretrained:
        if v["n"]:
            table_rows.append(row_cells(f"RL vs pretrained ({design['confirm_split']})", v, None,
                                        f"{v['left_mean']:.1f} (pretrained)"))
    return answers, {"columns": columns, "rows": table_rows}


def analyze_rl_choices(out: Path, plan: dict, receipts: list[dict]) -> tuple[dict, list[str], dict]:
    summary = compute_rl_choices(out, plan, receipts)
    answers, table = rl_choices_answers(plan, summary)
    summary["headline_table"], summary["answers"] = table, answers
    charts = _rl_charts(out, summary, plan["design"])
    return summary, _rl_report(plan, summary, charts), charts


def _rl_charts(out: Path, summary: dict, design: dict) -> dict[str, str]:
    charts = {}
    for key, name, fig in (("screen", "screen.png", study_charts.draw_rl_screen(summary)),
                           ("confirmation", "confirmation.png",
                            study_charts.draw_rl_confirmation(summary, design["confirm_split"]))):
        if fig is not None:
            charts[key] = name
            figures.save_png(fig, out / name, dpi=100)
    return charts


def _rl_report(plan: dict, summary: dict, charts: dict) -> list[str]:
    design, _analysis = plan["design"], plan["analysis"]
    recipe = design["recipe"]
    pretrained = ", ".join(f"{split} {v['solved']}/{v['tasks']}" for split, v in summary["pretrained"].items())
    lines = [
        "# Which RL choices matter?",
        "",
        (f"Every arm starts from checkpoint `{design['checkpoint']}` (sha256 `{design['checkpoint_sha256'][:12]}`; "
         f"greedy pass@1 before RL: {pretrained}). Recipe: "
         + (f"families {recipe['families']}, {recipe['tasks_per_family']} RL prompts per family, "
            if design.get("suite", "families") == "families" else
            f"the compositions suite's rl behaviours, every arm's groups x{design['budget_scale']}, "
            f"precision {design.get('precision', 'fp32')}, ")
         + f"lr {recipe['learning_rate']}, scope "
         f"{recipe['train_scope']}, max {recipe['max_new_tokens']} new tokens. Screen: {len(design['arms'])} arms x "
         f"seeds {design['screen_seeds']} on {design['screen_split']} "
         + (f"({design['tasks_per_family']} tasks per family). " if design.get("suite", "families") == "families" else
            f"({'all' if design['tasks_per_family'] is None else design['tasks_per_family']} tasks). ") +
         f"Confirmation: seeds {design['confirm_seeds']} on {design['confirm_split']}. Plan "
         f"`{summary['plan_sha256'][:12]}` was written before the first run; {summary['runs']}/{summary['runs_planned']} "
         f"runs done in {summary['wall_minutes']} min of wall time."),
        "",
        "## Answers",
        "",
        *[f"- {answer}" for answer in summary["answers"]],
        "",
        "## Results",
        "",
        *markdown_table(summary["headline_table"]["columns"], summary["headline_table"]["rows"]),
        "",
        ((f"Screen rows: test p = sign-flip over (seed, task) pairs, Holm across the arms. Confirmation row: test p = "
          f"exact sign-flip over training seeds (the primary test). {BOOTSTRAP_NOTE}")
         if design.get("suite", "families") == "families" else
         ("Every row compares two arms from one pretrained checkpoint at the units that vary: structure groups (each "
          "the mean of its behaviours; behaviours of one group are correlated) and training (RL) seeds. Screen rows: "
          "the exact sign-flip test over groups (seeds averaged), Holm across the arms, which flags a candidate and "
          "decides nothing. The confirmation and the comparisons with the starting checkpoint: a direction needs "
          "groups and seeds after Holm over the phase's comparisons; `RL seeds and groups random p` takes both as "
          "random at once (stats.crossed_comparison). Pass rates and their difference describe; wins/ties/losses "
          "count seeds whose pass rate is higher / equal / lower.")),
        "",
    ]
    for chart in charts.values():
        lines += [f"![{chart}]({chart})", ""]
    lines += ["## Screen arms", ""]
    arm_rows = [[a["arm"], a["rollouts"], f"{a['updates']:.1f}", f"{a['exact_training_rollouts']:.1f}",
                 f"{a['solved']}/{a['tasks']}", f"{a['mean_pass_rate']:.1f}", f"{a['seconds']:.0f}"] for a in summary["arms"]]
    lines += [*markdown_table(["arm", "rollouts", "updates (mean)", "exact training rollouts (mean)", "dev solved (all seeds)",
                       "dev pass@1 %", "seconds per run"], arm_rows), ""]
    if summary["selection"]:
        lines += [(f"Selected for confirmation: **{summary['selection']['candidate']}** "
                  f"({summary['selection']['rule']})."), ""]
    confirmation = summary["confirmation"]
    if confirmation:
        lines += ["## Confirmation per seed", ""]
        lines += markdown_table(["seed", "baseline solved", f"{confirmation['candidate']} solved", "gains", "losses",
                         "McNemar p"], [[r["seed"], f"{r['baseline_solved']}/{r['tasks']}",
                                         f"{r['candidate_solved']}/{r['tasks']}", r["gains"], r["losses"],
                                         format_p(r["mcnemar_p"])] for r in confirmation["per_seed"]])
        mde = confirmation.get("mde")
        lines += ["", (f"Minimum detectable effect at {confirmation['n']} seeds (80% power, from the observed seed-level "
                      f"SD): {'n/a' if mde is None else f'{mde:.1f} points'}."), ""]
    if design.get("suite", "families") == "families":
        units = summary.get("units") or {}
        units_limit = ("- The tasks of a family compute one function (its two descriptions compute the same one), so "
                       + (" and ".join(f"the {u['tasks']} {split} tasks are {u['units']} unit{'s' if u['units'] != 1 else ''}"
                                   for split, u in units.items())
                          or "a split's tasks are as many units as it has families")
                       + "; task-level tests (McNemar, pooled sign-flip) overstate the evidence, and the seed-level "
                         "test is the primary one.")
    else:
        units_limit = ("- Behaviours of one structure group are correlated, so the unit is the group, not the task: "
                       "task-level tests (McNemar, pooled sign-flip) overstate the evidence.")
    lines += ["## Limits", "", units_limit,
              "- One pretraining checkpoint and one learning rate: the training seeds and the tasks vary here, the "
              "pretraining seed does not; the screen's few seeds only select a candidate.",
              ""]
    return lines


# --------------------------------------------------------------------------- entry point


def analyze_generalisation(out: Path, plan: dict, receipts: list[dict]) -> tuple[dict, list[str], dict]:
    from glm53_flash.experiments import generalisation

    return generalisation.analyze(out, plan, receipts)


def analyze_rl_switches(out: Path, plan: dict, receipts: list[dict]) -> tuple[dict, list[str], dict]:
    from glm53_flash.experiments import rl_switches

    return rl_switches.analyze(out, plan, receipts)


def analyze_pretrain_switches(out: Path, plan: dict, receipts: list[dict]) -> tuple[dict, list[str], dict]:
    from glm53_flash.experiments import pretrain_switches

    return pretrain_switches.analyze(out, plan, receipts)


ANALYZERS = {"pretraining-data": analyze_pretraining, "rl-choices": analyze_rl_choices,
             "rl-generalisation": analyze_generalisation, "rl-switches": analyze_rl_switches,
             "pretrain-switches": analyze_pretrain_switches}


def analyze(directory: str | Path, force: bool = False, argv: list[str] | None = None,
            rerun_of: str | Path | None = None) -> dict:
    """A study directory's summary.json and REPORT.md from its receipts; with `rerun_of`, the directory is
    the rerun of that `rl-generalisation` study (disjoint pretraining seeds) and both are compared."""
    out = Path(directory)
    plan_path = out / PLAN_FILE
    if not plan_path.is_file():
        raise FileNotFoundError(f"{out} has no {PLAN_FILE}: not a study directory written by `glm53 experiment`")
    plan = read_json(plan_path)
    if plan.get("study") not in ANALYZERS:
        raise ValueError(f"{plan_path}: unknown study {plan.get('study')!r}; known: {', '.join(ANALYZERS)}")
    if rerun_of is not None and plan.get("study") not in RERUN_STUDIES:
        raise ValueError(f"--rerun-of compares {', '.join(f'`{name}`' for name in RERUN_STUDIES)} studies; {out} "
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
        if plan["study"] == "rl-generalisation":
            comparison = reruns.compare(first_plan, first_receipts, plan, receipts)
        elif plan["study"] == reruns.PRETRAIN_SWITCHES_STUDY:
            comparison = reruns.compare_pretrain_switches(first_plan, first_receipts, plan, receipts)
        elif plan["study"] == reruns.RL_SWITCHES_STUDY:
            from glm53_flash.experiments import rl_switches

            comparison = reruns.compare_rl_switches(first_plan, rl_switches.compute(first_plan, first_receipts),
                                                    plan, rl_switches.compute(plan, receipts))
        else:
            reruns.check_rl_choices_designs(first_plan, plan)
            comparison = reruns.compare_rl_choices(first_plan, compute_rl_choices(Path("."), first_plan, first_receipts),
                                                   plan, compute_rl_choices(Path("."), plan, receipts))
    summary, lines, charts = ANALYZERS[plan["study"]](out, plan, receipts)
    if rerun_of is not None:
        summary["rerun"] = comparison
        report = {"rl-generalisation": reruns.report_lines,
                  reruns.RL_SWITCHES_STUDY: reruns.rl_switches_report_lines,
                  reruns.PRETRAIN_SWITCHES_STUDY: reruns.pretrain_switches_report_lines}.get(plan["study"], reruns.rl_choices_report_lines)
        lines += report(comparison, str(rerun_of))
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
# The studies `glm53 analyze --rerun-of` compares with their rerun (experiments/reruns.py).
RERUN_STUDIES = ("rl-generalisation", "rl-choices", "rl-switches", "pretrain-switches")


def study_times(results: Path) -> dict:
    """Every committed study's time_record (a directory of `results` with plan.json and runs/), as a table:
    what docs/STUDIES.md shows (results/study-times.json; tests/test_results.py rebuilds it)."""
    from glm53_flash.experiments.study import PLAN_FILE, load_receipts

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


def _json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return None if math.isnan(value) else float(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


__all__ = ["ANALYZERS", "STUDY_TIMES_FILE", "analyze", "study_times", "time_record", "apply_holm", "compute_pretraining", "compute_rl_choices", "markdown_table",
           "paired_comparison", "pooled_pair_test", "pretraining_answers", "rl_choices_answers"]
