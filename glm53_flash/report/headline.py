"""REPORT.md and charts for `glm53 reproduce`, built only from the receipts in the run directory. Every
value from them is escaped for markdown (tables by markdown_table, values in prose by `md`, and every
prose line again by markdown_document), the receipts are
read within core.receipts.READ_LIMITS and the files are written inside the run directory only."""

from __future__ import annotations

from pathlib import Path

from glm53_flash.core.receipts import read_json, read_jsonl, write_text
from glm53_flash.evaluation.ledger import first_lines, report_rows
from glm53_flash.report.summary import RunSummary
from glm53_flash.report import figures
from glm53_flash.report.tables import MarkdownLine, markdown_document, markdown_escape as md, markdown_table
from glm53_flash.report.format import format_interval, format_p, format_signed

# The original's published confirmation numbers (seed-README "Result"), for side-by-side comparison.
ORIGINAL = {
    "greedy_trained": (0, 16, 24),
    "sampled_trained_solved": (9, 19, 24),
    "sampled_trained_exact": (13, 88, 192),
    "sampled_all_solved": (25, 34, 64),
    "mcnemar_p": 3.0518e-05,
}


def _read_jsonl(path: Path) -> list[dict]:
    return read_jsonl(path) if path.exists() else []


# --------------------------------------------------------------------------- chart data (numbers only)


def greedy_chart_data(summary: RunSummary) -> dict:
    """Greedy pass@1 on the trained families before RL and after it per seed, in percent, each after-RL
    bar with the receipts' 95% CI of the paired change drawn from the before level; the original
    miniature's published result as a rate, so it is comparable whatever the number of tasks."""
    seeds = summary.rl_seeds
    greedy = [summary.seeds[s]["greedy_trained"] for s in seeds]
    before = 100 * greedy[0]["before_solved"] / greedy[0]["tasks"]
    total = ORIGINAL["greedy_trained"][2]
    return {
        "tasks": greedy[0]["tasks"], "before": before, "before_solved": greedy[0]["before_solved"],
        "seeds": [{"seed": s, "after": 100 * g["after_solved"] / g["tasks"], "after_solved": g["after_solved"],
                   "interval": [before + 100 * g["rate_difference_ci"][0], before + 100 * g["rate_difference_ci"][1]]
                   if g.get("rate_difference_ci") else None} for s, g in zip(seeds, greedy)],
        "reference": {"value": 100 * ORIGINAL["greedy_trained"][1] / total,
                      "label": f"original after RL ({ORIGINAL['greedy_trained'][1]}/{total})"},
    }


def family_chart_data(summary: RunSummary) -> dict:
    """Per family and seed: the change in the exact sampled rate (points) with its 95% CI, trained
    families first."""
    seeds = summary.rl_seeds
    first = summary.seeds[seeds[0]]["sampled_by_family"]
    trained = [f for f in summary.trained_families if f in first]
    families = trained + [f for f in first if f not in trained]
    return {
        "families": families, "trained": trained, "seeds": seeds,
        "rollouts": {f: first[f]["rollouts"] for f in families},
        "change": {s: {f: 100 * summary.seeds[s]["sampled_by_family"][f]["rate_difference"] for f in families}
                   for s in seeds},
        "interval": {s: {f: [100 * x for x in summary.seeds[s]["sampled_by_family"][f]["rate_difference_ci"]]
                         for f in families} for s in seeds},
    }


def selection_chart_data(out: Path | None, summary: RunSummary) -> dict:
    """Exact dev rollouts per checkpoint: pretraining (from the summary) and, when the run directory
    holds them, every RL seed's selection receipt."""
    plan = summary.plan
    families = len(summary.trained_families) + len(summary.untrained_families)
    rl = {}
    for seed in summary.rl_seeds:
        path = out / f"rl-{seed}" / "selection-dev.json" if out is not None else None
        if path is not None and path.is_file():
            checkpoints = read_json(path)["checkpoints"]
            rl[seed] = [(e["step"], e["score"][0]) for e in checkpoints]
    return {
        "pretrain": [(e["step"], e["score"][0]) for e in summary.pretrain_selection["checkpoints"]],
        "pretrain_rollouts": plan.select_pretrain.per_family * families * plan.select_pretrain.samples,
        "rl": rl, "rl_rollouts": plan.select_rl.per_family * len(summary.trained_families) * plan.select_rl.samples,
    }


