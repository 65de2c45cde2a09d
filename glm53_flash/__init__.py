"""glm53_flash: a 25.7M byte-level hybrid-attention MoE language model and its whole pipeline.

The torch-backed names (GLM53Flash, ModelCache, ModelOutput) load lazily, so the tokenizer, tasks,
verifier and statistics import without torch (the verifier's workers stay small).
"""

from __future__ import annotations

from glm53_flash.model.config import ModelConfig
from glm53_flash.data.tokenizer import ByteTokenizer

from glm53_flash.core import __version__

_MODEL_NAMES = ("GLM53Flash", "ModelCache", "ModelOutput")


def __getattr__(name: str):
    if name in _MODEL_NAMES:
        from glm53_flash import model

        return getattr(model, name)
    raise AttributeError(f"module 'glm53_flash' has no attribute {name!r}")


__all__ = ["ByteTokenizer", "ModelConfig", "__version__", *_MODEL_NAMES]
