"""The dense product of decoding: F.linear(x, weight) without bias for a few rows (at most MAX_ROWS),
by the C loop that holds a few weight rows in registers and runs every input row past them, so each
weight byte is loaded once per call. BLAS tunes for large M: at 16 rows MKL's fp32 GEMM streamed the
flash model's weights at ~4 GB/s, a fifth of the memory bandwidth. Dispatch (`linear`): the kernel
where `library.serves` and the shapes allow, else `precision.mixed_linear` (the reference, and
training's path). `Linear` is nn.Linear without bias whose forward takes `linear`.
"""

from __future__ import annotations

import torch
from torch import nn

from glm53_flash.model.ops import library
from glm53_flash.model.precision import mixed_linear


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """F.linear(x, weight) without bias; by the kernel where it serves (its own dispatch: any input)."""
    if not library.ENABLED or torch.is_grad_enabled():  # training: straight to torch (in the run's product dtype)
        return mixed_linear(x, weight)
    k = x.shape[-1]
    rows = x.numel() // k if k else 0
    if not library.serves(x, weight, rows, library.MAX_ROWS) or weight.dim() != 2 or weight.shape[1] != k:
        return mixed_linear(x, weight)
    x = x.contiguous()  # held here: the library reads it below (a no-op for the usual contiguous x)
    out = torch.empty((*x.shape[:-1], weight.shape[0]), dtype=x.dtype)
    library.call("linear", x.data_ptr(), weight.data_ptr(), out.data_ptr(), rows, weight.shape[0], k)
    return out

class Linear(nn.Linear):
    """nn.Linear without bias (same parameters and state-dict keys) whose forward takes the CPU
    kernel where it serves (decoding a few rows) and F.linear everywhere else."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight)


__all__ = ["Linear", "linear"]
