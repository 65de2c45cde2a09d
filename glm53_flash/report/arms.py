"""REPORT.md of a two-arm headline directory (`glm53 reproduce`), built only from its summary.json,
which is built only from the runs' receipts. Each run keeps its own REPORT.md (ARM/REPORT.md). Values
are escaped for markdown (tables cell by cell, prose line by line: tables.markdown_document), the
inputs read within core.receipts.READ_LIMITS and REPORT.md written inside the directory only."""

from __future__ import annotations

from pathlib import Path

from glm53_flash.core.receipts import read_json, write_text
from glm53_flash.core.stats import sign_flip_floor

from glm53_flash.evaluation.headline_stats import ORIGINAL_CONFIRM, power_lines
from glm53_flash.evaluation.ledger import first_lines
from glm53_flash.report.format import format_p
from glm53_flash.report.tables import markdown_document, markdown_table

ARM_TITLES = {"faithful": "faithful (every original switch)", "ours": "ours (our defaults)"}


def checkpoint_label(name: str) -> str:
    """'before' -> 'before RL', 'rl-16180' -> 'after RL seed 16180'."""
    return "before RL" if name == "before" else f"after RL seed {name.removeprefix('rl-')}"


def _percent(low: float, high: float) -> str:
    return f"[{100 * low:.0f}%, {100 * high:.0f}%]"


def switch_lines(summary: dict) -> list[str]:
    lines = []
    for arm, switches in summary["arm_switches"].items():
        parts = [f"{k}={v}" for section in ("model_overrides", "pretrain", "rl") for k, v in switches[section].items()]
        lines.append(f"- **{arm}**: " + (", ".join(parts) if parts else "every stage config at its default"))
    return lines


def arm_table(summary: dict) -> list[str]:
    """Greedy pass@1 on the trained families, confirm and holdout, each arm's main run."""
    return markdown_table(*arm_rows(summary))


def arm_rows(summary: dict) -> tuple[list[str], list[list[str]]]:
    rows = []
    for arm, s in summary["arms"].items():
        seeds = [str(x) for x in s["plan"]["rl_seeds"]]
        confirm = s["seeds"]
        first = confirm[seeds[0]]["greedy_trained"]
        row = [ARM_TITLES.get(arm, arm), f"{first['before_solved']}/{first['tasks']}",
               ", ".join(f"{confirm[x]['greedy_trained']['after_solved']}" for x in seeds) + f" of {first['tasks']}"]
        if "holdout" in s:
            holdout = s["holdout"]["seeds"]
            h = holdout[seeds[0]]["greedy_trained"]
            row += [f"{h['before_solved']}/{h['tasks']}",
                    ", ".join(f"{holdout[x]['greedy_trained']['after_solved']}" for x in seeds) + f" of {h['tasks']}"]
        else:
            row += ["not run", "not run"]
        rows.append(row)
    rows.append(["the original (published)", f"{ORIGINAL_CONFIRM['before']}/{ORIGINAL_CONFIRM['tasks']}",
                 f"{ORIGINAL_CONFIRM['after']} of {ORIGINAL_CONFIRM['tasks']}", "never evaluated", "never evaluated"])
    columns = ["arm", "confirm before RL", "confirm after RL (per RL seed)", "holdout before RL",
               "holdout after RL (per RL seed)"]
    return columns, rows


