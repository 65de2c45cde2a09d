"""The miniature vision path: a GLM-style image encoder, a direct-patch baseline, generated RGB digits.

torch-backed names load on first use (like the package root), so `glm53 --help` stays fast.
"""

from __future__ import annotations

from glm53_flash.vision.config import (
    ARCHITECTURES,
    IMAGE_TOKENS,
    MINIATURE_LM,
    MINIATURE_VISION,
    PILOT_VISION,
    ImageTokenIds,
    VisionConfig,
)

_LAZY = {
    "MiniGLMVisionEncoder": "encoder", "VisionLanguageModel": "language",
    "DirectPatchImageEncoder": "baseline", "DirectPatchVisionLanguageModel": "baseline",
    "build_multimodal_input_ids": "sequence", "answer_only_labels": "sequence",
    "render_digits": "digits", "build_vision_model": "models",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'glm53_flash.vision' has no attribute {name!r}")


__all__ = [  # noqa: RUF022 - configuration names first, then the lazily loaded ones
    "ARCHITECTURES", "IMAGE_TOKENS", "MINIATURE_LM", "MINIATURE_VISION", "PILOT_VISION", "ImageTokenIds",
    "VisionConfig", "MiniGLMVisionEncoder", "VisionLanguageModel", "DirectPatchImageEncoder",
    "DirectPatchVisionLanguageModel", "build_multimodal_input_ids", "answer_only_labels", "render_digits",
    "build_vision_model",
]
