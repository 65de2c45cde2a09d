"""RL-switches study: which of the three RL switches that differ between the arms matters?

The faithful and our arm differ in three RL switches (`logprob_source`, `loss_normalization`,
`eos_handling`; reproduce.ARMS). This study reuses the pretrained and dev-selected checkpoints of a
finished `rl-generalisation` study, or the arms' runs of a `pretrain-switches` study (so its seeds cost
only RL), and, for each arm and pretraining seed,
runs RL with the arm's own switches and with each switch alone set to the other arm's value, for every
RL seed, with the source study's RL recipe and the original's three-case reward. Every run's last
checkpoint is evaluated greedy on dev (the same tasks for every run: no checkpoint is selected, so the
comparison is not biased by a choice made on the tasks it is judged on). Each flip is compared with the
arm's own run at both levels that vary (structure groups, each the mean of its behaviours, and
pretraining seeds, the RL seeds averaged), Holm over the comparisons at each level; each behaviour's
effect is a secondary view. Nothing here opens a sealed split.
`RLSwitches` at the end declares the study (study.Study), its rerun comparison beside it.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

from glm53_flash.core.options import option
from glm53_flash.core.receipts import read_json
from glm53_flash.experiments import generalisation as gen
from glm53_flash.experiments.config import (
    RerunnableStudyConfig, parse_count_or_all, parse_name_list, parse_seed_range,
)
from glm53_flash.experiments.reruns import RERUN_MARGIN, check_same_design, points, spread_cells, studies_compared
from glm53_flash.experiments.study import DeckEntry, MakeTarget, Study, after_holm_sentence
from glm53_flash.train.config import RLConfig

STUDY = "rl-switches"
SWITCHES = ("logprob_source", "loss_normalization", "eos_handling")
OWN = "own"
DEFAULT_RL_SEEDS = (101, 202)


def switch_values(arm: str) -> dict:
    """The arm's value of each RL switch (an arm that does not set one has RLConfig's default)."""
    from glm53_flash.experiments.reproduce import ARMS

    defaults = RLConfig(initial_checkpoint="", output="")
    return {name: ARMS[arm]["rl"].get(name, getattr(defaults, name)) for name in SWITCHES}


def variant_switches(arm: str, variant: str, other: str) -> dict:
    """The RL switches of `variant` on `arm`: its own, or one switch set to the `other` arm's value."""
    values = switch_values(arm)
    if variant == OWN:
        return values
    name = variant.removeprefix("flip-")
    if name not in SWITCHES or variant == name:
        raise ValueError(f"unknown variant {variant!r}; allowed: {OWN}, " + ", ".join(f"flip-{s}" for s in SWITCHES))
    return values | {name: switch_values(other)[name]}


