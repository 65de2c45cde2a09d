"""GLM53Flash: embedding -> residual streams -> 12 hybrid blocks -> RMSNorm -> tied head.

Each block is pre-norm attention (linear or local+strided sparse) followed by a mixture of experts,
in GLM-5.3-Flash's linear, linear, linear, sparse rhythm. `forward(ids, cache=...)` serves both
training (full sequences) and cached decoding (prefill, then any number of tokens at a time).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from glm53_flash.model.config import ModelConfig
from glm53_flash.model import ops
from glm53_flash.model.linear_attention import LinearAttention, LinearState
from glm53_flash.model.moe import MixtureOfExperts, original_balance_metric
from glm53_flash.model.norm import RMSNorm
from glm53_flash.model.ops.decode_model import decode_step
from glm53_flash.model.pretrained import load_model, save_pretrained
from glm53_flash.model.rope import RotaryEmbedding
from glm53_flash.model.sparse_attention import SparseAttention, SparseKV
from glm53_flash.model.streams import StreamConnection


@dataclass
class ModelOutput:
    logits: torch.Tensor  # [B, T, V]
    aux_loss: torch.Tensor  # router balance loss (scalar)
    usage: torch.Tensor  # [layers, experts] routed-slot fractions (no gradient)
    hidden: torch.Tensor | None = None  # [B, T, D] the final norm's output, which the tied head multiplies


# The attention kinds ModelConfig.attention_pattern names, each built from the config. An attention layer
# is called as layer(x, rope, position, state, return_state) -> (out, its state after x or None), and its
# state (None before the layer's first token) has keep_rows(rows).
ATTENTION = {"linear": LinearAttention.from_config, "sparse": SparseAttention.from_config}


@dataclass
class ModelCache:
    """Decode state for every layer; `position` is the number of tokens already consumed."""

    batch_size: int
    max_length: int
    position: int = 0
    layers: list = field(default_factory=list)  # each attention layer's state, None before its first token

    def tokens_left(self) -> int:
        return self.max_length - self.position

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keep only the given batch rows (e.g. drop finished sequences so they cost nothing more)."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        self.layers[:] = [None if state is None else state.keep_rows(rows) for state in self.layers]
        self.batch_size = int(rows.numel())


class HybridBlock(nn.Module):
    """Pre-norm attention, then a pre-norm mixture of experts, on a mix of the residual streams."""

    def __init__(self, cfg: ModelConfig, index: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim)
        self.attention = ATTENTION[cfg.attention_pattern[index]](cfg)
        self.moe_norm = RMSNorm(cfg.dim)
        self.moe = MixtureOfExperts(cfg.dim, cfg.expert_hidden, cfg.experts, cfg.top_k, cfg.init_std)
        self.connection = StreamConnection(cfg.streams, cfg.stream_mode)

    def forward(self, streams, rope, position, state, return_state, token_mask, balance_reduce=None):
        mixed = self.connection.read(streams)
        b, t, d = mixed.shape
        attn_out, new_state = self.attention(self.attn_norm(mixed), rope, position, state, return_state)
        hidden = mixed + attn_out
        moe_out, used, balance = self.moe(self.moe_norm(hidden).reshape(b * t, d), token_mask,
                                          with_balance=not return_state, balance_reduce=balance_reduce)
        update = attn_out + moe_out.view(b, t, d)
        return self.connection.write(streams, mixed, update), new_state, used, balance


class GLM53Flash(nn.Module):
    def __init__(self, config: ModelConfig | None = None) -> None:
        super().__init__()
        self.config = cfg = config or ModelConfig()
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList(HybridBlock(cfg, i) for i in range(cfg.layers))
        self.norm = RMSNorm(cfg.dim)
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.max_sequence_length, cfg.rope_base)
        self._init_weights()

    def _init_weights(self) -> None:
        std = self.config.init_std
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, std)

    # -- bookkeeping ---------------------------------------------------------------------------
    def save_pretrained(self, directory, metadata: dict | None = None):
        """Write config.json (Hugging Face style, with `model_type`), model.safetensors and
        metadata.json (their sha256) to a new directory, atomically. Returns the directory."""
        return save_pretrained(self, directory, metadata)

    @classmethod
    def from_pretrained(cls, directory, device="cpu", verify: bool = True) -> "GLM53Flash":
        """Load a directory written by `save_pretrained` or any training checkpoint (hashes checked;
        older config.json files without `model_type` and the older expert layout load too)."""
        model, _ = load_pretrained(directory, device=device, verify=verify)
        return model

    def parameter_counts(self) -> dict[str, int]:
        """Total parameters (tied head counted once) and the per-token active estimate."""
        total = sum(p.numel() for p in self.parameters())
        routed = sum(block.moe.routed_parameter_count() for block in self.blocks)
        active = total - routed + routed * self.config.top_k // self.config.experts
        return {"total": total, "active": active}

    def new_cache(self, batch_size: int) -> ModelCache:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        return ModelCache(batch_size, self.config.max_sequence_length, 0, [None] * self.config.layers)

    # -- forward -------------------------------------------------------------------------------
    def _check_ids(self, ids) -> None:
        if not isinstance(ids, torch.Tensor):
            raise ValueError(f"ids must be a torch.Tensor, got {type(ids).__name__}")
        if ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
            raise ValueError(f"ids must have an integer dtype, got {ids.dtype}")
        if ids.dim() != 2:
            raise ValueError(f"ids must have shape [batch, time], got rank {ids.dim()} shape {tuple(ids.shape)}")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size):
            raise ValueError(
                f"ids must lie in [0, {self.config.vocab_size}), got values in [{int(ids.min())}, {int(ids.max())}]")

    def _check_length(self, batch: int, length: int, cache: ModelCache | None) -> int:
        if length < 1:
            raise ValueError("sequence must have at least one position")
        position = 0 if cache is None else cache.position
        limit = self.config.max_sequence_length
        if position + length > limit:
            where = f" (cache already holds {position})" if cache is not None else ""
            raise ValueError(f"sequence of {length} tokens{where} exceeds max_sequence_length {limit}")
        if cache is not None and cache.batch_size != batch:
            raise ValueError(f"cache was made for batch size {cache.batch_size}, got a batch of {batch}")
        return position

    def forward(self, ids: torch.Tensor, cache: ModelCache | None = None, balance_reduce=None) -> ModelOutput:
        """ids [B, T] -> logits [B, T, V]; with `cache`, ids continue the cached sequence.

        `balance_reduce` (data-parallel training only) sums balance statistics across ranks.
        """
        self._check_ids(ids)
        ids = ids.long()
        # PAD (id 0) tokens do not count towards the balance statistics.
        token_mask = ids != 0 if self.config.balance_loss == "differentiable" else None
        return self.forward_embeddings(self.embedding(ids), cache=cache, token_mask=token_mask,
                                       balance_reduce=balance_reduce)

    def forward_embeddings(
        self, embedded: torch.Tensor, cache: ModelCache | None = None, token_mask: torch.Tensor | None = None,
        balance_reduce=None,
    ) -> ModelOutput:
        """The body on embeddings [B, T, D] (the vision path enters here)."""
        cfg = self.config
        if embedded.dim() != 3 or embedded.shape[-1] != cfg.dim:
            raise ValueError(f"embeddings must have shape [batch, time, {cfg.dim}], got {tuple(embedded.shape)}")
        b, t, _ = embedded.shape
        position = self._check_length(b, t, cache)
        streams = embedded.unsqueeze(0).expand(cfg.streams, b, t, cfg.dim)  # [S, B, T, D]
        usage, balances = [], []
        # One cached token per row: every block (and the head) in one C call where it serves (model/ops/).
        stepped = decode_step(self, streams, position, cache) if cache is not None and t == 1 else None
        hidden = logits = None
        if stepped is not None:
            streams, usage, hidden, logits = stepped  # routed slots [layers, E]; the head's, where it ran there
        else:
            for i, block in enumerate(self.blocks):
                state = cache.layers[i] if cache is not None else None
                streams, new_state, used, balance = block(
                    streams, self.rope, position, state, cache is not None, token_mask, balance_reduce)
                if cache is not None:
                    cache.layers[i] = new_state
                usage.append(used)
                balances.append(balance)
        if cache is not None:
            cache.position = position + t
        if logits is None:
            hidden = self.norm(streams.mean(dim=0))
            logits = ops.linear(hidden, self.embedding.weight)
        usage_by_layer = (usage if stepped is not None else torch.stack(usage)).float()
        usage_by_layer = usage_by_layer / usage_by_layer.sum(-1, keepdim=True).clamp_min(1.0)
        if cache is not None:  # decoding: no balance statistics
            aux = logits.new_zeros(())
        elif cfg.balance_loss == "hard-count":
            aux = original_balance_metric(usage_by_layer)
        else:
            aux = torch.stack(balances).mean()
        return ModelOutput(logits=logits, aux_loss=aux, usage=usage_by_layer, hidden=hidden)


__all__ = ["GLM53Flash", "ModelOutput", "ModelCache", "HybridBlock", "LinearState", "SparseKV"]


def load_pretrained(directory, device="cpu", verify: bool = True) -> tuple[GLM53Flash, dict]:
    """(model, metadata) from a saved model or a training checkpoint, hashes verified; model/pretrained.py
    checks every size, hash and tensor shape before the model is built."""
    return load_model(GLM53Flash, directory, device=device, verify=verify)
