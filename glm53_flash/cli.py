"""The `glm53` command: each subcommand parses flags and calls one library function.

Each command group is one module of glm53_flash/commands/ with a `register(subparsers)` function,
listed once in `commands.GROUPS`; every benchmark is in `commands/bench.py`. Registration modules import only argparse-level
code; handlers import torch lazily, which keeps `glm53 --help` fast.
Also runnable as `python -m glm53_flash.cli ...` (the form `torchrun` needs).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from . import __version__
from .commands import BENCH_GROUP, GROUPS

class CommandError(Exception):
    """A bad flag value or state that the user can fix; printed as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="glm53", description="A 25.7M byte-level GLM-5.3-Flash-style model: train, post-train, evaluate.")
    parser.add_argument("--version", action="version", version=f"glm53_flash {__version__}")
    parser.add_argument("--require-isolation", dest="require_isolation_everywhere", action="store_true",
                        help="refuse to judge any program unless the verifier's sandbox reaches full isolation "
                             "(see `glm53 verify --isolation`); applies to every command")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    bench = sub.add_parser("bench", help="benchmarks (ratios measured on this machine)")
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="BENCHMARK")
    bench.set_defaults(func=lambda args: _print_help(bench))
    for module_name, _ in GROUPS:
        importlib.import_module(f"glm53_flash.commands.{module_name}").register(sub)
    importlib.import_module(f"glm53_flash.commands.{BENCH_GROUP}").register(bench_sub)
    return parser


def _print_help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.command_argv = list(sys.argv[1:] if argv is None else argv)  # for "rerun this command" hints
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if getattr(args, "require_isolation_everywhere", False) or getattr(args, "require_isolation", False):
        from .verifier.sandbox import require_full_isolation

        require_full_isolation()
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
