"""Pretraining-switches study: which of the pretraining switches that differ between the arms matters?

The faithful and our arm differ in three pretraining switches (reproduce.ARMS: the model's `linear_rope`
and `balance_loss`, and pretraining's `decay_all_parameters`; the faithful arm also names the stream mode,
whose value is ours too, so it is no factor). Flipping each alone would need a run per switch and seed
beside each arm's own, and each comparison would rest on two runs per seed. A two-level factorial design
estimates every switch's main effect from all of its runs at once: with the switches as factors (0: our
value, 1: the original's), the full 2^3 design runs eight points per seed, our arm's configuration 000
and the faithful arm's 111 among them (`--fraction half` halves a design of four or more switches with
the last at the parity of the others). Each run pretrains the study model from random weights with the
rl-generalisation study's recipe (the `study` preset, 2,500 steps, the suite's stream) and its last
checkpoint is evaluated greedy on dev (no checkpoint is chosen, so the tasks that judge a run chose
nothing of it). Pretraining seeds are blocks: every design point runs under every seed.

A switch's main effect is the mean dev pass rate of its runs at the original's value minus that of its
runs at ours. It is tested at the two levels that vary independently:
- structure groups: each behaviour's effect (its mean pass at 1 minus at 0 over the runs) averaged
  within its structure group (behaviours of one group are correlated), the exact sign-flip test over
  groups (each behaviour's effect alone is a secondary view);
- runs: ordinary least squares over the runs' pass rates with a block per seed and the main effects
  (the interactions left in the residual, which makes the test conservative when they are real), a
  t-test on the coefficient with the residual's degrees of freedom.
A direction needs both levels, after Holm over the switches at each level. The rule that changes a
default is fixed here, before any run: a switch whose original value is shown better on dev becomes the
default of `glm53 pretrain`. Then, once every dev run is done and that decision is written
(`selection.json`), the sealed split `compositions.unseen_structures` is opened once for the plan and
every run's last checkpoint is evaluated there; a direction shown on dev is confirmed when the same
analysis on the sealed split shows it at both levels (Holm over the directions shown on dev).
`PretrainSwitches` at the end declares the study (study.Study), its rerun comparison beside it.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from glm53_flash.core.options import option
from glm53_flash.core.receipts import read_json
from glm53_flash.core.runtime import PRECISION_HELP, PRECISIONS
from glm53_flash.experiments import generalisation as gen
from glm53_flash.experiments.config import (
    RerunnableStudyConfig, allow_dirty_option, ledger_option, open_sealed_option, parse_count_or_all, parse_seed_range,
    reopen_option,
)
from glm53_flash.experiments.reruns import RERUN_MARGIN, check_same_design, points, spread_cells, studies_compared
from glm53_flash.experiments.runner import sealed_opening
from glm53_flash.experiments.study import SELECTION_FILE, DeckEntry, MakeTarget, Study, after_holm_sentence
from glm53_flash.model.config import PRESETS
from glm53_flash.tasks import compositions

STUDY = "pretrain-switches"
FRACTIONS = ("half", "full")
DEFAULT_SEEDS = (21, 22)  # disjoint from the rl-generalisation study (1-5) and its rerun (6-10); two seeds (16 runs)
# fit a study in about two hours on a 2-core machine, which three (24) do not
SEALED_SPLIT = compositions.UNSEEN_SPLIT
ALPHA = 0.05
# The spread of a run's dev pass rate the plan's power assumes: the rl-generalisation study's pretraining
# runs (the same model, recipe and dev tasks) measured 3.6 (ours) and 5.0 (faithful) points of standard
# deviation over five seeds (results/rl-generalisation/summary.json, pretraining_on_dev); their root mean
# square. tests/test_defaults_evidence.py holds it to that summary.
ASSUMED_RUN_SD = 0.0434
# The checkpoints each run keeps until the sealed phase has read them (a study's work directory).
CHECKPOINTS_DIR = "checkpoints"


def factors() -> dict:
    """The pretraining switches that differ between the arms, in a fixed order, each with our value and
    the original's: what reproduce.ARMS sets for the faithful arm's model and pretraining where that is not
    already ours (ours sets none, so its values are the defaults of ModelConfig and PretrainConfig)."""
    from glm53_flash.experiments.reproduce import ARMS
    from glm53_flash.model.config import ModelConfig
    from glm53_flash.train.config import PretrainConfig

    ours, faithful = ARMS["ours"], ARMS["faithful"]
    if ours["model_overrides"] or ours["pretrain"]:
        raise ValueError("our arm sets pretraining switches; the study takes the defaults as our values")
    model, pretraining = ModelConfig(), PretrainConfig(output="")
    table = {name: {"where": "model", "ours": getattr(model, name), "original": value}
             for name, value in faithful["model_overrides"].items()}
    table |= {name: {"where": "pretrain", "ours": getattr(pretraining, name), "original": value}
              for name, value in faithful["pretrain"].items()}
    # sorted by name: plan.json stores the table with its keys sorted, and a point's bits follow this order
    return {name: table[name] for name in sorted(table) if table[name]["ours"] != table[name]["original"]}


def design_points(fraction: str, names) -> list[str]:
    """The design's points as strings of 0/1 in factor order (0: our value, 1: the original's): every
    combination (full), or half of them with the last factor at the parity of the others (half: with k
    switches each main effect is then aliased only with a (k-1)-switch interaction, so it needs k >= 4;
    ours, all 0, is always a point, faithful, all 1, when k is even)."""
    if fraction not in FRACTIONS:
        raise ValueError(f"unknown fraction {fraction!r}; allowed: {', '.join(FRACTIONS)}")
    k = len(names)
    if k < 1:
        raise ValueError("the arms differ in no pretraining switch: nothing to study")
    if fraction == "full":
        return ["".join(bits) for bits in itertools.product("01", repeat=k)]
    if k < 4:
        raise ValueError(f"the half fraction needs at least four switches (with {k} its main effects would be "
                         "aliased with two-switch interactions); use --fraction full")
    return ["".join(bits) + str(sum(map(int, bits)) % 2) for bits in itertools.product("01", repeat=k - 1)]


def point_label(point: str) -> str:
    return {"0" * len(point): "ours", "1" * len(point): "faithful"}.get(point, point)


def point_switches(point: str, table: dict) -> dict:
    """{"model_overrides": {...}, "pretrain": {...}} of a design point (every switch set explicitly; the
    bits follow the switches' names in sorted order, as factors() and plan.json keep them)."""
    if len(point) != len(table):
        raise ValueError(f"design point {point!r} has {len(point)} bits for {len(table)} switches")
    out = {"model_overrides": {}, "pretrain": {}}
    for bit, name in zip(point, sorted(table)):
        values = table[name]
        key = "model_overrides" if values["where"] == "model" else "pretrain"
        out[key][name] = values["original" if bit == "1" else "ours"]
    return out


def aliases(fraction: str, names) -> list[list[str]]:
    """The two-switch interaction contrasts the design can estimate, each with the ones it cannot tell it
    from (with four switches halved, D = ABC: AB = CD, AC = BD, AD = BC; with more, none are aliased)."""
    pairs = [f"{a} x {b}" for a, b in itertools.combinations(names, 2)]
    if fraction == "full" or len(names) > 4:
        return [[p] for p in pairs]
    a, b, c, d = names
    return [[f"{a} x {b}", f"{c} x {d}"], [f"{a} x {c}", f"{b} x {d}"], [f"{a} x {d}", f"{b} x {c}"]]


def run_level_power(runs: int, blocks: int, switches: int, alpha: float, power: float = 0.8) -> dict:
    """What the run-level test can detect: a main effect's OLS estimate in a balanced two-level design has
    standard error 2 sigma / sqrt(N); the residual keeps N - blocks - switches degrees of freedom."""
    from glm53_flash.core.stats import student_t_quantile

    df = runs - blocks - switches
    if df < 1:
        return {"runs": runs, "df": df, "alpha": alpha, "power": power, "mdd_in_sd": None, "mdd_points": None}
    mdd = (student_t_quantile(1 - alpha / 2, df) + student_t_quantile(power, df)) * 2 / math.sqrt(runs)
    return {"runs": runs, "df": df, "alpha": alpha, "power": power, "mdd_in_sd": mdd,
            "assumed_run_sd": ASSUMED_RUN_SD, "mdd_points": 100 * mdd * ASSUMED_RUN_SD}


def build_plan(*, seeds, fraction: str, pretrain: dict, dev_tasks: int | None, sealed_tasks: int | None,
               precision: str, workers: int, speed: dict | None) -> dict:
    """The study's plan: design (hashed), units, analysis, power and time, written before the first run."""
    from glm53_flash.experiments.study import level_power
    from glm53_flash.tasks.compositions import structure_groups

    table = factors()
    names = sorted(table)
    points = design_points(fraction, names)
    seeds = list(seeds)
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError("seeds must be given, without repeats")
    steps = pretrain["steps"]
    if steps < 1:
        raise ValueError(f"pretraining steps must be >= 1, got {steps}")
    dev_ids = gen.task_subset(gen.DEV_SPLIT, dev_tasks)
    sealed_ids = gen.task_subset(SEALED_SPLIT, sealed_tasks)
    units = [{"key": f"dev-{point}-seed-{seed}", "phase": "dev", "point": point, "seed": seed}
             for seed in seeds for point in points]
    units += [{"key": f"sealed-{point}-seed-{seed}", "phase": "sealed", "point": point, "seed": seed,
               "split": SEALED_SPLIT} for seed in seeds for point in points]
    alpha_first = ALPHA / len(names)  # Holm's first step: the level one real effect must clear alone
    runs = len(points) * len(seeds)
    estimate = {"workers": workers, "pretraining_steps": runs * steps,
                "evaluated_tasks": runs * (len(dev_ids) + len(sealed_ids)), **(speed or {})}
    estimate["expected_minutes"] = round(
        (estimate["pretraining_steps"] * speed["seconds_per_step"]
         + estimate["evaluated_tasks"] * speed["seconds_per_eval_task"]) / max(1, min(workers, runs)) / 60, 1) \
        if speed else None
    return {
        "study": STUDY,
        "design": {
            "suite": compositions.SUITE, "suite_version": compositions.VERSION,
            "factors": table, "fraction": fraction,
            "generator": "the last switch at the parity of the others" if fraction == "half" else None,
            "points": {point: point_label(point) for point in points}, "seeds": seeds,
            "pretrain": {**{k: v for k, v in pretrain.items() if k != "checkpoints"}, "checkpoints": [steps],
                         "tasks": compositions.SUITE, "sequence_length": compositions.SEQUENCE_LENGTH},
            "precision": precision,
            "dev_split": gen.DEV_SPLIT, "dev_tasks": len(dev_ids), "dev_task_ids_sha256": gen._ids_sha256(dev_ids),
            "sealed_splits": [SEALED_SPLIT], "sealed_tasks": {SEALED_SPLIT: len(sealed_ids)},
            "sealed_task_ids_sha256": {SEALED_SPLIT: gen._ids_sha256(sealed_ids)},
            "subset_sizes": {"dev": dev_tasks, "sealed": sealed_tasks},
            "evaluation": f"each run's last checkpoint, greedy pass@1 (at most {gen.MAX_NEW_TOKENS} new tokens), "
                          "judged on the three cases and on the strong set",
        },
        "units": units,
        "analysis": {
            "effect": "a switch's main effect: the mean pass rate (three cases) of its runs at the original's value "
                      "minus that of its runs at ours",
            "behaviours": "each behaviour's effect over the runs (seeds averaged), exact sign-flip over behaviours",
            "runs": "ordinary least squares over the runs' pass rates: a block per pretraining seed and the main "
                    "effects (interactions in the residual); a t-test per coefficient",
            "multiplicity": f"Holm over the {len(names)} switches at each level; a direction needs both levels",
            "default_rule": "a switch whose original value is shown better on dev becomes the default of "
                            "glm53 pretrain; one shown worse keeps ours",
            "confirmation": f"after the dev decision is written, {SEALED_SPLIT} opened once for the plan: a direction "
                            "shown on dev is confirmed when the sealed split shows it at both levels (Holm over the "
                            "directions shown on dev)",
            "interactions": [" = ".join(group) for group in aliases(fraction, names)],
            "alpha": ALPHA,
        },
        # stated before the first run, outside the hashed design (as the estimate)
        "power": {f"over runs, at Holm's first step (alpha {ALPHA}/{len(names)})":
                  run_level_power(runs, len(seeds), len(names), alpha_first),
                  f"over structure groups, at Holm's first step (alpha {ALPHA}/{len(names)})":
                  {**level_power(len(set(structure_groups(dev_ids).values())), "sign-flip", alpha=alpha_first),
                   "unit": "structure groups"}},
        "estimate": estimate,
    }


def power_lines(plan: dict) -> list[str]:
    lines = []
    for name, level in plan["power"].items():
        if "runs" in level:
            lines.append(f"power, {name}: {level['runs']} runs, {level['df']} residual df: detects a main effect of "
                         + ("nothing" if level["mdd_in_sd"] is None else
                            f"{level['mdd_in_sd']:.2f} run standard deviations ({level['mdd_points']:.1f} points at "
                            f"the assumed sd of {100 * level['assumed_run_sd']:.1f} points)")
                         + f" with {round(100 * level['power'])}% power")
        else:
            mdd = level["mdd_in_sd"]
            unit = level.get("unit", "behaviours")  # a plan stated before the unit was the structure group counted these
            lines.append(f"power, {name}: {level['n']} {unit} (sign-flip): "
                         + ("nothing" if mdd is None else f"{mdd:.2f} standard deviations of a unit's effect")
                         + f" with {round(100 * level['power'])}% power")
    return lines


# --------------------------------------------------------------------------- the units


def checkpoint_dir(work_dir: str) -> Path:
    return Path(work_dir).parent.parent / CHECKPOINTS_DIR / Path(work_dir).name


def run_unit(unit: dict) -> dict:
    """Worker entry point: a dev unit pretrains one design point under one seed and evaluates its last
    checkpoint on dev (the checkpoint kept for the sealed phase); a sealed unit evaluates that checkpoint
    on the sealed split, under the plan's opening."""
    import torch

    torch.set_num_threads(1)
    started = time.perf_counter()
    result = (_dev_unit if unit["phase"] == "dev" else _sealed_unit)(unit)
    return {"phase": unit["phase"], "point": unit["point"], "seed": unit["seed"], **result,
            "elapsed_seconds": round(time.perf_counter() - started, 3)}


def _dev_unit(unit: dict) -> dict:
    from glm53_flash.model.lm import load_pretrained
    from glm53_flash.verifier import Verifier

    design, device = unit["design"], unit.get("device", "cpu")
    switches = point_switches(unit["point"], design["factors"])
    work = Path(unit["work_dir"])
    receipt = gen.pretrain_run(design, unit["seed"], work, device, switches)
    last = receipt["checkpoints"][-1]
    kept = checkpoint_dir(unit["work_dir"])
    if kept.exists():
        shutil.rmtree(kept)
    kept.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(last["path"], kept)
    shutil.rmtree(work, ignore_errors=True)
    model, meta = load_pretrained(kept, device)
    if meta["weights_sha256"] != last["weights_sha256"]:
        raise ValueError(f"{kept} changed while it was kept")
    tasks = gen._tasks(gen.DEV_SPLIT, gen._design_ids(design, gen.DEV_SPLIT))
    with Verifier(workers=1) as verifier:
        evaluation = gen._evaluate(model, tasks, design, verifier)
    curve = receipt["training_curve"]
    return {"switches": switches, "checkpoint": {"path": str(kept), "step": last["step"],
                                                 "weights_sha256": last["weights_sha256"]},
            "training": {"elapsed_seconds": receipt["elapsed_seconds"], "tokens_seen": receipt["tokens_seen"],
                         "final_loss": curve[-1]["loss"] if curve else None,
                         "parameters": receipt["parameter_counts"]},
            "evaluation": {k: evaluation[k] for k in ("summary", "by_kind", "outcomes")}}


def _sealed_unit(unit: dict) -> dict:
    from glm53_flash.verifier import Verifier

    design, device = unit["design"], unit.get("device", "cpu")
    source = unit["checkpoint"]
    model, _ = gen._check_weights(source["path"], source["weights_sha256"], device)
    opening = unit.get("opening")
    ids = gen._design_ids(design, SEALED_SPLIT)
    tasks = gen._tasks(SEALED_SPLIT, ids, opening=opening)
    with Verifier(workers=1) as verifier:
        evaluation = gen._evaluate(model, tasks, design, verifier, opening=opening)
    return {"split": SEALED_SPLIT, "checkpoint": source, "task_ids": ids,
            "passed": gen._bits(evaluation["outcomes"][t][0] for t in ids),
            "strong_passed": gen._bits(evaluation["outcomes"][t][1] for t in ids),
            "summary": evaluation["summary"],
            "sealed_opening": None if opening is None else {"split": opening.split, "purpose": opening.purpose}}


def measure_speed(design: dict, device: str = "cpu") -> dict:
    """Seconds per pretraining step and per evaluated dev task on this machine, one thread, as each worker
    runs: the median step after the first of a short run (gen.probe_pretraining_step), and the marginal cost
    of a dev task after an untimed warm-up (gen.probe_evaluation), so one-off costs (building the model and
    the kernels, starting the verifier) do not distort the estimate. The probe's model is untrained, so it
    writes every completion to the cap: the task's cost is an upper bound."""
    import tempfile

    import torch

    from glm53_flash.model.lm import load_pretrained

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory(prefix="glm53-pretrain-switches-probe-") as tmp:
            step, checkpoint = gen.probe_pretraining_step(design["pretrain"], design["precision"], device,
                                                          f"{tmp}/pretrain")
            model, _ = load_pretrained(checkpoint, device)
            task = gen.probe_evaluation(model, design["precision"])
    finally:
        torch.set_num_threads(before)
    return {"seconds_per_step": round(step, 4), "seconds_per_eval_task": round(task, 4),
            "probe": "the median pretraining step after the first of six; evaluation of 12 dev tasks minus 4 after "
                     "an untimed warm-up"}


# --------------------------------------------------------------------------- analysis


def _pass_rate(outcomes: dict) -> float:
    return sum(1 for v in outcomes.values() if v[0]) / len(outcomes)


def _outcomes_of(receipt: dict) -> dict:
    if receipt["phase"] == "dev":
        return receipt["evaluation"]["outcomes"]
    return {t: [p == "1", s == "1"] for t, p, s in zip(receipt["task_ids"], receipt["passed"], receipt["strong_passed"])}


def run_values(plan: dict, receipts: list[dict], phase: str) -> list[dict] | None:
    """Every run of `phase` as stats.factorial_effects takes it (a block per pretraining seed, each switch's
    level, the pass rate), in seed then point order; None until every run of the phase has its receipt."""
    design = plan["design"]
    names = sorted(design["factors"])
    found = {(r["point"], r["seed"]): _outcomes_of(r) for r in receipts if r["phase"] == phase}
    points, seeds = list(design["points"]), design["seeds"]
    if any((p, s) not in found for p in points for s in seeds):
        return None
    return [{"block": str(s), "levels": {n: int(b) for n, b in zip(names, p)}, "value": _pass_rate(found[(p, s)])}
            for s in seeds for p in points]


def main_effects(plan: dict, receipts: list[dict], phase: str) -> dict | None:
    """Every switch's main effect on `phase`'s split (dev or sealed) at both levels, over structure groups
    (each group's tasks read from the suite by their ids) and over runs, Holm over the switches at each
    level; each behaviour's effect as a secondary view. None until every run of the phase has its receipt."""
    from glm53_flash.core.stats import (
        bootstrap_ci, detectable_differences, factorial_effects, group_means, holm, sign_flip_p,
    )
    from glm53_flash.tasks.compositions import structure_groups

    design = plan["design"]
    names = sorted(design["factors"])
    found = {(r["point"], r["seed"]): _outcomes_of(r) for r in receipts if r["phase"] == phase}
    points, seeds = list(design["points"]), design["seeds"]
    runs = run_values(plan, receipts, phase)
    if runs is None:
        return None
    tasks = sorted(next(iter(found.values())))
    groups = structure_groups(tasks)
    fitted = factorial_effects(runs, names)

    def level(values: list[float]) -> dict:
        return {"n": len(values), "mean": sum(values) / len(values), "sign_flip_p": sign_flip_p(values, seed=0),
                "interval": list(bootstrap_ci(values, level=1 - ALPHA, seed=0)),
                "positive": sum(d > 0 for d in values), "negative": sum(d < 0 for d in values)}

    rows = []
    for index, name in enumerate(names):
        high = [(p, s) for p in points for s in seeds if p[index] == "1"]
        low = [(p, s) for p in points for s in seeds if p[index] == "0"]
        per_behaviour = [sum(found[k][t][0] for k in high) / len(high) - sum(found[k][t][0] for k in low) / len(low)
                         for t in tasks]
        per_group = list(group_means({"all": dict(zip(tasks, per_behaviour))}, groups)["all"].values())
        # the spread a group-level test could work with: each seed's contrast per structure group
        differences = {str(s): {t: (sum(found[(p, s)][t][0] for p in points if p[index] == "1")
                                    - sum(found[(p, s)][t][0] for p in points if p[index] == "0"))
                                / (len(points) / 2) for t in tasks} for s in seeds}
        rows.append({"switch": name, "ours": design["factors"][name]["ours"],
                     "original": design["factors"][name]["original"],
                     "effect": fitted["effects"][name]["estimate"],
                     "groups": level(per_group), "behaviours": level(per_behaviour),
                     "runs": fitted["effects"][name],
                     "detectable_groups": detectable_differences(group_means(differences, groups),
                                                                 ALPHA / len(names))["units"]})
    group_p = holm([row["groups"]["sign_flip_p"] for row in rows])
    run_p = holm([row["runs"]["p"] for row in rows])
    for row, gp, rp in zip(rows, group_p, run_p):
        same = (row["groups"]["mean"] > 0) == (row["effect"] > 0) and row["effect"] != 0
        row["holm"] = {"groups_p": gp, "runs_p": rp}
        row["verdict"] = (("original better" if row["effect"] > 0 else "ours better")
                          if gp < ALPHA and rp < ALPHA and same else "not shown")
        row["detectable_runs"] = None if fitted["residual_sd"] is None else \
            run_level_power(len(runs), len(seeds), len(names), ALPHA / len(names))["mdd_in_sd"] * fitted["residual_sd"]
    interactions = []
    for group in aliases(design["fraction"], names):
        a, b = (names.index(n) for n in group[0].split(" x "))
        same = [run["value"] for run, (p, _) in zip(runs, [(p, s) for s in seeds for p in points]) if p[a] == p[b]]
        other = [run["value"] for run, (p, _) in zip(runs, [(p, s) for s in seeds for p in points]) if p[a] != p[b]]
        interactions.append({"name": " = ".join(group), "estimate": sum(same) / len(same) - sum(other) / len(other)})
    ours, faithful = "0" * len(names), "1" * len(names)
    arms = [_pass_rate(found[(faithful, s)]) - _pass_rate(found[(ours, s)]) for s in seeds] \
        if faithful in design["points"] else None
    return {"phase": phase, "split": gen.DEV_SPLIT if phase == "dev" else SEALED_SPLIT, "tasks": len(tasks),
            "runs": len(runs), "residual_sd": fitted["residual_sd"], "df": fitted["df"],
            "pass_rates": {f"{p}-seed-{s}": _pass_rate(found[(p, s)]) for p in points for s in seeds},
            "switches": rows, "interactions": interactions,
            "faithful_minus_ours": None if arms is None else {"per_seed": arms, "mean": sum(arms) / len(arms)}}


def decision(plan: dict, dev: dict) -> dict:
    """The plan's rule applied to the dev analysis: the defaults of glm53 pretrain it supports."""
    changes = {row["switch"]: row["original"] for row in dev["switches"] if row["verdict"] == "original better"}
    return {"rule": plan["analysis"]["default_rule"],
            "shown": {row["switch"]: row["verdict"] for row in dev["switches"] if row["verdict"] != "not shown"},
            "defaults": {row["switch"]: changes.get(row["switch"], row["ours"]) for row in dev["switches"]},
            "changed": changes}


def confirmation(plan: dict, selection: dict, sealed: dict) -> dict:
    """Each direction shown on dev, on the sealed split: confirmed when shown there at both levels with the
    same sign, Holm over those directions."""
    from glm53_flash.core.stats import holm

    shown = selection["shown"]
    rows = {row["switch"]: row for row in sealed["switches"]}
    names = [name for name in shown]
    if not names:
        return {"directions": {}, "note": "no direction was shown on dev: nothing to confirm; the sealed split's "
                                          "effects are reported as they are"}
    group_p = holm([rows[n]["groups"]["sign_flip_p"] for n in names])
    run_p = holm([rows[n]["runs"]["p"] for n in names])
    out = {}
    for name, gp, rp in zip(names, group_p, run_p):
        expected_positive = shown[name] == "original better"
        row = rows[name]
        same = (row["effect"] > 0) == expected_positive and (row["groups"]["mean"] > 0) == expected_positive
        out[name] = {"dev": shown[name], "sealed_effect": row["effect"], "holm": {"groups_p": gp, "runs_p": rp},
                     "confirmed": bool(same and gp < ALPHA and rp < ALPHA)}
    return {"directions": out}


def _points(value) -> str:
    return "n/a" if value is None else f"{100 * value:+.1f}"


def headline_table(effects: dict) -> dict:
    """Per switch: its main effect over runs, the mean effect over structure groups with its interval, the
    runs' interval, Holm's p at each level, what each level could detect, the result after Holm, and the
    behaviours' mean effect as a secondary view."""
    columns = ["switch", "ours -> original", "effect over runs (points)", "over groups (points, CI)", "runs CI",
               "Holm p (groups / runs)", "detectable (groups / runs)", "result after Holm",
               "behaviours (secondary: points, CI)"]
    rows = []
    for row in effects["switches"]:
        g, b, r = row["groups"], row["behaviours"], row["runs"]
        rows.append([row["switch"], f"{row['ours']} -> {row['original']}", _points(row["effect"]),
                     f"{_points(g['mean'])} [{_points(g['interval'][0])}, {_points(g['interval'][1])}]",
                     f"[{_points(r['interval'][0])}, {_points(r['interval'][1])}]",
                     f"{row['holm']['groups_p']:.3g} / {row['holm']['runs_p']:.3g}",
                     f"{_points(row['detectable_groups']).lstrip('+')} / {_points(row['detectable_runs']).lstrip('+')}",
                     row["verdict"], f"{_points(b['mean'])} [{_points(b['interval'][0])}, {_points(b['interval'][1])}]"])
    return {"columns": columns, "rows": rows}


def answers(summary: dict) -> list[str]:
    """The study's answers: per switch its dev effect and its result after Holm over the switches at groups
    and runs; the arms' difference; the defaults the plan's rule chose (selection.json, written before the
    sealed split was opened: where today's analysis shows otherwise, it says so); the sealed confirmation."""
    from glm53_flash.experiments.study import after_holm

    dev = summary.get("dev")
    if dev is None:
        return ["Not every dev run has finished: no answer yet."]
    lines = []
    count = len(dev["switches"])
    for row in dev["switches"]:
        lines.append(f"{row['switch']} ({row['ours']} -> {row['original']}): {_points(row['effect'])} points on dev "
                     f"over runs, {_points(row['groups']['mean'])} over {row['groups']['n']} structure groups: "
                     f"{after_holm(row['verdict'], count, 'groups and runs')} (Holm p groups "
                     f"{row['holm']['groups_p']:.3g}, runs {row['holm']['runs_p']:.3g}; detectable "
                     f"{_points(row['detectable_groups']).lstrip('+')} over groups, "
                     f"{_points(row['detectable_runs']).lstrip('+')} over runs; over behaviours, a secondary view, "
                     f"{_points(row['behaviours']['mean'])})")
    arms = dev["faithful_minus_ours"]
    if arms is not None:
        lines.append(f"The faithful configuration minus ours on dev, per seed: "
                     f"{', '.join(_points(v) for v in arms['per_seed'])} points (mean {_points(arms['mean'])}).")
    selection = summary["selection"]
    lines.append("Defaults of glm53 pretrain by the plan's rule: " + (
        "unchanged (no original value better on dev)." if not selection["changed"] else
        "changed: " + ", ".join(f"{k} = {v}" for k, v in selection["changed"].items()) + "."))
    today = {row["switch"]: row["verdict"] for row in dev["switches"] if row["verdict"] != "not shown"}
    if today != selection["shown"]:
        lines.append("The dev decision (selection.json) was written before the sealed split was opened, under the "
                     "analysis of its time, and showed "
                     + (", ".join(f"{k} {v}" for k, v in selection["shown"].items()) or "nothing")
                     + "; this analysis shows " + (", ".join(f"{k} {v}" for k, v in today.items()) or "nothing")
                     + " on dev. The sealed split confirms the decision's directions.")
    if summary.get("confirmation") is not None:
        directions = summary["confirmation"]["directions"]
        lines.append("On the sealed split: " + ("; ".join(
            f"{name} {d['dev']}: {'confirmed' if d['confirmed'] else 'not confirmed'} at groups and runs after Holm "
            f"over {len(directions)} direction{'s' if len(directions) != 1 else ''} ({_points(d['sealed_effect'])} "
            f"points)" for name, d in directions.items()) if directions else summary["confirmation"]["note"]) + ".")
    return lines


def compute(plan: dict, receipts: list[dict], selection: dict | None = None) -> dict:
    dev = main_effects(plan, receipts, "dev")
    summary = {"study": STUDY, "plan_sha256": plan.get("plan_sha256"), "runs": len(receipts), "dev": dev}
    if dev is None:
        return summary | {"selection": None, "sealed": None, "confirmation": None, "complete": False}
    summary["selection"] = selection if selection is not None else decision(plan, dev)
    sealed = main_effects(plan, receipts, "sealed")
    summary["sealed"] = sealed
    summary["confirmation"] = None if sealed is None else confirmation(plan, summary["selection"], sealed)
    summary["complete"] = sealed is not None
    return summary


def report_lines(plan: dict, summary: dict) -> list[str]:
    design = plan["design"]
    names = sorted(design["factors"])
    lines = [f"# {STUDY}: which pretraining switch matters?", "",
             f"Design: the {design['fraction']} fraction of the 2^{len(names)} factorial over "
             f"{', '.join(names)} ({len(design['points'])} points"
             + (f", {design['generator']}" if design["generator"] else "") + f") x pretraining seeds "
             f"{', '.join(map(str, design['seeds']))}; the study model, {design['pretrain']['steps']} steps; each "
             f"run's last checkpoint on {design['dev_tasks']} dev tasks"
             + f", then on {design['sealed_tasks'][SEALED_SPLIT]} tasks of the sealed {SEALED_SPLIT}.", "",
             "## Power, stated before the runs", "", *(f"- {line}" for line in power_lines(plan)), ""]
    for phase, title in (("dev", "## Main effects on dev"), ("sealed", f"## Main effects on the sealed {SEALED_SPLIT}")):
        effects = summary.get(phase)
        if effects is None:
            lines += [title, "", "Not every run of this phase has finished.", ""]
            continue
        table = headline_table(effects)
        lines += [title, "", "| " + " | ".join(table["columns"]) + " |", "|" + "---|" * len(table["columns"])]
        lines += ["| " + " | ".join(row) + " |" for row in table["rows"]]
        lines += ["", f"Residual sd of a run's pass rate: {_points(effects['residual_sd']).lstrip('+')} points "
                      f"({effects['df']} df). Two-switch interaction contrasts (aliased groups): "
                  + "; ".join(f"{i['name']} {_points(i['estimate'])}" for i in effects["interactions"]) + ".", ""]
    lines += ["## Answers", "", *(f"- {a}" for a in summary["answers"]), "",
              "Points of greedy pass@1 (the three cases): a switch's runs at the original's value minus its runs at "
              "ours. Groups: each behaviour's effect averaged within its structure group (behaviours of one group "
              "are correlated), the exact sign-flip test over groups, bootstrap interval; runs: least squares with "
              "a block per seed, t interval. A direction needs both levels after Holm over the switches. "
              "`detectable`: the smallest effect each level would show at Holm's first step with 80% power, from "
              "the spread it measured. Behaviours, each its own unit, are a secondary view.", ""]
    return lines


def analyze(out: Path, plan: dict, receipts: list[dict]) -> tuple[dict, list[str], dict]:
    from glm53_flash.report import study_charts

    selection_path = Path(out) / "selection.json"
    selection = read_json(selection_path) if selection_path.exists() else None
    if selection is not None and selection.get("plan_sha256") != plan["plan_sha256"]:
        selection = None
    summary = compute(plan, receipts, selection)
    summary["answers"] = answers(summary)
    if summary["dev"] is not None:
        summary["headline_table"] = headline_table(summary["dev"])
    lines = report_lines(plan, summary)
    charts = {}
    if summary["dev"] is not None:
        charts = study_charts.insert_effects_chart(out, lines, study_charts.draw_pretrain_switches(summary),
                                                   "## Main effects on dev", "each switch's main effect")
    return summary, lines, charts


# --------------------------------------------------------------------------- the rerun


def check_rerun_design(first: dict, rerun: dict) -> None:
    """Two pretrain-switches studies that may be compared: the same design but for their pretraining seeds,
    which must not overlap."""
    check_same_design(first, rerun, STUDY, ("seeds",), "their pretraining seeds", True)


def main_effect_spread(first_runs: list[dict], rerun_runs: list[dict], names: list[str], margin: float,
                       alpha: float) -> dict:
    """Each switch's main effect in the rerun minus in the first study, from one least-squares fit over
    both studies' runs: a mean per pretraining seed (the seeds are disjoint, so the blocks hold the studies
    apart too), every switch's main effect, and per switch a factor that is 1 where the switch's level
    equals the run's study (0: first, 1: rerun). Coded -1/2, +1/2, that factor is twice the product of
    the two, so its coefficient is half the difference: the estimate, its (1 - 2 alpha) interval on the
    residual's degrees of freedom, and equivalence within +- margin (two one-sided tests)."""
    from glm53_flash.core.stats import factorial_effects

    differs = {name: f"{name} in the rerun" for name in names}
    runs = []
    for study, group in ((0, first_runs), (1, rerun_runs)):
        for run in group:
            levels = dict(run["levels"]) | {differs[n]: int(run["levels"][n] == study) for n in names}
            runs.append({"block": f"{study}-{run['block']}", "levels": levels, "value": run["value"]})
    fitted = factorial_effects(runs, names + list(differs.values()), alpha=2 * alpha)
    out = {}
    for name in names:
        effect = fitted["effects"][differs[name]]
        low, high = (2 * bound for bound in effect["interval"])
        out[name] = {"difference": 2 * effect["estimate"], "interval": [low, high], "df": effect["df"],
                     "p": effect["p"], "smallest_margin": max(abs(low), abs(high)),
                     "equivalent": bool(-margin < low and high < margin)}
    return out


def compare_rerun(first_plan: dict, first_receipts: list[dict], rerun_plan: dict,
                  rerun_receipts: list[dict], margin: float = RERUN_MARGIN) -> dict:
    """Two pretrain-switches studies on disjoint pretraining seeds, per phase both have finished (dev; the
    sealed split once both opened it) and per switch: each study's verdict and its directions after Holm
    over structure groups and over runs; the row holds when both agree on all three; the rerun spread
    (main_effect_spread); and both studies' runs analysed as one factorial (a secondary view)."""
    check_rerun_design(first_plan, rerun_plan)
    alpha = first_plan["analysis"]["alpha"]
    names = sorted(first_plan["design"]["factors"])
    pooled_plan = {**first_plan, "design": {**first_plan["design"],
                                            "seeds": first_plan["design"]["seeds"] + rerun_plan["design"]["seeds"]}}

    def directions(row) -> dict:
        out = {}
        for level, mean, p in (("groups", row["groups"]["mean"], row["holm"]["groups_p"]),
                               ("runs", row["effect"], row["holm"]["runs_p"])):
            out[level] = "0" if p >= alpha or not mean else "+" if mean > 0 else "-"
        return out

    phases = {}
    for phase in ("dev", "sealed"):
        a, b = main_effects(first_plan, first_receipts, phase), main_effects(rerun_plan, rerun_receipts, phase)
        if a is None or b is None:
            continue
        spread = main_effect_spread(run_values(first_plan, first_receipts, phase),
                                    run_values(rerun_plan, rerun_receipts, phase), names, margin, alpha)
        pooled = main_effects(pooled_plan, first_receipts + rerun_receipts, phase)
        rows_b = {row["switch"]: row for row in b["switches"]}
        rows_pooled = {row["switch"]: row for row in pooled["switches"]}
        rows = []
        for row in a["switches"]:
            other, both = rows_b[row["switch"]], rows_pooled[row["switch"]]
            da, db = directions(row), directions(other)
            rows.append({"switch": row["switch"], "ours": row["ours"], "original": row["original"],
                         "first": {"effect": row["effect"], "verdict": row["verdict"]},
                         "rerun": {"effect": other["effect"], "verdict": other["verdict"]},
                         "directions": {level: [da[level], db[level]] for level in da},
                         "holds": row["verdict"] == other["verdict"] and da == db,
                         "spread": spread[row["switch"]],
                         "pooled": {"effect": both["effect"], "verdict": both["verdict"], "holm": both["holm"],
                                    "runs_interval": both["runs"]["interval"]}})
        phases[phase] = {"rows": rows, "all_hold": all(r["holds"] for r in rows)}
    return {"study": STUDY,
            **studies_compared(first_plan, rerun_plan, "seeds"),
            "alpha": alpha, "margin": margin, "phases": phases,
            "rule": "a switch holds when both studies give the same verdict and the same direction (or none) after "
                    "Holm over structure groups and over runs; it reproduces its size when the 90% interval of the "
                    "rerun's main effect minus the first's (one least-squares fit over both studies' runs) lies "
                    "within +- the margin"}


def rerun_report_lines(comparison: dict, first_name: str) -> list[str]:
    lines = ["", f"## Against the first study (`{first_name}`, pretraining seeds "
                 f"{', '.join(map(str, comparison['first']['seeds']))})", "",
             f"Rule: {comparison['rule']}; margin {100 * comparison['margin']:.1f} points. Main effects in points "
             "of greedy pass@1, the original's value minus ours.", ""]
    for phase, result in comparison["phases"].items():
        lines += [f"### {phase}", "",
                  "| switch | first | rerun | holds (groups, runs) | rerun - first, 90% CI | within the margin | "
                  "both together | result together |", "|---|---|---|---|---|---|---|---|"]
        for row in result["rows"]:
            s, d, both = row["spread"], row["directions"], row["pooled"]
            lines.append(
                f"| {row['switch']} | {points(row['first']['effect'])} {row['first']['verdict']} | "
                f"{points(row['rerun']['effect'])} {row['rerun']['verdict']} | "
                f"{'yes' if row['holds'] else 'NO'} ({'/'.join(d['groups'])}, {'/'.join(d['runs'])}) | "
                f"{spread_cells(s)} | "
                f"{points(both['effect'])} | {both['verdict']} |")
        lines.append("")
    lines += ["`holds` lists each level's direction after Holm in the first study / the rerun (`+` the original's "
              "value raises the pass rate at alpha, `-` lowers it, `0` not shown). `both together` is one factorial "
              "over both studies' runs, a secondary view neither plan made alone.", ""]
    return lines


# --------------------------------------------------------------------------- the study's declaration


_PRETRAIN = gen.PRETRAIN_DEFAULTS


@dataclass(kw_only=True)
class PretrainSwitchesStudyConfig(RerunnableStudyConfig):
    """Every knob of `glm53 experiment pretrain-switches`; the design in plan.json comes from these."""

    seeds: tuple[int, ...] = option(DEFAULT_SEEDS, parse=parse_seed_range,
                                    help="pretraining seeds (blocks: every design point runs under each)",
                                    default_text=",".join(map(str, DEFAULT_SEEDS)))
    fraction: str = option("full", choices=FRACTIONS,
                           help="the design: full (every combination of the switches: 2^3 = 8 runs per seed) or "
                                "half (four or more switches: the last at the parity of the others)")
    preset: str = option(_PRETRAIN["preset"], choices=tuple(sorted(PRESETS)), help="model preset")
    steps: int = option(_PRETRAIN["steps"], help="pretraining steps per run (its last checkpoint is evaluated)")
    learning_rate: float = option(_PRETRAIN["learning_rate"], help="pretraining peak learning rate (constant after warmup)")
    warmup: int = option(_PRETRAIN["warmup"], help="pretraining warmup steps")
    batch_size: int = option(_PRETRAIN["batch_size"], help="pretraining sequences per step (192 tokens each)")
    dev_tasks: int | None = option(None, parse=parse_count_or_all, metavar="N|all",
                                   help="dev tasks every run is evaluated on (a fixed subset by hash)",
                                   default_text="all 621")
    sealed_tasks: int | None = option(None, parse=parse_count_or_all, metavar="N|all",
                                      help="tasks of the sealed compositions.unseen_structures evaluated (a fixed "
                                           "subset by hash)", default_text="all 1,030")
    precision: str = option("auto", choices=PRECISIONS, help=PRECISION_HELP + "; part of the design")
    open_sealed: str | None = open_sealed_option("after every dev run and the decision, evaluate every run on the "
                                                 "sealed split: say why it is opened (recorded in the ledger, once "
                                                 "for the plan)", "none: the study stops after its dev runs and decision")
    reopen: str | None = reopen_option("open the sealed split again for a plan that already opened it")
    allow_dirty: bool = allow_dirty_option()
    ledger: str | None = ledger_option()

    def __post_init__(self) -> None:
        self.seeds = tuple(self.seeds)

    def pretrain_recipe(self) -> dict:
        return {"preset": self.preset, "steps": self.steps, "learning_rate": self.learning_rate, "warmup": self.warmup,
                "batch_size": self.batch_size}


def deck_figures(slide_id: str, summary: dict, directory: Path) -> tuple[list, bool]:
    from glm53_flash.report import study_charts

    return [(study_charts.draw_pretrain_switches(summary, size=(12, 5.4)), f"{slide_id.removeprefix('research-')}-effects",
             "each pretraining switch's main effect on the pass rate, on dev and on the sealed split, with its "
             "intervals over behaviours and over runs")], False


# What `make` runs of this study (the Makefile's generated block; recipe lines indented by four spaces a tab).
MAKE_TARGETS = (
    MakeTarget("study-pretrain-switches", r"""
# Which pretraining switch matters: every combination of the three that differ between the arms, under each
# pretraining seed (docs/STUDIES.md); dev decides the defaults (selection.json), then the sealed split is
# opened once for the plan to confirm. The rerun is the same design on disjoint seeds.
PRETRAIN_SWITCHES_PURPOSE ?= make study-pretrain-switches: every run's last checkpoint, after the dev decision
study-pretrain-switches: $(STAMP)
    $(BIN)/glm53 experiment pretrain-switches --output runs/study-pretrain-switches --precision $(STUDY_PRECISION) \
        --open-sealed "$(PRETRAIN_SWITCHES_PURPOSE)"
"""),
    MakeTarget("study-pretrain-switches-rerun", r"""
study-pretrain-switches-rerun: $(STAMP)
    $(BIN)/glm53 experiment pretrain-switches --output runs/study-pretrain-switches-rerun --seeds 24,25 \
        --precision $(STUDY_PRECISION) --rerun-of results/pretrain-switches \
        --open-sealed "$(PRETRAIN_SWITCHES_PURPOSE) (the rerun on disjoint pretraining seeds)"
"""),
)


class PretrainSwitches(Study):
    name = STUDY
    config = PretrainSwitchesStudyConfig
    help = ("which pretraining switch matters: a two-level factorial over the three that differ between the arms, "
            "on dev, confirmed on a sealed split")
    description = ("The pretraining switches that differ between the faithful and our arm (three) as the factors "
                   "of a two-level factorial design (--fraction full: every combination, 8 runs per seed), "
                   "every point pretrained from random weights under every seed (the study model, the "
                   "rl-generalisation recipe); each run's last checkpoint evaluated greedy on dev; each switch's "
                   "main effect tested over behaviours and over runs (least squares, a block per seed), Holm over "
                   "the switches. Then the plan's rule picks the defaults (selection.json) and, with "
                   "--open-sealed, every run is evaluated on compositions.unseen_structures, opened once for the "
                   "plan, to confirm what dev showed. Resumable. Analyse with `glm53 analyze DIR`.")
    deck = (DeckEntry("research-pretrain-switches", "Research study: which pretraining switch matters?",
                      "make study-pretrain-switches", "pretrain-switches/summary.json", deck_figures),
            DeckEntry("research-pretrain-switches-rerun", "Research study: which pretraining switch matters? The rerun",
                      "make study-pretrain-switches-rerun", "pretrain-switches-rerun/summary.json", deck_figures))
    make_targets = MAKE_TARGETS
    rerunnable = True

    def plan(self, cfg: PretrainSwitchesStudyConfig, speed: dict | None) -> dict:
        from glm53_flash.core.runtime import resolve_device
        from glm53_flash.model.precision import resolve_precision

        return build_plan(seeds=cfg.seeds, fraction=cfg.fraction, pretrain=cfg.pretrain_recipe(),
                          dev_tasks=cfg.dev_tasks, sealed_tasks=cfg.sealed_tasks,
                          precision=resolve_precision(cfg.precision, str(resolve_device(cfg.device))).name,
                          workers=cfg.workers, speed=speed)

    def speed(self, cfg: PretrainSwitchesStudyConfig, draft: dict) -> dict:
        from glm53_flash.core.runtime import resolve_device

        print(f"{STUDY}: timing this machine (pretraining steps, dev tasks; one thread, as each worker runs)",
              file=sys.stderr)
        return measure_speed(draft["design"], str(resolve_device(cfg.device)))

    def power_lines(self, plan: dict) -> list[str]:
        return power_lines(plan)

    @contextlib.contextmanager
    def sealed_openings(self, cfg: PretrainSwitchesStudyConfig, out: Path, draft: dict):
        # The sealed split's opening is granted here, before the study directory is touched (a refused one costs
        # no training); its units run only after every dev run has finished and the decision is written.
        opening = None if cfg.plan_only or cfg.open_sealed is None else sealed_opening(cfg, out, draft)
        try:
            yield opening
        finally:
            if opening is not None:
                opening.close()

    def run(self, session) -> int:
        """Every dev run, then the plan's decision (selection.json, written once every dev run has its
        receipt), then, under the sealed split's opening, every run's checkpoint on the sealed split."""
        plan, work = session.plan, session.work_dir()
        dev = [u | {"work_dir": str(work / u["key"])} for u in plan["units"] if u["phase"] == "dev"]
        ran = session.run(dev, run_unit)
        if session.pending(dev):
            return ran  # another shard's dev runs are not done yet: no decision, no sealed split
        receipts = session.receipts()
        selection = session.decide(lambda receipts: decision(plan, main_effects(plan, receipts, "dev")))
        print(f"{STUDY}: the dev decision ({session.out / SELECTION_FILE}): "
              + (", ".join(f"{k} = {v}" for k, v in selection["changed"].items()) or "the defaults stay"),
              file=sys.stderr)
        sealed = [u for u in plan["units"] if u["phase"] == "sealed"]
        if not session.pending(sealed):
            return ran
        if session.openings is None:
            print(f"{STUDY}: the dev runs are done; pass --open-sealed \"<purpose>\" to evaluate every run on "
                  f"{SEALED_SPLIT} (opened once for the plan)", file=sys.stderr)
            return ran
        checkpoints = {(r["point"], r["seed"]): r["checkpoint"] for r in receipts if r["phase"] == "dev"}
        resolved = [u | {"checkpoint": checkpoints[(u["point"], u["seed"])]} for u in sealed]
        return ran + session.run(resolved, run_unit, session.openings)

    def analyze(self, out: Path, plan: dict, receipts: list[dict]) -> tuple[dict, list[str], dict]:
        return analyze(out, plan, receipts)

    def answer(self, plan: dict, summary: dict) -> str:
        """Each switch's main effect on dev after Holm over the switches at structure groups and runs, and the
        sealed split's confirmation of what dev showed."""
        dev = summary.get("dev")
        if dev is None:
            return "Not every dev run has finished: no answer yet."
        text = after_holm_sentence(
            f"Each pretraining switch's main effect on the dev pass rate, the original's value minus ours (over "
            f"structure groups and {dev['runs']} runs)",
            [(f"{row['switch']} {_points(row['effect'])} points", row["verdict"] != "not shown")
             for row in dev["switches"]], len(dev["switches"]), "groups and runs")
        confirmation = summary.get("confirmation")
        if confirmation is not None and confirmation["directions"]:
            directions = confirmation["directions"]
            text += " " + after_holm_sentence(
                "On the sealed split, the directions dev showed",
                [(f"{name} {d['dev']} ({_points(d['sealed_effect'])} points)", d["confirmed"])
                 for name, d in directions.items()], len(directions), "groups and runs")
        return text

    def check_rerun(self, first_plan: dict, plan: dict) -> None:
        check_rerun_design(first_plan, plan)

    def compare_rerun(self, first_plan: dict, first_receipts: list[dict], plan: dict, receipts: list[dict]) -> dict:
        return compare_rerun(first_plan, first_receipts, plan, receipts)

    def rerun_report_lines(self, comparison: dict, first_name: str) -> list[str]:
        return rerun_report_lines(comparison, first_name)

    def rerun_verdicts(self, comparison: dict) -> dict:
        """A verdict per phase both studies finished (dev; the sealed split once both opened it)."""
        return {f"every row holds in the rerun ({phase})": result["all_hold"]
                for phase, result in comparison["phases"].items()}


__all__ = ["ALPHA", "ASSUMED_RUN_SD", "DEFAULT_SEEDS", "FRACTIONS", "SEALED_SPLIT", "STUDY", "PretrainSwitches",
           "PretrainSwitchesStudyConfig", "aliases", "analyze", "build_plan", "check_rerun_design", "compare_rerun",
           "compute", "confirmation", "decision", "design_points", "factors", "main_effect_spread", "main_effects",
           "measure_speed", "point_switches", "power_lines", "rerun_report_lines", "run_level_power", "run_unit",
           "run_values"]
