"""The one place training changes weights. Every loop (pretraining and the pretraining-data study through
train/loop.py, RL in train/rl.py, vision training and the vision pilot) builds its optimizer with
`make_optimizer` from an `UpdateRecipe` and takes each step with `optimizer_step`: zero the
gradients, backward, sum them across ranks where the loop does that itself, clip, let the loop look
at the gradient norm (and stop a diverged run), update. The recipes the loops use:

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

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from glm53_flash.core.runtime import fused_optimizer_supported
from glm53_flash.train.config import STUDY_LEARNING_RATE

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


__all__ = ["OPTIMIZER_KERNELS", "PRETRAINING", "RL", "STUDY", "STUDY_LEARNING_RATE", "TORCH_BETAS", "TrainingDiverged",
           "UpdateRecipe", "VISION", "make_optimizer", "optimizer_step", "parameter_groups", "set_learning_rate",
           "stop_when_not_finite"]
