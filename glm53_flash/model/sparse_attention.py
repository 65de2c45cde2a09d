"""Local + strided sparse attention: the miniature's stand-in for GLM-5.3-Flash's sparse layers.

Query t attends to key j iff j <= t and (t - j < window or j % stride == 0): a causal local window
plus global anchors every `stride` positions. The original gathered a [B, H, T, W, d] copy of K and V
with index tables rebuilt by Python loops each call; here the boolean mask is built once per shape
and cached, and scaled dot-product attention does the rest. For decoding the layer keeps only the
keys a future query can still reach: the anchors and the last window - 1 positions. Without
gradients a one-token step writes its key into spare room at the end of the cached buffer, attends
without a mask (every kept key is visible to the newest query), then moves it into the slot of the
key that just left the window: no copy of the kept keys per step. The kept keys are then no longer
in position order, which attention does not care about.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from glm53_flash.model.ops import Linear
from glm53_flash.model.rope import RotaryEmbedding


@dataclass
class SparseKV:
    """Cached keys/values [B, H, N, d] of one sparse layer and their absolute positions (in the order
    of the keys). `room`: the buffers [B, H, capacity, d] that k and v are the first N slots of, when
    the in-place decode step made them (None: k and v own their storage)."""

    k: torch.Tensor
    v: torch.Tensor
    positions: tuple[int, ...]
    room: tuple[torch.Tensor, torch.Tensor] | None = None

    def keep_rows(self, rows: torch.Tensor) -> "SparseKV":
        """The state of the given batch rows only."""
        index = rows.to(self.k.device)
        return SparseKV(self.k.index_select(0, index), self.v.index_select(0, index), self.positions)

    def with_room(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Buffers holding the keys/values with at least one free slot after them (grown by half)."""
        n = len(self.positions)
        if self.room is not None and self.room[0].shape[2] > n:
            return self.room
        b, h, _, d = self.k.shape
        capacity = n + max(8, n // 2)
        buffers = []
        for cached in (self.k, self.v):
            buffer = cached.new_empty(b, h, capacity, d)
            buffer[:, :, :n] = cached
            buffers.append(buffer)
        return buffers[0], buffers[1]

    @staticmethod
    def in_buffers(keys: torch.Tensor, values: torch.Tensor, positions: tuple[int, ...]) -> "SparseKV":
        """The state after a decode step: the first len(positions) slots of the buffers, which stay its room."""
        return SparseKV(keys[:, :, :len(positions)], values[:, :, :len(positions)], positions, (keys, values))


# Shapes each cache of masks and kept-key indices holds at most: RL's shared-prompt update meets a new
# (prompt length, completion length) pair often, and nothing else would ever drop one.
CACHED_SHAPES = 1024


def _bounded(cache: dict) -> dict:
    """The cache, emptied first when it is full (rebuilding an entry costs microseconds)."""
    if len(cache) >= CACHED_SHAPES:
        cache.clear()
    return cache


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

    @classmethod
    def from_config(cls, cfg) -> "SparseAttention":
        return cls(cfg.dim, cfg.heads, cfg.sparse_window, cfg.sparse_stride)

    def _mask(self, key: tuple, query_positions, key_positions, device) -> torch.Tensor:
        mask = self._masks.get(key)
        if mask is None:
            mask = sparse_mask(query_positions, key_positions, self.window, self.stride, device)
            _bounded(self._masks)[key] = mask
        return mask

    def forward(
        self, x: torch.Tensor, rope: RotaryEmbedding, position: int = 0,
        state: SparseKV | None = None, return_state: bool = False,
    ) -> tuple[torch.Tensor, SparseKV | None]:
        """x [B, T, D] at positions position.. after the cached `state` -> (out [B, T, D], the keys a later
        query can still reach when return_state, else None)."""
        b, t, dim = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        q, k = rope(q, position), rope(k, position)
        if state is not None and t == 1 and return_state and not torch.is_grad_enabled():
            return self._decode_step(q, k, v, position, state)
        new_positions = tuple(range(position, position + t))
        if state is None:
            keys, values, key_positions = k, v, new_positions
        else:
            keys = torch.cat((state.k, k.to(state.k.dtype)), dim=2)
            values = torch.cat((state.v, v.to(state.v.dtype)), dim=2)
            key_positions = state.positions + new_positions
        # The cached key set is a function of `position` alone, so (position, t, device) names the mask.
        # Tensors made under inference_mode (the sampler's) cannot enter a graph that autograd records
        # (a training forward on a cache), so each mode keeps its own.
        cache_key = (position, t, len(key_positions), x.device, torch.is_inference_mode_enabled())
        mask = self._mask(cache_key, new_positions, key_positions, x.device)
        out = F.scaled_dot_product_attention(q, keys.to(q.dtype), values.to(q.dtype), attn_mask=mask)
        out = self.out(out.transpose(1, 2).reshape(b, t, dim))
        new_state = None
        if return_state:
            length = position + t
            cached = self._keep.get(cache_key)
            if cached is None:
                indices = reachable_positions(key_positions, length, self.window, self.stride)
                kept = tuple(key_positions[i] for i in indices)
                cached = (torch.tensor(indices, dtype=torch.long, device=x.device), kept)
                _bounded(self._keep)[cache_key] = cached
            keep, kept = cached
            new_state = SparseKV(keys.index_select(2, keep), values.index_select(2, keep), kept)
        return out, new_state

    def _decode_step(self, q, k, v, position: int, state: SparseKV) -> tuple[torch.Tensor, SparseKV]:
        """One token on the cached keys, in place (see the module docstring)."""
        b, heads, _, d = q.shape
        n = len(state.positions)
        keys, values = state.with_room()
        keys[:, :, n] = k[:, :, 0]
        values[:, :, n] = v[:, :, 0]
        # Every kept key is visible to the query at `position` (that is what kept means), so no mask.
        out = F.scaled_dot_product_attention(q, keys[:, :, :n + 1].to(q.dtype), values[:, :, :n + 1].to(q.dtype))
        out = self.out(out.transpose(1, 2).reshape(b, 1, heads * d))
        slot, positions = self.slot_for(position, state.positions)
        if 0 <= slot < n:
            keys[:, :, slot] = keys[:, :, n]
            values[:, :, slot] = values[:, :, n]
        return out, SparseKV.in_buffers(keys, values, positions)

    def slot_for(self, position: int, positions: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
        """Where the key at `position` is kept after its step (-1: nowhere, len(positions): appended, else
        the slot of the key that just left the window) and the kept positions then."""
        leaving = position + 1 - self.window  # no query after this one reaches it, unless an anchor
        if leaving == position and position % self.stride != 0:  # a window of one: the new key leaves
            return -1, positions
        if leaving >= 0 and leaving % self.stride != 0:
            slot = positions.index(leaving)
            return slot, positions[:slot] + (position,) + positions[slot + 1:]
        return len(positions), positions + (position,)
