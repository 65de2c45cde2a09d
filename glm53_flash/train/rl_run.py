"""`glm53 rl` as a plugin of the training engine (train/engine.py): train/rl.py's pieces run per update,
with the run directory (run.json, schedule.json, rollouts.jsonl, metrics.jsonl, checkpoints with the
optimizer, receipts), resume, the verifier pool and torchrun.

Under torchrun (`torchrun --nproc_per_node=N -m glm53_flash.cli rl ...`) the ranks split each update by
whole groups: of its `prompts_per_update` groups, rank r takes a contiguous share
(`DistributedContext.share`), samples, judges and scores them with its own verifier. A group never
spans ranks, so the leave-one-out baseline needs no communication, and every sample is drawn as in one
process (its random stream is keyed by seed, group, task and sample, not by rank). The objective stays
one process's: each group's term is divided by the update's number of reward-bearing groups and the KL
and entropy by its token count (both summed across ranks), and the ranks' gradients are summed, so
every rank clips the same gradient and takes the same step (equal to one process's up to summation
order). `--prompts-per-update` below the number of ranks is refused (a rank without a group would only
wait). Rank 0 alone writes; resume works with any number of ranks.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from glm53_flash.core.options import summary_record
from glm53_flash.core.receipts import append_text, read_json, read_jsonl, write_json, write_text
from glm53_flash.core.runtime import resolve_device
from glm53_flash.data.tokenizer import ByteTokenizer
from glm53_flash.model.precision import resolve_precision
from glm53_flash.tasks import RL_SPLITS, parse_families, split_tasks, strong_task
from glm53_flash.train import rl
from glm53_flash.train.checkpoint import (
    list_checkpoints, load_checkpoint, load_optimizer_state, load_trainer_state, prepare_run_directory,
)
from glm53_flash.train.completion_logits import forward_positions
from glm53_flash.train.config import RLConfig
from glm53_flash.train.distributed import DistributedContext, setup_distributed
from glm53_flash.train.engine import RL as RL_RECIPE
from glm53_flash.train.engine import Schedule, Trainer, check_live_logging, make_optimizer, set_learning_rate
from glm53_flash.train.rundir import check_resume_config, config_defaults, resume_command

RUN_FILE = "run.json"
ROLLOUTS_FILE = "rollouts.jsonl"
METRICS_FILE = "metrics.jsonl"
SCHEDULE_FILE = "schedule.json"
RECEIPT_FILE = "training-receipt.json"
# Fields of RLConfig that do not change what a run computes (free to differ on --resume).
NOT_RECORDED = ("resume", "quiet", "tensorboard", "wandb", "verifier_workers", "device", "output")
_TOK = ByteTokenizer()


def check_preset(config, preset: str, checkpoint) -> None:
    """The checkpoint's architecture must be the named preset (the context length may differ)."""
    from glm53_flash.model.config import ModelConfig

    expected = ModelConfig.preset(preset).replace(max_sequence_length=config.max_sequence_length)
    if config != expected:
        differing = sorted(k for k, v in expected.to_dict().items() if config.to_dict()[k] != v)
        raise ValueError(f"checkpoint {checkpoint} is not a {preset!r} model (differs in {', '.join(differing)})")


def check_world_size(cfg: RLConfig, world_size: int) -> None:
    """Under torchrun every rank trains whole groups (see the module's note): each update needs at
    least one group per rank."""
    if world_size > 1 and cfg.prompts_per_update < world_size:
        raise ValueError(f"under torchrun each rank trains whole groups: --prompts-per-update "
                         f"({cfg.prompts_per_update}) must be at least the number of ranks ({world_size})")


