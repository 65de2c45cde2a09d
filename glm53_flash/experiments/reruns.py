"""A study against its rerun: does every conclusion hold on disjoint pretraining seeds?

`glm53 analyze RERUN --rerun-of FIRST` compares two `rl-generalisation` studies whose designs are the
same but for their pretraining seeds, which must not overlap, or two `rl-choices` studies on the
compositions suite whose designs are the same but for their starting checkpoint (each of another
pretraining seed; `compare_rl_choices`). The rule was fixed before the rerun's sealed splits were
opened (docs/STUDIES.md, "Reruns"):

- a row (arm, reward, sealed split; the strong verdict, the README's) *holds* when both studies give
  it the same result at each level after their Holm correction over the rows: at the structure groups
  and at the seeds, the same direction at alpha or neither;
- the rerun spread is the rerun's seed-level effect minus the first's, Welch's t over the two sets
  of seeds (independent: disjoint seeds), with its 90% interval; the rerun *reproduces* a row's size
  when that interval lies within +- RERUN_MARGIN (two one-sided tests), and `smallest_margin` says
  which margin the data could show;
- both studies together (all their seeds; each evaluated the same sealed tasks) are analysed once
  more as one study, a secondary, more powerful view that neither study planned alone.
"""

from __future__ import annotations

from pathlib import Path

from glm53_flash.core.receipts import read_json
from glm53_flash.experiments import generalisation as gen

# Points of strong pass@1 within which the rerun's RL effect must lie of the first's to reproduce its
# size: the smallest effect the first study reports (1.1 points) is about half of it, so a rerun within
# the margin keeps each effect's order of magnitude; stated before the rerun's sealed splits were opened.
RERUN_MARGIN = 0.02
LEVELS = ("units", "seeds")


def _direction(result: dict, level: str, alpha: float) -> str:
    """'+', '-' or '0': a row's direction at `level` (units: structure groups; seeds) when its p after the
    study's Holm correction over its rows is below alpha."""
    if result["holm"][level] >= alpha:
        return "0"
    mean = result["comparison"][level]["mean"]
    return "+" if mean > 0 else "-" if mean < 0 else "0"


def _check_same_design(first: dict, rerun: dict, study: str, own: tuple, what: str, disjoint_seeds: bool) -> None:
    """Both plans are `study` studies whose designs and analyses are equal outside the keys in `own`
    (`what` names them in the error), and, with `disjoint_seeds`, share no pretraining seed."""
    for name, plan in (("first", first), ("rerun", rerun)):
        if plan.get("study") != study:
            raise ValueError(f"the {name} study is a {plan.get('study')!r} study; reruns compare `{study}` studies")
    differ = sorted(key for key in set(first["design"]) | set(rerun["design"])
                    if key not in own and first["design"].get(key) != rerun["design"].get(key))
    if first["analysis"] != rerun["analysis"]:
        differ.append("analysis")
    if differ:
        raise ValueError(f"the two studies differ in more than {what}: {', '.join(differ)}")
    shared = sorted(set(first["design"]["seeds"]) & set(rerun["design"]["seeds"])) if disjoint_seeds else []
    if shared:
        raise ValueError(f"a rerun needs disjoint pretraining seeds; both studies have {shared}")


def _check_designs(first: dict, rerun: dict) -> None:
    _check_same_design(first, rerun, gen.STUDY, ("seeds",), "their pretraining seeds", True)


