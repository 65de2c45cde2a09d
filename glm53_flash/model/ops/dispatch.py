"""Every switch that steers which path a layer takes, in one place: the module attributes tests and
benchmarks set, and the environment variables read when the process starts. Receipts record them
(provenance field `kernel_switches`; `decode_kernels` is the library's status)."""

from __future__ import annotations

import os

from glm53_flash.core import receipts
from glm53_flash.model.ops import experts, library, linear_attention

SWITCHES = {
    "GLM53_KERNELS": "environment: 0 turns every kernel off (ops.library.ENABLED = False)",
    "GLM53_KERNEL_ISA": "environment: avx512 or avx2, the build to load (default: the widest the CPU has)",
    "GLM53_KERNEL_CACHE": "environment: where builds are cached (default ~/.cache/glm53_flash/kernels)",
    "ops.library.ENABLED": "False: the eager torch path everywhere",
    "ops.library.FUSED_DECODE": "False: a decode step op by op instead of every block in one C call",
    "ops.experts.GROUPED_MM_ENABLED": "False: the MoE's many-row path without torch's grouped matmul",
    "ops.experts.PADDED_ENABLED": "False: the MoE's few-row path without the padded batched matmuls",
    "ops.linear_attention.SCAN_ENABLED": "False: sequences longer than the chunk in the torch chunks, not the C scan",
}


def dispatch_record() -> dict:
    """The switches' values in this process (what `SWITCHES` names)."""
    return {"enabled": library.ENABLED, "fused_decode": library.FUSED_DECODE, "grouped_mm": experts.GROUPED_MM_ENABLED,
            "padded": experts.PADDED_ENABLED, "linear_scan": linear_attention.SCAN_ENABLED,
            "environment": {name: os.environ.get(name) for name in SWITCHES if name.startswith("GLM53_")}}


receipts.observe("kernel_switches", dispatch_record)

__all__ = ["SWITCHES", "dispatch_record"]