def learning_chart_data(out: Path | None, summary: RunSummary) -> dict | None:
    """Pretraining loss per step and each seed's RL mean reward (moving mean), from the metrics
    receipts; None when the run directory does not hold them (the committed results/ do not)."""
    if out is None or not (out / "pretrain" / "metrics.jsonl").is_file():
        return None
    rows = _read_jsonl(out / "pretrain" / "metrics.jsonl")
    rewards = {}
    window = 1
    for seed in summary.rl_seeds:
        m = _read_jsonl(out / f"rl-{seed}" / "metrics.jsonl")
        ys = [r["mean_reward"] for r in m]
        window = max(1, len(ys) // 12)
        smooth = [sum(ys[max(0, i - window + 1): i + 1]) / len(ys[max(0, i - window + 1): i + 1]) for i in range(len(ys))]
        rewards[seed] = ([r["last_group"] for r in m], smooth)
    return {"loss": ([r["step"] for r in rows], [r["loss"] for r in rows]), "rewards": rewards, "window": window,
            "batch": summary.plan.pretrain.batch_size,
            "group_size": summary.plan.rl.group_size, "invalid_penalty": summary.plan.rl.invalid_penalty}


# --------------------------------------------------------------------------- charts (drawing only)


def draw_greedy(data: dict, size=(6.4, 4.2), arm: str = "ours"):
    """Before RL (grey) and after RL per RL seed (the arm's colour), the original's published result as a
    dashed line."""
    with figures.style() as plt:
        fig, ax = plt.subplots(figsize=size)
        labels = ["before RL"] + [f"RL seed {row['seed']}" for row in data["seeds"]]
        values = [data["before"]] + [row["after"] for row in data["seeds"]]
        counts = [data["before_solved"]] + [row["after_solved"] for row in data["seeds"]]
        bars = ax.bar(labels, values, color=[figures.BEFORE] + [figures.colour(arm)] * len(data["seeds"]))
        figures.series("before RL", bars[0])
        figures.series(arm, *bars[1:])
        bars[0].set_label("before RL")
        bars[1].set_label(f"after RL ({arm}), one bar per RL seed")
        centres = [row["after"] for row in data["seeds"]]
        intervals = [row["interval"] for row in data["seeds"]]
        if any(intervals):
            ax.errorbar(range(1, len(values)), centres, yerr=figures.interval_errors(centres, intervals), fmt="none",
                        ecolor="black", capsize=5, label="95% interval of the change")
        for bar, count in zip(bars, counts):
            ax.annotate(f"{count}/{data['tasks']}", (bar.get_x() + bar.get_width() / 2, 0), xytext=(0, 4),
                        textcoords="offset points", ha="center", va="bottom", color="white", fontweight="bold")
        ax.set_ylim(0, 100)
        figures.reference_line(ax, data["reference"]["value"], data["reference"]["label"])
        figures.series("original", ax.lines[-1])
        figures.include_in_axis(ax, [i[1] for i in intervals if i])
        ax.set(ylabel=f"tasks solved, greedy (% of {data['tasks']})",
               title=f"Greedy pass@1, trained families, confirm split (n={data['tasks']})")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, frameon=False)
        fig.tight_layout()
    return fig


