"""`glm53 report PATH`: a report card for one run, built only from what the run wrote: a pretraining run
(training-receipt.json + metrics.jsonl: loss, validation loss, learning rate, gradient norm, tokens/s),
an RL run (reward, loss, gradient norm, entropy, the share of groups without signal, the reward-hacking
rate) or one evaluation receipt (its summary and per-family table). Writes PATH/report.md (an
evaluation receipt: RECEIPT.report.md) and, for runs, the curves as report-curves.png beside it.

The run's files may be hostile: they are read within core.receipts.READ_LIMITS, every value from them
is escaped for markdown, and the outputs are written inside the output directory only, never through a
symbolic link (core.receipts.write_bytes)."""

from __future__ import annotations

from pathlib import Path

from glm53_flash.core.receipts import read_json, read_jsonl, write_text
from glm53_flash.report.figures import save_png, style
from glm53_flash.report.tables import markdown_escape, markdown_table

RECEIPT = "training-receipt.json"
METRICS = "metrics.jsonl"
# The curves of each kind of run: (row field, axis title), in the order drawn.
CURVES = {
    "pretraining": (("loss", "training loss"), ("val_loss", "validation loss"), ("lr", "learning rate"),
                    ("grad_norm", "gradient norm (before clipping)"), ("tokens_per_second", "tokens / s")),
    "rl": (("mean_reward", "mean reward"), ("loss", "policy loss"), ("grad_norm", "gradient norm"),
           ("entropy", "entropy of the sampled tokens"), ("zero_variance_fraction", "groups without signal")),
}
X_AXIS = {"pretraining": ("step", "step"), "rl": ("last_group", "group")}


class NotARun(ValueError):
    """The path holds nothing this command reports on."""


def run_kind(path: Path) -> str:
    """'pretraining', 'rl' or 'evaluation' (an eval receipt file)."""
    if path.is_file():
        receipt = _read(path)
        if isinstance(receipt, dict) and "episodes" in receipt and "summary" in receipt:
            return "evaluation"
        raise NotARun(f"{path} is not an evaluation receipt (no episodes and summary)")
    if not (path / RECEIPT).is_file():
        hint = " (a study directory: `glm53 analyze`)" if (path / "plan.json").is_file() else ""
        raise NotARun(f"{path} holds no {RECEIPT}: give a pretraining or RL run directory or an eval receipt{hint}")
    receipt = _read(path / RECEIPT)
    if receipt.get("algorithm", "").lower().startswith("rloo") or "group_size" in receipt:
        return "rl"
    return "pretraining"


def _read(path: Path):
    try:
        return read_json(path)
    except (OSError, ValueError) as error:
        raise NotARun(f"{path} cannot be read as JSON ({error})") from None


def metric_rows(directory: Path) -> list[dict]:
    """The rows of the run's metrics.jsonl (none when it has none), read within READ_LIMITS["jsonl"]."""
    path = directory / METRICS
    if not path.exists():
        return []
    try:
        return [row for row in read_jsonl(path) if isinstance(row, dict)]
    except (OSError, ValueError) as error:
        raise NotARun(f"{path} cannot be read as JSON lines ({error})") from None


def curves(rows: list[dict], kind: str) -> dict[str, tuple[list, list]]:
    """field -> (x values, y values) for every curve of `kind` the rows hold (None values skipped)."""
    x_key = X_AXIS[kind][0]
    found = {}
    for field, _ in CURVES[kind]:
        points = [(row[x_key], row[field]) for row in rows if row.get(field) is not None and x_key in row]
        if points:
            found[field] = ([x for x, _ in points], [y for _, y in points])
    return found


def draw_curves(series: dict, kind: str, path: Path, within: Path | None = None) -> None:
    titles = dict(CURVES[kind])
    with style() as plt:
        fig, axes = plt.subplots(len(series), 1, figsize=(7.5, 2.4 * len(series)), squeeze=False)
        for ax, (field, (xs, ys)) in zip(axes[:, 0], series.items()):
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3)
            ax.set_title(titles[field], loc="left")
            ax.set_xlabel(X_AXIS[kind][1])
        fig.tight_layout()
        save_png(fig, path, within=within)
        plt.close(fig)


def _summary_lines(series: dict, kind: str) -> list[str]:
    rows = []
    for field, title in CURVES[kind]:
        if field in series:
            ys = series[field][1]
            rows.append([title, f"{ys[0]:.4g}", f"{ys[-1]:.4g}", f"{min(ys):.4g}", f"{max(ys):.4g}", str(len(ys))])
    return markdown_table(["curve", "first", "last", "min", "max", "points"], rows)


