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
# Curves that count (a share of the update's groups): drawn as bars over bins of updates, not as a line.
BARS = {"zero_variance_fraction"}
BINS = 16
# Noisy per-update curves drawn with a running mean over them.
SMOOTHED = {"mean_reward", "loss"}
# What a reader should know to read each curve (one sentence, placed after the measured reading).
MEANING = {
    "loss": "The training loss is the mean cross-entropy per target byte (nats); lower means the model predicts "
            "the corpus better.",
    "val_loss": "The validation loss is the same on held-out text; a gap that widens against the training loss "
                "means memorising.",
    "lr": "The learning rate follows the schedule the run was given.",
    "grad_norm": "The gradient norm is measured before clipping; isolated spikes are single hard batches.",
    "tokens_per_second": "Throughput in tokens per second: it depends on the machine, not on learning.",
    "mean_reward": "The mean reward is the share of sampled programs that passed the hidden tests (with penalties "
                   "for invalid ones); it moves with which task each group drew, so compare stretches, not points.",
    "policy_loss": "",
    "entropy": "The entropy of the sampled tokens: falling entropy means the policy grows more certain.",
    "zero_variance_fraction": "A group whose samples all get the same reward has no advantage to learn from "
                              "(RLOO subtracts the mean of the others), so it contributes no gradient.",
}
MEANING["loss_rl"] = ("The policy loss is minus the advantage-weighted log-likelihood of the samples; its sign "
                      "and size follow the advantages of each update's groups, so a spike marks an update with "
                      "large advantages, not a failure.")


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


def binned(xs: list, ys: list, bins: int = BINS) -> tuple[list, list, list]:
    """(bin starts, bin ends, mean of ys) over at most `bins` consecutive bins of equal size."""
    size = max(1, -(-len(xs) // bins))
    starts, ends, means = [], [], []
    for i in range(0, len(xs), size):
        chunk = ys[i:i + size]
        starts.append(xs[i])
        ends.append(xs[min(i + size, len(xs)) - 1])
        means.append(sum(chunk) / len(chunk))
    return starts, ends, means


def draw_curves(series: dict, kind: str, path: Path, within: Path | None = None) -> None:
    titles = dict(CURVES[kind])
    with style() as plt:
        fig, axes = plt.subplots(len(series), 1, figsize=(7.5, 2.4 * len(series)), squeeze=False)
        for ax, (field, (xs, ys)) in zip(axes[:, 0], series.items()):
            if field in BARS:
                starts, ends, means = binned(xs, ys)
                widths = [max(1, end - start + 1) for start, end in zip(starts, ends)]
                ax.bar(starts, means, width=widths, align="edge", color="tab:gray", edgecolor="white")
                ax.set_ylim(0, 1)
                ax.set_ylabel("share")
            elif field in SMOOTHED and len(ys) >= 8:
                window = max(2, len(ys) // 8)
                means = [sum(ys[max(0, i - window + 1):i + 1]) / len(ys[max(0, i - window + 1):i + 1])
                         for i in range(len(ys))]
                ax.plot(xs, ys, color="tab:blue", alpha=0.35, linewidth=1, label="each update")
                ax.plot(xs, means, color="tab:blue", linewidth=2, label=f"mean of the last {window} updates")
                ax.legend(loc="best", frameon=False)
            else:
                ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3)
            ax.set_title(titles[field], loc="left")
            ax.set_xlabel(X_AXIS[kind][1])
        fig.tight_layout()
        save_png(fig, path, within=within)
        plt.close(fig)


def reading(field: str, xs: list, ys: list, kind: str) -> str:
    """One sentence on a curve: how it moved from its first quarter to its last, where it fell most, and
    what the curve means."""
    x_name = X_AXIS[kind][1]
    quarter = max(1, len(ys) // 4)
    first, last = sum(ys[:quarter]) / quarter, sum(ys[-quarter:]) / quarter
    title = dict(CURVES[kind])[field]
    if field in BARS:
        text = (f"{title}: {100 * first:.0f}% of the groups in the first quarter of the run, {100 * last:.0f}% in "
                f"the last (bars: each a bin of consecutive updates).")
    else:
        trend = "rose" if last > first * 1.02 + 1e-12 else "fell" if last < first * 0.98 - 1e-12 else "stayed level"
        text = f"{title} {trend}: {first:.4g} on average over the first quarter of the run, {last:.4g} over the last."
        if len(ys) >= 4 and field in ("mean_reward", "loss", "val_loss"):
            drops = [(ys[i] - ys[i + 1], xs[i + 1]) for i in range(len(ys) - 1)]
            worst, at = max(drops) if field == "mean_reward" else min(drops)
            if field == "mean_reward" and worst > 0.25 * (max(ys) - min(ys) or 1):
                text += f" Its largest fall between two updates is {worst:.3g}, at {x_name} {at}."
    meaning = MEANING["loss_rl"] if (kind == "rl" and field == "loss") else MEANING.get(field, "")
    return f"{text} {meaning}".strip()


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
    evaluations = evaluation_rows(path, receipt, kind)
    if evaluations:
        facts += evaluations
    lines += markdown_table(["fact", "value"], facts) + [""]
    checkpoints = [[str(c.get("step", c.get("group"))), str(c.get("weights_sha256", ""))[:16]]
                   for c in receipt.get("checkpoints", [])]
    if checkpoints:
        lines += ["## Checkpoints", "", *markdown_table([X_AXIS[kind][1], "weights sha256 (first 16)"], checkpoints), ""]
    if series:
        picture = out / "report-curves.png"
        draw_curves(series, kind, picture, within=out)
        lines += ["## Curves", "", *_summary_lines(series, kind), "", f"![curves]({picture.name})", "",
                  *[f"- {markdown_escape(reading(field, xs, ys, kind))}" for field, (xs, ys) in series.items()], ""]
    else:
        lines += ["No metrics rows yet: the run has not finished a step.", ""]
    return write_text(out / "report.md", "\n".join(lines), within=out)


def _eval_receipts(directory: Path) -> list[tuple[Path, dict]]:
    """The evaluation receipts (JSON files with episodes and a summary) directly inside `directory`."""
    found = []
    if not directory.is_dir():
        return found
    for candidate in sorted(directory.glob("*.json")):
        if candidate.name == RECEIPT or candidate.is_symlink():
            continue
        try:
            data = read_json(candidate)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "episodes" in data and isinstance(data.get("summary"), dict):
            found.append((candidate, data))
    return found


def evaluation_rows(path: Path, receipt: dict, kind: str) -> list[list[str]]:
    """Fact rows for the evaluation receipts beside the run (`glm53 eval ... --output RUN/dev.json`); for an
    RL run, also those beside its initial checkpoint's run that evaluated that checkpoint (before RL)."""
    rows = []
    places = [("", path)]
    if kind == "rl" and receipt.get("initial_checkpoint"):
        places.insert(0, ("before RL, ", Path(str(receipt["initial_checkpoint"])).parent))
    for prefix, directory in places:
        for receipt_path, data in _eval_receipts(directory):
            if prefix and Path(str(data.get("checkpoint", ""))).name != Path(str(receipt["initial_checkpoint"])).name:
                continue
            summary = data["summary"]
            solved, total = summary.get("tasks_solved"), summary.get("tasks_total")
            checkpoint = Path(str(data.get("checkpoint", ""))).name
            rows.append([f"{prefix}{data.get('split')} pass rate",
                         f"{solved}/{total} tasks ({checkpoint}; {receipt_path.name})"])
    return rows


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
