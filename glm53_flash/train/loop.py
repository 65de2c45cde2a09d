"""The training skeleton shared by pretraining and the pretraining-data study (and the pieces RL and
vision reuse): how one language-model update's objective is computed (its optimizer step is the
engine's, train/engine.py, like every loop's), the step loop with its per-step metrics, progress bar
and "at step N" actions (checkpoints, evaluations), and where metrics go.

The two loops differ on purpose in how they optimise, and each difference is a named field of
`UpdateRecipe` rather than an accident of two copies of the loop:

| field                  | pretraining (`PRETRAINING`)         | pretraining-data study (`STUDY`)     |
|------------------------|-------------------------------------|--------------------------------------|
| decay_all_parameters   | False: weight matrices only         | True: every parameter, norms included (the original miniature study's optimiser) |
| optimizer_kernel       | "fused" where torch has one         | "torch-default" (what AdamW picks by itself) |
| mixed_precision        | True: bf16 autocast on CUDA         | False: fp32 everywhere               |
| stop_on_divergence     | True: a non-finite loss or gradient stops the run | False: the run goes on and its metrics record the NaN |

Both compute the same objective: token-mean cross-entropy over the labels that are not
`IGNORE_INDEX` (padding) + the model's balance weight x its balance loss, gradients clipped to
`grad_clip`, AdamW betas (0.9, 0.95).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from glm53_flash.data.batches import IGNORE_INDEX
from glm53_flash.core.progress import ProgressLines, progress_bar  # noqa: F401  (re-exported: the loops' progress)
from glm53_flash.model.precision import compute_in
from glm53_flash.train.engine import (  # noqa: F401 - re-exported: the recipes and the optimizer live in the engine
    OPTIMIZER_KERNELS, PRETRAINING, STUDY, TrainingDiverged, UpdateRecipe, make_optimizer, optimizer_step,
    parameter_groups, set_learning_rate,
)

@dataclass
class UpdateResult:
    loss: float            # cross-entropy per target token over the global batch (all ranks)
    aux_loss: float        # balance loss (summed over ranks)
    grad_norm: float       # before clipping
    tokens: int            # target tokens in the global batch
    cross_entropy: torch.Tensor  # this rank's token-mean CE term of the objective (detached, fp32)


def language_model_update(model: torch.nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor,
                          labels: torch.Tensor, recipe: UpdateRecipe, *, learning_rate: float | None = None,
                          tokens: int | None = None, train_model: torch.nn.Module | None = None,
                          ctx=None, precision=None) -> UpdateResult:
    """One AdamW update on (inputs, labels) of the token-mean cross-entropy + balance term.

    `model` is the plain module (its parameters are clipped, its config gives the balance weight);
    `train_model` what runs the forward (a compiled or DDP wrapper; default `model`). Under DDP
    (`ctx` enabled) each rank holds a slice of the batch and `tokens` counts the whole batch's
    targets: each rank's objective is its share of the global token mean, times the world size
    because DDP averages gradients; the balance statistics are summed across ranks inside the MoE.
    `precision` (a model/precision.Precision) is the forward's; None: the recipe's (bf16 autocast on CUDA
    where `mixed_precision`, float32 elsewhere). A recipe without mixed precision stays float32 always.
    """
    world = ctx.world_size if ctx is not None else 1
    distributed = ctx is not None and ctx.enabled
    if tokens is None:
        tokens = int((labels != IGNORE_INDEX).sum())
    if learning_rate is not None:
        set_learning_rate(optimizer, learning_rate)
    forward = train_model if train_model is not None else model
    if not recipe.mixed_precision:
        context = contextlib.nullcontext()
    else:
        context = compute_in(precision, inputs.device)
    with context:
        out = forward(inputs, balance_reduce=ctx.all_sum if distributed else None)
        ce_sum = F.cross_entropy(out.logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX,
                                 reduction="sum")
    cross_entropy = ce_sum / tokens
    objective = world * (cross_entropy + model.config.balance_loss_weight * out.aux_loss)
    measured = {}

    def check(grad_norm: float) -> None:  # after the backward and the clip, before the update
        if distributed:
            totals = ctx.all_sum(torch.stack([ce_sum.detach().float(), out.aux_loss.detach().float()]))
            measured.update(loss=float(totals[0]) / tokens, aux=float(totals[1]))
        else:
            measured.update(loss=float(ce_sum.detach()) / tokens, aux=float(out.aux_loss.detach()))
        if recipe.stop_on_divergence and not (math.isfinite(measured["loss"]) and math.isfinite(grad_norm)):
            raise TrainingDiverged(f"loss {measured['loss']}, gradient norm {grad_norm}")

    grad_norm = optimizer_step(optimizer, model.parameters(), objective, grad_clip=recipe.grad_clip, check=check)
    loss, aux = measured["loss"], measured["aux"]
    return UpdateResult(loss=loss, aux_loss=aux, grad_norm=grad_norm, tokens=tokens,
                        cross_entropy=cross_entropy.detach())


# ----------------------------------------------------------------------------------- progress


# ----------------------------------------------------------------------------------- the loop


@dataclass
class StepLoop:
    """Steps `start` .. `stop` - 1 of a run: `step(s)` trains step s (0-based) and returns its metrics
    row; each row goes to `sink` (metrics.jsonl, TensorBoard, W&B) and the progress bar; after step
    s, every `(steps, action)` of `at_steps` whose steps contain s + 1 runs `action(s + 1)` (a
    checkpoint, an evaluation)."""

    start: int
    stop: int
    step: Callable[[int], dict]
    sink: "MetricsSink | None" = None
    at_steps: Iterable[tuple[Collection[int], Callable[[int], None]]] = ()
    bar: object = None
    postfix: Callable[[dict], dict] | None = None
    governor: object = None  # a runtime.ThreadGovernor: the thread count follows the free cores

    def run(self) -> None:
        actions = list(self.at_steps)
        try:
            for index in range(self.start, self.stop):
                row = self.step(index)
                if self.governor is not None:
                    row["threads"] = self.governor.threads  # the count this step ran with
                    self.governor.after_step()
                done = index + 1
                if self.sink is not None:
                    self.sink.write(row, done)
                if self.bar is not None:
                    self.bar.update(1)
                    if self.postfix is not None:
                        self.bar.set_postfix(**self.postfix(row))
                for steps, action in actions:
                    if done in steps:
                        action(done)
        finally:
            if self.bar is not None:
                self.bar.close()


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
            import json

            with open(self.jsonl_path, "a") as handle:
                handle.write(json.dumps(row, sort_keys=True) + "\n")
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


__all__ = ["MetricsSink", "OPTIMIZER_KERNELS", "PRETRAINING", "STUDY", "StepLoop", "TrainingDiverged",
           "UpdateRecipe", "UpdateResult", "check_live_logging", "language_model_update", "make_optimizer",
           "parameter_groups", "progress_bar"]
