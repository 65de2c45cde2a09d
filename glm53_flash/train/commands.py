"""CLI registration for `glm53 pretrain` (flags map one to one onto PretrainConfig)."""

from __future__ import annotations

import argparse
import sys

from ..config import LINEAR_ROPE_MODES, PRESETS, STREAM_MODES, BALANCE_LOSS_MODES
from ..runtime import DEVICE_CHOICES


def parse_steps(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def register(sub, bench_sub) -> None:
    p = sub.add_parser("pretrain", help="pretrain from random weights on the generated task corpus",
                       description="Pretrain with checkpoints, exact resume and receipts. Multi-process: "
                                   "torchrun --nproc_per_node=N -m glm53_flash.cli pretrain ...")
    p.add_argument("--output", required=True, help="run directory (must not exist unless --resume)")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--checkpoints", type=parse_steps, default=None,
                   help="comma-separated steps to checkpoint at; the last step always is "
                        "(default 100,200,400, those within --steps)")
    p.add_argument("--batch-size", type=int, default=32, help="global batch (split across ranks)")
    p.add_argument("--sequence-length", type=int, default=128)
    p.add_argument("--learning-rate", type=float, default=3e-4)
    p.add_argument("--seed", type=int, default=42, help="model initialisation seed")
    p.add_argument("--data-seed", type=int, default=42, help="seed of the pretraining stream (42 = the original's)")
    p.add_argument("--device", choices=DEVICE_CHOICES, default="auto")
    p.add_argument("--preset", choices=sorted(PRESETS), default="flash")
    p.add_argument("--warmup", type=int, default=0, help="linear warmup steps")
    p.add_argument("--schedule", choices=("constant", "cosine"), default="constant")
    p.add_argument("--weight-decay", type=float, default=0.1, help="applied to weight matrices only")
    p.add_argument("--resume", action="store_true", help="continue the run in --output from its last checkpoint")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--stream-mode", choices=STREAM_MODES, help="override the preset (ablations)")
    p.add_argument("--linear-rope", choices=LINEAR_ROPE_MODES, help="override the preset (ablations)")
    p.add_argument("--balance-loss", choices=BALANCE_LOSS_MODES, help="override the preset (ablations)")
    p.set_defaults(func=run_pretrain)


def run_pretrain(args: argparse.Namespace) -> int:
    from .pretrain import PretrainConfig, TrainingDiverged, pretrain

    overrides = {k: v for k, v in (("stream_mode", args.stream_mode), ("linear_rope", args.linear_rope),
                                   ("balance_loss", args.balance_loss)) if v is not None}
    checkpoints = args.checkpoints
    if checkpoints is None:
        checkpoints = tuple(c for c in (100, 200, 400) if c <= args.steps)
    cfg = PretrainConfig(
        output=args.output, steps=args.steps, checkpoints=checkpoints, batch_size=args.batch_size,
        sequence_length=args.sequence_length, learning_rate=args.learning_rate, seed=args.seed,
        data_seed=args.data_seed, device=args.device, preset=args.preset, warmup=args.warmup,
        schedule=args.schedule, weight_decay=args.weight_decay, resume=args.resume, compile=args.compile,
        progress=not args.no_progress, model_overrides=overrides)
    try:
        receipt = pretrain(cfg)
    except TrainingDiverged as error:
        print(f"glm53 pretrain: error: {error}", file=sys.stderr)
        return 1
    if receipt:
        last = receipt["training_curve"][-1] if receipt["training_curve"] else {}
        print(f"complete: {receipt['tokens_seen']:,} tokens in {receipt['elapsed_seconds']:.1f} s, "
              f"final loss {last.get('loss', float('nan')):.4f}; receipt {args.output}/training-receipt.json")
    return 0
