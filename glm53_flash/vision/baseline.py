"""Direct-patch baseline (NOT GLM-faithful): 8x8 patches projected straight to the LM width, prepended.

A control for the faithful path. It has no vision transformer, no merge, no projector and no image
boundary tokens: a strided convolution turns the 32x32 image into 16 vectors, adds a learned position
table and one learned "modality" vector, and puts them before BOS.
"""

from __future__ import annotations

import torch
from torch import nn

from glm53_flash.model import GLM53Flash, ModelOutput
from glm53_flash.vision.patch_embedding import check_images
from glm53_flash.vision.sequence import check_text_ids


class DirectPatchImageEncoder(nn.Module):
    def __init__(self, dim: int, patch_size: int = 8, image_size: int = 32) -> None:
        super().__init__()
        if patch_size < 1 or image_size % patch_size:
            raise ValueError(f"image_size {image_size} must be a positive multiple of patch_size {patch_size}")
        self.image_size = image_size
        self.patch_size = patch_size
        self.proj = nn.Conv2d(3, dim, kernel_size=patch_size, stride=patch_size, bias=True)
        count = (image_size // patch_size) ** 2
        self.position = nn.Parameter(torch.empty(1, count, dim).normal_(0.0, 0.02))
        self.modality = nn.Parameter(torch.empty(1, 1, dim).normal_(0.0, 0.02))

    @property
    def visual_token_count(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """images [B, 3, S, S] -> [B, (S/8)^2, dim], row-major over patches."""
        check_images(images, self.image_size)
        tokens = self.proj(images).flatten(2).transpose(1, 2)
        return tokens + self.position + self.modality


class DirectPatchVisionLanguageModel(nn.Module):
    """Baseline, not GLM-faithful: the 16 image vectors come before the text, with no boundary ids."""

    architecture = "baseline"
    glm_faithful = False

    def __init__(self, language_model: GLM53Flash, patch_size: int = 8, image_size: int = 32) -> None:
        super().__init__()
        self.language_model = language_model
        self.vision = DirectPatchImageEncoder(language_model.config.dim, patch_size, image_size)

    @property
    def visual_token_count(self) -> int:
        return self.vision.visual_token_count

    @property
    def boundary_token_count(self) -> int:
        return 0

    @property
    def inserted_token_count(self) -> int:
        return self.visual_token_count

    def embed_multimodal(self, images: torch.Tensor, text_ids: torch.Tensor) -> torch.Tensor:
        """images [B, 3, S, S], text_ids [B, T] -> [B, 16 + T, D]."""
        check_images(images, self.vision.image_size)
        check_text_ids(text_ids, self.language_model.config.vocab_size)
        if images.shape[0] != text_ids.shape[0]:
            raise ValueError(f"got {images.shape[0]} images for {text_ids.shape[0]} text rows")
        text = self.language_model.embedding(text_ids.long())
        return torch.cat((self.vision(images).to(text.dtype), text), dim=1)

    def forward(self, images: torch.Tensor, text_ids: torch.Tensor) -> ModelOutput:
        return self.language_model.forward_embeddings(self.embed_multimodal(images, text_ids))
