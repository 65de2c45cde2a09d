"""`glm53 bench architecture`: the loss after a fixed short pretraining run for each variant of the
original's flaws (stream residual, RoPE placement in linear layers, balance loss), paired by seed.

This is the measurement behind the defaults in ModelConfig (recorded in docs/BENCHMARKS-HISTORY.md).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from glm53_flash.model.config import ORIGINAL_MODEL_SWITCHES
from glm53_flash.core.receipts import provenance, write_json
from glm53_flash.train.pretrain import PretrainConfig, pretrain
from glm53_flash.benchmarks.common import print_table

VARIANTS: dict[str, dict] = {
    "default": {},
    # every switch of the original miniature at once
    "faithful": dict(ORIGINAL_MODEL_SWITCHES),
    "stream-delta": {"stream_mode": "delta"},
    "rope-before-feature": {"linear_rope": "rope-before-feature-map"},
    "balance-hard-count": {"balance_loss": "hard-count"},
    "sinkhorn": {"stream_mode": "sinkhorn"},
}


def run(preset: str = "flash", steps: int = 60, batch_size: int = 16, seeds=(1,), tail: int = 10,
        variants=(), device: str = "auto", output: str | None = None) -> dict:
    """Pretrain each of `variants` (names of VARIANTS; none given: all of them) from each of `seeds`."""
    variants = tuple(variants) or tuple(VARIANTS)
    unknown = [name for name in variants if name not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant {unknown[0]!r}; allowed: {', '.join(VARIANTS)}")
    if not seeds:
        raise ValueError("--seeds must name at least one seed")
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in variants:
            losses, seconds = [], []
            for seed in seeds:
                start = time.perf_counter()
                receipt = pretrain(PretrainConfig(
                    output=str(Path(tmp) / f"{name}-{seed}"), preset=preset, steps=steps, checkpoints=(),
                    batch_size=batch_size, seed=seed, device=device, quiet=True,
                    model_overrides=VARIANTS[name]))
                curve = [row["loss"] for row in receipt["training_curve"]]
                losses.append(statistics.fmean(curve[-tail:]))
                seconds.append(time.perf_counter() - start)
                print(f"  {name:<20} seed {seed}: mean loss of the last {tail} steps {losses[-1]:.4f} "
                      f"({seconds[-1]:.0f} s)", flush=True)
            results[name] = {"overrides": VARIANTS[name], "final_losses": losses,
                             "mean_final_loss": statistics.fmean(losses), "seconds": seconds}
    base = results.get("default", {}).get("mean_final_loss")
    rows = [(name, f"{r['mean_final_loss']:.4f}" + (f"  ({r['mean_final_loss'] - base:+.4f} vs default)"
                                                      if base is not None and name != "default" else ""))
            for name, r in results.items()]
    print_table(rows, title=f"glm53 bench architecture  preset={preset} steps={steps} batch={batch_size} "
                            f"seeds={','.join(map(str, seeds))}  (mean loss of the last {tail} steps)")
    payload = {"benchmark": "architecture", "preset": preset, "steps": steps, "batch_size": batch_size,
               "seeds": list(seeds), "tail": tail, "results": results, "provenance": provenance(device=device)}
    if output:
        write_json(output, payload)
        print(f"wrote {output}")
    return payload
