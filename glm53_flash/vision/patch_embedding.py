"""RGB patch embedding: non-overlapping 4x4 patches -> tokens in row-major order + learned positions.

GLM-5.3-Flash's vision tower embeds 3D (temporal x 14 x 14) patches and uses 2D RoPE; the miniature
keeps still images, a 2D convolution with kernel = stride = patch size, and a learned position table.
"""

from __future__ import annotations

import torch
from torch import nn

from glm53_flash.vision.config import VisionConfig


class RGBPatchEmbedding(nn.Module):
    def __init__(self, cfg: VisionConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.proj = nn.Conv2d(cfg.in_channels, cfg.hidden_size, kernel_size=cfg.patch_size,
                              stride=cfg.patch_size, bias=True)
        grid = cfg.patch_grid_size
        self.position = nn.Parameter(torch.empty(1, grid * grid, cfg.hidden_size).normal_(0.0, 0.02))

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """images [B, 3, S, S] -> (tokens [B, h*w, C], (h, w)); token r*w + c is patch row r, column c."""
        check_images(images, self.cfg.image_size)
        grid = self.proj(images)  # [B, C, h, w]
        h, w = grid.shape[-2:]
        tokens = grid.flatten(2).transpose(1, 2)  # [B, h*w, C], row-major over (h, w)
        return tokens + self.position, (h, w)


def check_images(images, size: int) -> None:
    if not isinstance(images, torch.Tensor):
        # ValueError, not TypeError: every bad input reaches the CLI's one-line error path.
        raise ValueError(f"images must be a torch.Tensor, got {type(images).__name__}")  # noqa: TRY004
    if images.dim() != 4 or images.shape[1] != 3 or images.shape[2] != size or images.shape[3] != size:
        raise ValueError(f"images must have shape [batch, 3, {size}, {size}], got {tuple(images.shape)}")
    if not images.is_floating_point():
        raise ValueError(f"images must be floating point (values in [0, 1]), got {images.dtype}")
