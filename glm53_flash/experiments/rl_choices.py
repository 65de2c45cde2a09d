"""RL-choices study: which RLOO choices beat the baseline? A screen, then a confirmation on fresh seeds.

The original's eight arms (seed-research §5.2: reward binary vs partial, invalid penalty 0 / -0.1 / -1,
temperature 0.20 / 0.35 / 0.80, group size 4 / 8 / 16 at a fixed budget of 128 completions), plus the
group-size arms at a matched number of updates (16 updates with 4 or 16 samples), so group size is
not confounded with how many updates and prompts a run gets. Every arm starts from one pretraining
checkpoint. The screen scores each arm on the dev split over a few training seeds; the arm with the
best mean dev pass rate (a rule fixed in the plan) is then compared with the baseline on fresh
training seeds, never a screening seed, and on the `final` split, which no other step of the study opens.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import replace
from pathlib import Path

from glm53_flash.evaluation.config import SAMPLING_TEMPERATURE
from glm53_flash.experiments.study import level_power
from glm53_flash.train.config import RLConfig

STUDY = "rl-choices"
BASE_ARM = {"groups": 16, "group_size": 8, "reward_mode": "binary", "invalid_penalty": -0.1,
            "temperature": SAMPLING_TEMPERATURE}
ARMS: dict[str, dict] = {
    "baseline": {},
    "partial": {"reward_mode": "case-fraction"},
    "invalid-zero": {"invalid_penalty": 0.0},
    "invalid-hard": {"invalid_penalty": -1.0},
    "temp-low": {"temperature": 0.20},
    "temp-high": {"temperature": 0.80},
    "group-4": {"groups": 32, "group_size": 4},
    "group-16": {"groups": 8, "group_size": 16},
    # the same 16 updates as the baseline: only the group size differs (64 / 256 completions)
    "group-4-matched-updates": {"group_size": 4},
    "group-16-matched-updates": {"group_size": 16},
}
# The original screen's shared recipe (run_rl_variant_screen.sh) and the headline's RL switches: the RL
# config every arm starts from (an arm changes the fields of its settings; the paths and the seed are
# the unit's).
RECIPE = RLConfig(initial_checkpoint="", output="", families="increment,double,square,even,reverse",
                  tasks_per_family=8, max_new_tokens=32, learning_rate=5e-5, train_scope="last-block-head",
                  exact_bonus=0.0, logprob_source="untempered", loss_normalization="sequence-mean", eos_handling="omit",
                  stop="parse", verifier_workers=1, quiet=True)
# The recipe's fields a plan's design records (its identity: the plan hash covers them).
RECIPE_RECORDED = ("families", "tasks_per_family", "max_new_tokens", "learning_rate", "train_scope", "exact_bonus",
                   "logprob_source", "loss_normalization", "eos_handling", "stop")


# The compositions suite's screen (`--suite compositions`): the rl-generalisation study's RL recipe (its
# learning rate and scope were chosen on dev for the study model) with our RL switches, every arm's budget
# eight times the original's (the families arms' 128 completions barely move a compositions dev pass rate),
# and one more arm: the strong set as the reward.
COMPOSITIONS_RECIPE = RLConfig(initial_checkpoint="", output="", tasks="compositions", families="",
                               tasks_per_family=None, max_new_tokens=64, learning_rate=2e-4,
                               train_scope="last-block-head", exact_bonus=0.0, stop="parse", verifier_workers=1,
                               quiet=True)
COMPOSITIONS_SCALE = 8  # groups per arm, times the original's
COMPOSITIONS_ARMS = {"reward-strong": {"reward_cases": "strong"}}
SUITES = ("families", "compositions")
SPLITS = {"families": ("dev", "final"), "compositions": ("compositions.dev", "compositions.unseen_structures")}


def recipe_for(suite: str) -> RLConfig:
    return RECIPE if suite == "families" else COMPOSITIONS_RECIPE


def recipe_record(suite: str = "families") -> dict:
    recipe = recipe_for(suite)
    return {name: getattr(recipe, name) for name in RECIPE_RECORDED}
SCREEN_SPLIT, CONFIRM_SPLIT = SPLITS["families"]
DEFAULT_SCREEN_SEEDS = (101, 202, 303)
DEFAULT_CONFIRM_SEEDS = tuple(range(1001, 1011))
DEFAULT_TASKS_PER_FAMILY = 20
EVAL_SEED = 2026  # recorded only: greedy decoding draws no random numbers


def arms_of(suite: str) -> dict:
    return ARMS if suite == "families" else ARMS | COMPOSITIONS_ARMS


def arm_settings(name: str, suite: str = "families") -> dict:
    arms = arms_of(suite)
    if name not in arms:
        raise ValueError(f"unknown arm {name!r}; allowed: {', '.join(arms)}")
    settings = BASE_ARM | arms[name]
    if suite == "compositions":
        settings = {"reward_cases": "three"} | settings | {"groups": settings["groups"] * COMPOSITIONS_SCALE}
    return settings


def check_suite(suite: str) -> str:
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; allowed: {', '.join(SUITES)}")
    return suite


def eval_task_ids(suite: str, split: str, tasks: int | None) -> list[str] | None:
    """The compositions suite's evaluated tasks of `split` (a fixed subset by hash; all when None); None
    for the families suite, whose tasks are chosen per family."""
    if suite == "families":
        return None
    from glm53_flash.experiments.generalisation import task_subset

    return task_subset(split, tasks)


def build_plan(checkpoint: str, checkpoint_sha256: str, arms, screen_seeds, confirm_seeds, tasks_per_family: int | None,
               confirm_arm: str | None, workers: int, seconds_per_rollout: float | None,
               seconds_per_eval_task: float | None, suite: str = "families", precision: str | None = None) -> dict:
    """The study's plan. `tasks_per_family`: the families suite's tasks per family (None: the default); the
    compositions suite's tasks of each split (None: all)."""
    check_suite(suite)
    arms, screen_seeds, confirm_seeds = list(arms), list(screen_seeds), list(confirm_seeds)
    if suite == "families" and tasks_per_family is None:
        tasks_per_family = DEFAULT_TASKS_PER_FAMILY
    screen_split, confirm_split = SPLITS[suite]
    for arm in arms:
        arm_settings(arm, suite)
    if "baseline" not in arms:
        raise ValueError("--arms must include baseline (every arm is compared with it)")
    if len(set(arms)) != len(arms) or len(set(screen_seeds)) != len(screen_seeds) \
            or len(set(confirm_seeds)) != len(confirm_seeds):
        raise ValueError("arms and seeds must not repeat")
    reused = sorted(set(screen_seeds) & set(confirm_seeds))
    if reused:
        raise ValueError(f"confirmation seeds must be fresh; {reused} are also screening seeds")
    if tasks_per_family is not None and tasks_per_family < 1:
        raise ValueError(f"--tasks must be >= 1, got {tasks_per_family}")
    if confirm_arm is not None:
        arm_settings(confirm_arm, suite)
        if confirm_arm == "baseline":
            raise ValueError("--confirm-arm must differ from baseline")
    if confirm_seeds and confirm_arm is None and len(arms) < 2:
        raise ValueError("a confirmation needs a second arm: list one in --arms or name it with --confirm-arm")
    units = [{"key": f"pretrained-{split}", "phase": "reference", "split": split}
             for split in (screen_split, confirm_split)]
    units += [{"key": f"screen-{arm}-seed-{seed}", "phase": "screen", "arm": arm, "seed": seed, "split": screen_split}
              for seed in screen_seeds for arm in arms]
    units += [{"key": f"confirm-{role}-seed-{seed}", "phase": "confirm", "role": role, "seed": seed,
               "split": confirm_split} for seed in confirm_seeds for role in ("baseline", "candidate")]
    if suite == "families":
        n_tasks = tasks_per_family * len(RECIPE.families.split(","))
    else:
        n_tasks = sum(len(eval_task_ids(suite, split, tasks_per_family)) for split in (screen_split, confirm_split)) / 2
    budget = 128 * (1 if suite == "families" else COMPOSITIONS_SCALE)  # every arm's completions but the matched ones
    rollouts = sum(arm_settings(a, suite)["groups"] * arm_settings(a, suite)["group_size"] for a in arms) * len(screen_seeds)
    rollouts += 2 * budget * len(confirm_seeds)  # the candidate's budget is not known yet: the arms' budget
    evaluations = round(n_tasks * (2 + len(arms) * len(screen_seeds) + 2 * len(confirm_seeds)))
    expected = None
    if seconds_per_rollout is not None and seconds_per_eval_task is not None:
        expected = round((rollouts * seconds_per_rollout + evaluations * seconds_per_eval_task) / max(1, workers) / 60, 1)
    design = {
        "checkpoint": str(checkpoint), "checkpoint_sha256": checkpoint_sha256, "arms": arms,
        "arm_settings": {arm: arm_settings(arm, suite) for arm in arms}, "recipe": recipe_record(suite),
        "screen_seeds": screen_seeds, "confirm_seeds": confirm_seeds, "tasks_per_family": tasks_per_family,
        "screen_split": screen_split, "confirm_split": confirm_split, "evaluation": "greedy pass@1",
        "max_new_tokens": recipe_for(suite).max_new_tokens, "confirm_arm": confirm_arm or "screen-winner",
    }
    if suite != "families":  # a families plan keeps the design (and so the hash) it always had
        design["suite"] = suite
        design["task_ids_sha256"] = {split: _ids_sha256(eval_task_ids(suite, split, tasks_per_family))
                                     for split in (screen_split, confirm_split)}
        design["budget_scale"] = COMPOSITIONS_SCALE
        design["precision"] = precision or "fp32"  # resolved by the CLI (auto: bf16 where the CPU has it)
    return {
        "study": STUDY,
        "design": design,
        "units": units,
        "analysis": {
            "selection_rule": ("the non-baseline arm with the highest mean dev pass rate over the screening seeds "
                               "(ties: more dev tasks solved in total, then arm order)"
                               if confirm_arm is None else f"fixed in advance: {confirm_arm}"),
            "screen": "each arm vs baseline: pooled sign-flip over (seed, task) pairs, Holm across the arms; "
                      "seed-level exact sign-flip reported (too few seeds to decide)",
            "confirmation": "candidate vs baseline: exact sign-flip over training seeds of the paired pass-rate "
                            "difference (primary), per-seed exact McNemar, pooled sign-flip over (seed, task) pairs",
            "bootstrap": {"resamples": 20000, "seed": 20261130, "level": 0.95}, "alpha": 0.05,
        },
        # stated before the first run, outside the hashed design (as the estimate)
        "power": {"screen, over seeds": level_power(len(screen_seeds), "sign-flip"),
                  "confirmation, over seeds": level_power(len(confirm_seeds), "sign-flip")},
        "estimate": {"workers": workers, "seconds_per_rollout": seconds_per_rollout,
                     "seconds_per_eval_task": seconds_per_eval_task, "rollouts": rollouts,
                     "evaluated_tasks": evaluations, "expected_minutes": expected},
    }


