"""Gated projector from the merged visual tokens into the language model's embedding space.

Mirrors GLM-5.3-Flash's patch-merger head: Linear (no bias) -> LayerNorm -> GELU, then a SwiGLU
(gate/up to the intermediate size, down back), all without biases. No residual connection.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MultimodalProjector(nn.Module):
    def __init__(self, dim: int, intermediate: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim, bias=False)
        self.norm = nn.LayerNorm(dim)
        self.gate = nn.Linear(dim, intermediate, bias=False)
        self.up = nn.Linear(dim, intermediate, bias=False)
        self.down = nn.Linear(intermediate, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, N, D] -> [B, N, D]."""
        x = F.gelu(self.norm(self.proj(x)))
        return self.down(F.silu(self.gate(x)) * self.up(x))
