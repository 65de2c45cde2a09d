"""RMSNorm, as in GLM-5.3-Flash's pre-norm blocks (and the original miniature).

x * rsqrt(mean(x^2) + eps) with the statistics in float32 (stable under bf16 autocast), then a learned
gain. Where a fast path serves (model/ops/rmsnorm.py: C kernels, torch's fused op) it computes the same.
"""

from __future__ import annotations

import torch
from torch import nn

from glm53_flash.model import ops


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fast = ops.rms_norm_layer(x, self.weight, self.eps)
        return rms_norm_reference(x, self.weight, self.eps) if fast is None else fast


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) computed in float32, cast back, times the gain."""
    normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return normed.to(x.dtype) * weight.to(x.dtype)
