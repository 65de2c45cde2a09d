"""glm53_flash: a 25.7M byte-level hybrid-attention MoE language model and its whole pipeline.

The torch-backed names (GLM53Flash, ModelCache, ModelOutput) load lazily, so the tokenizer, tasks,
verifier and statistics import without torch (the verifier's workers stay small).
"""

from __future__ import annotations

from .config import ModelConfig
from .tokenizer import ByteTokenizer

__version__ = "0.1.0"

_MODEL_NAMES = ("GLM53Flash", "ModelCache", "ModelOutput")


def __getattr__(name: str):
    if name in _MODEL_NAMES:
        from . import model

        return getattr(model, name)
    raise AttributeError(f"module 'glm53_flash' has no attribute {name!r}")


__all__ = ["ByteTokenizer", "ModelConfig", "__version__", *_MODEL_NAMES]
