"""RL-choices study: which RLOO choices beat the baseline? A screen, then a confirmation on fresh seeds.

The original's eight arms (seed-research §5.2: reward binary vs partial, invalid penalty 0 / -0.1 / -1,
temperature 0.20 / 0.35 / 0.80, group size 4 / 8 / 16 at a fixed budget of 128 completions), plus the
group-size arms at a matched number of updates (16 updates with 4 or 16 samples), so group size is
not confounded with how many updates and prompts a run gets. Every arm starts from one pretraining
checkpoint. The screen scores each arm on the dev split over a few training seeds; the arm with the
best mean dev pass rate (a rule fixed in the plan) is then compared with the baseline on fresh
training seeds, never a screening seed, and on the `final` split, which no other step of the study opens.
On the compositions suite (`--suite compositions`) every comparison is made over structure groups and RL
seeds, and a rerun from another pretraining seed's checkpoint is compared with the first (`compare_rerun`).
`RLChoices` at the end declares the study (study.Study).
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from glm53_flash.core.options import option
from glm53_flash.core.runtime import PRECISION_HELP, PRECISIONS
from glm53_flash.evaluation.config import SAMPLING_TEMPERATURE
from glm53_flash.experiments.config import (
    RerunnableStudyConfig, allow_dirty_option, ledger_option, open_sealed_option, parse_name_list, parse_seed_range,
    reopen_option,
)
from glm53_flash.experiments.reruns import LEVELS, RERUN_MARGIN, check_same_design, points, spread_cells
from glm53_flash.experiments.runner import sealed_opening
from glm53_flash.experiments.study import (
    SELECTION_FILE, DeckEntry, MakeTarget, Study, after_holm_sentence, level_power,
)
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
    from glm53_flash.train.rl_run import train_rl

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
    from glm53_flash.train.rl_run import train_rl

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


# --------------------------------------------------------------------------- analysis


def _outcome_map(receipt: dict) -> dict[str, bool]:
    return {o["task_id"]: bool(o["passed"]) for o in receipt["evaluation"]["outcomes"]}


def _task_pairs(left: dict[int, dict], right: dict[int, dict]) -> list[tuple[float, float]]:
    pairs = []
    for seed in sorted(set(left) & set(right)):
        a, b = _outcome_map(left[seed]), _outcome_map(right[seed])
        if set(a) != set(b):
            raise ValueError(f"seed {seed}: the two arms were evaluated on different tasks")
        pairs += [(float(a[t]), float(b[t])) for t in sorted(a)]
    return pairs


def _task_differences(left: dict[int, dict], right: dict[int, dict]) -> dict[str, dict[str, float]]:
    """{seed: {task id: right's pass minus left's}} over the seeds both have."""
    out = {}
    for seed in sorted(set(left) & set(right)):
        a, b = _outcome_map(left[seed]), _outcome_map(right[seed])
        if set(a) != set(b):
            raise ValueError(f"seed {seed}: the two arms were evaluated on different tasks")
        out[str(seed)] = {t: float(b[t]) - float(a[t]) for t in sorted(a)}
    return out


def group_comparison(differences: dict, groups: dict, alpha: float, resamples: int, seed: int) -> dict:
    """A compositions comparison at the units that vary (`differences[seed][task]`): over structure groups
    (each the mean of its behaviours) and over seeds (stats.two_level_comparison, the primary), what each level
    could detect with the spread it measured, with seeds and groups both random at once
    (stats.crossed_comparison; None below two seeds), and over behaviours as a secondary view."""
    from glm53_flash.core import stats

    by_group = stats.group_means(differences, groups)
    result = stats.two_level_comparison(by_group, alpha=alpha, resamples=resamples, seed=seed)
    result["crossed"] = stats.crossed_comparison(by_group, alpha) if len(by_group) >= 2 else None
    result["detectable"] = stats.detectable_differences(by_group, alpha)
    behaviours = stats.two_level_comparison(differences, alpha=alpha, resamples=resamples, seed=seed)
    result["behaviours"] = {"mean": behaviours["mean_difference"], **behaviours["units"]}
    return result


def compute(out: Path, plan: dict, receipts: list[dict]) -> dict:
    """Every number of the rl-choices study (no text); `out` holds the study's selection.json. On the
    compositions suite every comparison is also made at the units that vary (`groups`: structure groups and
    training seeds, group_comparison), and that is the primary one: Holm over the screen's arms at the groups,
    the confirmation's result after Holm (one comparison) at groups and seeds, Holm over the two comparisons
    with the starting checkpoint."""
    import numpy as np

    from glm53_flash.core import stats
    from glm53_flash.core.receipts import read_json
    from glm53_flash.experiments.paired import apply_holm, paired_comparison, pooled_pair_test, wall_minutes

    design, analysis = plan["design"], plan["analysis"]
    boot = analysis["bootstrap"]
    alpha = analysis["alpha"]
    reference = {r["evaluation"]["split"]: r["evaluation"]["summary"] for r in receipts if r["phase"] == "reference"}
    reference_runs = {r["evaluation"]["split"]: r for r in receipts if r["phase"] == "reference"}
    compositions_suite = design.get("suite", "families") != "families"
    groups = None
    if compositions_suite:
        from glm53_flash.tasks.compositions import structure_groups

        groups = structure_groups({o["task_id"] for r in receipts for o in r["evaluation"].get("outcomes", [])})
    screen: dict[str, dict[int, dict]] = {}
    confirm: dict[str, dict[int, dict]] = {}
    for receipt in receipts:
        if receipt["phase"] == "screen":
            screen.setdefault(receipt["arm"], {})[receipt["seed"]] = receipt
        elif receipt["phase"] == "confirm":
            confirm.setdefault(receipt["role"], {})[receipt["seed"]] = receipt

    def rates(runs: dict[int, dict]) -> dict[int, float]:
        return {seed: r["evaluation"]["summary"]["pass_at_1"] for seed, r in runs.items()}

    arms = []
    for arm in design["arms"]:
        runs = screen.get(arm, {})
        if not runs:
            continue
        arms.append({
            "arm": arm, "settings": design["arm_settings"][arm], "seeds": sorted(runs),
            "pass_rates": [100.0 * rates(runs)[s] for s in sorted(runs)],
            "mean_pass_rate": 100.0 * float(np.mean(list(rates(runs).values()))),
            "solved": sum(r["evaluation"]["summary"]["tasks_solved"] for r in runs.values()),
            "tasks": sum(r["evaluation"]["summary"]["tasks_total"] for r in runs.values()),
            "updates": float(np.mean([r["training"]["updated_groups"] for r in runs.values()])),
            "exact_training_rollouts": float(np.mean([r["training"]["exact_training_rollouts"] for r in runs.values()])),
            "rollouts": runs[min(runs)]["training"]["rollouts"],
            "seconds": float(np.mean([r["elapsed_seconds"] for r in runs.values()])),
        })
    screen_rows = []
    baseline = screen.get("baseline", {})
    for index, arm in enumerate(a["arm"] for a in arms if a["arm"] != "baseline"):
        row = {"name": arm, "left": "baseline", "right": arm}
        row |= paired_comparison(rates(baseline), rates(screen[arm]), resamples=boot["resamples"],
                                 seed=boot["seed"] + index, scale=100.0)
        row["pooled_tasks"] = pooled_pair_test(_task_pairs(baseline, screen[arm]), seed=boot["seed"] + index)
        row["pooled_p"] = row["pooled_tasks"]["p"]
        if compositions_suite:
            row["groups"] = group_comparison(_task_differences(baseline, screen[arm]), groups, alpha,
                                             boot["resamples"], boot["seed"] + index)
            row["groups_p"] = row["groups"]["units"]["sign_flip_p"]
        screen_rows.append(row)
    apply_holm(screen_rows, key="groups_p" if compositions_suite else "pooled_p", out_key="holm_p")

    selection_path = out / SELECTION_FILE
    selection = read_json(selection_path) if selection_path.exists() else None
    if selection is not None and selection.get("plan_sha256") != plan["plan_sha256"]:
        raise ValueError(f"{selection_path} was made for another plan; rerun `glm53 experiment rl-choices` to redo it")
    candidates = {r["arm"] for r in confirm.get("candidate", {}).values()}
    if len(candidates) > 1 or (selection and candidates and candidates != {selection["candidate"]}):
        raise ValueError(f"confirmation receipts train {sorted(candidates)} as the candidate but the selection names "
                         f"{selection and selection['candidate']}; the study directory is inconsistent")
    confirmation = None
    if confirm.get("baseline") and confirm.get("candidate"):
        base_runs, cand_runs = confirm["baseline"], confirm["candidate"]
        candidate = next(iter(cand_runs.values()))["arm"]
        row = {"name": f"{candidate} vs baseline", "left": "baseline", "right": candidate}
        row |= paired_comparison(rates(base_runs), rates(cand_runs), resamples=boot["resamples"], seed=boot["seed"],
                                 scale=100.0)
        row["holm_p"] = row["sign_flip_p"]  # one confirmatory comparison: nothing to correct
        row["pooled_tasks"] = pooled_pair_test(_task_pairs(base_runs, cand_runs), seed=boot["seed"])
        per_seed = []
        for seed in row["seeds"]:
            a, b = _outcome_map(base_runs[seed]), _outcome_map(cand_runs[seed])
            counts = stats.paired_counts([a[t] for t in sorted(a)], [b[t] for t in sorted(a)])
            per_seed.append({"seed": seed, "baseline_solved": sum(a.values()), "candidate_solved": sum(b.values()),
                             "tasks": len(a), "gains": counts["gains"], "losses": counts["losses"],
                             "mcnemar_p": stats.mcnemar_exact(counts["gains"], counts["losses"])})
        row["per_seed"] = per_seed
        row["candidate"] = candidate
        if compositions_suite:  # the primary test: groups and seeds, one comparison
            row["groups"] = group_comparison(_task_differences(base_runs, cand_runs), groups, alpha,
                                             boot["resamples"], boot["seed"])
            row["holm"] = stats.holm_verdicts([row["groups"]], alpha)[0]
            row["result"] = row["holm"]["verdict"]
            del row["holm_p"]
        confirmation = row

    # Does RL help at all? Each confirmation run against the starting checkpoint on the same split
    # (the checkpoint is one fixed value, so the sign-flip tests whether the runs' mean moved from it).
    versus_pretrained = []
    final_reference = reference.get(design["confirm_split"])
    if final_reference is not None:
        for index, role in enumerate(("baseline", "candidate")):
            runs = confirm.get(role, {})
            if not runs:
                continue
            arm = next(iter(runs.values()))["arm"]
            row = {"name": f"{arm} vs pretrained", "left": "pretrained", "right": arm}
            row |= paired_comparison({s: final_reference["pass_at_1"] for s in runs}, rates(runs),
                                     resamples=boot["resamples"], seed=boot["seed"] + 100 + index, scale=100.0)
            if compositions_suite:
                start = {s: reference_runs[design["confirm_split"]] for s in runs}
                row["groups"] = group_comparison(_task_differences(start, runs), groups, alpha, boot["resamples"],
                                                 boot["seed"] + 100 + index)
            versus_pretrained.append(row)
        if compositions_suite:
            for row, adjusted in zip(versus_pretrained, stats.holm_verdicts([r["groups"] for r in versus_pretrained],
                                                                            alpha)):
                row["holm"], row["result"] = adjusted, adjusted["verdict"]
        else:
            apply_holm(versus_pretrained)

    summary = {
        "study": plan["study"], "plan_sha256": plan["plan_sha256"], "checkpoint": design["checkpoint"],
        "checkpoint_sha256": design["checkpoint_sha256"], "runs": len(receipts), "runs_planned": len(plan["units"]),
        "wall_minutes": wall_minutes(receipts),
        "pretrained": {split: {"pass_rate": 100.0 * s["pass_at_1"], "solved": s["tasks_solved"],
                               "tasks": s["tasks_total"]} for split, s in reference.items()},
        "arms": arms, "screen_comparisons": screen_rows, "selection": selection, "confirmation": confirmation,
        "versus_pretrained": versus_pretrained,
    }
    if not compositions_suite:  # the units that vary: a family's tasks compute one function
        for split in (design["screen_split"], design["confirm_split"]):
            outcomes = next((r["evaluation"]["outcomes"] for r in receipts
                             if r["evaluation"]["split"] == split and r["evaluation"].get("outcomes")), [])
            if outcomes:
                summary.setdefault("units", {})[split] = {"tasks": len(outcomes),
                                                          "units": len({o["family"] for o in outcomes})}
    return summary


def _points(value: float) -> str:
    """A fraction of the pass rate as signed points: +1.7."""
    from glm53_flash.report.format import format_signed

    return format_signed(100 * value)


def _crossed_text(crossed: dict | None) -> str:
    from glm53_flash.report.format import format_p

    if crossed is None:
        return "with one seed no test takes seeds and groups random at once"
    low, high = crossed["interval"]
    return (f"with RL seeds and structure groups both random p {format_p(crossed['t_test_p'])}, "
            f"{round(100 * (1 - crossed['alpha']))}% CI {_points(low)} to {_points(high)}")


def _detectable(detectable: dict) -> str:
    def points(value):
        return "nothing" if value is None else f"{100 * value:.1f} points"

    return (f"{points(detectable['units'])} over groups and {points(detectable['seeds'])} over RL seeds with "
            f"{round(100 * detectable['power'])}% power")


def _compositions_answers(plan: dict, summary: dict) -> tuple[list[str], dict]:
    """The answers and headline table of an rl-choices study on the compositions suite: every comparison at
    structure groups and training (RL) seeds, from one pretrained checkpoint, its result stated only after the
    study's Holm correction at those levels; the pass rates describe, behaviours are a secondary view."""
    from glm53_flash.report.format import format_p, format_signed

    from glm53_flash.experiments.study import after_holm

    design, alpha = plan["design"], plan["analysis"]["alpha"]
    screen_rows, confirmation = summary["screen_comparisons"], summary["confirmation"]
    versus_pretrained = [v for v in summary["versus_pretrained"] if v["n"]]
    answers = []
    flagged = [r for r in screen_rows if r.get("holm_p") is not None and r["holm_p"] <= alpha]
    if screen_rows:
        best = max(screen_rows, key=lambda r: r["mean"])
        groups = best["groups"]
        answers.append(
            f"Screen ({design['screen_split']}, {best['n']} seed{'s' if best['n'] != 1 else ''} per arm from one "
            f"pretrained checkpoint; it selects, it does not decide): the best arm was {best['right']}, "
            f"{format_signed(best['mean'])} points of pass rate over the baseline ({_points(groups['mean_difference'])} "
            f"over {groups['units']['n']} structure groups, sign-flip p {format_p(groups['units']['sign_flip_p'])}, "
            f"Holm across {len(screen_rows)} arm{'s' if len(screen_rows) != 1 else ''} {format_p(best.get('holm_p'))})."
            + (f" After Holm across the arms the groups' test flags "
               + ", ".join(f"{r['right']} ({_points(r['groups']['mean_difference'])})" for r in flagged)
               + "; over the screen's few seeds of one checkpoint, only a confirmation on new seeds can back them."
               if flagged else ""))
    if confirmation is not None:
        groups = confirmation["groups"]
        answers.append(
            f"Confirmation on {confirmation['n']} fresh RL seeds from this one pretrained checkpoint and the "
            f"{design['confirm_split']} split (opened by no other step of this study): does {confirmation['candidate']} "
            f"differ from the baseline (two-sided)? Over {groups['units']['n']} structure groups (each the mean of its "
            f"behaviours) {_points(groups['mean_difference'])} points: "
            f"{after_holm(confirmation['result'], confirmation['holm']['comparisons'], 'groups and RL seeds')} "
            f"(groups p {format_p(confirmation['holm']['units'])}, RL seeds p {format_p(confirmation['holm']['seeds'])}; "
            f"with the spreads measured it detects {_detectable(groups['detectable'])}); "
            f"{_crossed_text(groups['crossed'])}. Pass rate {confirmation['left_mean']:.1f}% against "
            f"{confirmation['right_mean']:.1f}% ({format_signed(confirmation['mean'])} points, {confirmation['wins']} of "
            f"{confirmation['n']} seeds higher); over behaviours, a secondary view, "
            f"{_points(groups['behaviours']['mean'])} points (p {format_p(groups['behaviours']['sign_flip_p'])}).")
        shown = confirmation["result"] != "not shown"
        crossed = groups["crossed"]
        both_random = crossed is not None and crossed["t_test_p"] < alpha \
            and (crossed["mean"] > 0) == (groups["mean_difference"] > 0)
        untested = [r["right"] for r in flagged if r["right"] != confirmation["candidate"]]
        others = (f"the screen's other flags ({', '.join(untested)}) were not confirmed." if untested
                  else "no other arm was flagged.")
        direction = "beats the baseline" if confirmation["result"] == "better" else "is worse than the baseline"
        family = after_holm(confirmation["result"], confirmation["holm"]["comparisons"], "groups and RL seeds")
        if shown:
            answers.append(
                f"Answer: from this one pretrained checkpoint, {confirmation['candidate']} {direction} on fresh RL "
                f"seeds ({family})"
                + (f", and with RL seeds and structure groups both random (p {format_p(crossed['t_test_p'])})"
                   if both_random else
                   f", but not with RL seeds and structure groups both random (p "
                   f"{format_p(None if crossed is None else crossed['t_test_p'])})")
                + ("; the baseline's choice is the better one" if confirmation["result"] == "worse" else "")
                + "; it says nothing of other pretraining seeds' checkpoints; " + others)
        else:
            answers.append(f"Answer: from this one pretrained checkpoint, {confirmation['candidate']}"
                           + (" (fixed in advance)" if design.get("confirm_arm", "screen-winner") != "screen-winner"
                              else "") + f" is not shown to differ from the baseline on fresh RL seeds ({family})"
                           + (f"; {', '.join(untested)} (flagged by the screen) was never confirmed."
                              if untested else "."))
    for v in versus_pretrained:
        groups = v["groups"]
        answers.append(
            f"Does RL with this recipe beat the starting checkpoint on {design['confirm_split']}? {v['right']}: pass "
            f"rate {v['right_mean']:.1f}% against {v['left_mean']:.1f}% before RL ({format_signed(v['mean'])} points, "
            f"{v['wins']} of {v['n']} seeds higher); over {groups['units']['n']} structure groups "
            f"{_points(groups['mean_difference'])} points: "
            f"{after_holm(v['result'], v['holm']['comparisons'], 'groups and RL seeds')} (Holm p groups "
            f"{format_p(v['holm']['units'])}, RL seeds {format_p(v['holm']['seeds'])}); {_crossed_text(groups['crossed'])}.")
    columns = ["Phase", "Arm", "Baseline %", "Arm %", "Δ pass rate (points)", "Δ over groups (points)", "groups p",
               "RL seeds p", "Holm p (groups / RL seeds)", "RL seeds and groups random p", "wins/ties/losses",
               "seeds", "result"]

    def row_cells(phase, r, holm, result, left_label=None):
        groups = r["groups"]
        crossed = groups["crossed"]
        return [phase, r["right"], left_label or f"{r['left_mean']:.1f}", f"{r['right_mean']:.1f}",
                format_signed(r["mean"]), _points(groups["mean_difference"]), format_p(groups["units"]["sign_flip_p"]),
                format_p(groups["seeds"]["t_test_p"]), holm, format_p(None if crossed is None else crossed["t_test_p"]),
                f"{r['wins']}/{r['ties']}/{r['losses']}", r["n"], result]

    table_rows = [row_cells(f"screen ({design['screen_split']})", r, f"{format_p(r.get('holm_p'))} / -",
                            "flagged" if r in flagged else "-") for r in screen_rows if r["n"]]
    if confirmation is not None and confirmation["n"]:
        holm = confirmation["holm"]
        table_rows.append(row_cells(f"confirm ({design['confirm_split']})", confirmation,
                                    f"{format_p(holm['units'])} / {format_p(holm['seeds'])}", confirmation["result"]))
    for v in versus_pretrained:
        table_rows.append(row_cells(f"RL vs pretrained ({design['confirm_split']})", v,
                                    f"{format_p(v['holm']['units'])} / {format_p(v['holm']['seeds'])}", v["result"],
                                    f"{v['left_mean']:.1f} (pretrained)"))
    return answers, {"columns": columns, "rows": table_rows}


