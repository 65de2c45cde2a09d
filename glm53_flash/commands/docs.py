"""`glm53 docs check`: every figure of the docs against the exact cell of its receipt; `glm53 docs bind`:
write suggested bindings for the blocks of a doc that have none (report/cells.py); `glm53 docs times`: the
committed studies' stated and taken times (results/study-times.json); `glm53 docs makefile`: the Makefile's
study targets from the study registry (experiments/registry.py)."""

from __future__ import annotations

from pathlib import Path


def register(sub) -> None:
    parser = sub.add_parser("docs", help="check that each figure in the docs is the cell of its receipt",
                            description="The docs' figures bound to the exact cells of committed receipts.")
    commands = parser.add_subparsers(dest="docs_command", metavar="COMMAND", required=True)
    check = commands.add_parser("check", help="check every figure of the docs (or of the docs named)",
                                description="Check each doc's figures against the cells their bindings name.")
    check.add_argument("docs", nargs="*", help="docs to check, relative to the repository (default: all)")
    check.set_defaults(func=_run_check)
    bind = commands.add_parser(
        "bind", help="write suggested bindings for a doc's unbound blocks",
        description="For each block with figures and no binding, write a <!-- cells: --> comment naming, for "
                    "each figure, a cell that shows it (from the receipts the block names, its section's "
                    "marker and --receipts), or '?' where none does. Review every suggestion: a small number "
                    "can be shown by many cells.")
    bind.add_argument("doc", help="the doc, relative to the repository")
    bind.add_argument("--receipts", nargs="*", default=[], help="receipts to look in for every block")
    bind.set_defaults(func=_run_bind)
    times = commands.add_parser(
        "times", help="write results/study-times.json: each committed study's stated time beside what it took",
        description="Reads every results/*/plan.json and its runs/ (analysis.time_record) and writes the table "
                    "docs/STUDIES.md shows; tests/test_results.py checks the committed file against the same.")
    times.set_defaults(func=_run_times)
    makefile = commands.add_parser(
        "makefile", help="write the Makefile's study targets from the study registry",
        description="Rewrites the Makefile's block of study targets from each registered study's make_targets "
                    "(experiments/registry.py); tests/test_experiments.py checks the committed Makefile against the same.")
    makefile.set_defaults(func=_run_makefile)


def _root() -> Path:
    from glm53_flash.evaluation.ledger import repository_root

    root = repository_root()
    if root is None:
        raise ValueError("glm53 docs works in a checkout of the project (its README and results/)")
    return root


def _run_check(args) -> int:
    from glm53_flash.report.cells import DOCS, check_doc

    root = _root()
    problems = [problem for doc in (args.docs or DOCS) for problem in check_doc(root, doc)]
    for problem in problems:
        print(problem)
    print(f"{len(problems)} problem(s) in {len(args.docs or DOCS)} doc(s)")
    return 1 if problems else 0


def _run_bind(args) -> int:
    from glm53_flash.report.cells import bind

    counts = bind(_root(), args.doc, args.receipts)
    print(f"{args.doc}: {counts['blocks']} block(s) bound, {counts['entries']} entries, {counts['unresolved']} "
          f"unresolved ('?'), {len(counts['ambiguous'])} shown by several cells (review them)")
    return 0


def _run_times(args) -> int:
    import json

    from glm53_flash.core.receipts import write_text
    from glm53_flash.experiments.analysis import STUDY_TIMES_FILE, study_times

    path = _root() / "results" / STUDY_TIMES_FILE
    table = study_times(path.parent)
    write_text(path, json.dumps(table, indent=1) + "\n")
    print(f"wrote {path} ({len(table['headline_table']['rows'])} studies)")
    return 0


def _run_makefile(args) -> int:
    from glm53_flash.experiments.registry import write_makefile_block

    path = _root() / "Makefile"
    print(f"{path}: {'rewritten' if write_makefile_block(path) else 'already as the registry renders it'}")
    return 0
