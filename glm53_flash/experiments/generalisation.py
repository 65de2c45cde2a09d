"""RL-generalisation study: does RL on the compositions suite's rl behaviours carry over to behaviours
it never trained on?

For each arm (faithful: the original miniature's switches; ours: our defaults; reproduce.ARMS) and
each pretraining seed: pretrain on the suite's pretraining stream, select a checkpoint on dev
(greedy, the most tasks solved, then tests passed; ties to the earlier), then RL from it on
`compositions.rl` for every RL seed, once with the original's three-case reward and once with the
strong set as the reward, each run's checkpoint again selected on dev. Only when every run of an
(arm, seed) is selected are the two sealed splits opened, once each through the ledger: unseen
compositions (`compositions.unseen_structures`) and seen structures with new constants
(`compositions.new_constants`), reported separately. Every evaluation is greedy pass@1, judged on the
task's three cases and on its strong set, so a report can say how many passes are false (reward
hacking). The units of analysis are a structure group (its behaviours averaged: behaviours of one group
are correlated) and a pretraining seed; a direction is claimed only when both levels show it
(stats.two_level_comparison) after Holm over the study's comparisons at each level
(stats.holm_verdicts). Each behaviour's effect is a secondary view.
`Generalisation` at the end declares the study (study.Study), its rerun comparison beside it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from glm53_flash.core.argtypes import comma_ints
from glm53_flash.core.options import option
from glm53_flash.core.runtime import PRECISION_HELP, PRECISIONS
from glm53_flash.evaluation.config import SAMPLING_TEMPERATURE
from glm53_flash.experiments.config import (
    RerunnableStudyConfig, allow_dirty_option, ledger_option, open_sealed_option, parse_count_or_all, parse_name_list,
    parse_seed_range, reopen_option,
)
from glm53_flash.experiments.reruns import (LEVELS, RERUN_MARGIN, check_same_design, points,
                                             spread_cells, studies_compared)
from glm53_flash.experiments.runner import unit_openings
from glm53_flash.experiments.study import DeckEntry, MakeTarget, Study, after_holm_sentence
from glm53_flash.model.config import PRESETS
from glm53_flash.tasks import compositions
from glm53_flash.train.config import RLConfig

STUDY = "rl-generalisation"
DEV_SPLIT = compositions.DEV_SPLIT
SEALED_SPLITS = compositions.SEALED
SHORT_NAMES = {compositions.UNSEEN_SPLIT: "unseen", compositions.NEW_CONSTANTS_SPLIT: "new-constants"}
REWARDS = ("three", "strong")  # the reward cases of RL: the original's three, or the whole strong set
DEFAULT_SEEDS = (1, 2, 3, 4, 5)
DEFAULT_RL_SEEDS = (31415, 27182)
EVAL_SEED = 2026  # recorded only: greedy decoding draws no random numbers
MAX_NEW_TOKENS = compositions.MAX_NEW_TOKENS
SELECTION_RULE = ("on dev (the study's dev tasks), the checkpoint with the most tasks solved, then the most tests "
                  "passed; ties to the earlier checkpoint (pretraining: every checkpoint after step 0; RL: every "
                  "checkpoint of the run)")
# The pretraining recipe's defaults: the `study` preset's budget, chosen on dev by the suite's rule (the
# earliest checkpoint whose dev pass rate lies between 20% and 80% for both kinds of task; the pilot in
# results/study-budget/, docs/STUDIES.md), with the two checkpoints before it to select among.
PRETRAIN_DEFAULTS = {"preset": "study", "steps": 2500, "checkpoints": (1500, 2000, 2500), "learning_rate": 2e-3,
                     "warmup": 100, "batch_size": 32}
# The RL recipe every run starts from: the headline's (the original's) group size, temperature, binary
# reward and trained scope (the last block and the head); the learning rate and the number of groups
# chosen on dev for the study model (results/study-budget/: 5e-5 barely moved dev, 2e-4 did, training
# every parameter at 2e-4 lowered it). An arm changes its switches, a run its seed, reward cases and paths.
RL_RECIPE = RLConfig(initial_checkpoint="", output="", tasks="compositions", groups=128, checkpoints=(32, 64, 96, 128),
                     group_size=16, temperature=SAMPLING_TEMPERATURE, learning_rate=2e-4,
                     train_scope="last-block-head", reward_mode="binary", prompts_per_update=1, verifier_workers=1,
                     quiet=True)
RL_RECORDED = ("tasks", "groups", "checkpoints", "group_size", "temperature", "learning_rate", "train_scope",
               "reward_mode", "invalid_penalty", "exact_bonus", "max_new_tokens", "stop", "prompts_per_update",
               "kl_coef", "warmup", "grad_clip")


def _arms() -> dict:
    from glm53_flash.experiments.reproduce import ARMS

    return ARMS


def task_subset(split: str, count: int | None) -> list[str]:
    """The ids of `count` tasks of `split` (all when None): the first by sha256 of the id, so a subset is
    fixed, spread over the whole split, and needs no opening of a sealed split to name."""
    from glm53_flash.tasks import split_task_ids

    ids = split_task_ids(split)
    if count is None or count >= len(ids):
        return ids
    if count < 1:
        raise ValueError(f"a task count must be >= 1, got {count}")
    chosen = set(sorted(ids, key=lambda i: hashlib.sha256(i.encode()).hexdigest())[:count])
    return [i for i in ids if i in chosen]


def _ids_sha256(ids: list[str]) -> str:
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()


def rl_record(recipe: RLConfig) -> dict:
    record = {name: getattr(recipe, name) for name in RL_RECORDED}
    record["checkpoints"] = list(record["checkpoints"])
    return record


def build_plan(*, arms, seeds, rl_seeds, rewards, pretrain: dict, rl: RLConfig, dev_tasks: int | None,
               sealed_tasks: int | None, precision: str, workers: int, speed: dict | None) -> dict:
    """The study's plan: its design (hashed), units, analysis and power, stated before anything runs,
    and the time it is expected to take on this machine (`speed`: measure_speed's, None for a draft)."""
    from glm53_flash.evaluation.headline_stats import HEADLINE_ANALYSIS, level_power
    from glm53_flash.tasks.compositions import structure_groups

    known = _arms()
    arms, seeds, rl_seeds, rewards = list(arms), list(seeds), list(rl_seeds), list(rewards)
    for arm in arms:
        if arm not in known:
            raise ValueError(f"unknown arm {arm!r}; allowed: {', '.join(known)}")
    for reward in rewards:
        if reward not in REWARDS:
            raise ValueError(f"unknown reward {reward!r}; allowed: {', '.join(REWARDS)}")
    for name, values in (("arms", arms), ("seeds", seeds), ("RL seeds", rl_seeds), ("rewards", rewards)):
        if not values or len(set(values)) != len(values):
            raise ValueError(f"{name} must be given, without repeats")
    steps = pretrain["steps"]
    checkpoints = sorted(set(pretrain["checkpoints"]) | {steps})
    if steps < 1 or any(c < 1 or c > steps for c in checkpoints):
        raise ValueError(f"pretraining checkpoints must lie in 1..{steps}, got {checkpoints}")
    rl.validate()
    dev_ids = task_subset(DEV_SPLIT, dev_tasks)
    sealed_ids = {split: task_subset(split, sealed_tasks) for split in SEALED_SPLITS}
    units = [{"key": f"pretrain-{arm}-seed-{seed}", "phase": "pretrain", "arm": arm, "seed": seed}
             for seed in seeds for arm in arms]
    units += [{"key": f"rl-{arm}-seed-{seed}-{reward}-{rl_seed}", "phase": "rl", "arm": arm, "seed": seed,
               "reward": reward, "rl_seed": rl_seed}
              for seed in seeds for arm in arms for reward in rewards for rl_seed in rl_seeds]
    units += [{"key": f"sealed-{SHORT_NAMES[split]}-{arm}-seed-{seed}", "phase": "sealed", "arm": arm, "seed": seed,
               "split": split} for split in SEALED_SPLITS for seed in seeds for arm in arms]
    analysis = HEADLINE_ANALYSIS
    power = {f"RL gain on {split}": {"test": "before vs after RL (the mean over RL seeds), units and pretraining "
                                             "seeds together", "unit": "structure groups",
                                     **level_power(len(set(structure_groups(ids).values())), len(seeds), analysis)}
             for split, ids in sealed_ids.items()}
    runs = len(arms) * len(seeds)
    rl_runs = runs * len(rewards) * len(rl_seeds)
    selections = len(checkpoints) * runs + len(set(rl.checkpoints) | {0, rl.groups}) * rl_runs  # RL's step 0 too
    evaluated = selections * len(dev_ids) + runs * (1 + len(rewards) * len(rl_seeds)) * sum(
        len(ids) for ids in sealed_ids.values())
    estimate = {"workers": workers, "pretraining_steps": runs * steps, "rollouts": rl_runs * rl.groups * rl.group_size,
                "evaluated_tasks": evaluated, **(speed or {})}
    if speed:
        seconds = (estimate["pretraining_steps"] * speed["seconds_per_step"]
                   + estimate["rollouts"] * speed["seconds_per_rollout"]
                   + evaluated * speed["seconds_per_eval_task"])
        estimate["expected_minutes"] = round(seconds / max(1, min(workers, runs)) / 60, 1)
    else:
        estimate["expected_minutes"] = None
    return {
        "study": STUDY,
        "design": {
            "suite": compositions.SUITE, "suite_version": compositions.VERSION, "arms": arms,
            "arm_switches": {arm: known[arm] for arm in arms}, "seeds": seeds, "rl_seeds": rl_seeds,
            "rewards": rewards,
            "pretrain": {**{k: v for k, v in pretrain.items() if k != "checkpoints"}, "checkpoints": checkpoints,
                         "tasks": compositions.SUITE, "sequence_length": compositions.SEQUENCE_LENGTH},
            "rl": rl_record(rl), "precision": precision,
            "dev_split": DEV_SPLIT, "dev_tasks": len(dev_ids), "dev_task_ids_sha256": _ids_sha256(dev_ids),
            "sealed_splits": list(SEALED_SPLITS), "sealed_tasks": {s: len(ids) for s, ids in sealed_ids.items()},
            "sealed_task_ids_sha256": {s: _ids_sha256(ids) for s, ids in sealed_ids.items()},
            "subset_sizes": {"dev": dev_tasks, "sealed": sealed_tasks},
            "evaluation": f"greedy pass@1, at most {MAX_NEW_TOKENS} new tokens, each program judged on its three "
                          "cases and on its strong set",
            "selection": SELECTION_RULE,
        },
        "units": units,
        "analysis": {
            "effect": "per arm, reward and sealed split: after RL (the selected checkpoint, averaged over RL seeds) "
                      "minus before RL (the selected pretraining checkpoint), per behaviour and pretraining seed",
            "test": "stats.two_level_comparison: exact sign-flip and bootstrap CI over behaviours, t-test and "
                    "interval over pretraining seeds; a direction needs both levels at alpha",
            "reward_hacking": "false passes (pass the three cases, fail the strong set) per pass, on the sealed "
                              "evaluations and in training",
            "settings": analysis.to_dict(),
        },
        # stated before the first run, outside the hashed design (as the estimate)
        "power": power,
        "estimate": estimate,
    }


def power_lines(plan: dict) -> list[str]:
    def points(value):
        return "none" if value is None else f"{100 * value:.1f} points"

    settings = plan["analysis"]["settings"]
    lines = [f"power at alpha {settings['alpha']} and {settings['power']:.0%} (assumed sd: units "
             f"{settings['unit_sd']}, seeds {settings['seed_sd']}, the headline's; this study measures its own):"]
    for name, q in plan["power"].items():
        unit = q.get("unit", "behaviours")  # a plan stated before the unit was the structure group counted these
        lines.append(f"- {name}: {q['units']} {unit}, {q['seeds']} pretraining seeds; smallest detectable "
                     f"difference {points(q['mdd_units'])} over {unit}, {points(q['mdd_seeds'])} over seeds "
                     f"(effect of interest {points(q['effect_of_interest'])}) -> "
                     f"{'can' if q['detectable'] else 'cannot'} detect it")
    return lines


# --------------------------------------------------------------------------- the units


def _tasks(split: str, ids: list[str] | None = None, opening=None) -> list:
    """The split's tasks (those of `ids` when given); a sealed split's after its opening's line is written."""
    from glm53_flash.tasks import split_tasks

    if opening is not None:
        opening.activate()
    tasks = split_tasks(split, opening=opening)
    if ids is None:
        return tasks
    wanted = set(ids)
    return [task for task in tasks if task.task_id in wanted]


def _design_ids(design: dict, split: str) -> list[str]:
    sizes = design["subset_sizes"]
    ids = task_subset(split, sizes["dev"] if split == DEV_SPLIT else sizes["sealed"])
    expected = design["dev_task_ids_sha256"] if split == DEV_SPLIT else design["sealed_task_ids_sha256"][split]
    if _ids_sha256(ids) != expected:
        raise ValueError(f"the tasks of {split} differ from the plan's (suite changed?); start a new study")
    return ids


def _evaluate(model, tasks: list, design: dict, verifier, opening=None) -> dict:
    """Greedy pass@1 of `model` on `tasks`: the summary, by kind, and each task's two verdicts."""
    from glm53_flash.evaluation.evaluate import evaluate_greedy

    receipt = evaluate_greedy(model, tasks, max_new_tokens=MAX_NEW_TOKENS, seed=EVAL_SEED, verifier=verifier,
                              opening=opening, precision=design["precision"])
    outcomes = {e["task_id"]: [bool(e["evaluation"]["passed"]), bool(e["strong_passed"])] for e in receipt["episodes"]}
    return {"summary": receipt["summary"], "by_kind": receipt["by_kind"], "outcomes": outcomes,
            "completions": {e["task_id"]: e["generated_completion"] for e in receipt["episodes"]},
            "seconds": receipt["elapsed_seconds"]}


def _select(run_dir: Path, design: dict, device: str, skip_step_zero: bool) -> dict:
    """Every checkpoint of a run evaluated on the study's dev tasks, and the one the rule selects."""
    from glm53_flash.model.lm import load_pretrained
    from glm53_flash.train.checkpoint import list_checkpoints
    from glm53_flash.train.select import best_entry, selection_score
    from glm53_flash.verifier import Verifier

    tasks = _tasks(DEV_SPLIT, _design_ids(design, DEV_SPLIT))
    entries, results = [], {}
    with Verifier(workers=1) as verifier:
        for step, path in list_checkpoints(run_dir):
            if skip_step_zero and step == 0:
                continue
            model, meta = load_pretrained(path, device)
            result = _evaluate(model, tasks, design, verifier)
            score = list(selection_score(result, sampled=False))
            entries.append({"step": step, "checkpoint": str(path), "weights_sha256": meta["weights_sha256"],
                            "score": score, "pass_at_1": result["summary"]["pass_at_1"],
                            "solved_strong": result["summary"]["tasks_solved_strong"], "by_kind": result["by_kind"]})
            results[step] = result
    if not entries:
        raise ValueError(f"{run_dir} holds no checkpoint to select from")
    best = best_entry(entries)
    return {"rule": SELECTION_RULE, "checkpoints": entries, "selected": best,
            "outcomes": results[best["step"]]["outcomes"]}


def run_unit(unit: dict) -> dict:
    """Worker entry point: one pretraining run (and its selection), one RL run (and its selection), or
    one sealed split's evaluation of an (arm, seed)'s selected checkpoints."""
    import torch

    torch.set_num_threads(1)
    started = time.perf_counter()
    phase = unit["phase"]
    result = {"pretrain": _pretrain_unit, "rl": _rl_unit, "sealed": _sealed_unit}[phase](unit)
    return {"phase": phase, "arm": unit["arm"], "seed": unit["seed"], **result,
            "elapsed_seconds": round(time.perf_counter() - started, 3)}


def pretrain_run(design: dict, seed: int, work: Path, device: str, switches: dict) -> dict:
    """One pretraining run of a study's recipe (design["pretrain"], its precision) under `seed` with
    `switches` ({"model_overrides": ..., "pretrain": ...}, as reproduce.ARMS gives them) into `work`,
    resumed where it stopped; returns its receipt."""
    from glm53_flash.train.config import PretrainConfig
    from glm53_flash.train.pretrain import pretrain

    recipe = design["pretrain"]
    return pretrain(PretrainConfig(
        output=str(work), steps=recipe["steps"], checkpoints=tuple(recipe["checkpoints"]),
        batch_size=recipe["batch_size"], sequence_length=recipe["sequence_length"],
        learning_rate=recipe["learning_rate"], warmup=recipe["warmup"], seed=seed, tasks=recipe["tasks"],
        preset=recipe["preset"], model_overrides={**recipe.get("model_overrides", {}), **switches["model_overrides"]},
        precision=design["precision"], device=device, resume=True, quiet=True, **switches["pretrain"]))


def _pretrain_unit(unit: dict) -> dict:
    design, device = unit["design"], unit.get("device", "cpu")
    work = Path(unit["work_dir"])
    receipt = pretrain_run(design, unit["seed"], work, device, _arms()[unit["arm"]])
    curve = receipt["training_curve"]
    training = {"elapsed_seconds": receipt["elapsed_seconds"], "tokens_seen": receipt["tokens_seen"],
                "final_loss": curve[-1]["loss"] if curve else None, "parameters": receipt["parameter_counts"],
                "checkpoints": [{"step": c["step"], "weights_sha256": c["weights_sha256"]}
                                for c in receipt["checkpoints"]]}
    return {"training": training, "selection": _select(work, design, device, skip_step_zero=True)}


def _rl_unit(unit: dict) -> dict:
    from glm53_flash.train.rl_run import train_rl

    design, device = unit["design"], unit.get("device", "cpu")
    switches = _arms()[unit["arm"]]
    recipe = {k: tuple(v) if isinstance(v, list) else v for k, v in design["rl"].items()}
    work = Path(unit["work_dir"])
    _check_weights(unit["initial_checkpoint"], unit.get("initial_checkpoint_sha256"), device)
    config = replace(RLConfig(initial_checkpoint="", output="", **recipe), **switches["rl"],
                     initial_checkpoint=unit["initial_checkpoint"], output=str(work), seed=unit["rl_seed"],
                     reward_cases=unit["reward"], precision=design["precision"], device=device, resume=True, quiet=True,
                     verifier_workers=1)
    receipt = train_rl(config)
    expected = unit.get("initial_checkpoint_sha256")
    if expected is not None and receipt.get("initial_checkpoint_sha256") != expected:
        raise ValueError(f"{unit['key']}: RL started from weights {receipt.get('initial_checkpoint_sha256')}, not the "
                         f"selected {expected}")
    training = {key: receipt.get(key) for key in ("initial_checkpoint_sha256", "schedule_sha256", "updated_groups",
                                                  "exact_training_rollouts", "elapsed_seconds", "reward_hacking",
                                                  "trainable_parameters")}
    # the switches this run had (an arm that sets none has RLConfig's defaults, which the design does not pin)
    effective = {name: getattr(config, name) for name in ("logprob_source", "loss_normalization", "eos_handling")}
    return {"reward": unit["reward"], "rl_seed": unit["rl_seed"], "initial_checkpoint": unit["initial_checkpoint"],
            "switches": effective, "training": training, "selection": _select(work, design, device, skip_step_zero=False)}


def _check_weights(checkpoint: str, expected: str | None, device: str):
    """Load `checkpoint`; when `expected` is given, refuse weights whose sha256 is another (a checkpoint
    replaced since it was selected). Returns (model, metadata)."""
    from glm53_flash.model.lm import load_pretrained

    model, meta = load_pretrained(checkpoint, device)
    if expected is not None and meta["weights_sha256"] != expected:
        raise ValueError(f"{checkpoint} holds weights {meta['weights_sha256'][:12]}, not the selected {expected[:12]}")
    return model, meta


# A sealed receipt holds five evaluations of up to 1,030 tasks: their verdicts as strings of 0/1 in task
# order, and the completions only of the programs that passed (the ones a reward-hacking audit reads),
# so it stays far under the repository's 1 MB per file; past this size the completions are left out.
SEALED_RECEIPT_LIMIT = 900_000


def _bits(values) -> str:
    return "".join("1" if v else "0" for v in values)


def _sealed_unit(unit: dict) -> dict:
    from glm53_flash.verifier import Verifier

    design, device, opening = unit["design"], unit.get("device", "cpu"), unit.get("opening")
    split = unit["split"]
    if opening is None or opening.split != split:
        raise ValueError(f"{unit['key']} evaluates the sealed split {split}: it needs an opening of it")
    tasks = _tasks(split, _design_ids(design, split), opening=opening)
    ids = [task.task_id for task in tasks]
    expected = unit.get("checkpoint_sha256") or {}
    evaluations = {}
    with Verifier(workers=1) as verifier:
        for name, checkpoint in unit["checkpoints"].items():
            model, meta = _check_weights(checkpoint, expected.get(name), device)
            result = _evaluate(model, tasks, design, verifier, opening=opening)
            outcomes = result["outcomes"]
            evaluations[name] = {
                "checkpoint": checkpoint, "weights_sha256": meta["weights_sha256"], "summary": result["summary"],
                "by_kind": result["by_kind"], "seconds": result["seconds"],
                "passed": _bits(outcomes[t][0] for t in ids), "strong_passed": _bits(outcomes[t][1] for t in ids),
                "completions_of_passes": {t: result["completions"][t] for t in ids if outcomes[t][0] or outcomes[t][1]}}
    record = {"split": split, "task_ids": ids, "structures": [task.structure for task in tasks],
              "evaluations": evaluations, "sealed_opening": opening.to_dict()}
    if len(json.dumps(record, indent=2)) > SEALED_RECEIPT_LIMIT:
        for evaluation in evaluations.values():
            evaluation.pop("completions_of_passes")
        record["completions_left_out"] = f"the receipt would exceed {SEALED_RECEIPT_LIMIT} bytes"
    return record


def sealed_outcomes(receipt: dict, name: str) -> dict:
    """task id -> [passed on the three cases, passed on the strong set] of one evaluation of a sealed receipt."""
    evaluation = receipt["evaluations"][name]
    return {t: [p == "1", q == "1"] for t, p, q in zip(receipt["task_ids"], evaluation["passed"],
                                                         evaluation["strong_passed"], strict=True)}


def measure_speed(design_draft: dict, device: str = "cpu") -> dict:
    """Seconds per pretraining step, per RL rollout and per evaluated dev task of the plan's model on this
    machine, one thread (as each worker runs): a few steps of a fresh pretraining run
    (probe_pretraining_step), then from its checkpoint the marginal cost of an RL rollout and of a dev
    task's greedy evaluation (probe_rl_and_evaluation). An untrained model writes every completion to the
    cap, so the last two are upper bounds."""
    import tempfile

    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory(prefix="glm53-generalisation-probe-") as tmp:
            step, checkpoint = probe_pretraining_step(design_draft["pretrain"], design_draft["precision"], device,
                                                      f"{tmp}/pretrain")
            speed = probe_rl_and_evaluation(checkpoint, design_draft["rl"], design_draft["precision"], device)
        return {"seconds_per_step": round(step, 4), **speed}
    finally:
        torch.set_num_threads(before)


def probe_pretraining_step(recipe: dict, precision: str, device: str, output: str, steps: int = 6) -> tuple[float, str]:
    """Seconds per pretraining step of `recipe` in the calling thread's settings, and the probe run's
    checkpoint: the median of the steps after the first, so the first step's one-off costs (building the
    kernels, touching the weights) do not count. (A difference of two runs' totals does not remove them:
    the first run in a process pays them and the second does not.)"""
    from glm53_flash.train.config import PretrainConfig
    from glm53_flash.train.pretrain import pretrain

    receipt = pretrain(PretrainConfig(
        output=output, steps=steps, checkpoints=(steps,), batch_size=recipe["batch_size"],
        sequence_length=recipe["sequence_length"], learning_rate=recipe["learning_rate"], warmup=0,
        tasks=recipe["tasks"], preset=recipe["preset"], model_overrides=recipe.get("model_overrides", {}),
        precision=precision, device=device, quiet=True))
    later = sorted(row["seconds"] for row in receipt["training_curve"][1:])
    return later[len(later) // 2], receipt["checkpoints"][-1]["path"]


def probe_evaluation(model, precision: str) -> float:
    """Seconds per greedy evaluation of a dev task by `model` in the calling thread's settings: after one
    untimed evaluation of two tasks (the verifier's start and the first generation's one-off costs), the
    marginal cost of twelve tasks over four."""
    from glm53_flash.verifier import Verifier

    ids = task_subset(DEV_SPLIT, 12)
    with Verifier(workers=1) as verifier:
        _evaluate(model, _tasks(DEV_SPLIT, ids[:2]), {"precision": precision}, verifier)
        seconds = []
        for tasks in (_tasks(DEV_SPLIT, ids[:4]), _tasks(DEV_SPLIT, ids)):
            started = time.perf_counter()
            _evaluate(model, tasks, {"precision": precision}, verifier)
            seconds.append(time.perf_counter() - started)
    return max(seconds[1] - seconds[0], 0.0) / 8 or seconds[1] / 12


def probe_rl_and_evaluation(checkpoint: str, rl: dict, precision: str, device: str = "cpu") -> dict:
    """Seconds per RL rollout and per greedy evaluation of a dev task from `checkpoint`, in the calling
    thread's settings, as marginal costs: RL with one group and with three groups of `rl`'s size, and
    evaluations of four and of twelve dev tasks (probe_evaluation), each difference divided by what it
    adds, so that loading the model, starting the verifier and writing checkpoints (paid once per run) do
    not count as the rollouts' or the tasks' time."""
    import tempfile

    from glm53_flash.model.lm import load_pretrained
    from glm53_flash.train.rl_run import train_rl

    def rl_seconds(groups: int) -> float:
        with tempfile.TemporaryDirectory(prefix="glm53-rl-probe-") as tmp:
            started = time.perf_counter()
            train_rl(RLConfig(initial_checkpoint=checkpoint, output=f"{tmp}/rl", tasks="compositions", groups=groups,
                              checkpoints=(groups,), group_size=rl["group_size"], temperature=rl["temperature"],
                              train_scope=rl["train_scope"], precision=precision, device=device, verifier_workers=1,
                              quiet=True))
            return time.perf_counter() - started

    rl_seconds(1)  # untimed: the first RL run in a process pays one-off costs the later ones do not
    one, three = rl_seconds(1), rl_seconds(3)
    rollout = max(three - one, 0.0) / (2 * rl["group_size"]) or three / (3 * rl["group_size"])
    model, _ = load_pretrained(checkpoint, device)
    return {"seconds_per_rollout": round(rollout, 4), "seconds_per_eval_task": round(probe_evaluation(model, precision), 4),
            "probe": "marginal costs after an untimed warm-up: RL with 3 groups minus 1 group, evaluation of 12 dev "
                     "tasks minus 4"}


# --------------------------------------------------------------------------- analysis


def _by_unit(receipts: list[dict]) -> dict:
    return {(r["phase"], r["arm"], r["seed"], r.get("reward"), r.get("rl_seed"), r.get("split")): r for r in receipts}


def _rate(outcomes: dict, strong: bool) -> float:
    return sum(v[1 if strong else 0] for v in outcomes.values()) / len(outcomes) if outcomes else 0.0


def _false_pass_share(outcomes_list: list[dict]) -> dict:
    passes = sum(v[0] for outcomes in outcomes_list for v in outcomes.values())
    false = sum(v[0] and not v[1] for outcomes in outcomes_list for v in outcomes.values())
    return {"passes": passes, "false_passes": false, "share": false / passes if passes else None}


def compute(plan: dict, receipts: list[dict]) -> dict:
    """The study's summary from its receipts: per arm, reward and sealed split the RL effect under the
    three-case and the strong verdict, over structure groups and pretraining seeds (`comparison`, the
    primary; each group's tasks read from the suite by their ids), Holm over the rows at each level
    (`holm`, with the verdict after it), and over behaviours as a secondary view (`behaviours`); the same
    on dev (where the checkpoints were selected: optimistic, shown for reference); the false passes; the
    seeds' spread."""
    from glm53_flash.core.stats import detectable_differences, group_means, holm_verdicts, two_level_comparison
    from glm53_flash.tasks.compositions import structure_groups

    design = plan["design"]
    found = _by_unit(receipts)
    alpha = plan["analysis"]["settings"]["alpha"]
    results, dev, hacking, spread = [], [], [], {}
    for arm in design["arms"]:
        for reward in design["rewards"]:
            for split in design["sealed_splits"]:
                seeds = [s for s in design["seeds"] if ("sealed", arm, s, None, None, split) in found]
                if not seeds:
                    continue
                sealed = {s: found[("sealed", arm, s, None, None, split)] for s in seeds}
                for s in seeds:
                    _check_sealed_weights(sealed[s], found, design, arm, s, reward)
                outcomes = {s: {name: sealed_outcomes(sealed[s], name) for name in sealed[s]["evaluations"]}
                            for s in seeds}
                groups = structure_groups(sealed[seeds[0]]["task_ids"])
                row = {"arm": arm, "reward": reward, "split": split, "seeds": seeds,
                       "groups": len(set(groups.values()))}
                for verdict, strong in (("three", False), ("strong", True)):
                    differences, before, after = {}, [], []
                    for s in seeds:
                        base = outcomes[s]["before"]
                        runs = [outcomes[s][f"{reward}-{r}"] for r in design["rl_seeds"]]
                        differences[str(s)] = {t: sum(run[t][strong] for run in runs) / len(runs) - base[t][strong]
                                               for t in base}
                        before.append(_rate(base, strong))
                        after.append(sum(_rate(run, strong) for run in runs) / len(runs))
                    by_group = group_means(differences, groups)
                    row[verdict] = {"before": before, "after": after,
                                    "comparison": two_level_comparison(by_group, alpha=alpha),
                                    "behaviours": two_level_comparison(differences, alpha=alpha),
                                    "differences": by_group}
                row["false_passes"] = {
                    "before": _false_pass_share([outcomes[s]["before"] for s in seeds]),
                    "after": _false_pass_share([outcomes[s][f"{reward}-{r}"] for s in seeds for r in design["rl_seeds"]])}
                results.append(row)
            rl_rows = [r for r in receipts if r["phase"] == "rl" and r["arm"] == arm and r["reward"] == reward]
            if rl_rows:
                hacks = [{k: v for k, v in r["training"]["reward_hacking"].items() if k != "by_group"}
                         for r in rl_rows if r["training"].get("reward_hacking")]
                hacking.append({"arm": arm, "reward": reward, "runs": len(rl_rows), "training": hacks})
                seeds = sorted({r["seed"] for r in rl_rows if ("pretrain", arm, r["seed"], None, None, None) in found})
                complete = [s for s in seeds if all(("rl", arm, s, reward, r, None) in found for r in design["rl_seeds"])]
                if complete:
                    differences = {}
                    for s in complete:
                        base = found[("pretrain", arm, s, None, None, None)]["selection"]["outcomes"]
                        runs = [found[("rl", arm, s, reward, r, None)]["selection"]["outcomes"] for r in design["rl_seeds"]]
                        differences[str(s)] = {t: sum(run[t][0] for run in runs) / len(runs) - base[t][0] for t in base}
                    by_group = group_means(differences, structure_groups(next(iter(differences.values()))))
                    dev.append({"arm": arm, "reward": reward, "seeds": complete,
                                "comparison": two_level_comparison(by_group, alpha=alpha)})
        pretrained = [found[k] for k in found if k[0] == "pretrain" and k[1] == arm]
        if pretrained:
            rates = [r["selection"]["selected"]["pass_at_1"] for r in pretrained]
            mean = sum(rates) / len(rates)
            sd = (sum((x - mean) ** 2 for x in rates) / (len(rates) - 1)) ** 0.5 if len(rates) > 1 else None
            spread[arm] = {"seeds": [r["seed"] for r in pretrained], "dev_pass_at_1": rates, "mean": mean, "sd": sd,
                           "selected_steps": [r["selection"]["selected"]["step"] for r in pretrained]}
    for verdict in ("three", "strong"):  # the study's family: its rows under one verdict, Holm at each level
        for row, adjusted in zip(results, holm_verdicts([row[verdict]["comparison"] for row in results], alpha)):
            row[verdict]["holm"] = adjusted
            # what each level could have shown at Holm's first step (alpha / rows), from the spread it measured
            row[verdict]["detectable"] = detectable_differences(row[verdict].pop("differences"), alpha / len(results))
    return {"study": STUDY, "runs": len(receipts), "sealed": results, "dev": dev, "reward_hacking": hacking,
            "pretraining_on_dev": spread}


def _check_sealed_weights(receipt: dict, found: dict, design: dict, arm: str, seed: int, reward: str) -> None:
    """Every checkpoint a sealed receipt evaluated must be the one its selection chose (the weights' sha256
    in the selection receipts), or the analysis refuses it."""
    expected = {"before": ("pretrain", arm, seed, None, None, None)}
    expected |= {f"{reward}-{r}": ("rl", arm, seed, reward, r, None) for r in design["rl_seeds"]}
    for name, key in expected.items():
        if key not in found:
            raise ValueError(f"a sealed receipt of {arm} seed {seed} has no selection receipt for {name}")
        chosen = found[key]["selection"]["selected"]["weights_sha256"]
        evaluated = receipt["evaluations"][name]["weights_sha256"]
        if evaluated != chosen:
            raise ValueError(f"the sealed evaluation of {arm} seed {seed}, {name}, evaluated weights {evaluated[:12]}, "
                             f"not the selected {chosen[:12]}")


VERBS = {"better": "RL raises it", "worse": "RL lowers it", "not shown": "not shown"}


def _interval(values) -> str:
    return "n/a" if values is None else f"[{points(values[0])}, {points(values[1])}]"


def answers(plan: dict, summary: dict) -> list[str]:
    """One line per (arm, reward, sealed split), under the strong verdict: RL's effect over structure groups
    and pretraining seeds with its result after Holm over the rows at both levels, the per-comparison p
    beside it, the behaviours as a secondary view, and for a row not shown what its seeds could detect."""
    from glm53_flash.experiments.study import after_holm

    lines = []
    for row in summary["sealed"]:
        result = row["strong"]
        c, holm, behaviours = result["comparison"], result["holm"], result["behaviours"]
        seeds = c["seeds"]
        lines.append(
            f"{row['arm']}, {row['reward']}-case reward, {SHORT_NAMES.get(row['split'], row['split'])}: after minus "
            f"before RL on the strong pass rate, over {c['units']['n']} structure groups (each the mean of its "
            f"behaviours) and {seeds['n']} pretraining seeds, {points(c['mean_difference'])} points: "
            f"{after_holm(VERBS[holm['verdict']], holm['comparisons'], 'groups and seeds')} (Holm p groups "
            f"{holm['units']:.3g}, seeds {holm['seeds']:.3g}; per comparison groups p {c['units']['sign_flip_p']:.3g}, "
            f"CI {points(c['units']['interval'][0])} to {points(c['units']['interval'][1])}; seeds "
            + ("p n/a" if seeds["t_test_p"] is None else
               f"p {seeds['t_test_p']:.3g}, CI {points(seeds['interval'][0])} to {points(seeds['interval'][1])}")
            + f"). Over behaviours, a secondary view: {points(behaviours['mean_difference'])} points (p "
            f"{behaviours['units']['sign_flip_p']:.3g})" + _detectable_note(result) + ".")
    return lines


def _detectable_note(verdict: dict) -> str:
    """For a row not shown after Holm, the difference its seeds could have shown (80% power, their measured
    spread, at Holm's first step); empty otherwise."""
    seeds = (verdict.get("detectable") or {}).get("seeds")
    if verdict["holm"]["verdict"] != "not shown" or seeds is None:
        return ""
    return f"; with this spread its seeds detect {100 * seeds:.1f} points at Holm's first step"


def headline_table(summary: dict) -> dict:
    """The README's and the deck's table: per arm, reward and sealed split, the strong pass rate before and
    after RL, RL's effect over structure groups and over seeds, Holm's p at each level and the result after
    it, and the effect over behaviours as a secondary view."""
    columns = ["arm", "reward", "sealed split", "strong pass@1 before", "after RL", "effect over groups (points, CI)",
               "over seeds (CI)", "Holm p (groups / seeds)", "groups / seeds", "result after Holm",
               "behaviours (secondary: points, CI)"]
    rows = []
    for row in summary["sealed"]:
        values = row["strong"]
        c, holm, behaviours = values["comparison"], values["holm"], values["behaviours"]
        rows.append([row["arm"], row["reward"], SHORT_NAMES.get(row["split"], row["split"]),
                     f"{100 * sum(values['before']) / len(values['before']):.1f}%",
                     f"{100 * sum(values['after']) / len(values['after']):.1f}%",
                     f"{points(c['mean_difference'])} {_interval(c['units']['interval'])}",
                     _interval(c["seeds"]["interval"]), f"{holm['units']:.3g} / {holm['seeds']:.3g}",
                     f"{c['units']['n']} / {c['seeds']['n']}", holm["verdict"],
                     f"{points(behaviours['mean_difference'])} {_interval(behaviours['units']['interval'])}"])
    return {"columns": columns, "rows": rows}


def report_lines(plan: dict, summary: dict) -> list[str]:
    design = plan["design"]
    lines = [f"# {STUDY}: does RL on the compositions suite carry over?", "",
             f"Arms {', '.join(design['arms'])}; pretraining seeds {', '.join(map(str, design['seeds']))}; RL seeds "
             f"{', '.join(map(str, design['rl_seeds']))}; rewards {', '.join(design['rewards'])}; the "
             f"{design['pretrain']['preset']} preset, {design['pretrain']['steps']} pretraining steps; RL "
             f"{design['rl']['groups']} groups x {design['rl']['group_size']}; precision {design['precision']}.", "",
             "## Power, stated before the runs", "", *power_lines(plan), "",
             "## The sealed splits (each opened once per (arm, seed), after every selection)", "",
             "| arm | reward | split | verdict | before | after | effect, groups | effect, seeds | per comparison | "
             "Holm p (groups / seeds) | result after Holm | behaviours (secondary) | false passes before / after |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def mean(values):
        return sum(values) / len(values)

    def share(entry):
        return "n/a" if entry["share"] is None else f"{100 * entry['share']:.1f}%"

    for row in summary["sealed"]:
        for verdict in ("three", "strong"):
            c, holm, behaviours = row[verdict]["comparison"], row[verdict]["holm"], row[verdict]["behaviours"]
            units, seeds = c["units"], c["seeds"]
            seed_text = "n/a" if seeds["interval"] is None else \
                f"{points(seeds['mean'])} {_interval(seeds['interval'])} p {seeds['t_test_p']:.3g}"
            fp = row["false_passes"]
            lines.append(f"| {row['arm']} | {row['reward']} | {SHORT_NAMES.get(row['split'], row['split'])} | {verdict} | "
                         f"{100 * mean(row[verdict]['before']):.1f}% | {100 * mean(row[verdict]['after']):.1f}% | "
                         f"{points(units['mean'])} {_interval(units['interval'])} p {units['sign_flip_p']:.3g} "
                         f"({units['n']}) | {seed_text} | {c['verdict']} | {holm['units']:.3g} / {holm['seeds']:.3g} | "
                         f"{holm['verdict']} | {points(behaviours['mean_difference'])} "
                         f"{_interval(behaviours['units']['interval'])} p {behaviours['units']['sign_flip_p']:.3g} "
                         f"({behaviours['units']['n']}) | "
                         + (f"{share(fp['before'])} / {share(fp['after'])}" if verdict == "three" else "") + " |")
    lines += ["", "Effects are points of greedy pass@1 under the row's verdict (after minus before; brackets: 95% "
                  "intervals). The unit is the structure group (each group the mean of its behaviours, their number "
                  "in brackets): behaviours of one group are correlated. `result after Holm` is `better`/`worse` only "
                  "when groups and seeds both show it at alpha after Holm over the comparisons of the verdict, at "
                  "each level; `per comparison` is the same rule without the correction, which claims nothing. The "
                  "behaviours (each its own unit) are a secondary view. False passes: passes of the three cases "
                  "that fail the strong set, per pass.", "",
              "## On dev (where every checkpoint was selected: optimistic)", "",
              "| arm | reward | seeds | effect over groups (three cases) | per comparison |", "|---|---|---|---|---|"]
    for row in summary["dev"]:
        c = row["comparison"]
        lines.append(f"| {row['arm']} | {row['reward']} | {len(row['seeds'])} | {100 * c['mean_difference']:+.1f} | "
                     f"{c['verdict']} |")
    lines += ["", "## Pretraining: the selected checkpoints on dev", "",
              "| arm | seeds | dev pass@1 | mean | sd over seeds | selected steps |", "|---|---|---|---|---|---|"]
    for arm, row in summary["pretraining_on_dev"].items():
        lines.append(f"| {arm} | {', '.join(map(str, row['seeds']))} | "
                     f"{', '.join(f'{100 * r:.1f}%' for r in row['dev_pass_at_1'])} | {100 * row['mean']:.1f}% | "
                     + ("n/a" if row["sd"] is None else f"{100 * row['sd']:.1f} points") + " | "
                     f"{', '.join(map(str, row['selected_steps']))} |")
    lines += ["", "## Reward hacking in training", "", "With the strong set as the reward a pass is judged on that set, so "
              "its count is 0 by construction; the three-case reward's count is the measurement.", "",
              "| arm | reward | runs | passes that fail the strong set |", "|---|---|---|---|"]
    for row in summary["reward_hacking"]:
        passes = sum(h["rollouts_passing_reward_cases"] for h in row["training"])
        hacks = sum(h["failing_strong_set"] for h in row["training"])
        lines.append(f"| {row['arm']} | {row['reward']} | {row['runs']} | {hacks} of {passes} |")
    return lines + [""]


def analyze(out: Path, plan: dict, receipts: list[dict]) -> tuple[dict, list[str], dict]:
    from glm53_flash.report import study_charts

    summary = compute(plan, receipts)
    summary["answers"] = answers(plan, summary)
    summary["headline_table"] = headline_table(summary)
    lines = report_lines(plan, summary)
    charts = study_charts.insert_effects_chart(
        out, lines, study_charts.draw_rl_generalisation(summary),
        "## The sealed splits (each opened once per (arm, seed), after every selection)",
        "RL's effect per arm, reward and sealed split")
    return summary, lines, charts


# --------------------------------------------------------------------------- the rerun


def _rerun_direction(result: dict, level: str, alpha: float) -> str:
    """'+', '-' or '0': a row's direction at `level` (units: structure groups; seeds) when its p after the
    study's Holm correction over its rows is below alpha."""
    if result["holm"][level] >= alpha:
        return "0"
    mean = result["comparison"][level]["mean"]
    return "+" if mean > 0 else "-" if mean < 0 else "0"


def check_rerun_design(first: dict, rerun: dict) -> None:
    check_same_design(first, rerun, STUDY, ("seeds",), "their pretraining seeds", True)


def compare_rerun(first_plan: dict, first_receipts: list[dict], rerun_plan: dict, rerun_receipts: list[dict],
                  margin: float = RERUN_MARGIN) -> dict:
    """Per (arm, reward, sealed split) under the strong verdict: each study's result after its Holm
    correction (over structure groups and seeds), whether it holds, the rerun spread with its equivalence
    test, and both studies analysed as one."""
    from glm53_flash.core.stats import welch_comparison

    check_rerun_design(first_plan, rerun_plan)
    alpha = first_plan["analysis"]["settings"]["alpha"]
    first, rerun = compute(first_plan, first_receipts), compute(rerun_plan, rerun_receipts)
    seeds = first_plan["design"]["seeds"] + rerun_plan["design"]["seeds"]
    pooled_plan = {**first_plan, "design": {**first_plan["design"], "seeds": seeds}}
    pooled = compute(pooled_plan, first_receipts + rerun_receipts)

    def keyed(summary):
        return {(r["arm"], r["reward"], r["split"]): r for r in summary["sealed"]}

    first_rows, rerun_rows, pooled_rows = keyed(first), keyed(rerun), keyed(pooled)
    rows = []
    for key, a in first_rows.items():
        if key not in rerun_rows:
            continue
        ra, rb = a["strong"], rerun_rows[key]["strong"]
        ca, cb = ra["comparison"], rb["comparison"]
        directions = {level: [_rerun_direction(ra, level, alpha), _rerun_direction(rb, level, alpha)] for level in LEVELS}
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
    return {**studies_compared(first_plan, rerun_plan, "seeds"),
            "alpha": alpha, "margin": margin, "verdict": "strong", "rows": rows,
            "all_hold": bool(rows) and all(r["holds"] for r in rows),
            "rule": "a row holds when both studies give the same result and the same direction (or none) at alpha "
                    "after their Holm correction over the rows, at the structure groups and at the seeds; it "
                    "reproduces its size when Welch's 90% interval of the rerun's seed-level effect minus the "
                    "first's lies within +- the margin (two one-sided tests)"}


def rerun_report_lines(comparison: dict, first_name: str) -> list[str]:
    """REPORT.md's section: the table of each row in both studies and together."""
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
            f"| {row['arm']} | {row['reward']} | {SHORT_NAMES.get(row['split'], row['split'])} | "
            f"{points(row['first']['mean_difference'])} {row['first']['verdict']} | "
            f"{points(row['rerun']['mean_difference'])} {row['rerun']['verdict']} | "
            f"{'yes' if row['holds'] else 'NO'} ({'/'.join(d['units'])}, {'/'.join(d['seeds'])}) | "
            + spread_cells(spread) + f" | {points(both['mean_difference'])}, seeds CI "
            + ("n/a" if seeds_ci is None else f"[{points(seeds_ci[0])}, {points(seeds_ci[1])}]")
            + f" ({len(row['pooled']['seeds'])} seeds) | {row['pooled']['holm']['verdict']} | "
            + ("n/a" if not row["pooled"]["holm"] else
               f"{row['pooled']['holm']['units']:.3g} / {row['pooled']['holm']['seeds']:.3g}") + " |")
    lines += ["", "`holds` lists each level's direction after Holm in the first study / the rerun (`+` RL raises the "
                  "strong pass rate at alpha, `-` lowers it, `0` not shown); effects are over structure groups. `both "
                  "together` is one analysis over both studies' seeds, a secondary view neither plan made alone; its "
                  "result is after Holm over the rows at both levels.", ""]
    return lines


# --------------------------------------------------------------------------- the study's declaration


_PRETRAIN = PRETRAIN_DEFAULTS
_RL = RL_RECIPE


@dataclass(kw_only=True)
class GeneralisationStudyConfig(RerunnableStudyConfig):
    """Every knob of `glm53 experiment rl-generalisation`; the design in plan.json comes from these."""

    arms: tuple[str, ...] = option(("faithful", "ours"), parse=parse_name_list,
                                   help="comma-separated arms (reproduce's: faithful, ours)", default_text="faithful,ours")
    seeds: tuple[int, ...] = option(DEFAULT_SEEDS, parse=parse_seed_range,
                                    help="pretraining seeds: comma-separated or START:COUNT:STEP",
                                    default_text="1,2,3,4,5")
    rl_seeds: tuple[int, ...] = option(DEFAULT_RL_SEEDS, parse=parse_seed_range,
                                       help="RL seeds of every pretraining seed", default_text="31415,27182")
    rewards: tuple[str, ...] = option(REWARDS, parse=parse_name_list,
                                      help="RL reward cases, each its own runs: three (the original's), strong",
                                      default_text="three,strong")
    preset: str = option(_PRETRAIN["preset"], choices=tuple(sorted(PRESETS)), help="model preset")
    steps: int = option(_PRETRAIN["steps"], help="pretraining steps per run")
    checkpoints: tuple[int, ...] = option(_PRETRAIN["checkpoints"], parse=comma_ints,
                                          help="pretraining checkpoints selected among on dev (the last step always)")
    learning_rate: float = option(_PRETRAIN["learning_rate"], help="pretraining peak learning rate (constant after warmup)")
    warmup: int = option(_PRETRAIN["warmup"], help="pretraining warmup steps")
    batch_size: int = option(_PRETRAIN["batch_size"], help="pretraining sequences per step (192 tokens each)")
    groups: int = option(_RL.groups, help="RL prompts per run (one group each)")
    group_size: int = option(_RL.group_size, help="RL samples per prompt")
    rl_checkpoints: tuple[int, ...] = option(_RL.checkpoints, parse=comma_ints,
                                             help="RL checkpoints selected among on dev (the last group always)")
    rl_learning_rate: float = option(_RL.learning_rate, help="RL learning rate")
    dev_tasks: int | None = option(None, parse=parse_count_or_all, metavar="N|all",
                                   help="dev tasks every selection evaluates (a fixed subset by hash)",
                                   default_text="all 621")
    sealed_tasks: int | None = option(None, parse=parse_count_or_all, metavar="N|all",
                                      help="tasks of each sealed split evaluated (a fixed subset by hash)",
                                      default_text="all: 1,030 unseen compositions, 478 new constants")
    precision: str = option("auto", choices=PRECISIONS, help=PRECISION_HELP + "; part of the design")
    open_sealed: str | None = open_sealed_option("the sealed splits' evaluations run: say why they are opened "
                                                 "(recorded in the ledger, once per arm and seed)",
                                                 "none: the study stops before its sealed evaluations")
    reopen: str | None = reopen_option("open a sealed split again for an (arm, seed) that already opened it")
    allow_dirty: bool = allow_dirty_option()
    ledger: str | None = ledger_option()

    def __post_init__(self) -> None:
        self.arms, self.seeds, self.rl_seeds = tuple(self.arms), tuple(self.seeds), tuple(self.rl_seeds)
        self.rewards, self.checkpoints, self.rl_checkpoints = (tuple(self.rewards), tuple(self.checkpoints),
                                                              tuple(self.rl_checkpoints))

    def pretrain_recipe(self) -> dict:
        return {"preset": self.preset, "steps": self.steps, "checkpoints": self.checkpoints,
                "learning_rate": self.learning_rate, "warmup": self.warmup, "batch_size": self.batch_size}

    def rl_recipe(self):
        from dataclasses import replace

        return replace(_RL, groups=self.groups, group_size=self.group_size,
                       checkpoints=tuple(c for c in self.rl_checkpoints if c <= self.groups),
                       learning_rate=self.rl_learning_rate)


def deck_figures(slide_id: str, summary: dict, directory: Path) -> tuple[list, bool]:
    from glm53_flash.report import study_charts

    return [(study_charts.draw_rl_generalisation(summary, size=(12, 5.4)), f"{slide_id.removeprefix('research-')}-effects",
             "RL's effect on the strong pass rate per arm, reward and sealed split, with each seed")], False


# What `make` runs of this study (the Makefile's generated block; recipe lines indented by four spaces a tab).
MAKE_TARGETS = (
    MakeTarget("study-generalisation", r"""
STUDY_PURPOSE ?= make study-generalisation: the study's sealed evaluations, after every selection on dev
study-generalisation: $(STAMP)
    $(BIN)/glm53 experiment rl-generalisation --output runs/study-generalisation --precision $(STUDY_PRECISION) \
        --open-sealed "$(STUDY_PURPOSE)"
"""),
    MakeTarget("study-generalisation-rerun", r"""
study-generalisation-rerun: $(STAMP)
    $(BIN)/glm53 experiment rl-generalisation --output runs/study-generalisation-rerun --seeds 6,7,8,9,10 \
        --precision $(STUDY_PRECISION) --rerun-of results/rl-generalisation \
        --open-sealed "$(STUDY_PURPOSE) (the rerun on disjoint pretraining seeds)"
"""),
)


class Generalisation(Study):
    name = STUDY
    config = GeneralisationStudyConfig
    help = "does RL on the compositions suite generalise: arms x pretraining seeds x RL seeds x rewards, two sealed splits"
    description = ("For each arm (faithful, ours) and pretraining seed: pretrain on the compositions suite, select on "
                   "dev, RL on compositions.rl for every RL seed with the three-case and the strong reward (each run "
                   "selected on dev), then open the two sealed splits (unseen compositions, new constants) once per "
                   "arm and seed. Units run in parallel (--workers, one thread each); the plan states its power and "
                   "its time on this machine before the first run. Resumable. Analyse with `glm53 analyze DIR`.")
    deck = (DeckEntry("research-rl-generalisation", "Research study: does RL generalise?", "make study-generalisation",
                      "rl-generalisation/summary.json", deck_figures),
            DeckEntry("research-rl-generalisation-rerun", "Research study: does RL generalise? The rerun",
                      "make study-generalisation-rerun", "rl-generalisation-rerun/summary.json", deck_figures))
    make_targets = MAKE_TARGETS
    rerunnable = True

    def plan(self, cfg: GeneralisationStudyConfig, speed: dict | None) -> dict:
        from glm53_flash.core.runtime import resolve_device
        from glm53_flash.model.precision import resolve_precision

        return build_plan(arms=cfg.arms, seeds=cfg.seeds, rl_seeds=cfg.rl_seeds, rewards=cfg.rewards,
                          pretrain=cfg.pretrain_recipe(), rl=cfg.rl_recipe(), dev_tasks=cfg.dev_tasks,
                          sealed_tasks=cfg.sealed_tasks,
                          precision=resolve_precision(cfg.precision, str(resolve_device(cfg.device))).name,
                          workers=cfg.workers, speed=speed)

    def speed(self, cfg: GeneralisationStudyConfig, draft: dict) -> dict:
        from glm53_flash.core.runtime import resolve_device

        print(f"{STUDY}: timing this machine (a few pretraining steps, RL with one and with three groups, 4 and 12 "
              "dev tasks; one thread, as each worker runs)", file=sys.stderr)
        return measure_speed(draft["design"], str(resolve_device(cfg.device)))

    def power_lines(self, plan: dict) -> list[str]:
        return power_lines(plan)

    @contextlib.contextmanager
    def sealed_openings(self, cfg: GeneralisationStudyConfig, out: Path, draft: dict):
        # Every pending sealed evaluation's opening is granted here, before the study directory is touched: a
        # refused one (a second opening without --reopen) costs no training. Without --open-sealed the study
        # runs up to its sealed evaluations and stops there.
        openings = {} if cfg.plan_only else unit_openings(cfg, out, draft)
        try:
            yield openings
        finally:
            for opening in openings.values():
                opening.close()  # a later run (in this process too) asks the ledger again

    def run(self, session) -> int:
        """One pretraining seed at a time (so a study stopped early has whole seeds to analyse): that seed's
        pretraining runs (each then selected on dev), its RL runs from each selected checkpoint (each selected
        on dev), then its sealed evaluations, each under its opening, once all its runs are done."""
        plan, work, openings = session.plan, session.work_dir(), session.openings
        ran = 0
        for seed in plan["design"]["seeds"]:
            units = [u for u in plan["units"] if u["seed"] == seed]

            def done() -> dict:
                return {r["unit"]["key"]: r for r in session.receipts()}

            ran += session.run([u | {"work_dir": str(work / u["key"])} for u in units if u["phase"] == "pretrain"],
                               run_unit)
            receipts = done()
            rl = []
            for unit in units:
                start = receipts.get(f"pretrain-{unit['arm']}-seed-{seed}") if unit["phase"] == "rl" else None
                if start is not None:
                    selected = start["selection"]["selected"]
                    rl.append(unit | {"work_dir": str(work / unit["key"]), "initial_checkpoint": selected["checkpoint"],
                                      "initial_checkpoint_sha256": selected["weights_sha256"]})
            ran += session.run(rl, run_unit)
            receipts = done()
            sealed = []
            for unit in (u for u in units if u["phase"] == "sealed" and u["key"] not in receipts):
                arm = unit["arm"]
                runs = {"before": f"pretrain-{arm}-seed-{seed}"}
                runs |= {f"{reward}-{r}": f"rl-{arm}-seed-{seed}-{reward}-{r}"
                         for reward in plan["design"]["rewards"] for r in plan["design"]["rl_seeds"]}
                if not all(key in receipts for key in runs.values()):
                    continue  # its runs are not all done (another shard's, or failed): it waits
                if unit["key"] not in openings:
                    print(f"rl-generalisation: {unit['key']} is ready; pass --open-sealed \"<purpose>\" to evaluate it",
                          file=sys.stderr)
                    continue
                selected = {name: receipts[key]["selection"]["selected"] for name, key in runs.items()}
                sealed.append(unit | {"checkpoints": {name: s["checkpoint"] for name, s in selected.items()},
                                      "checkpoint_sha256": {name: s["weights_sha256"] for name, s in selected.items()},
                                      "opening": openings[unit["key"]]})
            ran += session.run(sealed, run_unit)
        return ran

    def analyze(self, out: Path, plan: dict, receipts: list[dict]) -> tuple[dict, list[str], dict]:
        return analyze(out, plan, receipts)

    def answer(self, plan: dict, summary: dict) -> str:
        """RL's effect on each sealed split's strong pass rate, after minus before, after Holm over the rows at
        structure groups and pretraining seeds."""
        rows = summary["sealed"]
        seeds = max((len(row["seeds"]) for row in rows), default=0)
        return after_holm_sentence(
            f"RL's effect on the strong pass rate of the sealed splits (after minus before RL, over structure groups "
            f"and {seeds} pretraining seeds)",
            [(f"{row['arm']}, {row['reward']}-case reward, {SHORT_NAMES.get(row['split'], row['split'])} "
              f"{points(row['strong']['comparison']['mean_difference'])} points",
              row["strong"]["holm"]["verdict"] != "not shown") for row in rows], len(rows), "groups and seeds")

    def check_rerun(self, first_plan: dict, plan: dict) -> None:
        check_rerun_design(first_plan, plan)

    def compare_rerun(self, first_plan: dict, first_receipts: list[dict], plan: dict, receipts: list[dict]) -> dict:
        return compare_rerun(first_plan, first_receipts, plan, receipts)

    def rerun_report_lines(self, comparison: dict, first_name: str) -> list[str]:
        return rerun_report_lines(comparison, first_name)


__all__ = ["DEFAULT_RL_SEEDS", "DEFAULT_SEEDS", "PRETRAIN_DEFAULTS", "REWARDS", "RL_RECIPE", "STUDY", "Generalisation",
           "GeneralisationStudyConfig", "analyze", "build_plan", "check_rerun_design", "compare_rerun", "compute",
           "measure_speed", "rerun_report_lines", "run_unit", "task_subset"]