def answers_and_table(plan: dict, summary: dict) -> tuple[list[str], dict]:
    """The study's answers (sentences) and its headline table, formatted from the computed numbers."""
    from glm53_flash.experiments.paired import verdict
    from glm53_flash.report.format import format_interval, format_p, format_signed

    if plan["design"].get("suite", "families") != "families":
        return _compositions_answers(plan, summary)
    design, alpha = plan["design"], plan["analysis"]["alpha"]
    screen_rows, confirmation = summary["screen_comparisons"], summary["confirmation"]
    versus_pretrained = summary["versus_pretrained"]
    answers = []
    flagged = [r for r in screen_rows if r.get("holm_p") is not None and r["holm_p"] <= alpha]
    flag_list = ", ".join(f"{r['right']} ({format_signed(r['mean'])})" for r in flagged)
    if screen_rows:
        best = max(screen_rows, key=lambda r: r["mean"])
        answers.append(
            f"Screen ({design['screen_split']}, {best['n']} seed{'s' if best['n'] != 1 else ''} per arm; it selects, it "
            "does not decide): the best "
            f"arm was {best['right']}, {format_signed(best['mean'])} points over the baseline (seed-level sign-flip p "
            f"{format_p(best['sign_flip_p'])}; task-pooled p {format_p(best['pooled_p'])}, Holm across "
            f"{len(screen_rows)} arm{'s' if len(screen_rows) != 1 else ''} {format_p(best.get('holm_p'))})."
            + (f" Task-pooled tests flag {flag_list}; they condition on these particular runs, so only a "
               "confirmation on new seeds can back them." if flagged else ""))
    if confirmation is not None:
        answers.append(f"Confirmation on {confirmation['n']} fresh seeds and the {design['confirm_split']} split "
                       f"(opened by no other step of this study): does {confirmation['candidate']} differ from the "
                       f"baseline (two-sided)? {verdict(confirmation, alpha, 'points')}.")
        shown = confirmation.get("holm_p") is not None and confirmation["holm_p"] <= alpha
        untested = [r["right"] for r in flagged if r["right"] != confirmation["candidate"]]
        others = (f"the screen's other flags ({', '.join(untested)}) were not confirmed." if untested
                  else "no other arm was flagged.")
        if shown and confirmation["mean"] > 0:
            answers.append(f"Answer: {confirmation['candidate']} beats the baseline on fresh seeds; " + others)
        elif shown:  # a confirmed difference the other way: the baseline's choice is the better one
            answers.append(f"Answer: {confirmation['candidate']} is worse than the baseline on fresh seeds "
                           f"({format_signed(confirmation['mean'])} points): the baseline's choice is the better one; "
                           + others)
        elif design.get("confirm_arm", "screen-winner") != "screen-winner":
            answers.append(f"Answer: {confirmation['candidate']}, fixed in advance, was not shown to beat the baseline "
                           "on fresh seeds"
                           + (f"; {', '.join(untested)} (flagged by the screen) was never confirmed." if untested
                              else "."))
        else:
            answers.append(f"Answer: no RL choice was shown to beat the baseline. The screen's "
                           f"{confirmation['candidate']} signal did not replicate on fresh seeds"
                           + (f", and {', '.join(untested)} (flagged by the screen) was never confirmed." if untested
                              else "."))
    for v in versus_pretrained:
        if v["n"]:
            answers.append(f"Does RL with this recipe beat the starting checkpoint on {design['confirm_split']}? "
                           f"{v['right']}: {v['right_mean']:.1f}% vs {v['left_mean']:.1f}% before RL, "
                           f"{format_signed(v['mean'])} points; {v['wins']} of {v['n']} seeds higher, {v['losses']} lower "
                           f"(sign test against the fixed checkpoint: p {format_p(v['sign_flip_p'])}, "
                           f"Holm p {format_p(v.get('holm_p'))}).")
    columns = ["Phase", "Arm", "Baseline %", "Arm %", "Δ points", "95% CI (or range)", "seed sign-flip p",
               "task-pooled p", "Holm p", "wins/ties/losses", "seeds"]

    def row_cells(phase, r, pooled, left_label=None):
        return [phase, r["right"], left_label or f"{r['left_mean']:.1f}", f"{r['right_mean']:.1f}",
                format_signed(r["mean"]), format_interval(r["ci95"], spread=r.get("range")), format_p(r["sign_flip_p"]),
                format_p(pooled), format_p(r.get("holm_p")), f"{r['wins']}/{r['ties']}/{r['losses']}", r["n"]]

    table_rows = [row_cells(f"screen ({design['screen_split']})", r, r["pooled_p"]) for r in screen_rows if r["n"]]
    if confirmation is not None and confirmation["n"]:
        table_rows.append(row_cells(f"confirm ({design['confirm_split']})", confirmation,
                                    confirmation["pooled_tasks"]["p"]))
    for v in versus_pretrained:
        if v["n"]:
            table_rows.append(row_cells(f"RL vs pretrained ({design['confirm_split']})", v, None,
                                        f"{v['left_mean']:.1f} (pretrained)"))
    return answers, {"columns": columns, "rows": table_rows}