def source_runs(source: Path, seeds=None) -> tuple[dict, dict]:
    """A source study's plan and, per (arm, seed), the pretraining checkpoint RL starts from: an
    rl-generalisation study's selected one, or a pretrain-switches study's last checkpoint of the arm's
    design point (ours: every switch ours; faithful: every switch the original's), whose RL recipe is then
    the rl-generalisation study's. Refused when the study is another, or the pretraining of a seed in
    `seeds` (default: all of the study's) is not finished."""
    from glm53_flash.experiments import pretrain_switches as ps
    from glm53_flash.experiments.study import PLAN_FILE, load_receipts

    path = Path(source) / PLAN_FILE
    if not path.is_file():
        raise FileNotFoundError(f"--source {source}: no {PLAN_FILE}; give an `{gen.STUDY}` or `{ps.STUDY}` study "
                                "directory")
    plan = read_json(path)
    if plan.get("study") not in (gen.STUDY, ps.STUDY):
        raise ValueError(f"--source {source} is a {plan.get('study')!r} study; give an `{gen.STUDY}` or `{ps.STUDY}` "
                         "study directory")
    design = plan["design"]
    receipts = load_receipts(source, plan["plan_sha256"])
    if plan["study"] == ps.STUDY:
        points = {label: point for point, label in design["points"].items() if label in ("faithful", "ours")}
        if len(points) != 2:
            raise ValueError(f"--source {source}: its design has no point for each arm (ours and faithful)")
        found = {(arm, r["seed"]): r["checkpoint"] for r in receipts if r["phase"] == "dev"
                 for arm, point in points.items() if r["point"] == point}
        # the arms, the seeds and the RL recipe the rl-generalisation study would give these checkpoints
        plan = plan | {"design": design | {"arms": sorted(points), "rl": gen.rl_record(gen.RL_RECIPE)}}
    else:
        found = {(r["arm"], r["seed"]): r["selection"]["selected"] for r in receipts if r["phase"] == "pretrain"}
    arms = plan["design"]["arms"]
    wanted = design["seeds"] if seeds is None else [s for s in design["seeds"] if s in set(seeds)]
    missing = [f"{arm} seed {seed}" for arm in arms for seed in wanted if (arm, seed) not in found]
    if missing:
        raise ValueError(f"--source {source}: pretraining not finished for {', '.join(missing)}; finish it first "
                         f"(`glm53 experiment {plan['study']}` resumes it)")
    checkpoints = {}
    for (arm, seed), selected in found.items():
        checkpoints[f"{arm}-{seed}"] = {"checkpoint": selected.get("checkpoint") or selected["path"],
                                        "weights_sha256": selected["weights_sha256"], "step": selected["step"]}
    return plan, checkpoints


def build_plan(source: Path, rl_seeds, switches, dev_tasks: int | None, workers: int, speed: dict | None,
               seeds=None) -> dict:
    """The study's plan over the source's pretraining seeds (`seeds`, default all of them), refused before
    anything runs when a checkpoint it needs is no longer on disk."""
    from glm53_flash.experiments.study import level_power
    from glm53_flash.tasks.compositions import structure_groups

    source_plan, checkpoints = source_runs(source, seeds)
    design_in = source_plan["design"]
    arms, rl_seeds, switches = list(design_in["arms"]), list(rl_seeds), list(switches)
    seeds = list(design_in["seeds"]) if seeds is None else list(seeds)
    outside = [s for s in seeds if s not in design_in["seeds"]]
    if not seeds or outside or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds must be distinct pretraining seeds of the source study "
                         f"({', '.join(map(str, design_in['seeds']))}); got {', '.join(map(str, seeds)) or 'none'}")
    checkpoints = {key: checkpoints[key] for arm in arms for seed in seeds for key in [f"{arm}-{seed}"]}
    gone = [key for key, c in checkpoints.items() if not Path(c["checkpoint"]).exists()]
    if gone:
        kept = [s for s in seeds if all(f"{arm}-{s}" not in gone for arm in arms)]
        raise FileNotFoundError(
            f"--source {source}: the selected checkpoints of {', '.join(gone)} are no longer on disk (a study's "
            "work directory is not committed); " + (f"pass --seeds {','.join(map(str, kept))} to use the seeds "
            "whose checkpoints remain, or " if kept else "") + f"rerun their pretraining (`glm53 experiment "
            f"{gen.STUDY}` into a new directory)")
    if len(arms) != 2:
        raise ValueError(f"the source study must have both arms to flip a switch to the other's value; it has "
                         f"{', '.join(arms)}")
    unknown = [s for s in switches if s not in SWITCHES]
    if unknown or not switches or len(set(switches)) != len(switches):
        raise ValueError(f"switches must be distinct names among {', '.join(SWITCHES)}; got {', '.join(switches)}")
    if not rl_seeds or len(set(rl_seeds)) != len(rl_seeds):
        raise ValueError("RL seeds must be given, without repeats")
    variants = [OWN, *(f"flip-{s}" for s in switches)]
    other = {arms[0]: arms[1], arms[1]: arms[0]}
    dev_ids = gen.task_subset(gen.DEV_SPLIT, dev_tasks)
    units = [{"key": f"{arm}-seed-{seed}-{variant}-{rl_seed}", "arm": arm, "seed": seed, "variant": variant,
              "rl_seed": rl_seed}
             for seed in seeds for arm in arms for variant in variants for rl_seed in rl_seeds]
    rl = design_in["rl"]
    estimate = {"workers": workers, "rollouts": len(units) * rl["groups"] * rl["group_size"],
                "evaluated_tasks": len(units) * len(dev_ids), **(speed or {})}
    estimate["expected_minutes"] = round(
        (estimate["rollouts"] * speed["seconds_per_rollout"] + estimate["evaluated_tasks"] * speed["seconds_per_eval_task"])
        / max(1, workers) / 60, 1) if speed else None
    comparisons = len(arms) * len(switches)
    return {
        "study": STUDY,
        "design": {
            "source": {"directory": str(source), "plan_sha256": source_plan["plan_sha256"],
                       "study": source_plan["study"]},
            "checkpoints": checkpoints, "arms": arms, "seeds": seeds, "rl_seeds": rl_seeds, "switches": switches,
            "variants": {arm: {v: variant_switches(arm, v, other[arm]) for v in variants} for arm in arms},
            "rl": rl, "reward_cases": "three", "precision": design_in["precision"],
            "dev_split": gen.DEV_SPLIT, "dev_tasks": len(dev_ids), "dev_task_ids_sha256": gen._ids_sha256(dev_ids),
            "subset_sizes": {"dev": dev_tasks}, "evaluation": "the last RL checkpoint, greedy pass@1 on dev",
        },
        "units": units,
        "analysis": {
            "comparison": "each flip vs the arm's own switches: per behaviour and pretraining seed, the flip's pass "
                          "minus the own run's (RL seeds averaged); stats.two_level_comparison",
            "multiplicity": f"Holm over the {comparisons} comparisons, at each level separately; a direction needs "
                            "both levels significant after Holm",
            "alpha": 0.05,
        },
        # Holm tests the smallest p at alpha / comparisons: the power a single real flip has at worst
        "power": {f"over pretraining seeds, at Holm's first step (alpha 0.05/{comparisons})":
                  level_power(len(seeds), "t", alpha=0.05 / comparisons),
                  f"over structure groups, at Holm's first step (alpha 0.05/{comparisons})":
                  level_power(len(set(structure_groups(dev_ids).values())), "sign-flip", alpha=0.05 / comparisons)},
        "estimate": estimate,
    }


