"""The studies' charts, drawn from their summary.json alone: the PNGs next to each study's REPORT.md
(experiments/analysis.py, vision/report.py) and the deck's inline SVG (report/slides.py) are the same
drawing at two sizes. Each function takes a study's summary dict and returns a matplotlib Figure, or
None when the summary holds nothing to draw; nothing here reads a file or computes a statistic. A summary without a chart's fields (an older or a
hand-written one) gets no chart."""

from __future__ import annotations

from glm53_flash.report import figures
from glm53_flash.report.format import format_p

# The sizes the study reports have always been drawn at (inches); the deck passes its own.
LEARNING_SIZE = (12, 4.6)
SCREEN_WIDTH, CONFIRMATION_SIZE = 9, (6.4, 4.4)
VISION_PANEL = (4.8, 4.4)


def paired_differences_size(rows: int) -> tuple[float, float]:
    return 9, 1.4 + 0.9 * rows


def screen_size(arms: int) -> tuple[float, float]:
    return SCREEN_WIDTH, 1.4 + 0.5 * arms


def draw_learning_curves(summary: dict, size=LEARNING_SIZE):
    """Pretraining-data study: accuracy by condition, and each comparison's paired difference, over training."""
    curves = summary.get("curves", {}).get(summary.get("primary_metric"), {})
    if not any(curves.values()):
        return None
    n = len(summary["seeds_completed"])
    with figures.style() as plt:
        fig, axes = plt.subplots(1, 2, figsize=size, layout="constrained")
        for condition, points in curves.items():
            steps = [p["step"] for p in points]
            axes[0].plot(steps, [p["mean"] for p in points], marker="o", label=condition)
            low = [p["ci95"][0] if p["ci95"] else p["mean"] for p in points]
            high = [p["ci95"][1] if p["ci95"] else p["mean"] for p in points]
            axes[0].fill_between(steps, low, high, alpha=0.15)
        axes[0].set(xlabel="update", ylabel="held-out target-byte accuracy (%)",
                    title=f"Accuracy by condition (mean, 95% CI, n={n} seeds)")
        axes[0].legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
        for name, points in summary["trajectory"].items():
            steps = [p["step"] for p in points]
            means = [p["mean"] for p in points]
            axes[1].errorbar(steps, means, yerr=figures.interval_errors(means, [p["ci95"] for p in points]),
                             marker="o", capsize=3, label=name)
        axes[1].axhline(0, color="grey", lw=0.8)
        axes[1].set(xlabel="update", ylabel="paired difference (points)",
                    title=f"Right - left over training (95% CI, n={n} seeds)")
        axes[1].legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    return fig


def draw_paired_differences(summary: dict, size=None):
    """Pretraining-data study: one dot per seed and comparison, the mean with its CI."""
    import numpy as np

    rows = [r for r in summary.get("comparisons", {}).get(summary.get("primary_metric"), []) if r["n"]]
    if not rows:
        return None
    n = len(summary["seeds_completed"])
    with figures.style() as plt:
        fig, ax = plt.subplots(figsize=size or paired_differences_size(len(rows)), layout="constrained")
        for y, row in enumerate(rows):
            jitter = np.linspace(-0.2, 0.2, len(row["differences"])) if len(row["differences"]) > 1 else [0.0]
            ax.scatter(row["differences"], np.full(len(row["differences"]), y) + jitter, s=14, alpha=0.6)
            if row["ci95"]:
                ax.errorbar([row["mean"]], [y], xerr=figures.interval_errors([row["mean"]], [row["ci95"]]),
                            fmt="D", color="black", capsize=4)
            else:  # too few seeds for a CI: the mean alone
                ax.scatter([row["mean"]], [y], marker="D", color="black")
        ax.axvline(0, color="grey", lw=0.8)
        ax.set_yticks(range(len(rows)), [f"{r['name']}\n{r['right']} - {r['left']}" for r in rows])
        ax.set_xlabel(f"per-seed difference in held-out byte accuracy at update {summary['primary_step']} (points)")
        ax.set_title(f"One dot per seed (n={n}); diamond = mean with its 95% bootstrap CI")
    return fig


def draw_rl_screen(summary: dict, size=None):
    """RL-choices study: each arm's dev pass@1 per screening seed, the pretrained checkpoint's as a line."""
    arms = summary.get("arms")
    if not arms:
        return None
    with figures.style() as plt:
        fig, ax = plt.subplots(figsize=size or screen_size(len(arms)), layout="constrained")
        for y, arm in enumerate(arms):
            ax.scatter(arm["pass_rates"], [y] * len(arm["pass_rates"]), s=18, alpha=0.6)
            ax.scatter([arm["mean_pass_rate"]], [y], marker="D", color="black")
        ax.set_yticks(range(len(arms)), [a["arm"] for a in arms])
        if "dev" in summary.get("pretrained", {}):
            figures.reference_line(ax, summary["pretrained"]["dev"]["pass_rate"], "pretrained", axis="x")
            figures.shared_legend(fig)
        seeds = sorted({len(a["pass_rates"]) for a in arms})
        ax.set_xlabel("dev greedy pass@1 (%) per screening seed; diamond = mean")
        ax.set_title(f"RL screen: one dot per training seed (n={'/'.join(map(str, seeds))} per arm)")
    return fig