def compare(first_plan: dict, first_receipts: list[dict], rerun_plan: dict, rerun_receipts: list[dict],
            margin: float = RERUN_MARGIN) -> dict:
    """Per (arm, reward, sealed split) under the strong verdict: each study's result after its Holm
    correction (over structure groups and seeds), whether it holds, the rerun spread with its equivalence
    test, and both studies analysed as one."""
    from glm53_flash.core.stats import welch_comparison

    _check_designs(first_plan, rerun_plan)
    alpha = first_plan["analysis"]["settings"]["alpha"]
    first, rerun = gen.compute(first_plan, first_receipts), gen.compute(rerun_plan, rerun_receipts)
    seeds = first_plan["design"]["seeds"] + rerun_plan["design"]["seeds"]
    pooled_plan = {**first_plan, "design": {**first_plan["design"], "seeds": seeds}}
    pooled = gen.compute(pooled_plan, first_receipts + rerun_receipts)

    def keyed(summary):
        return {(r["arm"], r["reward"], r["split"]): r for r in summary["sealed"]}

    first_rows, rerun_rows, pooled_rows = keyed(first), keyed(rerun), keyed(pooled)
    rows = []
    for key, a in first_rows.items():
        if key not in rerun_rows:
            continue
        ra, rb = a["strong"], rerun_rows[key]["strong"]
        ca, cb = ra["comparison"], rb["comparison"]
        directions = {level: [_direction(ra, level, alpha), _direction(rb, level, alpha)] for level in LEVELS}
        spread = (welch_comparison(ca["seeds"]["values"], cb["seeds"]["values"], margin=margin, alpha=alpha)
                  if min(len(ca["seeds"]["values"]), len(cb["seeds"]["values"])) >= 2 else None)
        cp = pooled_rows[key]["strong"]
        rows.append({
            "arm": key[0], "reward": key[1], "split": key[2],
            "first": {"mean_difference": ca["mean_difference"], "verdict": ra["holm"]["verdict"], "seeds": a["seeds"],
                      "holm": ra["holm"]},
            "rerun": {"mean_difference": cb["mean_difference"], "verdict": rb["holm"]["verdict"],
                      "seeds": rerun_rows[key]["seeds"], "holm": rb["holm"]},
            "directions": directions,
            "holds": ra["holm"]["verdict"] == rb["holm"]["verdict"] and all(d[0] == d[1] for d in directions.values()),
            "spread": spread,
            "pooled": {"seeds": pooled_rows[key]["seeds"], "comparison": cp["comparison"], "holm": cp.get("holm")},
        })
    return {"first": {"plan_sha256": first_plan["plan_sha256"], "seeds": first_plan["design"]["seeds"]},
            "rerun": {"plan_sha256": rerun_plan["plan_sha256"], "seeds": rerun_plan["design"]["seeds"]},
            "alpha": alpha, "margin": margin, "verdict": "strong", "rows": rows,
            "all_hold": bool(rows) and all(r["holds"] for r in rows),
            "rule": "a row holds when both studies give the same result and the same direction (or none) at alpha "
                    "after their Holm correction over the rows, at the structure groups and at the seeds; it "
                    "reproduces its size when Welch's 90% interval of the rerun's seed-level effect minus the "
                    "first's lies within +- the margin (two one-sided tests)"}


RL_CHOICES_STUDY = "rl-choices"


def check_rl_choices_designs(first: dict, rerun: dict) -> None:
    _check_same_design(first, rerun, RL_CHOICES_STUDY, ("checkpoint", "checkpoint_sha256"),
                       "their starting checkpoint", False)
    if first["design"]["checkpoint_sha256"] == rerun["design"]["checkpoint_sha256"]:
        raise ValueError("a rerun starts from another pretraining seed's checkpoint; both studies start from the "
                         f"same weights ({first['design']['checkpoint_sha256'][:12]})")


