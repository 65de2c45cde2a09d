"""Bidirectional self-attention of the vision blocks, with RMSNorm on each head's queries and keys.

As in GLM-5.3-Flash's vision tower every patch attends to every other (no causal mask) and q/k are
RMS-normalised per head. The miniature has no position encoding inside attention (no 2D RoPE): the
patch embedding's learned table carries positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from glm53_flash.model.norm import RMSNorm


class VisionSelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, eps: float) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden {hidden} must be a multiple of heads {heads}")
        self.heads = heads
        self.head_dim = hidden // heads
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=True)
        self.q_norm = RMSNorm(self.head_dim, eps)
        self.k_norm = RMSNorm(self.head_dim, eps)
        self.out = nn.Linear(hidden, hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, N, C] -> [B, N, C]."""
        b, n, c = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)  # 3 x [B, H, N, d]
        q, k = self.q_norm(q), self.k_norm(k)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=False)  # [B, H, N, d]
        return self.out(attended.transpose(1, 2).reshape(b, n, c))
