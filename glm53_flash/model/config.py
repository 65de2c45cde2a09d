"""ModelConfig: the miniature's hyper-parameters and named presets.

The `flash` preset mirrors GLM-5.3-Flash's shape at 1/10,000 scale: 12 layers in a
linear, linear, linear, sparse rhythm, 8 routed experts top-2 plus one shared expert, and four
residual streams. Switches restore the original miniature's behaviour where we fixed a flaw
(`linear_rope="rope-before-feature-map"`, `balance_loss="hard-count"`), so an ablation can compare the
two; every option value names what it does.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

# Largest sizes a config may ask for (far above any model this code is meant for; a config beyond them
# is corrupt or hostile) and the largest totals: checked before a single tensor is allocated. The bytes
# count every parameter and buffer in float32 and the RoPE tables' construction (`model_bytes`); loaders
# also hold them against the memory the machine has free (model/pretrained.py).
SIZE_BOUNDS = {"vocab_size": 1 << 20, "dim": 1 << 14, "layers": 1024, "heads": 1024, "expert_hidden": 1 << 16,
               "experts": 1024, "top_k": 1024, "streams": 64, "sparse_window": 1 << 20, "sparse_stride": 1 << 20,
               "max_sequence_length": 1 << 20, "sparse_every": 1024, "linear_chunk": 1 << 20}
MAX_PARAMETERS = 4_000_000_000
MAX_MODEL_BYTES = 4 * MAX_PARAMETERS


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 260
    dim: int = 192
    layers: int = 12
    heads: int = 6
    expert_hidden: int = 384
    experts: int = 8
    top_k: int = 2
    streams: int = 4
    sparse_window: int = 32
    sparse_stride: int = 32
    max_sequence_length: int = 192
    sparse_every: int = 4  # layer i is sparse iff (i + 1) % sparse_every == 0
    # How block outputs enter the residual streams (`glm53 bench architecture` compares the modes):
    #   "double-residual" - the original miniature's form: each stream adds its share of (block input
    #                + update), so the identity path is counted twice; it gave the lowest loss, so it
    #                stays default,
    #   "delta"    - each stream adds S x its share of the update only (a standard residual),
    #   "sinkhorn" - mHC-style: a doubly-stochastic stream-mixing matrix (Sinkhorn) plus the delta.
    stream_mode: str = "double-residual"
    # RoPE in the linear-attention layers: "rope-before-feature-map" is the original (rotate q, k, then apply
    # the positive ELU+1 feature map, which mixes the rotation into the kernel); "none" applies the
    # feature map alone and leaves positions to causality and the RoPE of the sparse layers.
    linear_rope: str = "none"
    balance_loss_weight: float = 0.01
    balance_loss: str = "differentiable"  # "differentiable" (default) | "hard-count" (the original: no gradient)
    init_std: float = 0.02
    rope_base: float = 10000.0
    linear_chunk: int = 128  # sequences up to this length use one quadratic block; longer ones chunk

    def __post_init__(self) -> None:
        self._check_types_and_bounds()
        checks = [
            (self.vocab_size >= 4, "vocab_size must be >= 4"),
            (self.dim > 0 and self.heads > 0 and self.dim % self.heads == 0, "dim must be a positive multiple of heads"),
            ((self.dim // max(self.heads, 1)) % 2 == 0, "head dimension (dim / heads) must be even for RoPE"),
            (self.layers >= 1, "layers must be >= 1"),
            (1 <= self.top_k <= self.experts, "top_k must be in [1, experts]"),
            (self.streams >= 1, "streams must be >= 1"),
            (self.sparse_window >= 1 and self.sparse_stride >= 1, "sparse_window and sparse_stride must be >= 1"),
            (self.max_sequence_length >= 1, "max_sequence_length must be >= 1"),
            (self.sparse_every >= 1, "sparse_every must be >= 1"),
            (self.stream_mode in STREAM_MODES, f"stream_mode must be one of {STREAM_MODES}"),
            (self.linear_rope in LINEAR_ROPE_MODES, f"linear_rope must be one of {LINEAR_ROPE_MODES}"),
            (self.balance_loss in BALANCE_LOSS_MODES, f"balance_loss must be one of {BALANCE_LOSS_MODES}"),
            (self.linear_chunk >= 1, "linear_chunk must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"invalid ModelConfig: {message}")

    def _check_types_and_bounds(self) -> None:
        """Types and sizes first, so a corrupt or hostile config.json (a string for `dim`, `layers`
        = 10**7) is refused in one line before anything is allocated."""
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            kind = {"int": int, "float": float, "str": str}[field.type]
            ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                  if kind is float else isinstance(value, kind) and not isinstance(value, bool))
            if not ok:
                raise ValueError(f"invalid ModelConfig: {field.name} must be {field.type}, got {value!r:.40}")
            if field.name in SIZE_BOUNDS and not 0 <= value <= SIZE_BOUNDS[field.name]:
                raise ValueError(f"invalid ModelConfig: {field.name}={value} outside 0..{SIZE_BOUNDS[field.name]}")
        if self.approximate_parameters() > MAX_PARAMETERS:
            raise ValueError(f"invalid ModelConfig: about {self.approximate_parameters():.3g} parameters, more than "
                             f"this code builds ({MAX_PARAMETERS:.0e})")
        if self.model_bytes() > MAX_MODEL_BYTES:
            raise ValueError(f"invalid ModelConfig: building it takes about {self.model_bytes() / 2**30:.1f} GiB "
                             f"(of which the RoPE tables, max_sequence_length x head dimension, "
                             f"{self.rope_bytes() / 2**30:.1f} GiB), more than this code builds "
                             f"({MAX_MODEL_BYTES / 2**30:.1f} GiB)")

    def approximate_parameters(self) -> int:
        """An upper estimate of the parameter count from the shapes alone (no allocation)."""
        per_layer = 4 * self.dim * self.dim + (self.experts + 1) * 3 * self.dim * self.expert_hidden \
            + self.experts * self.dim + 4 * self.streams * self.streams * self.dim
        return self.vocab_size * self.dim + self.layers * per_layer

    def rope_bytes(self) -> int:
        """The RoPE tables' peak while they are built (model/rope.py): cos and sin [max_sequence_length,
        head_dim] in float32, kept, and the float64 angles and values they are rounded from."""
        positions = self.max_sequence_length * (self.dim // max(self.heads, 1))
        return 2 * 4 * positions + 10 * positions

    def model_bytes(self) -> int:
        """An upper estimate of the memory the model takes once built, in float32: every parameter and
        every buffer (the RoPE tables, with their construction's peak), from the shapes alone."""
        return 4 * self.approximate_parameters() + self.rope_bytes()

    def training_bytes(self, batch_size: int, sequence_length: int) -> int:
        """An upper estimate of the memory one fp32 training step needs on the CPU (weights, gradients,
        AdamW's two moments, activations kept for the backward, the sparse layers' T x T scores, the
        logits), from the shapes alone. Measured on the flash model (2 cores, ru_maxrss over the
        process's start): 0.51 MB per token at 8 x 64, 8 x 192 and 32 x 192; this charges 0.59."""
        tokens = batch_size * sequence_length
        sparse_layers = sum(self.is_sparse_layer(i) for i in range(self.layers))
        weights = 4 * 4 * self.approximate_parameters() + self.rope_bytes()
        activations = tokens * self.layers * self.dim * 256
        scores = batch_size * sparse_layers * self.heads * sequence_length * sequence_length * 12
        logits = tokens * self.vocab_size * 12
        return weights + activations + scores + logits

    def decode_bytes(self, rows: int, length: int) -> int:
        """An upper estimate of the memory cached generation of `rows` sequences up to `length` tokens
        needs on the CPU in fp32 (weights; each row's decode cache as if every sparse layer kept every
        key; the prompt forward's streams; the logits), from the shapes alone. Measured on the flash
        model (one thread, ru_maxrss over the process's start, 24 new tokens after a 165-token
        prompt): 0.6 MB per row at 64, 256 and 512 rows; this charges 2.1 MB (`training_bytes` is the
        training step's)."""
        sparse_layers = sum(self.is_sparse_layer(i) for i in range(self.layers))
        linear_layers = self.layers - sparse_layers
        tokens = rows * length
        weights = self.model_bytes()
        cache = 4 * rows * (linear_layers * self.heads * self.head_dim * (self.head_dim + 1)
                            + sparse_layers * 2 * self.dim * length + self.streams * self.dim)
        streams = tokens * self.dim * 4 * self.streams
        logits = tokens * self.vocab_size * 4 * 2
        return weights + cache + streams + logits

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    def is_sparse_layer(self, index: int) -> bool:
        return (index + 1) % self.sparse_every == 0

    @property
    def attention_pattern(self) -> list[str]:
        return ["sparse" if self.is_sparse_layer(i) else "linear" for i in range(self.layers)]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown ModelConfig fields: {', '.join(unknown)}")
        return cls(**values)

    @classmethod
    def preset(cls, name: str, **overrides) -> "ModelConfig":
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; allowed: {', '.join(PRESETS)}")
        return dataclasses.replace(PRESETS[name], **overrides)

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)


