"""Vision configuration: the encoder's sizes, the image token ids and the named model configs.

Mirrors the original miniature's `MiniVisionConfig` and `ImageTokenIds`. The image ids 260-262 sit
after the 260-id byte vocabulary, so a language model that reads images is built with vocab 263:
three extra rows in the tied embedding/head, nothing else changes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from glm53_flash.model.config import ModelConfig
from glm53_flash.data.tokenizer import ByteTokenizer


@dataclass(frozen=True)
class VisionConfig:
    image_size: int = 32
    patch_size: int = 4
    in_channels: int = 3
    hidden_size: int = 32
    depth: int = 2
    heads: int = 4
    intermediate_size: int = 64
    spatial_merge_size: int = 2
    projection_intermediate_size: int = 64
    rms_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        checks = [
            (self.in_channels == 3, f"in_channels must be 3 (RGB), got {self.in_channels}"),
            (self.image_size > 0 and self.patch_size > 0 and self.image_size % self.patch_size == 0,
             f"image_size {self.image_size} must be a positive multiple of patch_size {self.patch_size}"),
            (self.spatial_merge_size == 2, f"spatial_merge_size must be 2 (2x2 merge), got {self.spatial_merge_size}"),
            (self.patch_size > 0 and (self.image_size // self.patch_size) % self.spatial_merge_size == 0,
             (f"the patch grid {self.image_size // max(self.patch_size, 1)} must be divisible by "
              f"spatial_merge_size {self.spatial_merge_size}")),
            (self.hidden_size > 0 and self.heads > 0 and self.hidden_size % self.heads == 0,
             f"hidden_size {self.hidden_size} must be a positive multiple of heads {self.heads}"),
            (self.depth >= 1, f"depth must be >= 1, got {self.depth}"),
            (self.intermediate_size >= 1 and self.projection_intermediate_size >= 1,
             "intermediate sizes must be >= 1"),
            (self.rms_norm_eps > 0, "rms_norm_eps must be > 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"invalid VisionConfig: {message}")

    @property
    def patch_grid_size(self) -> int:
        return self.image_size // self.patch_size

    @property
    def merged_grid_size(self) -> int:
        return self.patch_grid_size // self.spatial_merge_size

    @property
    def visual_token_count(self) -> int:
        return self.merged_grid_size ** 2

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> VisionConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown VisionConfig fields: {', '.join(unknown)}")
        return cls(**values)


@dataclass(frozen=True)
class ImageTokenIds:
    """Ids of the image span `[start] [placeholder] x n [end]`, placed right after BOS."""

    start: int = 260
    placeholder: int = 261
    end: int = 262
    bos: int = ByteTokenizer.bos_id

    @property
    def required_vocab_size(self) -> int:
        return max(self.start, self.placeholder, self.end) + 1


IMAGE_TOKENS = ImageTokenIds()
VISION_VOCAB_SIZE = IMAGE_TOKENS.required_vocab_size  # 263

# The miniature comparison (faithful 60,924 parameters, baseline 42,500): a one-layer language model.
MINIATURE_LM = ModelConfig(
    vocab_size=VISION_VOCAB_SIZE, dim=32, layers=1, heads=4, expert_hidden=48, experts=4, top_k=2,
    streams=2, sparse_window=8, sparse_stride=8, max_sequence_length=64)
MINIATURE_VISION = VisionConfig(hidden_size=24, intermediate_size=48, projection_intermediate_size=64)

# The full pilot: the 25.7M flash language model (vocab 263) and a wider projector (144,408 vision params).
PILOT_VISION = VisionConfig(hidden_size=24, intermediate_size=48, projection_intermediate_size=128)
PILOT_MAX_SEQUENCE_LENGTH = 64

ARCHITECTURES = ("faithful", "baseline")


def check_architecture(name: str) -> str:
    if name not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {name!r}; allowed: {', '.join(ARCHITECTURES)}")
    return name