def select_candidate(plan: dict, receipts: list[dict]) -> dict:
    """Apply the plan's selection rule to the finished screen; returns the selection record."""
    design = plan["design"]
    if design["confirm_arm"] != "screen-winner":
        return {"candidate": design["confirm_arm"], "rule": plan["analysis"]["selection_rule"], "screen": {}}
    screen = {}
    for receipt in receipts:
        if receipt["phase"] == "screen":
            screen.setdefault(receipt["arm"], []).append(receipt["evaluation"]["summary"])
    expected = len(design["screen_seeds"])
    incomplete = [arm for arm in design["arms"] if len(screen.get(arm, [])) != expected]
    if incomplete:
        raise ValueError(f"the screen is not finished for {', '.join(incomplete)}; cannot select a candidate")
    table = {arm: {"mean_pass_rate": sum(s["pass_at_1"] for s in rows) / len(rows),
                   "solved": sum(s["tasks_solved"] for s in rows)} for arm, rows in screen.items()}
    order = {arm: i for i, arm in enumerate(design["arms"])}
    contenders = [arm for arm in design["arms"] if arm != "baseline"]
    best = max(contenders, key=lambda a: (table[a]["mean_pass_rate"], table[a]["solved"], -order[a]))
    return {"candidate": best, "rule": plan["analysis"]["selection_rule"], "screen": table}


