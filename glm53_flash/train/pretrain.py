"""Pretraining on the compatible task stream: AdamW, checkpoints, exact resume, receipts, DDP.

The original's flags and defaults (400 steps, checkpoints 100/200/400, batch 32 x 128, lr 3e-4,
seed 42, AdamW betas 0.9/0.95, weight decay 0.1, loss = token cross-entropy + 0.01 x balance).
Differences: weight decay on matrices only, an optional warmup/cosine schedule, a balance loss with
gradients, per-step metrics, receipts at every checkpoint, and resume that reproduces the loss curve
bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..data import IGNORE_INDEX, pretraining_rows, rows_to_batch
from ..model import GLM53Flash
from ..receipts import peak_rss_bytes, provenance, write_json, write_text
from ..options import config_record
from ..runtime import autocast, fused_optimizer_supported, resolve_device
from .config import SCHEDULES, PretrainConfig  # noqa: F401 - re-exported
from .checkpoint import (
    checkpoint_name, list_checkpoints, load_checkpoint, load_optimizer_state, load_trainer_state, prepare_run_directory,
    save_checkpoint,
)
from .distributed import DistributedContext, setup_distributed, teardown_distributed

RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
RECEIPT_FILE = "training-receipt.json"
# Fields that must match for --resume to continue a run.
RESUME_FIELDS = ("preset", "steps", "batch_size", "sequence_length", "learning_rate", "seed", "data_seed",
                 "warmup", "schedule", "weight_decay", "model_overrides", "checkpoints")


def learning_rate_at(step: int, cfg: PretrainConfig) -> float:
    """LR for 0-based `step`: linear warmup, then constant or cosine down to min_lr_ratio x lr."""
    if cfg.warmup and step < cfg.warmup:
        return cfg.learning_rate * (step + 1) / cfg.warmup
    if cfg.schedule == "constant":
        return cfg.learning_rate
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    floor = cfg.min_lr_ratio * cfg.learning_rate
    return floor + (cfg.learning_rate - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def parameter_groups(model: GLM53Flash, weight_decay: float) -> list[dict]:
    """Decay weight matrices (including the tied embedding); not norms, stream logits or mixers."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (decay if param.ndim >= 2 and "logits" not in name else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(model: GLM53Flash, cfg: PretrainConfig) -> torch.optim.AdamW:
    fused = fused_optimizer_supported(next(model.parameters()).device)
    return torch.optim.AdamW(parameter_groups(model, cfg.weight_decay), lr=cfg.learning_rate, betas=(0.9, 0.95),
                             fused=fused)


def data_sha256(cfg: PretrainConfig) -> str:
    """Hash of every token of every batch the run will see (the stream is a pure function of its seed)."""
    digest = hashlib.sha256()
    for step in range(cfg.steps):
        digest.update(pretraining_rows(step * cfg.batch_size, cfg.batch_size, cfg.sequence_length,
                                       cfg.data_seed).astype("<i2").tobytes())
    return digest.hexdigest()


class TrainingDiverged(RuntimeError):
    pass