def analyze(out: Path, plan: dict, receipts: list[dict]) -> tuple[dict, list[str], dict]:
    summary = compute(out, plan, receipts)
    answers, table = answers_and_table(plan, summary)
    summary["headline_table"], summary["answers"] = table, answers
    charts = _charts(out, summary, plan["design"])
    return summary, report_lines(plan, summary, charts), charts


def _charts(out: Path, summary: dict, design: dict) -> dict[str, str]:
    from glm53_flash.report import study_charts

    return study_charts.save_charts(out, [
        ("screen", "screen.png", study_charts.draw_rl_screen(summary)),
        ("confirmation", "confirmation.png", study_charts.draw_rl_confirmation(summary, design["confirm_split"]))])


def report_lines(plan: dict, summary: dict, charts: dict) -> list[str]:
    from glm53_flash.experiments.paired import BOOTSTRAP_NOTE
    from glm53_flash.report.format import format_p
    from glm53_flash.report.tables import markdown_table

    design = plan["design"]
    recipe = design["recipe"]
    pretrained = ", ".join(f"{split} {v['solved']}/{v['tasks']}" for split, v in summary["pretrained"].items())
    lines = [
        "# Which RL choices matter?",
        "",
        (f"Every arm starts from checkpoint `{design['checkpoint']}` (sha256 `{design['checkpoint_sha256'][:12]}`; "
         f"greedy pass@1 before RL: {pretrained}). Recipe: "
         + (f"families {recipe['families']}, {recipe['tasks_per_family']} RL prompts per family, "
            if design.get("suite", "families") == "families" else
            f"the compositions suite's rl behaviours, every arm's groups x{design['budget_scale']}, "
            f"precision {design.get('precision', 'fp32')}, ")
         + f"lr {recipe['learning_rate']}, scope "
         f"{recipe['train_scope']}, max {recipe['max_new_tokens']} new tokens. Screen: {len(design['arms'])} arms x "
         f"seeds {design['screen_seeds']} on {design['screen_split']} "
         + (f"({design['tasks_per_family']} tasks per family). " if design.get("suite", "families") == "families" else
            f"({'all' if design['tasks_per_family'] is None else design['tasks_per_family']} tasks). ") +
         f"Confirmation: seeds {design['confirm_seeds']} on {design['confirm_split']}. Plan "
         f"`{summary['plan_sha256'][:12]}` was written before the first run; {summary['runs']}/{summary['runs_planned']} "
         f"runs done in {summary['wall_minutes']} min of wall time."),
        "",
        "## Answers",
        "",
        *[f"- {answer}" for answer in summary["answers"]],
        "",
        "## Results",
        "",
        *markdown_table(summary["headline_table"]["columns"], summary["headline_table"]["rows"]),
        "",
        ((f"Screen rows: test p = sign-flip over (seed, task) pairs, Holm across the arms. Confirmation row: test p = "
          f"exact sign-flip over training seeds (the primary test). {BOOTSTRAP_NOTE}")
         if design.get("suite", "families") == "families" else
         ("Every row compares two arms from one pretrained checkpoint at the units that vary: structure groups (each "
          "the mean of its behaviours; behaviours of one group are correlated) and training (RL) seeds. Screen rows: "
          "the exact sign-flip test over groups (seeds averaged), Holm across the arms, which flags a candidate and "
          "decides nothing. The confirmation and the comparisons with the starting checkpoint: a direction needs "
          "groups and seeds after Holm over the phase's comparisons; `RL seeds and groups random p` takes both as "
          "random at once (stats.crossed_comparison). Pass rates and their difference describe; wins/ties/losses "
          "count seeds whose pass rate is higher / equal / lower.")),
        "",
    ]
    for chart in charts.values():
        lines += [f"![{chart}]({chart})", ""]
    lines += ["## Screen arms", ""]
    arm_rows = [[a["arm"], a["rollouts"], f"{a['updates']:.1f}", f"{a['exact_training_rollouts']:.1f}",
                 f"{a['solved']}/{a['tasks']}", f"{a['mean_pass_rate']:.1f}", f"{a['seconds']:.0f}"] for a in summary["arms"]]
    lines += [*markdown_table(["arm", "rollouts", "updates (mean)", "exact training rollouts (mean)", "dev solved (all seeds)",
                       "dev pass@1 %", "seconds per run"], arm_rows), ""]
    if summary["selection"]:
        lines += [(f"Selected for confirmation: **{summary['selection']['candidate']}** "
                  f"({summary['selection']['rule']})."), ""]
    confirmation = summary["confirmation"]
    if confirmation:
        lines += ["## Confirmation per seed", ""]
        lines += markdown_table(["seed", "baseline solved", f"{confirmation['candidate']} solved", "gains", "losses",
                         "McNemar p"], [[r["seed"], f"{r['baseline_solved']}/{r['tasks']}",
                                         f"{r['candidate_solved']}/{r['tasks']}", r["gains"], r["losses"],
                                         format_p(r["mcnemar_p"])] for r in confirmation["per_seed"]])
        mde = confirmation.get("mde")
        lines += ["", (f"Minimum detectable effect at {confirmation['n']} seeds (80% power, from the observed seed-level "
                      f"SD): {'n/a' if mde is None else f'{mde:.1f} points'}."), ""]
    if design.get("suite", "families") == "families":
        units = summary.get("units") or {}
        units_limit = ("- The tasks of a family compute one function (its two descriptions compute the same one), so "
                       + (" and ".join(f"the {u['tasks']} {split} tasks are {u['units']} unit{'s' if u['units'] != 1 else ''}"
                                   for split, u in units.items())
                          or "a split's tasks are as many units as it has families")
                       + "; task-level tests (McNemar, pooled sign-flip) overstate the evidence, and the seed-level "
                         "test is the primary one.")
    else:
        units_limit = ("- Behaviours of one structure group are correlated, so the unit is the group, not the task: "
                       "task-level tests (McNemar, pooled sign-flip) overstate the evidence.")
    lines += ["## Limits", "", units_limit,
              "- One pretraining checkpoint and one learning rate: the training seeds and the tasks vary here, the "
              "pretraining seed does not; the screen's few seeds only select a candidate.",
              ""]
    return lines