def draw_family_changes(data: dict, size=(11, 4.4), arm: str = "ours"):
    """Per family, the change RL made to the exact sampled rate: one bar per RL seed (shades of the arm's
    colour), hatched for the families RL never trained on."""
    with figures.style() as plt:
        fig, ax = plt.subplots(figsize=size, layout="constrained")
        families, seeds = data["families"], data["seeds"]
        width = 0.8 / max(1, len(seeds))
        shades = figures.seed_shades(arm, len(seeds))
        for j, seed in enumerate(seeds):
            xs = [i - 0.4 + width * (j + 0.5) for i in range(len(families))]
            values = [data["change"][seed][f] for f in families]
            intervals = [data["interval"][seed][f] for f in families]
            bars = ax.bar(xs, values, width, color=shades[j], label=f"RL seed {seed}",
                          hatch=[figures.UNTRAINED_HATCH if f not in data["trained"] else "" for f in families],
                          edgecolor="white", linewidth=0)
            figures.series(arm, bars)
            ax.errorbar(xs, values, yerr=figures.interval_errors(values, intervals), fmt="none", ecolor="black",
                        elinewidth=1, capsize=2)
        ax.axhline(0, color="black", lw=0.8)
        from glm53_flash.report.glossary import label

        ax.set_xticks(range(len(families)),
                      [label(f) + ("\n(trained)" if f in data["trained"] else "\n(untrained)") for f in families])
        from matplotlib.patches import Patch

        handles, _ = ax.get_legend_handles_labels()
        handles += [Patch(facecolor="white", edgecolor="0.3", label="trained by RL: solid"),
                    Patch(facecolor="white", edgecolor="0.3", hatch=figures.UNTRAINED_HATCH,
                          label="not trained: hatched")]
        rollouts = sorted(set(data["rollouts"].values()))
        n = "/".join(map(str, rollouts))
        ax.set(ylabel="change in exact completions (points)",
               title=f"Exact sampled completions per family, after RL minus before, 95% interval (n={n} per family)")
        figures.shared_legend(fig, handles)
    return fig


def selection_panel(ax, data: dict, phase: str, arm: str = "ours") -> None:
    """phase 'pretrain': exact dev rollouts per pretraining checkpoint; 'rl': one line per RL seed."""
    if phase == "pretrain":
        (line,) = ax.plot([s for s, _ in data["pretrain"]], [v for _, v in data["pretrain"]], marker="o",
                          color=figures.BEFORE)
        figures.series("before RL", line)
        ax.set(title=f"Dev selection, pretraining (n={data['pretrain_rollouts']} rollouts)", xlabel="pretraining step",
               ylabel="exact dev rollouts (count)")
        return
    for shade, (seed, points) in zip(figures.seed_shades(arm, len(data["rl"])), data["rl"].items()):
        lines = ax.plot([s for s, _ in points], [v for _, v in points], marker="o", color=shade,
                        label=f"RL seed {seed}")
        figures.series(arm, lines)
    ax.set(title=f"Dev selection, RL, {arm} arm (n={data['rl_rollouts']} rollouts)", xlabel="RL update (group)",
           ylabel="exact dev rollouts (count)")


def loss_panel(ax, data: dict) -> None:
    (line,) = ax.plot(*data["loss"], color=figures.BEFORE)
    figures.series("before RL", line)
    ax.set(title=f"Pretraining loss (batch of {data['batch']} sequences)", xlabel="pretraining step",
           ylabel="loss (nats per byte)")


def reward_panel(ax, data: dict, arm: str = "ours") -> None:
    """Each RL seed's mean reward per group (a moving mean), on the reward's whole range: from the invalid
    program's penalty to 1 (every sample passes)."""
    for shade, (seed, (xs, ys)) in zip(figures.seed_shades(arm, len(data["rewards"])), data["rewards"].items()):
        lines = ax.plot(xs, ys, color=shade, label=f"RL seed {seed}")
        figures.series(arm, lines)
    penalty = data.get("invalid_penalty", 0.0)
    ax.set_ylim(min(penalty, 0.0) - 0.02, 1.02)
    ax.set(title=f"RL reward: 1 pass, 0 fail, {penalty:g} refused\n(n={data['group_size']} samples per group)",
           xlabel="RL update (group)", ylabel=f"mean reward (moving mean of {data['window']})")


