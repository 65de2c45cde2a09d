"""Pretraining on the compatible task stream: AdamW, checkpoints, exact resume, receipts, DDP.

The original's flags and defaults (400 steps, checkpoints 100/200/400, batch 32 x 128, lr 3e-4,
seed 42, AdamW betas 0.9/0.95, weight decay 0.1, loss = token cross-entropy + 0.01 x balance).
Differences: weight decay on matrices only, an optional warmup/cosine schedule, a balance loss with
gradients, per-step metrics, receipts at every checkpoint, and resume that reproduces the loss curve
bit for bit. `Pretrainer` is a plugin of the training engine (train/engine.py): its step is one
`language_model_update` (train/objective.py, recipe `PRETRAINING`); the engine runs the loop, the
lock, checkpoints, resume and receipts.
"""

from __future__ import annotations

import hashlib
import random
import time
from dataclasses import replace
from pathlib import Path

import torch

from glm53_flash.data.batches import IGNORE_INDEX, pretraining_rows, rows_to_batch
from glm53_flash.model import GLM53Flash
from glm53_flash.core.receipts import read_json, write_json, write_text
from glm53_flash.core.runtime import resolve_device
from glm53_flash.model.precision import resolve_precision
from glm53_flash.train.config import SCHEDULES, PretrainConfig  # noqa: F401 - re-exported
from glm53_flash.train.checkpoint import (
    list_checkpoints, load_checkpoint, load_optimizer_state, load_trainer_state, prepare_run_directory,
)
from glm53_flash.train.distributed import DistributedContext, setup_distributed
from glm53_flash.train.engine import (  # noqa: F401 - parameter_groups and TrainingDiverged are re-exported
    PRETRAINING, Schedule, Trainer, TrainingDiverged, UpdateRecipe, check_live_logging, parameter_groups,
)
from glm53_flash.train.engine import make_optimizer as make_recipe_optimizer
from glm53_flash.train.objective import language_model_update
from glm53_flash.train.rundir import check_resume_config, config_defaults, resume_command

RUN_FILE = "run.json"
# Validation batches come from the stream drawn with data_seed + this offset (`--eval-every`).
VALIDATION_SEED_OFFSET = 1_000_003
METRICS_FILE = "metrics.jsonl"
RECEIPT_FILE = "training-receipt.json"
# Fields that must match for --resume to continue a run (steps and checkpoints may change when the
# schedule allows it: see `Pretrainer._check_length_change`).
RESUME_FIELDS = ("preset", "steps", "batch_size", "sequence_length", "learning_rate", "seed", "data_seed",
                 "tasks", "warmup", "schedule", "weight_decay", "decay_all_parameters", "model_overrides",
                 "checkpoints")
LENGTH_FIELDS = ("steps", "checkpoints")
MAX_RUN_FILE_BYTES = 1 << 20  # run.json is a few hundred bytes


def resumed_config(cfg: PretrainConfig, given: frozenset[str] | set[str]) -> PretrainConfig:
    """`--resume` as `glm53 pretrain --output DIR --resume` means it: every run-shaping field
    (RESUME_FIELDS) whose flag is not in `given` takes the value DIR's run.json recorded, so the run
    continues with its own settings; a given flag that differs is then refused by the resume check,
    naming it (`--steps` may change the length where the schedule allows). Without run.json (nothing to
    resume yet) `cfg` is returned as it is."""
    path = Path(cfg.output) / RUN_FILE
    if not cfg.resume or not path.is_file():
        return cfg
    if path.stat().st_size > MAX_RUN_FILE_BYTES:
        raise ValueError(f"--resume: {path} has more than {MAX_RUN_FILE_BYTES:,} bytes; it is not a run record")
    recorded = read_json(path, ValueError, "--resume: {path} is corrupt")
    if not isinstance(recorded, dict):
        raise ValueError(f"--resume: {path} is corrupt (not a JSON object)")
    taken = {name: recorded[name] for name in RESUME_FIELDS if name not in given and name in recorded}
    if "checkpoints" in taken:
        steps = taken.get("steps", cfg.steps)  # a new --steps keeps the checkpoints that still lie within it
        taken["checkpoints"] = tuple(step for step in taken["checkpoints"] if step <= steps)
    if "model_overrides" in taken and not isinstance(taken["model_overrides"], dict):
        raise ValueError(f"--resume: {path} is corrupt (model_overrides is not an object)")
    return replace(cfg, **taken)