# --------------------------------------------------------------------------- the rerun


def check_rerun_design(first: dict, rerun: dict) -> None:
    check_same_design(first, rerun, STUDY, ("checkpoint", "checkpoint_sha256"),
                       "their starting checkpoint", False)
    if first["design"]["checkpoint_sha256"] == rerun["design"]["checkpoint_sha256"]:
        raise ValueError("a rerun starts from another pretraining seed's checkpoint; both studies start from the "
                         f"same weights ({first['design']['checkpoint_sha256'][:12]})")


def compare_rerun(first_plan: dict, first: dict, rerun_plan: dict, rerun: dict,
                   margin: float = RERUN_MARGIN) -> dict:
    """Two rl-choices studies from checkpoints of different pretraining seeds: the screen's choice in each, and
    per confirmation row (the candidate against the baseline; each arm against its starting checkpoint)
    whether it holds (the same arms and the same direction at alpha, or none, over the training seeds)
    and the rerun spread (Welch's t over the two sets of per-seed differences, independent because their
    runs start from different weights, with equivalence within `margin`). `first` and `rerun` are the
    studies' numbers as `compute` gives them."""
    from glm53_flash.core.stats import welch_comparison

    check_rerun_design(first_plan, rerun_plan)
    alpha = first_plan["analysis"]["alpha"]

    def directions(row) -> dict:
        """Per level, the direction after the study's Holm correction: on the compositions suite at the
        structure groups and the training seeds (the primary comparison), else over the training seeds."""
        if "holm" in row:
            return {level: "0" if row["holm"][level] >= alpha else
                    "+" if row["groups"][level]["mean"] > 0 else "-" for level in LEVELS}
        p = row.get("holm_p")
        return {"seeds": "0" if p is None or p >= alpha else "+" if row["mean"] > 0 else "-" if row["mean"] < 0 else "0"}

    def seed_values(row) -> list[float]:
        return row["groups"]["seeds"]["values"] if "groups" in row else [v / 100 for v in row["differences"]]

    def side(row) -> dict:
        out = {"mean": row["mean"], "holm_p": row.get("holm_p"), "n": row["n"]}
        if "groups" in row:
            out |= {"groups_mean": row["groups"]["mean_difference"], "holm": row["holm"], "result": row["result"],
                    "crossed_p": None if row["groups"]["crossed"] is None else row["groups"]["crossed"]["t_test_p"]}
        return out

    def confirmations(summary) -> list[dict]:
        rows = [summary["confirmation"]] if summary.get("confirmation") else []
        return rows + list(summary.get("versus_pretrained") or [])

    rows = []
    for a, b in zip(confirmations(first), confirmations(rerun)):
        same_arms = (a["left"], a["right"]) == (b["left"], b["right"])
        spread = welch_comparison(seed_values(a), seed_values(b), margin=margin, alpha=alpha) if same_arms else None
        da, db = directions(a), directions(b)
        rows.append({"name": a["name"], "rerun_name": b["name"], "first": side(a), "rerun": side(b),
                     "directions": {level: [da[level], db[level]] for level in da},
                     "holds": same_arms and da == db and a.get("result") == b.get("result"), "spread": spread})
    return {"study": STUDY,
            "first": {"plan_sha256": first_plan["plan_sha256"], "checkpoint_sha256": first_plan["design"]["checkpoint_sha256"],
                      "candidate": (first.get("confirmation") or {}).get("candidate")},
            "rerun": {"plan_sha256": rerun_plan["plan_sha256"], "checkpoint_sha256": rerun_plan["design"]["checkpoint_sha256"],
                      "candidate": (rerun.get("confirmation") or {}).get("candidate")},
            "alpha": alpha, "margin": margin, "rows": rows,
            "all_hold": bool(rows) and all(r["holds"] for r in rows),
            "rule": "a row holds when both studies compare the same arms and give the same direction (or none) at "
                    "alpha after their Holm correction, on the compositions suite at the structure groups and at the "
                    "training seeds (over the training seeds on the families suite); it reproduces its size when "
                    "Welch's 90% interval of the rerun's seed-level effect minus the first's lies within +- the margin "
                    "(two one-sided tests)"}


