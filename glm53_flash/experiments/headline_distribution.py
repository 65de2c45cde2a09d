"""The headline as a distribution: the original's experiment over many pretraining seeds, both arms, in
fp32 and in bf16 on the same seeds.

One run of `glm53 reproduce` is a draw: a pretraining seed, then three RL seeds. This study repeats the
headline plan (`reproduce.PLANS["headline"]`) at `SEEDS` pretraining seeds for each arm and precision,
every one with all three RL seeds, and asks at the pretraining-seed level (the unit that varies
independently) whether our recipe makes RL more reliable than the original's, and what bf16 does to
each arm. Everything it decides is in `DistributionPlan`, written (with its power) before any run
starts; `distribution_summary` reads only the runs' receipts.

Layout: OUT/distribution-plan.json, OUT/<precision>/<arm>-pretrain-<seed>/ (a `reproduce` run each).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from glm53_flash.core.receipts import provenance, read_json, sha256_json, write_json, write_text

PLAN_FILE = "distribution-plan.json"
SUMMARY_FILE = "distribution.json"
PRECISIONS = ("fp32", "bf16")
RECEIPT_MAX_BYTES = 64 * 1024 * 1024
# The original's published result (seed-core 9.4): 16 of 24 confirm tasks after RL.
ORIGINAL_CONFIRM_AFTER = 16


@dataclass(frozen=True)
class DistributionPlan:
    """Everything the study decides before its first run."""

    preset: str = "headline"
    arms: tuple[str, ...] = ("faithful", "ours")
    precisions: tuple[str, ...] = PRECISIONS
    # the plan's own pretraining seed first, then nine more
    pretrain_seeds: tuple[int, ...] = (42, 1, 2, 3, 4, 5, 6, 7, 8, 9)
    # "RL took off": at least this many exact training rollouts (of groups x group size = 1,536)
    takeoff_min_exact: int = 50
    alpha: float = 0.05
    power: float = 0.8
    # assumed standard deviations of a pretraining seed's paired difference, for the power statement
    sd_takeoff_fraction: float = 0.40
    sd_confirm_tasks: float = 5.0
    sd_source: str = ("the committed draws before this study: faithful fp32 15, 16, 15 and bf16 9, 12, 7 and "
                      "0, 0, 8 of 24 at one pretraining seed; 14-22 at others (results/headline, "
                      "results/headline-bf16)")
    # the primary family, corrected together (Holm): arm difference per precision, precision per arm
    primary: tuple[str, ...] = ("takeoff: ours - faithful (fp32)", "takeoff: ours - faithful (bf16)",
                                "confirm after RL: bf16 - fp32 (faithful)", "confirm after RL: bf16 - fp32 (ours)")
    notes: tuple[str, ...] = field(default=(
        "unit: the pretraining seed; each seed's value is the mean over its three RL seeds",
        "test: the exact sign-flip test over pretraining seeds (two-sided), Holm over the primary family; "
        "intervals: t intervals over seeds",
        "the confirm split is 24 tasks of 3 distinct functions: within a run, 3 units",
        "nothing is chosen from the sealed splits: every run selects its checkpoints on dev before they open",
    ))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "DistributionPlan":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"distribution plan has unknown fields: {', '.join(unknown)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


DEFAULT_PLAN = DistributionPlan()


def plan_power(plan: DistributionPlan) -> dict:
    """The smallest paired difference over the plan's pretraining seeds each primary question detects
    with the plan's power (exact noncentral t; the exact sign-flip test's floor beside it)."""
    from glm53_flash.core.stats import minimum_detectable_difference, sign_flip_floor

    n = len(plan.pretrain_seeds)
    takeoff = minimum_detectable_difference(n, plan.sd_takeoff_fraction, plan.alpha, plan.power, "sign-flip")
    confirm = minimum_detectable_difference(n, plan.sd_confirm_tasks, plan.alpha, plan.power, "sign-flip")
    return {"seeds": n, "sign_flip_floor": sign_flip_floor(n),
            "mdd_takeoff_fraction": takeoff, "mdd_confirm_tasks": confirm,
            "method": "exact noncentral t (scipy), two-sided, paired over pretraining seeds"}


def power_lines(plan: DistributionPlan, power: dict) -> list[str]:
    def show(value, unit):
        return "none" if value is None else f"{value:.2f} {unit}"

    return [f"power at alpha {plan.alpha} and {plan.power:.0%} over {power['seeds']} pretraining seeds "
            f"(exact sign-flip floor {power['sign_flip_floor']:.4f}):",
            f"- RL take-off (fraction of a seed's 3 RL runs with >= {plan.takeoff_min_exact} exact training "
            f"rollouts): detects {show(power['mdd_takeoff_fraction'], '')} (assumed sd {plan.sd_takeoff_fraction})",
            f"- confirm after RL (tasks of 24, mean of 3 RL seeds): detects "
            f"{show(power['mdd_confirm_tasks'], 'tasks')} (assumed sd {plan.sd_confirm_tasks})"]


def state_plan(out: Path, plan: DistributionPlan) -> dict:
    """OUT/distribution-plan.json: the plan and its power, written before any run; a directory that
    states another plan is refused (one directory, one design)."""
    path = out / PLAN_FILE
    record = {"plan": plan.to_dict(), "plan_sha256": sha256_json(plan.to_dict()), "power": plan_power(plan)}
    if path.is_file():
        recorded = read_json(path)
        if not isinstance(recorded, dict) or recorded.get("plan_sha256") != record["plan_sha256"]:
            raise ValueError(f"{path} states another design; use a new --output")
        return recorded
    out.mkdir(parents=True, exist_ok=True)
    write_json(path, {**record, "stated": "before the first run", "provenance": provenance()})
    return read_json(path)


def distribution_runs(out: Path, plan: DistributionPlan, device: str = "cpu") -> list:
    """Every run of the study as reproduce.ArmRun, seed by seed (so an interrupted study holds whole
    seeds), each precision and arm within a seed."""
    from glm53_flash.experiments.reproduce import PLANS, ArmRun, arm_plan, with_precision
    from glm53_flash.model.precision import resolve_precision

    runs = []
    for seed in plan.pretrain_seeds:
        for name in plan.precisions:
            base = with_precision(PLANS[plan.preset], resolve_precision(name, device), device)
            for arm in plan.arms:
                runs.append(ArmRun(arm, arm_plan(base, arm, pretrain_seed=seed),
                                   out / name / f"{arm}-pretrain-{seed}"))
    return runs


def run_distribution(output: str | Path, plan: DistributionPlan = DEFAULT_PLAN, *, device: str = "cpu",
                     sealed: bool = True, reopen: str | None = None, ledger: str | Path | None = None,
                     allow_dirty: bool = False,
                     progress: bool = False, only_precisions: tuple[str, ...] | None = None,
                     log=print) -> dict | None:
    """Run (or resume) every run of the study (of `only_precisions` when given: a CPU without bf16
    runs the fp32 half). With `sealed=False` each run stops after its dev selections (nothing sealed
    is opened); with `sealed=True` the confirm and holdout splits of each run are opened (recorded in
    `ledger` first) and evaluated, then the summary of every finished run is written."""
    from glm53_flash.experiments.reproduce import _require_openings, reproduce_arm
    from glm53_flash.model.precision import resolve_precision

    out = Path(output)
    recorded = state_plan(out, plan)
    for line in power_lines(plan, recorded["power"]):
        log(line)
    runs = [run for run in distribution_runs(out, plan, device)
            if only_precisions is None or run.directory.parent.name in only_precisions]
    for number, run in enumerate(runs, start=1):
        precision = resolve_precision(run.directory.parent.name, device)
        log(f"run {number}/{len(runs)}: {run.directory.parent.name} {run.arm} pretraining seed {run.pretrain_seed}")
        where = Path(ledger) if ledger else out / "ledger.jsonl"
        openings = _require_openings(run, reopen, where, allow_dirty) if sealed else {}
        reproduce_arm(run, plan.preset, device=device, progress=progress, openings=openings, precision=precision,
                      sealed=sealed)
    if not sealed:
        return None
    return write_summary(out)


def write_summary(out: str | Path) -> dict:
    """OUT/distribution.json, OUT/REPORT.md and the chart, from the receipts in OUT."""
    out = Path(out)
    summary = distribution_summary(out)
    write_json(out / SUMMARY_FILE, summary)
    build_report(out)
    return summary


def build_report(out: str | Path) -> Path:
    """OUT/REPORT.md and OUT/distribution.png from OUT/distribution.json."""
    from glm53_flash.report.distribution import (
        CHART_FILE, cell_rows, effect_text, primary_rows, statements, write_chart,
    )
    from glm53_flash.report.format import format_p
    from glm53_flash.report.tables import markdown_table

    out = Path(out)
    summary = read_json(out / SUMMARY_FILE)
    write_chart(summary, out / CHART_FILE)
    plan = DistributionPlan.from_dict(summary["plan"])
    columns, rows = primary_rows(summary)
    seed_rows = []
    for row in sorted(summary["draws"], key=lambda r: (r["precision"], r["arm"], r["pretrain_seed"], r["rl_seed"])):
        seed_rows.append([row["precision"], row["arm"], row["pretrain_seed"], row["rl_seed"], row["confirm_before"],
                          row["confirm_after"], row["holdout_before"], row["holdout_after"],
                          row["exact_training_rollouts"], "yes" if row["took_off"] else "no"])
    lines = [
        "# The headline as a distribution", "",
        f"The original's experiment (`glm53 reproduce --preset {plan.preset}`), planned at "
        f"{len(plan.pretrain_seeds)} pretraining seeds, each with its {summary['power'].get('rl_seeds', 3)} RL "
        f"seeds, both arms, in {' and '.join(plan.precisions)}. Built from the runs' receipts "
        f"(`distribution.json`).", "",
        f"![every draw]({CHART_FILE})", "",
        *markdown_table(*cell_rows(summary)), "",
        *[f"- {s}" for s in statements(summary)], "",
        "## The plan, stated before the first run", "",
        *[f"- {note}" for note in plan.notes],
        f"- RL took off: at least {plan.takeoff_min_exact} exact training rollouts of 1,536", "",
        *power_lines(plan, summary["power"]), "",
        "## Primary comparisons (paired by pretraining seed, Holm over the family)", "",
        *markdown_table(columns, rows), "",
        "## Secondary", "",
        *markdown_table(["comparison (second - first)", "pretraining seeds", "mean difference", "sign-flip p"],
                        [[name, str(len(t["seeds"])), effect_text(t, "tasks"),
                          "n/a" if t["p"] is None else format_p(t["p"])] for name, t in summary["secondary"].items()]),
        "",
        "## Every draw", "",
        *markdown_table(["precision", "arm", "pretraining seed", "RL seed", "confirm before", "confirm after",
                         "holdout before", "holdout after", "exact training rollouts", "took off"], seed_rows), "",
    ]
    path = out / "REPORT.md"
    write_text(path, "\n".join(lines))
    return path


# --------------------------------------------------------------------------- analysis (receipts only)


def _read(path: Path) -> dict:
    """A receipt at `path`, or its gzip-compressed copy at `path`.gz (how the committed results keep them)."""
    if path.is_file():
        return read_json(path)
    packed = path.with_name(path.name + ".gz")
    if packed.is_file():
        import gzip
        import json

        with gzip.open(packed, "rb") as handle:
            return json.loads(handle.read(RECEIPT_MAX_BYTES))
    raise FileNotFoundError(f"{path} is missing (nor is there {packed.name})")


def _exists(path: Path) -> bool:
    return path.is_file() or path.with_name(path.name + ".gz").is_file()


def _greedy_solved(run_dir: Path, split: str, name: str) -> int:
    return int(_read(run_dir / split / f"{name}-greedy.json")["summary"]["tasks_solved"])


def read_draws(out: Path, plan: DistributionPlan) -> list[dict]:
    """One row per (precision, arm, pretraining seed, RL seed) whose run finished its sealed stages."""
    rows = []
    for precision in plan.precisions:
        for arm in plan.arms:
            for seed in plan.pretrain_seeds:
                run_dir = out / precision / f"{arm}-pretrain-{seed}"
                meta_path = run_dir / "plan.json"
                if not meta_path.is_file():
                    continue
                rl_seeds = read_json(meta_path)["plan"]["rl_seeds"]
                names = ["before", *(f"rl-{s}" for s in rl_seeds)]
                if not all(_exists(run_dir / split / f"{n}-greedy.json")
                           for split in ("confirm", "holdout") for n in names):
                    continue
                for rl_seed in rl_seeds:
                    exact = _read(run_dir / f"rl-{rl_seed}" / "training-receipt.json")["exact_training_rollouts"]
                    rows.append({
                        "precision": precision, "arm": arm, "pretrain_seed": seed, "rl_seed": rl_seed,
                        "confirm_before": _greedy_solved(run_dir, "confirm", "before"),
                        "confirm_after": _greedy_solved(run_dir, "confirm", f"rl-{rl_seed}"),
                        "holdout_before": _greedy_solved(run_dir, "holdout", "before"),
                        "holdout_after": _greedy_solved(run_dir, "holdout", f"rl-{rl_seed}"),
                        "exact_training_rollouts": int(exact),
                        "took_off": int(exact) >= plan.takeoff_min_exact,
                    })
    return rows


def describe(values: list[float]) -> dict:
    """Median, quartiles (the inclusive method) and range of a list of draws."""
    ordered = sorted(values)
    if len(ordered) == 1:
        q1 = q3 = ordered[0]
    else:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    return {"n": len(ordered), "median": statistics.median(ordered), "q1": q1, "q3": q3,
            "min": ordered[0], "max": ordered[-1]}


def place_of(value: float, values: list[float]) -> dict:
    """Where `value` falls among `values`: how many draws lie below, equal and above it."""
    return {"value": value, "below": sum(v < value for v in values), "equal": sum(v == value for v in values),
            "above": sum(v > value for v in values), "draws": len(values)}


def _per_seed(rows: list[dict], key) -> dict[int, float]:
    by_seed: dict[int, list[float]] = {}
    for row in rows:
        by_seed.setdefault(row["pretrain_seed"], []).append(float(key(row)))
    return {seed: statistics.fmean(values) for seed, values in by_seed.items()}


def _paired(first: dict[int, float], second: dict[int, float]) -> dict:
    """second - first over the pretraining seeds both hold: mean, t interval, exact sign-flip p."""
    from glm53_flash.core.stats import sign_flip_p, t_interval

    seeds = sorted(set(first) & set(second))
    diffs = [second[s] - first[s] for s in seeds]
    result = {"seeds": seeds, "differences": diffs, "mean": statistics.fmean(diffs) if diffs else None}
    if len(diffs) >= 2:
        result["interval"] = list(t_interval(diffs)) if statistics.pstdev(diffs) > 0 else [diffs[0], diffs[0]]
        result["p"] = sign_flip_p(diffs) if any(diffs) else 1.0
    else:
        result["interval"], result["p"] = None, None
    return result


def distribution_summary(out: str | Path) -> dict:
    """The study's summary from its receipts: the draws, each arm's and precision's distribution, where
    the original's 16/24 falls, how often RL took off, and the primary tests (Holm-corrected)."""
    from glm53_flash.core.stats import holm

    out = Path(out)
    recorded = read_json(out / PLAN_FILE)
    plan = DistributionPlan.from_dict(recorded["plan"])
    rows = read_draws(out, plan)
    cells = {}
    for precision in plan.precisions:
        for arm in plan.arms:
            chosen = [r for r in rows if r["precision"] == precision and r["arm"] == arm]
            if not chosen:
                continue
            confirm = [r["confirm_after"] for r in chosen]
            cells[f"{arm}/{precision}"] = {
                "arm": arm, "precision": precision, "draws": len(chosen),
                "pretrain_seeds": sorted({r["pretrain_seed"] for r in chosen}),
                "confirm_after": describe(confirm), "holdout_after": describe([r["holdout_after"] for r in chosen]),
                "confirm_before": describe([r["confirm_before"] for r in chosen]),
                "took_off": sum(r["took_off"] for r in chosen),
                "original_place": place_of(ORIGINAL_CONFIRM_AFTER, confirm),
            }

    def subset(arm, precision):
        return [r for r in rows if r["arm"] == arm and r["precision"] == precision]

    takeoff = {(a, p): _per_seed(subset(a, p), lambda r: r["took_off"]) for a in plan.arms for p in plan.precisions}
    confirm = {(a, p): _per_seed(subset(a, p), lambda r: r["confirm_after"]) for a in plan.arms
               for p in plan.precisions}
    def pair(first, second, table):
        return _paired(table.get(first, {}), table.get(second, {}))

    tests = {
        plan.primary[0]: pair(("faithful", "fp32"), ("ours", "fp32"), takeoff),
        plan.primary[1]: pair(("faithful", "bf16"), ("ours", "bf16"), takeoff),
        plan.primary[2]: pair(("faithful", "fp32"), ("faithful", "bf16"), confirm),
        plan.primary[3]: pair(("ours", "fp32"), ("ours", "bf16"), confirm),
    }
    names = [n for n in plan.primary if tests[n]["p"] is not None]
    adjusted = holm([tests[n]["p"] for n in names]) if names else []
    for name, p in zip(names, adjusted):
        tests[name]["p_holm"] = p
        tests[name]["holds"] = p < plan.alpha
    secondary = {f"confirm after RL: ours - faithful ({p})": pair(("faithful", p), ("ours", p), confirm)
                 for p in plan.precisions}
    return {"schema_version": "1.0", "plan": plan.to_dict(), "plan_sha256": recorded["plan_sha256"],
            "power": recorded["power"], "power_stated": recorded.get("stated"), "draws": rows, "cells": cells,
            "primary": tests, "secondary": secondary, "provenance": provenance()}


