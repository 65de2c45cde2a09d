"""RMSNorm over the last dimension: the decode form (`rms_norm`: a few rows, no gradients; None where it
does not serve, for the caller's own path) and the training pair (`rms_norm_forward` returning the
inverse RMS per row, `rms_norm_backward` the gradients of x and the weight in one pass over memory
each way, as one autograd op where `rms_norm_training_serves`). `rms_norm_layer` is norm.py's entry point:
it picks one of them, or torch's fused rms_norm for inference elsewhere, or None (the layer's formula).
The reference is `reference_rms_norm`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from glm53_flash.model.ops import library


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """RMSNorm over the last dimension by the kernel where it serves (a few rows); None elsewhere, for
    the caller's own path."""
    if not library.ENABLED or torch.is_grad_enabled():
        return None
    dim = x.shape[-1]
    rows = x.numel() // dim if dim else 0
    if not library.serves(x, weight, rows, library.MAX_ROWS) or tuple(weight.shape) != (dim,):
        return None
    x = x.contiguous()  # held here: the library reads it below
    out = torch.empty_like(x)
    library.call("rms_norm_forward", x.data_ptr(), weight.data_ptr(), out.data_ptr(), None, rows, dim, eps)
    return out

RMS_BLOCK = 256  # rows per partial sum of the RMSNorm weight's gradient (kernels.c's RMS_BLOCK)

def rms_norm_training_serves(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the RMSNorm forward/backward pair serves x [..., D] (float32 on the CPU, D % 8 == 0,
    outside autocast and compile); gradients on or off."""
    return (library.ENABLED and library.cpu_float32(x, weight) and x.dim() > 0 and x.numel() > 0 and x.shape[-1] % 8 == 0
            and weight.shape == x.shape[-1:] and weight.is_contiguous() and library.path_open())

def _check_rms_input(op: str, x: torch.Tensor, weight: torch.Tensor) -> int:
    if not (isinstance(x, torch.Tensor) and x.dim() > 0):
        library.fail(op, "x must be [..., D]")
    dim = x.shape[-1]
    library.check_tensor(op, "x", x)
    library.check_vector_size(op, "D", dim)
    library.check_tensor(op, "weight", weight, (dim,))
    return dim

def rms_norm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of x [..., D] -> (out, rstd [rows]) for the backward."""
    x = x.contiguous() if isinstance(x, torch.Tensor) else x  # held here: the library reads it below
    dim = _check_rms_input("rms_norm_forward", x, weight)
    out = torch.empty_like(x)
    rstd = torch.empty(x.numel() // dim, dtype=x.dtype, device=x.device)
    library.call("rms_norm_forward", x.data_ptr(), weight.data_ptr(), out.data_ptr(), rstd.data_ptr(), rstd.numel(), dim, eps)
    return out, rstd

def rms_norm_backward(x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor,
                      grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_x, grad_w) of rms_norm_forward, in one pass over x and grad_out."""
    op = "rms_norm_backward"
    x = x.contiguous() if isinstance(x, torch.Tensor) else x  # held here: the library reads them below
    grad_out = grad_out.contiguous() if isinstance(grad_out, torch.Tensor) else grad_out
    dim = _check_rms_input(op, x, weight)
    rows = x.numel() // dim
    library.check_tensor(op, "rstd", rstd, (rows,))
    library.check_tensor(op, "grad_out", grad_out, tuple(x.shape))
    grad_x = torch.empty_like(x)
    grad_w = torch.empty_like(weight)
    partial = torch.empty((rows + RMS_BLOCK - 1) // RMS_BLOCK, dim, dtype=x.dtype, device=x.device)
    library.call(op, x.data_ptr(), weight.data_ptr(), rstd.data_ptr(), grad_out.data_ptr(), grad_x.data_ptr(),
          grad_w.data_ptr(), partial.data_ptr(), rows, dim)
    return grad_x, grad_w

def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

def reference_rms_norm(x, weight, eps):
    return _rms(x, weight, eps)


class _RMSNormFunction(torch.autograd.Function):
    """RMSNorm by rms_norm_forward/backward; saves x and each row's 1 / rms."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        out, rstd = rms_norm_forward(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        grad_x, grad_w = rms_norm_backward(x, weight, rstd, grad_out)
        return grad_x, grad_w, None


def rms_norm_layer(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """RMSNorm of x [..., D] with gain `weight` by the fastest path that serves: inference on float32 inputs
    outside autocast the C kernel for a few rows (decoding), else torch's fused rms_norm; training on
    float32 CPU inputs the C forward/backward pair (one pass over memory each way; torch's fused rms_norm
    was no faster in training than the formula, whose autograd graph makes about eight). None elsewhere:
    the caller's formula."""
    if (x.dtype == torch.float32 and weight.dtype == torch.float32 and not torch.is_grad_enabled()
            and not torch.is_autocast_enabled(x.device.type)):
        out = rms_norm(x, weight, eps)  # a few rows on the CPU (decoding)
        return F.rms_norm(x, weight.shape, weight, eps) if out is None else out
    if rms_norm_training_serves(x, weight):
        return _RMSNormFunction.apply(x, weight, eps)
    return None


__all__ = ["RMS_BLOCK", "reference_rms_norm", "rms_norm", "rms_norm_backward", "rms_norm_forward", "rms_norm_layer",
           "rms_norm_training_serves"]