def rerun_report_lines(comparison: dict, first_name: str) -> list[str]:
    def result(side):
        if "holm" in side:  # the compositions suite: over structure groups, after Holm at groups and seeds
            return (f"{points(side['groups_mean'])} over groups, {side['result']} (Holm p {side['holm']['units']:.3g} / "
                    f"{side['holm']['seeds']:.3g})")
        return f"{side['mean']:+.1f} (Holm p {side['holm_p']:.3g})"

    lines = ["", f"## Against the first study (`{first_name}`, checkpoint {comparison['first']['checkpoint_sha256'][:12]})",
             "", f"Rule: {comparison['rule']}; margin {100 * comparison['margin']:.1f} points. Effects in points of "
                 "greedy pass@1 on the confirmation split.", "",
             "| comparison | first | rerun | holds (first / rerun) | rerun - first, 90% CI | within the margin |",
             "|---|---|---|---|---|---|"]
    for row in comparison["rows"]:
        spread = row["spread"]
        lines.append(
            f"| {row['name']} | {result(row['first'])} | {result(row['rerun'])} | "
            f"{'yes' if row['holds'] else 'NO'} ({', '.join('/'.join(d) for d in row['directions'].values())}) | "
            + spread_cells(spread) + " |")
    lines += ["", "`holds` lists each level's direction after Holm (on the compositions suite: structure groups, then "
                  "training seeds; `+` higher, `-` lower, `0` not shown) in the first study / the rerun.", ""]
    return lines