def demo_place(summary: dict, arm: str, precision: str, confirm_after: list[int], exact_rollouts: list[int]) -> str:
    """One sentence placing a user's run (its confirm results after RL and exact training rollouts per RL
    seed) in the committed distribution of `arm` at `precision`."""
    cell = summary["cells"].get(f"{arm}/{precision}")
    plan = DistributionPlan.from_dict(summary["plan"])
    scores = ", ".join(str(v) for v in confirm_after)
    failed = sum(e < plan.takeoff_min_exact for e in exact_rollouts)
    if cell is None:
        return f"{arm} {scores} of 24 ({precision}): no committed draws at this precision to compare with"
    draws = [r for r in summary["draws"] if r["arm"] == arm and r["precision"] == precision]
    by_seed: dict[int, int] = {}
    for r in draws:
        by_seed[r["pretrain_seed"]] = by_seed.get(r["pretrain_seed"], 0) + (not r["took_off"])
    same_failures = sum(v == failed for v in by_seed.values())
    c = cell["confirm_after"]
    if failed:
        what = f"RL did not take off on {failed} of {len(exact_rollouts)} seeds, as in {same_failures} of {len(by_seed)} committed pretraining seeds"
    else:
        what = f"RL took off on every seed, as on {same_failures} of {len(by_seed)} committed pretraining seeds"
    return (f"{arm} {scores} of 24 ({precision}): {what}; committed draws: median {c['median']:g}, "
            f"quartiles {c['q1']:g}-{c['q3']:g}, range {c['min']}-{c['max']} of {c['n']}")


