"""Feature-map linear attention: the miniature's stand-in for GLM-5.3-Flash's linear layers.

o_t = phi(q_t)^T S_t / max(phi(q_t) . z_t, 1e-6), with S_t = sum_{s<=t} phi(k_s) v_s^T and
z_t = sum_{s<=t} phi(k_s), phi(u) = ELU(u) + 1. Unlike the original, which materialised S_t for
every position ([B, T, H, d, d]), training uses the causal quadratic form inside chunks and carries
only one [d, d] state per head between chunks; decoding keeps that state and costs O(1) per token.
No decay or gating (GLM's KDA has both): this is the original miniature's mechanism, made fast.
model/ops/linear_attention.py computes the same by C kernels where they serve (a decode step; a
sequence longer than the chunk) and holds the feature map's backward and the blocks' bf16 products.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from glm53_flash.model import ops
from glm53_flash.model.ops import Linear
from glm53_flash.model.rope import RotaryEmbedding

DENOMINATOR_FLOOR = 1e-6


@dataclass
class LinearState:
    """Running prefix sums of one linear-attention layer: kv [B, H, d, d] and z [B, H, d]."""

    kv: torch.Tensor
    z: torch.Tensor

    def keep_rows(self, rows: torch.Tensor) -> "LinearState":
        """The state of the given batch rows only."""
        index = rows.to(self.kv.device)
        return LinearState(self.kv.index_select(0, index), self.z.index_select(0, index))


def causal_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: LinearState | None = None,
    chunk: int = 64,
    return_state: bool = False,
) -> tuple[torch.Tensor, LinearState | None]:
    """Causal linear attention over feature-mapped q, k [B, H, T, d] and v [B, H, T, d].

    `state` holds the sums over earlier positions (cached decoding). Sequences of at most `chunk`
    steps use one masked quadratic block; longer ones are split into chunks whose cross-chunk
    contribution comes from exclusive prefix sums of per-chunk states. Both equal the recurrence.
    """
    b, h, t, d = q.shape
    if t == 1 and state is not None:
        # One decode step: fold the new key into the state first, then read it (O(d^2) per head).
        # Without gradients the cache's own state is updated in place (no new [B, H, d, d] tensor
        # per layer per token); with them, or a state that is not one block of memory, a new one.
        key_t, value = k.flatten(0, 1).transpose(1, 2), v.flatten(0, 1)
        if not torch.is_grad_enabled() and state.kv.is_contiguous() and state.z.is_contiguous():
            kv, z = state.kv, state.z
            kv.view(-1, d, d).baddbmm_(key_t, value)
            z.add_(k[:, :, 0])
        else:
            kv = torch.baddbmm(state.kv.flatten(0, 1), key_t, value).view_as(state.kv)
            z = state.z + k[:, :, 0]
        numerator = torch.matmul(q, kv)
        denominator = torch.matmul(q, z.unsqueeze(-1)).squeeze(-1)
        out = numerator / denominator.clamp_min(DENOMINATOR_FLOOR).unsqueeze(-1)
        return out, (LinearState(kv, z) if return_state else None)
    dtype = ops.block_dtype(q)  # bf16 products where the batch repays them (inside bf16 weight products)
    if t <= chunk:
        numerator, denominator = ops.masked_block(q, k, v, dtype)  # [B, H, T, d], [B, H, T]
        if state is not None:
            numerator = numerator + torch.matmul(q, state.kv)
            denominator = denominator + torch.matmul(q, state.z.unsqueeze(-1)).squeeze(-1)
    else:
        n = -(-t // chunk)
        pad = n * chunk - t
        if pad:  # padded keys are zero, so they add nothing to any state
            q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        qc, kc, vc = (x.view(b, h, n, chunk, d) for x in (q, k, v))
        numerator, denominator = ops.masked_block(qc, kc, vc, dtype)  # [B, H, N, C, d], [B, H, N, C]
        chunk_kv = torch.matmul(kc.transpose(-1, -2), vc)  # [B, H, N, d, d]
        chunk_z = kc.sum(-2)  # [B, H, N, d]
        prior_kv = chunk_kv.cumsum(2) - chunk_kv  # exclusive prefix over chunks
        prior_z = chunk_z.cumsum(2) - chunk_z
        if state is not None:
            prior_kv = prior_kv + state.kv.unsqueeze(2)
            prior_z = prior_z + state.z.unsqueeze(2)
        numerator = numerator + torch.matmul(qc, prior_kv)
        denominator = denominator + torch.matmul(qc, prior_z.unsqueeze(-1)).squeeze(-1)
        numerator = numerator.reshape(b, h, n * chunk, d)[:, :, :t]
        denominator = denominator.reshape(b, h, n * chunk)[:, :, :t]
        k, v = k[:, :, :t], v[:, :, :t]
    out = numerator / denominator.clamp_min(DENOMINATOR_FLOOR).unsqueeze(-1)
    new_state = None
    if return_state:
        kv = torch.matmul(k.transpose(-1, -2), v)
        z = k.sum(-2)
        if state is not None:
            kv, z = kv + state.kv, z + state.z
        new_state = LinearState(kv, z)
    return out, new_state


def recurrent_linear_attention(q, k, v, state: LinearState | None = None):
    """The plain recurrence, one position at a time: the test oracle for the fast forms."""
    b, h, t, d = q.shape
    kv = q.new_zeros(b, h, d, d) if state is None else state.kv.clone()
    z = q.new_zeros(b, h, d) if state is None else state.z.clone()
    outs = []
    for i in range(t):
        kv = kv + k[:, :, i, :, None] * v[:, :, i, None, :]
        z = z + k[:, :, i]
        num = torch.einsum("bhd,bhde->bhe", q[:, :, i], kv)
        den = torch.einsum("bhd,bhd->bh", q[:, :, i], z).clamp_min(DENOMINATOR_FLOOR)
        outs.append(num / den[..., None])
    return torch.stack(outs, dim=2), LinearState(kv, z)


class LinearAttention(nn.Module):
    def __init__(self, dim: int, heads: int, chunk: int, rope_before_feature: bool) -> None:
        super().__init__()
        self.heads = heads
        self.chunk = chunk
        self.rope_before_feature = rope_before_feature
        self.qkv = Linear(dim, 3 * dim)
        self.out = Linear(dim, dim)

    @classmethod
    def from_config(cls, cfg) -> "LinearAttention":
        return cls(cfg.dim, cfg.heads, cfg.linear_chunk, rope_before_feature=cfg.linear_rope == "rope-before-feature-map")

    def forward(
        self, x: torch.Tensor, rope: RotaryEmbedding, position: int = 0,
        state: LinearState | None = None, return_state: bool = False,
    ) -> tuple[torch.Tensor, LinearState | None]:
        """x [B, T, D] at positions position.. after the cached `state` -> (out [B, T, D], the state after
        x when return_state, else None)."""
        b, t, dim = x.shape
        qkv = self.qkv(x)
        tables = (rope.cos, rope.sin) if self.rope_before_feature else None
        fast = ops.linear_attention_layer(qkv, self.heads, self.chunk, tables, position,
                                          None if state is None else (state.kv, state.z), return_state,
                                          DENOMINATOR_FLOOR)
        if fast is not None:
            out, sums = fast
            return self.out(out), None if sums is None else LinearState(*sums)
        q, k, v = qkv.view(b, t, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        if self.rope_before_feature:  # the original's order (see docs/ARCHITECTURE.md)
            q, k = rope(q, position), rope(k, position)
        # Prefix sums in float32 even under bf16 autocast: they accumulate over the sequence.
        with torch.autocast(device_type=x.device.type, enabled=False):
            q, k, v = ops.feature_map(q.float()), ops.feature_map(k.float()), v.float()
            out, new_state = causal_linear_attention(q, k, v, state, self.chunk, return_state)
        out = out.to(x.dtype).transpose(1, 2).reshape(b, t, dim)
        return self.out(out), new_state