# --------------------------------------------------------------------------- the study's declaration


@dataclass(kw_only=True)
class RLChoicesStudyConfig(RerunnableStudyConfig):
    """Every knob of `glm53 experiment rl-choices`; the design in plan.json comes from these."""

    checkpoint: str = option(help="pretraining checkpoint directory every arm starts from")
    arms: tuple[str, ...] | None = option(None, parse=parse_name_list,
                                          help=f"comma-separated arms; {', '.join(ARMS)} (compositions also "
                                               f"{', '.join(COMPOSITIONS_ARMS)})",
                                          default_text="all of the suite's")
    seeds: tuple[int, ...] = option(DEFAULT_SCREEN_SEEDS, parse=parse_seed_range,
                                    help="screening training seeds: comma-separated or START:COUNT:STEP")
    confirm_seeds: tuple[int, ...] = option(DEFAULT_CONFIRM_SEEDS, parse=parse_seed_range,
                                            help="fresh training seeds for the confirmation",
                                            default_text="1001:10:1")
    suite: str = option("families", choices=("families", "compositions"),
                        help="task suite: families (the original's screen: dev, then the sealed final) or "
                             "compositions (compositions.dev, then the sealed compositions.unseen_structures; every "
                             "arm's budget x8 and a strong-reward arm)")
    tasks: int | None = option(None, help="evaluation tasks per family (families: 5 families) or of each split "
                                          "(compositions: a fixed subset by hash)",
                               default_text=f"{DEFAULT_TASKS_PER_FAMILY} per family, 100 per split (families); all "
                                            "(compositions)")
    confirm_arm: str | None = option(None, help="confirm this arm instead of the screen's winner",
                                     default_text="the screen's winner")
    precision: str = option("auto", choices=PRECISIONS,
                            help=PRECISION_HELP + "; part of the design; the compositions suite only (the families "
                                                  "screen keeps the original's default)")
    open_sealed: str | None = open_sealed_option("the confirmation evaluates the sealed split final: say why it is "
                                                 "opened (recorded in the ledger; `glm53 ledger`)",
                                                 "none: the confirmation is refused")
    reopen: str | None = reopen_option("open final again for a plan that already opened it (recorded in the ledger)")
    allow_dirty: bool = allow_dirty_option()
    ledger: str | None = ledger_option()

    def __post_init__(self) -> None:
        if self.arms is None:
            self.arms = tuple(arms_of(self.suite)) if self.suite in ("families", "compositions") else tuple(ARMS)
        self.arms, self.seeds, self.confirm_seeds = tuple(self.arms), tuple(self.seeds), tuple(self.confirm_seeds)

    def validate(self) -> None:
        super().validate()
        if self.precision != "auto" and self.suite != "compositions":
            raise ValueError(f"--precision {self.precision}: only the compositions suite's screen takes a precision; "
                             "the families screen runs the original's default")


