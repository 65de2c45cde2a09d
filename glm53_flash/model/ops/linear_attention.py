"""Feature-map linear attention in C: one decode step on the cached state (`linear_attention_step`: kv, z
updated in place; `linear_attention_serves`: at most MAX_GROUPED_ROWS rows), and a whole sequence for
training and full forwards (`linear_attention_scan_forward` / `linear_attention_scan_backward`, the
recurrence position by position with each head's state in L1; `linear_attention_scan_serves`). Both take
the qkv product's output, apply the feature map themselves and rotate q and k first when given the
rotary tables (the original's order). Heads of at most LIMITS["head_dim"] floats, a multiple of 8.
References: `reference_linear_attention_step`, `reference_linear_attention_scan`.
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


def linear_attention_scan_serves(qkv: torch.Tensor, head_dim: int) -> bool:
    """Whether the sequence kernels serve qkv [B, T, 3D] (float32 on the CPU, outside autocast and compile,
    heads the C code holds); gradients on or off (the backward is `linear_attention_scan_backward`)."""
    return (library.ENABLED and qkv.is_cpu and qkv.dtype == torch.float32 and qkv.dim() == 3 and qkv.numel() > 0
            and library.head_dim_serves(head_dim) and library.path_open())

def _check_scan(op: str, qkv: torch.Tensor, heads: int, cos, sin) -> tuple[int, int, int]:
    if not (isinstance(qkv, torch.Tensor) and qkv.dim() == 3):
        library.fail(op, "qkv must be [B, T, 3 * H * d]")
    batch, steps, width = qkv.shape
    if not (isinstance(heads, int) and heads >= 1 and width % (3 * heads) == 0):
        library.fail(op, f"qkv's last size {width} must be 3 x heads ({heads}) x the head size")
    d = width // (3 * heads)
    if not (d <= library.LIMITS["head_dim"]):
        library.fail(op, f"head size {d}; the kernel holds at most {library.LIMITS['head_dim']}")
    library.check_vector_size(op, "the head size", d)
    library.check_tensor(op, "qkv", qkv)
    if not ((cos is None) == (sin is None)):
        library.fail(op, "cos and sin come together or not at all")
    if cos is not None:
        library.check_tensor(op, "cos", cos, (steps, d))
        library.check_tensor(op, "sin", sin, (steps, d))
    return batch, steps, d

def scan_row(d: int) -> int:
    """The scan's padded head row (kernels.c's scan rows: whole vectors of up to 16 floats)."""
    return -(-d // 16) * 16

def _tables(cos, sin):
    return (cos.data_ptr(), sin.data_ptr()) if cos is not None else (None, None)

def linear_attention_scan_forward(qkv: torch.Tensor, heads: int, cos: torch.Tensor | None, sin: torch.Tensor | None,
                                  floor: float) -> tuple[torch.Tensor, ...]:
    """qkv [B, T, 3D] -> (out [B, T, D], den [B, H, T] (phi(q) . z before the floor), the final state kv
    [B, H, d, d] and z [B, H, d]); cos/sin [T, d] rotate q and k first when given."""
    op = "linear_attention_scan_forward"
    batch, steps, d = _check_scan(op, qkv, heads, cos, sin)
    out = torch.empty(batch, steps, heads * d)
    den = torch.empty(batch, heads, steps)
    kv = torch.empty(batch, heads, d, d)
    z = torch.empty(batch, heads, d)
    work = torch.empty(batch, heads, d + 1, scan_row(d))
    library.call(op, qkv.data_ptr(), out.data_ptr(), den.data_ptr(), kv.data_ptr(), z.data_ptr(), work.data_ptr(),
                 batch, steps, heads, d, *_tables(cos, sin), floor)
    return out, den, kv, z

def linear_attention_scan_backward(qkv: torch.Tensor, out: torch.Tensor, den: torch.Tensor, grad_out: torch.Tensor,
                                   heads: int, cos: torch.Tensor | None, sin: torch.Tensor | None,
                                   floor: float) -> torch.Tensor:
    """The gradient with respect to qkv [B, T, 3D] of linear_attention_scan_forward's out, given grad_out
    [B, T, D] and the forward's out and den."""
    op = "linear_attention_scan_backward"
    grad_out = grad_out.contiguous() if isinstance(grad_out, torch.Tensor) else grad_out  # held: read below
    batch, steps, d = _check_scan(op, qkv, heads, cos, sin)
    library.check_tensor(op, "out", out, (batch, steps, heads * d))
    library.check_tensor(op, "den", den, (batch, heads, steps))
    library.check_tensor(op, "grad_out", grad_out, (batch, steps, heads * d))
    grad = torch.empty_like(qkv)
    state = torch.empty(batch, heads, d + 1, scan_row(d))
    scratch = torch.empty(batch, heads, steps, scan_row(d) + 1)
    library.call(op, qkv.data_ptr(), out.data_ptr(), den.data_ptr(), grad_out.data_ptr(), grad.data_ptr(),
                 state.data_ptr(), scratch.data_ptr(), batch, steps, heads, d, *_tables(cos, sin), floor)
    return grad

def reference_linear_attention_scan(qkv, heads, cos, sin, floor):
    """The recurrence in plain torch: -> (out [B, T, D], den [B, H, T], kv [B, H, d, d], z [B, H, d])."""
    batch, steps, width = qkv.shape
    d = width // (3 * heads)
    q, k, v = qkv.view(batch, steps, 3, heads, d).permute(2, 0, 3, 1, 4)
    if cos is not None:
        q, k = library.rotate_pairs(q, cos, sin), library.rotate_pairs(k, cos, sin)
    pq, pk = _feature_map(q), _feature_map(k)
    kv = qkv.new_zeros(batch, heads, d, d)
    z = qkv.new_zeros(batch, heads, d)
    outs, dens = [], []
    for t in range(steps):
        kv = kv + pk[:, :, t, :, None] * v[:, :, t, None, :]
        z = z + pk[:, :, t]
        den = (pq[:, :, t] * z).sum(-1)
        outs.append((pq[:, :, t, :, None] * kv).sum(-2) / den.clamp_min(floor)[..., None])
        dens.append(den)
    out = torch.stack(outs, dim=2).transpose(1, 2).reshape(batch, steps, heads * d)
    return out, torch.stack(dens, dim=-1), kv, z


__all__ = ["linear_attention_scan_backward", "linear_attention_scan_forward", "linear_attention_scan_serves",
           "linear_attention_serves", "linear_attention_step", "reference_linear_attention_scan",
           "reference_linear_attention_step"]
