"""Faithful vs baseline over seeds: paired tests and confusion matrices, from a training receipt alone.

The unit of replication is the seed (model initialisation, training images and held-out images all
change with it). Across seeds: the exact two-sided sign-flip test of the per-seed accuracy
differences and a paired bootstrap CI. Within a seed both arms see the same held-out images, so an
exact McNemar test compares them example by example; the pooled view sums those discordant pairs.
"""

from __future__ import annotations

from glm53_flash.core.stats import mcnemar_exact, paired_bootstrap_ci, sign_flip_p
from glm53_flash.vision.evaluation import CONFUSION_COLUMNS

BOOTSTRAP = {"resamples": 10_000, "seed": 0, "level": 0.95}


def results_by(receipt: dict) -> dict[tuple[int, str], dict]:
    return {(r["seed"], r["architecture"]): r for r in receipt["results"]}


def arm_summary(results: list[dict]) -> dict:
    """Per-architecture figures pooled over seeds."""
    before = [r["before"]["correct"] for r in results]
    after = [r["after"]["correct"] for r in results]
    examples = [r["after"]["examples"] for r in results]
    accuracy = [r["after"]["accuracy"] for r in results]
    matrix = [[0] * len(CONFUSION_COLUMNS) for _ in range(10)]
    for r in results:
        for i, row in enumerate(r["after"]["confusion"]["matrix"]):
            for j, value in enumerate(row):
                matrix[i][j] += value
    first = results[0]
    return {
        "architecture": first["architecture"], "glm_faithful": first["glm_faithful"],
        "parameter_count": first["parameter_count"], "seeds": [r["seed"] for r in results],
        "before_correct": sum(before), "after_correct": sum(after), "examples": sum(examples),
        "mean_accuracy_after": sum(accuracy) / len(accuracy),
        "min_accuracy_after": min(accuracy), "max_accuracy_after": max(accuracy),
        "mean_accuracy_before": sum(r["before"]["accuracy"] for r in results) / len(results),
        "mean_loss_before": sum(r["before"]["loss"] for r in results) / len(results),
        "mean_loss_after": sum(r["after"]["loss"] for r in results) / len(results),
        "mean_final_training_loss": sum(r["final_training_loss"] for r in results) / len(results),
        "mean_train_seconds": sum(r["wall_time_seconds"] for r in results) / len(results),
        "confusion_after_pooled": {"rows": [str(d) for d in range(10)], "columns": CONFUSION_COLUMNS,
                                   "matrix": matrix},
        "top_confusions": top_confusions(matrix),
    }


def top_confusions(matrix: list[list[int]], limit: int = 5) -> list[dict]:
    """The most frequent off-diagonal (target -> prediction) cells."""
    cells = [{"target": str(t), "prediction": CONFUSION_COLUMNS[p], "count": matrix[t][p]}
             for t in range(10) for p in range(len(CONFUSION_COLUMNS)) if p != t and matrix[t][p]]
    return sorted(cells, key=lambda c: (-c["count"], c["target"], c["prediction"]))[:limit]


def compare_architectures(receipt: dict, first: str = "faithful", second: str = "baseline") -> dict | None:
    """Paired comparison of two architectures over the seeds that trained both; None if there are none."""
    table = results_by(receipt)
    seeds = [s for s in receipt["config"]["seeds"] if (s, first) in table and (s, second) in table]
    if not seeds:
        return None
    per_seed = []
    for seed in seeds:
        a, b = table[(seed, first)]["after"], table[(seed, second)]["after"]
        if a["targets"] != b["targets"] or a["render_seed"] != b["render_seed"]:
            raise ValueError(f"seed {seed}: the two arms were evaluated on different held-out sets")
        only_first = sum(x and not y for x, y in zip(a["correct_by_example"], b["correct_by_example"]))
        only_second = sum(y and not x for x, y in zip(a["correct_by_example"], b["correct_by_example"]))
        per_seed.append({
            "seed": seed, f"{first}_correct": a["correct"], f"{second}_correct": b["correct"],
            "examples": a["examples"], f"{first}_accuracy": a["accuracy"], f"{second}_accuracy": b["accuracy"],
            "difference": a["accuracy"] - b["accuracy"], f"only_{first}_correct": only_first,
            f"only_{second}_correct": only_second, "mcnemar_p": mcnemar_exact(only_first, only_second),
        })
    differences = [row["difference"] for row in per_seed]
    low, high = paired_bootstrap_ci([row[f"{second}_accuracy"] for row in per_seed],
                                    [row[f"{first}_accuracy"] for row in per_seed], level=BOOTSTRAP["level"],
                                    resamples=BOOTSTRAP["resamples"], seed=BOOTSTRAP["seed"])
    pooled_first = sum(row[f"only_{first}_correct"] for row in per_seed)
    pooled_second = sum(row[f"only_{second}_correct"] for row in per_seed)
    return {
        "first": first, "second": second, "seeds": seeds, "per_seed": per_seed,
        "mean_difference": sum(differences) / len(differences),
        "seeds_first_better": sum(d > 0 for d in differences),
        "seeds_second_better": sum(d < 0 for d in differences), "seeds_tied": sum(d == 0 for d in differences),
        "sign_flip_p": sign_flip_p(differences),
        "sign_flip_test": "exact two-sided paired sign-flip over seed-level accuracy differences",
        "bootstrap_ci_mean_difference": [low, high], "bootstrap": BOOTSTRAP,
        "pooled": {f"only_{first}_correct": pooled_first, f"only_{second}_correct": pooled_second,
                   "mcnemar_p": mcnemar_exact(pooled_first, pooled_second),
                   "note": "discordant pairs summed over seeds (each seed has its own held-out images)"},
    }
