"""`glm53 ledger`: every opening of a sealed split and every receipt from one, oldest first;
`glm53 ledger verify`: the chain and what the ledger vouches for (evaluation/ledger_verify.py)."""

from __future__ import annotations

import json

from glm53_flash.tasks import SEALED_SPLITS


def register(sub) -> None:
    parser = sub.add_parser(
        "ledger", help="list the openings of the sealed splits, or verify the ledger (glm53 ledger verify)",
        description="Print the ledger: each opening (its purpose, plan, dev decision, code commit) and each receipt "
                    "written from it (time, commit, command, reopen reason, sha256). The ledger is --ledger, else "
                    "results/ledger.jsonl of the checkout. `glm53 ledger verify` checks the hash chain, that the "
                    "committed ledger was only appended to, and that every sealed receipt under results/ is vouched "
                    "for by committed code and a dev decision committed before its opening.")
    parser.add_argument("action", nargs="?", choices=("list", "verify"), default="list",
                        help="list (default) or verify")
    parser.add_argument("--split", choices=SEALED_SPLITS, default=None,
                        help="only this split's lines (default: all)")
    parser.add_argument("--ledger", default=None, help="this ledger file (default: see above)")
    parser.add_argument("--results", default=None, metavar="DIR",
                        help="verify: the directory whose sealed receipts must be vouched (default: results/ of the "
                             "checkout)")
    parser.add_argument("--json", action="store_true", help="print the lines (or the verification) as JSON")
    parser.set_defaults(func=_run_ledger)


def _run_ledger(args) -> int:
    from glm53_flash.evaluation.ledger import format_lines, ledger_path, read_ledger

    if args.action == "verify":
        return _verify(args)
    if args.results is not None:
        raise ValueError("--results applies only to `glm53 ledger verify`")
    lines = [line for line in read_ledger(args.ledger) if args.split is None or line["split"] == args.split]
    if args.json:
        print(json.dumps(lines, indent=2, ensure_ascii=False))
        return 0
    openings = sum(1 for line in lines if line.get("kind") == "opened")
    print(f"ledger {ledger_path(args.ledger)}: {openings} write-ahead opening(s), {len(lines) - openings} receipt "
          f"line(s)" + (f" of split {args.split}" if args.split else ""))
    print(format_lines(lines))
    return 0


def _verify(args) -> int:
    from glm53_flash.evaluation.ledger_verify import verify_ledger

    if args.split is not None:
        raise ValueError("--split applies only to listing the ledger")
    result = verify_ledger(args.ledger, args.results)
    if args.json:
        print(json.dumps(result, indent=2))
        return 1 if result["problems"] else 0
    counts = result["counts"]
    print(f"ledger {result['ledger']}: {counts['lines']} lines ({counts['chained']} chained, {counts['legacy']} legacy), "
          f"{counts['openings']} write-ahead opening(s); {counts['receipts_checked']} sealed receipt(s) checked")
    for note in result["notes"]:
        print(f"note: {note}")
    for problem in result["problems"]:
        print(f"PROBLEM: {problem}")
    print("verified: no problem" if not result["problems"] else f"{len(result['problems'])} problem(s)")
    return 1 if result["problems"] else 0
