"""Residual streams: the miniature's simplified form of GLM-5.3-Flash's four-stream mHC.

Each block reads a softmax-weighted mix of the S streams and writes its update back with learned
per-stream weights. Modes (ModelConfig.stream_mode):
- "double-residual" (default, it trained best; docs/BENCHMARKS-HISTORY.md): streams += softmax(out) * (mix + update),
  the original's residual, which counts the identity path twice.
- "delta": streams += S * softmax(out) * update; the identity path is counted once.
- "sinkhorn": mHC-style; streams are first mixed by a doubly-stochastic S x S matrix (Sinkhorn
  iterations on learned logits, S^2 extra parameters per layer), then the delta update is added.
The write's weighted sum is ops.add_outer (a hand-written backward, model/ops/streams.py).
"""

from __future__ import annotations

import torch
from torch import nn

from glm53_flash.model import ops

SINKHORN_ITERATIONS = 8


def sinkhorn(logits: torch.Tensor, iterations: int = SINKHORN_ITERATIONS) -> torch.Tensor:
    """Approximately doubly-stochastic matrix from logits by alternating row/column normalisation."""
    log_matrix = logits.float()
    for _ in range(iterations):
        log_matrix = log_matrix - log_matrix.logsumexp(dim=1, keepdim=True)
        log_matrix = log_matrix - log_matrix.logsumexp(dim=0, keepdim=True)
    return log_matrix.exp()


class StreamConnection(nn.Module):
    def __init__(self, streams: int, mode: str) -> None:
        super().__init__()
        self.streams = streams
        self.mode = mode
        self.input_logits = nn.Parameter(torch.linspace(0.1, -0.1, streams))
        self.output_logits = nn.Parameter(torch.linspace(-0.1, 0.1, streams))
        if mode == "sinkhorn":
            # Near-identity start: strong diagonal so streams begin almost unmixed.
            self.mixing_logits = nn.Parameter(4.0 * torch.eye(streams))

    def read(self, streams: torch.Tensor) -> torch.Tensor:
        """streams [S, B, T, D] -> the block input [B, T, D]."""
        weights = torch.softmax(self.input_logits, dim=0).to(streams.dtype)
        if streams.stride(0) == 0:
            # Still the broadcast embedding: the streams are identical, so the mix is one stream times
            # the weights' sum (one); multiplying keeps input_logits in the graph for DDP.
            return streams[0] * weights.sum()
        return torch.matmul(weights, streams.flatten(1)).view(streams.shape[1:])

    def write(self, streams: torch.Tensor, mixed: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
        """Add the block's update (without its input) back into the streams."""
        weights = torch.softmax(self.output_logits, dim=0).to(update.dtype)
        if self.mode == "double-residual":
            return ops.add_outer(streams, weights, mixed + update)
        if self.mode == "sinkhorn":
            mixing = sinkhorn(self.mixing_logits).to(streams.dtype)
            streams = torch.matmul(mixing, streams.flatten(1)).view(streams.shape)
        return ops.add_outer(streams, self.streams * weights, update)
