"""results/vision: summary.json, REPORT.md and a chart, built only from the vision receipts.

`glm53 vision report --train RECEIPT [--pilot RECEIPT] --output DIR` copies the receipts into
DIR/receipts/ and derives every figure from them; nothing is typed in by hand.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from glm53_flash.core.receipts import read_json, sha256_file, write_json, write_text
from glm53_flash.report import figures
from glm53_flash.report.study_charts import draw_vision_comparison
from glm53_flash.report.format import format_interval, format_p, format_signed
from glm53_flash.vision.analysis import arm_summary, compare_architectures
from glm53_flash.vision.config import ARCHITECTURES

LABELS = {"faithful": "GLM-style faithful miniature", "baseline": "direct-patch baseline (not GLM-faithful)"}
CHART_FILE = "vision-comparison.png"


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def _read(path: str | Path, kind: str) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{kind} receipt {path} does not exist")
    receipt = read_json(path)
    expected = {"train": "vision-miniature-rgb-digits", "pilot": "vision-pilot"}[kind]
    if receipt.get("kind") != expected:
        raise ValueError(f"{path} is not a vision {kind} receipt (kind {receipt.get('kind')!r}, expected {expected!r})")
    return receipt


def build_summary(train: dict, pilot: dict | None, sources: dict) -> dict:
    cfg = train["config"]
    arms = {}
    for name in ARCHITECTURES:
        results = [r for r in train["results"] if r["architecture"] == name]
        if results:
            arms[name] = arm_summary(results)
    comparison = compare_architectures(train) if len(arms) == 2 else None
    rows = []
    for name, arm in arms.items():
        n = len(arm["seeds"])
        rows.append([LABELS[name], f"{arm['parameter_count']:,}",
                     f"{arm['before_correct']}/{arm['examples']} ({_pct(arm['before_correct'] / arm['examples'])})",
                     (f"{arm['after_correct']}/{arm['examples']} ({_pct(arm['after_correct'] / arm['examples'])}; "
                     f"seeds {_pct(arm['min_accuracy_after'])}-{_pct(arm['max_accuracy_after'])})"),
                     f"{n} x {cfg['steps']} steps x {cfg['batch_size']}", f"{arm['mean_train_seconds']:.2f}"])
    answers = []
    if comparison:
        f_arm, b_arm = arms["faithful"], arms["baseline"]
        leader = "faithful miniature" if comparison["mean_difference"] > 0 else "direct-patch baseline"
        answers.append(
            f"Over {len(comparison['seeds'])} seeds the {leader} named more held-out digits: faithful "
            f"{f_arm['after_correct']}/{f_arm['examples']} vs baseline {b_arm['after_correct']}/{b_arm['examples']} "
            f"(faithful better on {comparison['seeds_first_better']}, baseline on {comparison['seeds_second_better']}, "
            f"tied on {comparison['seeds_tied']}; exact sign-flip p = {format_p(comparison['sign_flip_p'])}).")
        low, high = comparison["bootstrap_ci_mean_difference"]
        pooled = comparison["pooled"]
        answers.append(
            f"Faithful minus baseline accuracy: {format_signed(comparison['mean_difference'], scale=100)} points "
            f"(95% bootstrap CI over seeds {format_signed(low, scale=100)} to {format_signed(high, scale=100)}); pooled over seeds only the faithful "
            f"model was right on {pooled['only_faithful_correct']} images and only the baseline on "
            f"{pooled['only_baseline_correct']} (descriptive only: a McNemar p over images pooled across "
            f"independently trained models ignores run-to-run variance, so the seed-level test above is the inference).")
    for name, arm in arms.items():
        if arm["top_confusions"]:
            top = ", ".join(f"{c['target']}->{c['prediction']} ({c['count']})" for c in arm["top_confusions"][:3])
            answers.append(f"The {LABELS[name]}'s most frequent held-out errors are {top}.")
    pilot_summary = None
    if pilot is not None:
        model, opt, before, after = pilot["model"], pilot["optimization"], pilot["before"], pilot["after"]
        pilot_summary = {
            "initialization": pilot["initialization"], "device": pilot["environment"]["device"],
            "total_parameters": model["total_multimodal_parameters"],
            "trainable_parameters": model["trainable_parameters"],
            "completed_steps": opt["completed_steps"], "requested_steps": opt["requested_steps"],
            "batch_size": opt["batch_size"], "stop_reason": opt["stop_reason"],
            "train_seconds": opt["train_seconds"], "wall_time_seconds": opt["wall_time_seconds"],
            "before": {k: before[k] for k in ("correct", "examples", "accuracy", "loss")},
            "after": {k: after[k] for k in ("correct", "examples", "accuracy", "loss")},
            "learned_at_all": pilot["learned_at_all"], "loss_trace": opt["loss_trace"],
            "confusion_after": after["confusion"], "held_out_seed": pilot["data"]["held_out_seed"],
        }
        rows.append([f"25.7M pilot ({pilot['initialization']['source'].replace('_', ' ')})",
                     f"{model['total_multimodal_parameters']:,} ({model['trainable_parameters']:,} trained)",
                     f"{before['correct']}/{before['examples']} ({_pct(before['accuracy'])})",
                     f"{after['correct']}/{after['examples']} ({_pct(after['accuracy'])})",
                     f"1 x {opt['completed_steps']} steps x {opt['batch_size']}", f"{opt['train_seconds']:.2f}"])
        answers.append(
            f"The 25.7M pilot ({pilot['initialization']['source'].replace('_', ' ')}) went from {before['correct']}/"
            f"{before['examples']} to {after['correct']}/{after['examples']} held-out digits in {opt['completed_steps']} "
            f"steps ({opt['train_seconds']:.1f} s of training on {pilot['environment']['device']}); held-out "
            f"cross-entropy {before['loss']:.3f} -> {after['loss']:.3f}.")
    return {
        "headline_table": {"columns": ["model", "parameters", "held-out before", "held-out after",
                                       "training", "train s (per model)"], "rows": rows},
        "answers": answers,
        "arms": arms,
        "comparison": comparison,
        "pilot": pilot_summary,
        "training_config": {k: cfg[k] for k in ("seeds", "steps", "batch_size", "learning_rate", "eval_examples",
                                                 "smoke_test")},
        "environment": {"train": train["provenance"], "pilot": pilot["provenance"] if pilot else None},
        "sources": sources,
    }


def render_markdown(summary: dict) -> str:
    table = summary["headline_table"]
    lines = ["# Vision: the miniature GLM-style vision path on generated RGB digits", "",
             ("Generated by `glm53 vision report` from the receipts in `receipts/`; every figure below comes "
             "from them."), "", "| " + " | ".join(table["columns"]) + " |",
             "|" + "---|" * len(table["columns"])]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in table["rows"]]
    lines += ["", "## Answers", ""] + [f"- {a}" for a in summary["answers"]]
    comparison = summary["comparison"]
    if comparison:
        lines += ["", "## Faithful vs baseline, seed by seed", "",
                  ("Same seed = same language-model initialisation, training images and held-out images for both "
                  "arms. McNemar: exact, on the held-out images of that seed."), "",
                  "| seed | faithful | baseline | difference | only faithful right | only baseline right | McNemar p |",
                  "|---:|---:|---:|---:|---:|---:|---:|"]
        for row in comparison["per_seed"]:
            lines.append(f"| {row['seed']} | {row['faithful_correct']}/{row['examples']} | "
                         f"{row['baseline_correct']}/{row['examples']} | {format_signed(row['difference'], scale=100)} | "
                         f"{row['only_faithful_correct']} | {row['only_baseline_correct']} | {format_p(row['mcnemar_p'])} |")
        low, high = comparison["bootstrap_ci_mean_difference"]
        lines += ["", (f"Exact sign-flip p over {len(comparison['seeds'])} seeds: {format_p(comparison['sign_flip_p'])}; "
                  f"mean difference {format_signed(comparison['mean_difference'], scale=100)} points, 95% paired "
                  f"bootstrap CI {format_interval([low, high], scale=100)} ({comparison['bootstrap']['resamples']:,} resamples, "
                  f"seed {comparison['bootstrap']['seed']}).")]
    for name, arm in summary["arms"].items():
        confusion = arm["confusion_after_pooled"]
        lines += ["", f"## Confusion after training: {LABELS[name]} (pooled over seeds {arm['seeds']})", "",
                  "Rows: the digit drawn; columns: the id predicted (\"other\" = any non-digit id).", "",
                  "| target | " + " | ".join(confusion["columns"]) + " |", "|---|" + "---:|" * len(confusion["columns"])]
        for label, row in zip(confusion["rows"], confusion["matrix"]):
            lines.append(f"| {label} | " + " | ".join(str(v) for v in row) + " |")
    pilot = summary["pilot"]
    if pilot:
        lines += ["", "## The 25.7M pilot", "",
                  (f"Initialisation: {pilot['initialization']['source']} ({pilot['initialization'].get('checkpoint')}). "
                  f"{pilot['total_parameters']:,} parameters, {pilot['trainable_parameters']:,} trained; "
                  f"{pilot['completed_steps']}/{pilot['requested_steps']} steps of batch {pilot['batch_size']} "
                  f"({pilot['stop_reason']}), {pilot['train_seconds']:.1f} s of training on {pilot['device']}."), "",
                  "| step | language loss | gradient norm |", "|---:|---:|---:|"]
        lines += [f"| {r['step']} | {r['language_loss']:.4f} | {r['gradient_norm']:.3f} |" for r in pilot["loss_trace"]]
        confusion = pilot["confusion_after"]
        lines += ["", ("Confusion after training (held-out seed "
                  f"{pilot['held_out_seed']}):"), "", "| target | " + " | ".join(confusion["columns"]) + " |",
                  "|---|" + "---:|" * len(confusion["columns"])]
        for label, row in zip(range(10), confusion["matrix"]):
            lines.append(f"| {label} | " + " | ".join(str(v) for v in row) + " |")
    lines += ["", "## Reproduce", ""]
    for name, source in summary["sources"].items():
        lines.append(f"- {name}: `{source['command']}`")
    lines += ["", f"![faithful vs baseline]({CHART_FILE})", ""]
    return "\n".join(lines)


def make_chart(summary: dict, path: Path) -> None:
    fig = draw_vision_comparison(summary)
    if fig is not None:
        figures.save_png(fig, path, dpi=90)


def build_vision_report(train_path: str | Path, pilot_path: str | Path | None, output: str | Path,
                        force: bool = False) -> dict:
    out = Path(output)
    if (out / "summary.json").exists() and not force:
        raise FileExistsError(f"{out}/summary.json already exists; pass --force to rebuild the report")
    train = _read(train_path, "train")
    pilot = _read(pilot_path, "pilot") if pilot_path else None
    receipts = out / "receipts"
    receipts.mkdir(parents=True, exist_ok=True)
    sources = {}
    for name, path, receipt in (("train", train_path, train), ("pilot", pilot_path, pilot)):
        if receipt is None:
            continue
        target = receipts / f"{name}.json"
        if Path(path).resolve() != target.resolve():
            # the same content without indentation: the per-example lists make indented JSON large
            write_text(target, json.dumps(receipt, sort_keys=True, separators=(",", ":")) + "\n")
        sources[name] = {"receipt": f"receipts/{name}.json", "sha256": sha256_file(target),
                         "command": shlex.join(receipt["command"]) if receipt.get("command") else None}
    summary = build_summary(train, pilot, sources)
    write_json(out / "summary.json", summary)
    write_text(out / "REPORT.md", render_markdown(summary))
    make_chart(summary, out / CHART_FILE)
    return summary
