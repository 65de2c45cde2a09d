"""The training engine: everything a training run does that is not its own step.

A loop is a step (one update that returns its metrics row) plus what it saves; the engine owns the
rest, once:

- **the update**: `make_optimizer` builds AdamW from an `UpdateRecipe`, `optimizer_step` takes every
  update of every loop (zero the gradients, backward, sum them across ranks where the loop does that
  itself, clip, let the loop look at the gradient norm and stop a diverged run, update);
- **the schedule**: `Schedule` (linear warmup, then constant or cosine) gives each update's learning
  rate, for pretraining by step and for RL by update;
- **the loop**: `StepLoop` runs the steps, hands each metrics row to the `MetricsSink`
  (metrics.jsonl, TensorBoard, W&B) and the progress bar, follows the thread governor (without it, after
  a quiet start, shared_machine.BusyHint says once when the machine gets busy), fires "at position N" actions
  (checkpoints, evaluations) and stops early when told (a time cap);
- **the run directory** (`Trainer`, for the loops that write one: pretraining and RL): the lock,
  fresh start or exact resume, checkpoints with their hashes, metrics rows cut back to the
  checkpoint on resume, the receipt (`running` at each checkpoint, `interrupted` on Ctrl-C or
  SIGTERM with the command that resumes, `complete` at the end), a finished run found finished, and
  the torchrun rules (rank 0 alone writes; every rank waits at each checkpoint).

The loops over it: pretraining (`train/pretrain.py`, a Trainer), RL (`train/rl_run.py`, a Trainer whose
step is train/rl.py's rollouts plus the RLOO update and advances by a whole update of groups), the
pretraining-data study (`experiments/pretraining_data.py`, a StepLoop in memory, its run directory
the study's) and both vision runs (`vision/training.py`, `vision/pilot.py`, StepLoops in memory:
they train for seconds and write one receipt). The recipes they use:

| recipe        | learning rate | weight decay             | betas        | AdamW kernel  | autocast   | on a non-finite loss or gradient |
|---------------|---------------|--------------------------|--------------|---------------|------------|----------------------------------|
| `PRETRAINING` | 3e-4          | 0.1, weight matrices     | (0.9, 0.95)  | fused         | bf16, CUDA | stop (`TrainingDiverged`)        |
| `STUDY`       | 8e-4          | 0.1, every parameter     | (0.9, 0.95)  | torch default | none       | go on (the metrics show the NaN) |
| `RL`          | config        | 0, the trained scope     | (0.9, 0.999) | torch default | none       | stop                             |
| `VISION`      | config        | config, trainable params | (0.9, 0.999) | torch default | none       | stop (`TrainingDiverged`)        |

RL and vision take torch's AdamW defaults for the betas, as they always did; each loop replaces the
learning rate, decay and clip by its config's.
"""

from __future__ import annotations

import abc
import contextlib
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

import torch

from glm53_flash.core.receipts import append_text, read_json, read_jsonl, write_text
from glm53_flash.core.runtime import fused_optimizer_supported
from glm53_flash.core.shared_machine import BusyHint, ShortSpinRestart, restart_allowed, restart_pays
from glm53_flash.train.config import SCHEDULES, STUDY_LEARNING_RATE

OPTIMIZER_KERNELS = ("fused", "torch-default")


class TrainingDiverged(RuntimeError):
    """The loss or the gradient norm became non-finite."""


@dataclass(frozen=True)
class UpdateRecipe:
    """How one update is computed (see the module's table for the two recipes in use)."""

    learning_rate: float
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    decay_all_parameters: bool = False
    optimizer_kernel: str = "fused"
    mixed_precision: bool = True
    stop_on_divergence: bool = True

    def __post_init__(self) -> None:
        if self.optimizer_kernel not in OPTIMIZER_KERNELS:
            raise ValueError(f"optimizer kernel {self.optimizer_kernel!r}; allowed: {', '.join(OPTIMIZER_KERNELS)}")


PRETRAINING = UpdateRecipe(learning_rate=3e-4)
STUDY = UpdateRecipe(learning_rate=STUDY_LEARNING_RATE, decay_all_parameters=True, optimizer_kernel="torch-default",
                     mixed_precision=False, stop_on_divergence=False)
TORCH_BETAS = (0.9, 0.999)  # torch's AdamW default, which RL and vision have always used
RL = UpdateRecipe(learning_rate=1e-6, weight_decay=0.0, betas=TORCH_BETAS, decay_all_parameters=True,
                  optimizer_kernel="torch-default", mixed_precision=False)
