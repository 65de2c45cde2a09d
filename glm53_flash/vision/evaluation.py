"""Held-out digit evaluation: greedy next-id prediction after the prompt, accuracy, CE, confusion.

The prediction is the argmax over every id (263 with the image ids), so a model may predict an
image id; it is recorded and decoded to "" rather than crashing (the original crashed there).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from glm53_flash.data.tokenizer import ByteTokenizer
from glm53_flash.vision.digits import DIGIT_TOKEN_IDS, id_to_digit, prompt_ids, render_digits

TOKENIZER = ByteTokenizer()
CONFUSION_COLUMNS = [str(d) for d in range(10)] + ["other"]


def held_out_labels(examples: int) -> torch.Tensor:
    """Balanced held-out targets: 0, 1, ..., 9, 0, 1, ..."""
    return torch.arange(examples) % 10


@torch.no_grad()
def predict_ids(model: nn.Module, images: torch.Tensor, chunk: int = 100) -> torch.Tensor:
    """images [N, 3, S, S] -> last-position logits [N, V] after the "Digit: " prompt."""
    device = next(model.parameters()).device
    rows = []
    for start in range(0, images.shape[0], chunk):
        batch = images[start:start + chunk].to(device)
        out = model(batch, prompt_ids(batch.shape[0]).to(device))
        rows.append(out.logits[:, -1, :].float().cpu())
    return torch.cat(rows)


def confusion_matrix(targets: list[int], predictions: list[int]) -> list[list[int]]:
    """rows: target digit 0-9; columns: predicted digit 0-9, then "other" (any non-digit id)."""
    matrix = [[0] * len(CONFUSION_COLUMNS) for _ in range(10)]
    for target, predicted in zip(targets, predictions):
        digit = id_to_digit(predicted)
        matrix[target][10 if digit is None else digit] += 1
    return matrix


def evaluate_digits(model: nn.Module, examples: int, render_seed: int) -> dict:
    """Accuracy and cross-entropy on `examples` generated images drawn with `render_seed`."""
    was_training = model.training
    model.eval()
    try:
        labels = held_out_labels(examples)
        logits = predict_ids(model, render_digits(labels, render_seed))
    finally:
        model.train(was_training)
    return summarise_predictions(logits, labels, render_seed)


def summarise_predictions(logits: torch.Tensor, labels: torch.Tensor, render_seed: int) -> dict:
    """logits [N, V] at the answer position, digit labels [N] -> the evaluation record."""
    examples = int(labels.shape[0])
    target_ids = torch.tensor([DIGIT_TOKEN_IDS[int(d)] for d in labels])
    predicted = logits.argmax(-1)
    correct = predicted == target_ids
    targets, predictions = labels.tolist(), predicted.tolist()
    return {
        "accuracy": float(correct.float().mean()),
        "correct": int(correct.sum()),
        "examples": examples,
        "loss": float(F.cross_entropy(logits, target_ids)),
        "render_seed": render_seed,
        "targets": targets,
        "prediction_ids": predictions,
        "correct_by_example": [bool(c) for c in correct.tolist()],
        "confusion": {"columns": CONFUSION_COLUMNS, "matrix": confusion_matrix(targets, predictions)},
        "samples": [{"target": str(t), "prediction": TOKENIZER.decode([p]), "prediction_id": p}
                    for t, p in zip(targets[:10], predictions[:10])],
    }
