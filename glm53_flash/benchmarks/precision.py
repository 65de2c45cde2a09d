"""`glm53 bench precision`: does a bf16 run follow the fp32 one? The same pretraining (same initial
weights, same batches of the task stream, the PRETRAINING recipe) run in fp32 and in bf16, step by step
in turn in one process, with both loss curves, their differences and the step times. Beside them, the
yardstick: a third run in fp32 from another initialisation seed (same batches), whose distance from
the first fp32 run is what a result drawn from one seed already cannot tell apart. bf16 whose gap is
inside that spread changes nothing a seed's result could show."""

from __future__ import annotations

import statistics
import sys
import time

import torch

from glm53_flash.core.receipts import provenance, write_json
from glm53_flash.core.runtime import resolve_device
from glm53_flash.data.batches import pretraining_batch
from glm53_flash.model import GLM53Flash
from glm53_flash.model.config import ModelConfig
from glm53_flash.model.precision import resolve_precision
from glm53_flash.train.engine import PRETRAINING, make_optimizer
from glm53_flash.train.objective import language_model_update
from glm53_flash.benchmarks.common import print_table, synchronize

# The stated tolerance: over windows of WINDOW steps, the bf16 run's mean loss within this fraction of
# the fp32 run's (bf16 products round each operand to 8 mantissa bits; the loss itself stays fp32).
CURVE_TOLERANCE = 0.02
WINDOW = 10
TIMING_SKIP = 10  # steps left out of the median step time: the first compile bf16 kernels per new shape (model/moe.py)


def _window_means(losses: list[float]) -> list[float]:
    return [statistics.fmean(losses[i:i + WINDOW]) for i in range(0, len(losses) - WINDOW + 1, WINDOW)]


def _worst(reference: list[float], other: list[float]) -> float:
    return max(abs(b - a) / a for a, b in zip(reference, other))


def run(preset: str = "flash", device: str = "auto", steps: int = 100, batch_size: int = 32,
        sequence_length: int = 128, seed: int = 42, baseline_seed: int | None = None,
        output: str | None = None) -> dict:
    if steps < WINDOW:
        raise ValueError(f"--steps must be at least {WINDOW}, got {steps}")
    device = resolve_device(device)
    cfg = ModelConfig.preset(preset)
    if sequence_length > cfg.max_sequence_length:
        raise ValueError(f"--sequence-length {sequence_length} exceeds the {preset} preset's {cfg.max_sequence_length}")
    baseline_seed = seed + 1 if baseline_seed is None else baseline_seed
    if baseline_seed == seed:
        raise ValueError(f"--baseline-seed must differ from --seed ({seed}): it is the other seed's run")
    runs = {}
    for name, precision, init in (("fp32", "fp32", seed), ("bf16", "bf16", seed), ("fp32_seed", "fp32", baseline_seed)):
        torch.manual_seed(init)
        model = GLM53Flash(cfg).to(device).train()
        runs[name] = {"model": model, "optimizer": make_optimizer(model, PRETRAINING),
                      "precision": resolve_precision(precision, device), "losses": [], "seconds": []}
    for step in range(steps):
        inputs, labels = (t.to(device) for t in pretraining_batch(step, batch_size, sequence_length))
        for name, state in runs.items():
            synchronize(device)
            start = time.perf_counter()
            result = language_model_update(state["model"], state["optimizer"], inputs, labels, PRETRAINING,
                                           precision=state["precision"])
            synchronize(device)
            state["seconds"].append(time.perf_counter() - start)
            state["losses"].append(result.loss)
        if (step + 1) % 10 == 0:
            print(f"[bench precision {time.strftime('%H:%M:%S')}] step {step + 1}/{steps}: loss fp32 "
                  f"{runs['fp32']['losses'][-1]:.4f}, bf16 {runs['bf16']['losses'][-1]:.4f}, fp32 seed "
                  f"{baseline_seed} {runs['fp32_seed']['losses'][-1]:.4f}", file=sys.stderr, flush=True)
    fp32, bf16, other = (runs[name]["losses"] for name in ("fp32", "bf16", "fp32_seed"))
    means = {name: _window_means(runs[name]["losses"]) for name in runs}
    windows = list(zip(means["fp32"], means["bf16"]))
    worst_window, worst_step = _worst(means["fp32"], means["bf16"]), _worst(fp32, bf16)
    seed_window, seed_step = _worst(means["fp32"], means["fp32_seed"]), _worst(fp32, other)
    skip = min(TIMING_SKIP, steps // 2)
    median = {name: statistics.median(state["seconds"][skip:]) for name, state in runs.items()}
    result = {
        "benchmark": "precision", "preset": preset, "device": str(device), "steps": steps,
        "batch_size": batch_size, "sequence_length": sequence_length, "seed": seed,
        "data": "task stream, batches 0..steps-1",
        "precisions": {name: state["precision"].record() for name, state in runs.items()},
        "loss_fp32": fp32, "loss_bf16": bf16,
        "step_seconds_fp32": runs["fp32"]["seconds"], "step_seconds_bf16": runs["bf16"]["seconds"],
        "window": WINDOW, "tolerance": CURVE_TOLERANCE,
        "max_relative_difference_of_window_means": worst_window,
        "max_relative_difference_per_step": worst_step,
        "final_window_fp32": windows[-1][0], "final_window_bf16": windows[-1][1],
        "within_tolerance": worst_window <= CURVE_TOLERANCE,
        "baseline_seed": baseline_seed, "loss_fp32_other_seed": other,
        "seed_max_relative_difference_of_window_means": seed_window,
        "seed_max_relative_difference_per_step": seed_step, "final_window_fp32_other_seed": means["fp32_seed"][-1],
        "bf16_within_seed_spread": worst_window <= seed_window,
        "median_step_seconds_after_warmup": median, "steps_skipped_for_timing": skip,
        "bf16_speedup_of_median": median["fp32"] / median["bf16"],
        "provenance": provenance(device=str(device)),
    }
    print_table([
        ("loss, first -> last window", f"fp32 {windows[0][0]:.4f} -> {windows[-1][0]:.4f}, "
                                       f"bf16 {windows[0][1]:.4f} -> {windows[-1][1]:.4f}"),
        (f"largest difference ({WINDOW}-step means)", f"{100 * worst_window:.2f}% (tolerance "
                                                      f"{100 * CURVE_TOLERANCE:.0f}%: "
                                                      f"{'within' if result['within_tolerance'] else 'OUTSIDE'})"),
        ("largest difference (one step)", f"{100 * worst_step:.2f}%"),
        (f"the same in fp32 from seed {baseline_seed}", f"{100 * seed_window:.2f}% ({WINDOW}-step means), "
                                                        f"{100 * seed_step:.2f}% (one step): bf16 "
                                                        f"{'inside' if result['bf16_within_seed_spread'] else 'OUTSIDE'}"
                                                        f" the seed spread"),
        ("median step after warm-up", f"fp32 {median['fp32']:.3f} s, bf16 {median['bf16']:.3f} s "
                                      f"({result['bf16_speedup_of_median']:.2f}x)"),
    ], title=f"glm53 bench precision  preset={preset}  steps={steps}")
    if output:
        write_json(output, result)
        print(f"wrote {output}")
    return result
