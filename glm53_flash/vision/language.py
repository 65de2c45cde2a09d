"""The GLM-faithful vision-language wrapper: visual vectors scattered into placeholder slots.

Text ids with the image span are embedded by the language model's (tied) embedding; the rows of the
16 placeholders are replaced by the encoder's outputs and the language model runs on the embeddings,
as GLM-5.3-Flash does with its image tokens.
"""

from __future__ import annotations

import torch
from torch import nn

from glm53_flash.model import GLM53Flash, ModelOutput
from glm53_flash.vision.config import IMAGE_TOKENS, ImageTokenIds, VisionConfig
from glm53_flash.vision.encoder import MiniGLMVisionEncoder
from glm53_flash.vision.patch_embedding import check_images
from glm53_flash.vision.sequence import build_multimodal_input_ids, check_text_ids


class VisionLanguageModel(nn.Module):
    architecture = "faithful"
    glm_faithful = True

    def __init__(self, language_model: GLM53Flash, vision_config: VisionConfig | None = None,
                 token_ids: ImageTokenIds = IMAGE_TOKENS) -> None:
        super().__init__()
        vocab = language_model.config.vocab_size
        if vocab < token_ids.required_vocab_size:
            raise ValueError(f"the language model's vocab_size {vocab} has no room for the image ids; "
                             f"it must be >= {token_ids.required_vocab_size}")
        self.language_model = language_model
        self.vision_config = vision_config or VisionConfig()
        self.token_ids = token_ids
        self.vision = MiniGLMVisionEncoder(self.vision_config, language_model.config.dim)

    @property
    def visual_token_count(self) -> int:
        return self.vision_config.visual_token_count

    @property
    def boundary_token_count(self) -> int:
        return 2

    @property
    def inserted_token_count(self) -> int:
        return self.visual_token_count + self.boundary_token_count

    def multimodal_ids(self, text_ids: torch.Tensor) -> torch.Tensor:
        return build_multimodal_input_ids(text_ids, self.visual_token_count, self.token_ids)

    def embed_multimodal(self, images: torch.Tensor, text_ids: torch.Tensor) -> torch.Tensor:
        """images [B, 3, S, S], text_ids [B, T] -> embeddings [B, T + n + 2, D]."""
        check_images(images, self.vision_config.image_size)
        check_text_ids(text_ids, self.language_model.config.vocab_size)
        ids = self.multimodal_ids(text_ids)
        if images.shape[0] != ids.shape[0]:
            raise ValueError(f"got {images.shape[0]} images for {ids.shape[0]} text rows")
        slots = ids == self.token_ids.placeholder  # [B, L]
        per_row = slots.sum(1)
        if bool((per_row != self.visual_token_count).any()):
            raise ValueError(f"every row needs exactly {self.visual_token_count} placeholder ids "
                             f"({self.token_ids.placeholder}); got counts {per_row.tolist()}")
        embedded = self.language_model.embedding(ids)  # [B, L, D]
        visual = self.vision(images).to(embedded.dtype)  # [B, n, D]
        # masked_scatter fills the True slots in row-major order: row b's placeholders get visual[b].
        return embedded.masked_scatter(slots.unsqueeze(-1), visual)

    def forward(self, images: torch.Tensor, text_ids: torch.Tensor) -> ModelOutput:
        return self.language_model.forward_embeddings(self.embed_multimodal(images, text_ids))
