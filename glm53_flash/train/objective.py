"""The language-model update shared by pretraining, the pretraining-data study and `bench model`: the
objective of one step on (inputs, labels) and its optimizer step (the engine's, train/engine.py,
like every loop's; the loop, the metrics sink and the run directory are the engine's too).

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
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from glm53_flash.data.batches import IGNORE_INDEX
from glm53_flash.model.precision import compute_in
from glm53_flash.train.engine import TrainingDiverged, UpdateRecipe, optimizer_step, set_learning_rate

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


__all__ = ["UpdateResult", "language_model_update"]
