"""The GLM53Flash language model, one mechanism per file (see docs/ARCHITECTURE.md)."""

from .lm import GLM53Flash, HybridBlock, ModelCache, ModelOutput

__all__ = ["GLM53Flash", "HybridBlock", "ModelCache", "ModelOutput"]