def draw_panels(panels, size=(11, 4), stacked: bool = False):
    """One figure, the given (panel function, data, *args) side by side (or one above the other). The
    panels' labelled lines (one colour per seed in every panel) share one legend under the figure, so
    no legend covers data."""
    with figures.style() as plt:
        fig, axes = plt.subplots(len(panels) if stacked else 1, 1 if stacked else len(panels), figsize=size,
                                 squeeze=False, layout="constrained")
        for ax, (panel, *args) in zip(axes.flat, panels):
            panel(ax, *args)
        figures.shared_legend(fig)
    return fig


def draw_selection(data: dict, size=(11, 4), arm: str = "ours"):
    return draw_panels([(selection_panel, data, "pretrain")] + ([(selection_panel, data, "rl", arm)] if data["rl"]
                                                                else []), size)


def draw_learning(data: dict, size=(11, 4), arm: str = "ours"):
    return draw_panels([(loss_panel, data), (reward_panel, data, arm)], size)


def run_arm(out: Path) -> str:
    """The arm a run directory belongs to, for its colour: a two-arm reproduce directory names its arms'
    directories after them (faithful/, ours/); any other run is drawn as ours."""
    from glm53_flash.report.figures import ARM_COLOURS

    return out.name if out.name in ARM_COLOURS else "ours"


def make_charts(out: Path, summary: RunSummary) -> dict[str, str]:
    charts = out / "charts"
    figures_by_name = {
        "learning_curves": ("learning-curves.png", draw_learning, learning_chart_data(out, summary)),
        "selection_curves": ("dev-selection.png", draw_selection, selection_chart_data(out, summary)),
        "family_bars": ("family-before-after.png", draw_family_changes, family_chart_data(summary)),
        "per_seed": ("per-seed-greedy.png", draw_greedy, greedy_chart_data(summary)),
    }
    paths = {}
    for key, (name, draw, data) in figures_by_name.items():
        if data is None:
            continue
        figures.save_png(draw(data, arm=run_arm(out)), charts / name, within=out)
        paths[key] = f"charts/{name}"
    return paths


def metric_rows(results: dict, seeds: list[str], k: int) -> list[tuple[str, str, str, list[str]]]:
    """A sealed split's paired results as table rows: (metric, its key in ORIGINAL, before RL, after RL
    per seed). Confirm's table sets them beside the original's counts; holdout's has none."""
    def counts(key: str, what: str, total: str) -> tuple[str, list[str]]:
        rows = [results[s][key] for s in seeds]
        return (md(f"{rows[0]['before_' + what]}/{rows[0][total]}"),
                [md(f"{r['after_' + what]}/{r[total]}") for r in rows])

    return [("greedy pass@1, trained families", "greedy_trained", *counts("greedy_trained", "solved", "tasks")),
            (f"sampled pass@{k}, trained families", "sampled_trained_solved",
             *counts("sampled_trained", "solved", "tasks")),
            ("exact sampled completions, trained families", "sampled_trained_exact",
             *counts("sampled_trained", "exact", "rollouts")),
            (f"sampled pass@{k}, all eight families", "sampled_all_solved", *counts("sampled_all", "solved", "tasks"))]


def gains_cells(results: dict, seeds: list[str]) -> list[str]:
    """Greedy gains / losses on the trained families and their McNemar p (pooled over tasks), per seed."""
    return [md(f"{g['gains']} / {g['losses']} ({format_p(g['mcnemar_p'])})")
            for g in (results[s]["greedy_trained"] for s in seeds)]


UNITS_ROW = "greedy units better / worse (sign-flip p over units)"
GAINS_ROW = "greedy tasks gained / lost (McNemar p, tasks pooled)"


def unit_cells(results: dict, seeds: list[str]) -> list[str]:
    """Greedy units (distinct functions: a family) better / worse after RL and the exact sign-flip p over
    units, per seed; '' for a summary that predates units."""
    cells = []
    for g in (results[s]["greedy_trained"] for s in seeds):
        units = g.get("units")
        cells.append("" if units is None else
                     md(f"{units['better']} / {units['worse']} of {units['units']} ({format_p(units['sign_flip_p'])})"))
    return cells