def run_unit(unit: dict) -> dict:
    """Worker entry point: one RL run from the source study's checkpoint, its last checkpoint on dev."""
    import torch

    from glm53_flash.model.lm import load_pretrained
    from glm53_flash.train.rl_run import train_rl
    from glm53_flash.verifier import Verifier

    torch.set_num_threads(1)
    started = time.perf_counter()
    design, device = unit["design"], unit.get("device", "cpu")
    start = design["checkpoints"][f"{unit['arm']}-{unit['seed']}"]
    switches = design["variants"][unit["arm"]][unit["variant"]]
    recipe = {k: tuple(v) if isinstance(v, list) else v for k, v in design["rl"].items()}
    work = Path(unit["work_dir"])
    receipt = train_rl(replace(RLConfig(initial_checkpoint="", output="", **recipe), **switches,
                               initial_checkpoint=start["checkpoint"], output=str(work), seed=unit["rl_seed"],
                               reward_cases=design["reward_cases"], precision=design["precision"], device=device,
                               checkpoints=(recipe["groups"],), resume=True, quiet=True, verifier_workers=1))
    if receipt["initial_checkpoint_sha256"] != start["weights_sha256"]:
        raise ValueError(f"{start['checkpoint']} changed since the source study selected it")
    final = receipt["checkpoints"][-1]
    model, meta = load_pretrained(final["path"], device)
    tasks = gen._tasks(gen.DEV_SPLIT, gen._design_ids(design, gen.DEV_SPLIT))
    with Verifier(workers=1) as verifier:
        evaluation = gen._evaluate(model, tasks, design, verifier)
    hacking = {k: v for k, v in (receipt.get("reward_hacking") or {}).items() if k != "by_group"}
    shutil.rmtree(work, ignore_errors=True)  # the weights of every run: the receipt keeps their hashes
    return {"arm": unit["arm"], "seed": unit["seed"], "variant": unit["variant"], "rl_seed": unit["rl_seed"],
            "switches": switches, "training": {"exact_training_rollouts": receipt.get("exact_training_rollouts"),
                                               "elapsed_seconds": receipt.get("elapsed_seconds"),
                                               "final_weights_sha256": meta["weights_sha256"],
                                               "reward_hacking": hacking},
            "evaluation": {k: evaluation[k] for k in ("summary", "by_kind", "outcomes")},
            "elapsed_seconds": round(time.perf_counter() - started, 3)}


