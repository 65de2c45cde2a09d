"""The SwiGLU activation silu(gate) * value of h = [gate | value], forward and backward in one pass each
(moe.py's autograd.Function calls them where `swiglu_serves`: training too). Reference:
`reference_swiglu`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from glm53_flash.model.ops import library


def swiglu_serves(h: torch.Tensor) -> bool:
    """Whether the fused SwiGLU activation serves h [..., 2H] (float32 on the CPU, H % 8 == 0, outside
    autocast and compile). Unlike the products above it serves training too: it has a backward."""
    return library.ENABLED and library.cpu_float32(h) and h.dim() > 0 and h.shape[-1] % 16 == 0 and h.numel() > 0 and library.path_open()

def _check_swiglu_input(op: str, h: torch.Tensor) -> int:
    if not (isinstance(h, torch.Tensor) and h.dim() > 0):
        library.fail(op, "h must be [..., 2H]")
    library.check_tensor(op, "h", h)
    if not (h.shape[-1] % 16 == 0 and h.shape[-1] > 0):
        library.fail(op, f"2H = {h.shape[-1]} must be a positive multiple of 16")
    return h.shape[-1] // 2

def swiglu_forward(h: torch.Tensor) -> torch.Tensor:
    """silu(gate) * value for h = [gate | value] [..., 2H] -> [..., H] in one pass (see swiglu_serves)."""
    h = h.contiguous() if isinstance(h, torch.Tensor) else h  # held here: the library reads it below
    hidden = _check_swiglu_input("swiglu_forward", h)
    out = torch.empty((*h.shape[:-1], hidden), dtype=h.dtype, device=h.device)
    library.call("swiglu_forward", h.data_ptr(), out.data_ptr(), h.numel() // h.shape[-1], hidden)
    return out

def swiglu_backward(h: torch.Tensor, grad_out: torch.Tensor) -> torch.Tensor:
    """The gradient with respect to h of swiglu_forward(h), given grad_out [..., H], in one pass."""
    op = "swiglu_backward"
    h = h.contiguous() if isinstance(h, torch.Tensor) else h  # held here: the library reads them below
    grad_out = grad_out.contiguous() if isinstance(grad_out, torch.Tensor) else grad_out
    hidden = _check_swiglu_input(op, h)
    library.check_tensor(op, "grad_out", grad_out, (*h.shape[:-1], hidden))
    grad = torch.empty_like(h)
    library.call(op, h.data_ptr(), grad_out.data_ptr(), grad.data_ptr(), h.numel() // h.shape[-1], hidden)
    return grad

def reference_swiglu(h):
    gate, value = h.chunk(2, dim=-1)
    return F.silu(gate) * value


__all__ = ["reference_swiglu", "swiglu_backward", "swiglu_forward", "swiglu_serves"]
