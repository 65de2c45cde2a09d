"""CLI registration for `glm53 experiment NAME` (each study of experiments/registry.py, its flags from its
config) and `glm53 analyze DIR`."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from glm53_flash.core.options import add_arguments, from_arguments
from glm53_flash.commands.train import add_no_progress_alias


def register(sub) -> None:
    from glm53_flash.experiments.registry import STUDIES, rerunnable

    experiment = sub.add_parser("experiment", help="research studies (resumable, planned, with receipts)")
    studies = experiment.add_subparsers(dest="study", metavar="STUDY")
    experiment.set_defaults(func=lambda args: (experiment.print_help(), 2)[1])
    for study in STUDIES.values():
        parser = studies.add_parser(study.name, help=study.help, description=study.description)
        add_arguments(parser, study.config)  # --quiet, --tensorboard, --wandb as on every training command
        add_no_progress_alias(parser)
        parser.set_defaults(func=run_experiment)

    names = rerunnable()
    a = sub.add_parser("analyze", help="summary.json, REPORT.md and charts from a study directory's receipts",
                       description="Reads only DIR/plan.json and DIR/runs/*.json; writes DIR/summary.json, "
                                   "DIR/REPORT.md and PNG charts. Refuses to replace them without --force.")
    a.add_argument("directory", help="a study directory written by `glm53 experiment ...`")
    a.add_argument("--force", action="store_true", help="rebuild summary.json / REPORT.md when they exist")
    a.add_argument("--rerun-of", metavar="FIRST", default=None,
                   help=f"DIR is the rerun of this {', '.join(names[:-1])} or {names[-1]} study (disjoint "
                        "pretraining seeds): add whether each conclusion holds in both, the rerun spread and both "
                        "together (default: none)")
    a.set_defaults(func=run_analyze)


def run_experiment(args) -> int:
    from glm53_flash.experiments.registry import STUDIES
    from glm53_flash.experiments.runner import run_study

    study = STUDIES[args.study]
    command = shlex.join(["glm53", *getattr(args, "command_argv", sys.argv[1:])])
    return run_study(study, from_arguments(study.config, args), command=command, argv=sys.argv)


def run_analyze(args) -> int:
    from glm53_flash.experiments.analysis import analyze, shown

    summary = analyze(args.directory, force=args.force, argv=sys.argv, rerun_of=args.rerun_of)
    print(json.dumps(shown(summary), indent=2))
    print(f"wrote {Path(args.directory) / 'REPORT.md'}", file=sys.stderr)
    return 0