def committed_summary() -> dict | None:
    """results/headline-distribution/distribution.json of the checkout, or None (outside a checkout, or
    before the study is committed)."""
    from glm53_flash.evaluation.ledger import repository_root

    root = repository_root()
    path = None if root is None else root / "results" / "headline-distribution" / SUMMARY_FILE
    return read_summary(path) if path is not None and path.is_file() else None


def place_user_run(out: str | Path, precision: str, summary: dict | None = None) -> list[str]:
    """Sentences placing a `glm53 reproduce` run in OUT (its arms' confirm after RL and exact training
    rollouts per RL seed) among the committed draws of the same precision; [] without a committed study."""
    summary = committed_summary() if summary is None else summary
    if summary is None:
        return []
    out = Path(out)
    lines = []
    for arm in summary["plan"]["arms"]:
        run_dir = out / arm
        if not (run_dir / "plan.json").is_file():
            continue
        seeds = read_json(run_dir / "plan.json")["plan"]["rl_seeds"]
        if not all(_exists(run_dir / "confirm" / f"rl-{s}-greedy.json") for s in seeds):
            continue
        confirm = [_greedy_solved(run_dir, "confirm", f"rl-{s}") for s in seeds]
        exact = [int(_read(run_dir / f"rl-{s}" / "training-receipt.json")["exact_training_rollouts"]) for s in seeds]
        lines.append(demo_place(summary, arm, precision, confirm, exact))
    return lines


