"""The GLM-style miniature vision encoder: patches -> bidirectional blocks -> RMSNorm -> 2x2 merge -> projector.

32x32 RGB -> 64 patch tokens (4x4 patches) -> `depth` blocks -> RMSNorm -> 16 merged tokens at the
language model's width -> gated projector. GLM-5.3-Flash's tower does the same at 24 blocks and
variable resolution.
"""

from __future__ import annotations

import torch
from torch import nn

from glm53_flash.model.norm import RMSNorm
from glm53_flash.vision.block import VisionTransformerBlock
from glm53_flash.vision.config import VisionConfig
from glm53_flash.vision.merger import SpatialMerger2x2
from glm53_flash.vision.patch_embedding import RGBPatchEmbedding
from glm53_flash.vision.projector import MultimodalProjector


class MiniGLMVisionEncoder(nn.Module):
    def __init__(self, cfg: VisionConfig, lm_dim: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.lm_dim = lm_dim
        self.patch_embed = RGBPatchEmbedding(cfg)
        self.blocks = nn.ModuleList(
            VisionTransformerBlock(cfg.hidden_size, cfg.heads, cfg.intermediate_size, cfg.rms_norm_eps)
            for _ in range(cfg.depth))
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.merger = SpatialMerger2x2(cfg.hidden_size, lm_dim)
        self.projector = MultimodalProjector(lm_dim, cfg.projection_intermediate_size)

    @property
    def visual_token_count(self) -> int:
        return self.cfg.visual_token_count

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """images [B, 3, S, S] -> visual embeddings [B, (S/8)^2, lm_dim] (16 for S = 32)."""
        tokens, grid = self.patch_embed(images)  # [B, 64, C]
        for block in self.blocks:
            tokens = block(tokens)
        merged = self.merger(self.post_norm(tokens), grid)  # [B, 16, lm_dim]
        return self.projector(merged)
