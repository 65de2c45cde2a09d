"""`glm53 serve` and `glm53 slides build`."""

from __future__ import annotations

import faulthandler
import signal
import sys
from pathlib import Path

from glm53_flash.core.runtime import DEFAULT_DEVICE, DEVICE_CHOICES, PRECISION_HELP, PRECISIONS
from glm53_flash.web import BODY_TIMEOUT, HEADER_TIMEOUT, MAX_CONNECTIONS

DEFAULT_RUNS = "results"
DEFAULT_NOTES = "runs/slide-notes"


def register(sub) -> None:
    slides = sub.add_parser("slides", help="the course deck, built from receipts")
    slides_sub = slides.add_subparsers(dest="slides_command", metavar="ACTION")
    slides.set_defaults(func=lambda args: slides.print_help() or 2)
    build = slides_sub.add_parser("build", help="write the self-contained HTML deck",
                                  description="Write the course deck as one self-contained HTML file, its charts "
                                              "drawn from the committed results (or a reproduce run directory).")
    build.add_argument("--runs", default=DEFAULT_RUNS,
                       help="results directory (holds headline/summary.json) or a reproduce run directory "
                            f"(default {DEFAULT_RUNS})")
    build.add_argument("--output", default="slides/index.html", help="the HTML file to write (default slides/index.html)")
    build.set_defaults(func=_run_build)

    serve = sub.add_parser("serve", help="serve the deck, its notes and the live playground on this machine",
                           description="Serve the deck, its notes and text edits (with history) and the live "
                                       "playground (a checkpoint generating, the verifier judging each case) on "
                                       "loopback; every request needs the launch token printed at start.")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)")
    serve.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    serve.add_argument("--allow-remote", action="store_true",
                       help="allow a non-loopback --host (anyone who can reach it can read the deck and run the model)")
    serve.add_argument("--allowed-host", action="append", default=[], metavar="NAME:PORT",
                       help="an extra Host header value to accept, e.g. myhost.lan:8765 (needed behind a wildcard "
                            "--host such as 0.0.0.0; repeatable)")
    serve.add_argument("--runs", default=DEFAULT_RUNS, help=f"receipts the deck is built from (default {DEFAULT_RUNS})")
    serve.add_argument("--checkpoint", default=None,
                       help="the playground's model (default: the demo run's selected checkpoint under runs/demo)")
    serve.add_argument("--notes", default=DEFAULT_NOTES,
                       help=f"directory for feedback notes and text edits (default {DEFAULT_NOTES}; never served)")
    serve.add_argument("--generations-per-minute", type=int, default=12, help="playground rate limit (default 12)")
    serve.add_argument("--device", choices=DEVICE_CHOICES, default=DEFAULT_DEVICE,
                       help=f"device for the playground model (default {DEFAULT_DEVICE}: CUDA, then MPS, then the CPU)")
    serve.add_argument("--precision", choices=PRECISIONS, default=None,
                       help="what the playground's generations run in: " + PRECISION_HELP + " (default: fp32 on the CPU, bf16 "
                            "autocast on CUDA)")
    serve.add_argument("--max-connections", type=int, default=MAX_CONNECTIONS,
                       help=f"open connections at most; past that requests answer 503 (default {MAX_CONNECTIONS})")
    serve.add_argument("--header-timeout", type=float, default=HEADER_TIMEOUT,
                       help=f"seconds a client has to send a request's headers (default {HEADER_TIMEOUT:g})")
    serve.add_argument("--body-timeout", type=float, default=BODY_TIMEOUT,
                       help=f"seconds a client has to send a request's body (default {BODY_TIMEOUT:g})")
    serve.set_defaults(func=_run_serve)


def _run_build(args) -> int:
    from glm53_flash.experiments.registry import deck_entries, study_of
    from glm53_flash.report.slides import write_deck

    path = write_deck(args.runs, args.output, deck_entries(), study_of)
    print(f"wrote {path} ({path.stat().st_size:,} bytes) from {args.runs}")
    return 0


def _dump_stacks_on_sigusr1() -> None:
    """`kill -USR1 PID` prints every thread's stack to stderr, so a hung server says where it hangs. A
    stderr with no file descriptor (the server called in a process that captures its output) has
    nowhere to write them: the server runs without the dump rather than failing."""
    if not hasattr(signal, "SIGUSR1"):
        return
    try:
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    except (AttributeError, ValueError, OSError):  # io.UnsupportedOperation is both of the last two
        pass


def _run_serve(args) -> int:
    from glm53_flash.experiments.registry import deck_entries, study_of
    from glm53_flash.report.slides import build_deck
    from glm53_flash.web.playground import NO_CHECKPOINT_HELP, Playground, default_checkpoint
    from glm53_flash.web.server import check_limits, is_loopback, start_server

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port} is outside 0-65535")
    check_limits(args.max_connections, args.header_timeout, args.body_timeout)  # before the model loads
    if not is_loopback(args.host):
        if not args.allow_remote:
            raise ValueError(f"--host {args.host} is not a loopback address; pass --allow-remote to expose the "
                             f"server to the network")
        print(f"WARNING: serving on {args.host} without TLS: the token travels in clear, so anyone who can watch "
              f"the network can read the deck, change the notes and run the model and the sandbox",
              file=sys.stderr)
    _dump_stacks_on_sigusr1()
    checkpoint = Path(args.checkpoint) if args.checkpoint else default_checkpoint()
    deck = build_deck(args.runs, deck_entries(), study_of)
    playground = Playground(checkpoint, per_minute=args.generations_per_minute, device=args.device,
                            precision=args.precision)
    try:
        server, _ = start_server(args.host, args.port, deck_html=deck, notes_dir=args.notes,
                                      playground=playground, allow_remote=args.allow_remote,
                                      allowed_hosts=tuple(args.allowed_host), max_connections=args.max_connections,
                                      header_timeout=args.header_timeout, body_timeout=args.body_timeout)
    except OSError as error:  # port in use, unknown address, ... (the failed server closed the playground)
        raise ValueError(f"cannot listen on {args.host}:{args.port}: {error.strerror or error}") from None
    token = server.launch_url.partition("?")[2]  # token=...: required by every request
    print(f"slides:     {server.url}?{token}", flush=True)
    print(f"playground: {server.url}playground?{token}", flush=True)
    print(f"notes:      {Path(args.notes).resolve()} (not served)", flush=True)
    print(f"model:      {checkpoint if checkpoint else NO_CHECKPOINT_HELP}", flush=True)
    try:
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
    return 0
