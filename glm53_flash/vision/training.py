"""Training the miniature vision-language models on generated digits, and the faithful-vs-baseline run.
Each arm's steps run in the engine's StepLoop (train/engine.py) with the `VISION` recipe.

Both architectures get the same seed reset before construction (so the same language-model weights),
the same image seeds and the same batches. Step s (from 0) uses digits (arange(B) + s) % 10 drawn
with seed + s; held-out images use seed 10000 + seed, before and after training. Loss: cross-entropy
on the answer byte only + the balance term; AdamW (weight decay 0.01), gradients clipped at 1.0.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from glm53_flash.core.receipts import peak_rss_bytes, provenance
from glm53_flash.core.runtime import resolve_device, seed_everything
from glm53_flash.model.precision import compute_in, resolve_precision
from glm53_flash.train.engine import (VISION, StepLoop, TrainingDiverged, UpdateRecipe, make_optimizer, optimizer_step,
                                      stop_when_not_finite)
from glm53_flash.core.progress import progress_bar
from glm53_flash.vision.config import MINIATURE_LM, MINIATURE_VISION
from glm53_flash.vision.digits import PROMPT_LENGTH, digit_token_ids, render_digits
from glm53_flash.vision.evaluation import evaluate_digits
from glm53_flash.vision.models import build_vision_model, describe
from glm53_flash.vision.run_config import SMOKE_CAPS, VisionTrainConfig, check_budget  # noqa: F401 (the library's names)
from glm53_flash.vision.sequence import IGNORE_INDEX, answer_only_labels

HELD_OUT_OFFSET = 10000


@contextlib.contextmanager
def cpu_threads(count: int | None):
    """torch's intra-op thread count for the duration (restored afterwards); None leaves it alone."""
    before = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def deterministic(device: torch.device):
    """Deterministic kernels on the CPU for the duration (restored afterwards)."""
    if device.type != "cpu":
        yield
        return
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


def training_batch(step: int, batch_size: int, seed: int, label_stride: int = 1):
    """(images [B, 3, 32, 32], tokens [B, 9]) of step `step` (from 0)."""
    labels = (torch.arange(batch_size) + label_stride * step) % 10
    return render_digits(labels, seed + step), digit_token_ids(labels)


def digit_loss(model: nn.Module, images: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(answer-only cross-entropy, balance term) for one batch; the prompt alone is fed."""
    out = model(images, tokens[:, :-1])
    labels = answer_only_labels(tokens, PROMPT_LENGTH, model.visual_token_count, model.boundary_token_count)
    logits = out.logits  # [B, inserted + 8, V]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                         ignore_index=IGNORE_INDEX)
    return ce, out.aux_loss


def vision_recipe(cfg) -> "UpdateRecipe":
    """The engine's VISION recipe with a run config's learning rate, weight decay and clip."""
    return replace(VISION, learning_rate=cfg.learning_rate, weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip)


def optimisation_step(model, optimizer, params, images, tokens, grad_clip: float) -> tuple[float, float]:
    """One AdamW update; returns (language loss, gradient norm). Raises TrainingDiverged if non-finite."""
    ce, aux = digit_loss(model, images, tokens)
    loss = ce + model.language_model.config.balance_loss_weight * aux
    if not torch.isfinite(loss):
        raise TrainingDiverged(f"non-finite loss {float(loss)}")
    norm = optimizer_step(optimizer, params, loss, grad_clip=grad_clip, check=stop_when_not_finite("gradient"))
    return float(ce.detach()), norm


def train_arm(architecture: str, seed: int, cfg: VisionTrainConfig, device: torch.device, bar=None):
    """Train one architecture from one seed; returns (result dict, trained model)."""
    seed_everything(seed)
    model = build_vision_model(architecture, MINIATURE_LM, MINIATURE_VISION).to(device)
    held_out = HELD_OUT_OFFSET + seed
    before = evaluate_digits(model, cfg.eval_examples, held_out)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(model, vision_recipe(cfg))
    model.train()
    curve = []

    def step(index: int) -> dict:
        images, tokens = training_batch(index, cfg.batch_size, seed)
        try:
            loss, norm = optimisation_step(model, optimizer, params, images.to(device), tokens.to(device),
                                           cfg.grad_clip)
        except TrainingDiverged as error:
            raise TrainingDiverged(f"{architecture} seed {seed} step {index + 1}: {error}") from None
        curve.append(round(loss, 6))
        return {"step": index + 1, "loss": loss, "grad_norm": norm}

    start = time.perf_counter()
    StepLoop(0, cfg.steps, step, bar=bar,
             postfix=lambda row: {"arm": architecture, "seed": seed, "loss": f"{row['loss']:.3f}"}).run()
    train_seconds = time.perf_counter() - start
    after = evaluate_digits(model, cfg.eval_examples, held_out)
    result = {**describe(model), "seed": seed, "held_out_seed": held_out, "before": before, "after": after,
              "final_training_loss": curve[-1], "training_loss_curve": curve,
              "wall_time_seconds": round(train_seconds, 4)}
    return result, model


def run_vision_training(cfg: VisionTrainConfig, argv: list[str] | None = None, on_model=None) -> dict:
    """Train every (seed, architecture) pair; `on_model(result, model)` may save weights. Returns the receipt."""
    cfg.validate()
    cfg = cfg.effective()
    device = resolve_device(cfg.device)
    precision = resolve_precision(cfg.precision, device)
    bar = progress_bar(cfg.steps * len(cfg.seeds) * len(cfg.architectures), quiet=not cfg.progress,
                       desc="vision train")
    results = []
    start = time.perf_counter()
    try:
        with deterministic(device), cpu_threads(cfg.threads), compute_in(precision, device):
            threads = torch.get_num_threads()
            for seed in cfg.seeds:
                for architecture in cfg.architectures:
                    result, model = train_arm(architecture, seed, cfg, device, bar)
                    if on_model is not None:
                        result["weights"] = on_model(result, model)
                    results.append(result)
    finally:
        if bar is not None:
            bar.close()
    total = time.perf_counter() - start
    return {
        "schema_version": "1.0",
        "kind": "vision-miniature-rgb-digits",
        "status": "complete",
        "dataset": "generated seven-segment RGB digits (32x32, glm53_flash.vision.digits)",
        "split": {"training_seed_schedule": "seed + step (step from 0)",
                  "held_out_seed": f"{HELD_OUT_OFFSET} + seed", "held_out_reused_before_after": True,
                  "downloaded_data": False},
        "config": {
            "architectures": list(cfg.architectures), "seeds": list(cfg.seeds), "steps": cfg.steps,
            "batch_size": cfg.batch_size, "training_examples_seen_per_model": cfg.steps * cfg.batch_size,
            "eval_examples": cfg.eval_examples, "learning_rate": cfg.learning_rate,
            "weight_decay": cfg.weight_decay, "grad_clip": cfg.grad_clip, "smoke_test": cfg.smoke_test,
            "deterministic_cpu_kernels": device.type == "cpu",
            "language_model": MINIATURE_LM.to_dict(), "vision_model": MINIATURE_VISION.to_dict(),
        },
        "provenance": provenance(argv, str(device)),
        "environment": {"device": str(device), "torch_version": torch.__version__,
                        "torch_threads": threads},
        "precision": precision.record(),
        "results": results,
        "total_wall_time_seconds": round(total, 4),
        "peak_rss_bytes": peak_rss_bytes(),
        "checkpoint_saved": any(r.get("weights") for r in results),
    }