def result_table(summary: RunSummary) -> list[str]:
    seeds = summary.rl_seeds
    k = summary.plan.confirm_sampled.samples
    header = "| confirmation metric | original before | original after | ours before | " + \
             " | ".join(f"ours after (seed {s})" for s in seeds) + " |"
    lines = [header, "|---|---:|---:|---:|" + "---:|" * len(seeds)]
    for name, key, before, afters in metric_rows(summary.seeds, seeds, k):
        original = ORIGINAL[key]
        lines.append(f"| {name} | {original[0]}/{original[2]} | {original[1]}/{original[2]} | {before} | "
                     + " | ".join(afters) + " |")
    lines.append(f"| {GAINS_ROW} | | 16 / 0 ({format_p(ORIGINAL['mcnemar_p'])}) | | "
                 + " | ".join(gains_cells(summary.seeds, seeds)) + " |")
    lines.append(f"| {UNITS_ROW} | | | | " + " | ".join(unit_cells(summary.seeds, seeds)) + " |")
    return lines


def holdout_lines(summary: RunSummary) -> list[str]:
    """The holdout split's results (sealed until this plan first opened it): the same paired statistics
    as confirm's, per RL seed, and the strong set."""
    holdout = summary.holdout
    seeds = summary.rl_seeds
    k = summary.plan.holdout_sampled.samples
    rows = [[name, before, *afters] for name, _, before, afters in metric_rows(holdout.seeds, seeds, k)]
    rows.append([GAINS_ROW, "", *gains_cells(holdout.seeds, seeds)])
    rows.append([UNITS_ROW, "", *unit_cells(holdout.seeds, seeds)])
    columns = ["holdout metric", "before RL", *[f"after (seed {s})" for s in seeds]]
    openings = first_lines(holdout.ledger)
    opened = (f"The ledger records {len(openings)} opening(s) of the holdout split for this plan"
              + (f", the first at {md(openings[0]['utc'])} (commit {md(openings[0]['commit'][:7])})" if openings else "")
              + ("; each later one was a reopening with its reason (table below)." if len(openings) > 1 else "."))
    strong = holdout.strong_tests or {}
    false_passes = ", ".join(md(f"{name} {r['greedy']['false_passes']}") for name, r in strong.items())
    return ["## Holdout split (sealed until this plan first opened it)", "",
            ("Opened after all selection" if holdout.opened_after_selection else
             "WARNING: a holdout receipt predates a selection receipt") + f" (first receipt {md(holdout.first_opened_utc)}). "
            + opened, "", *markdown_table(columns, rows), "",
            *([f"Greedy false passes (pass the three cases, fail the strong set): {false_passes}.", ""] if strong else []),
            *ledger_table(holdout.ledger, "holdout")]


def goal_lines(summary: RunSummary) -> list[str]:
    """The issue's goals, checked per seed: greedy trained-family pass@1 at least the original's with
    no losses, and no untrained family dropping beyond its confidence interval."""
    target = ORIGINAL["greedy_trained"][1]
    seeds = summary.seeds
    met = [s for s, v in seeds.items()
           if v["greedy_trained"]["after_solved"] >= target and v["greedy_trained"]["losses"] == 0]
    clean = [s for s, v in seeds.items() if not any(f["significant_drop"] for f in v["untrained_interference"].values())]
    return [
        f"Goal 1, greedy confirm pass@1 on the trained families >= {target}/24 with no losses: "
        + (f"**reached on {len(met)} of {len(seeds)} seeds**" if met else f"**not reached on any of {len(seeds)} seeds**")
        + (f" ({md(', '.join(met))})." if met else "."),
        "",
        f"Goal 2, no untrained family drops by more than its confidence interval allows: "
        f"**{'met' if len(clean) == len(seeds) else 'not met'}** ({len(clean)} of {len(seeds)} seeds clean).",
    ]


def _stage_order(name: str) -> tuple:
    prefixes = ("pretrain", "select_pretrain", "rl_", "select_rl_", "confirm")
    return (next((i for i, p in enumerate(prefixes) if name.startswith(p)), len(prefixes)), name)


