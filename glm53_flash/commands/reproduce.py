"""`glm53 reproduce`: the headline experiment end to end (glm53_flash/reproduce.py)."""

from __future__ import annotations

from pathlib import Path

from ..reproduce import PLANS, reproduce
from ..runtime import DEVICE_CHOICES


def register(sub) -> None:
    """`glm53 reproduce`."""

    p = sub.add_parser("reproduce", help="the headline experiment end to end: pretrain, RL, confirm, report",
                       description="Pretrain -> dev selection -> RL per seed -> dev selection -> confirm split -> "
                                   "paired statistics -> REPORT.md. Rerun the same command to resume. The "
                                   "sealed confirm split is opened once per plan and recorded in the ledger.")
    p.add_argument("--output", required=True)
    p.add_argument("--preset", choices=sorted(PLANS), default="headline")
    p.add_argument("--rl-seeds", default=None, help="comma-separated RL seeds (default: the preset's)")
    p.add_argument("--device", choices=DEVICE_CHOICES, default="cpu")
    p.add_argument("--reopen", metavar="REASON", default=None,
                   help="open the sealed confirm split again for a plan that already opened it (in this or another "
                        "directory); the reason is recorded in the ledger (`glm53 ledger`)")
    p.add_argument("--quiet", "--no-progress", dest="quiet", action="store_true",
                   help="no progress bars (also off when stderr is not a terminal)")
    p.set_defaults(func=_run_reproduce)


def _run_reproduce(args) -> int:
    from ..report.headline import result_table

    seeds = None if args.rl_seeds is None else tuple(int(s) for s in args.rl_seeds.split(",") if s.strip())
    summary = reproduce(args.output, preset=args.preset, rl_seeds=seeds, device=args.device,
                        progress=not args.quiet, reopen=args.reopen)
    print()
    print("\n".join(result_table(summary)))
    print(f"\nreport: {Path(args.output) / 'REPORT.md'}")
    return 0
