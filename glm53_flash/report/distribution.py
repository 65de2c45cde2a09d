"""The headline as a distribution: its chart, the tables and sentences of its REPORT.md (which
experiments/headline_distribution.py writes) and the README's headline block, built only from
distribution.json (itself built from the runs' receipts)."""

from __future__ import annotations

from pathlib import Path

from glm53_flash.report.format import format_p
from glm53_flash.report.tables import markdown_table

CHART_FILE = "distribution.png"
PRECISION_MARKERS = {"fp32": "o", "bf16": "D"}
ARM_NAMES = {"faithful": "faithful (the original's recipe)", "ours": "ours (our defaults)"}


def _cell(summary: dict, arm: str, precision: str) -> dict | None:
    return summary["cells"].get(f"{arm}/{precision}")


def _cells(summary: dict) -> list[tuple[str, str, dict]]:
    plan = summary["plan"]
    return [(arm, precision, cell) for arm in plan["arms"] for precision in plan["precisions"]
            if (cell := _cell(summary, arm, precision)) is not None]


def distribution_figure(summary: dict):
    """Confirm (of 24) and holdout (of 96) after RL, one point per draw (pretraining seed x RL seed),
    a box per arm and precision, the original's 16/24 as a dashed line."""
    from glm53_flash.report.figures import ARM_COLOURS, REFERENCE, pyplot, series, style

    plt = pyplot()
    cells = _cells(summary)
    with style():
        fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
        for ax, key, total, title in ((axes[0], "confirm_after", 24, "confirm split after RL (of 24 tasks)"),
                                      (axes[1], "holdout_after", 96, "holdout split after RL (of 96 tasks)")):
            for position, (arm, precision, _) in enumerate(cells):
                values = [r[key] for r in summary["draws"] if r["arm"] == arm and r["precision"] == precision]
                ax.boxplot([values], positions=[position], widths=0.5, showfliers=False,
                           medianprops={"color": "black"}, boxprops={"color": "0.4"}, whiskerprops={"color": "0.4"},
                           capprops={"color": "0.4"})
                offsets = [((i * 37) % 11 - 5) * 0.03 for i in range(len(values))]  # a fixed jitter
                series(arm, ax.scatter([position + o for o in offsets], values, s=18, alpha=0.75,
                                       color=ARM_COLOURS.get(arm), marker=PRECISION_MARKERS.get(precision, "o"),
                                       zorder=3))
            ax.set_xticks(range(len(cells)), [f"{arm}\n{precision}" for arm, precision, _ in cells])
            ax.set_ylim(-0.5, total + 0.5)
            ax.set_ylabel("tasks solved (greedy)")
            ax.set_title(title)
            if key == "confirm_after":
                series("original", ax.axhline(16, color=REFERENCE, linestyle="--", linewidth=1.5))
        handles = [plt.Line2D([], [], color=ARM_COLOURS[a], marker="o", linestyle="", label=ARM_NAMES[a])
                   for a in summary["plan"]["arms"]]
        handles += [plt.Line2D([], [], color="0.3", marker=PRECISION_MARKERS[p], linestyle="", label=p)
                    for p in summary["plan"]["precisions"]]
        handles.append(plt.Line2D([], [], color=REFERENCE, linestyle="--", label="the original's published 16/24"))
        fig.legend(handles=handles, loc="lower center", ncol=(len(handles) + 1) // 2, frameon=False)
        fig.tight_layout(rect=(0, 0.15, 1, 1))
    return fig


def write_chart(summary: dict, path: str | Path) -> Path:
    from glm53_flash.report.figures import save_png

    fig = distribution_figure(summary)
    save_png(fig, path)
    return Path(path)


def cell_rows(summary: dict) -> tuple[list[str], list[list[str]]]:
    """One row per arm and precision: draws, confirm and holdout after RL (median, quartiles, range), how
    often RL took off, and where the original's 16/24 falls."""
    rule = summary["plan"]["takeoff_min_exact"]
    rows = []
    for arm, precision, cell in _cells(summary):
        c, h, place = cell["confirm_after"], cell["holdout_after"], cell["original_place"]
        rows.append([arm, precision, f"{len(cell['pretrain_seeds'])} x {cell['draws'] // max(len(cell['pretrain_seeds']), 1)}",
                     f"{c['median']:g} ({c['q1']:g}-{c['q3']:g}; {c['min']}-{c['max']})",
                     f"{h['median']:g} ({h['q1']:g}-{h['q3']:g}; {h['min']}-{h['max']})",
                     f"{cell['took_off']} of {cell['draws']}",
                     f"{place['above']} above, {place['equal']} equal, {place['below']} below"])
    columns = ["arm", "precision", "draws (pretraining x RL seeds)", "confirm after RL /24: median (quartiles; range)",
               "holdout after RL /96", f"RL took off (>= {rule} exact rollouts)", "draws vs the original's 16/24"]
    return columns, rows


def effect_text(test: dict, unit: str, scale: float = 1.0) -> str:
    if test["mean"] is None:
        return "not run"
    low, high = test["interval"] if test["interval"] else (None, None)
    interval = "" if low is None else f", 95% interval {scale * low:+.2f} to {scale * high:+.2f}"
    return f"{scale * test['mean']:+.2f} {unit}{interval}"


def primary_rows(summary: dict) -> tuple[list[str], list[list[str]]]:
    rows = []
    for name, test in summary["primary"].items():
        unit = "of a seed's RL runs" if name.startswith("takeoff") else "tasks"
        rows.append([name, str(len(test["seeds"])), effect_text(test, unit),
                     "n/a" if test["p"] is None else format_p(test["p"]),
                     "n/a" if test.get("p_holm") is None else format_p(test["p_holm"]),
                     "holds" if test.get("holds") else "not shown"])
    return ["comparison (second - first)", "pretraining seeds", "mean difference over seeds", "sign-flip p",
            "Holm p", "result"], rows


def statements(summary: dict) -> list[str]:
    """The three plain sentences: what holds, what does not, what varies with the CPU."""
    primary = summary["primary"]
    held = [name for name, t in primary.items() if t.get("holds")]
    not_shown = [name for name, t in primary.items() if t.get("p_holm") is not None and not t.get("holds")]
    untested = [name for name, t in primary.items() if t.get("p_holm") is None]
    alpha = summary["plan"]["alpha"]
    n = len({row["pretrain_seed"] for row in summary["draws"]})
    first = ("**Holds** (Holm over the primary family, at pretraining seeds): " + "; ".join(
        f"{name} ({effect_text(primary[name], 'tasks' if 'confirm' in name else 'of the RL runs')}, Holm p "
        f"{format_p(primary[name]['p_holm'])})" for name in held) + "." if held else
             f"**Holds:** nothing in the primary family at alpha {alpha} after Holm.")
    second = ("**Not shown:** " + "; ".join(f"{name} (Holm p {format_p(primary[name]['p_holm'])})" for name in not_shown)
              + "." if not_shown else "**Not shown:** nothing.")
    if untested:
        second += " Not yet run: " + "; ".join(untested) + "."
    cells = {f"{a}/{p}": c for a, p, c in _cells(summary)}
    varies = []
    for arm in summary["plan"]["arms"]:
        parts = [f"{p} {cells[f'{arm}/{p}']['took_off']} of {cells[f'{arm}/{p}']['draws']}"
                 for p in summary["plan"]["precisions"] if f"{arm}/{p}" in cells]
        if parts:
            varies.append(f"{arm}: RL took off in " + ", ".join(parts))
    third = ("**Varies with the CPU's arithmetic:** the same seeds give other results in fp32 and in bf16 ("
             + "; ".join(varies) + f" draws over {n} pretraining seeds), so one run is one draw from these "
             f"distributions.")
    planned = len(summary["plan"]["pretrain_seeds"])
    if n < planned:
        floor = 2 / 2 ** n if n else 1.0
        holm_floor = min(1.0, len(primary) * floor)
        verdict = ("so no comparison can hold yet" if holm_floor > alpha else
                   "so what holds now is an interim look")
        progress = (f"**In progress:** {n} of the plan's {planned} pretraining seeds have run (the table counts "
                    f"each cell's draws). With {n} seeds the smallest possible two-sided sign-flip p is "
                    f"{format_p(floor)}, {format_p(holm_floor)} after Holm over the {len(primary)} primary "
                    f"comparisons, {verdict}; the tests are the plan's, for all {planned} seeds.")
        return [progress, first, second, third]
    return [first, second, third]


def headline_block(summary: dict, chart: str) -> list[str]:
    """The README's headline: the chart, one table, three sentences (at most 40 lines)."""
    columns, rows = cell_rows(summary)
    return [f"![confirm and holdout after RL, every draw]({chart})", "", *markdown_table(columns, rows), "",
            *[f"- {s}" for s in statements(summary)]]


__all__ = ["CHART_FILE", "cell_rows", "distribution_figure", "effect_text", "headline_block",
           "primary_rows", "statements", "write_chart"]