STREAM_MODES = ("delta", "double-residual", "sinkhorn")
LINEAR_ROPE_MODES = ("none", "rope-before-feature-map")
BALANCE_LOSS_MODES = ("differentiable", "hard-count")
# Every model switch of the original miniature at once (the faithful arm, the faithful architecture
# variant, the studies' comparison with the original).
ORIGINAL_MODEL_SWITCHES = {"stream_mode": "double-residual", "linear_rope": "rope-before-feature-map",
                           "balance_loss": "hard-count"}

PRESETS: dict[str, ModelConfig] = {
    "flash": ModelConfig(),
    # The original miniature's research model: three linear layers and no sparse one, so its only
    # positional information is the RoPE it applies before the feature map in those linear layers
    # (without it the model could not tell the order of its prefix).
    "research-mini": ModelConfig(
        dim=48, layers=3, heads=3, expert_hidden=96, experts=4, top_k=1, streams=2,
        sparse_window=24, sparse_stride=24, linear_rope="rope-before-feature-map",
    ),
    # The compositions studies' model (`glm53 experiment rl-generalisation`): the flash model's pattern once
    # (three linear layers, then one sparse), narrower, so five pretraining seeds per arm fit a study on a
    # 2-core CPU; its budget was chosen on dev (docs/STUDIES.md, results/study-budget/).
    "study": ModelConfig(dim=96, layers=4, heads=4, expert_hidden=192),
    "tiny": ModelConfig(
        dim=32, layers=4, heads=4, expert_hidden=48, experts=4, top_k=2, streams=4,
        sparse_window=8, sparse_stride=8, max_sequence_length=192, linear_chunk=16,
    ),
}
