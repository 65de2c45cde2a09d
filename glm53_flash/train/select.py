"""Checkpoint selection: evaluate every checkpoint of a run on a held-out split and name the best.

Stated rule: with samples > 1, the most exact sampled rollouts (pass@1 by sampling); with greedy
evaluation, the most tasks solved, then the most tests passed. Ties go to the earlier checkpoint,
so selection never prefers more training without evidence.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from glm53_flash.core.options import config_record
from glm53_flash.core.receipts import provenance, read_json, write_json
from glm53_flash.tasks import DEV_SPLITS, MAX_NEW_TOKENS, parse_families, split_tasks, suite_of
from glm53_flash.train.checkpoint import list_checkpoints, load_checkpoint
from glm53_flash.train.config import SelectConfig

RULE_SAMPLED = "max exact sampled rollouts; ties to the earlier checkpoint"
RULE_GREEDY = "max greedy tasks solved, then tests passed; ties to the earlier checkpoint"


def selection_score(receipt: dict, sampled: bool) -> tuple:
    summary = receipt["summary"]
    if sampled:
        return (summary["exact_rollouts"],)
    return (summary["tasks_solved"], summary["tests_passed"])


def format_score(score, sampled: bool) -> str:
    """A score as words: '12 exact rollouts' or '3 tasks solved, 7 tests passed'."""
    if sampled:
        return f"{score[0]} exact rollouts"
    return f"{score[0]} tasks solved, {score[1]} tests passed"


def tie_of_zeros_note(entries: list[dict]) -> str | None:
    """What to say when every checkpoint scored nothing: the tie rule then picks the earliest, which is
    a choice by the rule, not by evidence (and, for a run's step 0, the untrained initialisation)."""
    if any(any(part for part in entry["score"]) for entry in entries):
        return None
    earliest = min(entries, key=lambda e: e["step"])
    what = "the untrained initialisation" if earliest["step"] == 0 else f"step {earliest['step']}"
    return (f"every checkpoint scored 0, so the tie rule picks the earliest ({what}); no evaluation "
            f"supports it over the others")


def best_entry(entries: list[dict]) -> dict:
    """The highest score; among equal scores, the earliest step."""
    return max(entries, key=lambda e: (tuple(e["score"]), -e["step"]))


def run_families(run_dir: Path) -> str:
    """The families an RL run trained on ('' = all); pretraining runs use all."""
    receipt = run_dir / "training-receipt.json"
    if receipt.is_file():
        families = read_json(receipt).get("families", "all")
        if isinstance(families, list):
            return ",".join(families)
    return ""


def select_checkpoint(run_dir: str | Path, **options) -> dict:
    """`select_from_config` of SelectConfig(run=run_dir, **options): the knobs and their defaults are
    SelectConfig's, declared once."""
    return select_from_config(SelectConfig(run=str(run_dir), **options))


def select_from_config(cfg: SelectConfig) -> dict:
    """Evaluate every checkpoint of cfg.run on cfg.split and write the selection receipt (`glm53 select`,
    the reproduce plan's selection stages)."""
    from glm53_flash.evaluation.evaluate import evaluate_greedy, evaluate_sampled
    from glm53_flash.verifier import Verifier

    run_dir, split, samples, per_family, families = Path(cfg.run), cfg.split, cfg.samples, cfg.per_family, cfg.families
    temperature, max_new_tokens, seed, stop, device = cfg.temperature, cfg.max_new_tokens, cfg.seed, cfg.stop, cfg.device
    output, force, quiet = cfg.output, cfg.force, cfg.quiet
    from glm53_flash.core.runtime import resolve_device

    device = str(resolve_device(device))
    if split not in DEV_SPLITS.values():  # choosing by a sealed split would spend it; rl is what the model trained on
        raise ValueError(f"--split {split!r} cannot be used for selection; allowed: {', '.join(DEV_SPLITS.values())}")
    suite = suite_of(split)
    if per_family is None and suite == "families":
        per_family = 4
    if max_new_tokens is None:
        max_new_tokens = MAX_NEW_TOKENS[suite]
    checkpoints = list_checkpoints(run_dir)
    if not checkpoints:
        raise FileNotFoundError(f"no checkpoints in {run_dir}")
    out = Path(output) if output else run_dir / f"selection-{split}.json"
    if out.exists() and not force:
        raise FileExistsError(f"{out} exists; pass --force to replace it")
    family_text = run_families(run_dir) if families is None else families
    tasks = split_tasks(split, per_family, families=parse_families(family_text, suite))
    sampled = samples > 1
    entries = []
    with Verifier() as verifier:
        for step, path in checkpoints:
            model, meta = load_checkpoint(path, device)
            common = dict(max_new_tokens=max_new_tokens, stop=stop, seed=seed, verifier=verifier,
                          checkpoint=str(path), checkpoint_sha256=meta["weights_sha256"], precision=cfg.precision)
            if sampled:
                receipt = evaluate_sampled(model, tasks, samples=samples, temperature=temperature, **common)
            else:
                receipt = evaluate_greedy(model, tasks, **common)
            eval_path = run_dir / "selection" / f"{split}-{path.name}.json"
            write_json(eval_path, receipt)
            entries.append({"checkpoint": str(path), "step": step, "weights_sha256": meta["weights_sha256"],
                            "score": list(selection_score(receipt, sampled)), "summary": receipt["summary"],
                            "pass_at_k": receipt.get("pass_at_k"), "receipt": str(eval_path)})
            if not quiet:
                print(f"  {path.name}: {format_score(entries[-1]['score'], sampled)}", flush=True)
    best = best_entry(entries)
    note = tie_of_zeros_note(entries)
    result = {
        "schema_version": "1.0", "status": "complete", "run": str(run_dir), "split": split,
        "rule": RULE_SAMPLED if sampled else RULE_GREEDY,
        "inference": {"samples": samples, "temperature": temperature if sampled else None,
                      "max_new_tokens": max_new_tokens, "per_family": per_family,
                      "families": family_text or "all", "seed": seed, "stop": stop},
        "selected": best, "tie_of_zeros": note, "checkpoints": entries, "provenance": provenance(device=device),
        "run_config": config_record(replace(cfg, run=str(run_dir), per_family=per_family, max_new_tokens=max_new_tokens)),
    }
    write_json(out, result)
    return result