def schedule(cfg: PretrainConfig) -> Schedule:
    """The run's learning-rate schedule: linear warmup, then constant or cosine down to min_lr_ratio x lr."""
    return Schedule(cfg.learning_rate, cfg.warmup, cfg.schedule, cfg.steps, cfg.min_lr_ratio)


def learning_rate_at(step: int, cfg: PretrainConfig) -> float:
    """LR for 0-based `step`."""
    return schedule(cfg).at(step)


def update_recipe(cfg: PretrainConfig) -> UpdateRecipe:
    return replace(PRETRAINING, learning_rate=cfg.learning_rate, weight_decay=cfg.weight_decay,
                   grad_clip=cfg.grad_clip, decay_all_parameters=cfg.decay_all_parameters)


def make_optimizer(model: GLM53Flash, cfg: PretrainConfig) -> torch.optim.AdamW:
    return make_recipe_optimizer(model, update_recipe(cfg))


def data_sha256(cfg: PretrainConfig) -> str:
    """Hash of every token of every batch the run will see (the stream is a pure function of its seed)."""
    digest = hashlib.sha256()
    for step in range(cfg.steps):
        digest.update(pretraining_rows(step * cfg.batch_size, cfg.batch_size, cfg.sequence_length,
                                       cfg.data_seed, cfg.tasks).astype("<i2").tobytes())
    return digest.hexdigest()


