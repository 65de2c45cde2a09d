"""The SwiGLU activation silu(gate) * value of h = [gate | value], and the SwiGLU layer around it.

`swiglu_activation` is the one entry point (what moe.py calls): the C forward and backward, one pass over
memory each (`swiglu_forward` / `swiglu_backward`, where `swiglu_serves`: training too), else the eager
formula with a hand-written backward (aten's fused silu_backward, the gradient's halves written in place).
In float32, or in bf16 for bf16 weight products (model/precision.py): bf16 in and out, float32 arithmetic
between, equal bit for bit to the float32 kernel on the widened input with its output rounded to bf16
(what casting around it gave, without the casts' passes over memory). `swiglu_mlp` is a SwiGLU layer's two
products and activation (the shared expert), its activation kept in bf16 between bf16 products.
Reference: `reference_swiglu`; the eager activation is the kernel's oracle in the tests.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from glm53_flash.model.ops import library
from glm53_flash.model.ops.dense import linear
from glm53_flash.model.precision import product_dtype_for


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


class _SwiGLUActivation(torch.autograd.Function):
    """silu(gate) * value for h = [gate | value] [N, 2H].

    Where the fused kernel serves (swiglu_serves) the forward and the backward each make one pass over
    memory and only h is saved: the backward recomputes the exponentials, which cost less than reading a
    saved [N, H] tensor back. Elsewhere, and as the kernel's test oracle, the eager formulation: the
    forward keeps silu(gate) so the backward need not recompute its exponentials, and the backward writes
    both halves of the gradient in place (no concatenation) with aten's fused silu_backward for the gate
    half: three elementwise passes where the plain autograd graph takes about nine."""

    @staticmethod
    def forward(ctx, h: torch.Tensor) -> torch.Tensor:
        ctx.fused = swiglu_serves(h)
        if ctx.fused:
            ctx.save_for_backward(h)
            return swiglu_forward(h)
        gate, value = h.chunk(2, dim=-1)
        activated = F.silu(gate)
        ctx.save_for_backward(h, activated)
        return activated * value

    @staticmethod
    @once_differentiable  # the out= writes below are not differentiable again: say so clearly
    def backward(ctx, grad_out: torch.Tensor) -> torch.Tensor:
        if ctx.fused:
            (h,) = ctx.saved_tensors
            return swiglu_backward(h, grad_out.to(h.dtype))
        h, activated = ctx.saved_tensors
        gate, value = h.chunk(2, dim=-1)
        grad = torch.empty_like(h)
        grad_gate, grad_value = grad.chunk(2, dim=-1)
        # d/d gate = grad_out * value * silu'(gate); d/d value = grad_out * silu(gate)
        if h.device.type in ("cpu", "cuda"):  # kernels that write through the strided half directly
            torch.ops.aten.silu_backward.grad_input(grad_out * value, gate, grad_input=grad_gate)
        else:
            grad_gate.copy_(torch.ops.aten.silu_backward(grad_out * value, gate))
        torch.mul(activated, grad_out, out=grad_value)
        return grad


def swiglu_activation(h: torch.Tensor) -> torch.Tensor:
    """silu(gate) * value for h = [gate | value] [..., 2H] -> [..., H], differentiable."""
    if not torch.is_grad_enabled():  # inference: skip the autograd.Function's per-call overhead
        if swiglu_serves(h):
            return swiglu_forward(h)
        gate, value = h.chunk(2, dim=-1)
        return F.silu(gate) * value
    return _SwiGLUActivation.apply(h)


def swiglu_rounded(h: torch.Tensor) -> torch.Tensor:
    """The activation of a bf16 product's output h (bf16 weight products on the CPU, model/precision.py)
    as the next product's bf16 input: the fused kernel in bf16 where it serves, else float32 between two
    casts. Both round once, at the end: what the kernel computes equals the float32 kernel on the widened
    h rounded to bf16, bit for bit, and its backward hands the product's backward bf16 as a cast would."""
    if swiglu_serves(h):
        return swiglu_activation(h)
    return swiglu_activation(h.float()).to(h.dtype)


def swiglu_mlp(x: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """A SwiGLU layer without biases: down(silu(gate) * value) with [gate | value] = x up^T; up [2H, D] and
    down [D, H] in nn.Linear's layout. Inside bf16 weight products the hidden activations stay bf16 from
    one product to the next: the same bits as the float32 activation between two mixed_linear products,
    which would widen them to float32 and round them back."""
    dtype = product_dtype_for(x)
    if dtype is None:
        return linear(swiglu_activation(linear(x, up)), down)
    hidden = F.linear(x.to(dtype), up.to(dtype))
    return F.linear(swiglu_rounded(hidden), down.to(dtype)).float()


__all__ = ["reference_swiglu", "swiglu_activation", "swiglu_backward", "swiglu_forward", "swiglu_mlp",
           "swiglu_rounded", "swiglu_serves"]