def compare_rl_choices(first_plan: dict, first: dict, rerun_plan: dict, rerun: dict,
                       margin: float = RERUN_MARGIN) -> dict:
    """Two rl-choices studies from checkpoints of different pretraining seeds: the screen's choice in each, and
    per confirmation row (the candidate against the baseline; each arm against its starting checkpoint)
    whether it holds (the same arms and the same direction at alpha, or none, over the training seeds)
    and the rerun spread (Welch's t over the two sets of per-seed differences, independent because their
    runs start from different weights, with equivalence within `margin`). `first` and `rerun` are the
    studies' numbers as analysis.compute_rl_choices gives them (this module sits below the analysis)."""
    from glm53_flash.core.stats import welch_comparison

    check_rl_choices_designs(first_plan, rerun_plan)
    alpha = first_plan["analysis"]["alpha"]

    def directions(row) -> dict:
        """Per level, the direction after the study's Holm correction: on the compositions suite at the
        structure groups and the training seeds (the primary comparison), else over the training seeds."""
        if "holm" in row:
            return {level: "0" if row["holm"][level] >= alpha else
                    "+" if row["groups"][level]["mean"] > 0 else "-" for level in LEVELS}
        p = row.get("holm_p")
        return {"seeds": "0" if p is None or p >= alpha else "+" if row["mean"] > 0 else "-" if row["mean"] < 0 else "0"}

    def seed_values(row) -> list[float]:
        return row["groups"]["seeds"]["values"] if "groups" in row else [v / 100 for v in row["differences"]]

    def side(row) -> dict:
        out = {"mean": row["mean"], "holm_p": row.get("holm_p"), "n": row["n"]}
        if "groups" in row:
            out |= {"groups_mean": row["groups"]["mean_difference"], "holm": row["holm"], "result": row["result"],
                    "crossed_p": None if row["groups"]["crossed"] is None else row["groups"]["crossed"]["t_test_p"]}
        return out

    def confirmations(summary) -> list[dict]:
        rows = [summary["confirmation"]] if summary.get("confirmation") else []
        return rows + list(summary.get("versus_pretrained") or [])

    rows = []
    for a, b in zip(confirmations(first), confirmations(rerun)):
        same_arms = (a["left"], a["right"]) == (b["left"], b["right"])
        spread = welch_comparison(seed_values(a), seed_values(b), margin=margin, alpha=alpha) if same_arms else None
        da, db = directions(a), directions(b)
        rows.append({"name": a["name"], "rerun_name": b["name"], "first": side(a), "rerun": side(b),
                     "directions": {level: [da[level], db[level]] for level in da},
                     "holds": same_arms and da == db and a.get("result") == b.get("result"), "spread": spread})
    return {"study": RL_CHOICES_STUDY,
            "first": {"plan_sha256": first_plan["plan_sha256"], "checkpoint_sha256": first_plan["design"]["checkpoint_sha256"],
                      "candidate": (first.get("confirmation") or {}).get("candidate")},
            "rerun": {"plan_sha256": rerun_plan["plan_sha256"], "checkpoint_sha256": rerun_plan["design"]["checkpoint_sha256"],
                      "candidate": (rerun.get("confirmation") or {}).get("candidate")},
            "alpha": alpha, "margin": margin, "rows": rows,
            "all_hold": bool(rows) and all(r["holds"] for r in rows),
            "rule": "a row holds when both studies compare the same arms and give the same direction (or none) at "
                    "alpha after their Holm correction, on the compositions suite at the structure groups and at the "
                    "training seeds (over the training seeds on the families suite); it reproduces its size when "
                    "Welch's 90% interval of the rerun's seed-level effect minus the first's lies within +- the margin "
                    "(two one-sided tests)"}


def rl_choices_report_lines(comparison: dict, first_name: str) -> list[str]:
    def signed(value):
        return f"{100 * value:+.1f}"

    def result(side):
        if "holm" in side:  # the compositions suite: over structure groups, after Holm at groups and seeds
            return (f"{signed(side['groups_mean'])} over groups, {side['result']} (Holm p {side['holm']['units']:.3g} / "
                    f"{side['holm']['seeds']:.3g})")
        return f"{side['mean']:+.1f} (Holm p {side['holm_p']:.3g})"

    lines = ["", f"## Against the first study (`{first_name}`, checkpoint {comparison['first']['checkpoint_sha256'][:12]})",
             "", f"Rule: {comparison['rule']}; margin {100 * comparison['margin']:.1f} points. Effects in points of "
                 "greedy pass@1 on the confirmation split.", "",
             "| comparison | first | rerun | holds (first / rerun) | rerun - first, 90% CI | within the margin |",
             "|---|---|---|---|---|---|"]
    for row in comparison["rows"]:
        spread = row["spread"]
        lines.append(
            f"| {row['name']} | {result(row['first'])} | {result(row['rerun'])} | "
            f"{'yes' if row['holds'] else 'NO'} ({', '.join('/'.join(d) for d in row['directions'].values())}) | "
            + ("n/a | n/a" if spread is None else
               f"{signed(spread['difference'])} [{signed(spread['interval'][0])}, {signed(spread['interval'][1])}] | "
               f"{'yes' if spread['equivalent'] else 'no'} (shown within {100 * spread['smallest_margin']:.1f})") + " |")
    lines += ["", "`holds` lists each level's direction after Holm (on the compositions suite: structure groups, then "
                  "training seeds; `+` higher, `-` lower, `0` not shown) in the first study / the rerun.", ""]
    return lines


