"""Precision as one choice: `fp32`, `bf16` or `auto`, resolved once per run and entered with `compute_in`.

What bf16 means depends on the device:
- **CUDA**: torch's bf16 autocast (what pretraining always used there).
- **CPU**: the weight products only. Inside `compute_in`, every `nn.Linear`-style product of the model
  (`mixed_linear`: attention in/out, router, shared expert, tied head) and the routed experts' products
  (ops/experts.py, the blocked path) cast both operands to bf16 and hand back float32; their backward runs
  in bf16 too (autograd casts the incoming gradient). Everything else stays float32, and the C kernels keep
  serving it: master weights and AdamW state, the losses, the router's softmax, the norms, the SwiGLU
  activation, the residual streams, the linear-attention feature maps and states (its masked blocks' two
  products take bf16 too: ops.block_dtype), the sparse attention's scores. CPU autocast, which casts every
  op's inputs and shuts the float32 kernels off, is not used (docs/ARCHITECTURE.md, "Precision").
- **Only products with enough rows** (`BF16_MIN_ROWS`; the routed experts `ops.experts.BLOCKED_MIN_SLOTS`):
  casting the weight and the result is a fixed cost that a few rows do not repay.
- **Cached decoding on the CPU** reads bf16 weights: inside `compute_in(bf16)` the one-call decode step
  (ops/decode_model.py) reads bf16 copies of each block's weight-product matrices, made once per weight
  version, and widens them to float32 in registers; its arithmetic stays float32 (a step equals the float32
  step on the weights rounded to bf16, bit for bit), the router, norms and head stay float32.
  `mixed_linear` leaves a call that a C kernel serves to it, so prefills, full forwards and decode steps
  of many rows take bf16 products.

`auto` takes bf16 where the device accelerates it (CUDA with bf16; a CPU with AVX512-BF16 or AMX, read
from /proc/cpuinfo) and fp32 elsewhere. fp32 stays bit-reproducible: outside `compute_in`, or inside
it with fp32, no product changes.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from glm53_flash.core.runtime import PRECISION_HELP, PRECISIONS  # noqa: E402 - torch-free, for the CLI
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")

# The dtype of the weight products inside compute_in on the CPU; None: float32 (no change).
_PRODUCT_DTYPE: contextvars.ContextVar = contextvars.ContextVar("glm53_product_dtype", default=None)


@dataclass(frozen=True)
class Precision:
    """A resolved choice: `name` is fp32 or bf16, `requested` what the user asked for, `reason` why."""

    name: str
    requested: str
    reason: str

    @property
    def dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.name == "bf16" else torch.float32

    @property
    def setting(self) -> str | None:
        """What an evaluation's identity records: the name a chosen precision resolved to (auto is bf16 on
        one machine, fp32 on another), None for the default (which earlier plans left out)."""
        return None if self.requested == "default" else self.name

    def record(self) -> dict:
        """What receipts hold."""
        return {**asdict(self), "decode": DECODE_NOTE if self.name == "bf16" else "fp32"}


DECODE_NOTE = ("cached decode steps on the CPU run the C kernels on bf16 copies of the block weights (float32 "
               "arithmetic; router, norms and head float32); prefills and full forwards take bf16 products")


def cpu_bf16_flags(cpuinfo: str | None = None) -> list[str]:
    """The bf16 flags this CPU reports (of CPU_BF16_FLAGS), from /proc/cpuinfo or the text given."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as handle:
                cpuinfo = handle.read()
        except OSError:
            return []
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags") or line.startswith("Features"):
            flags.update(line.split(":", 1)[-1].split())
    return [flag for flag in CPU_BF16_FLAGS if flag in flags]