def confirm_history(summary: RunSummary) -> str:
    """One sentence on how often the confirm split was opened for this plan, from the ledger lines the
    summary carries."""
    lines = summary.ledger
    openings = first_lines(lines)
    if len(openings) <= 1:
        return (f"The ledger records one opening of the confirm split for this plan ({len(lines)} receipts); "
                "nothing else has evaluated on it for this plan.")
    reasons = md("; ".join(dict.fromkeys(str(line["reopen"]) for line in lines if line["reopen"])))  # ledger order
    return (f"The ledger records {len(openings)} openings of the confirm split for this plan (reopened: "
            f"{reasons or 'no reason recorded'}): its numbers are no longer from an untouched split.")


def strong_test_lines(summary: RunSummary) -> list[str]:
    """The confirm results under the three original cases and under the strong set, per arm, with the
    false passes (pass the three, fail the strong set); nothing when the receipts predate the strong set."""
    strong = summary.strong_tests
    if not strong:
        return []
    rows = []
    for arm, r in strong.items():
        g, s = r["greedy"], r["sampled"]
        rows.append([arm, f"{g['tasks_solved']}/{g['tasks_total']}", f"{g['tasks_solved_strong']}/{g['tasks_total']}",
                     g["false_passes"], f"{s['exact_rollouts']}/{s['rollouts_total']}",
                     f"{s['exact_rollouts_strong']}/{s['rollouts_total']}", s["false_pass_rollouts"]])
    columns = ["arm", "greedy, 3 cases", "greedy, strong set", "false passes", "sampled exact, 3 cases",
               "sampled exact, strong set", "false-pass rollouts"]
    return ["## The original three cases versus the strong set", "",
            "Each task's three hidden cases are the original's; the strong set adds 50 or more cases generated "
            "from the reference (zero, negatives, large numbers, empty and long inputs). Rewards and selection "
            "never see it.", "", *markdown_table(columns, rows), ""]


def ledger_table(lines: list[dict], split: str = "confirm") -> list[str]:
    """The ledger lines of this plan's openings of `split` as a markdown table (nothing without lines)."""
    if not lines:
        return []
    columns, rows = report_rows(lines)
    return [f"### Ledger lines ({split} split, this plan)", "", *markdown_table(columns, rows), ""]


def load_summary(path: str | Path) -> RunSummary:
    """A headline run's summary.json, every field checked before anything is built from it (a corrupt
    one is a one-line ValueError): report/summary.py."""
    return RunSummary.read(path)


