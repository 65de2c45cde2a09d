"""The `glm53` command: each subcommand parses flags and calls one library function.

Also runnable as `python -m glm53_flash.cli ...` (the form `torchrun` needs).
"""

from __future__ import annotations

import argparse
import sys

from . import __version__
from .config import PRESETS
from .runtime import DEVICE_CHOICES


class CommandError(Exception):
    """A bad flag value or state that the user can fix; printed as one line, exit code 2."""


def cmd_info(args: argparse.Namespace) -> int:
    from .info import describe

    describe(args.preset, generate=not args.no_generate, max_new_tokens=args.max_new_tokens)
    return 0


def cmd_bench_model(args: argparse.Namespace) -> int:
    from .benchmarks.model import run

    run(preset=args.preset, device_name=args.device, batch_size=args.batch_size, seq_len=args.sequence_length,
        steps=args.steps, decode_batch=args.decode_batch, prompt_len=args.prompt_length,
        decode_total=args.decode_length, reforward_every=args.reforward_every, output=args.output)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="glm53", description="A 25.7M byte-level GLM-5.3-Flash-style model: train, post-train, evaluate.")
    parser.add_argument("--version", action="version", version=f"glm53_flash {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    info = sub.add_parser("info", help="print a preset's parameter table, layer pattern and a sample generation")
    info.add_argument("--preset", choices=sorted(PRESETS), default="flash")
    info.add_argument("--no-generate", action="store_true", help="skip the sample generation")
    info.add_argument("--max-new-tokens", type=int, default=32)
    info.set_defaults(func=cmd_info)

    bench = sub.add_parser("bench", help="benchmarks (ratios measured on this machine)")
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="BENCHMARK")
    bench.set_defaults(func=lambda a: _missing(bench))

    model = bench_sub.add_parser("model", help="training FLOP/s vs matmul peak, cached decode vs re-forward, memory")
    model.add_argument("--preset", choices=sorted(PRESETS), default="flash")
    model.add_argument("--device", choices=DEVICE_CHOICES, default="cpu")
    model.add_argument("--batch-size", type=int, default=32)
    model.add_argument("--sequence-length", type=int, default=128)
    model.add_argument("--steps", type=int, default=5, help="timed training steps (the minimum is reported)")
    model.add_argument("--decode-batch", type=int, default=16)
    model.add_argument("--prompt-length", type=int, default=64)
    model.add_argument("--decode-length", type=int, default=192, help="total length to decode to")
    model.add_argument("--reforward-every", type=int, default=1,
                       help="time the re-forward baseline at every N-th length and interpolate (1 = all)")
    model.add_argument("--output", default="runs/bench/model.json", help="JSON receipt path")
    model.set_defaults(func=cmd_bench_model)
    return parser


def _missing(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (CommandError, ValueError, FileExistsError, FileNotFoundError) as error:
        print(f"glm53 {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"glm53 {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