def resolve_precision(requested: str | None, device, cpuinfo: str | None = None) -> Precision:
    """fp32 | bf16 | auto (or None: the default, bf16 autocast on CUDA and fp32 elsewhere) on `device` -> a
    Precision with its reason; an unknown name or bf16 where the device cannot run it is a clear error."""
    kind = torch.device(device).type
    if requested is None:  # the default (plans and evaluations that name no precision leave it out)
        name = "bf16" if kind == "cuda" else "fp32"
        return Precision(name, "default", "default: bf16 autocast on CUDA, fp32 elsewhere (use auto for bf16 "
                                          "where the CPU accelerates it)")
    if requested not in PRECISIONS:
        raise ValueError(f"unknown precision {requested!r}; allowed: {', '.join(PRECISIONS)}")
    if kind == "cuda":
        supported = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        accelerated, why = supported, "CUDA with bf16" if supported else "this CUDA device has no bf16"
    elif kind == "cpu":
        flags = cpu_bf16_flags(cpuinfo)
        supported = True  # oneDNN and torch emulate bf16 where the CPU has no instructions for it: slow, correct
        accelerated = bool(flags)
        why = f"CPU with {', '.join(flags)}" if flags else "this CPU has no AVX512-BF16 or AMX"
    else:
        supported, accelerated, why = False, False, f"no bf16 path on {kind} here"
    if requested == "fp32":
        return Precision("fp32", requested, "asked for")
    if requested == "bf16":
        if not supported:
            raise ValueError(f"--precision bf16: {why}")
        return Precision("bf16", requested, "asked for" + ("" if accelerated else f" ({why}: emulated, slow)"))
    return Precision("bf16" if accelerated else "fp32", requested, f"auto: {why}")


def compute_in(precision: Precision | None, device):
    """The context a forward (and its backward, when called inside) runs in for `precision`; None: the
    default (`resolve_precision(None, device)`: bf16 autocast on CUDA, float32 elsewhere)."""
    if precision is None:
        precision = resolve_precision(None, device)
    if precision.name == "fp32":
        return contextlib.nullcontext()
    kind = torch.device(device).type
    if kind == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return _cpu_products(precision.dtype)


@contextlib.contextmanager
def _cpu_products(dtype: torch.dtype):
    token = _PRODUCT_DTYPE.set(dtype)
    try:
        yield
    finally:
        _PRODUCT_DTYPE.reset(token)


# Below this many rows a bf16 weight product on the CPU costs more than the float32 one: casting the weight
# and the result is a fixed cost the few rows do not repay (the figures: docs/ARCHITECTURE.md, "Precision").
# So a prefill of one prompt and RL's update on a few short sequences stay float32, a pretraining batch
# (4096 rows) takes bf16.
BF16_MIN_ROWS = 256


def product_dtype() -> torch.dtype | None:
    """The dtype weight products take now on the CPU (None: their inputs' own)."""
    return _PRODUCT_DTYPE.get()


def product_dtype_for(x: torch.Tensor, rows: int | None = None) -> torch.dtype | None:
    """The dtype the product of float32 CPU rows `x` takes inside compute_in, or None: its own (outside
    bf16 products, another dtype or device, or fewer than BF16_MIN_ROWS rows: x's leading sizes, or
    `rows` where the caller counts them otherwise)."""
    dtype = _PRODUCT_DTYPE.get()
    if dtype is None or x.dtype != torch.float32 or not x.is_cpu:
        return None
    few = x.numel() < BF16_MIN_ROWS * x.shape[-1] if rows is None else rows < BF16_MIN_ROWS
    return None if few else dtype


def mixed_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """F.linear(x, weight) without bias, in the product dtype of compute_in for float32 CPU inputs of
    at least BF16_MIN_ROWS rows."""
    dtype = product_dtype_for(x)
    if dtype is None:
        return F.linear(x, weight)
    return F.linear(x.to(dtype), weight.to(dtype)).float()


def mixed_matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight, in the product dtype of compute_in for float32 CPU inputs of at least BF16_MIN_ROWS rows."""
    dtype = product_dtype_for(x)
    if dtype is None:
        return torch.matmul(x, weight)
    return torch.matmul(x.to(dtype), weight.to(dtype)).float()


__all__ = ["BF16_MIN_ROWS", "CPU_BF16_FLAGS", "DECODE_NOTE", "PRECISIONS", "PRECISION_HELP", "Precision",
           "compute_in", "cpu_bf16_flags", "mixed_linear", "mixed_matmul", "product_dtype", "product_dtype_for",
           "resolve_precision"]