VISION = UpdateRecipe(learning_rate=1e-3, weight_decay=0.0, betas=TORCH_BETAS, decay_all_parameters=True,
                      optimizer_kernel="torch-default", mixed_precision=False)


def parameter_groups(model: torch.nn.Module, weight_decay: float, decay_all: bool = False) -> list[dict]:
    """AdamW groups. By default decay weight matrices (including the tied embedding), not norms,
    stream logits or mixers; `decay_all` puts every trainable parameter in one decayed group."""
    if decay_all:
        return [{"params": [p for p in model.parameters() if p.requires_grad], "weight_decay": weight_decay}]
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (decay if param.ndim >= 2 and "logits" not in name else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(model: torch.nn.Module, recipe: UpdateRecipe) -> torch.optim.AdamW:
    groups = parameter_groups(model, recipe.weight_decay, recipe.decay_all_parameters)
    kernel = {}
    if recipe.optimizer_kernel == "fused":
        kernel["fused"] = fused_optimizer_supported(next(model.parameters()).device)
    return torch.optim.AdamW(groups, lr=recipe.learning_rate, betas=recipe.betas, **kernel)


def set_learning_rate(optimizer: torch.optim.Optimizer, learning_rate: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = learning_rate


def optimizer_step(optimizer: torch.optim.Optimizer, parameters: Iterable[torch.nn.Parameter],
                   objective: torch.Tensor | None, *, grad_clip: float, learning_rate: float | None = None,
                   reduce_gradients: Callable[[list], None] | None = None,
                   check: Callable[[float], None] | None = None) -> float:
    """One update of `parameters` by `optimizer` from `objective` (None: this process has no term of its
    own, as an RL rank whose groups all lacked signal, and takes part in the gradient sum with zeros).
    `reduce_gradients(parameters)` sums the gradients across ranks (the loops whose model is not a DDP
    wrapper); `check(grad_norm)` runs after the clip and may raise to stop before the update. Returns
    the gradient norm before clipping."""
    parameters = list(parameters)
    if learning_rate is not None:
        set_learning_rate(optimizer, learning_rate)
    optimizer.zero_grad(set_to_none=True)
    if objective is not None:
        objective.backward()
    if reduce_gradients is not None:
        reduce_gradients(parameters)
    grad_norm = float(torch.nn.utils.clip_grad_norm_(parameters, grad_clip))
    if check is not None:
        check(grad_norm)
    optimizer.step()
    return grad_norm


def stop_when_not_finite(what: str = "gradient norm") -> Callable[[float], None]:
    """A `check` that raises TrainingDiverged on a non-finite gradient norm."""
    def check(grad_norm: float) -> None:
        if not math.isfinite(grad_norm):
            raise TrainingDiverged(f"non-finite {what} ({grad_norm})")
    return check


# ----------------------------------------------------------------------------------- the schedule

@dataclass(frozen=True)
class Schedule:
    """The learning rate of update `index` (0-based): linear warmup over `warmup` updates, then
    `base` (constant) or a cosine from `base` down to `min_ratio` x base at update `total`."""

    base: float
    warmup: int = 0
    shape: str = "constant"
    total: int = 0
    min_ratio: float = 0.0

    def __post_init__(self) -> None:
        if self.shape not in SCHEDULES:
            raise ValueError(f"schedule {self.shape!r}; allowed: {', '.join(SCHEDULES)}")

    def at(self, index: int) -> float:
        if self.warmup and index < self.warmup:
            return self.base * (index + 1) / self.warmup
        if self.shape == "constant":
            return self.base
        progress = (index - self.warmup) / max(1, self.total - self.warmup)
        floor = self.min_ratio * self.base
        return floor + (self.base - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    @property
    def depends_on_length(self) -> bool:
        """Whether some update's learning rate depends on `total` (then a run cannot change length)."""
        return self.shape != "constant"


# ----------------------------------------------------------------------------------- the loop


SLOW_STEP = 3.0  # a busy step this many times the median of the steps before it (2 or more) is evidence enough


def _slow(per_position: list[float]) -> bool:
    """Whether the last step took SLOW_STEP times the median of the ones before it (at least two of them:
    a first step warms up and runs long)."""
    return len(per_position) >= 3 and per_position[-1] >= SLOW_STEP * statistics.median(per_position[:-1])


@dataclass
class StepLoop:
    """Positions `start` .. `stop` of a run: `step(p)` trains from position p (0-based: steps done, or
    groups done) and returns its metrics row (None on a rank that keeps none); the step ends at
    `advance(p)` (default p + 1; RL's update covers several groups). Each row goes to `sink`
    (metrics.jsonl, TensorBoard, W&B) with the new position as its x, and to the progress bar;
    after the step, every `(positions, action)` of `at_steps` with a position in (p, new] runs
    `action(new)` (a checkpoint, an evaluation). `stop_when(p)`, asked before each step, may end the
    loop early with a reason (kept in `stopped_by`; None when it ran to `stop`). A run that started on a
    quiet machine with fixed threads and finds it busy (shared_machine.BusyHint) ends with
    shared_machine.ShortSpinRestart after that step's actions, given `restart_from` and where the command allows
    and it pays (shared_machine.restart_pays), or prints the hint once. The bar is the caller's to close
    (several loops may share one)."""

    start: int
    stop: int
    step: Callable[[int], dict | None]
    sink: "MetricsSink | None" = None
    at_steps: Iterable[tuple[Collection[int], Callable[[int], None]]] = ()
    bar: object = None
    postfix: Callable[[dict], dict] | None = None
    governor: object = None  # a shared_machine.ThreadGovernor: the thread count follows the free cores
    advance: Callable[[int], int] | None = None
    stop_when: Callable[[int], str | None] | None = None
    stopped_by: str | None = None
    # The position a restart would resume from (the last checkpoint saved; None: none), where the run may
    # restart itself with short spin waits (shared_machine.ShortSpinRestart) instead of only hinting at it.
    restart_from: Callable[[], int | None] | None = None

    def run(self) -> int:
        """Returns the position reached."""
        actions = list(self.at_steps)
        position = self.start
        hint = BusyHint() if self.governor is None and BusyHint.wanted() else None
        per_position: list[float] = []  # each step's seconds per position it advanced
        while position < self.stop:
            if self.stop_when is not None:
                reason = self.stop_when(position)
                if reason is not None:
                    self.stopped_by = reason
                    break
            started = time.perf_counter()
            row = self.step(position)
            done = self.advance(position) if self.advance is not None else position + 1
            per_position.append((time.perf_counter() - started) / max(1, done - position))
            if self.governor is not None:
                if row is not None:
                    row["threads"] = self.governor.threads  # the count this step ran with
                self.governor.after_step()
            message = hint.after_step(slow=_slow(per_position)) if hint is not None else None
            if self.sink is not None and row is not None:
                self.sink.write(row, done)
            if self.bar is not None:
                self.bar.update(done - position)
                if self.postfix is not None and row is not None:
                    self.bar.set_postfix(**self.postfix(row))
            for positions, action in actions:
                if any(p in positions for p in range(position + 1, done + 1)):
                    action(done)
            position = done
            if message is not None:  # after the step's checkpoint, which a restart resumes from
                self._busy(message, hint, position, per_position)
                hint = None
        return position

    def _busy(self, message: str, hint: BusyHint, position: int, per_position: list[float]) -> None:
        """The machine got busy: restart with short spin waits where that is allowed and pays
        (shared_machine.restart_pays), else say how to (the hint)."""
        resume_from = self.restart_from() if self.restart_from is not None and restart_allowed() else None
        if resume_from is not None and position < self.stop:
            busy = per_position[-hint.streak:]  # the steps that saw the load
            quiet = per_position[:-hint.streak] or busy
            if restart_pays(self.stop - position, statistics.median(busy), statistics.median(quiet),
                            position - resume_from):
                raise ShortSpinRestart(f"other processes used {hint.busy:.1f} cores at position {position}",
                                       resume_from)
        if hasattr(self.bar, "write"):  # a tqdm bar: the line goes above it, not through it
            self.bar.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------- metrics


TENSORBOARD_HINT = "pip install 'glm53_flash[tensorboard]'"


def check_live_logging(tensorboard: str | None, wandb: str | None) -> None:
    """One-line errors, before anything trains, when a live logger's package is missing."""
    import importlib.util

    if tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ValueError(f"--tensorboard needs the tensorboard package ({TENSORBOARD_HINT})")
    if wandb and importlib.util.find_spec("wandb") is None:
        raise ValueError("--wandb needs the wandb package (pip install wandb)")


# Row fields that are the x axis (the step a live logger is given), not a curve of their own.
UNLOGGED = ("step", "first_group", "last_group")


class MetricsSink:
    """Where a run's per-step metrics go: `metrics.jsonl` (one JSON row per step, always, when a
    path is given) and, when asked, TensorBoard (`--tensorboard DIR`) and Weights & Biases
    (`--wandb PROJECT`). Live loggers get the row's numeric fields; a resumed run tells TensorBoard
    to hide the events after its checkpoint (`purge_step`), since those steps are recomputed."""

    def __init__(self, jsonl_path=None, *, tensorboard: str | None = None, wandb: str | None = None,
                 run_name: str | None = None, config: dict | None = None, resumed_at: int | None = None,
                 prefix: str = "", namespace: str = "train") -> None:
        check_live_logging(tensorboard, wandb)
        self.jsonl_path = jsonl_path
        self.prefix = prefix
        self.namespace = namespace
        self.writer = None
        self.wandb_run = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=tensorboard,
                                        purge_step=resumed_at + 1 if resumed_at else None)
        if wandb:
            import wandb as wandb_module

            self.wandb_run = wandb_module.init(project=wandb, name=run_name, config=config or {},
                                               resume="allow" if resumed_at else None)

    def write(self, row: dict, step: int) -> None:
        if self.jsonl_path is not None:
            append_text(self.jsonl_path, json.dumps(row, sort_keys=True) + "\n")
        numbers = {self.prefix + self.tag(k): float(v) for k, v in row.items()
                   if k not in UNLOGGED and isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self.writer is not None:
            for key, value in numbers.items():
                self.writer.add_scalar(key, value, step)
        if self.wandb_run is not None:
            self.wandb_run.log(numbers, step=step)

    def tag(self, key: str) -> str:
        """The live loggers' name of a metrics field: namespaced, `val_loss` -> `val/loss`, `loss` ->
        `train/loss` (RL's rows: `rl/...`)."""
        if key.startswith("val_"):
            return "val/" + key[len("val_"):]
        return f"{self.namespace}/{key}"

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False




# ----------------------------------------------------------------------------------- runs in a directory


class Trainer(abc.ABC):
    """A training run that owns a directory: the engine's part of pretraining and RL.

    A subclass sets, in its `__init__` (after `Trainer.__init__`): `cfg` (with `output`, `quiet`,
    `tensorboard`, `wandb`, `adapt_threads`), `out`, `device`, `ctx` (a DistributedContext) and
    `precision`; and provides the plugin's part:

    - `prepare()`: build the model and optimizer, then start fresh (write run.json, empty metrics
      files, `save_checkpoint_at(0, 0.0)`) or resume from the newest checkpoint (`restore_checkpoints`,
      `cut_jsonl`); it sets `position`;
    - `step(position)`: one update from `position`; returns its metrics row on rank 0 (None elsewhere);
      `advance(position)` where it ends (default position + 1);
    - `checkpoint_positions()`; `checkpoint_contents(position, elapsed)`: (model, metadata, trainer state);
    - `receipt_fields()`: the receipt's own fields (`final_fields()`: more at the end);
    - `resume_hint()`; optionally `session()`, a context around the loop (RL's verifier pool), and
      `postfix(row)` for the progress bar.

    The checkpoints list holds `{unit: position, "path": ..., "weights_sha256": ...}` entries; the
    receipt lists those saved; position, unit ("step" or "group") and `length_field` ("steps" or
    "groups") name what a run counts."""

    command = ""
    stage = ""
    unit = "step"
    length_field = "steps"
    namespace = "train"
    desc = ""
    RUN_FILE = "run.json"
    METRICS_FILE = "metrics.jsonl"
    RECEIPT_FILE = "training-receipt.json"

    def __init__(self) -> None:
        self.position = 0
        self.checkpoints: list[dict] = []
        self.metrics_rows: list[dict] = []
        self.elapsed_before = 0.0
        self.prepared = False
        self.trained_this_session = False  # a step was taken by this process (see mark_interrupted)
        self.governor = None  # a ThreadGovernor with --adapt-threads on the CPU, while the loop runs
        self.session_start = time.perf_counter()

    # -- the plugin's part (see the class's note) ---------------------------------------------
    @property
    def total(self) -> int:
        return getattr(self.cfg, self.length_field)

    @abc.abstractmethod
    def prepare(self) -> None:
        """See the class's note."""

    @abc.abstractmethod
    def step(self, position: int) -> dict | None:
        """See the class's note."""

    def advance(self, position: int) -> int:
        return position + 1

    @abc.abstractmethod
    def checkpoint_positions(self) -> Collection[int]:
        """See the class's note."""

    @abc.abstractmethod
    def checkpoint_contents(self, position: int, elapsed: float) -> tuple[torch.nn.Module, dict, dict]:
        """See the class's note."""

    @abc.abstractmethod
    def receipt_fields(self) -> dict:
        """See the class's note."""

    def final_fields(self) -> dict:
        return {}

    @abc.abstractmethod
    def resume_hint(self) -> str:
        """See the class's note."""

    def session(self):
        return contextlib.nullcontext()

    def postfix(self, row: dict) -> dict:
        return {}

    def can_mark_interrupted(self) -> bool:
        """Whether an interrupt now has a run to mark (set up far enough to have a receipt)."""
        return self.prepared

    # -- checkpoints and resume ----------------------------------------------------------------
    def saved_checkpoints(self) -> list[dict]:
        return [c for c in self.checkpoints if c["weights_sha256"] is not None]

    def save_checkpoint_at(self, position: int, elapsed: float) -> None:
        """Save the checkpoint at `position` and list it (its trainer state lists it too, before its hash
        is known: `restore_checkpoints` fills that in)."""
        from glm53_flash.train.checkpoint import checkpoint_name, save_checkpoint

        entry = {self.unit: position, "path": str(self.out / checkpoint_name(position)), "weights_sha256": None}
        self.checkpoints.append(entry)
        model, metadata, state = self.checkpoint_contents(position, elapsed)
        info = save_checkpoint(self.out / checkpoint_name(position), model, metadata, state)
        entry["weights_sha256"] = info["weights_sha256"]

    def restore_checkpoints(self, entries: list[dict]) -> None:
        """The checkpoint list of a resumed run: the trainer state's entries up to `position`, each with
        its hash (the newest was listed before its hash was known; every listed one must be on disk)."""
        self.checkpoints = [c for c in entries if c[self.unit] <= self.position]
        self._fill_hashes(strict=True)

    def _fill_hashes(self, strict: bool) -> None:
        """An entry listed before its hash was known takes the hash from its directory's metadata. Not
        strict (an interrupt): one whose directory was not (wholly) written stays unsaved; an interrupt
        between a checkpoint's rename and its recorded hash thus still names it saved."""
        from glm53_flash.train.checkpoint import checkpoint_name, read_metadata

        for entry in self.checkpoints:
            if entry["weights_sha256"] is None:
                try:
                    entry["weights_sha256"] = read_metadata(self.out / checkpoint_name(entry[self.unit]))["weights_sha256"]
                except ValueError:
                    if strict:
                        raise

    def cut_jsonl(self, name: str, key: str) -> list[dict]:
        """Rows of `name` with `key` <= position, rewritten as the file (rows an interrupted run wrote
        after its checkpoint are recomputed); rank 0 only."""
        path = self.out / name
        kept = [r for r in read_jsonl(path) if r[key] <= self.position]
        write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept), within=self.out)
        return kept

    # -- receipts ------------------------------------------------------------------------------
    def write_receipt(self, status: str, elapsed: float, extra: dict | None = None) -> None:
        from glm53_flash.core.options import config_record
        from glm53_flash.core.receipts import peak_rss_bytes, provenance, write_json

        peak_vram = torch.cuda.max_memory_allocated(self.device) / 2**30 if self.device.type == "cuda" else None
        receipt = {
            "schema_version": "1.0", "status": status, "stage": self.stage, "run_config": config_record(self.cfg),
            self.length_field: self.total, "seed": self.cfg.seed, "device": str(self.device),
            "precision": self.precision.record(), "world_size": self.ctx.world_size,
            "elapsed_seconds": round(elapsed, 3),
            "peak_vram_gib": round(peak_vram, 3) if peak_vram is not None else None,
            "peak_rss_bytes": peak_rss_bytes(), "checkpoints": self.saved_checkpoints(),
            "provenance": provenance(device=str(self.device)),
        }
        receipt.update(self.receipt_fields())
        receipt.update(extra or {})
        write_json(self.out / self.RECEIPT_FILE, receipt, within=self.out)

    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.session_start

    def mark_interrupted(self) -> None:
        from glm53_flash.train.rundir import finished_receipt

        if not self.trained_this_session and finished_receipt(self.out / self.RECEIPT_FILE) is not None:
            return  # stopped while finding a finished run finished: its receipt stays as it is
        if self.ctx.is_main and self.can_mark_interrupted():
            self._fill_hashes(strict=False)
            saved = self.saved_checkpoints()
            self.write_receipt("interrupted", self.elapsed(), {
                "resume_command": self.resume_hint(),
                f"resumes_from_{self.unit}": saved[-1][self.unit] if saved else None})

    def redo(self) -> str | None:
        from glm53_flash.train.rundir import redo_note

        saved = [c[self.unit] for c in self.saved_checkpoints()]
        return redo_note(self.position, max(saved) if saved else None, unit=self.unit)

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> dict:
        """Lock, prepare (fresh or resumed), train to the end with checkpoints and receipts, release;
        returns the final receipt on rank 0 ({} elsewhere)."""
        from glm53_flash.core.options import config_record
        from glm53_flash.core.progress import progress_bar
        from glm53_flash.core.shared_machine import governed
        from glm53_flash.train.distributed import lock_on_main, teardown_distributed
        from glm53_flash.train.rundir import AlreadyFinished, finished_receipt, interruptible

        cfg, ctx = self.cfg, self.ctx
        self.session_start = time.perf_counter()
        lock = lock_on_main(ctx, self.out, self.device)
        sink = bar = None
        result: dict = {}
        try:
            with interruptible(self.mark_interrupted, self.resume_hint(), announce=ctx.is_main, redo=self.redo):
                self.prepare()
                self.prepared = True
                finished = (finished_receipt(self.out / self.RECEIPT_FILE, (self.length_field, self.total),
                                             self.checkpoints) if self.position >= self.total else None)
                if finished is not None:  # resumed after its last step: nothing to train, the receipt stays
                    raise AlreadyFinished(finished if ctx.is_main else {})
                self.session_start = time.perf_counter()
                if ctx.is_main:
                    sink = MetricsSink(self.out / self.METRICS_FILE, tensorboard=cfg.tensorboard, wandb=cfg.wandb,
                                       run_name=self.out.name, config=config_record(cfg),
                                       resumed_at=self.position or None, namespace=self.namespace)
                bar = progress_bar(self.total, quiet=cfg.quiet or not ctx.is_main, initial=self.position,
                                   desc=self.desc, unit=self.unit)

                def step(position: int) -> dict | None:
                    self.trained_this_session = True
                    row = self.step(position)
                    self.position = self.advance(position)
                    return row

                def checkpoint(done: int) -> None:
                    if ctx.is_main:
                        elapsed = self.elapsed()
                        self.save_checkpoint_at(done, elapsed)
                        self.write_receipt("running", elapsed)
                    ctx.barrier()  # rank 0 has written the checkpoint

                def last_saved() -> int | None:  # where a restart with short spin waits resumes
                    return max((entry[self.unit] for entry in self.saved_checkpoints()), default=None)

                with self.session(), governed(cfg.adapt_threads, self.device) as self.governor:
                    StepLoop(self.position, self.total, step, sink=sink, bar=bar, governor=self.governor,
                             at_steps=[(set(self.checkpoint_positions()), checkpoint)], advance=self.advance,
                             postfix=self.postfix, restart_from=None if ctx.enabled else last_saved).run()
                self.governor = None
                if ctx.is_main:
                    self.write_receipt("complete", self.elapsed(), self.final_fields())
                    result = read_json(self.out / self.RECEIPT_FILE)
        except AlreadyFinished as done:
            result = done.receipt
        finally:
            self.governor = None
            if bar is not None:
                bar.close()
            if sink is not None:
                sink.close()
            if lock is not None:
                lock.release()
        teardown_distributed(ctx)
        return result


__all__ = ["MetricsSink", "OPTIMIZER_KERNELS", "PRETRAINING", "RL", "SCHEDULES", "STUDY", "STUDY_LEARNING_RATE",
           "Schedule", "StepLoop", "TORCH_BETAS", "Trainer", "TrainingDiverged", "UpdateRecipe", "VISION",
           "check_live_logging", "make_optimizer", "optimizer_step", "parameter_groups", "set_learning_rate",
           "stop_when_not_finite"]
