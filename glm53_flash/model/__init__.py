"""The GLM53Flash language model, one mechanism per file (see docs/ARCHITECTURE.md).

`ModelConfig` (config.py) is torch-free; the torch-backed names load on first use, so importing the
config (as the verifier's workers and the CLI's parser do) does not load torch."""

from __future__ import annotations

_LM_NAMES = ("GLM53Flash", "HybridBlock", "ModelCache", "ModelOutput")


def __getattr__(name: str):
    if name in _LM_NAMES:
        from glm53_flash.model import lm

        return getattr(lm, name)
    raise AttributeError(f"module 'glm53_flash.model' has no attribute {name!r}")


__all__ = list(_LM_NAMES)