RL_SWITCHES_STUDY = "rl-switches"


def check_rl_switches_designs(first: dict, rerun: dict) -> None:
    """Two rl-switches studies that may be compared: the same design but for their source study, its
    checkpoints and its pretraining seeds, which must not overlap."""
    _check_same_design(first, rerun, RL_SWITCHES_STUDY, ("source", "checkpoints", "seeds"),
                       "their source's pretraining seeds", True)


def compare_rl_switches(first_plan: dict, first: dict, rerun_plan: dict, rerun: dict,
                        margin: float = RERUN_MARGIN) -> dict:
    """Two rl-switches studies on disjoint pretraining seeds (`first` and `rerun` as rl_switches.compute gives
    them): per (arm, switch), whether the verdict and each level's direction after Holm hold in both, and the
    rerun spread (Welch's t over the two sets of per-seed effects, independent: disjoint seeds)."""
    from glm53_flash.core.stats import welch_comparison

    check_rl_switches_designs(first_plan, rerun_plan)
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
    return {"study": RL_SWITCHES_STUDY,
            "first": {"plan_sha256": first_plan["plan_sha256"], "seeds": first_plan["design"]["seeds"]},
            "rerun": {"plan_sha256": rerun_plan["plan_sha256"], "seeds": rerun_plan["design"]["seeds"]},
            "alpha": alpha, "margin": margin, "rows": rows,
            "all_hold": bool(rows) and all(r["holds"] for r in rows),
            "rule": "a row holds when both studies give the same verdict and the same direction (or none) after Holm "
                    "at the structure groups and at the pretraining seeds; it reproduces its size when Welch's 90% "
                    "interval of the rerun's seed-level effect minus the first's lies within +- the margin (two "
                    "one-sided tests)"}


def rl_switches_report_lines(comparison: dict, first_name: str) -> list[str]:
    def signed(value):
        return f"{100 * value:+.1f}"

    lines = ["", f"## Against the first study (`{first_name}`, pretraining seeds "
                 f"{', '.join(map(str, comparison['first']['seeds']))})", "",
             f"Rule: {comparison['rule']}; margin {100 * comparison['margin']:.1f} points. Effects in points of "
             "greedy pass@1 on dev, the flip minus the arm's own.", "",
             "| arm | switch | first | rerun | holds (groups, seeds) | rerun - first, 90% CI | within the margin |",
             "|---|---|---|---|---|---|---|"]
    for row in comparison["rows"]:
        spread, d = row["spread"], row["directions"]
        lines.append(
            f"| {row['arm']} | {row['switch']} | {signed(row['first']['mean'])} {row['first']['verdict']} | "
            f"{signed(row['rerun']['mean'])} {row['rerun']['verdict']} | "
            f"{'yes' if row['holds'] else 'NO'} ({'/'.join(d['units'])}, {'/'.join(d['seeds'])}) | "
            + ("n/a | n/a" if spread is None else
               f"{signed(spread['difference'])} [{signed(spread['interval'][0])}, {signed(spread['interval'][1])}] | "
               f"{'yes' if spread['equivalent'] else 'no'} (shown within {100 * spread['smallest_margin']:.1f})") + " |")
    lines += ["", "`holds` lists each level's direction after Holm in the first study / the rerun (`+` the flip "
                  "raises the pass rate at alpha, `-` lowers it, `0` not shown).", ""]
    return lines


