"""The studies' charts, drawn from their summary.json alone: the PNGs next to each study's REPORT.md
(experiments/analysis.py, vision/report.py) and the deck's inline SVG (report/slides.py) are the same
drawing at two sizes. Each function takes a study's summary dict and returns a matplotlib Figure, or
None when the summary holds nothing to draw; nothing here reads a file or computes a statistic. A summary without a chart's fields (an older or a
hand-written one) gets no chart. Every condition is drawn in its palette colour (report/figures.PALETTE) and
tagged with its name, every chart with more than one condition has a legend, and labels show the plain names
of the code's identifiers (report/glossary.py)."""

from __future__ import annotations

from glm53_flash.report import figures
from glm53_flash.report.glossary import COMPARISONS, label, rl_arm_names

# The sizes the study reports have always been drawn at (inches); the deck passes its own.
LEARNING_SIZE = (12, 4.6)
SCREEN_WIDTH, CONFIRMATION_SIZE = 9, (6.4, 4.4)
VISION_PANEL = (4.8, 4.4)


def paired_differences_size(rows: int) -> tuple[float, float]:
    return 9, 1.4 + 0.9 * rows


def screen_size(arms: int) -> tuple[float, float]:
    return SCREEN_WIDTH, 1.4 + 0.5 * arms


# Markers and line styles that tell apart the comparisons of one study, all drawn in the palette's EFFECT
# colour (a comparison is a difference between two conditions, not a condition of its own).
COMPARISON_STYLES = (("o", "-"), ("s", "--"), ("^", ":"), ("D", "-."), ("v", (0, (5, 1))), ("P", (0, (1, 1))))


def draw_learning_curves(summary: dict, size=LEARNING_SIZE):
    """Pretraining-data study: accuracy by condition (each in its palette colour), and each comparison's
    paired difference over training (the EFFECT colour, one marker and line style each)."""
    curves = summary.get("curves", {}).get(summary.get("primary_metric"), {})
    if not any(curves.values()):
        return None
    n = len(summary["seeds_completed"])
    with figures.style() as plt:
        fig, axes = plt.subplots(1, 2, figsize=size, layout="constrained")
        for condition, points in curves.items():
            steps = [p["step"] for p in points]
            colour = figures.colour(condition)
            line = axes[0].plot(steps, [p["mean"] for p in points], marker="o", color=colour, label=label(condition))
            low = [p["ci95"][0] if p["ci95"] else p["mean"] for p in points]
            high = [p["ci95"][1] if p["ci95"] else p["mean"] for p in points]
            band = axes[0].fill_between(steps, low, high, alpha=0.15, color=colour, lw=0)
            figures.series(condition, line, band)
        axes[0].set(xlabel="pretraining update", ylabel="held-out byte accuracy (%)",
                    title=f"Byte accuracy by condition (mean, 95% interval, n={n} seeds)")
        axes[0].legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
        for (name, points), (marker, dashes) in zip(summary["trajectory"].items(), COMPARISON_STYLES * 4):
            steps = [p["step"] for p in points]
            means = [p["mean"] for p in points]
            drawn = axes[1].errorbar(steps, means, yerr=figures.interval_errors(means, [p["ci95"] for p in points]),
                                     marker=marker, linestyle=dashes, color=figures.EFFECT, capsize=3,
                                     label=COMPARISONS.get(name, label(name)))
            figures.series("effect", drawn)
        axes[1].axhline(0, color="grey", lw=0.8)
        axes[1].set(xlabel="pretraining update", ylabel="paired difference (points)",
                    title=f"Each comparison, right minus left (95% interval, n={n} seeds)")
        axes[1].legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    return fig


