"""The `glm53` command: each subcommand parses flags and calls one library function.

Each command group is one module of glm53_flash/commands/ with a `register(subparsers)` function,
listed once in `commands.GROUPS`; every benchmark is in `commands/bench.py`. Registration modules import only argparse-level
code; handlers import torch lazily, which keeps `glm53 --help` fast.
Also runnable as `python -m glm53_flash.cli ...` (the form `torchrun` needs).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import re
import sys

from glm53_flash.core import __version__
from glm53_flash.commands import BENCH_GROUP, GROUPS
from glm53_flash.core.receipts import pin_launch_commit
from glm53_flash.core.runtime import retain_freed_memory
from glm53_flash.core.shared_machine import (RESTART_COMMANDS, ShortSpinRestart, allow_restart, restart_with_short_spins,
                                             short_spin_waits)


class CommandError(Exception):
    """A bad flag value or state that the user can fix; printed as one line, exit code 2."""


_INVALID_CHOICE = re.compile(r"invalid choice: '?([^' ]*)'? \(choose from (.*)\)")


class Parser(argparse.ArgumentParser):
    """argparse with the behaviour a user expects: flags must be spelled out (`--step 3` is not
    `--steps 3`), an error is one line naming the (sub)command it was given to, then a pointer to its
    --help (not the whole usage), and a misspelt command, choice or flag gets a "did you mean".
    Subcommands inherit the class."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and self.prog != ROOT_PROG:
            # Reported here, by the (sub)command that received them, not by the top-level parser.
            self.error(f"unrecognized arguments: {' '.join(extras)}" + self._suggest_flag(extras))
        return namespace, extras

    def _suggest_flag(self, extras: list[str]) -> str:
        flags = [s for action in self._actions for s in action.option_strings if s.startswith("--")]
        for extra in extras:
            if extra.startswith("--"):
                close = difflib.get_close_matches(extra.split("=", 1)[0], flags, n=1, cutoff=0.6)
                if close:
                    return f" (did you mean {close[0]}?)"
        return ""

    def error(self, message: str):
        match = _INVALID_CHOICE.search(message)
        if match:
            choices = [c.strip(" '\"") for c in match.group(2).split(",")]
            close = difflib.get_close_matches(match.group(1), choices, n=1, cutoff=0.5)
            if close:
                message += f"; did you mean {close[0]!r}?"
        # The one useful line first, then where the flags are: not the whole usage block above it.
        self.exit(2, f"{self.prog}: error: {message}\n(`{self.prog} --help` lists every flag)\n")


ROOT_PROG = "glm53"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=ROOT_PROG, description="A 25.7M byte-level GLM-5.3-Flash-style model: train, post-train, evaluate.")
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


def _quiet_broken_pipe() -> int:
    """The reader of our output went away (`glm53 info | head`): stop without a traceback. stdout is
    pointed at /dev/null so that the interpreter's final flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141  # 128 + SIGPIPE, what a shell reports for a command killed by a closed pipe


def _rank() -> int:
    """This process's rank under torchrun (0 outside it)."""
    import os

    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        return _quiet_broken_pipe()


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.command_argv = list(sys.argv[1:] if argv is None else argv)  # for "rerun this command" hints
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    short_spin_waits()  # before torch loads: on a busy machine idle math threads sleep after a short spin
    # A run of this process's own command line may start again with short spins when the machine gets busy
    # (shared_machine.ShortSpinRestart); not a call from Python (tests, notebooks) and not under torchrun.
    allow_restart(argv is None and args.command in RESTART_COMMANDS and os.environ.get("WORLD_SIZE", "1") == "1")
    retain_freed_memory()  # steadier, faster training and sampling steps: see its note
    pin_launch_commit()  # receipts name the code this process loaded, not later commits
    if getattr(args, "require_isolation_everywhere", False) or getattr(args, "require_isolation", False):
        from glm53_flash.verifier.sandbox import require_full_isolation

        require_full_isolation()
    try:
        return int(args.func(args) or 0)
    except (CommandError, ValueError, FileExistsError, FileNotFoundError) as error:
        if _rank() == 0:  # under torchrun every rank meets the same bad input: one line, from rank 0
            print(f"glm53 {args.command}: error: {error}", file=sys.stderr)
        return 2
    except ShortSpinRestart as restart:
        return restart_with_short_spins(args.command, args.command_argv, hasattr(args, "resume"), restart)
    except KeyboardInterrupt:
        print(f"glm53 {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
