"""The two-arm headline's statistics, computed only from the runs' receipts and summaries.

What varies independently is a distinct function (a unit: on the families suite a family, whose two
descriptions compute the same function, so the 96 holdout tasks of three families are 3 units) and a
seed (pretraining, then RL). Every question names its units and seeds, and the plan states its power before it runs
(`plan_power`: the smallest difference it can detect at each level, under `AnalysisPlan`'s stated
assumptions).

1. Does the faithful arm reproduce the original's confirm result (16/24 after RL)? An equivalence
   test (two one-sided t-tests over pretraining seeds, each seed the mean of its RL seeds' confirm
   rates) with the margin the analysis plan states; "reproduces" only when it is shown. The 95% Wilson
   interval of each count is kept as a description, not as a test.
2. Does our arm beat the faithful one on the holdout split? Per checkpoint: the exact sign-flip test
   over units (its floor is 2/2^units), with the exact McNemar test pooled over tasks beside it (Holm
   over checkpoints); across pretraining seeds, the two-level comparison (`stats.two_level_comparison`):
   "better" needs both the units and the seeds.
3. Does the answer survive another pretraining seed? Per pretraining seed, the holdout scores of both
   arms before RL and after the first RL seed, the RL gains, and the sign of every difference across
   seeds (the exact sign-flip p cannot go below 0.25 with 3 seeds: the spread is what we report).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from pathlib import Path

from glm53_flash.core.receipts import read_json
from glm53_flash.core.stats import (
    equivalence_test, holm, minimum_detectable_difference, minimum_equivalence_margin, sign_flip_p,
    two_level_comparison, wilson_interval,
)

# The original's published confirm result (seed-core 9.4): greedy on the three trained families.
ORIGINAL_CONFIRM = {"tasks": 24, "before": 0, "after": 16}
ANALYSIS_FILE = "analysis-plan.json"


@dataclass(frozen=True)
class AnalysisPlan:
    """What a headline run's analysis decides before it runs: the test levels, the smallest effect
    worth finding, the equivalence margin for "reproduces", and the spreads its power assumes."""

    alpha: float = 0.05
    power: float = 0.8
    # the smallest difference in greedy pass rate (a fraction of the units' tasks) worth detecting
    effect_of_interest: float = 0.10
    # "reproduces the original": our confirm rate after RL within this of the original's 16/24
    equivalence_margin: float = 0.15
    # standard deviations the power computation assumes: of one unit's difference in pass rate between
    # two checkpoints or arms, and of a seed's mean difference
    unit_sd: float = 0.30
    seed_sd: float = 0.15
    sd_source: str = ("the committed two-arm headline at 54a3da4 (results/headline): arms' per-unit holdout "
                      "differences had standard deviations of 0.06 to 0.30, their seed means 0.13")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "AnalysisPlan":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known - {"stated"})
        if unknown:
            raise ValueError(f"analysis plan has unknown fields: {', '.join(unknown)}")
        return cls(**{k: v for k, v in values.items() if k in known})


HEADLINE_ANALYSIS = AnalysisPlan()


def level_power(units: int, seeds: int, analysis: AnalysisPlan) -> dict:
    """The smallest true difference in pass rate a paired comparison detects with the plan's power at its
    alpha: over units (the exact sign-flip test; None when 2/2^units > alpha) and over seeds (a t-test;
    None below two seeds), from the assumed standard deviations. `detectable` says whether both levels
    can detect the effect of interest."""
    by_units = minimum_detectable_difference(units, analysis.unit_sd, analysis.alpha, analysis.power, "sign-flip")
    if by_units is not None:
        by_units = minimum_detectable_difference(units, analysis.unit_sd, analysis.alpha, analysis.power, "t")
    by_seeds = minimum_detectable_difference(seeds, analysis.seed_sd, analysis.alpha, analysis.power, "t")
    detectable = (by_units is not None and by_seeds is not None
                  and max(by_units, by_seeds) <= analysis.effect_of_interest)
    return {"units": units, "seeds": seeds, "mdd_units": by_units, "mdd_seeds": by_seeds,
            "effect_of_interest": analysis.effect_of_interest, "detectable": detectable}


def plan_power(plan, pretrain_seeds: int, analysis: AnalysisPlan = HEADLINE_ANALYSIS) -> dict:
    """The power of a headline plan run at `pretrain_seeds` pretraining seeds (the plan's own and the
    extra ones), stated before it runs: for each question its units, seeds and minimum detectable
    difference, and for "reproduces" the smallest margin its equivalence test could show."""
    from glm53_flash.tasks import split_units

    def units(config) -> int:
        families = tuple(config.families.split(",")) if config.families else None
        return split_units(config.split, config.per_family, families)

    holdout = units(plan.holdout_greedy)
    confirm = units(plan.confirm_greedy)
    smallest_margin = minimum_equivalence_margin(pretrain_seeds, analysis.seed_sd, analysis.alpha, analysis.power)
    questions = {
        "faithful_reproduces_original": {
            "test": "equivalence (TOST) over pretraining seeds, margin stated in the analysis plan",
            "units": confirm, "seeds": pretrain_seeds, "margin": analysis.equivalence_margin,
            "smallest_margin": smallest_margin,
            "can_show_equivalence": smallest_margin is not None and smallest_margin <= analysis.equivalence_margin},
    }
    questions["ours_vs_faithful_holdout"] = {
        "test": "exact sign-flip over units per checkpoint; units and pretraining seeds together",
        **level_power(holdout, pretrain_seeds, analysis)}
    questions["rl_gain_holdout"] = {"test": "before vs after RL, units and pretraining seeds together",
                                    **level_power(holdout, pretrain_seeds, analysis)}
    return {"analysis": analysis.to_dict(), "pretrain_seeds": pretrain_seeds, "rl_seeds": len(plan.rl_seeds),
            "questions": questions}


def power_lines(power: dict) -> list[str]:
    """The power statement a plan prints before it runs (and its report repeats)."""
    def points(value):
        return "none" if value is None else f"{100 * value:.1f} points"

    analysis = power["analysis"]
    lines = [f"power at alpha {analysis['alpha']} and {analysis['power']:.0%} (assumed sd: units "
             f"{analysis['unit_sd']}, seeds {analysis['seed_sd']}; {analysis['sd_source']}):"]
    for name, q in power["questions"].items():
        if "margin" in q:
            lines.append(f"- {name}: {q['units']} units, {q['seeds']} pretraining seed(s); equivalence margin "
                         f"{points(q['margin'])}, smallest margin this plan can show {points(q['smallest_margin'])}"
                         f" -> {'can' if q['can_show_equivalence'] else 'cannot'} show equivalence")
        else:
            lines.append(f"- {name}: {q['units']} units, {q['seeds']} pretraining seed(s); smallest detectable "
                         f"difference {points(q['mdd_units'])} over units, {points(q['mdd_seeds'])} over seeds "
                         f"(effect of interest {points(q['effect_of_interest'])}) -> "
                         f"{'can' if q['detectable'] else 'cannot'} detect it")
    return lines


def read_analysis(out: Path) -> tuple[AnalysisPlan, str]:
    """The analysis plan a headline directory stated before it ran (OUT/analysis-plan.json), or the
    current one with a note that it was stated after the run."""
    path = Path(out) / ANALYSIS_FILE
    if path.is_file():
        recorded = read_json(path)
        return AnalysisPlan.from_dict(recorded["analysis"]), recorded.get("stated", "before the run")
    return HEADLINE_ANALYSIS, "after the run: its directory holds no analysis plan, so these settings are today's"


def _greedy(directory: Path, split: str, name: str) -> dict:
    return read_json(directory / split / f"{name}-greedy.json")


def _solved(receipt: dict) -> tuple[int, int]:
    summary = receipt["summary"]
    return summary["tasks_solved"], summary["tasks_total"]


def seed_table(out: Path, runs: list) -> dict:
    """Per arm, one row per pretraining seed (`runs`: (directory, report.summary.RunSummary) pairs): the holdout (and confirm) greedy scores before RL and
    after each RL seed that run trained, and the RL gain of its first RL seed."""
    table: dict[str, list[dict]] = {}
    for path, summary in runs:
        plan_seeds = summary.rl_seeds
        first = plan_seeds[0]
        row = {"pretrain_seed": summary.pretrain_seed, "directory": path.name, "rl_seeds": plan_seeds}
        for split in ("holdout", "confirm"):
            before, total = _solved(_greedy(path, split, "before"))
            after = {seed: _solved(_greedy(path, split, f"rl-{seed}"))[0] for seed in plan_seeds}
            row[split] = {"tasks": total, "before": before, "after": after,
                          "first_rl_gain": after[first] - before}
        row["strong_false_passes_holdout"] = {
            name: counts["greedy"]["false_passes"]
            for name, counts in (summary.holdout.strong_tests or {}).items()}
        table.setdefault(summary.arm, []).append(row)
    for rows in table.values():
        rows.sort(key=lambda r: r["pretrain_seed"])
    return table


def _spread(values: list[float]) -> dict:
    return {"values": values, "mean": statistics.fmean(values), "min": min(values), "max": max(values),
            "stdev": statistics.stdev(values) if len(values) > 1 else None}


def equivalence_to_original(seed_rows: list[dict], analysis: AnalysisPlan, stated: str) -> dict | None:
    """Question 1 as a test: per pretraining seed, the mean over its RL seeds of the faithful arm's
    confirm rate after RL; TOST against the original's 16/24 with the plan's margin."""
    values = [statistics.fmean(row["confirm"]["after"][s] for s in row["rl_seeds"]) / row["confirm"]["tasks"]
              for row in seed_rows]
    reference = ORIGINAL_CONFIRM["after"] / ORIGINAL_CONFIRM["tasks"]
    result = {"pretrain_seeds": [row["pretrain_seed"] for row in seed_rows], "values": values,
              "original": reference, "margin": analysis.equivalence_margin, "margin_stated": stated}
    if len(values) < 2:
        result.update(equivalent=False, p=None, interval=None, smallest_margin=None,
                      verdict="not tested: one pretraining seed gives no spread to test with")
        return result
    test = equivalence_test(values, reference=reference, margin=analysis.equivalence_margin, alpha=analysis.alpha)
    smallest = minimum_equivalence_margin(len(values), statistics.stdev(values) or analysis.seed_sd,
                                          analysis.alpha, analysis.power)
    result.update(equivalent=test["equivalent"], p=test["p"], interval=test["interval"],
                  interval_level=test["interval_level"], mean=test["mean"], smallest_margin=smallest,
                  verdict="equivalent" if test["equivalent"] else "not shown equivalent", method=test["method"])
    return result


def reproduces_original(faithful: dict) -> dict:
    """Question 1's description, from the faithful arm's main run (its confirm receipts): Wilson
    intervals of each count (the test is `equivalence_to_original`)."""
    total = ORIGINAL_CONFIRM["tasks"]
    seeds = faithful["seeds"]
    first = next(iter(seeds.values()))["greedy_trained"]
    before = first["before_solved"]
    rows = {"before": {"solved": before, "tasks": first["tasks"], "original": ORIGINAL_CONFIRM["before"]}}
    for seed, result in seeds.items():
        g = result["greedy_trained"]
        rows[f"rl-{seed}"] = {"solved": g["after_solved"], "tasks": g["tasks"], "original": ORIGINAL_CONFIRM["after"]}
    for row in rows.values():
        low, high = wilson_interval(row["solved"], row["tasks"])
        row["interval"] = [low, high]
        row["original_tasks"] = total
        # rates, so a plan with another number of confirm tasks still compares (the headline's is 24)
        row["original_inside"] = low <= row["original"] / total <= high
    return {"rows": rows, "original_inside_every_interval": all(row["original_inside"] for row in rows.values()),
            "method": "95% Wilson interval of each count; the original's count inside it, before RL and for "
                      "every RL seed (a description, not a test)"}


def arms_on_holdout(out: Path, arms: dict) -> dict | None:
    """Question 2: ours vs faithful on the holdout greedy tasks, paired by task, per checkpoint."""
    from glm53_flash.evaluation.compare import compare_receipts

    if not {"faithful", "ours"} <= set(arms) or any("holdout" not in arms[a] for a in ("faithful", "ours")):
        return None
    names = ["before", *(f"rl-{seed}" for seed in arms["ours"]["plan"]["rl_seeds"])]
    faithful_names = {"before", *(f"rl-{seed}" for seed in arms["faithful"]["plan"]["rl_seeds"])}
    rows = {}
    for name in (n for n in names if n in faithful_names):
        result = compare_receipts(_greedy(out / "faithful", "holdout", name), _greedy(out / "ours", "holdout", name),
                                  labels=("faithful", "ours"))["overall"]
        units = result["units"]
        rows[name] = {"tasks": result["tasks"], "faithful_solved": result["before_solved"],
                      "ours_solved": result["after_solved"], "only_ours": result["gains"],
                      "only_faithful": result["losses"], "mcnemar_p": result["mcnemar_p"],
                      "units": units["units"], "units_ours_better": units["better"],
                      "units_faithful_better": units["worse"], "unit_rate_difference": units["rate_difference"],
                      "unit_sign_flip_p": units["sign_flip_p"], "unit_sign_flip_floor": units["sign_flip_floor"]}
    for name, adjusted in zip(rows, holm([row["unit_sign_flip_p"] for row in rows.values()])):
        rows[name]["unit_sign_flip_p_holm"] = adjusted
        rows[name]["ours_better"] = adjusted < 0.05 and rows[name]["unit_rate_difference"] > 0
        rows[name]["faithful_better"] = adjusted < 0.05 and rows[name]["unit_rate_difference"] < 0
    for name, adjusted in zip(rows, holm([row["mcnemar_p"] for row in rows.values()])):
        rows[name]["mcnemar_p_holm"] = adjusted  # pooled over tasks, as if they were independent
    return {"rows": rows, "method": "per checkpoint, the exact sign-flip test over units (distinct functions: a "
                                    "family) on the holdout greedy tasks, Holm-adjusted over the checkpoints, alpha "
                                    "0.05; the exact McNemar test pooled over tasks beside it"}


def over_pretraining_seeds(seeds: dict) -> dict | None:
    """Question 3: per pretraining seed present in both arms, the holdout differences and RL gains."""
    if not {"faithful", "ours"} <= set(seeds):
        return None
    faithful = {row["pretrain_seed"]: row for row in seeds["faithful"]}
    ours = {row["pretrain_seed"]: row for row in seeds["ours"]}
    common = sorted(set(faithful) & set(ours))
    if not common:
        return None
    first = {s: ours[s]["rl_seeds"][0] for s in common}
    measures = {
        "ours_minus_faithful_before": [ours[s]["holdout"]["before"] - faithful[s]["holdout"]["before"] for s in common],
        "ours_minus_faithful_after": [ours[s]["holdout"]["after"][first[s]]
                                      - faithful[s]["holdout"]["after"][first[s]] for s in common],
        "rl_gain_faithful": [faithful[s]["holdout"]["first_rl_gain"] for s in common],
        "rl_gain_ours": [ours[s]["holdout"]["first_rl_gain"] for s in common],
    }
    result = {"pretrain_seeds": common, "tasks": ours[common[0]]["holdout"]["tasks"],
              "method": "per pretraining seed, holdout greedy tasks solved (first RL seed after RL); exact "
                        "sign-flip p over seeds (two-sided; its floor is 2/2^n for n seeds)"}
    for name, values in measures.items():
        entry = _spread([float(v) for v in values])
        entry["positive_seeds"] = sum(v > 0 for v in values)
        entry["negative_seeds"] = sum(v < 0 for v in values)
        entry["sign_flip_p"] = sign_flip_p([float(v) for v in values]) if any(values) else 1.0
        result[name] = entry
    return result


def unit_differences(before: dict, after: dict) -> dict[str, float]:
    """unit -> after's pass rate minus before's, over the unit's tasks (two greedy receipts)."""
    from glm53_flash.evaluation.compare import task_outcomes, unit_rates

    b, a = task_outcomes(before), task_outcomes(after)
    if set(b) != set(a):
        raise ValueError("the receipts cover different tasks")
    rb, ra = unit_rates(sorted(b), b), unit_rates(sorted(a), a)
    return {unit: ra[unit] - rb[unit] for unit in rb}