def draw_paired_differences(summary: dict, size=None):
    """Pretraining-data study: one dot per seed and comparison, the mean with its interval."""
    import numpy as np

    rows = [r for r in summary.get("comparisons", {}).get(summary.get("primary_metric"), []) if r["n"]]
    if not rows:
        return None
    n = len(summary["seeds_completed"])
    with figures.style() as plt:
        fig, ax = plt.subplots(figsize=size or paired_differences_size(len(rows)), layout="constrained")
        for y, row in enumerate(rows):
            jitter = np.linspace(-0.2, 0.2, len(row["differences"])) if len(row["differences"]) > 1 else [0.0]
            figures.series("effect", ax.scatter(row["differences"], np.full(len(row["differences"]), y) + jitter,
                                                s=14, alpha=0.5, color=figures.EFFECT))
            if row["ci95"]:
                drawn = ax.errorbar([row["mean"]], [y], xerr=figures.interval_errors([row["mean"]], [row["ci95"]]),
                                    fmt="D", color="black", capsize=4)
            else:  # too few seeds for an interval: the mean alone
                drawn = ax.scatter([row["mean"]], [y], marker="D", color="black")
            figures.series("effect", drawn)
        ax.axvline(0, color="grey", lw=0.8)
        ax.set_yticks(range(len(rows)), [f"{label(r['name'])}\n"
                                         + COMPARISONS.get(r["name"], f"{label(r['right'])} - {label(r['left'])}")
                                         for r in rows])
        ax.set_xlabel(f"per-seed difference in held-out byte accuracy at update {summary['primary_step']} (points)")
        ax.set_title(f"One dot per seed (n={n}); diamond = mean with its 95% interval")
    return fig


def _arm_colour(name: str) -> str:
    """An RL arm's colour: its own where the palette has one (the baseline, the temperatures), the
    screen's other arms' otherwise."""
    return figures.PALETTE.get(name, figures.PALETTE["other arms"])


def draw_rl_screen(summary: dict, size=None):
    """RL-choices study: each arm's dev pass@1 per screening seed, the pretrained checkpoint's as a line."""
    arms = summary.get("arms")
    if not arms:
        return None
    with figures.style() as plt:
        from matplotlib.lines import Line2D

        fig, ax = plt.subplots(figsize=size or screen_size(len(arms)), layout="constrained")
        for y, arm in enumerate(arms):
            name = arm["arm"] if arm["arm"] in figures.PALETTE else "other arms"
            figures.series(name, ax.scatter(arm["pass_rates"], [y] * len(arm["pass_rates"]), s=22,
                                            color=_arm_colour(arm["arm"]), alpha=0.85))
            ax.scatter([arm["mean_pass_rate"]], [y], marker="D", color="black")
        names = {**rl_arm_names(arms), "other arms": "other settings"}
        ax.set_yticks(range(len(arms)), [names.get(a["arm"], label(a["arm"])) for a in arms])
        handles = [Line2D([], [], color=_arm_colour(n), marker="o", linestyle="", label=names.get(n, label(n)))
                   for n in dict.fromkeys([a["arm"] for a in arms if a["arm"] in figures.PALETTE] + ["other arms"])]
        handles.append(Line2D([], [], color="black", marker="D", linestyle="", label="mean over seeds"))
        if "dev" in summary.get("pretrained", {}):
            figures.reference_line(ax, summary["pretrained"]["dev"]["pass_rate"], "pretrained (before RL)", axis="x")
            ax.lines[-1].set_color(figures.BEFORE)
            figures.series("before RL", ax.lines[-1])
            handles.append(ax.lines[-1])
        figures.shared_legend(fig, handles, columns=3)
        seeds = sorted({len(a["pass_rates"]) for a in arms})
        ax.set_xlabel("dev pass@1, greedy (% of tasks), one dot per RL seed")
        ax.set_title(f"Screen: every RL setting on dev (n={'/'.join(map(str, seeds))} seeds per setting)")
    return fig