def measure_speed(plan_draft: dict, device: str = "cpu") -> dict:
    """Seconds per RL rollout and per evaluated dev task on this machine, one thread, from the first
    source checkpoint: their marginal costs (gen.probe_rl_and_evaluation)."""
    import torch

    design = plan_draft["design"]
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return gen.probe_rl_and_evaluation(next(iter(design["checkpoints"].values()))["checkpoint"], design["rl"],
                                           design["precision"], device)
    finally:
        torch.set_num_threads(before)


# --------------------------------------------------------------------------- analysis


def compute(plan: dict, receipts: list[dict]) -> dict:
    """Per arm and switch, the flip minus the arm's own run on dev: over structure groups and pretraining
    seeds (`comparison`, each group's tasks read from the suite by their ids), Holm over the comparisons at
    each level (`holm`, `verdict`), what each level could have detected at Holm's first step, and over
    behaviours as a secondary view (`behaviours`)."""
    from glm53_flash.core.stats import detectable_differences, group_means, holm, two_level_comparison
    from glm53_flash.tasks.compositions import structure_groups

    design, alpha = plan["design"], plan["analysis"]["alpha"]
    found = {(r["arm"], r["seed"], r["variant"], r["rl_seed"]): r["evaluation"]["outcomes"] for r in receipts}
    rows = []
    for arm in design["arms"]:
        for switch in design["switches"]:
            variant = f"flip-{switch}"
            seeds = [s for s in design["seeds"]
                     if all((arm, s, v, r) in found for v in (OWN, variant) for r in design["rl_seeds"])]
            if not seeds:
                continue
            differences, own_rates, flip_rates = {}, [], []
            for s in seeds:
                own = [found[(arm, s, OWN, r)] for r in design["rl_seeds"]]
                flip = [found[(arm, s, variant, r)] for r in design["rl_seeds"]]
                differences[str(s)] = {t: (sum(o[t][0] for o in flip) - sum(o[t][0] for o in own)) / len(own)
                                       for t in own[0]}
                own_rates.append(sum(gen._rate(o, False) for o in own) / len(own))
                flip_rates.append(sum(gen._rate(o, False) for o in flip) / len(flip))
            by_group = group_means(differences, structure_groups(next(iter(differences.values()))))
            rows.append({"arm": arm, "switch": switch, "own": design["variants"][arm][OWN][switch],
                         "flipped_to": design["variants"][arm][variant][switch], "seeds": seeds,
                         "own_pass_rate": own_rates, "flipped_pass_rate": flip_rates,
                         "comparison": two_level_comparison(by_group, alpha=alpha),
                         "behaviours": two_level_comparison(differences, alpha=alpha), "differences": by_group})
    if rows:
        unit_p = holm([row["comparison"]["units"]["sign_flip_p"] for row in rows])
        seed_p = holm([1.0 if row["comparison"]["seeds"]["t_test_p"] is None else row["comparison"]["seeds"]["t_test_p"]
                       for row in rows])
        for row, up, sp in zip(rows, unit_p, seed_p):
            c = row["comparison"]
            same = (c["units"]["mean"] > 0) == (c["seeds"]["mean"] > 0) and c["units"]["mean"] != 0
            row["holm"] = {"units_p": up, "seeds_p": sp}
            # what the data could have shown: Holm tests the smallest p at alpha / comparisons
            row["detectable"] = detectable_differences(row.pop("differences"), alpha / len(rows))
            row["verdict"] = ("flip better" if c["units"]["mean"] > 0 else "flip worse") \
                if up < alpha and sp < alpha and same else "not shown"
    return {"study": STUDY, "runs": len(receipts), "comparisons": rows}