PRETRAIN_SWITCHES_STUDY = "pretrain-switches"


def check_pretrain_switches_designs(first: dict, rerun: dict) -> None:
    """Two pretrain-switches studies that may be compared: the same design but for their pretraining seeds,
    which must not overlap."""
    _check_same_design(first, rerun, PRETRAIN_SWITCHES_STUDY, ("seeds",), "their pretraining seeds", True)


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


def compare_pretrain_switches(first_plan: dict, first_receipts: list[dict], rerun_plan: dict,
                              rerun_receipts: list[dict], margin: float = RERUN_MARGIN) -> dict:
    """Two pretrain-switches studies on disjoint pretraining seeds, per phase both have finished (dev; the
    sealed split once both opened it) and per switch: each study's verdict and its directions after Holm
    over structure groups and over runs; the row holds when both agree on all three; the rerun spread
    (main_effect_spread); and both studies' runs analysed as one factorial (a secondary view)."""
    from glm53_flash.experiments import pretrain_switches as ps

    check_pretrain_switches_designs(first_plan, rerun_plan)
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
        a, b = ps.main_effects(first_plan, first_receipts, phase), ps.main_effects(rerun_plan, rerun_receipts, phase)
        if a is None or b is None:
            continue
        spread = main_effect_spread(ps.run_values(first_plan, first_receipts, phase),
                                    ps.run_values(rerun_plan, rerun_receipts, phase), names, margin, alpha)
        pooled = ps.main_effects(pooled_plan, first_receipts + rerun_receipts, phase)
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
    return {"study": PRETRAIN_SWITCHES_STUDY,
            "first": {"plan_sha256": first_plan["plan_sha256"], "seeds": first_plan["design"]["seeds"]},
            "rerun": {"plan_sha256": rerun_plan["plan_sha256"], "seeds": rerun_plan["design"]["seeds"]},
            "alpha": alpha, "margin": margin, "phases": phases,
            "rule": "a switch holds when both studies give the same verdict and the same direction (or none) after "
                    "Holm over structure groups and over runs; it reproduces its size when the 90% interval of the "
                    "rerun's main effect minus the first's (one least-squares fit over both studies' runs) lies "
                    "within +- the margin"}


def pretrain_switches_report_lines(comparison: dict, first_name: str) -> list[str]:
    def signed(value):
        return f"{100 * value:+.1f}"

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
                f"| {row['switch']} | {signed(row['first']['effect'])} {row['first']['verdict']} | "
                f"{signed(row['rerun']['effect'])} {row['rerun']['verdict']} | "
                f"{'yes' if row['holds'] else 'NO'} ({'/'.join(d['groups'])}, {'/'.join(d['runs'])}) | "
                f"{signed(s['difference'])} [{signed(s['interval'][0])}, {signed(s['interval'][1])}] | "
                f"{'yes' if s['equivalent'] else 'no'} (shown within {100 * s['smallest_margin']:.1f}) | "
                f"{signed(both['effect'])} | {both['verdict']} |")
        lines.append("")
    lines += ["`holds` lists each level's direction after Holm in the first study / the rerun (`+` the original's "
              "value raises the pass rate at alpha, `-` lowers it, `0` not shown). `both together` is one factorial "
              "over both studies' runs, a secondary view neither plan made alone.", ""]
    return lines


DESIGN_CHECKS = {gen.STUDY: _check_designs, RL_CHOICES_STUDY: check_rl_choices_designs,
                 RL_SWITCHES_STUDY: check_rl_switches_designs, PRETRAIN_SWITCHES_STUDY: check_pretrain_switches_designs}


def check_planned_rerun(first_directory: str | Path, draft: dict) -> None:
    """Before a study's first run: `draft` (its plan, untimed) may be compared as the rerun of the study in
    `first_directory` (the check `glm53 analyze --rerun-of` makes on the finished studies), or a ValueError
    names what differs, so a mismatch (a precision `auto` resolved otherwise on this machine, a changed
    flag) costs seconds instead of a study's hours."""
    first = read_plan(first_directory)
    check = DESIGN_CHECKS.get(draft["study"])
    if check is None:
        raise ValueError(f"--rerun-of: reruns compare {', '.join(f'`{name}`' for name in DESIGN_CHECKS)} studies, "
                         f"not `{draft['study']}`")
    try:
        check(first, draft)
    except ValueError as error:
        raise ValueError(f"this study is not a rerun of {first_directory}: {error}") from None