def draw_rl_confirmation(summary: dict, split: str, size=CONFIRMATION_SIZE):
    """RL-choices study: baseline and candidate on the confirmation split, one line per fresh seed (grey,
    its ends in each condition's colour)."""
    confirmation = summary.get("confirmation")
    if not (confirmation and confirmation["per_seed"]):
        return None
    candidate = confirmation["candidate"]
    names = rl_arm_names(summary.get("arms") or [])
    words = names.get(candidate, label(candidate))
    with figures.style() as plt:
        fig, ax = plt.subplots(figsize=size, layout="constrained")
        left, right = [], []
        for row in confirmation["per_seed"]:
            pair = [100 * row["baseline_solved"] / row["tasks"], 100 * row["candidate_solved"] / row["tasks"]]
            ax.plot([0, 1], pair, color="#d9d9d9", lw=1, zorder=1)
            left.append(pair[0])
            right.append(pair[1])
        figures.series("baseline", ax.scatter([0] * len(left), left, color=_arm_colour("baseline"), zorder=3,
                                              label="baseline"))
        figures.series(candidate if candidate in figures.PALETTE else "other arms",
                       ax.scatter([1] * len(right), right, color=_arm_colour(candidate), zorder=3, label=words))
        tasks = confirmation["per_seed"][0]["tasks"]
        ax.set_xticks([0, 1], ["baseline", words])
        ax.set_xlim(-0.3, 1.3)
        ax.set_xlabel(f"{label(split)} split, {tasks} tasks")
        ax.set_ylabel(f"pass@1, greedy (% of {tasks} tasks)")
        ax.set_title(f"Confirmation: one line per fresh RL seed (n={confirmation['n']})")
        figures.shared_legend(fig, columns=2)
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
                ax.plot([0, 1], [100 * row["faithful_accuracy"], 100 * row["baseline_accuracy"]], color="#d9d9d9",
                        lw=0.8)
            for x, name in ((0, "faithful"), (1, "baseline")):
                figures.series(name, ax.scatter([x] * len(per_seed), [100 * r[f"{name}_accuracy"] for r in per_seed],
                                                color=figures.colour(name), zorder=3, label=name))
            ax.set_xticks([0, 1], ["faithful", "baseline"])
            ax.set_xlim(-0.4, 1.4)
            ax.set_ylim(0, 100)
            examples = sorted({r["examples"] for r in per_seed})
            ax.set(ylabel=f"held-out digits named right (% of {'/'.join(map(str, examples))})",
                   title=f"One line per seed (n={len(per_seed)})")
        for name, arm in arms.items():
            ax = axes[index]
            index += 1
            confusion = arm["confusion_after_pooled"]
            ax.imshow(confusion["matrix"], cmap="Greys")  # grey: counts, not a condition's colour
            ax.set_xticks(range(len(confusion["columns"])), confusion["columns"], fontsize=figures.MIN_FONT_PT - 1)
            ax.set_yticks(range(10), confusion["rows"])
            ax.set(xlabel="digit the model said", ylabel="digit drawn", title=f"{name}: confusion (all seeds)")
        if comparison:
            figures.shared_legend(fig, columns=2)
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


def _two_level_effects(comparisons: list[dict], labels: list[str], arms: list[str], size, xlabel: str, title: str):
    """One row per two_level_comparison, in its arm's colour: each seed's effect as a small dot, the mean
    (a large dot) with its 95% interval over units (thick) and over seeds (thin), in points."""
    from matplotlib.lines import Line2D

    with figures.style() as plt:
        fig, ax = plt.subplots(figsize=size or (9, 1.4 + 0.55 * len(comparisons)), layout="constrained")
        for y, (c, arm) in enumerate(zip(comparisons, arms)):
            colour = figures.colour(arm)
            mean = 100 * c["mean_difference"]
            seeds = [100 * v for v in c["seeds"]["values"]]
            drawn = [ax.scatter(seeds, [y] * len(seeds), s=14, color=colour, alpha=0.45, zorder=2)]
            if c["seeds"]["interval"] is not None:
                low, high = (100 * v for v in c["seeds"]["interval"])
                drawn += ax.plot([low, high], [y, y], color=colour, lw=1, zorder=1)
            low, high = (100 * v for v in c["units"]["interval"])
            drawn += ax.plot([low, high], [y, y], color=colour, lw=4, alpha=0.6, zorder=1)
            drawn.append(ax.scatter([mean], [y], color=colour, s=36, zorder=3))
            figures.series(arm, *drawn)
        ax.axvline(0, color="grey", lw=0.8)
        ax.set_yticks(range(len(comparisons)), labels)
        ax.invert_yaxis()
        ax.set(xlabel=xlabel, title=title)
        figures.shared_legend(fig, [Line2D([], [], color=figures.colour(arm), marker="o", lw=4, alpha=0.8,
                                           label=f"{arm} arm") for arm in dict.fromkeys(arms)], columns=2)
    return fig