def _points(value) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}"


def answers(summary: dict) -> list[str]:
    """One line per (arm, switch): the flip's effect on dev over structure groups, its result after Holm at
    groups and seeds, the behaviours as a secondary view and, when nothing is shown, the smallest difference
    each level could have shown with the spread it measured."""
    from glm53_flash.experiments.study import after_holm

    lines = []
    for row in summary["comparisons"]:
        c, d = row["comparison"], row["detectable"]
        lines.append(f"{row['arm']}: {row['switch']} {row['own']} -> {row['flipped_to']}: "
                     f"{100 * c['mean_difference']:+.1f} points on dev over {c['units']['n']} structure groups: "
                     f"{after_holm(row['verdict'], len(summary['comparisons']), 'groups and seeds')} (Holm p groups "
                     f"{row['holm']['units_p']:.3g}, seeds {row['holm']['seeds_p']:.3g}; {len(row['seeds'])} seeds; "
                     f"over behaviours, a secondary view, {100 * row['behaviours']['mean_difference']:+.1f})"
                     + ("" if row["verdict"] != "not shown" else
                        f"; detectable at Holm's first step: {_points(d['seeds'])} points over seeds, "
                        f"{_points(d['units'])} over groups"))
    return lines


def headline_table(summary: dict) -> dict:
    """The README's and the deck's table: per arm and switch, the dev pass rates, the flip's effect at both
    levels with Holm's p, and what each level could have detected."""
    columns = ["arm", "switch", "own -> flipped", "own pass@1", "flipped", "effect over groups (points, CI)",
               "over seeds (CI)", "Holm p (groups / seeds)", "detectable (seeds / groups)", "seeds", "result after Holm"]
    rows = []
    for row in summary["comparisons"]:
        c, d = row["comparison"], row["detectable"]
        interval = c["seeds"]["interval"]
        rows.append([row["arm"], row["switch"], f"{row['own']} -> {row['flipped_to']}",
                     f"{100 * sum(row['own_pass_rate']) / len(row['own_pass_rate']):.1f}%",
                     f"{100 * sum(row['flipped_pass_rate']) / len(row['flipped_pass_rate']):.1f}%",
                     f"{100 * c['mean_difference']:+.1f} [{100 * c['units']['interval'][0]:+.1f}, "
                     f"{100 * c['units']['interval'][1]:+.1f}]",
                     "n/a" if interval is None else f"[{100 * interval[0]:+.1f}, {100 * interval[1]:+.1f}]",
                     f"{row['holm']['units_p']:.3g} / {row['holm']['seeds_p']:.3g}",
                     f"{_points(d['seeds'])} / {_points(d['units'])}", str(len(row["seeds"])), row["verdict"]])
    return {"columns": columns, "rows": rows}