def _points(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{100 * value:+.1f}" if signed else f"{100 * value:.1f}"


def equivalence_sentence(summary: dict) -> str:
    """The answer to "does the faithful arm reproduce the original?" as its equivalence test gives it."""
    result = summary["comparison"].get("faithful_equivalent_to_original")
    if not result:
        return "The faithful arm did not run."
    original = f"{ORIGINAL_CONFIRM['after']}/{ORIGINAL_CONFIRM['tasks']}"
    if result["p"] is None:
        return (f"Reproduction of the original's {original} is not tested: {result['verdict']} "
                f"(margin +-{_points(result['margin'])} points).")
    low, high = result["interval"]
    verdict = ("**shown**: the faithful arm reproduces it within the margin" if result["equivalent"] else
               "**not shown**: no claim that the faithful arm reproduces the original is made")
    return (f"Equivalence to the original's {original} after RL within +-{_points(result['margin'])} points "
            f"(two one-sided t-tests over {len(result['values'])} pretraining seeds, each the mean of its RL "
            f"seeds' confirm rates): {verdict}. Mean {_points(result['mean'])}% against "
            f"{_points(result['original'])}%, {round(100 * result['interval_level'])}% interval "
            f"[{_points(low)}%, {_points(high)}%], TOST p {format_p(result['p'])}; these seeds could show a "
            f"margin of {_points(result['smallest_margin'])} points at the plan's power. The margin was stated "
            f"{result['margin_stated']}.")


def reproduction_lines(summary: dict) -> list[str]:
    result = summary["comparison"].get("faithful_reproduces_original")
    if not result:
        return ["The faithful arm did not run."]
    rows = [[name, f"{r['solved']}/{r['tasks']}", _percent(*r["interval"]), f"{r['original']}/{r['original_tasks']}",
             "yes" if r["original_inside"] else "no"] for name, r in result["rows"].items()]
    tasks = next(iter(result["rows"].values()))["tasks"]
    units = ((summary.get("power") or {}).get("questions", {}).get("faithful_reproduces_original") or {}).get("units")
    counted = f"{tasks} tasks" + (f" are {units} units" if units else "")
    return [equivalence_sentence(summary), "",
            f"As a description only (an interval holding the original's count is not a test; {counted}): the "
            f"main run's counts and their 95% Wilson intervals. {result['method']}.", "",
            *markdown_table(["checkpoint", "faithful", "95% Wilson interval", "original", "original inside"], rows)]


def holdout_lines(summary: dict) -> list[str]:
    result = summary["comparison"].get("ours_vs_faithful_holdout")
    if not result:
        return ["Both arms' holdout receipts are needed for this comparison."]
    rows = [[name, r["units"], f"{r['units_ours_better']} / {r['units_faithful_better']}",
             _points(r["unit_rate_difference"], signed=True), format_p(r["unit_sign_flip_p"]),
             format_p(r["unit_sign_flip_p_holm"]),
             "ours" if r["ours_better"] else "faithful" if r["faithful_better"] else "no difference shown",
             r["tasks"], r["faithful_solved"], r["ours_solved"], format_p(r["mcnemar_p"])]
            for name, r in result["rows"].items()]
    better = [name for name, r in result["rows"].items() if r["ours_better"]]
    worse = [name for name, r in result["rows"].items() if r["faithful_better"]]
    verdict = (f"ours is better {', '.join(map(checkpoint_label, better))}" if better else
               "ours is not shown better at any checkpoint")
    undecided = [name for name in result["rows"] if name not in better + worse]
    if undecided and better:
        verdict += f"; no difference is shown {', '.join(map(checkpoint_label, undecided))}"
    if worse:
        verdict += f"; the faithful arm is better {', '.join(map(checkpoint_label, worse))}"
    floor = next(iter(result["rows"].values()))["unit_sign_flip_floor"]
    return [f"Does ours beat the faithful arm on the holdout split? {verdict} "
            f"(method: {result['method']}; with these units the sign-flip test's smallest p is {format_p(floor)}).", "",
            *markdown_table(["checkpoint", "units", "units ours / faithful better", "rate diff (pts, units)",
                             "sign-flip p (units)", "Holm p", "significant at 0.05", "tasks", "faithful solved",
                             "ours solved", "McNemar p (tasks pooled)"], rows)]


TWO_LEVEL_NAMES = {"ours_minus_faithful_before": "ours - faithful, before RL",
                   "ours_minus_faithful_after": "ours - faithful, after RL",
                   "rl_gain_faithful": "RL gain, faithful", "rl_gain_ours": "RL gain, ours"}


def two_level_lines(summary: dict) -> list[str]:
    """Each question at both levels that vary: units (seed-averaged) and pretraining seeds (unit-averaged)."""
    result = summary["comparison"].get("units_and_seeds")
    if not result:
        return ["No pretraining seed has both arms' holdout receipts yet."]
    rows = []
    for key, label in TWO_LEVEL_NAMES.items():
        r = result[key]
        low, high = r["seeds"]["interval"] or (None, None)
        rows.append([label, _points(r["mean_difference"], signed=True), r["units"]["n"],
                     f"{r['units']['positive']} / {r['units']['negative']}", format_p(r["units"]["sign_flip_p"]),
                     r["seeds"]["n"], "n/a" if r["seeds"]["t_test_p"] is None else format_p(r["seeds"]["t_test_p"]),
                     "n/a" if low is None else f"[{_points(low, True)}, {_points(high, True)}]", r["verdict"]])
    return [f"Holdout greedy pass rate on the trained families, at both levels (pretraining seeds "
            f"{', '.join(map(str, result['pretrain_seeds']))}, each after its first RL seed; "
            f"{next(iter(result[k] for k in TWO_LEVEL_NAMES))['method']}):", "",
            *markdown_table(["measure", "mean (pts)", "units", "units + / -", "sign-flip p (units)", "seeds",
                             "t-test p (seeds)", "95% interval (seeds, pts)", "direction (both levels)"], rows)]


def _wrap(text: str, width: int = 100) -> list[str]:
    """Markdown prose wrapped at `width` (list items keep a two-space hanging indent)."""
    import textwrap

    lines = []
    for paragraph in text.split("\n"):
        indent = "  " if paragraph.startswith("- ") else ""
        lines += textwrap.wrap(paragraph, width, subsequent_indent=indent, break_on_hyphens=False,
                               break_long_words=False) or [""]
    return lines


def _list(values: list[str]) -> str:
    return values[0] if len(values) == 1 else ", ".join(values[:-1]) + " and " + values[-1]


def readme_statements(summary: dict) -> str | None:
    """The headline statements of a two-arm run, every figure read from this summary (its summary.json's
    `readme` field, which experiments/reproduce.py writes). None until both arms, their holdout receipts and
    at least two pretraining seeds are in."""
    comparison = summary["comparison"]
    equivalence = comparison.get("faithful_equivalent_to_original")
    holdout = comparison.get("ours_vs_faithful_holdout")
    both = comparison.get("units_and_seeds")
    power = summary.get("power")
    if not (equivalence and equivalence.get("p") is not None and holdout and both and power):
        return None
    rows = holdout["rows"]
    before, afters = rows["before"], [r for name, r in rows.items() if name != "before"]
    confirm_units = power["questions"]["faithful_reproduces_original"]["units"]
    q = power["questions"]["ours_vs_faithful_holdout"]
    first = next(iter(summary["arms"].values()))
    confirm_tasks = first["seeds"][str(first["plan"]["rl_seeds"][0])]["greedy_trained"]["tasks"]
    low, high = equivalence["interval"]
    gain_f, gain_o, after = both["rl_gain_faithful"], both["rl_gain_ours"], both["ours_minus_faithful_after"]
    false_passes = sum(counts["greedy"]["false_passes"] + counts["sampled"]["false_pass_rollouts"]
                       for arm in summary["arms"].values() for split in (arm, arm.get("holdout") or {})
                       for counts in (split.get("strong_tests") or {}).values())

    def p(value):
        return format_p(value)

    def pts(value, signed=True):
        return f"{100 * value:+.1f}" if signed else f"{100 * value:.1f}"

    def level(result, name):
        units = result["units"]
        seeds = result["seeds"]
        return (f"{name} gains {pts(result['mean_difference'], False)} points, {units['positive']} of {units['n']} "
                f"units up (sign-flip p {p(units['sign_flip_p'])}) and the t-test over seeds p "
                f"{p(seeds['t_test_p'])}")

    def verdict(result):
        if result["verdict"] != "not shown":
            return "shown at both levels"
        alpha = result["alpha"]
        units = result["units"]["sign_flip_p"] < alpha
        seeds = result["seeds"]["t_test_p"] is not None and result["seeds"]["t_test_p"] < alpha
        return ("not shown: over the units only" if units else "not shown: over the seeds only" if seeds
                else "not shown at either level")

    text = "\n".join([
        f"What varies independently here is a distinct function, not a task: the {confirm_tasks} confirm and "
        f"{before['tasks']} holdout tasks of the trained families are {confirm_units} and {before['units']} units "
        f"(each a family: its two descriptions compute the same function, and its tasks differ only in that "
        f"description and a random function name), and the pretraining seed. Every statement below is a test at those levels, generated from "
        f"`results/headline/summary.json` (`comparison`, `power`).",
        "",
        f"- **Whether the faithful arm reproduces the original: "
        f"{'shown' if equivalence['equivalent'] else 'not shown'}.** Within {pts(equivalence['margin'], False)} "
        f"points of the original's {ORIGINAL_CONFIRM['after']}/{ORIGINAL_CONFIRM['tasks']}, by two one-sided "
        f"t-tests over {len(equivalence['values'])} pretraining seeds (each the mean of its RL seeds' confirm "
        f"rates: {_list([pts(v, False) + '%' for v in equivalence['values']])}): mean "
        f"{pts(equivalence['mean'], False)}%, {round(100 * equivalence['interval_level'])}% interval "
        f"{pts(low, False)}% to {pts(high, False)}%, TOST p {p(equivalence['p'])}. These seeds could show a "
        f"margin of {pts(equivalence['smallest_margin'], False)} points. The margin was stated "
        f"{equivalence['margin_stated'].split(':')[0]}"
        + (" (the run predates the analysis plan), so no claim of reproduction is made."
           if equivalence["margin_stated"].startswith("after") else "."),
        f"- **Ours against the faithful arm on holdout: {'a difference is shown' if any(r['ours_better'] or r['faithful_better'] for r in rows.values()) else 'no difference is shown'}.** "
        f"Per checkpoint, the exact sign-flip test over the {before['units']} units (its smallest possible p is "
        f"{p(before['unit_sign_flip_floor'])}): before RL {pts(before['unit_rate_difference'])} points "
        f"(p {p(before['unit_sign_flip_p'])}), after the RL seeds "
        f"{_list([pts(r['unit_rate_difference']) for r in afters])} points "
        f"(p {_list([p(r['unit_sign_flip_p']) for r in afters])}; Holm "
        f"{_list(sorted({p(r['unit_sign_flip_p_holm']) for r in afters}))}). Pooled over tasks as if they were "
        f"independent, McNemar's p would be {_list([p(r['mcnemar_p']) for r in afters])}.",
        f"- **RL's gain on holdout: faithful {verdict(gain_f)}, ours {verdict(gain_o)}.** Units and pretraining "
        f"seeds together (each seed after its first RL seed): {level(gain_f, 'the faithful arm')}; "
        f"{level(gain_o, 'ours')}. Ours minus faithful after RL is {pts(after['mean_difference'])} points "
        f"({after['verdict']}: units p {p(after['units']['sign_flip_p'])}, seeds p "
        f"{p(after['seeds']['t_test_p'])}). False passes (the three hidden cases passed, the strong set failed) in "
        f"every receipt together: {false_passes}.",
        f"- **What this plan can detect: {'the effect it asks about' if q['detectable'] else 'not the effect it asks about'}.** "
        f"With {q['units']} units and {q['seeds']} pretraining seeds the smallest difference it detects with "
        f"{round(100 * power['analysis']['power'])}% power is "
        + (f"{pts(q['mdd_units'], False)} points over units and {pts(q['mdd_seeds'], False)} over seeds"
           if q["mdd_units"] is not None else
           f"{pts(q['mdd_seeds'], False)} points over seeds, and over units there is none (the sign-flip test over "
           f"{q['units']} units cannot go below p {p(sign_flip_floor(q['units']))}, above alpha "
           f"{power['analysis']['alpha']})")
        + f" (assumed spreads: its power section), against an effect of "
        f"interest of {pts(q['effect_of_interest'], False)} points; the smallest equivalence margin it can show is "
        f"{pts(power['questions']['faithful_reproduces_original']['smallest_margin'], False)} points.",
    ])
    return "\n".join(_wrap(text))


def readme_seed_table(summary: dict) -> dict | None:
    """The README's table over pretraining seeds, as columns and rows (rendered by tables.markdown_table)."""
    over = summary["comparison"].get("over_pretraining_seeds")
    if not over:
        return None
    names = {"ours_minus_faithful_before": "ours - faithful, before RL",
             "ours_minus_faithful_after": "ours - faithful, after RL",
             "rl_gain_faithful": "RL gain, faithful", "rl_gain_ours": "RL gain, ours"}
    seeds = ", ".join(map(str, over["pretrain_seeds"]))
    rows = [[label, ", ".join(f"{v:+.0f}" for v in over[key]["values"]), f"{over[key]['mean']:+.1f}",
             f"{over[key]['min']:+.0f} to {over[key]['max']:+.0f}",
             f"{over[key]['positive_seeds']} / {over[key]['negative_seeds']}", format_p(over[key]["sign_flip_p"])]
            for key, label in names.items()]
    return {"columns": ["measure", f"per pretraining seed ({seeds})", "mean", "range", "seeds + / -", "sign-flip p"],
            "rows": rows}


def power_section(summary: dict) -> list[str]:
    power = summary.get("power")
    if not power:
        return ["This summary predates the power statement."]
    return [f"Stated {power['stated']}.", "", *power_lines(power)]


def seed_lines(summary: dict) -> list[str]:
    seeds = summary.get("pretraining_seeds") or {}
    lines = []
    rows = []
    for arm, entries in seeds.items():
        for row in entries:
            h, c = row["holdout"], row["confirm"]
            rows.append([arm, row["pretrain_seed"], f"{h['before']}/{h['tasks']}",
                         ", ".join(str(h["after"][s]) for s in row["rl_seeds"]) + f" of {h['tasks']}",
                         f"{h['first_rl_gain']:+d}", f"{c['before']}/{c['tasks']}",
                         ", ".join(str(c["after"][s]) for s in row["rl_seeds"]) + f" of {c['tasks']}"])
    if rows:
        lines += markdown_table(["arm", "pretraining seed", "holdout before", "holdout after (per RL seed)",
                                 "RL gain (first RL seed)", "confirm before", "confirm after"], rows)
    over = summary["comparison"].get("over_pretraining_seeds")
    if over:
        n = len(over["pretrain_seeds"])
        lines += ["", f"Over {n} pretraining seed(s) ({', '.join(map(str, over['pretrain_seeds']))}), holdout greedy "
                      f"tasks solved of {over['tasks']} ({over['method']}):", ""]
        names = {"ours_minus_faithful_before": "ours - faithful, before RL",
                 "ours_minus_faithful_after": "ours - faithful, after RL",
                 "rl_gain_faithful": "RL gain, faithful", "rl_gain_ours": "RL gain, ours"}
        table = [[label, ", ".join(f"{v:+.0f}" for v in over[key]["values"]), f"{over[key]['mean']:+.1f}",
                  f"{over[key]['min']:+.0f} to {over[key]['max']:+.0f}",
                  f"{over[key]['positive_seeds']} / {over[key]['negative_seeds']}", format_p(over[key]["sign_flip_p"])]
                 for key, label in names.items()]
        lines += markdown_table(["measure", "per seed", "mean", "range", "seeds + / -", "sign-flip p"], table)
        if n < 3:
            lines += ["", f"Only {n} pretraining seed(s) ran in this directory: `make seeds` adds two more per arm."]
    else:
        lines.append("No pretraining seed has both arms yet.")
    return lines


def holdout_history(summary: dict) -> str:
    """Each arm's openings of the holdout split, from the ledger lines in its summary: when its plan
    first opened the split, and how many openings there have been since (each later one with the
    reason recorded in the ledger)."""
    parts = []
    for arm, s in summary["arms"].items():
        entries = (s.get("holdout") or {}).get("ledger") or []
        if not entries:
            continue
        openings = first_lines(entries)
        first = openings[0]
        parts.append(f"{arm}: first opened {first['utc'][:10]} at commit {first['commit'][:7]}, {len(openings)} "
                     "opening(s) in all" + (", the later ones each with its reason" if len(openings) > 1 else ""))
    return "; ".join(parts) if parts else "no opening recorded in the ledger"


def ledger_lines(summary: dict) -> list[str]:
    lines = []
    for arm, s in summary["arms"].items():
        for split, entries in (("confirm", s.get("ledger") or []),
                               ("holdout", (s.get("holdout") or {}).get("ledger") or [])):
            openings = first_lines(entries)
            lines.append(f"- {arm}, {split}: {len(openings)} opening(s) for this plan, {len(entries)} receipt(s)"
                         + (f"; reopened: {'; '.join(dict.fromkeys(x['reopen'] for x in entries if x['reopen']))}"
                            if len(openings) > 1 else ""))
    return lines


def precision_sentence(summary: dict) -> str:
    """What the arms computed in (each arm's RunSummary.precision_line; one sentence when they agree)."""
    from glm53_flash.report.summary import RunSummary

    lines = {arm: RunSummary.from_dict(record, source=f"arm {arm}").precision_line
             for arm, record in summary.get("arms", {}).items()}
    if len(set(lines.values())) == 1:
        return next(iter(lines.values()))
    return " ".join(f"{arm}: {line}" for arm, line in lines.items())


def build_headline_report(out: str | Path) -> Path:
    out = Path(out)
    summary = read_json(out / "summary.json")
    stage_rows = []
    for path in sorted(out.iterdir()):
        plan = path / "plan.json"
        if plan.is_file():
            seconds = read_json(plan).get("stage_seconds", {})
            stage_rows.append([path.name, f"{sum(seconds.values()):.0f}"])
    from glm53_flash.evaluation.ledger_verify import unvouched_receipts

    unvouched = unvouched_receipts(out)
    stand_in = {arm.get("sealed_stand_in") for arm in summary.get("arms", {}).values()} - {None}
    vouching = [f"**A smoke test:** this preset's confirm and holdout stages evaluated the {', '.join(sorted(stand_in))} "
                "split instead, so no sealed split was opened; its figures say nothing about held-out tasks.", ""] \
        if stand_in else []
    vouching += [] if not unvouched else [
        f"**Not vouched for by the committed ledger:** {len(unvouched)} sealed-split receipt(s) here are not in "
        "results/ledger.jsonl (opened under another ledger, such as this run's own, or changed since), for "
        "example `" + str(unvouched[0].relative_to(out)) + "`. Their figures are this run's, not the project's.", ""]
    lines = [
        f"# Headline experiment, two arms ({summary['preset']} preset)",
        "",
        *vouching,
        "Every number below is read from `summary.json`, which `glm53 reproduce` computes from the receipts in "
        "the run directories (`faithful/`, `ours/`, and `ARM-pretrain-SEED/` for the extra pretraining seeds). "
        "Each run directory has its own REPORT.md.",
        "",
        precision_sentence(summary),
        "",
        "The two arms share the data, the budget and every hyperparameter; they differ only in these switches:",
        "",
        *switch_lines(summary),
        "",
        "Each run: pretraining -> checkpoint selection on dev -> RLOO for each RL seed -> selection on dev -> "
        "the confirm split (opened before by the original and by earlier versions of this project) -> the holdout "
        "split (sealed until each arm's plan first opened it; " + holdout_history(summary) + ").",
        "",
        "## Greedy pass@1 on the trained families",
        "",
        *arm_table(summary),
        "",
        "## 1. The faithful arm against the original",
        "",
        *reproduction_lines(summary),
        "",
        "## 2. Ours against the faithful arm, on holdout",
        "",
        *holdout_lines(summary),
        "",
        "## 3. Units and seeds together",
        "",
        *two_level_lines(summary),
        "",
        "## 4. Over pretraining seeds",
        "",
        *seed_lines(summary),
        "",
        "## Power of this plan",
        "",
        *power_section(summary),
        "",
        "## Ledger",
        "",
        *ledger_lines(summary),
        "",
        "## Time per run (seconds of stages, this machine)",
        "",
        *markdown_table(["run", "seconds"], stage_rows),
    ]
    return write_text(out / "REPORT.md", markdown_document(lines) + "\n", within=out)
