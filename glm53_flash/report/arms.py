"""REPORT.md of a two-arm headline directory (`glm53 reproduce`), built only from its summary.json,
which is built only from the runs' receipts. Each run keeps its own REPORT.md (ARM/REPORT.md)."""

from __future__ import annotations

import json
from pathlib import Path

from ..headline_stats import ORIGINAL_CONFIRM
from ..ledger import first_lines
from .format import format_p
from .tables import markdown_table

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


def reproduction_lines(summary: dict) -> list[str]:
    result = summary["comparison"].get("faithful_reproduces_original")
    if not result:
        return ["The faithful arm did not run."]
    rows = [[name, f"{r['solved']}/{r['tasks']}", _percent(*r["interval"]), f"{r['original']}/{r['original_tasks']}",
             "yes" if r["original_inside"] else "no"] for name, r in result["rows"].items()]
    after = [r for name, r in result["rows"].items() if name != "before"]
    inside = sum(r["original_inside"] for r in after)
    before = "inside" if result["rows"]["before"]["original_inside"] else "outside"
    verdict = ("**yes**: the original's count lies inside every interval" if result["reproduces"] else
               f"**not on every count**: the original's count lies {before} the interval before RL and "
               f"inside it on {inside} of {len(after)} RL seeds")
    return [f"Does the faithful arm reproduce the original's {ORIGINAL_CONFIRM['before']}/24 -> "
            f"{ORIGINAL_CONFIRM['after']}/24 within its uncertainty? {verdict}. Method: {result['method']}.", "",
            *markdown_table(["checkpoint", "faithful", "95% Wilson interval", "original", "original inside"], rows)]


def holdout_lines(summary: dict) -> list[str]:
    result = summary["comparison"].get("ours_vs_faithful_holdout")
    if not result:
        return ["Both arms' holdout receipts are needed for this comparison."]
    rows = [[name, r["tasks"], r["faithful_solved"], r["ours_solved"], r["only_faithful"], r["only_ours"],
             format_p(r["mcnemar_p"]), format_p(r["mcnemar_p_holm"]),
             "ours" if r["ours_better"] else "faithful" if r["faithful_better"] else "no difference shown"]
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
    return [f"Does ours beat the faithful arm on the holdout split? {verdict} "
            f"(method: {result['method']}).", "",
            *markdown_table(["checkpoint", "tasks", "faithful solved", "ours solved", "only faithful", "only ours",
                             "McNemar p", "Holm p", "significant at 0.05"], rows)]


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


def build_headline_report(out: str | Path) -> Path:
    out = Path(out)
    summary = json.loads((out / "summary.json").read_text())
    stage_rows = []
    for path in sorted(out.iterdir()):
        plan = path / "plan.json"
        if plan.is_file():
            seconds = json.loads(plan.read_text()).get("stage_seconds", {})
            stage_rows.append([path.name, f"{sum(seconds.values()):.0f}"])
    lines = [
        f"# Headline experiment, two arms ({summary['preset']} preset)",
        "",
        "Every number below is read from `summary.json`, which `glm53 reproduce` computes from the receipts in "
        "the run directories (`faithful/`, `ours/`, and `ARM-pretrain-SEED/` for the extra pretraining seeds). "
        "Each run directory has its own REPORT.md.",
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
        "## 3. Over pretraining seeds",
        "",
        *seed_lines(summary),
        "",
        "## Ledger",
        "",
        *ledger_lines(summary),
        "",
        "## Time per run (seconds of stages, this machine)",
        "",
        *markdown_table(["run", "seconds"], stage_rows),
    ]
    path = out / "REPORT.md"
    path.write_text("\n".join(lines) + "\n")
    return path