def deck_figures(slide_id: str, summary: dict, directory: Path) -> tuple[list, bool]:
    """The screen and the confirmation, side by side, at the deck's sizes (each study's charts keep element
    ids of their own)."""
    from glm53_flash.core.receipts import read_json
    from glm53_flash.report import study_charts

    plan = directory / "plan.json"
    split = read_json(plan)["design"]["confirm_split"] if plan.is_file() else "confirmation"
    prefix = slide_id.removeprefix("research-")
    return [(study_charts.draw_rl_screen(summary, size=(7.4, 5.4)), f"{prefix}-screen",
             "dev greedy pass@1 of every RL arm per screening seed"),
            (study_charts.draw_rl_confirmation(summary, split, size=(5.6, 5.4)), f"{prefix}-confirmation",
             "baseline and candidate on the confirmation split, one line per fresh seed")], False


# What `make` runs of this study (the Makefile's generated block; recipe lines indented by four spaces a tab).
MAKE_TARGETS = (
    MakeTarget("study-rl-choices", r"""
# Which RL choices matter on the compositions suite (docs/STUDIES.md): the original's screen (every arm's budget
# x8, plus the strong reward) from our arm's study checkpoint of one pretraining seed, the screen's winner confirmed
# on fresh seeds and the sealed unseen compositions; the rerun from another pretraining seed; and the
# original's strongest lead, temperature 0.20, confirmed as fixed in advance from both.
RL_CHOICES_PURPOSE ?= make study-rl-choices: the compositions RL-choices confirmation
STUDY_PRETRAIN_FLAGS = --preset study --tasks compositions --steps 2500 --checkpoints 1500,2000,2500 --batch-size 32 \
    --learning-rate 2e-3 --warmup 100 --precision $(STUDY_PRECISION) --quiet
runs/study-pretrain-ours-%/checkpoint-2500/model.safetensors: | $(STAMP)
    $(BIN)/glm53 pretrain $(STUDY_PRETRAIN_FLAGS) --seed $* --output runs/study-pretrain-ours-$* \
        $$(test -d runs/study-pretrain-ours-$* && echo --resume)

study-rl-choices: runs/study-pretrain-ours-11/checkpoint-2500/model.safetensors
    $(BIN)/glm53 experiment rl-choices --suite compositions --checkpoint runs/study-pretrain-ours-11/checkpoint-2500 \
        --precision $(STUDY_PRECISION) --output runs/study-rl-choices --open-sealed "$(RL_CHOICES_PURPOSE), pretraining seed 11"
"""),
    MakeTarget("study-rl-choices-rerun", r"""
study-rl-choices-rerun: runs/study-pretrain-ours-12/checkpoint-2500/model.safetensors
    $(BIN)/glm53 experiment rl-choices --suite compositions --checkpoint runs/study-pretrain-ours-12/checkpoint-2500 \
        --precision $(STUDY_PRECISION) --output runs/study-rl-choices-rerun --rerun-of results/rl-choices-compositions \
        --open-sealed "$(RL_CHOICES_PURPOSE), pretraining seed 12 (the rerun)"
"""),
    MakeTarget("study-rl-choices-temperature", r"""
study-rl-choices-temperature: runs/study-pretrain-ours-11/checkpoint-2500/model.safetensors \
        runs/study-pretrain-ours-12/checkpoint-2500/model.safetensors
    for seed in 11 12; do \
        $(BIN)/glm53 experiment rl-choices --suite compositions --checkpoint runs/study-pretrain-ours-$$seed/checkpoint-2500 \
            --precision $(STUDY_PRECISION) --output runs/study-rl-choices-temperature-$$seed --arms baseline,temp-low --seeds 101 --confirm-arm temp-low \
            --confirm-seeds 2001:10:1 \
            --open-sealed "$(RL_CHOICES_PURPOSE): temperature 0.20 fixed in advance, pretraining seed $$seed" || exit 1; \
    done
"""),
)


def _precision(cfg: RLChoicesStudyConfig) -> str | None:
    """The compositions screen's precision, resolved on this machine (`auto`: bf16 where the CPU has it); the
    families screen runs the original's default."""
    from glm53_flash.core.runtime import resolve_device
    from glm53_flash.model.precision import resolve_precision

    return resolve_precision(cfg.precision, str(resolve_device(cfg.device))).name if cfg.suite == "compositions" else None


