"""A study against its rerun: does every conclusion hold on disjoint pretraining seeds?

`glm53 analyze RERUN --rerun-of FIRST` compares two studies of one kind whose designs are the same but for
their pretraining seeds, which must not overlap (or, for `rl-choices` on the compositions suite, their
starting checkpoint, each of another pretraining seed). Each rerunnable study declares its comparison in
its own module (`Study.compare_rerun`); the rule they share was fixed before the first rerun's sealed splits
were opened (docs/STUDIES.md, "Reruns"):

- a row *holds* when both studies give it the same result at each level after their Holm correction over
  the rows: the same direction at alpha, or neither;
- the rerun spread is the rerun's seed-level effect minus the first's, Welch's t over the two sets
  of seeds (independent: disjoint seeds), with its 90% interval; the rerun *reproduces* a row's size
  when that interval lies within +- RERUN_MARGIN (two one-sided tests), and `smallest_margin` says
  which margin the data could show;
- both studies together (all their seeds) are analysed once more as one study, a secondary, more
  powerful view that neither study planned alone.

This module holds what every comparison shares: the margin, the design check, reading a study back.
"""

from __future__ import annotations

from pathlib import Path

from glm53_flash.core.receipts import read_json

# Points of strong pass@1 within which the rerun's RL effect must lie of the first's to reproduce its
# size: the smallest effect the first study reports (1.1 points) is about half of it, so a rerun within
# the margin keeps each effect's order of magnitude; stated before the rerun's sealed splits were opened.
RERUN_MARGIN = 0.02
LEVELS = ("units", "seeds")


def check_same_design(first: dict, rerun: dict, study: str, own: tuple, what: str, disjoint_seeds: bool) -> None:
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


def studies_compared(first_plan: dict, rerun_plan: dict, *design_keys: str) -> dict:
    """A rerun comparison's `first` and `rerun` entries: each plan's sha256 and its design's `design_keys`."""
    return {name: {"plan_sha256": plan["plan_sha256"], **{key: plan["design"][key] for key in design_keys}}
            for name, plan in (("first", first_plan), ("rerun", rerun_plan))}


def points(value: float) -> str:
    """A fraction as signed percentage points, one decimal (+1.2)."""
    return f"{100 * value:+.1f}"


def spread_cells(spread: dict | None) -> str:
    """A rerun table's two cells of a row's spread: the rerun's effect minus the first's with its 90% interval
    (points), and whether it lies within the margin, with the smallest margin the data show."""
    if spread is None:
        return "n/a | n/a"
    low, high = (points(v) for v in spread["interval"])
    return (f"{points(spread['difference'])} [{low}, {high}] | {'yes' if spread['equivalent'] else 'no'} (shown "
            f"within {100 * spread['smallest_margin']:.1f})")


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


__all__ = ["LEVELS", "RERUN_MARGIN", "check_same_design", "load", "read_plan", "spread_cells"]