def report_lines(plan: dict, summary: dict) -> list[str]:
    from glm53_flash.experiments.study import power_lines

    design = plan["design"]
    lines = [f"# {STUDY}: which RL switch matters?", "",
             f"Source: `{design['source']['directory']}` (plan {design['source']['plan_sha256'][:12]}); arms "
             f"{', '.join(design['arms'])}; pretraining seeds {', '.join(map(str, design['seeds']))}; RL seeds "
             f"{', '.join(map(str, design['rl_seeds']))}; RL {design['rl']['groups']} groups x "
             f"{design['rl']['group_size']}, three-case reward; each run's last checkpoint on "
             f"{design['dev_tasks']} dev tasks.", "", "## Power, stated before the runs", "", *power_lines(plan), "",
             "## Each switch alone, flipped to the other arm's value", ""]
    table = summary["headline_table"]
    lines += ["| " + " | ".join(table["columns"]) + " |", "|" + "---|" * len(table["columns"])]
    lines += ["| " + " | ".join(row) + " |" for row in table["rows"]]
    lines += ["", "Points of greedy pass@1 on dev (the three cases), each flip minus the arm's own run, the RL "
                  "seeds averaged, over structure groups (each the mean of its behaviours: behaviours of one group "
                  "are correlated); brackets: 95% intervals. A direction needs both levels after Holm. `detectable`: "
                  "the smallest difference each level would show at Holm's first step with 80% power, from the "
                  "spread it measured.", "", "### Over behaviours (a secondary view)", "",
              "| arm | switch | effect over behaviours (points, CI) | sign-flip p (behaviours) | behaviours |",
              "|---|---|---|---|---|"]
    for row in summary["comparisons"]:
        units = row["behaviours"]["units"]
        lines.append(f"| {row['arm']} | {row['switch']} | {100 * units['mean']:+.1f} [{100 * units['interval'][0]:+.1f}, "
                     f"{100 * units['interval'][1]:+.1f}] | {units['sign_flip_p']:.3g} | {units['n']} |")
    return lines + [""]


def analyze(out: Path, plan: dict, receipts: list[dict]) -> tuple[dict, list[str], dict]:
    from glm53_flash.report import study_charts

    summary = compute(plan, receipts)
    summary["answers"] = answers(summary)
    summary["headline_table"] = headline_table(summary)
    lines = report_lines(plan, summary)
    charts = study_charts.insert_effects_chart(out, lines, study_charts.draw_rl_switches(summary),
                                               "## Each switch alone, flipped to the other arm's value",
                                               "each flip's effect on dev per arm")
    return summary, lines, charts


# --------------------------------------------------------------------------- the rerun


def check_rerun_design(first: dict, rerun: dict) -> None:
    """Two rl-switches studies that may be compared: the same design but for their source study, its
    checkpoints and its pretraining seeds, which must not overlap."""
    check_same_design(first, rerun, STUDY, ("source", "checkpoints", "seeds"),
                       "their source's pretraining seeds", True)


def compare_rerun(first_plan: dict, first: dict, rerun_plan: dict, rerun: dict,
                  margin: float = RERUN_MARGIN) -> dict:
    """Two rl-switches studies on disjoint pretraining seeds (`first` and `rerun` as `compute` gives
    them): per (arm, switch), whether the verdict and each level's direction after Holm hold in both, and the
    rerun spread (Welch's t over the two sets of per-seed effects, independent: disjoint seeds)."""
    from glm53_flash.core.stats import welch_comparison

    check_rerun_design(first_plan, rerun_plan)
    alpha = first_plan["analysis"]["alpha"]

    def directions(row) -> list[str]:
        out = []
        for level, key in (("units", "units_p"), ("seeds", "seeds_p")):
            mean = row["comparison"][level]["mean"]
            out.append("0" if row["holm"][key] >= alpha or not mean else "+" if mean > 0 else "-")
        return out

    keyed = {(r["arm"], r["switch"]): r for r in rerun["comparisons"]}
    rows = []
    for a in first["comparisons"]:
        b = keyed.get((a["arm"], a["switch"]))
        if b is None:
            continue
        va, vb = a["comparison"]["seeds"]["values"], b["comparison"]["seeds"]["values"]
        spread = welch_comparison(va, vb, margin=margin, alpha=alpha) if min(len(va), len(vb)) >= 2 else None
        da, db = directions(a), directions(b)
        rows.append({"arm": a["arm"], "switch": a["switch"], "own": a["own"], "flipped_to": a["flipped_to"],
                     "first": {"mean": a["comparison"]["units"]["mean"], "verdict": a["verdict"], "seeds": a["seeds"]},
                     "rerun": {"mean": b["comparison"]["units"]["mean"], "verdict": b["verdict"], "seeds": b["seeds"]},
                     "directions": {"units": [da[0], db[0]], "seeds": [da[1], db[1]]},
                     "holds": a["verdict"] == b["verdict"] and da == db, "spread": spread})
    return {"study": STUDY,
            **studies_compared(first_plan, rerun_plan, "seeds"),
            "alpha": alpha, "margin": margin, "rows": rows,
            "all_hold": bool(rows) and all(r["holds"] for r in rows),
            "rule": "a row holds when both studies give the same verdict and the same direction (or none) after Holm "
                    "at the structure groups and at the pretraining seeds; it reproduces its size when Welch's 90% "
                    "interval of the rerun's seed-level effect minus the first's lies within +- the margin (two "
                    "one-sided tests)"}


