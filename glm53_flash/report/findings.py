"""What the course deck says a result means, in a learner's words: the headline distribution's findings
and each study's answer as a question and one or two plain sentences.

Every sentence is built at build time from the committed summaries (results/headline-distribution/
distribution.json, each study's summary.json and plan.json), with the same decisions its study's
`answer()` states (what holds after the study's own Holm correction, at the levels it names): only the
words differ. The statistics themselves (which test, which correction, the p-values) are for the deck's
appendix, where `answer()` is shown as the study wrote it, its identifiers in words.
"""

from __future__ import annotations

import re

from glm53_flash.report.glossary import COMPARISONS, label

# The question each study asks, as a slide's title (the rl-choices study runs on two suites).
QUESTIONS = {
    "vision": "Which image encoder names digits better?",
    "pretraining-data": "Which pretraining data helps?",
    "rl-choices/families": "Which RL setting matters?",
    "rl-choices/compositions": "Which RL setting matters on harder tasks?",
    "rl-generalisation": "Does RL's gain reach tasks it never trained on?",
    "rl-switches": "Do the original's RL switches matter?",
    "pretrain-switches": "Do the original's pretraining switches matter?",
}


def points(value: float) -> str:
    """Signed points, with a real minus sign: +2.6, \u22120.5 (and 0.0, never -0.0)."""
    rounded = round(value, 1)
    return "0.0" if rounded == 0 else f"{rounded:+.1f}".replace("-", "\u2212")


def study_key(plan: dict) -> str:
    name = plan.get("study", "")
    return f"{name}/{plan['design'].get('suite') or 'families'}" if name == "rl-choices" else name


def question(plan: dict | None) -> str:
    """The study's question, its slide's title."""
    return QUESTIONS["vision"] if plan is None else QUESTIONS.get(study_key(plan), plan.get("study", "A study"))


