"""Device choice, memory checks, seeding and malloc tuning shared by training, sampling and benchmarks (the
precision a forward runs in is model/precision.py's compute_in; running beside other work is
core/shared_machine.py).

torch is imported inside the functions so that CLI registration can read DEVICE_CHOICES cheaply.
"""

from __future__ import annotations

import random

DEVICE_CHOICES = ("auto", "cpu", "cuda", "mps")
DEFAULT_DEVICE = "auto"  # every command's --device default: CUDA, then MPS, then the CPU
PRECISIONS = ("fp32", "bf16", "auto")  # resolved by model/precision.py
PRECISION_HELP = ("fp32, bf16 (the weight products in bf16 with float32 everything else on the CPU; autocast "
                  "on CUDA) or auto: bf16 where the device accelerates it (AVX512-BF16/AMX CPUs, CUDA with bf16)")
BENCH_PRECISIONS_HELP = ("the precisions a bench times, comma-separated (fp32, bf16), or auto: both where the device "
                         "accelerates bf16 (CUDA with bf16, a CPU with AVX512-BF16 or AMX), fp32 alone elsewhere, "
                         "where bf16 is emulated and a step can take minutes")


def resolve_device(name: str = "auto"):
    """'auto' picks CUDA, then MPS, then CPU; an unavailable explicit choice is a clear error."""
    import torch

    if name not in DEVICE_CHOICES:
        raise ValueError(f"unknown device {name!r}; allowed: {', '.join(DEVICE_CHOICES)}")
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but CUDA is not available")
    if name == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError("device 'mps' requested but MPS is not available")
    return torch.device(name)


def available_memory_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (None where it cannot be read)."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_fits(needed: int, what: str, hint: str, available: int | None = None) -> None:
    """One-line ValueError when `needed` bytes (an estimate) exceed the machine's free memory
    (MemAvailable; nothing is checked where it cannot be read)."""
    available = available_memory_bytes() if available is None else available
    if available is not None and needed > available:
        raise ValueError(f"{what} needs about {needed / 2**30:.1f} GiB, more than the {available / 2**30:.1f} GiB "
                         f"this machine has free; {hint}")


def fused_optimizer_supported(device) -> bool:
    """Whether to ask for torch's fused AdamW kernel (one pass per parameter instead of a chain of
    foreach ops): on CPU and CUDA, where it is tested here; measured on the flash preset it saves
    ~4% of a CPU training step. MPS keeps the foreach path (newer torch has a fused MPS kernel too,
    but nothing here has measured it)."""
    import torch

    return torch.device(device).type in ("cpu", "cuda")


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)


# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MALLOC_RETAIN_BYTES = 1 << 30
_malloc_tuning: str | None = None  # what retain_freed_memory did in this process (receipts record it)


def retain_freed_memory(environ=None) -> str:
    """Ask glibc's malloc to keep freed memory (blocks up to MALLOC_RETAIN_BYTES) for reuse instead of
    handing it back to the kernel, so that each training or sampling step reuses the pages of the one
    before instead of faulting in fresh ones. The process keeps its peak heap, which a step reaches anyway.
    Returns what was done (receipts record it); GLM53_MALLOC_TUNING=0 turns it off; a C library other
    than glibc is left alone."""
    import ctypes
    import ctypes.util
    import os
    import platform

    global _malloc_tuning
    environ = os.environ if environ is None else environ
    if environ.get("GLM53_MALLOC_TUNING", "1") == "0":
        _malloc_tuning = "off (GLM53_MALLOC_TUNING=0)"
    elif platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        _malloc_tuning = "left alone (not glibc)"
    else:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            # Freed memory goes back to the kernel only when 2 GiB (the largest int) lie free at the top.
            ok = libc.mallopt(_M_MMAP_THRESHOLD, MALLOC_RETAIN_BYTES) == 1 and \
                libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1
            _malloc_tuning = "on (glibc keeps freed blocks up to 1 GiB)" if ok else "left alone (glibc refused mallopt)"
        except (OSError, AttributeError) as error:
            _malloc_tuning = f"left alone ({error})"
    return _malloc_tuning


def malloc_tuning() -> str | None:
    """What retain_freed_memory did in this process, or None when nothing called it (library use)."""
    return _malloc_tuning