def draw_rl_confirmation(summary: dict, split: str, size=CONFIRMATION_SIZE):
    """RL-choices study: baseline and candidate on the confirmation split, one line per fresh seed."""
    confirmation = summary.get("confirmation")
    if not (confirmation and confirmation["per_seed"]):
        return None
    with figures.style() as plt:
        fig, ax = plt.subplots(figsize=size, layout="constrained")
        for row in confirmation["per_seed"]:
            ax.plot([0, 1], [100 * row["baseline_solved"] / row["tasks"], 100 * row["candidate_solved"] / row["tasks"]],
                    marker="o", alpha=0.6)
        tasks = confirmation["per_seed"][0]["tasks"]
        ax.set_xticks([0, 1], ["baseline", confirmation["candidate"]])
        ax.set_xlabel(f"{split}, {tasks} tasks")  # the split's name is long: the wide axis carries it
        ax.set_ylabel("greedy pass@1 (%)")
        ax.set_title(f"Confirmation: one line per fresh seed (n={confirmation['n']})")
    return fig


def draw_vision_comparison(summary: dict, size=None):
    """Vision: faithful vs baseline accuracy per seed, and each architecture's pooled confusion matrix."""
    comparison, arms = summary.get("comparison"), summary.get("arms") or {}
    panels = (1 if comparison else 0) + len(arms)
    if not panels:
        return None
    with figures.style() as plt:
        fig, axes = plt.subplots(1, panels, figsize=size or (VISION_PANEL[0] * panels, VISION_PANEL[1]),
                                 layout="constrained")
        axes = [axes] if panels == 1 else list(axes)
        index = 0
        if comparison:
            ax = axes[index]
            index += 1
            per_seed = comparison["per_seed"]
            for row in per_seed:
                ax.plot([0, 1], [100 * row["faithful_accuracy"], 100 * row["baseline_accuracy"]], color="0.6", lw=0.8)
            ax.scatter([0] * len(per_seed), [100 * r["faithful_accuracy"] for r in per_seed], color="tab:blue", zorder=3)
            ax.scatter([1] * len(per_seed), [100 * r["baseline_accuracy"] for r in per_seed], color="tab:orange",
                       zorder=3)
            ax.set_xticks([0, 1], ["faithful", "baseline"])
            ax.set_xlim(-0.4, 1.4)
            ax.set_ylim(0, 100)
            examples = sorted({r["examples"] for r in per_seed})
            ax.set(ylabel=f"held-out accuracy over {'/'.join(map(str, examples))} images (%)",
                   title=f"per seed, n={len(per_seed)} (sign-flip p = {format_p(comparison['sign_flip_p'])})")
        for name, arm in arms.items():
            ax = axes[index]
            index += 1
            confusion = arm["confusion_after_pooled"]
            ax.imshow(confusion["matrix"], cmap="Blues")
            ax.set_xticks(range(len(confusion["columns"])), confusion["columns"], fontsize=figures.MIN_FONT_PT - 1)
            ax.set_yticks(range(10), confusion["rows"])
            ax.set(xlabel="predicted", ylabel="drawn", title=f"{name}: confusion (all seeds)")
    return fig


def save_charts(out, charts) -> dict:
    """Save each (key, file name, figure) of a study's REPORT.md as OUT/<file name> (a figure of None is a chart
    with nothing to draw: no file); the charts entry of its summary, {key: file name}."""
    from pathlib import Path

    saved = {}
    for key, name, fig in charts:
        if fig is not None:
            saved[key] = name
            figures.save_png(fig, Path(out) / name, dpi=100)
    return saved


def insert_effects_chart(out, lines: list[str], fig, heading: str, alt: str) -> dict:
    """Save a study's effects chart as OUT/effects.png and show it under `heading` in its REPORT.md
    lines; the charts entry for its summary ({} when there is no figure)."""
    from pathlib import Path

    if fig is None:
        return {}
    figures.save_png(fig, Path(out) / "effects.png", dpi=100)
    at = lines.index(heading)
    lines[at + 1:at + 1] = ["", f"![{alt}](effects.png)"]
    return {"effects": "effects.png"}


