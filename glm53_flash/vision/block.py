"""One vision transformer block: pre-norm attention and a pre-norm SwiGLU MLP, each residual.

Mirrors the block of GLM-5.3-Flash's vision tower (RMSNorm, bidirectional attention with q/k norm,
SwiGLU), at width 24 with 4 heads instead of 1024 with 16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from glm53_flash.model.norm import RMSNorm
from glm53_flash.vision.attention import VisionSelfAttention


class VisionSwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)), every projection with a bias."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate = nn.Linear(hidden, intermediate, bias=True)
        self.up = nn.Linear(hidden, intermediate, bias=True)
        self.down = nn.Linear(intermediate, hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class VisionTransformerBlock(nn.Module):
    def __init__(self, hidden: int, heads: int, intermediate: int, eps: float) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(hidden, eps)
        self.attention = VisionSelfAttention(hidden, heads, eps)
        self.mlp_norm = RMSNorm(hidden, eps)
        self.mlp = VisionSwiGLU(hidden, intermediate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, N, C] -> [B, N, C]."""
        x = x + self.attention(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))
