"""Shared measurement helpers: matmul peak, peak memory, environment, table printing."""

from __future__ import annotations

import time

import torch


def timed_runs(fn, device: torch.device, warmup: int, repeats: int) -> list[float]:
    """Wall seconds of `repeats` calls of fn() after `warmup` untimed calls, device synchronised."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


# The square GEMM sizes whose best rate is a precision's peak. A test passes smaller ones: on a CPU without
# bf16 instructions a bf16 GEMM is emulated at about 1 GFLOP/s, and one 2048^3 product takes 17 s.
PEAK_SIZES = (1024, 2048)


def measure_matmul_peak(device: torch.device, sizes=PEAK_SIZES, repeats: int = 5,
                        dtype: torch.dtype = torch.float32) -> dict:
    """Best GEMM rate in `dtype` over a few square sizes: the denominator of training efficiency."""
    best = 0.0
    per_size = {}
    for n in sizes:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        rate = 2 * n**3 / min(timed_runs(lambda: a @ b, device, warmup=2, repeats=repeats))
        per_size[str(n)] = rate
        best = max(best, rate)
    return {"flops_per_second": best, "by_size": per_size}


def bench_precisions(requested: str, device) -> dict:
    """The precisions a bench compares, from --precisions: {"names": [...] (fp32 first), "requested", "reason"}.
    `auto` leaves bf16 out where the device only emulates it (resolve_precision('auto') picks fp32 there)."""
    from glm53_flash.model.precision import resolve_precision

    if requested == "auto":
        chosen = resolve_precision("auto", device)
        if chosen.name == "bf16":
            return {"names": ["fp32", "bf16"], "requested": requested, "reason": chosen.reason}
        return {"names": ["fp32"], "requested": requested,
                "reason": f"{chosen.reason}: bf16 left out (emulated; --precisions fp32,bf16 times it anyway)"}
    names = [name.strip() for name in requested.split(",") if name.strip()]
    unknown = [name for name in names if name not in ("fp32", "bf16")]
    if not names or unknown or len(set(names)) != len(names):
        raise ValueError(f"--precisions takes auto or a comma-separated list of fp32 and bf16 (each once), got "
                         f"{requested!r}")
    for name in names:
        resolve_precision(name, device)  # bf16 where the device has no path for it: a clear error now
    return {"names": sorted(names, key=("fp32", "bf16").index), "requested": requested, "reason": "asked for"}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def print_table(rows: list[tuple[str, str]], title: str) -> None:
    width = max(len(name) for name, _ in rows)
    print(title)
    print("-" * (width + 30))
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
