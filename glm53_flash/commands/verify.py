"""CLI glue for the verifier: `glm53 verify` (judge one program; `glm53 bench verify` is in commands/bench.py).

Each `add_*_parser` registers a subcommand whose `func` takes the parsed Namespace and returns the
exit code; the handlers only read flags, call library functions and print.
"""

from __future__ import annotations

import argparse
import json
import sys

from glm53_flash.core.options import add_arguments
from glm53_flash.tasks import task_by_id
from glm53_flash.verifier.policy import MAX_SOURCE_BYTES
from glm53_flash.verifier.sandbox import CandidateLimits


def add_verify_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "verify",
        help="judge one program for one task in the sandbox and print the Evaluation as JSON",
        description="Judge a full program (prompt + completion) for a frozen task. Exit status: 0 passed, "
                    "1 judged but not passed (failed, invalid or limit), 2 bad input.",
    )
    parser.add_argument("--task-id", help="task id of an unsealed split, e.g. dev-double-000 (required unless --isolation)")
    parser.add_argument("--source",
                        help="file holding the full program (prompt + completion); '-' reads stdin "
                             f"(at most {MAX_SOURCE_BYTES} bytes are read: a longer program is invalid)")
    parser.add_argument("--isolation", action="store_true",
                        help="print the sandbox isolation this host allows, layer by layer, as JSON and exit "
                             "(exit status 0 full, 1 partial)")
    parser.add_argument("--require-isolation", action="store_true",
                        help="refuse to judge unless the sandbox reaches full isolation (exit status 2)")
    add_arguments(parser, CandidateLimits)
    parser.set_defaults(func=run_verify_command)
    return parser


def run_verify_command(args: argparse.Namespace) -> int:
    """Bad input raises ValueError; glm53_flash.cli prints it as one line with exit status 2."""
    from glm53_flash.verifier.sandbox import Verifier, probe_isolation

    if args.isolation:
        report = probe_isolation(require=False)
        print(json.dumps(report, indent=2))
        return 0 if report.get("level") == "full" else 1
    if not args.task_id or not args.source:
        raise ValueError("--task-id and --source are required (or --isolation)")
    task = task_by_id(args.task_id)
    raw = read_source_bounded(args.source)
    # surrogateescape keeps non-UTF-8 bytes visible to the policy, which rejects them as invalid.
    source = raw.decode("utf-8", errors="surrogateescape")
    with Verifier(workers=1, cpu_seconds=args.cpu_seconds, wall_seconds=args.wall_seconds,
                  memory_mb=args.memory_mb) as verifier:
        evaluation = verifier.evaluate(task, source)
    print(json.dumps({"task_id": task.task_id, **evaluation.to_dict()}, indent=2))
    return 0 if evaluation.passed else 1


def read_source_bounded(source: str) -> bytes:
    """At most MAX_SOURCE_BYTES + 1 bytes of the file (or stdin): enough for the policy to judge a
    longer program too large without ever holding it."""
    try:
        if source == "-":
            return sys.stdin.buffer.read(MAX_SOURCE_BYTES + 1)
        with open(source, "rb") as handle:
            return handle.read(MAX_SOURCE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read --source {source!r}: {exc.strerror or exc}") from None


def register(sub) -> None:
    """`glm53 verify`."""
    add_verify_parser(sub)