def rerun_report_lines(comparison: dict, first_name: str) -> list[str]:
    lines = ["", f"## Against the first study (`{first_name}`, pretraining seeds "
                 f"{', '.join(map(str, comparison['first']['seeds']))})", "",
             f"Rule: {comparison['rule']}; margin {100 * comparison['margin']:.1f} points. Effects in points of "
             "greedy pass@1 on dev, the flip minus the arm's own.", "",
             "| arm | switch | first | rerun | holds (groups, seeds) | rerun - first, 90% CI | within the margin |",
             "|---|---|---|---|---|---|---|"]
    for row in comparison["rows"]:
        spread, d = row["spread"], row["directions"]
        lines.append(
            f"| {row['arm']} | {row['switch']} | {points(row['first']['mean'])} {row['first']['verdict']} | "
            f"{points(row['rerun']['mean'])} {row['rerun']['verdict']} | "
            f"{'yes' if row['holds'] else 'NO'} ({'/'.join(d['units'])}, {'/'.join(d['seeds'])}) | "
            + spread_cells(spread) + " |")
    lines += ["", "`holds` lists each level's direction after Holm in the first study / the rerun (`+` the flip "
                  "raises the pass rate at alpha, `-` lowers it, `0` not shown).", ""]
    return lines


# --------------------------------------------------------------------------- the study's declaration


@dataclass(kw_only=True)
class RLSwitchesStudyConfig(RerunnableStudyConfig):
    """Every knob of `glm53 experiment rl-switches`; the design in plan.json comes from these."""

    source: str = option(help="a finished rl-generalisation (or pretrain-switches) study directory whose selected "
                              "(or the arms' last) pretraining "
                              "checkpoints every run starts from")
    rl_seeds: tuple[int, ...] = option(DEFAULT_RL_SEEDS, parse=parse_seed_range,
                                       help="RL seeds of every (arm, pretraining seed, variant)", default_text="101,202")
    seeds: tuple[int, ...] | None = option(None, parse=parse_seed_range,
                                           help="the source study's pretraining seeds to use (each needs its "
                                                "selected checkpoints still on disk)", default_text="all of them")
    switches: tuple[str, ...] = option(SWITCHES, parse=parse_name_list,
                                       help=f"RL switches to flip, each alone; {', '.join(SWITCHES)}",
                                       default_text="all three")
    dev_tasks: int | None = option(None, parse=parse_count_or_all, metavar="N|all",
                                   help="dev tasks every run's last checkpoint is evaluated on (a fixed subset by hash)",
                                   default_text="all 621")

    def __post_init__(self) -> None:
        self.rl_seeds, self.switches = tuple(self.rl_seeds), tuple(self.switches)
        self.seeds = None if self.seeds is None else tuple(self.seeds)


def deck_figures(slide_id: str, summary: dict, directory: Path) -> tuple[list, bool]:
    from glm53_flash.report import study_charts

    return [(study_charts.draw_rl_switches(summary, size=(12, 5.4)), f"{slide_id.removeprefix('research-')}-effects",
             "each RL switch flipped alone: its effect on the dev pass rate per arm, with each seed")], False