def two_level_questions(out: Path, seeds: dict, analysis: AnalysisPlan) -> dict | None:
    """Ours against faithful (before RL and after the first RL seed) and each arm's RL gain on holdout, at
    both levels that vary: the units and the pretraining seeds present in both arms."""
    if not {"faithful", "ours"} <= set(seeds):
        return None
    directories = {arm: {row["pretrain_seed"]: out / row["directory"] for row in rows} for arm, rows in seeds.items()}
    firsts = {row["pretrain_seed"]: row["rl_seeds"][0] for row in seeds["ours"]}
    common = sorted(set(directories["faithful"]) & set(directories["ours"]))
    if not common:
        return None

    def receipt(arm, seed, name):
        return _greedy(directories[arm][seed], "holdout", name)

    def after_name(seed):
        return f"rl-{firsts[seed]}"

    measures = {
        "ours_minus_faithful_before": {s: unit_differences(receipt("faithful", s, "before"),
                                                           receipt("ours", s, "before")) for s in common},
        "ours_minus_faithful_after": {s: unit_differences(receipt("faithful", s, after_name(s)),
                                                          receipt("ours", s, after_name(s))) for s in common},
        "rl_gain_faithful": {s: unit_differences(receipt("faithful", s, "before"),
                                                 receipt("faithful", s, after_name(s))) for s in common},
        "rl_gain_ours": {s: unit_differences(receipt("ours", s, "before"), receipt("ours", s, after_name(s)))
                         for s in common},
    }
    result = {name: two_level_comparison(values, alpha=analysis.alpha) for name, values in measures.items()}
    result["pretrain_seeds"] = common
    return result


def compare_arms(out: Path, arms: dict, seeds: dict) -> dict:
    analysis, stated = read_analysis(out)
    faithful_rows = seeds.get("faithful") or []
    return {
        "analysis": {**analysis.to_dict(), "stated": stated},
        "faithful_reproduces_original": reproduces_original(arms["faithful"]) if "faithful" in arms else None,
        "faithful_equivalent_to_original": (equivalence_to_original(faithful_rows, analysis, stated)
                                            if faithful_rows else None),
        "ours_vs_faithful_holdout": arms_on_holdout(out, arms),
        "over_pretraining_seeds": over_pretraining_seeds(seeds),
        "units_and_seeds": two_level_questions(out, seeds, analysis),
    }