def draw_rl_switches(summary: dict, size=None):
    """RL-switches study: per arm and switch, the flip's effect on the dev pass rate (points), each
    pretraining seed's as a dot, with the intervals over structure groups and over seeds."""
    rows = summary.get("comparisons") or []
    if not rows:
        return None
    seeds = max(len(r["comparison"]["seeds"]["values"]) for r in rows)
    return _two_level_effects([r["comparison"] for r in rows],
                              [f"{label(r['switch'])}: {label(r['own'])} -> {label(r['flipped_to'])}" for r in rows],
                              [r["arm"] for r in rows], size, "flipped minus the arm's own, dev pass rate (points)",
                              f"Each RL switch flipped alone\n(small dots: pretraining seeds, n={seeds}; thick: 95% "
                              "interval over structure groups; thin: over seeds)")


def draw_pretrain_switches(summary: dict, size=None):
    """Pretraining-switches study: each switch's main effect (the original's value minus ours, points of
    the pass rate), on dev and, once opened, on the sealed split: the estimate with its 95% interval over
    structure groups (thick, around the groups' mean, a tick) and over runs (thin, around the runs' estimate, a
    dot); dev and the sealed split told apart by the marker, all in the EFFECT colour."""
    from matplotlib.lines import Line2D

    phases = [(name, summary.get(name)) for name in ("dev", "sealed") if summary.get(name)]
    if not phases:
        return None
    markers = {"dev": "o", "sealed": "s"}
    rows = [(f"{label(row['switch'])} ({name})", name, row) for name, effects in phases for row in effects["switches"]]
    with figures.style() as plt:
        fig, ax = plt.subplots(figsize=size or (9, 1.4 + 0.55 * len(rows)), layout="constrained")
        for y, (_, phase, row) in enumerate(rows):
            drawn = []
            low, high = (100 * v for v in row["runs"]["interval"])
            drawn += ax.plot([low, high], [y, y], color=figures.EFFECT, lw=1, zorder=1)
            low, high = (100 * v for v in row["groups"]["interval"])
            drawn += ax.plot([low, high], [y, y], color=figures.EFFECT, lw=4, alpha=0.45, zorder=1)
            drawn.append(ax.scatter([100 * row["groups"]["mean"]], [y], color=figures.EFFECT, marker="|", s=120,
                                    zorder=3))
            drawn.append(ax.scatter([100 * row["effect"]], [y], color=figures.EFFECT, marker=markers[phase], s=36,
                                    zorder=3))
            figures.series("effect", *drawn)
        ax.axvline(0, color="grey", lw=0.8)
        ax.set_yticks(range(len(rows)), [text for text, _, _ in rows])
        ax.invert_yaxis()
        runs = phases[0][1]["runs"]
        ax.set(xlabel="the original's value minus ours, pass rate (points)",
               title=f"Each pretraining switch's main effect\n(n={runs} runs; thick: 95% interval over structure "
                     "groups; thin: over runs)")
        figures.shared_legend(fig, [Line2D([], [], color=figures.EFFECT, marker=markers[name], linestyle="",
                                           label=f"{'dev split' if name == 'dev' else 'sealed split'}")
                                    for name, _ in phases], columns=2)
    return fig


def draw_rl_generalisation(summary: dict, size=None):
    """RL-generalisation study: per arm, reward and sealed split, RL's effect on the strong pass rate (points):
    each pretraining seed's effect as a dot, the mean with its 95% interval over structure groups (thick) and over
    seeds (thin), in the arm's colour."""
    rows = [row for row in summary.get("sealed", []) if row.get("strong")]
    if not rows:
        return None
    seeds = max(len(r["strong"]["comparison"]["seeds"]["values"]) for r in rows)
    return _two_level_effects([r["strong"]["comparison"] for r in rows],
                              [f"{label(r['reward'])} reward, {label(r['split'])}" for r in rows],
                              [r["arm"] for r in rows], size, "after RL minus before, strong pass rate (points)",
                              f"RL's effect on the sealed splits\n(small dots: pretraining seeds, n={seeds}; thick: 95% "
                              "interval over structure groups; thin: over seeds)")
