"""One decode step of the local + strided sparse layer: q and k rotated, attention over the kept keys and
the token's own key, its key and value stored at a slot (at most `MAX_SPARSE_KEYS` kept keys: the C
code's score buffer). Reference: `reference_sparse_attention_step`.
"""

from __future__ import annotations

import torch

from glm53_flash.model.ops import library



def sparse_attention_step(qkv: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, kept: int, slot: int,
                          cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """One token of the sparse layer: q and k of qkv [B, 1, 3D] rotated by cos/sin [d], attention over
    the first `kept` keys/values of the buffers [B, H, capacity, d] and its own key, then its key and
    value stored at `slot` (-1: not stored). -> out [B, 1, D] (before the output product)."""
    op = "sparse_attention_step"
    if not (isinstance(keys, torch.Tensor) and keys.dim() == 4):
        library.fail(op, "keys must be [B, H, capacity, d]")
    batch, heads, capacity, d = keys.shape
    if not (d <= library.LIMITS["head_dim"]):
        library.fail(op, f"head size {d}; the kernel holds at most {library.LIMITS['head_dim']}")
    library.check_vector_size(op, "the head size", d)
    if not (0 <= kept <= min(capacity, library.MAX_SPARSE_KEYS)):
        library.fail(op, f"kept = {kept} keys; the kernel takes 0 to min(capacity {capacity}, {library.MAX_SPARSE_KEYS})")
    if not (-1 <= slot < capacity):
        library.fail(op, f"slot = {slot} outside -1 .. capacity - 1 = {capacity - 1}")
    library.check_tensor(op, "keys", keys)
    library.check_tensor(op, "values", values, tuple(keys.shape))
    library.check_tensor(op, "qkv", qkv, (batch, 1, 3 * heads * d))
    library.check_tensor(op, "cos", cos, (d,))
    library.check_tensor(op, "sin", sin, (d,))
    out = torch.empty(batch, 1, heads * d, dtype=torch.float32)
    library.call(op, qkv.data_ptr(), keys.data_ptr(), values.data_ptr(), capacity, kept, slot, batch, heads, d,
          cos.data_ptr(), sin.data_ptr(), out.data_ptr())
    return out

def reference_sparse_attention_step(qkv, keys, values, kept, slot, cos, sin):
    """-> (out [B, 1, D], the new keys, the new values)."""
    batch, heads, capacity, d = keys.shape
    q, k, v = qkv.view(batch, 3, heads, d).unbind(1)
    q, k = library.rotate_pairs(q, cos, sin), library.rotate_pairs(k, cos, sin)
    all_keys = torch.cat((keys[:, :, :kept], k.unsqueeze(2)), dim=2)
    all_values = torch.cat((values[:, :, :kept], v.unsqueeze(2)), dim=2)
    weights = torch.softmax((all_keys @ q.unsqueeze(-1)).squeeze(-1) / d ** 0.5, dim=-1)
    out = (weights.unsqueeze(-1) * all_values).sum(2).reshape(batch, 1, heads * d)
    keys, values = keys.clone(), values.clone()
    if slot >= 0:
        keys[:, :, slot], values[:, :, slot] = k, v
    return out, keys, values


__all__ = ["reference_sparse_attention_step", "sparse_attention_step"]
