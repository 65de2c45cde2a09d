"""Local + strided sparse attention: the miniature's stand-in for GLM-5.3-Flash's sparse layers.

Query t attends to key j iff j <= t and (t - j < window or j % stride == 0): a causal local window
plus global anchors every `stride` positions. The original gathered a [B, H, T, W, d] copy of K and V
with index tables rebuilt by Python loops each call; here the boolean mask is built once per shape
and cached, and scaled dot-product attention does the rest. For decoding the layer keeps only the
keys a future query can still reach: the anchors and the last window - 1 positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .kernels import Linear
from .rope import RotaryEmbedding


@dataclass
class SparseKV:
    """Cached keys/values [B, H, N, d] of one sparse layer and their absolute positions."""

    k: torch.Tensor
    v: torch.Tensor
    positions: tuple[int, ...]


def sparse_mask(query_positions, key_positions, window: int, stride: int, device=None) -> torch.Tensor:
    """Boolean [Tq, Tk] mask: True where the query may attend to the key."""
    q = torch.as_tensor(query_positions, device=device).unsqueeze(1)
    k = torch.as_tensor(key_positions, device=device).unsqueeze(0)
    return (k <= q) & (((q - k) < window) | (k % stride == 0))


def reachable_positions(positions, length: int, window: int, stride: int) -> list[int]:
    """Indices into `positions` of keys that a query at position >= length can still attend to."""
    return [i for i, p in enumerate(positions) if p % stride == 0 or p > length - window]


class SparseAttention(nn.Module):
    def __init__(self, dim: int, heads: int, window: int, stride: int) -> None:
        super().__init__()
        self.heads = heads
        self.window = window
        self.stride = stride
        self.qkv = Linear(dim, 3 * dim)
        self.out = Linear(dim, dim)
        self._masks: dict[tuple, torch.Tensor] = {}
        self._keep: dict[tuple, tuple[torch.Tensor, tuple[int, ...]]] = {}

    def _mask(self, key: tuple, query_positions, key_positions, device) -> torch.Tensor:
        mask = self._masks.get(key)
        if mask is None:
            mask = sparse_mask(query_positions, key_positions, self.window, self.stride, device)
            self._masks[key] = mask
        return mask

    def forward(
        self, x: torch.Tensor, rope: RotaryEmbedding, position: int = 0,
        state: SparseKV | None = None, return_state: bool = False,
    ) -> tuple[torch.Tensor, SparseKV | None]:
        b, t, dim = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        q, k = rope(q, position), rope(k, position)
        new_positions = tuple(range(position, position + t))
        if state is None:
            keys, values, key_positions = k, v, new_positions
        else:
            keys = torch.cat((state.k, k.to(state.k.dtype)), dim=2)
            values = torch.cat((state.v, v.to(state.v.dtype)), dim=2)
            key_positions = state.positions + new_positions
        # The cached key set is a function of `position` alone, so (position, t, device) names the mask.
        mask = self._mask((position, t, len(key_positions), x.device), new_positions, key_positions, x.device)
        out = F.scaled_dot_product_attention(q, keys.to(q.dtype), values.to(q.dtype), attn_mask=mask)
        out = self.out(out.transpose(1, 2).reshape(b, t, dim))
        new_state = None
        if return_state:
            length = position + t
            cache_key = (position, t, len(key_positions), x.device)
            cached = self._keep.get(cache_key)
            if cached is None:
                indices = reachable_positions(key_positions, length, self.window, self.stride)
                kept = tuple(key_positions[i] for i in indices)
                cached = (torch.tensor(indices, dtype=torch.long, device=x.device), kept)
                self._keep[cache_key] = cached
            keep, kept = cached
            new_state = SparseKV(keys.index_select(2, keep), values.index_select(2, keep), kept)
        return out, new_state