class RLChoices(Study):
    name = STUDY
    config = RLChoicesStudyConfig
    help = "which RLOO choices matter: a screen of arms, then a confirmation on fresh seeds"
    description = ("The original's eight RL arms (+ group-size arms at matched updates) from one pretraining "
                   "checkpoint, screened on dev over --seeds; the best arm (rule fixed in plan.json) is confirmed "
                   "against the baseline on --confirm-seeds (never a screening seed) and the final split, which no "
                   "other step of the study opens. Resumable: finished (arm, seed) runs are skipped. Analyse with "
                   "`glm53 analyze DIR`.")
    deck = (DeckEntry("research-rl-choices", "Research study: RL choices", "glm53 experiment rl-choices",
                      "rl-choices/summary.json", deck_figures),
            DeckEntry("research-rl-choices-compositions", "Research study: RL choices on the compositions suite",
                      "make study-rl-choices", "rl-choices-compositions/summary.json", deck_figures))
    make_targets = MAKE_TARGETS
    rerunnable = True

    def plan(self, cfg: RLChoicesStudyConfig, speed: tuple[float, float] | None) -> dict:
        from glm53_flash.model.pretrained import read_metadata

        checkpoint = Path(cfg.checkpoint)
        if not (checkpoint / "metadata.json").is_file() and not checkpoint.is_dir():
            raise FileNotFoundError(f"--checkpoint {checkpoint} does not exist; make a pretraining checkpoint with "
                                    "`glm53 pretrain --output runs/pretrain --steps 100` (or `make demo`)")
        return build_plan(str(checkpoint), read_metadata(checkpoint)["weights_sha256"], cfg.arms, cfg.seeds,
                          cfg.confirm_seeds, cfg.tasks, cfg.confirm_arm, cfg.workers, *(speed or (None, None)),
                          cfg.suite, _precision(cfg))

    def speed(self, cfg: RLChoicesStudyConfig, draft: dict) -> tuple[float, float]:
        return tuple(round(v, 4) for v in measure_speed(str(Path(cfg.checkpoint)), cfg.suite, _precision(cfg)))

    @contextlib.contextmanager
    def sealed_openings(self, cfg: RLChoicesStudyConfig, out: Path, draft: dict):
        # Every unit on a sealed split (the confirmation and its reference) runs under one opening, granted
        # here, before the study directory is touched: a missing --open-sealed costs no training.
        yield None if cfg.plan_only else sealed_opening(cfg, out, draft)

    def run(self, session) -> int:
        """The screen (and references), then the planned selection (selection.json), then the confirmation;
        units on a sealed split run under the opening."""
        plan, work = session.plan, session.work_dir(resolve=False)
        first = [u | {"work_dir": str(work / u["key"])} for u in plan["units"] if u["phase"] != "confirm"]
        ran = session.run(first, run_unit, session.openings)
        confirm = [u for u in plan["units"] if u["phase"] == "confirm"]
        if confirm:
            selection = session.decide(lambda receipts: select_candidate(plan, receipts))
            print(f"rl-choices: confirmation candidate = {selection['candidate']} ({selection['rule']})",
                  file=sys.stderr)
            resolved = [u | {"arm": "baseline" if u["role"] == "baseline" else selection["candidate"],
                             "work_dir": str(work / u["key"])} for u in confirm]
            ran += session.run(resolved, run_unit, session.openings)
        session.remove_empty_work_dir()  # each unit removes its own; another shard may still run
        return ran

    def analyze(self, out: Path, plan: dict, receipts: list[dict]) -> tuple[dict, list[str], dict]:
        return analyze(out, plan, receipts)

    def answer(self, plan: dict, summary: dict) -> str:
        """The confirmation (the candidate against the baseline on fresh seeds, from one pretrained checkpoint)
        and each arm against that checkpoint, each after the study's Holm correction at the levels it tests:
        structure groups and RL seeds on the compositions suite, RL seeds on the families suite."""
        from glm53_flash.report.format import format_signed

        design, alpha = plan["design"], plan["analysis"]["alpha"]
        compositions = design.get("suite", "families") != "families"
        levels = "groups and RL seeds" if compositions else "RL seeds"

        def row(r, label):
            if compositions:
                return (f"{label} {_points(r['groups']['mean_difference'])} points over structure groups",
                        r["result"] != "not shown")
            return f"{label} {format_signed(r['mean'])} points", r.get("holm_p") is not None and r["holm_p"] <= alpha

        sentences = []
        confirmation = summary.get("confirmation")
        if confirmation is not None and confirmation["n"]:
            sentences.append(after_holm_sentence(
                f"From one pretrained checkpoint, {confirmation['candidate']} against the baseline on "
                f"{confirmation['n']} fresh RL seeds ({design['confirm_split']})",
                [row(confirmation, confirmation["candidate"])], 1, levels))
        versus = [v for v in summary.get("versus_pretrained") or [] if v["n"]]
        if versus:
            sentences.append(after_holm_sentence(f"RL against the starting checkpoint on {design['confirm_split']}",
                                                 [row(v, v["right"]) for v in versus], len(versus), levels))
        return " ".join(sentences) or "No confirmation has finished: no answer yet."

    def check_rerun(self, first_plan: dict, plan: dict) -> None:
        check_rerun_design(first_plan, plan)

    def compare_rerun(self, first_plan: dict, first_receipts: list[dict], plan: dict, receipts: list[dict]) -> dict:
        check_rerun_design(first_plan, plan)
        return compare_rerun(first_plan, compute(Path("."), first_plan, first_receipts),
                             plan, compute(Path("."), plan, receipts))

    def rerun_report_lines(self, comparison: dict, first_name: str) -> list[str]:
        return rerun_report_lines(comparison, first_name)


__all__ = ["ARMS", "BASE_ARM", "COMPOSITIONS_ARMS", "COMPOSITIONS_RECIPE", "RECIPE", "SPLITS", "STUDY", "SUITES",
           "RLChoices", "RLChoicesStudyConfig", "analyze", "arm_settings", "arms_of", "build_plan",
           "check_rerun_design", "compare_rerun", "compute", "group_comparison", "measure_speed", "recipe_for",
           "rerun_report_lines", "run_unit", "select_candidate"]