def build_report(out: str | Path) -> Path:
    out = Path(out)
    summary = load_summary(out / "summary.json")
    charts = make_charts(out, summary)
    seeds = summary.rl_seeds
    trained = md(", ".join(summary.trained_families))
    plan = summary.plan
    k = plan.confirm_sampled.samples
    lines = [
        f"# Headline experiment ({md(summary.preset)} preset)",
        "",
        "Every number below is read from the receipts in this directory (`summary.json` is computed from "
        "them by `glm53 reproduce`).",
        "",
        f"Pipeline: pretrain the `{md(plan.pretrain.preset)}` model for {md(plan.pretrain.steps)} steps -> select a "
        f"checkpoint on dev ({md(summary.pretrain_selection['rule'])}; selected "
        f"`{md(Path(summary.pretrain_selection['selected']).name)}`) -> RLOO on {trained} with "
        f"{md(plan.rl.groups)} groups x {md(plan.rl.group_size)} samples for each of {len(seeds)} seeds -> select each "
        f"RL run's checkpoint on dev -> open the confirm split.",
        "",
        md(summary.precision_line),
        "",
        ("The confirm split was opened only after all selection was done (first confirm receipt "
         f"{md(summary.first_confirm_utc)}, last selection receipt {md(summary.last_selection_utc)})."
         if summary.confirm_opened_after_selection else
         "WARNING: a confirm receipt predates a selection receipt; the confirm split was not held out."),
        "",
        confirm_history(summary),
        "",
        *ledger_table(summary.ledger),
        "## Result, side by side with the original's published numbers",
        "",
        *result_table(summary),
        "",
        *goal_lines(summary),
        "",
        *strong_test_lines(summary),
        *holdout_lines(summary),
        MarkdownLine(f"![per-seed greedy]({charts['per_seed']})"),
        "",
        "## Per seed",
        "",
    ]
    for seed in seeds:
        s = summary.seeds[seed]
        g = s["greedy_trained"]
        t = s["sampled_trained"]
        verdict = "no losses" if g["losses"] == 0 else f"{g['losses']} losses"
        lines += [
            f"### seed {md(seed)} (selected `{md(Path(s['selected_checkpoint']).name)}`)",
            "",
            "- greedy pass@1 on the trained families: "
            + md(f"{g['before_solved']}/{g['tasks']} -> {g['after_solved']}/{g['tasks']}, {g['gains']} gains and {verdict}")
            + f", exact McNemar p = {format_p(g['mcnemar_p'])} (pooled over tasks)"
            + ("." if "units" not in g else
               "; over its " + md(f"{g['units']['units']} units, {g['units']['better']} better and {g['units']['worse']} worse")
               + f", exact sign-flip p = {format_p(g['units']['sign_flip_p'])}."),
            f"- sampled exact rate on the trained families: {100 * t['before_rate']:.1f}% -> "
            f"{100 * t['after_rate']:.1f}% ({format_signed(t['rate_difference'], scale=100)} points, 95% "
            f"task-bootstrap CI {format_interval(t['rate_difference_ci'], scale=100)}).",
        ]
        drops = [f for f, v in s["untrained_interference"].items() if v["significant_drop"]]
        parts = []
        for family, v in s["untrained_interference"].items():
            parts.append(md(f"{family} {v['before_exact']}->{v['after_exact']}/{v['rollouts']}") + " "
                         f"(CI {format_interval(v['ci'], scale=100)})")
        lines.append("- untrained families (exact sampled completions, CI of the rate change in points): "
                     + "; ".join(parts) + ".")
        lines.append("- interference: " + (f"RL lowered {md(', '.join(drops))}: the 95% bootstrap CI of the rate "
                                            "change lies below zero (a description over the family's tasks, not "
                                            "a test; no multiplicity control)." if drops else
                                            "no untrained family dropped by more than its confidence interval "
                                            "allows."))
        lines.append("")
    lines += [
        "## Charts",
        "",
        *[line for key, alt in (("learning_curves", "learning curves"), ("selection_curves", "dev selection"),
                                ("family_bars", "per family")) if key in charts
          for line in (MarkdownLine(f"![{alt}]({charts[key]})"), "")],
        "## Time per stage (seconds, this machine)",
        "",
        "| stage | seconds |",
        "|---|---:|",
        *[f"| {md(name)} | {seconds:.0f} |" for name, seconds in sorted(summary.stage_seconds.items(),
                                                                     key=lambda kv: _stage_order(kv[0]))],
        f"| **total** | {sum(summary.stage_seconds.values()):.0f} |",
        "",
        "## What this measures",
        "",
        f"Confirm tasks differ from training tasks only by a random 7-letter function name; the descriptions, "
        f"bodies and the three hidden tests are the same in every split and in pretraining. The statistics "
        f"describe this synthetic benchmark, not general coding ability. Greedy statistics use {md(summary.seeds[seeds[0]]['greedy_trained']['tasks'])} "
        f"trained-family tasks" + (f" in {md(summary.seeds[seeds[0]]['greedy_trained']['units']['units'])} units "
                                   f"(distinct functions: a family's two descriptions compute the same function, "
                                   f"and its tasks differ only in that description and the function name, so they "
                                   f"are not independent)"
                                   if "units" in summary.seeds[seeds[0]]['greedy_trained'] else "")
        + f"; sampled ones use {k} samples per task.",
    ]
    return write_text(out / "REPORT.md", markdown_document(lines) + "\n", within=out)
