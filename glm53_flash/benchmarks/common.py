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


def measure_matmul_peak(device: torch.device, sizes=(1024, 2048), repeats: int = 5,
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


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def print_table(rows: list[tuple[str, str]], title: str) -> None:
    width = max(len(name) for name, _ in rows)
    print(title)
    print("-" * (width + 30))
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
