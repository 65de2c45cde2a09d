"""Learned 2x2 spatial merge: each 2x2 block of neighbouring patch tokens -> one token at LM width.

GLM-5.3-Flash merges 2x2 patches before the projector; so does the miniature, as gather + Linear,
which equals a stride-2 convolution (its test checks that equality and the block ordering). A
plain reshape of the row-major token list would group four patches of one row instead of a 2x2
square; that is the mistake this module's test is built to catch.
"""

from __future__ import annotations

import torch
from torch import nn


class SpatialMerger2x2(nn.Module):
    merge = 2

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.in_dim = in_dim
        self.proj = nn.Linear(self.merge * self.merge * in_dim, out_dim, bias=True)

    def forward(self, tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """tokens [B, h*w, C] (row-major) -> [B, (h/2)*(w/2), out_dim] (row-major over 2x2 blocks)."""
        return self.proj(gather_2x2_blocks(tokens, grid))


def gather_2x2_blocks(tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """[B, h*w, C] -> [B, (h/2)*(w/2), 4C]; each block's features in (C, dy, dx) order."""
    b, n, c = tokens.shape
    h, w = grid
    if h * w != n:
        raise ValueError(f"grid {h}x{w} does not match {n} tokens")
    if h % 2 or w % 2:
        raise ValueError(f"the 2x2 merge needs an even grid, got {h}x{w}")
    image = tokens.transpose(1, 2).reshape(b, c, h // 2, 2, w // 2, 2)  # [B, C, h/2, dy, w/2, dx]
    blocks = image.permute(0, 2, 4, 1, 3, 5)  # [B, h/2, w/2, C, dy, dx]
    return blocks.reshape(b, (h // 2) * (w // 2), 4 * c)
