"""`glm53 docs build`: render every generated block of the docs from committed summaries (report/docs.py);
`glm53 docs check`: the blocks are what build renders and no figure is typed into prose; `glm53 docs
times`: the committed studies' stated and taken times (results/study-times.json); `glm53 docs makefile`:
the Makefile's study targets from the study registry (experiments/registry.py)."""

from __future__ import annotations

from pathlib import Path


def register(sub) -> None:
    parser = sub.add_parser("docs", help="render the docs' generated blocks from committed summaries, and check them",
                            description="Every figure in the docs sits in a generated block (<!-- generated: NAME --> "
                                        "... <!-- /generated -->) that build renders from committed summaries; check "
                                        "refuses a stale block and a number typed into prose.")
    commands = parser.add_subparsers(dest="docs_command", metavar="COMMAND", required=True)
    for name, helptext, func in (("build", "rewrite every generated block of the docs (or of the docs named)", _run_build),
                                 ("check", "check every doc (or the docs named): blocks as rendered, no figure in prose",
                                  _run_check)):
        command = commands.add_parser(name, help=helptext, description=helptext)
        command.add_argument("docs", nargs="*", help="docs, relative to the repository (default: all)")
        command.set_defaults(func=func)
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


# The tutorial's verifier lesson: two programs for one dev task, judged as `glm53 verify` judges them.
VERIFY_TASK = "dev-double-000"
VERIFY_BODIES = {"good.py": "return x * 2", "bad.py": "return x + 2"}


def render_verify_example(root: Path) -> str:
    """What `glm53 verify --task-id VERIFY_TASK --source FILE` prints for each of VERIFY_BODIES, run now."""
    import json

    from glm53_flash.tasks import task_by_id
    from glm53_flash.verifier.sandbox import Verifier

    task = task_by_id(VERIFY_TASK)
    lines = []
    with Verifier(workers=1) as verifier:
        for name, body in VERIFY_BODIES.items():
            source = f"{task.prompt}\n    {body}\n"
            evaluation = verifier.evaluate(task, source)
            lines += ["```bash", f"cat > {name} <<'PY'", *source.rstrip("\n").split("\n"), "PY",
                      f"glm53 verify --task-id {VERIFY_TASK} --source {name}", "```", "```json",
                      json.dumps({"task_id": task.task_id, **evaluation.to_dict()}, indent=2), "```", ""]
    return "\n".join(lines[:-1])


def blocks(root: Path | None = None) -> dict:
    """Every generated block the docs may hold: the report layer's and those of the layers above it; with the
    checkout's `root`, one `study-answer-NAME` per committed study directory as well."""
    from functools import partial

    from glm53_flash.benchmarks.quickstart import render_first_run, render_first_run_times
    from glm53_flash.experiments.analysis import render_study_answers, study_answer_blocks
    from glm53_flash.report import doc_blocks as d
    from glm53_flash.report.docs import RENDERERS

    return {**RENDERERS, "first-run": render_first_run, "first-run-times": render_first_run_times,
            "study-answers": render_study_answers, "verify-example": render_verify_example,
            # docs/STUDIES.md
            "compositions-splits": d.render_compositions_splits, "study-model": d.render_study_model,
            "budget-compositions": partial(d.render_budget, name="compositions-budget"),
            "budget-study-model": partial(d.render_budget, name="study-budget"),
            "study-times": d.render_study_times, "study-answer-headline-distribution": d.render_headline_answer,
            "study-answer-vision": d.render_vision_answer,
            **(study_answer_blocks(root) if root is not None else {}),
            # docs/VERIFIER.md and docs/GLM_MAPPING.md
            "verifier-settings": d.render_verifier_settings, "verifier-speed": d.render_verifier_speed,
            "cheat-suite": d.render_cheat_suite, "glm-mapping": d.render_glm_mapping}


def _docs(args) -> tuple:
    from glm53_flash.report.docs import DOCS

    unknown = [doc for doc in args.docs if doc not in DOCS]
    if unknown:
        raise ValueError(f"unknown doc {unknown[0]!r}; the docs are {', '.join(DOCS)}")
    return tuple(args.docs) or DOCS


def _run_build(args) -> int:
    from glm53_flash.report.docs import build

    root = _root()
    changed = build(root, _docs(args), blocks(root))
    print("rewrote " + ", ".join(changed) if changed else "every generated block is as rendered")
    return 0


def _run_check(args) -> int:
    from glm53_flash.report.docs import check

    docs = _docs(args)
    root = _root()
    problems = check(root, docs, blocks(root))
    for problem in problems:
        print(problem)
    print(f"{len(problems)} problem(s) in {len(docs)} doc(s)")
    return 1 if problems else 0


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