def read_plan(directory: str | Path) -> dict:
    """The plan.json of the study named by --rerun-of, or a clear error."""
    from glm53_flash.experiments.study import PLAN_FILE

    path = Path(directory) / PLAN_FILE
    if not path.is_file():
        raise FileNotFoundError(f"--rerun-of {directory}: no {PLAN_FILE}; give the first study's directory")
    return read_json(path)


def load(directory: Path) -> tuple[dict, list[dict]]:
    """A study directory's plan and the receipts of that plan."""
    from glm53_flash.experiments.study import load_receipts

    plan = read_plan(directory)
    return plan, load_receipts(directory, plan["plan_sha256"])


def report_lines(comparison: dict, first_name: str) -> list[str]:
    """REPORT.md's section: the table of each row in both studies and together."""
    def signed(value):
        return f"{100 * value:+.1f}"

    lines = ["", f"## Against the first study (`{first_name}`, seeds "
                 f"{', '.join(map(str, comparison['first']['seeds']))})", "",
             f"Rule (the one fixed before this rerun's sealed splits were opened, its levels now the structure groups "
             f"and the seeds after each study's Holm correction): {comparison['rule']}; margin "
             f"{100 * comparison['margin']:.1f} points. Strong verdict; effects in points.", "",
             "| arm | reward | split | first | rerun | holds (groups, seeds) | rerun - first, 90% CI | "
             "within the margin | both together | result together, after Holm | Holm p together (groups / seeds) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in comparison["rows"]:
        spread = row["spread"]
        d = row["directions"]
        both = row["pooled"]["comparison"]
        seeds_ci = both["seeds"]["interval"]
        lines.append(
            f"| {row['arm']} | {row['reward']} | {gen.SHORT_NAMES.get(row['split'], row['split'])} | "
            f"{signed(row['first']['mean_difference'])} {row['first']['verdict']} | "
            f"{signed(row['rerun']['mean_difference'])} {row['rerun']['verdict']} | "
            f"{'yes' if row['holds'] else 'NO'} ({'/'.join(d['units'])}, {'/'.join(d['seeds'])}) | "
            + ("n/a | n/a" if spread is None else
               f"{signed(spread['difference'])} [{signed(spread['interval'][0])}, {signed(spread['interval'][1])}] | "
               f"{'yes' if spread['equivalent'] else 'no'} (shown within {100 * spread['smallest_margin']:.1f})")
            + f" | {signed(both['mean_difference'])}, seeds CI "
            + ("n/a" if seeds_ci is None else f"[{signed(seeds_ci[0])}, {signed(seeds_ci[1])}]")
            + f" ({len(row['pooled']['seeds'])} seeds) | {row['pooled']['holm']['verdict']} | "
            + ("n/a" if not row["pooled"]["holm"] else
               f"{row['pooled']['holm']['units']:.3g} / {row['pooled']['holm']['seeds']:.3g}") + " |")
    lines += ["", "`holds` lists each level's direction after Holm in the first study / the rerun (`+` RL raises the "
                  "strong pass rate at alpha, `-` lowers it, `0` not shown); effects are over structure groups. `both "
                  "together` is one analysis over both studies' seeds, a secondary view neither plan made alone; its "
                  "result is after Holm over the rows at both levels.", ""]
    return lines


__all__ = ["RERUN_MARGIN", "check_pretrain_switches_designs", "check_rl_choices_designs", "check_rl_switches_designs",
           "compare", "compare_pretrain_switches", "compare_rl_choices", "compare_rl_switches", "load",
           "main_effect_spread", "pretrain_switches_report_lines", "report_lines", "rl_choices_report_lines",
           "rl_switches_report_lines"]
