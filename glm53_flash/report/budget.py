"""The before-RL pass rate of a pretraining run on a suite's dev split, checkpoint by checkpoint: the
receipt behind the stated pretraining budget at which the sealed sets are measurable (neither 0 nor
saturated). Built only from the pretraining receipt and one greedy evaluation receipt per checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

from glm53_flash.core.receipts import provenance, read_json, sha256_file

# The budget: the earliest checkpoint at which every kind of dev task is measurable, its greedy pass
# rate inside this band (outcomes near the middle carry the most information per pass/fail unit).
MEASURABLE = (0.20, 0.80)


def _sha256_json(value) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(value).encode()).hexdigest()


def budget_summary(training_receipt: str | Path, evaluations: list[str | Path]) -> dict:
    """Per evaluated checkpoint: its step, tokens seen, training loss, and the greedy dev result overall,
    under the strong set and per kind (with units); the rows sorted by step."""
    training = read_json(Path(training_receipt))
    curve = {row["step"]: row for row in training["training_curve"]}
    seen = {c["weights_sha256"]: c["step"] for c in training["checkpoints"]}
    rows = []
    for path in evaluations:
        receipt = read_json(Path(path))
        if not receipt.get("inference", {}).get("greedy"):
            raise ValueError(f"{path} is not a greedy evaluation receipt")
        step = seen.get(receipt.get("checkpoint_sha256"))
        if step is None:
            raise ValueError(f"{path} evaluates a checkpoint that {training_receipt} did not write")
        summary = receipt["summary"]
        tokens = sum(r["tokens"] for s, r in curve.items() if s <= step)
        kinds = {kind: {"solved": row["solved"], "tasks": row["tasks"], "units": row["units"],
                        "solved_strong": row.get("solved_strong")}
                 for kind, row in receipt["by_kind"].items()}
        rows.append({"step": step, "tokens_seen": tokens, "loss": curve[step]["loss"] if step in curve else None,
                     "split": receipt["split"], "tasks": summary["tasks_total"], "units": summary["units"],
                     "solved": summary["tasks_solved"], "pass_at_1": summary["pass_at_1"],
                     "solved_strong": summary["tasks_solved_strong"], "false_passes": summary["false_passes"],
                     "valid_programs": summary["valid_programs"], "by_kind": kinds,
                     "receipt": Path(path).name, "receipt_sha256": sha256_file(path)})
        rows[-1]["strong_tests_sha256"] = receipt["inference"]["strong_tests"]["sha256"]
        rows[-1]["task_ids_sha256"] = _sha256_json([e["task_id"] + "\n" + e["prompt"] for e in receipt["episodes"]])
    rows.sort(key=lambda r: r["step"])
    for key in ("split", "strong_tests_sha256", "task_ids_sha256"):
        if len({r[key] for r in rows}) > 1:
            raise ValueError(f"the evaluation receipts differ in {key}: every checkpoint must be judged on the same tasks")
    kinds = sorted({k for r in rows for k in r["by_kind"]})
    table_rows = []
    for r in rows:
        cells = [f"{r['step']:,}", f"{r['tokens_seen'] / 1e6:.2f}M", f"{r['loss']:.3f}",
                 f"{r['solved']}/{r['tasks']} ({100 * r['pass_at_1']:.1f}%)", f"{r['solved_strong']}"]
        for kind in kinds:
            k = r["by_kind"].get(kind)
            cells.append("-" if k is None else f"{k['solved']}/{k['tasks']} ({100 * k['solved'] / k['tasks']:.1f}%)")
        table_rows.append(cells)
    columns = ["pretraining step", "tokens seen", "training loss", "dev greedy pass@1",
               "solved under the strong set", *[f"{kind}, solved" for kind in kinds]]
    data = training.get("data", {})
    low, high = MEASURABLE
    measurable = [r for r in rows if r["by_kind"] and all(low <= k["solved"] / k["tasks"] <= high
                                                          for k in r["by_kind"].values())]
    budget = None if not measurable else {
        "step": measurable[0]["step"], "tokens_seen": measurable[0]["tokens_seen"],
        "pass_at_1": measurable[0]["pass_at_1"],
        "by_kind": {kind: k["solved"] / k["tasks"] for kind, k in measurable[0]["by_kind"].items()},
        "rule": f"the earliest checkpoint whose dev greedy pass rate lies between {low:.0%} and {high:.0%} for "
                f"every kind of task (neither 0 nor saturated)"}
    return {
        "what": "greedy pass@1 of each pretraining checkpoint on the suite's dev split, before any RL",
        "training": {"receipt": Path(training_receipt).name, "receipt_sha256": sha256_file(training_receipt),
                     "preset": training["preset"], "tasks": data.get("tasks", "families"),
                     "behaviours_sha256": data.get("behaviours_sha256"), "batch_size": training["batch_size"],
                     "sequence_length": training["sequence_length"], "learning_rate": training["learning_rate"],
                     "warmup": training["warmup"], "schedule": training["schedule"], "steps": training["steps"],
                     "seed": training["seed"], "parameters": training["parameter_counts"]["total"],
                     "elapsed_seconds": training["elapsed_seconds"], "commit": training["provenance"]["git_commit"]},
        "checkpoints": rows,
        "budget": budget,
        "headline_table": {"columns": columns, "rows": table_rows},
        "provenance": provenance(),
    }
