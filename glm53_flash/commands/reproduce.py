"""`glm53 reproduce`: the headline experiment end to end (glm53_flash/experiments/reproduce.py)."""

from __future__ import annotations

from pathlib import Path

from glm53_flash.experiments.reproduce import ARMS, PLANS, reproduce
from glm53_flash.core.argtypes import parse_int_list
from glm53_flash.core.runtime import DEFAULT_DEVICE, DEVICE_CHOICES, PRECISION_HELP, PRECISIONS


def register(sub) -> None:
    """`glm53 reproduce`."""

    p = sub.add_parser("reproduce", help="the headline experiment end to end, two arms: pretrain, RL, sealed "
                                         "splits, report",
                       description="For each arm (faithful: the original's switches; ours: our defaults): "
                                   "pretrain -> dev selection -> RL per seed -> dev selection -> the confirm and "
                                   "holdout splits -> paired statistics -> REPORT.md, then the two-arm report. "
                                   "Rerun the same command to resume. Each sealed split is opened once per plan "
                                   "and recorded in the run's ledger (see --ledger).")
    p.add_argument("--output", required=True)
    p.add_argument("--preset", choices=sorted(PLANS), default="headline")
    p.add_argument("--rl-seeds", default=None, help="comma-separated RL seeds (default: the preset's)")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated arms (default: {','.join(ARMS)})")
    p.add_argument("--extra-pretrain-seeds", default="", metavar="SEEDS",
                   help="comma-separated pretraining seeds to run besides the plan's own, each arm with the first "
                        "RL seed only (`make seeds`: 1,2)")
    p.add_argument("--device", choices=DEVICE_CHOICES, default=DEFAULT_DEVICE)
    p.add_argument("--precision", choices=PRECISIONS, default=None,
                   help=PRECISION_HELP + ". Resolved once for every stage; a choice that resolves to the device's "
                        "default (fp32 on a CPU without bf16) leaves the plan as it is, any other is a new plan "
                        "(`make demo` passes auto)")
    p.add_argument("--adapt-threads", action="store_true",
                   help="pretraining, RL and the sealed evaluations run with their math threads following the free "
                        "cores (a busy core then slows a step by its share instead of stalling it; on a quiet "
                        "machine nothing changes; not part of the plan; the receipts record the thread counts)")
    p.add_argument("--reopen", metavar="REASON", default=None,
                   help="open a sealed split (confirm, holdout) again for a plan that already opened it (in this or another "
                        "directory); the reason is recorded in the ledger (`glm53 ledger`)")
    p.add_argument("--ledger", metavar="PATH", default=None,
                   help="the ledger this run records its sealed openings in (default: OUTPUT/ledger.jsonl, a ledger "
                        "of the run's own; results/ledger.jsonl adds them to the committed one)")
    p.add_argument("--allow-dirty", action="store_true",
                   help="open the sealed splits even though the code has uncommitted changes (each opening is "
                        "recorded as unvouched; `make demo` passes it: its ledger is its own)")
    p.add_argument("--quiet", "--no-progress", dest="quiet", action="store_true",
                   help="no progress bars (also off when stderr is not a terminal)")
    p.add_argument("--distribution", action="store_true",
                   help="the headline as a distribution (experiments/headline_distribution.py): the preset at ten "
                        "pretraining seeds, every one with all its RL seeds, both arms, in fp32 and bf16; its plan and "
                        "power are written to OUTPUT before the first run")
    p.add_argument("--precisions", default=None, metavar="LIST",
                   help="with --distribution: the precisions to run now (default: fp32,bf16 where the CPU has bf16 "
                        "instructions, else fp32; the other half can run on another machine into the same OUTPUT)")
    p.add_argument("--dev-only", action="store_true",
                   help="with --distribution: stop every run after its dev selections (nothing sealed is opened); "
                        "rerun without it to open the sealed splits and write the summary")
    p.add_argument("--reports-only", action="store_true",
                   help="rebuild every summary.json and REPORT.md of --output from the receipts already there; "
                        "nothing trains, evaluates or opens a sealed split")
    p.set_defaults(func=_run_reproduce)