# What `make` runs of this study (the Makefile's generated block; recipe lines indented by four spaces a tab).
MAKE_TARGETS = (MakeTarget("study-switches", r"""
# Which RL switch matters, from a study's pretrained checkpoints (dev only). The checkpoints are not
# committed, so run it in the same checkout as its source, e.g.
# make study-switches SWITCHES_SOURCE=runs/study-generalisation-rerun SWITCHES_FLAGS="--seeds 6,7,8"
SWITCHES_SOURCE ?= runs/study-generalisation
SWITCHES_FLAGS ?=
study-switches: $(STAMP)
    $(BIN)/glm53 experiment rl-switches --source $(SWITCHES_SOURCE) --output runs/study-switches $(SWITCHES_FLAGS)
"""),)


class RLSwitches(Study):
    name = STUDY
    config = RLSwitchesStudyConfig
    help = ("which RL switch matters: each of the three flipped alone on each arm, from an rl-generalisation "
            "study's checkpoints, on dev")
    description = ("From the selected pretraining checkpoints of a finished rl-generalisation study (--source): RL "
                   "with each arm's own switches and with each switch alone set to the other arm's value, for every "
                   "RL seed; each run's last checkpoint evaluated greedy on dev; each flip compared with the arm's "
                   "own at the behaviour and the seed level, Holm over the comparisons. Opens no sealed split. "
                   "Resumable. Analyse with `glm53 analyze DIR`.")
    deck = (DeckEntry("research-rl-switches", "Research study: which RL switch matters?", "make study-switches",
                      "rl-switches/summary.json", deck_figures),)
    make_targets = MAKE_TARGETS
    rerunnable = True

    def plan(self, cfg: RLSwitchesStudyConfig, speed: dict | None) -> dict:
        return build_plan(Path(cfg.source), cfg.rl_seeds, cfg.switches, cfg.dev_tasks, cfg.workers, speed,
                          seeds=cfg.seeds)

    def speed(self, cfg: RLSwitchesStudyConfig, draft: dict) -> dict:
        from glm53_flash.core.runtime import resolve_device

        return measure_speed(draft, str(resolve_device(cfg.device)))

    def run(self, session) -> int:
        work = session.work_dir()
        ran = session.run([u | {"work_dir": str(work / u["key"])} for u in session.plan["units"]], run_unit)
        session.remove_empty_work_dir()
        return ran

    def analyze(self, out: Path, plan: dict, receipts: list[dict]) -> tuple[dict, list[str], dict]:
        return analyze(out, plan, receipts)

    def answer(self, plan: dict, summary: dict) -> str:
        """Each flip's effect on dev, after Holm over the comparisons at structure groups and pretraining seeds."""
        rows = summary["comparisons"]
        seeds = max((len(row["seeds"]) for row in rows), default=0)
        return after_holm_sentence(
            f"Each RL switch flipped alone to the other arm's value, its effect on the dev pass rate (over structure "
            f"groups and {seeds} pretraining seeds)",
            [(f"{row['arm']}: {row['switch']} {row['own']} -> {row['flipped_to']} "
              f"{100 * row['comparison']['mean_difference']:+.1f} points", row["verdict"] != "not shown")
             for row in rows], len(rows), "groups and seeds")

    def check_rerun(self, first_plan: dict, plan: dict) -> None:
        check_rerun_design(first_plan, plan)

    def compare_rerun(self, first_plan: dict, first_receipts: list[dict], plan: dict, receipts: list[dict]) -> dict:
        return compare_rerun(first_plan, compute(first_plan, first_receipts), plan, compute(plan, receipts))

    def rerun_report_lines(self, comparison: dict, first_name: str) -> list[str]:
        return rerun_report_lines(comparison, first_name)


__all__ = ["DEFAULT_RL_SEEDS", "OWN", "STUDY", "SWITCHES", "RLSwitches", "RLSwitchesStudyConfig", "analyze",
           "build_plan", "check_rerun_design", "compare_rerun", "compute", "headline_table", "measure_speed",
           "rerun_report_lines", "run_unit", "source_runs", "switch_values", "variant_switches"]