def _ids_sha256(ids: list[str]) -> str:
    from glm53_flash.experiments.generalisation import _ids_sha256 as digest

    return digest(ids)


def _evaluate(model, split: str, tasks_per_family: int | None, opening=None, suite: str = "families",
              precision: str | None = None) -> dict:
    from glm53_flash.evaluation.evaluate import evaluate_greedy
    from glm53_flash.tasks import frozen_tasks, parse_families

    if suite == "families":
        if opening is not None:
            opening.activate()  # its opened line first, then its tasks
        tasks = frozen_tasks(split, tasks_per_family, families=parse_families(RECIPE.families), opening=opening)
    else:
        from glm53_flash.experiments.generalisation import _tasks

        tasks = _tasks(split, eval_task_ids(suite, split, tasks_per_family), opening=opening)
    receipt = evaluate_greedy(model, tasks, max_new_tokens=recipe_for(suite).max_new_tokens, seed=EVAL_SEED,
                              opening=opening, precision=precision)
    outcomes = [{"task_id": e["task_id"], "family": e["family"], "passed": e["evaluation"]["passed"],
                 "status": e["evaluation"]["status"], "pass_fraction": e["evaluation"]["pass_fraction"],
                 "completion": e["generated_completion"]} for e in receipt["episodes"]]
    return {"split": split, "summary": receipt["summary"], "by_family": receipt["by_family"], "outcomes": outcomes,
            "timing": receipt.get("timing")}