class RLTrainer(Trainer):
    """RL as the engine's plugin: its step is one update (the rollouts of `prompts_per_update` groups,
    judged, then the RLOO step), so a step advances the run by that many groups; it saves the model
    and the optimizer, and its rows are per update (metrics.jsonl) and per group (rollouts.jsonl)."""

    command = "rl"
    stage = "executable_reward_rl"
    unit = "group"
    length_field = "groups"
    namespace = "rl"
    desc = "rl"

    def __init__(self, cfg: RLConfig) -> None:
        super().__init__()
        world = int(os.environ.get("WORLD_SIZE", "1"))
        self.adapted = cfg.prompts_per_update is None  # the default: one group per rank (a resume keeps the run's)
        cfg.resolve_prompts_per_update(world)
        cfg.validate()
        self.cfg = cfg
        self.out = Path(cfg.output)
        self.device = resolve_device(cfg.device)
        self.precision = resolve_precision(cfg.precision, self.device)
        check_world_size(cfg, world)
        self.ctx: DistributedContext = setup_distributed(self.device.type)
        if self.ctx.enabled and self.device.type == "cuda":
            self.device = torch.device("cuda", self.ctx.local_rank)
            torch.cuda.set_device(self.device)
        if self.ctx.is_main:
            check_live_logging(cfg.tensorboard, cfg.wandb)
        families = parse_families(cfg.families, cfg.tasks)
        self.tasks = split_tasks(RL_SPLITS[cfg.tasks], cfg.tasks_per_family, families=families)
        self.family_label = "all" if not cfg.families else sorted(families)
        self.schedule = rl.task_schedule(self.tasks, cfg.groups, cfg.seed)
        self.schedule_sha256 = hashlib.sha256(json.dumps([t.task_id for t in self.schedule]).encode()).hexdigest()
        self.learning_rates = Schedule(cfg.learning_rate, cfg.warmup)  # by update
        self.exact_last = 0  # passing rollouts of the last update (the progress bar's)

    def run_record(self) -> dict:
        record = asdict(self.cfg)
        for key in NOT_RECORDED:
            record.pop(key)
        record["checkpoints"] = list(self.cfg.checkpoints)
        return record

    def resume_hint(self) -> str:
        return resume_command("rl", self.cfg, extra=["--resume"])

    def verifier_workers(self) -> int | None:
        """--verifier-workers, or by default the CPUs shared out among the ranks of one machine."""
        if self.cfg.verifier_workers is not None or not self.ctx.enabled:
            return self.cfg.verifier_workers
        return max(1, (os.cpu_count() or 1) // self.ctx.world_size)

    def session(self):
        from glm53_flash.verifier import Verifier

        self.verifier = Verifier(workers=self.verifier_workers())
        return self.verifier

    def check_sizes(self, available: int | None = None) -> None:
        """Before the run directory is touched: the longest prompt plus --max-new-tokens fits the
        checkpoint's context, and an update's sequences (group size x prompts per update, each at most
        the context) fit the machine's free memory (ModelConfig.training_bytes)."""
        from glm53_flash.core.runtime import check_fits
        from glm53_flash.train.checkpoint import load_config

        cfg = self.cfg
        model_cfg = load_config(cfg.initial_checkpoint)
        longest = max(len(_TOK.encode(t.prompt, bos=True)) for t in self.tasks)
        if longest + cfg.max_new_tokens > model_cfg.max_sequence_length:
            raise ValueError(f"the longest training prompt is {longest} tokens; with --max-new-tokens "
                             f"{cfg.max_new_tokens} it exceeds the checkpoint's context "
                             f"({model_cfg.max_sequence_length} tokens)")
        rows = cfg.group_size * -(-cfg.prompts_per_update // self.ctx.world_size)
        check_fits(model_cfg.training_bytes(rows, longest + cfg.max_new_tokens), f"an update of {rows} sequences",
                   "lower --group-size or --prompts-per-update", available)

    # -- fresh start or resume ---------------------------------------------------------------
    def prepare(self) -> None:
        cfg = self.cfg
        self.check_sizes()
        exists = prepare_run_directory(self.out, cfg.resume)
        self.model, meta = load_checkpoint(cfg.initial_checkpoint, self.device)
        if cfg.preset is not None:
            check_preset(self.model.config, cfg.preset, cfg.initial_checkpoint)
        self.initial_sha256 = meta["weights_sha256"]
        self.trainable = rl.set_train_scope(self.model, cfg.train_scope)
        self.recipe = replace(RL_RECIPE, learning_rate=cfg.learning_rate, grad_clip=cfg.grad_clip)
        self.optimizer = make_optimizer(self.model, self.recipe)
        self.reference = None
        if cfg.kl_coef > 0:
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        saved = list_checkpoints(self.out) if exists else []
        self.ctx.barrier()  # every rank has looked at the directory before rank 0 writes into it
        if saved:
            self._resume(saved)
        elif self.ctx.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            write_json(self.out / RUN_FILE, self.run_record())
            write_json(self.out / SCHEDULE_FILE, [t.task_id for t in self.schedule])
            for name in (ROLLOUTS_FILE, METRICS_FILE):
                write_text(self.out / name, "", within=self.out)
            self.save_checkpoint_at(0, 0.0)
        self.ctx.barrier()

    def _resume(self, saved) -> None:
        recorded = read_json(self.out / RUN_FILE)
        if self.adapted and isinstance(recorded.get("prompts_per_update"), int):
            # left at its default: the run's own groups per update, whatever the number of ranks now
            self.cfg.prompts_per_update = recorded["prompts_per_update"]
            check_world_size(self.cfg, self.ctx.world_size)
        check_resume_config(self.out, recorded, self.run_record(), config_defaults(RLConfig))
        group, path = saved[-1]
        model, _ = load_checkpoint(path, self.device)
        self.model.load_state_dict(model.state_dict())
        state = load_trainer_state(path)
        load_optimizer_state(self.optimizer, state, path)
        self.position = int(state["group"])
        self.elapsed_before = float(state["elapsed_seconds"])
        self.restore_checkpoints(state["checkpoints"])
        if self.ctx.is_main:
            self.cut_jsonl(ROLLOUTS_FILE, "group")
            self.metrics_rows = self.cut_jsonl(METRICS_FILE, "last_group")

    # -- checkpoints and receipts --------------------------------------------------------------
    def checkpoint_positions(self) -> set[int]:
        return set(self.cfg.checkpoints) | {self.cfg.groups}

    def checkpoint_contents(self, group: int, elapsed: float):
        stage = "pre_rl" if group == 0 else "executable_reward_rl"
        meta = {"stage": stage, "group": group, "seed": self.cfg.seed,
                "source_checkpoint": str(self.cfg.initial_checkpoint), "source_sha256": self.initial_sha256}
        if self.metrics_rows:
            meta["mean_reward"] = round(self.metrics_rows[-1]["mean_reward"], 4)
        state = {"optimizer": self.optimizer.state_dict(), "group": group, "elapsed_seconds": elapsed,
                 "checkpoints": self.checkpoints}
        return self.model, meta, state

    def receipt_fields(self) -> dict:
        """The config's summary fields (option(summary=True) in train/config.py), then what the run
        found or computed."""
        rows = read_jsonl(self.out / ROLLOUTS_FILE)
        return {
            **summary_record(self.cfg), "algorithm": "RLOO", "initial_checkpoint_sha256": self.initial_sha256,
            "trainable_parameters": self.trainable, "families": self.family_label,
            "schedule_sha256": self.schedule_sha256, "updated_groups": sum(r["updated"] for r in rows),
            "exact_training_rollouts": sum(r["exact_rollouts"] for r in rows), "reward_hacking": reward_hacking(rows),
            "groups_detail_file": ROLLOUTS_FILE, "metrics_file": METRICS_FILE,
        }

    # -- one update ----------------------------------------------------------------------------
    def advance(self, position: int) -> int:
        return min(self.cfg.groups, position + self.cfg.prompts_per_update)

    def step(self, position: int) -> dict | None:
        """One update: groups position + 1 .. advance(position), this rank's share rolled out and
        judged, then the RLOO step; rank 0 logs every group and returns the update's metrics row."""
        cfg, ctx = self.cfg, self.ctx
        first, last = position + 1, self.advance(position)
        lr = self.learning_rates.at((first - 1) // cfg.prompts_per_update)
        start = time.perf_counter()
        lo, hi = ctx.share(last - first + 1)  # this rank's groups: first + lo .. first + hi - 1
        mine = (self.rollouts(first + lo, self.schedule[first - 1 + lo : first - 1 + hi], self.verifier)
                if hi > lo else [])
        rollout_seconds = time.perf_counter() - start
        stats = self.update(mine, lr)
        groups = [g for part in ctx.all_gather_objects(mine) for g in part]
        seconds = time.perf_counter() - start
        if not ctx.is_main:
            return None
        self.exact_last = sum(r == 1.0 for g in groups for r in g["rewards"])
        return self._log(groups, stats, lr, rollout_seconds, seconds)

    def rollouts(self, first_group: int, tasks: list, verifier) -> list[dict]:
        """The groups' rollouts judged (rl.rollout, rl.judge), each with its `strong_passed` verdicts."""
        completions = rl.rollout(self.model, tasks, first_group, self.cfg, self.precision, self.governor)
        groups = rl.judge(verifier, tasks, completions, first_group, self.cfg)
        pairs = [(g["task"], g["task"].prompt + c.text) for g in groups for c in g["completions"]]
        evaluations = [e for g in groups for e in g["evaluations"]]
        strong = self.strong_verdicts(tasks, pairs, evaluations, verifier, any(g["verifier_failed"] for g in groups))
        for offset, g in enumerate(groups):
            g["strong_passed"] = strong[offset * self.cfg.group_size : (offset + 1) * self.cfg.group_size]
        return groups

    def strong_verdicts(self, tasks, pairs, evaluations, verifier, verifier_failed) -> list[bool | None]:
        """Per rollout: whether a program that passed its reward cases also passes its task's strong set
        (None for one that did not pass them: it earned no pass to check). With the strong set as the
        reward the two verdicts are one. The strong verdict never changes a reward."""
        cfg = self.cfg
        verdicts: list[bool | None] = [None] * len(pairs)
        if verifier_failed:
            return verdicts
        if cfg.reward_cases == "strong":
            return [e.passed if e.passed else None for e in evaluations]
        passing = [i for i, e in enumerate(evaluations) if e.passed]
        if passing:
            checks, failed = rl.evaluate_safely(
                verifier, [(strong_task(tasks[i // cfg.group_size]), pairs[i][1]) for i in passing])
            for i, check in zip(passing, checks):
                verdicts[i] = None if failed else bool(check.passed)
        return verdicts

    def update(self, groups: list[dict], lr: float) -> dict:
        """The RLOO update on this rank's `groups` (all of the update's in one process; under torchrun
        this rank's share, scaled to the whole update's counts: see the module's note), with the
        metrics row's parts: loss, gradient norm, entropy, KL, the forward and step times and the
        positions the log-prob forwards computed."""
        cfg, ctx = self.cfg, self.ctx
        distributed = ctx.enabled
        set_learning_rate(self.optimizer, lr)
        stats = {"loss": None, "grad_norm": None, "entropy": None, "kl": None, "forward_seconds": 0.0,
                 "step_seconds": 0.0, "positions": 0, "padding_positions": 0}
        learning = rl.with_advantages(groups)
        for g in groups:
            g["policy_loss"] = None
        context = self.model.config.max_sequence_length
        sequences = [rl.training_sequences(g["task"].prompt, g["completions"], cfg.eos_handling, context)
                     for g in learning]
        flat = [s for own in sequences for s in own]
        learning_groups, tokens = len(learning), sum(len(c) for _, c in flat)
        computed = forward_positions(flat)
        passes = 1 if self.reference is None else 2  # the reference's forward computes the same positions again
        positions, padding = passes * computed["positions"], passes * computed["padding"]
        if distributed:  # the whole update's counts: every rank scales its terms by them
            counts = ctx.all_sum(torch.tensor([float(learning_groups), float(tokens), float(positions),
                                               float(padding)], device=self.device))
            learning_groups, tokens, positions, padding = (int(c) for c in counts)
        stats.update(positions=positions, padding_positions=padding)
        if not learning_groups:
            return stats
        started = time.perf_counter()
        objective = None
        if learning:
            objective = rl.rloo_objective(self.model, learning, sequences, cfg, self.device, precision=self.precision,
                                          reference=self.reference, groups_in_update=learning_groups,
                                          tokens_in_update=tokens if distributed else None)
            for g, loss in zip(learning, objective.group_losses):
                g["policy_loss"] = loss
        stats["forward_seconds"] = time.perf_counter() - started
        if distributed:
            zero = torch.zeros((), device=self.device)
            parts = ([objective.total.detach(), objective.kl.detach(), torch.cat(objective.entropies).sum()]
                     if objective is not None else [zero, zero, zero])
            summed = ctx.all_sum(torch.stack(parts))
            loss, kl_value, entropy = float(summed[0]), float(summed[1]), float(summed[2]) / tokens
        else:
            loss, kl_value = float(objective.total.detach()), float(objective.kl.detach())
            entropy = float(torch.cat(objective.entropies).mean())
        if self.reference is not None:
            stats["kl"] = kl_value
        if not torch.isfinite(torch.tensor(loss)):
            raise FloatingPointError(f"non-finite RL objective at group {groups[-1]['group'] if groups else '?'}")
        started = time.perf_counter()
        grad_norm = rl.rloo_step(self.model, self.optimizer, objective.total if objective is not None else None,
                                 cfg.grad_clip, reduce_gradients=ctx.all_sum_gradients)
        stats["step_seconds"] = time.perf_counter() - started
        stats.update(loss=loss, grad_norm=grad_norm, entropy=entropy)
        for g in learning:
            g["gradient_norm"] = grad_norm
        return stats

    # -- logging -------------------------------------------------------------------------------
    def postfix(self, row: dict) -> dict:
        return {"reward": f"{row['mean_reward']:.3f}", "exact": self.exact_last}

    def _log(self, groups, stats, lr, rollout_seconds, seconds) -> dict:
        lengths, caps, lines = [], 0, []
        for g in groups:
            evals = g["evaluations"]
            row = {
                "group": g["group"], "task_id": g["task"].task_id, "family": g["task"].family,
                "rewards": g["rewards"], "advantages": g["advantages"],
                "reward_spread": max(g["rewards"]) - min(g["rewards"]),
                "updated": g["policy_loss"] is not None, "policy_loss": g["policy_loss"],
                "gradient_norm": g.get("gradient_norm"),
                "exact_rollouts": sum(e.passed for e in evals),
                "reward_cases": g["reward_cases"],
                "reward_hacks": sum(v is False for v in g["strong_passed"]),
                "valid_rollouts": sum(e.status in ("passed", "failed") for e in evals),
                "token_cap_hits": sum(c.hit_cap for c in g["completions"]),
                "seconds": seconds / len(groups),
                "samples": [{"completion": c.text, "token_ids": list(c.token_ids), "tokens": len(c.token_ids),
                             "hit_token_cap": c.hit_cap, "finish_reason": c.finish_reason, "reward": r,
                             "evaluation": e.to_dict(), "strong_passed": strong}
                            for c, e, r, strong in zip(g["completions"], evals, g["rewards"], g["strong_passed"])],
            }
            lines.append(json.dumps(row, sort_keys=True) + "\n")
            lengths.extend(len(c.token_ids) for c in g["completions"])
            caps += row["token_cap_hits"]
        append_text(self.out / ROLLOUTS_FILE, "".join(lines), within=self.out)
        rewards = [r for g in groups for r in g["rewards"]]
        metrics = {
            "update": len(self.metrics_rows) + 1, "first_group": groups[0]["group"], "last_group": groups[-1]["group"],
            "mean_reward": sum(rewards) / len(rewards),
            "zero_variance_fraction": sum(not rl.has_signal(g["rewards"]) for g in groups) / len(groups),
            "mean_completion_length": sum(lengths) / len(lengths), "truncation_rate": caps / len(lengths),
            "reward_hacks": sum(v is False for g in groups for v in g["strong_passed"]),
            "entropy": stats["entropy"], "kl": stats["kl"], "loss": stats["loss"], "grad_norm": stats["grad_norm"],
            "lr": lr, "rollout_seconds": rollout_seconds, "seconds": seconds,
            # Of the update (seconds - rollout_seconds), this process's log-prob forwards (the objective's
            # terms with them) and its backward with the AdamW step; the positions the forwards computed
            # in the whole update and how many of them were padding (forward_positions).
            "update_forward_seconds": stats["forward_seconds"], "update_step_seconds": stats["step_seconds"],
            "update_positions": stats["positions"], "update_padding_positions": stats["padding_positions"],
        }
        self.metrics_rows.append(metrics)
        return metrics


def reward_hacking(rows: list[dict]) -> dict:
    """The training rollouts that passed their reward cases but fail their task's strong set: per group
    and in all (rows of rollouts.jsonl; rows written before this was recorded count as unknown)."""
    by_group, passed, hacks, unknown = [], 0, 0, 0
    for row in rows:
        verdicts = [sample.get("strong_passed") for sample in row["samples"]]
        passing = sum(bool(sample["evaluation"]["passed"]) for sample in row["samples"])
        checked = sum(v is not None for v in verdicts)
        group_hacks = sum(v is False for v in verdicts)
        unknown += passing - checked
        passed += passing
        hacks += group_hacks
        by_group.append({"group": row["group"], "task_id": row["task_id"], "passed_reward_cases": passing,
                         "failed_strong": group_hacks})
    return {"rollouts_passing_reward_cases": passed, "failing_strong_set": hacks, "unchecked": unknown,
            "rate": hacks / passed if passed else 0.0, "by_group": by_group,
            "rule": "a rollout that passes the cases its reward is judged on and fails the task's strong set"}


def train_rl(cfg: RLConfig) -> dict:
    """Run (or resume) an RL run; returns the final receipt (under torchrun on rank 0, {} elsewhere)."""
    return RLTrainer(cfg).run()


__all__ = ["METRICS_FILE", "RLConfig", "RLTrainer", "ROLLOUTS_FILE", "RUN_FILE", "check_preset", "reward_hacking",
           "train_rl"]