def _run_distribution(args) -> int:
    from dataclasses import replace

    from glm53_flash.experiments.headline_distribution import DEFAULT_PLAN, run_distribution
    from glm53_flash.model.precision import cpu_bf16_flags

    if args.precisions is None:
        names = ("fp32", "bf16") if cpu_bf16_flags() else ("fp32",)
        if len(names) == 1:
            print("this CPU has no AVX512-BF16 or AMX: running the fp32 half (the bf16 half needs a CPU that has them)")
    else:
        names = tuple(n.strip() for n in args.precisions.split(",") if n.strip())
        unknown = [n for n in names if n not in DEFAULT_PLAN.precisions]
        if unknown or not names:
            raise ValueError(f"--precisions: unknown {', '.join(unknown) or '(none)'}; allowed: "
                             f"{', '.join(DEFAULT_PLAN.precisions)}")
    summary = run_distribution(args.output, DEFAULT_PLAN, device=args.device, sealed=not args.dev_only,
                               reopen=args.reopen, ledger=args.ledger, allow_dirty=args.allow_dirty,
                               progress=not args.quiet,
                               only_precisions=names)
    if summary is not None:
        print(f"summary: {Path(args.output) / 'distribution.json'}")
    return 0


def _run_reproduce(args) -> int:
    from glm53_flash.report.arms import arm_table

    if args.distribution:
        return _run_distribution(args)
    if args.dev_only or args.precisions is not None:
        raise ValueError("--dev-only and --precisions apply only with --distribution")
    if args.reports_only:
        from glm53_flash.experiments.reproduce import rebuild_reports

        summary = rebuild_reports(args.output)
        print("\n".join(arm_table(summary)))
        print(f"\nrebuilt from the receipts: {Path(args.output) / 'REPORT.md'}")
        return 0
    seeds = None if args.rl_seeds is None else parse_int_list(args.rl_seeds, "--rl-seeds")
    summary = reproduce(args.output, preset=args.preset, rl_seeds=seeds, device=args.device,
                        progress=not args.quiet, reopen=args.reopen,
                        extra_pretrain_seeds=parse_int_list(args.extra_pretrain_seeds, "--extra-pretrain-seeds"),
                        arms=tuple(a.strip() for a in args.arms.split(",") if a.strip()), ledger=args.ledger,
                        precision=args.precision, adapt_threads=args.adapt_threads, allow_dirty=args.allow_dirty)
    print()
    print("\n".join(arm_table(summary)))
    for line in _place_lines(args, summary):
        print(line)
    print(f"\nreport: {Path(args.output) / 'REPORT.md'}")
    return 0


def _place_lines(args, summary: dict) -> list[str]:
    """Where this run falls among the committed draws of the headline as a distribution, and why its
    numbers depend on the CPU (only for the headline preset; nothing without a committed study)."""
    from glm53_flash.core.receipts import cpu_description
    from glm53_flash.core.runtime import resolve_device
    from glm53_flash.experiments.headline_distribution import place_user_run
    from glm53_flash.model.precision import resolve_precision

    if args.preset != "headline":
        return []
    precision = resolve_precision(args.precision, str(resolve_device(args.device))).name
    placed = place_user_run(args.output, precision)
    if not placed:
        return []
    cpu = cpu_description()
    return ["", "Where this run falls among the committed draws (results/headline-distribution):",
            *[f"- {line}" for line in placed],
            f"These numbers depend on the CPU's arithmetic ({precision} on {cpu['model']}, family {cpu['family']} model "
            f"{cpu['model_number']}): another CPU or precision gives another draw from the same distribution. "
            f"This run's stages took {summary['demo_seconds']:.0f} s."]