class Pretrainer:
    def __init__(self, cfg: PretrainConfig) -> None:
        self.cfg = cfg
        self.out = Path(cfg.output)
        self.device = resolve_device(cfg.device)
        self.ctx: DistributedContext = setup_distributed(self.device.type)
        if self.ctx.enabled and self.device.type == "cuda":
            self.device = torch.device("cuda", self.ctx.local_rank)
            torch.cuda.set_device(self.device)
        cfg.validate(self.ctx.world_size)
        self.rows_per_rank = cfg.batch_size // self.ctx.world_size
        self.metrics_rows: list[dict] = []
        self.checkpoints: list[dict] = []
        self.elapsed_before = 0.0
        self.start_step = 0

    # -- setup ------------------------------------------------------------------------------------
    def run_record(self) -> dict:
        record = {k: getattr(self.cfg, k) for k in RESUME_FIELDS}
        record["checkpoints"] = list(self.cfg.checkpoints)
        return record

    def prepare(self) -> None:
        cfg = self.cfg
        exists = prepare_run_directory(self.out, cfg.resume)
        saved = list_checkpoints(self.out) if exists else []
        if exists and saved:
            self._resume(saved)
        else:
            self._fresh()
        self._wrap_model()

    def _fresh(self) -> None:
        cfg = self.cfg
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        self.raw_model = GLM53Flash(cfg.model_config()).to(self.device)
        self.optimizer = make_optimizer(self.raw_model, cfg)
        if self.ctx.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            write_json(self.out / RUN_FILE, self.run_record())
            (self.out / METRICS_FILE).write_text("")
            self._save(0)
        self.ctx.barrier()

    def _resume(self, saved: list[tuple[int, Path]]) -> None:
        cfg = self.cfg
        run_path = self.out / RUN_FILE
        if run_path.is_file():
            recorded = json.loads(run_path.read_text())
            mismatched = [k for k in RESUME_FIELDS if k in recorded and recorded[k] != self.run_record()[k]]
            if mismatched:
                raise ValueError(f"--resume: {self.out} was started with different "
                                 f"{', '.join(mismatched)}; use the same flags or a new --output")
        step, path = saved[-1]
        self.raw_model, _ = load_checkpoint(path, self.device)
        if self.raw_model.config != cfg.model_config():
            raise ValueError(f"--resume: checkpoint {path} has a different model config than --preset {cfg.preset}")
        state = load_trainer_state(path)
        self.optimizer = make_optimizer(self.raw_model, cfg)
        load_optimizer_state(self.optimizer, state, path)
        torch.set_rng_state(state["torch_rng"])
        random.setstate(_tuples(state["python_rng"]))
        self.start_step = int(state["step"])
        self.elapsed_before = float(state["elapsed_seconds"])
        self.checkpoints = [c for c in state["checkpoints"] if c["step"] <= self.start_step]
        if self.ctx.is_main:
            rows = [json.loads(line) for line in (self.out / METRICS_FILE).read_text().splitlines() if line]
            self.metrics_rows = [r for r in rows if r["step"] <= self.start_step]
            # Rows written after the checkpoint by the interrupted run are recomputed.
            _write_jsonl(self.out / METRICS_FILE, self.metrics_rows)
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
    def _trainer_state(self, step: int, elapsed: float) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(), "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(), "step": step, "elapsed_seconds": elapsed,
            "checkpoints": self.checkpoints, "data_position": step * self.cfg.batch_size,
        }

    def _save(self, step: int, elapsed: float = 0.0) -> None:
        tokens = sum(r["tokens"] for r in self.metrics_rows)
        meta = {"stage": "random_initialization" if step == 0 else "coding_pretraining", "seed": self.cfg.seed,
                "step": step, "tokens_seen": tokens}
        self.checkpoints.append({"step": step, "path": str(self.out / checkpoint_name(step)), "weights_sha256": None})
        info = save_checkpoint(self.out / checkpoint_name(step), self.raw_model, meta,
                               self._trainer_state(step, elapsed))
        self.checkpoints[-1]["weights_sha256"] = info["weights_sha256"]

    def write_receipt(self, status: str, elapsed: float, extra: dict | None = None) -> None:
        cfg = self.cfg
        peak_vram = (torch.cuda.max_memory_allocated(self.device) / 2**30 if self.device.type == "cuda" else None)
        receipt = {
            "schema_version": "1.0", "status": status, "stage": "coding_pretraining",
            "config": self.raw_model.config.to_dict(), "parameter_counts": self.raw_model.parameter_counts(),
            "preset": cfg.preset, "model_overrides": cfg.model_overrides,
            "seed": cfg.seed, "steps": cfg.steps, "batch_size": cfg.batch_size,
            "sequence_length": cfg.sequence_length, "learning_rate": cfg.learning_rate,
            "warmup": cfg.warmup, "schedule": cfg.schedule, "weight_decay": cfg.weight_decay,
            "balance_weight": self.raw_model.config.balance_loss_weight, "world_size": self.ctx.world_size,
            "run_config": config_record(cfg),
            "tokens_seen": sum(r["tokens"] for r in self.metrics_rows),
            "elapsed_seconds": round(elapsed, 3), "device": str(self.device),
            "peak_vram_gib": round(peak_vram, 3) if peak_vram is not None else None,
            "peak_rss_bytes": peak_rss_bytes(),
            "data": {"seed": cfg.data_seed, "examples": cfg.steps * cfg.batch_size, "sha256": self.data_hash},
            "checkpoints": self.checkpoints, "training_curve": self.metrics_rows,
            "provenance": provenance(device=str(self.device)),
        }
        receipt.update(extra or {})
        write_json(self.out / RECEIPT_FILE, receipt)

    # -- the loop ------------------------------------------------------------------------------
    def train_step(self, step: int) -> dict:
        cfg = self.cfg
        start = time.perf_counter()
        inputs, labels = rows_to_batch(pretraining_rows(step * cfg.batch_size, cfg.batch_size,
                                                        cfg.sequence_length, cfg.data_seed))
        tokens = int((labels != IGNORE_INDEX).sum())
        lo = self.ctx.rank * self.rows_per_rank
        inputs = inputs[lo : lo + self.rows_per_rank].to(self.device, non_blocking=True)
        labels = labels[lo : lo + self.rows_per_rank].to(self.device, non_blocking=True)
        data_seconds = time.perf_counter() - start

        lr = learning_rate_at(step, cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        reduce = self.ctx.all_sum if self.ctx.enabled else None
        with autocast(self.device):
            out = self.train_model(inputs, balance_reduce=reduce)
            ce_sum = F.cross_entropy(out.logits.float().flatten(0, 1), labels.flatten(),
                                     ignore_index=IGNORE_INDEX, reduction="sum")
        # Each rank's share of the global objective; DDP averages gradients, hence the world size.
        objective = self.ctx.world_size * (ce_sum / tokens + self.raw_model.config.balance_loss_weight * out.aux_loss)
        self.optimizer.zero_grad(set_to_none=True)
        objective.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), cfg.grad_clip))
        totals = self.ctx.all_sum(torch.stack([ce_sum.detach().float(), out.aux_loss.detach().float()]))
        loss, aux = float(totals[0]) / tokens, float(totals[1])
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            raise TrainingDiverged(f"step {step + 1}: loss {loss}, gradient norm {grad_norm}")
        self.optimizer.step()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        return {"step": step + 1, "loss": loss, "aux_loss": aux, "grad_norm": grad_norm, "lr": lr,
                "tokens": tokens, "tokens_seen": sum(r["tokens"] for r in self.metrics_rows) + tokens,
                "tokens_per_second": tokens / seconds, "seconds": seconds, "data_seconds": data_seconds}

    def run(self) -> dict:
        cfg = self.cfg
        self.data_hash = data_sha256(cfg)
        self.prepare()
        self.raw_model.train()
        save_steps = set(cfg.checkpoint_steps())
        session_start = time.perf_counter()
        bar = None
        if self.ctx.is_main and cfg.progress:
            from tqdm import tqdm

            bar = tqdm(total=cfg.steps, initial=self.start_step, desc="pretrain", unit="step", dynamic_ncols=True)
        last_good = self.checkpoints[-1]["path"] if self.checkpoints else None
        try:
            for step in range(self.start_step, cfg.steps):
                try:
                    row = self.train_step(step)
                except TrainingDiverged as error:
                    raise TrainingDiverged(f"training diverged at {error}; stopped. Last good checkpoint: "
                                           f"{last_good}") from None
                elapsed = self.elapsed_before + time.perf_counter() - session_start
                if self.ctx.is_main:
                    self.metrics_rows.append(row)
                    with open(self.out / METRICS_FILE, "a") as handle:
                        handle.write(json.dumps(row, sort_keys=True) + "\n")
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(loss=f"{row['loss']:.4f}", tok_s=f"{row['tokens_per_second']:.0f}")
                if row["step"] in save_steps:
                    if self.ctx.is_main:
                        self._save(row["step"], elapsed)
                        self.write_receipt("running", elapsed)
                        last_good = self.checkpoints[-1]["path"]
                    self.ctx.barrier()
        finally:
            if bar is not None:
                bar.close()
        elapsed = self.elapsed_before + time.perf_counter() - session_start
        result = {}
        if self.ctx.is_main:
            data_seconds = sum(r.get("data_seconds", 0.0) for r in self.metrics_rows)
            step_seconds = sum(r["seconds"] for r in self.metrics_rows)
            timing = {"data_seconds": data_seconds, "step_seconds": step_seconds,
                      "data_fraction": data_seconds / step_seconds if step_seconds else 0.0}
            self.write_receipt("complete", elapsed, {"timing": timing})
            result = json.loads((self.out / RECEIPT_FILE).read_text())
        teardown_distributed(self.ctx)
        return result


def pretrain(cfg: PretrainConfig) -> dict:
    """Run (or resume) a pretraining run; returns the final receipt on rank 0."""
    return Pretrainer(cfg).run()


def _tuples(value):
    """torch.load returns lists where random.getstate() had tuples."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


__all__ = ["PretrainConfig", "pretrain", "learning_rate_at", "parameter_groups", "TrainingDiverged"]