def _two_level_effects(comparisons: list[dict], labels: list[str], size, xlabel: str, title: str):
    """One row per two_level_comparison: each seed's effect as a dot, the mean with its 95% interval over
    units (thick) and over seeds (thin), in points."""
    with figures.style() as plt:
        fig, ax = plt.subplots(figsize=size or (9, 1.4 + 0.55 * len(comparisons)), layout="constrained")
        for y, c in enumerate(comparisons):
            mean = 100 * c["mean_difference"]
            seeds = [100 * v for v in c["seeds"]["values"]]
            ax.scatter(seeds, [y] * len(seeds), s=14, color="grey", alpha=0.7, zorder=2)
            if c["seeds"]["interval"] is not None:
                low, high = (100 * v for v in c["seeds"]["interval"])
                ax.plot([low, high], [y, y], color="tab:blue", lw=1, zorder=1)
            low, high = (100 * v for v in c["units"]["interval"])
            ax.plot([low, high], [y, y], color="tab:blue", lw=4, alpha=0.6, zorder=1)
            ax.scatter([mean], [y], color="tab:blue", s=36, zorder=3)
        ax.axvline(0, color="grey", lw=0.8)
        ax.set_yticks(range(len(comparisons)), labels)
        ax.invert_yaxis()
        ax.set(xlabel=xlabel, title=title)
    return fig


def draw_rl_switches(summary: dict, size=None):
    """RL-switches study: per arm and switch, the flip's effect on the dev pass rate (points), each
    pretraining seed's as a dot, with the intervals over structure groups and over seeds."""
    rows = summary.get("comparisons") or []
    if not rows:
        return None
    seeds = max(len(r["comparison"]["seeds"]["values"]) for r in rows)
    return _two_level_effects([r["comparison"] for r in rows],
                              [f"{r['arm']}: {r['switch']} -> {r['flipped_to']}" for r in rows], size,
                              "flipped minus own switches, dev pass rate (points)",
                              f"Each RL switch flipped alone\n(dots: pretraining seeds, n={seeds}; thick: 95% CI over "
                              "structure groups; thin: over seeds)")


def draw_pretrain_switches(summary: dict, size=None):
    """Pretraining-switches study: each switch's main effect (the original's value minus ours, points of
    the pass rate), on dev and, once opened, on the sealed split: the estimate with its 95% interval over
    structure groups (thick, around the groups' mean, a tick) and over runs (thin, around the runs' estimate, a
    dot)."""
    phases = [(name, summary.get(name)) for name in ("dev", "sealed") if summary.get(name)]
    if not phases:
        return None
    rows = [(f"{row['switch']} ({name})", row) for name, effects in phases for row in effects["switches"]]
    with figures.style() as plt:
        fig, ax = plt.subplots(figsize=size or (9, 1.4 + 0.55 * len(rows)), layout="constrained")
        for y, (_, row) in enumerate(rows):
            color = "tab:blue" if y < len(phases[0][1]["switches"]) else "tab:orange"
            low, high = (100 * v for v in row["runs"]["interval"])
            ax.plot([low, high], [y, y], color=color, lw=1, zorder=1)
            low, high = (100 * v for v in row["groups"]["interval"])
            ax.plot([low, high], [y, y], color=color, lw=4, alpha=0.6, zorder=1)
            ax.scatter([100 * row["groups"]["mean"]], [y], color=color, marker="|", s=120, zorder=3)
            ax.scatter([100 * row["effect"]], [y], color=color, s=36, zorder=3)
        ax.axvline(0, color="grey", lw=0.8)
        ax.set_yticks(range(len(rows)), [label for label, _ in rows])
        ax.invert_yaxis()
        runs = phases[0][1]["runs"]
        ax.set(xlabel="original's value minus ours, pass rate (points)",
               title=f"Each pretraining switch's main effect\n(n={runs} runs; thick: 95% CI over structure groups; "
                     "thin: over runs)")
    return fig


def draw_rl_generalisation(summary: dict, size=None):
    """RL-generalisation study: per arm, reward and sealed split, RL's effect on the strong pass rate (points):
    each pretraining seed's effect as a dot, the mean with its 95% interval over structure groups (thick) and over
    seeds (thin)."""
    rows = [row for row in summary.get("sealed", []) if row.get("strong")]
    if not rows:
        return None
    split_names = {"compositions.unseen_structures": "unseen compositions", "compositions.new_constants": "new constants"}
    rewards = {"three": "three-case", "strong": "strong-set"}
    seeds = max(len(r["strong"]["comparison"]["seeds"]["values"]) for r in rows)
    return _two_level_effects([r["strong"]["comparison"] for r in rows],
                              [f"{r['arm']}, {rewards.get(r['reward'], r['reward'])} reward, "
                               f"{split_names.get(r['split'], r['split'])}" for r in rows], size,
                              "after RL minus before, strong pass rate (points)",
                              f"RL's effect on the sealed splits\n(dots: pretraining seeds, n={seeds}; thick: 95% CI over "
                              "structure groups; thin: over seeds)")