class Pretrainer(Trainer):
    """Pretraining as the engine's plugin: its step is one `language_model_update` on the stream's
    batch; it saves the model, the optimizer, both random states and the data position, and may
    change its length on resume where the schedule allows it."""

    command = "pretrain"
    stage = "coding_pretraining"
    desc = "pretrain"

    def __init__(self, cfg: PretrainConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.out = Path(cfg.output)
        self.device = resolve_device(cfg.device)
        self.ctx: DistributedContext = setup_distributed(self.device.type)
        if self.ctx.enabled and self.device.type == "cuda":
            self.device = torch.device("cuda", self.ctx.local_rank)
            torch.cuda.set_device(self.device)
        cfg.validate(self.ctx.world_size)
        if cfg.compile and self.device.type == "cpu":
            raise ValueError("--compile is for CUDA: on the CPU torch.compile spends longer compiling than a short "
                             "run trains and its kernels step around ours; leave it off on the CPU")
        if self.ctx.is_main:
            check_live_logging(cfg.tensorboard, cfg.wandb)
        self.recipe = update_recipe(cfg)
        self.schedule = schedule(cfg)
        self.precision = resolve_precision(cfg.precision, self.device)
        self.rows_per_rank = cfg.batch_size // self.ctx.world_size
        self.length_changes: list[dict] = []
        self.raw_model = None

    # -- setup ------------------------------------------------------------------------------------
    def data_record(self) -> dict:
        """The receipt's account of the data: the stream's suite and seed, the examples and the sha256 of
        every token; for the compositions suite also the sha256 of its pretraining behaviours."""
        cfg = self.cfg
        record = {"seed": cfg.data_seed, "examples": cfg.steps * cfg.batch_size, "sha256": self.data_hash}
        if cfg.tasks != "families":  # the original suite's receipts keep their keys
            from glm53_flash.tasks import compositions

            record.update(tasks=cfg.tasks, suite_version=compositions.VERSION,
                          behaviours_sha256=compositions.split_sha256(compositions.PRETRAIN_SPLIT))
        return record

    def run_record(self) -> dict:
        record = {k: getattr(self.cfg, k) for k in RESUME_FIELDS}
        record["checkpoints"] = list(self.cfg.checkpoints)
        return record

    def resume_hint(self) -> str:
        overrides = [word for name, value in self.cfg.model_overrides.items()
                     for word in ("--" + name.replace("_", "-"), str(value))]
        return resume_command("pretrain", self.cfg, extra=[*overrides, "--resume"])

    def can_mark_interrupted(self) -> bool:
        return self.raw_model is not None and (self.out / RUN_FILE).exists()

    def prepare(self) -> None:
        cfg = self.cfg
        exists = prepare_run_directory(self.out, cfg.resume)
        saved = list_checkpoints(self.out) if exists else []
        # Every rank has looked at the directory before rank 0 writes into it (_fresh, save_checkpoint_at):
        # a rank that looked later would take a fresh run for an existing one.
        self.ctx.barrier()
        if exists and saved:
            self._resume(saved)
        else:
            self._fresh()
        self._wrap_model()
        self.raw_model.train()

    def _fresh(self) -> None:
        cfg = self.cfg
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        self.raw_model = GLM53Flash(cfg.model_config()).to(self.device)
        self.optimizer = make_optimizer(self.raw_model, cfg)
        if self.ctx.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            write_json(self.out / RUN_FILE, self.run_record())
            write_text(self.out / METRICS_FILE, "", within=self.out)
            self.save_checkpoint_at(0, 0.0)
        self.ctx.barrier()

    def _check_length_change(self, recorded: dict, last_saved: int) -> None:
        """A run may change its --steps on resume only when that changes no step already taken: the
        learning rate of every step must not depend on the run's length, and the new end must not
        lie before the newest checkpoint."""
        cfg, old = self.cfg, recorded["steps"]
        verb = "extend" if cfg.steps > old else "shorten"
        if self.schedule.depends_on_length:
            raise ValueError(f"--resume --steps {cfg.steps}: cannot {verb} {self.out} ({old} steps): its "
                             f"{cfg.schedule} schedule sets every step's learning rate from --steps; only a "
                             "constant schedule (after warmup) can change length; start a new run")
        if cfg.steps < last_saved:
            raise ValueError(f"--resume --steps {cfg.steps}: {self.out} already has a checkpoint at step "
                             f"{last_saved}; --steps must be at least that")

    def _resume(self, saved: list[tuple[int, Path]]) -> None:
        cfg = self.cfg
        step, path = saved[-1]
        run_path = self.out / RUN_FILE
        if run_path.is_file():
            recorded = read_json(run_path)
            changes_length = recorded.get("steps", cfg.steps) != cfg.steps
            check_resume_config(self.out, recorded, self.run_record(), config_defaults(PretrainConfig),
                                allowed=LENGTH_FIELDS if changes_length else ())
            self.length_changes = list(recorded.get("length_changes", []))
            if changes_length:
                self._check_length_change(recorded, step)
                self.length_changes.append({"from_steps": recorded["steps"], "to_steps": cfg.steps,
                                            "at_step": step})
        self.raw_model, _ = load_checkpoint(path, self.device)
        if self.raw_model.config != cfg.model_config():
            raise ValueError(f"--resume: checkpoint {path} has a different model config than --preset {cfg.preset}")
        state = load_trainer_state(path)
        self.optimizer = make_optimizer(self.raw_model, cfg)
        load_optimizer_state(self.optimizer, state, path)
        torch.set_rng_state(state["torch_rng"])
        random.setstate(_tuples(state["python_rng"]))
        self.position = int(state["step"])
        self.elapsed_before = float(state["elapsed_seconds"])
        self.restore_checkpoints(state["checkpoints"])
        if self.ctx.is_main:
            self.metrics_rows = self.cut_jsonl(METRICS_FILE, "step")
            if self.length_changes and self.length_changes[-1]["to_steps"] == cfg.steps:
                write_json(self.out / RUN_FILE, self.run_record() | {"length_changes": self.length_changes})
        self.ctx.barrier()

    def _wrap_model(self) -> None:
        model = self.raw_model
        if self.cfg.compile:
            model = torch.compile(model)
        if self.ctx.enabled:
            from torch.nn.parallel import DistributedDataParallel

            model = DistributedDataParallel(model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        self.train_model = model

    # -- checkpoints and receipts ----------------------------------------------------------------
    def checkpoint_positions(self) -> set[int]:
        return set(self.cfg.checkpoint_steps())

    def checkpoint_contents(self, step: int, elapsed: float):
        tokens = sum(r["tokens"] for r in self.metrics_rows)
        meta = {"stage": "random_initialization" if step == 0 else "coding_pretraining", "seed": self.cfg.seed,
                "step": step, "tokens_seen": tokens}
        if self.metrics_rows:
            meta["training_loss"] = round(self.metrics_rows[-1]["loss"], 4)
        state = {
            "optimizer": self.optimizer.state_dict(), "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(), "step": step, "elapsed_seconds": elapsed,
            "checkpoints": self.checkpoints, "data_position": step * self.cfg.batch_size,
        }
        return self.raw_model, meta, state

    def receipt_fields(self) -> dict:
        cfg = self.cfg
        fields = {
            "config": self.raw_model.config.to_dict(), "parameter_counts": self.raw_model.parameter_counts(),
            "preset": cfg.preset, "model_overrides": cfg.model_overrides,
            "batch_size": cfg.batch_size, "sequence_length": cfg.sequence_length, "learning_rate": cfg.learning_rate,
            "warmup": cfg.warmup, "schedule": cfg.schedule, "weight_decay": cfg.weight_decay,
            "decay_all_parameters": cfg.decay_all_parameters,
            "balance_weight": self.raw_model.config.balance_loss_weight,
            "tokens_seen": sum(r["tokens"] for r in self.metrics_rows),
            "data": self.data_record(), "training_curve": self.metrics_rows,
        }
        if self.length_changes:
            fields["length_changes"] = self.length_changes
        return fields

    def final_fields(self) -> dict:
        data_seconds = sum(r.get("data_seconds", 0.0) for r in self.metrics_rows)
        step_seconds = sum(r["seconds"] for r in self.metrics_rows)
        return {"timing": {"data_seconds": data_seconds, "step_seconds": step_seconds,
                           "data_fraction": data_seconds / step_seconds if step_seconds else 0.0}}

    # -- the step ------------------------------------------------------------------------------
    def train_step(self, step: int) -> dict:
        cfg = self.cfg
        start = time.perf_counter()
        inputs, labels = rows_to_batch(pretraining_rows(step * cfg.batch_size, cfg.batch_size,
                                                        cfg.sequence_length, cfg.data_seed, cfg.tasks))
        tokens = int((labels != IGNORE_INDEX).sum())
        lo = self.ctx.rank * self.rows_per_rank
        inputs = inputs[lo : lo + self.rows_per_rank].to(self.device, non_blocking=True)
        labels = labels[lo : lo + self.rows_per_rank].to(self.device, non_blocking=True)
        data_seconds = time.perf_counter() - start

        lr = self.schedule.at(step)
        try:
            result = language_model_update(self.raw_model, self.optimizer, inputs, labels, self.recipe,
                                           learning_rate=lr, tokens=tokens, train_model=self.train_model,
                                           ctx=self.ctx, precision=self.precision)
        except TrainingDiverged as error:
            raise TrainingDiverged(f"step {step + 1}: {error}") from None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        return {"step": step + 1, "loss": result.loss, "aux_loss": result.aux_loss, "grad_norm": result.grad_norm,
                "lr": lr, "tokens": tokens, "tokens_seen": sum(r["tokens"] for r in self.metrics_rows) + tokens,
                "tokens_per_second": tokens / seconds, "seconds": seconds, "data_seconds": data_seconds}

    def step(self, index: int) -> dict:
        try:
            row = self.train_step(index)
        except TrainingDiverged as error:
            last_good = self.checkpoints[-1]["path"] if self.checkpoints else None
            raise TrainingDiverged(f"training diverged at {error}; stopped. Last good checkpoint: "
                                   f"{last_good}") from None
        if self.cfg.eval_every and (index + 1) % self.cfg.eval_every == 0:
            row["val_loss"] = self.validation_loss()
        if self.ctx.is_main:
            self.metrics_rows.append(row)
        return row

    def postfix(self, row: dict) -> dict:
        return {"loss": f"{row['loss']:.4f}", "tok_s": f"{row['tokens_per_second']:.0f}"}

    def validation_loss(self) -> float:
        """Token-mean cross-entropy on `eval_batches` held-out batches of the stream (its examples drawn
        with seed data_seed + VALIDATION_SEED_OFFSET, so no training batch is among them), without
        gradients and without touching any random state the training uses; every rank computes the
        same value."""
        cfg = self.cfg
        total, tokens = 0.0, 0
        with torch.no_grad():
            for batch in range(cfg.eval_batches):
                inputs, labels = rows_to_batch(pretraining_rows(batch * cfg.batch_size, cfg.batch_size,
                                                                cfg.sequence_length,
                                                                cfg.data_seed + VALIDATION_SEED_OFFSET, cfg.tasks))
                logits = self.raw_model(inputs.to(self.device)).logits
                total += float(torch.nn.functional.cross_entropy(
                    logits.float().flatten(0, 1), labels.to(self.device).flatten(), ignore_index=IGNORE_INDEX,
                    reduction="sum"))
                tokens += int((labels != IGNORE_INDEX).sum())
        return total / tokens

    def run(self) -> dict:
        self.data_hash = data_sha256(self.cfg)
        return super().run()


def pretrain(cfg: PretrainConfig) -> dict:
    """Run (or resume) a pretraining run; returns the final receipt on rank 0."""
    return Pretrainer(cfg).run()


def _tuples(value):
    """torch.load returns lists where random.getstate() had tuples."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


__all__ = ["PretrainConfig", "pretrain", "learning_rate_at", "parameter_groups", "resumed_config", "TrainingDiverged"]