def run_unit(unit: dict) -> dict:
    """Worker entry point: evaluate the checkpoint (reference) or train one arm at one seed and evaluate it."""
    import torch

    from glm53_flash.model.lm import load_pretrained
    from glm53_flash.train.rl import train_rl

    torch.set_num_threads(1)
    design, device = unit["design"], unit.get("device", "cpu")
    suite = design.get("suite", "families")
    started = time.perf_counter()
    if unit["phase"] == "reference":
        model, _ = load_pretrained(design["checkpoint"], device)
        evaluation = _evaluate(model, unit["split"], design["tasks_per_family"], unit.get("opening"), suite,
                               design.get("precision"))
        return {"phase": "reference", "arm": "pretrained", "seed": None, "evaluation": evaluation,
                "elapsed_seconds": round(time.perf_counter() - started, 3)}
    arm = unit["arm"]
    settings = arm_settings(arm, suite)
    logging = unit.get("logging") or {}
    work = Path(unit["work_dir"])
    rl = train_rl(replace(
        recipe_for(suite), initial_checkpoint=design["checkpoint"], output=str(work), groups=settings["groups"],
        checkpoints=(settings["groups"],), group_size=settings["group_size"], temperature=settings["temperature"],
        reward_mode=settings["reward_mode"], invalid_penalty=settings["invalid_penalty"], seed=unit["seed"],
        device=device, resume=True, **({"reward_cases": settings["reward_cases"]} if "reward_cases" in settings else {}),
        **({"precision": design["precision"]} if "precision" in design else {}),
        tensorboard=str(Path(logging["tensorboard"]) / unit["key"]) if logging.get("tensorboard") else None,
        wandb=logging.get("wandb")))
    final = rl["checkpoints"][-1]
    model, meta = load_pretrained(final["path"], device)
    evaluation = _evaluate(model, unit["split"], design["tasks_per_family"], unit.get("opening"), suite,
                           design.get("precision"))
    training = {key: rl[key] for key in ("initial_checkpoint_sha256", "schedule_sha256", "updated_groups",
                                         "exact_training_rollouts", "elapsed_seconds", "trainable_parameters")}
    training.update(rollouts=settings["groups"] * settings["group_size"], final_weights_sha256=meta["weights_sha256"])
    shutil.rmtree(work, ignore_errors=True)  # ~100 MB of weights per run; the receipt keeps the hashes
    return {"phase": unit["phase"], "arm": arm, "role": unit.get("role"), "seed": unit["seed"],
            "settings": settings, "training": training, "evaluation": evaluation,
            "elapsed_seconds": round(time.perf_counter() - started, 3)}


def measure_speed(checkpoint: str, suite: str = "families", precision: str | None = None) -> tuple[float, float]:
    """(seconds per training rollout, seconds per evaluated task) on this machine, one thread each. On the
    compositions suite, their marginal costs (generalisation.probe_rl_and_evaluation: RL with three groups
    minus one, twelve dev tasks minus four), so what a run pays once does not count per rollout (the one-group
    probe of the families suite put a compositions plan at 340.9 minutes; its runs took 21-32 s each)."""
    import tempfile

    import torch

    from glm53_flash.model.lm import load_pretrained
    from glm53_flash.train.rl import train_rl

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if suite == "compositions":
            from glm53_flash.experiments.generalisation import probe_rl_and_evaluation

            recipe = COMPOSITIONS_RECIPE
            speed = probe_rl_and_evaluation(checkpoint, {"group_size": BASE_ARM["group_size"],
                                                         "temperature": BASE_ARM["temperature"],
                                                         "train_scope": recipe.train_scope},
                                            precision or "fp32")
            return speed["seconds_per_rollout"], speed["seconds_per_eval_task"]
        with tempfile.TemporaryDirectory(prefix="glm53-rl-probe-") as tmp:
            started = time.perf_counter()
            train_rl(replace(recipe_for(suite), initial_checkpoint=checkpoint, output=str(Path(tmp) / "probe"),
                             groups=1, checkpoints=(1,), group_size=8, temperature=SAMPLING_TEMPERATURE,
                             reward_mode="binary", seed=0, device="cpu",
                             **({"tasks_per_family": 1} if suite == "families" else {})))
            per_rollout = (time.perf_counter() - started) / 8
        model, _ = load_pretrained(checkpoint)
        started = time.perf_counter()
        _evaluate(model, SPLITS[suite][0], 2 if suite == "families" else 8, suite=suite)
        per_task = (time.perf_counter() - started) / (2 * len(RECIPE.families.split(",")) if suite == "families" else 8)
        return per_rollout, per_task
    finally:
        torch.set_num_threads(before)


__all__ = ["ARMS", "BASE_ARM", "COMPOSITIONS_ARMS", "COMPOSITIONS_RECIPE", "RECIPE", "SPLITS", "STUDY", "SUITES",
           "arm_settings", "arms_of", "build_plan", "measure_speed", "recipe_for", "run_unit", "select_candidate"]
