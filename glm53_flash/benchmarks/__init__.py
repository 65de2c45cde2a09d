"""Benchmarks behind `glm53 bench ...`: ratios measured on one machine in one process."""

from __future__ import annotations

from ..config import PRESETS
from ..runtime import DEVICE_CHOICES


def register(sub, bench_sub) -> None:
    parser = bench_sub.add_parser(
        "model", help="training FLOP/s vs matmul peak, cached decode vs re-forward, peak memory")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="flash")
    parser.add_argument("--device", choices=DEVICE_CHOICES, default="cpu")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5, help="timed training steps (the minimum is reported)")
    parser.add_argument("--decode-batch", type=int, default=16)
    parser.add_argument("--prompt-length", type=int, default=64)
    parser.add_argument("--decode-length", type=int, default=None,
                        help="total length to decode to (default: the preset's max_sequence_length)")
    parser.add_argument("--reforward-every", type=int, default=1,
                        help="time the re-forward baseline at every N-th length and interpolate (1 = all)")
    parser.add_argument("--output", default="runs/bench/model.json", help="JSON receipt path")
    parser.set_defaults(func=lambda a: _run_model(a))

    arch = bench_sub.add_parser(
        "architecture", help="loss after a short pretraining run for each variant of the original's flaws")
    arch.add_argument("--preset", choices=sorted(PRESETS), default="flash")
    arch.add_argument("--steps", type=int, default=60)
    arch.add_argument("--batch-size", type=int, default=16)
    arch.add_argument("--seeds", default="1", help="comma-separated initialisation seeds (paired across variants)")
    arch.add_argument("--variants", default="", help="comma-separated subset (default: all)")
    arch.add_argument("--device", choices=DEVICE_CHOICES, default="cpu")
    arch.add_argument("--output", default="runs/bench/architecture.json", help="JSON receipt path")
    arch.set_defaults(func=_run_architecture)


def _run_model(a) -> int:
    from .model import run

    run(
        preset=a.preset, device_name=a.device, batch_size=a.batch_size, seq_len=a.sequence_length,
        steps=a.steps, decode_batch=a.decode_batch, prompt_len=a.prompt_length, decode_total=a.decode_length,
        reforward_every=a.reforward_every, output=a.output)
    return 0




def _run_architecture(a) -> int:
    from .architecture import VARIANTS, run

    variants = tuple(v for v in a.variants.split(",") if v) or tuple(VARIANTS)
    run(preset=a.preset, steps=a.steps, batch_size=a.batch_size,
        seeds=tuple(int(s) for s in a.seeds.split(",") if s), variants=variants, device=a.device, output=a.output)
    return 0