def _listing(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


# --------------------------------------------------------------------------- the studies


def _pretraining_data(plan: dict, summary: dict) -> str:
    alpha = plan["analysis"]["alpha"]
    rows = [r for r in summary["comparisons"][summary["primary_metric"]] if r["n"]]
    shown = [r for r in rows if r.get("holm_p") is not None and r["holm_p"] <= alpha]
    other = [r for r in rows if r not in shown]

    def words(r):
        return f"{COMPARISONS.get(r['name'], r['name'])} ({points(r['mean'])} points)"

    text = (f"After {summary['primary_step']} updates, byte accuracy on unseen structures rose with "
            f"{_listing([words(r) for r in shown])}" if shown else
            f"After {summary['primary_step']} updates, no mix is shown to change byte accuracy on unseen structures")
    text += f"; not shown: {_listing([words(r) for r in other])}." if other else "."
    if summary.get("generations_at_primary_step") and not summary.get("correct_generations_at_primary_step"):
        text += " No model computed a held-out expression right."
    return text


def _setting_change(plan: dict, arm: str) -> str:
    """What an RL arm changes against the baseline, in words: 'temperature 0.2 instead of 0.35'."""
    settings = plan["design"].get("arm_settings", {})
    mine, base = settings.get(arm, {}), settings.get("baseline", {})
    changed = [f"{key.replace('_', ' ')} {mine[key]:g} instead of {base[key]:g}" for key in sorted(mine)
               if key in base and mine[key] != base[key] and isinstance(mine[key], (int, float))]
    return "; ".join(changed) or arm


def _rl_choices(plan: dict, summary: dict) -> str:
    design, alpha = plan["design"], plan["analysis"]["alpha"]
    compositions = design.get("suite", "families") != "families"

    def effect(r) -> tuple[float, bool]:  # the rows' effect and verdict exactly as answer() takes them
        if compositions:
            return 100 * r["groups"]["mean_difference"], r["result"] != "not shown"
        return r["mean"], r.get("holm_p") is not None and r["holm_p"] <= alpha

    split = label(design["confirm_split"])
    parts = []
    versus = [v for v in summary.get("versus_pretrained") or [] if v["n"]]
    if versus:
        gains = [effect(v) for v in versus]
        held = sum(shown for _, shown in gains)
        parts.append(f"RL beat the pretrained model on the sealed {split} split with "
                     + ("both settings" if len(gains) == 2 else f"all {len(gains)} settings") + " ("
                     + _listing([points(value) for value, _ in gains]) + " points; "
                     + ("each rise shown)" if held == len(gains) else f"{held} of {len(gains)} rises shown)"))
    confirmation = summary.get("confirmation")
    if confirmation is not None and confirmation["n"]:
        value, shown = effect(confirmation)
        parts.append(f"the screen's pick ({_setting_change(plan, confirmation['candidate'])}) "
                     + ("beat" if shown and value > 0 else "was worse than" if shown else "was not shown to differ from")
                     + f" the baseline on {confirmation['n']} fresh RL seeds ({points(value)} points)")
    if not parts:
        return "No confirmation has finished: no answer yet."
    text = "; ".join(parts) + "."
    return text[0].upper() + text[1:]


def _generalisation(plan: dict, summary: dict) -> str:
    rows = [r for r in summary["sealed"] if r.get("strong")]
    values = [100 * r["strong"]["comparison"]["mean_difference"] for r in rows]
    shown = sum(r["strong"]["holm"]["verdict"] != "not shown" for r in rows)
    splits = _listing(sorted({label(r["split"]) for r in rows}))
    return (f"After RL the strong pass rate on {splits} moved by {points(min(values))} to {points(max(values))} "
            f"points across both arms and both rewards; "
            + ("none" if not shown else f"{shown}") + f" of these {len(rows)} changes "
            + ("is" if shown <= 1 else "are") + " shown.")


def _rl_switches(plan: dict, summary: dict) -> str:
    rows = summary["comparisons"]
    largest = max(abs(100 * r["comparison"]["mean_difference"]) for r in rows)
    shown = [r for r in rows if r["verdict"] != "not shown"]
    switches = _listing(list(dict.fromkeys(label(r["switch"]) for r in rows)))
    return (f"Flipping one switch at a time ({switches}) moved the dev pass rate by at most {largest:.1f} points; "
            + ("none" if not shown else f"{len(shown)}") + f" of the {len(rows)} flips "
            + ("is" if len(shown) <= 1 else "are") + " shown.")


def _pretrain_switches(plan: dict, summary: dict) -> str:
    dev = summary.get("dev")
    if dev is None:
        return "Not every run has finished: no answer yet."
    shown = [r for r in dev["switches"] if r["verdict"] != "not shown"]
    other = [r for r in dev["switches"] if r["verdict"] == "not shown"]
    text = ("Only " if shown and other else "") + (
        _listing([f"{label(r['switch'])} ({points(100 * r['effect'])} points for the original's setting)"
                  for r in shown]) + (" is" if len(shown) == 1 else " are") + " shown to matter on dev"
        if shown else "No switch is shown to matter on dev")
    directions = (summary.get("confirmation") or {}).get("directions") or {}
    confirmed = [f"{points(100 * d['sealed_effect'])} points" for d in directions.values() if d["confirmed"]]
    if confirmed:
        text += f", and the sealed split confirms it ({_listing(confirmed)})"
    return text + (f"; not shown: {_listing([label(r['switch']) for r in other])}." if other else ".")


FINDERS = {"pretraining-data": _pretraining_data, "rl-choices": _rl_choices, "rl-generalisation": _generalisation,
           "rl-switches": _rl_switches, "pretrain-switches": _pretrain_switches}


def study_finding(plan: dict, summary: dict) -> str:
    """A study's answer in a learner's words (its verdicts are the study's own)."""
    finder = FINDERS.get(plan.get("study"))
    return finder(plan, summary) if finder else ""


def rerun_finding(study, summary: dict) -> str:
    """Whether a rerun on other seeds agrees with its first study, from the study's own verdicts."""
    verdicts = study.rerun_verdicts(summary["rerun"])
    agree = all(verdicts.values())
    if agree:
        return "A rerun on new seeds repeats every result."
    held = [re.sub(r"^every row holds in the rerun ?", "", name).strip("()") for name, holds in verdicts.items() if holds]
    return ("A rerun on new seeds does not repeat every result"
            + (f" (it does on the {_listing(held)} split)" if any(held) else "") + ".")


def vision_finding(summary: dict) -> str:
    comparison = summary.get("comparison")
    if not comparison:
        return ""
    per_seed = comparison["per_seed"]
    mean = {name: 100 * sum(r[f"{name}_accuracy"] for r in per_seed) / len(per_seed) for name in ("faithful", "baseline")}
    better, worse = comparison["seeds_second_better"], comparison["seeds_first_better"]
    winner, loser = ("baseline", "faithful") if better >= worse else ("faithful", "baseline")
    shown = comparison["sign_flip_p"] <= 0.05
    return (("Shown: " if shown else "Not shown: ") + f"the {winner} encoder named more held-out digits than the "
            f"{loser} one in {max(better, worse)} of {len(per_seed)} seeds ({mean[winner]:.0f}% against "
            f"{mean[loser]:.0f}% right).")


# --------------------------------------------------------------------------- the headline distribution


def _primary_words(name: str) -> str:
    """'takeoff: ours - faithful (fp32)' -> 'how often RL takes off, ours against faithful, in fp32'."""
    match = re.fullmatch(r"(takeoff|confirm after RL): (\S+) - (\S+) \((\S+)\)", name)
    if not match:
        return name
    what, second, first, where = match.groups()
    if what == "takeoff":
        return f"how often RL takes off, {second} against {first}, in {where}"
    return f"the confirm score after RL, {second} against {first}, for {where}"


def headline_findings(summary: dict) -> list[str]:
    """One short sentence per finding of the headline distribution: where the original's one run falls
    among the draws, how the arithmetic changes whether RL takes off, and what holds (so far, while
    pretraining seeds of the plan are still to run)."""
    cells = summary["cells"]
    draws = summary["draws"]
    above = sum(c["original_place"]["above"] for c in cells.values())
    equal = sum(c["original_place"]["equal"] for c in cells.values())
    value = next(iter(cells.values()))["original_place"]["value"] if cells else 16
    first = f"{above} of {len(draws)} draws beat the original's {value} of 24 on confirm; {equal} matched it."
    parts = []
    for arm in summary["plan"]["arms"]:
        counts = [f"{cells[key]['took_off']} of {cells[key]['draws']} in {precision}"
                  for precision in summary["plan"]["precisions"] if (key := f"{arm}/{precision}") in cells]
        if counts:
            parts.append(f"{arm} {', '.join(counts)}")
    second = "Same seeds, other arithmetic: RL took off for " + "; ".join(parts) + "."
    primary = summary["primary"]
    held = [_primary_words(name) for name, test in primary.items() if test.get("holds")]
    seeds = len({row["pretrain_seed"] for row in draws})
    planned = len(summary["plan"]["pretrain_seeds"])
    if seeds < planned:
        third = ((f"Shown so far: {_listing(held)}" if held else "Nothing is shown yet")
                 + f" ({seeds} of {planned} planned pretraining seeds have run).")
    else:
        third = ((f"Shown: {_listing(held)}" if held else "Nothing is shown")
                 + f" after Holm, with all {planned} pretraining seeds in.")
    return [first, second, third]


__all__ = ["QUESTIONS", "headline_findings", "points", "question", "rerun_finding", "study_finding",
           "study_key", "vision_finding"]
