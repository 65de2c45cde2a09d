"""Builders for the two miniature vision-language models and their parameter accounting."""

from __future__ import annotations

import torch
from torch import nn

from glm53_flash.model.config import ModelConfig
from glm53_flash.model import GLM53Flash
from glm53_flash.vision.baseline import DirectPatchVisionLanguageModel
from glm53_flash.vision.config import MINIATURE_LM, MINIATURE_VISION, VisionConfig, check_architecture
from glm53_flash.vision.language import VisionLanguageModel


def build_vision_model(architecture: str, lm_config: ModelConfig = MINIATURE_LM,
                       vision_config: VisionConfig = MINIATURE_VISION) -> nn.Module:
    """A fresh model; the language model is built first, so equal seeds give equal LM weights in both arms."""
    check_architecture(architecture)
    lm = GLM53Flash(lm_config)
    if architecture == "faithful":
        return VisionLanguageModel(lm, vision_config)
    return DirectPatchVisionLanguageModel(lm, image_size=vision_config.image_size)


def parameter_count(module: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


def describe(model: nn.Module) -> dict:
    return {
        "architecture": model.architecture,
        "glm_faithful": model.glm_faithful,
        "parameter_count": parameter_count(model),
        "vision_parameter_count": parameter_count(model.vision),
        "language_model_parameter_count": parameter_count(model.language_model),
        "visual_token_count": model.visual_token_count,
        "inserted_token_count": model.inserted_token_count,
    }


def meta_parameter_counts(architecture: str, lm_config: ModelConfig, vision_config: VisionConfig) -> dict:
    """Parameter counts of the real modules built on the meta device (no memory, no init cost)."""
    with torch.device("meta"):
        model = build_vision_model(architecture, lm_config, vision_config)
    return describe(model)
