"""`glm53 report PATH`: the report card of one pretraining or RL run, or of one evaluation receipt."""

from __future__ import annotations


def register(sub) -> None:
    parser = sub.add_parser(
        "report", help="a report card (report.md and curves) for one run directory or evaluation receipt",
        description="Write report.md for a pretraining or RL run directory (its facts, checkpoints and curves: "
                    "loss, validation loss, learning rate, gradient norm, tokens/s; or reward, policy loss, "
                    "entropy, groups without signal, the reward-hacking rate), drawn as report-curves.png, or "
                    "for one evaluation receipt (its summary and per-family table). Built only from the run's "
                    "own files.")
    parser.add_argument("path", help="a run directory (holds training-receipt.json) or an eval receipt")
    parser.add_argument("--output", default=None,
                        help="where to write (a run: a directory, default the run's own; a receipt: the "
                             "report's path, default RECEIPT.report.md)")
    parser.set_defaults(func=_run)


def _run(args) -> int:
    from glm53_flash.report.run_card import build_run_report

    report = build_run_report(args.path, args.output)
    print(f"wrote {report}")
    return 0