def build_run_report(path: str | Path, output: str | Path | None = None) -> Path:
    """Write the report card of a run directory or an eval receipt; returns the report.md path."""
    path = Path(path)
    kind = run_kind(path)
    if kind == "evaluation":
        return _evaluation_report(path, output)
    receipt = _read(path / RECEIPT)
    out = Path(output) if output else path
    out.mkdir(parents=True, exist_ok=True)
    rows = metric_rows(path)
    series = curves(rows, kind)
    title = "Pretraining run" if kind == "pretraining" else "RL run"
    lines = [f"# {title}: {markdown_escape(path.name)}", "",
             f"Built by `glm53 report` from `{RECEIPT}` and `{METRICS}` of {markdown_escape(path)} (nothing else is "
             "read).", ""]
    facts = [["status", str(receipt.get("status"))], ["commit", str(receipt.get("provenance", {}).get("git_commit"))],
             ["device", str(receipt.get("device"))], ["elapsed", f"{receipt.get('elapsed_seconds', 0):.1f} s"]]
    if kind == "pretraining":
        facts += [["preset", str(receipt.get("preset"))], ["steps", str(receipt.get("steps"))],
                  ["batch x length", f"{receipt.get('batch_size')} x {receipt.get('sequence_length')}"],
                  ["tokens seen", f"{receipt.get('tokens_seen', 0):,}"],
                  ["parameters", f"{receipt.get('parameter_counts', {}).get('total', 0):,}"]]
    else:
        facts += [["groups", f"{receipt.get('groups')} of {receipt.get('group_size')} rollouts"],
                  ["updates with signal", str(receipt.get("updated_groups"))],
                  ["exact training rollouts", str(receipt.get("exact_training_rollouts"))],
                  ["reward", f"{receipt.get('reward_mode')} ({receipt.get('reward_cases', 'three')} cases)"]]
        hacking = receipt.get("reward_hacking")
        if isinstance(hacking, dict) and hacking.get("rate") is not None:
            facts.append(["reward-hacking rate", f"{hacking['rate']:.3f} of rewarded rollouts fail the strong tests"])
    lines += markdown_table(["", ""], facts) + [""]
    checkpoints = [[str(c.get("step", c.get("group"))), str(c.get("weights_sha256", ""))[:16]]
                   for c in receipt.get("checkpoints", [])]
    if checkpoints:
        lines += ["## Checkpoints", "", *markdown_table([X_AXIS[kind][1], "weights sha256 (first 16)"], checkpoints), ""]
    if series:
        picture = out / "report-curves.png"
        draw_curves(series, kind, picture, within=out)
        lines += ["## Curves", "", *_summary_lines(series, kind), "", f"![curves]({picture.name})", ""]
    else:
        lines += ["No metrics rows yet: the run has not finished a step.", ""]
    return write_text(out / "report.md", "\n".join(lines), within=out)


def _evaluation_report(path: Path, output: str | Path | None) -> Path:
    receipt = _read(path)
    summary = receipt["summary"]
    inference = receipt.get("inference", {})
    mode = "greedy pass@1" if inference.get("greedy") else f"sampled, {inference.get('samples_per_task')} per task"
    lines = [f"# Evaluation: {markdown_escape(path.name)}", "",
             f"Built by `glm53 report` from {markdown_escape(path)}: split `{markdown_escape(receipt.get('split'))}`, "
             f"{markdown_escape(mode)}, checkpoint `{markdown_escape(receipt.get('checkpoint'))}`.", ""]
    keys = [k for k in ("tasks_total", "tasks_solved", "pass_at_1", "tests_passed", "tests_total", "valid_programs",
                        "tasks_solved_strong", "false_passes", "exact_rollouts") if k in summary]
    lines += markdown_table(["measure", "value"], [[k, f"{summary[k]:.4g}" if isinstance(summary[k], float)
                                                    else str(summary[k])] for k in keys]) + [""]
    families = receipt.get("by_family", {})
    if families:
        columns = sorted({k for row in families.values() for k in row})
        lines += ["## By family", "", *markdown_table(["family", *columns],
                                                     [[name, *(str(row.get(c, "")) for c in columns)]
                                                      for name, row in families.items()]), ""]
    report = Path(output) if output else path.with_suffix(".report.md")
    return write_text(report, "\n".join(lines), within=report.parent)


__all__ = ["NotARun", "build_run_report", "curves", "metric_rows", "run_kind"]
