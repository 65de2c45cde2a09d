"""Paired comparisons over seeds, shared by the pretraining-data and rl-choices studies' analyses.

The unit of analysis is the training seed; each comparison gets the mean paired difference, a seeded
percentile bootstrap CI, an exact two-sided sign-flip p-value, wins/ties/losses, Holm across the study's
comparisons, and the minimum detectable effect at the number of seeds run. Pass/fail metrics also get a
pooled test over (seed, item) pairs. All statistics come from glm53_flash.core.stats.
"""

from __future__ import annotations

from glm53_flash.core import stats
from glm53_flash.report.format import format_interval, format_p, format_signed

MIN_SEEDS_FOR_CI = 8  # below this the percentile bootstrap is little more than [min, max]

# The percentile bootstrap over n seeds is known to under-cover at small n; the report says so.
BOOTSTRAP_NOTE = ("Bootstrap CIs resample seeds (percentile method). With n below about 20 they are too "
                  "narrow (coverage of a nominal 95% interval is closer to 90% at n = 10), so decisions use "
                  "the exact sign-flip test, and the CI only describes the size of an effect; below "
                  f"{MIN_SEEDS_FOR_CI} seeds no CI is shown, only the range of the per-seed differences. "
                  "MDE = minimum detectable effect at 80% power and alpha / (number of comparisons), normal "
                  "approximation (optimistic at small n). wins/ties/losses count seeds where right > / = / < left "
                  "(for a loss, lower is better).")


# --------------------------------------------------------------------------- shared statistics


def paired_comparison(left: dict, right: dict, *, resamples: int, seed: int, scale: float = 1.0,
                      family_size: int = 1) -> dict:
    """Compare right - left over the seeds both have; values are scaled (100 turns rates into points)."""
    import numpy as np

    seeds = sorted(set(left) & set(right))
    differences = [scale * (right[s] - left[s]) for s in seeds]
    result = {"seeds": seeds, "n": len(seeds), "differences": differences, "mean": None, "ci95": None,
              "sign_flip_p": None, "wins": sum(d > 0 for d in differences), "ties": sum(d == 0 for d in differences),
              "losses": sum(d < 0 for d in differences), "sd": None, "mde": None,
              "left_mean": None, "right_mean": None}
    if not seeds:
        return result
    result["left_mean"] = scale * float(np.mean([left[s] for s in seeds]))
    result["right_mean"] = scale * float(np.mean([right[s] for s in seeds]))
    result["mean"] = float(np.mean(differences))
    result["range"] = [float(min(differences)), float(max(differences))]
    if len(seeds) >= MIN_SEEDS_FOR_CI:
        result["ci95"] = list(stats.bootstrap_ci(differences, resamples=resamples, seed=seed))
    result["sign_flip_p"] = stats.sign_flip_p(differences, seed=seed)
    result["sign_flip_exact"] = sum(d != 0 for d in differences) <= 20  # beyond that sign_flip_p samples
    if len(seeds) >= 2:
        result["sd"] = float(np.std(differences, ddof=1))
        if result["sd"] > 0:  # at the first Holm step's level (alpha / m): the bar a difference must clear
            result["mde"] = stats.minimum_detectable_effect(len(seeds), result["sd"], alpha=0.05 / family_size)
    return result


def apply_holm(comparisons: list[dict], key: str = "sign_flip_p", out_key: str = "holm_p") -> None:
    tested = [c for c in comparisons if c.get(key) is not None]
    for comparison, adjusted in zip(tested, stats.holm([c[key] for c in tested])):
        comparison[out_key] = adjusted


def pooled_pair_test(pairs: list[tuple[float, float]], seed: int) -> dict:
    """Sign-flip over (seed, item) pairs: swapping the two conditions within each pair is the only
    exchangeability assumed, i.e. a permutation test stratified by seed and item. Items that share a
    structure or a task family are not independent, so treat this as supporting evidence."""
    differences = [b - a for a, b in pairs]
    if not differences:
        return {"pairs": 0, "p": None, "gains": 0, "losses": 0}
    return {"pairs": len(differences), "gains": sum(d > 0 for d in differences),
            "losses": sum(d < 0 for d in differences),
            "p": stats.sign_flip_p(differences, seed=seed, samples=20000) if any(differences) else 1.0}


def verdict(comparison: dict, alpha: float, unit: str, what: str = "") -> str:
    p = comparison.get("holm_p")
    if p is None:
        return "not testable (no paired seeds)"
    direction = "higher" if comparison["mean"] > 0 else "lower"
    if p <= alpha:
        subject = f"{comparison['right']}'s {what}" if what else comparison["right"]
        return f"yes: {subject} is {direction} by {abs(comparison['mean']):.1f} {unit} (Holm p {format_p(p)})"
    mde = comparison.get("mde")
    detail = f"; this design detects about {mde:.1f} {unit} with 80% power" if mde else ""
    interval = format_interval(comparison["ci95"], spread=comparison.get("range"))
    interval = f"CI {interval}" if comparison["ci95"] else interval
    return f"no reliable difference: {format_signed(comparison['mean'])} {unit}, {interval}, Holm p {format_p(p)}{detail}"


def wall_minutes(receipts: list[dict]) -> float | None:
    """From the first run's start to the last run's end: each receipt's write time minus its run time."""
    from datetime import datetime, timedelta

    spans = []
    for receipt in receipts:
        written = receipt.get("provenance", {}).get("finished_utc") or receipt.get("provenance", {}).get("created_utc")
        if written is None or "elapsed_seconds" not in receipt:
            return None
        end = datetime.fromisoformat(written)
        spans.append((end - timedelta(seconds=receipt["elapsed_seconds"]), end))
    if not spans:
        return None
    return round((max(e for _, e in spans) - min(s for s, _ in spans)).total_seconds() / 60, 1)


__all__ = ["BOOTSTRAP_NOTE", "MIN_SEEDS_FOR_CI", "apply_holm", "paired_comparison", "pooled_pair_test", "verdict",
           "wall_minutes"]