# What the committed study keeps of each run (besides its sealed greedy receipts, gzipped).
EXPORTED = ("plan.json", "pretrain/selection-dev.json", "rl-*/selection-dev.json", "rl-*/training-receipt.json")


def export(runs: str | Path, results: str | Path, plan: DistributionPlan = DEFAULT_PLAN,
           receipts: bool = False, only: str | Path | None = None) -> list[Path]:
    """Copy into `results` what the committed study keeps of the runs in `runs`: each run's plan, dev
    selections and RL training receipts; with `receipts`, its sealed splits' greedy receipts (gzipped,
    byte-identical inside, so the ledger's sha256 vouches for them) and the study's summary, report and
    chart. Checkpoints, metrics and sampled receipts stay behind (their sha256 are in the ledger).
    `only`: one run directory (its files only, not the study's summary)."""
    import gzip
    import shutil

    runs, results = Path(runs), Path(results)
    written = []
    for run in distribution_runs(runs, plan):
        if not (run.directory / "plan.json").is_file() or (only is not None and run.directory != Path(only)):
            continue
        target = results / run.directory.relative_to(runs)
        patterns = EXPORTED + (("confirm/*-greedy.json", "holdout/*-greedy.json") if receipts else ())
        for pattern in patterns:
            for source in sorted(run.directory.glob(pattern)):
                destination = target / source.relative_to(run.directory)
                destination.parent.mkdir(parents=True, exist_ok=True)
                if source.parent.name in ("confirm", "holdout"):
                    destination = destination.with_name(destination.name + ".gz")
                    with open(source, "rb") as raw, open(destination, "wb") as handle, \
                            gzip.GzipFile(filename="", mode="wb", fileobj=handle, mtime=0, compresslevel=9) as packed:
                        shutil.copyfileobj(raw, packed)
                else:
                    shutil.copyfile(source, destination)
                written.append(destination)
    if receipts and only is None:
        from glm53_flash.report.distribution import CHART_FILE

        for name in (SUMMARY_FILE, "REPORT.md", CHART_FILE):
            if (runs / name).is_file():
                shutil.copyfile(runs / name, results / name)
                written.append(results / name)
    return written


def read_summary(path: str | Path) -> dict:
    data = read_json(path)
    if not isinstance(data, dict) or "cells" not in data or "draws" not in data:
        raise ValueError(f"{path} is not a distribution summary")
    return data


__all__ = ["DEFAULT_PLAN", "DistributionPlan", "PLAN_FILE", "SUMMARY_FILE", "build_report", "committed_summary", "demo_place",
           "describe", "distribution_runs", "distribution_summary", "export", "place_of", "place_user_run",
           "plan_power", "read_draws", "read_summary", "run_distribution", "state_plan", "write_summary"]

