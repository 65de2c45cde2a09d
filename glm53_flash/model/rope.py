"""Rotary position embedding with cached tables and a position offset (for cached decoding).

Interleaved-pair convention, as in the original miniature: channels (0,1), (2,3), ... rotate by
position * base^(-2i/d). The original recomputed the tables in every layer on every call and had no
offset, which made incremental decoding impossible; here one table serves every layer.
"""

from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_positions: int, base: float = 10000.0) -> None:
        super().__init__()
        inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
        # Each frequency serves a pair of adjacent channels: [P, d/2] -> [P, d]. Rounded to float32 before
        # the pairs are repeated (the same values; the float64 copy is half the size):
        # ModelConfig.rope_bytes counts this construction.
        self.register_buffer("cos", angles.cos().float().repeat_interleave(2, dim=-1), persistent=False)
        self.register_buffer("sin", angles.sin().float().repeat_interleave(2, dim=-1), persistent=False)

    def forward(self, x: torch.Tensor, position: int = 0) -> torch.Tensor:
        """Rotate x [B, H, T, d] whose first time step sits at absolute `position`."""
        t = x.shape[-2]
        cos = self.cos[position : position + t].to(x.dtype)
        sin = self.sin[position : position + t].to(x.dtype)
        pairs = x.unflatten(-1, (-1, 2))
        rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
        return x * cos + rotated * sin
