"""The residual streams' write, streams + weights (x) update, with a hand-written backward (`add_outer`).

torch.addcmul(streams, weights.view(-1, 1, 1, 1), update.unsqueeze(0)) computes the value; its autograd
graph (the reference, `reference_add_outer`) forms two [S, B, T, D] products in the backward and reduces
them; here the weights' and the update's gradients are one matrix-vector product each over the incoming
[S, N] gradient, which passes on to the streams as it is. Without gradients the plain addcmul.
"""

from __future__ import annotations

import torch


def reference_add_outer(streams: torch.Tensor, weights: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
    return torch.addcmul(streams, weights.view(-1, 1, 1, 1), update.unsqueeze(0))


class _AddOuter(torch.autograd.Function):
    """streams + weights (x) update: streams [S, B, T, D], weights [S], update [B, T, D]."""

    @staticmethod
    def forward(ctx, streams: torch.Tensor, weights: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(weights, update)
        return reference_add_outer(streams, weights, update)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        weights, update = ctx.saved_tensors
        flat = grad.reshape(grad.shape[0], -1)
        # addcmul promoted: float32 streams with bf16 weights and update (CUDA autocast) give a float32
        # gradient; the products run in its dtype and autograd casts each result back to its input's.
        grad_weights = torch.mv(flat, update.reshape(-1).to(flat.dtype)) if ctx.needs_input_grad[1] else None
        grad_update = torch.mv(flat.t(), weights.to(flat.dtype)).view(update.shape) if ctx.needs_input_grad[2] else None
        return grad, grad_weights, grad_update


def add_outer(streams: torch.Tensor, weights: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
    """streams [S, B, T, D] + weights [S] (x) update [B, T, D]."""
    if not torch.is_grad_enabled():  # decoding: an autograd.Function's call costs more than the sum
        return reference_add_outer(streams, weights, update)
    return _AddOuter.apply(streams, weights, update)


__all__ = ["add_outer", "reference_add_outer"]
