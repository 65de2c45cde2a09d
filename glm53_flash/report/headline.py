"""REPORT.md and charts for `glm53 reproduce`, built only from the receipts in the run directory."""

from __future__ import annotations

import json
from pathlib import Path

from ..reproduce import ReproducePlan
from ..stats import format_p

# The original's published confirmation numbers (seed-README "Result"), for side-by-side comparison.
ORIGINAL = {
    "greedy_trained": (0, 16, 24),
    "sampled_trained_solved": (9, 19, 24),
    "sampled_trained_exact": (13, 88, 192),
    "sampled_all_solved": (25, 34, 64),
    "mcnemar_p": 3.0518e-05,
}


def seed_order(summary: dict) -> list[str]:
    """RL seeds in the plan's order (JSON receipts store them with sorted keys)."""
    return [str(seed) for seed in summary["plan"]["rl_seeds"]]


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def make_charts(out: Path, summary: dict) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    charts = out / "charts"
    charts.mkdir(exist_ok=True)
    paths = {}
    seeds = seed_order(summary)

    # learning curves: pretraining loss; RL mean reward per update for every seed
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    rows = _read_jsonl(out / "pretrain" / "metrics.jsonl")
    ax1.plot([r["step"] for r in rows], [r["loss"] for r in rows], color="tab:blue")
    ax1.set(title="Pretraining loss", xlabel="step", ylabel="token cross-entropy")
    for seed in seeds:
        m = _read_jsonl(out / f"rl-{seed}" / "metrics.jsonl")
        xs = [r["last_group"] for r in m]
        ys = [r["mean_reward"] for r in m]
        window = max(1, len(ys) // 12)
        smooth = [sum(ys[max(0, i - window + 1): i + 1]) / len(ys[max(0, i - window + 1): i + 1]) for i in range(len(ys))]
        ax2.plot(xs, smooth, label=f"seed {seed}")
    ax2.set(title="RL mean reward (moving mean)", xlabel="group", ylabel="reward")
    ax2.legend()
    fig.tight_layout()
    paths["learning_curves"] = str(charts / "learning-curves.png")
    fig.savefig(paths["learning_curves"], dpi=110)
    plt.close(fig)

    # dev selection curves
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    pre = summary["pretrain_selection"]["checkpoints"]
    ax1.plot([e["step"] for e in pre], [e["score"][0] for e in pre], marker="o")
    ax1.set(title="Dev selection: pretraining checkpoints", xlabel="step", ylabel="exact dev rollouts")
    for seed in seeds:
        sel = json.loads((out / f"rl-{seed}" / "selection-dev.json").read_text())
        ax2.plot([e["step"] for e in sel["checkpoints"]], [e["score"][0] for e in sel["checkpoints"]],
                 marker="o", label=f"seed {seed}")
    ax2.set(title="Dev selection: RL checkpoints", xlabel="group", ylabel="exact dev rollouts")
    ax2.legend()
    fig.tight_layout()
    paths["selection_curves"] = str(charts / "dev-selection.png")
    fig.savefig(paths["selection_curves"], dpi=110)
    plt.close(fig)

    # per-family before/after sampled exact rate
    families = list(summary["seeds"][seeds[0]]["sampled_by_family"])
    fig, ax = plt.subplots(figsize=(11, 4))
    width = 0.8 / (len(seeds) + 1)
    first = summary["seeds"][seeds[0]]["sampled_by_family"]
    ax.bar([i for i in range(len(families))], [first[f]["before_rate"] for f in families], width, label="before RL",
           color="gray")
    for j, seed in enumerate(seeds, start=1):
        rows = summary["seeds"][seed]["sampled_by_family"]
        ax.bar([i + j * width for i in range(len(families))], [rows[f]["after_rate"] for f in families], width,
               label=f"after RL, seed {seed}")
    ax.set_xticks([i + width * len(seeds) / 2 for i in range(len(families))], families, rotation=20)
    ax.set(title="Confirm split: fraction of exact sampled completions per family", ylabel="exact rate",
           ylim=(0, 1.05))
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths["family_bars"] = str(charts / "family-before-after.png")
    fig.savefig(paths["family_bars"], dpi=110)
    plt.close(fig)

    # per-seed greedy result on the trained families
    fig, ax = plt.subplots(figsize=(6, 4))
    greedy = [summary["seeds"][s]["greedy_trained"] for s in seeds]
    ax.bar(["before"] + [f"seed {s}" for s in seeds], [greedy[0]["before_solved"]] + [g["after_solved"] for g in greedy],
           color=["gray"] + ["tab:green"] * len(seeds))
    ax.axhline(ORIGINAL["greedy_trained"][1], color="tab:red", linestyle="--", label="original after RL")
    ax.set(title="Greedy pass@1, trained families (confirm)", ylabel=f"tasks solved of {greedy[0]['tasks']}")
    ax.legend()
    fig.tight_layout()
    paths["per_seed"] = str(charts / "per-seed-greedy.png")
    fig.savefig(paths["per_seed"], dpi=110)
    plt.close(fig)
    return {k: str(Path(v).relative_to(out)) for k, v in paths.items()}


def result_table(summary: dict) -> list[str]:
    seeds = seed_order(summary)
    k = ReproducePlan.from_dict(summary["plan"]).confirm_sampled.samples
    header = "| confirmation metric | original before | original after | ours before | " + \
             " | ".join(f"ours after (seed {s})" for s in seeds) + " |"
    lines = [header, "|---|---:|---:|---:|" + "---:|" * len(seeds)]

    def row(name, original, before, afters):
        lines.append(f"| {name} | {original[0]}/{original[2]} | {original[1]}/{original[2]} | {before} | "
                     + " | ".join(afters) + " |")

    g = [summary["seeds"][s]["greedy_trained"] for s in seeds]
    row("greedy pass@1, trained families", ORIGINAL["greedy_trained"], f"{g[0]['before_solved']}/{g[0]['tasks']}",
        [f"{x['after_solved']}/{x['tasks']}" for x in g])
    t = [summary["seeds"][s]["sampled_trained"] for s in seeds]
    row(f"sampled pass@{k}, trained families", ORIGINAL["sampled_trained_solved"],
        f"{t[0]['before_solved']}/{t[0]['tasks']}", [f"{x['after_solved']}/{x['tasks']}" for x in t])
    row("exact sampled completions, trained families", ORIGINAL["sampled_trained_exact"],
        f"{t[0]['before_exact']}/{t[0]['rollouts']}", [f"{x['after_exact']}/{x['rollouts']}" for x in t])
    a = [summary["seeds"][s]["sampled_all"] for s in seeds]
    row(f"sampled pass@{k}, all eight families", ORIGINAL["sampled_all_solved"],
        f"{a[0]['before_solved']}/{a[0]['tasks']}", [f"{x['after_solved']}/{x['tasks']}" for x in a])
    lines.append(f"| greedy gains / losses (McNemar p) | | 16 / 0 ({format_p(ORIGINAL['mcnemar_p'])}) | | "
                 + " | ".join(f"{x['gains']} / {x['losses']} ({format_p(x['mcnemar_p'])})" for x in g) + " |")
    return lines


def goal_lines(summary: dict) -> list[str]:
    """The issue's goals, checked per seed: greedy trained-family pass@1 at least the original's with
    no losses, and no untrained family dropping beyond its confidence interval."""
    target = ORIGINAL["greedy_trained"][1]
    seeds = summary["seeds"]
    met = [s for s, v in seeds.items()
           if v["greedy_trained"]["after_solved"] >= target and v["greedy_trained"]["losses"] == 0]
    clean = [s for s, v in seeds.items() if not any(f["significant_drop"] for f in v["untrained_interference"].values())]
    return [
        f"Goal 1, greedy confirm pass@1 on the trained families >= {target}/24 with no losses: "
        + (f"**reached on {len(met)} of {len(seeds)} seeds**" if met else f"**not reached on any of {len(seeds)} seeds**")
        + (f" ({', '.join(met)})." if met else "."),
        "",
        f"Goal 2, no untrained family drops by more than its confidence interval allows: "
        f"**{'met' if len(clean) == len(seeds) else 'not met'}** ({len(clean)} of {len(seeds)} seeds clean).",
    ]


def _stage_order(name: str) -> tuple:
    prefixes = ("pretrain", "select_pretrain", "rl_", "select_rl_", "confirm")
    return (next((i for i, p in enumerate(prefixes) if name.startswith(p)), len(prefixes)), name)


def build_report(out: str | Path) -> Path:
    out = Path(out)
    summary = json.loads((out / "summary.json").read_text())
    charts = make_charts(out, summary)
    seeds = seed_order(summary)
    trained = ", ".join(summary["trained_families"])
    plan = ReproducePlan.from_dict(summary["plan"])
    k = plan.confirm_sampled.samples
    lines = [
        f"# Headline experiment ({summary['preset']} preset)",
        "",
        "Every number below is read from the receipts in this directory (`summary.json` is computed from "
        "them by `glm53 reproduce`).",
        "",
        f"Pipeline: pretrain the `{plan.pretrain.preset}` model for {plan.pretrain.steps} steps -> select a "
        f"checkpoint on dev ({summary['pretrain_selection']['rule']}; selected "
        f"`{Path(summary['pretrain_selection']['selected']).name}`) -> RLOO on {trained} with "
        f"{plan.rl.groups} groups x {plan.rl.group_size} samples for each of {len(seeds)} seeds -> select each "
        f"RL run's checkpoint on dev -> open the confirm split.",
        "",
        ("The confirm split was opened only after all selection was done (first confirm receipt "
         f"{summary['first_confirm_utc']}, last selection receipt {summary['last_selection_utc']})."
         if summary["confirm_opened_after_selection"] else
         "WARNING: a confirm receipt predates a selection receipt; the confirm split was not held out."),
        "",
        "## Result, side by side with the original's published numbers",
        "",
        *result_table(summary),
        "",
        *goal_lines(summary),
        "",
        f"![per-seed greedy]({charts['per_seed']})",
        "",
        "## Per seed",
        "",
    ]
    for seed in seeds:
        s = summary["seeds"][seed]
        g = s["greedy_trained"]
        t = s["sampled_trained"]
        low, high = t["rate_difference_ci"]
        verdict = "no losses" if g["losses"] == 0 else f"{g['losses']} losses"
        lines += [
            f"### seed {seed} (selected `{Path(s['selected_checkpoint']).name}`)",
            "",
            f"- greedy pass@1 on the trained families: {g['before_solved']}/{g['tasks']} -> {g['after_solved']}/"
            f"{g['tasks']}, {g['gains']} gains and {verdict}, exact McNemar p = {format_p(g['mcnemar_p'])}.",
            f"- sampled exact rate on the trained families: {100 * t['before_rate']:.1f}% -> "
            f"{100 * t['after_rate']:.1f}% ({100 * t['rate_difference']:+.1f} points, 95% task-bootstrap CI "
            f"[{100 * low:+.1f}, {100 * high:+.1f}]).",
        ]
        drops = [f for f, v in s["untrained_interference"].items() if v["significant_drop"]]
        parts = []
        for family, v in s["untrained_interference"].items():
            parts.append(f"{family} {v['before_exact']}->{v['after_exact']}/{v['rollouts']} "
                         f"(CI [{100 * v['ci'][0]:+.1f}, {100 * v['ci'][1]:+.1f}])")
        lines.append("- untrained families (exact sampled completions, CI of the rate change in points): "
                     + "; ".join(parts) + ".")
        lines.append("- interference: " + (f"RL made {', '.join(drops)} significantly worse (the CI of the "
                                            "change lies below zero)." if drops else
                                            "no untrained family dropped by more than its confidence interval "
                                            "allows."))
        lines.append("")
    lines += [
        "## Charts",
        "",
        f"![learning curves]({charts['learning_curves']})",
        "",
        f"![dev selection]({charts['selection_curves']})",
        "",
        f"![per family]({charts['family_bars']})",
        "",
        "## Time per stage (seconds, this machine)",
        "",
        "| stage | seconds |",
        "|---|---:|",
        *[f"| {name} | {seconds:.0f} |" for name, seconds in sorted(summary["stage_seconds"].items(),
                                                                     key=lambda kv: _stage_order(kv[0]))],
        f"| **total** | {sum(summary['stage_seconds'].values()):.0f} |",
        "",
        "## What this measures",
        "",
        f"Confirm tasks differ from training tasks only by a random 7-letter function name; the descriptions, "
        f"bodies and the three hidden tests are the same in every split and in pretraining. The statistics "
        f"describe this synthetic benchmark, not general coding ability. Greedy statistics use {summary['seeds'][seeds[0]]['greedy_trained']['tasks']} "
        f"trained-family tasks; sampled ones use {k} samples per task.",
    ]
    path = out / "REPORT.md"
    path.write_text("\n".join(lines) + "\n")
    return path
