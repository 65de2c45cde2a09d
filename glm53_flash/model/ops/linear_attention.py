"""One decode step of feature-map linear attention on the cached state (kv, z updated in place), q and k
optionally rotated first (`linear_attention_serves`: at most MAX_GROUPED_ROWS rows, heads of at most
LIMITS["head_dim"] floats). Reference: `reference_linear_attention_step`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from glm53_flash.model.ops import library


def linear_attention_serves(qkv: torch.Tensor, kv: torch.Tensor, z: torch.Tensor, head_dim: int) -> bool:
    """Whether `linear_attention_step` serves one decode step: qkv [B, 1, 3D], the state [B, H, d, d]."""
    return (library.serves(qkv, kv, qkv.shape[0], library.MAX_GROUPED_ROWS) and library.head_dim_serves(head_dim)
            and qkv.is_contiguous() and z.is_contiguous() and z.dtype == torch.float32)

def linear_attention_step(qkv: torch.Tensor, kv: torch.Tensor, z: torch.Tensor, cos: torch.Tensor | None,
                          sin: torch.Tensor | None, floor: float) -> torch.Tensor:
    """One token of feature-map linear attention on the cached state (kv [B, H, d, d], z [B, H, d],
    updated in place): qkv [B, 1, 3D] -> out [B, 1, D]; cos/sin [d] rotate q and k first when given."""
    op = "linear_attention_step"
    if not (isinstance(z, torch.Tensor) and z.dim() == 3):
        library.fail(op, "z must be [B, H, d]")
    batch, heads, d = z.shape
    if not (d <= library.LIMITS["head_dim"]):
        library.fail(op, f"head size {d}; the kernel holds at most {library.LIMITS['head_dim']}")
    library.check_vector_size(op, "the head size", d)
    library.check_tensor(op, "z", z)
    library.check_tensor(op, "kv", kv, (batch, heads, d, d))
    library.check_tensor(op, "qkv", qkv, (batch, 1, 3 * heads * d))
    if not ((cos is None) == (sin is None)):
        library.fail(op, "cos and sin come together or not at all")
    if cos is not None:
        library.check_tensor(op, "cos", cos, (d,))
        library.check_tensor(op, "sin", sin, (d,))
    out = torch.empty(batch, 1, heads * d, dtype=qkv.dtype)
    rotate = cos is not None
    library.call(op, qkv.data_ptr(), kv.data_ptr(), z.data_ptr(), out.data_ptr(), batch, heads, d,
          cos.data_ptr() if rotate else None, sin.data_ptr() if rotate else None, floor)
    return out

def _feature_map(u: torch.Tensor) -> torch.Tensor:
    return F.elu(u) + 1

def reference_linear_attention_step(qkv, kv, z, cos, sin, floor):
    """-> (out [B, 1, D], the new kv, the new z)."""
    batch, heads, d = z.shape
    q, k, v = qkv.view(batch, 3, heads, d).unbind(1)
    if cos is not None:
        q, k = library.rotate_pairs(q, cos, sin), library.rotate_pairs(k, cos, sin)
    pq, pk = _feature_map(q), _feature_map(k)
    kv = kv + pk.unsqueeze(-1) * v.unsqueeze(-2)
    z = z + pk
    numerator = (pq.unsqueeze(-1) * kv).sum(-2)
    denominator = (pq * z).sum(-1, keepdim=True).clamp_min(floor)
    return (numerator / denominator).reshape(batch, 1, heads * d), kv, z


__all__ = ["linear_attention_serves", "linear_attention_step", "reference_linear_attention_step"]
