"""`glm53 ledger`: every opening of a sealed split (final, confirm, holdout), oldest first."""

from __future__ import annotations

import json

from glm53_flash.tasks import SEALED_SPLITS


def register(sub) -> None:
    parser = sub.add_parser(
        "ledger", help="list the openings of the sealed splits (final, confirm, holdout)",
        description="Print the ledger: one entry per receipt written from a sealed split, with its time, "
                    "commit, command, stated purpose, reopen reason and the receipt's sha256. The ledger is "
                    "$GLM53_LEDGER when set, else results/ledger.jsonl of the checkout.")
    parser.add_argument("--split", choices=SEALED_SPLITS, default=None,
                        help="only this split's openings (default: all)")
    parser.add_argument("--ledger", default=None, help="read this ledger file instead (default: see above)")
    parser.add_argument("--json", action="store_true", help="print the lines as a JSON list")
    parser.set_defaults(func=_run_ledger)


def _run_ledger(args) -> int:
    from glm53_flash.evaluation.ledger import format_lines, ledger_lines, ledger_path

    lines = ledger_lines(args.split, args.ledger)
    if args.json:
        print(json.dumps(lines, indent=2, ensure_ascii=False))
        return 0
    print(f"ledger {ledger_path(args.ledger)}: {len(lines)} receipt(s)"
          + (f" from split {args.split}" if args.split else ""))
    print(format_lines(lines))
    return 0
