"""The SwiGLU activation silu(gate) * value of h = [gate | value], forward and backward in one pass each
(moe.py's autograd.Function calls them where `swiglu_serves`: training too). Reference:
`reference_swiglu`. In float32, or in bf16 for bf16 weight products (model/precision.py): bf16 in and
out, float32 arithmetic between, equal bit for bit to the float32 kernel on the widened input with its
output rounded to bf16 (what casting around it gave, without the casts' passes over memory).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from glm53_flash.model.ops import library


# The kernel of each dtype the activation takes: float32, and bf16 for the bf16 weight products.
_KERNELS = {torch.float32: "", torch.bfloat16: "_bf16"}


def swiglu_serves(h: torch.Tensor) -> bool:
    """Whether the fused SwiGLU activation serves h [..., 2H] (float32 or bf16 on the CPU, H % 8 == 0, outside
    autocast and compile). Unlike the products above it serves training too: it has a backward."""
    return (library.ENABLED and h.is_cpu and h.dtype in _KERNELS and h.dim() > 0 and h.shape[-1] % 16 == 0
            and h.numel() > 0 and library.path_open())


def _check_swiglu_input(op: str, h: torch.Tensor) -> int:
    if not (isinstance(h, torch.Tensor) and h.dim() > 0):
        library.fail(op, "h must be [..., 2H]")
    if h.dtype not in _KERNELS:
        library.fail(op, f"h must be float32 or bf16, not {h.dtype}")
    library.check_tensor(op, "h", h, dtype=h.dtype)
    if not (h.shape[-1] % 16 == 0 and h.shape[-1] > 0):
        library.fail(op, f"2H = {h.shape[-1]} must be a positive multiple of 16")
    return h.shape[-1] // 2

def swiglu_forward(h: torch.Tensor) -> torch.Tensor:
    """silu(gate) * value for h = [gate | value] [..., 2H] -> [..., H] in one pass (see swiglu_serves)."""
    h = h.contiguous() if isinstance(h, torch.Tensor) else h  # held here: the library reads it below
    hidden = _check_swiglu_input("swiglu_forward", h)
    out = torch.empty((*h.shape[:-1], hidden), dtype=h.dtype, device=h.device)
    library.call("swiglu_forward" + _KERNELS[h.dtype], h.data_ptr(), out.data_ptr(), h.numel() // h.shape[-1], hidden)
    return out

def swiglu_backward(h: torch.Tensor, grad_out: torch.Tensor) -> torch.Tensor:
    """The gradient with respect to h of swiglu_forward(h), given grad_out [..., H], in one pass."""
    op = "swiglu_backward"
    h = h.contiguous() if isinstance(h, torch.Tensor) else h  # held here: the library reads them below
    grad_out = grad_out.contiguous() if isinstance(grad_out, torch.Tensor) else grad_out
    hidden = _check_swiglu_input(op, h)
    library.check_tensor(op, "grad_out", grad_out, (*h.shape[:-1], hidden), dtype=h.dtype)
    grad = torch.empty_like(h)
    library.call(op + _KERNELS[h.dtype], h.data_ptr(), grad_out.data_ptr(), grad.data_ptr(), h.numel() // h.shape[-1], hidden)
    return grad

def reference_swiglu(h):
    """The plain formula, in float32 for a bf16 h (rounded back to bf16 once, as the kernel does)."""
    gate, value = h.float().chunk(2, dim=-1)
    return (F.silu(gate) * value).to(h.dtype)


__all__ = ["reference_swiglu", "swiglu_backward", "swiglu_forward", "swiglu_serves"]
