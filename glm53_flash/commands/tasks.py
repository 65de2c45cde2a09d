"""`glm53 tasks summary`: what each split of a task suite holds (tasks, its units of analysis,
structures, the split's sha256) and how many tasks the cheat suite's wrong programs pass per case set
(read from the committed receipt `CHEATS_RECEIPT`); `glm53 tasks cheats`: measure the cheat suite and
write that receipt; `glm53 tasks show`: one task's prompt and reference. None judges a model, so a
sealed split's counts and hashes can be printed without opening it; `show` refuses a sealed split's
tasks (their text is what the seal protects)."""

from __future__ import annotations

import json
from pathlib import Path

from glm53_flash.tasks import SEALED_SPLITS, SUITES

CHEATS_RECEIPT = "results/tasks/cheats.json"


def register(sub) -> None:
    parser = sub.add_parser("tasks", help="the task suites: each split's size, behaviours, structures and sha256",
                            description="Describe the task suites without judging anything.")
    commands = parser.add_subparsers(dest="tasks_command", metavar="COMMAND", required=True)
    summary = commands.add_parser(
        "summary", help="per split: tasks, units of analysis, structures, the split's sha256",
        description="Per split of a suite: its tasks, its units of analysis, its structures (and, for "
                    "compositions, its distinct behaviours), kinds and families, and the sha256 that pins its "
                    "content. families: the original eight families (a unit is a distinct function, a family: "
                    "its two descriptions compute the same one); compositions: the typed grammar's behaviours "
                    "(a unit is a structure group, whose behaviours are correlated).")
    summary.add_argument("--suite", choices=SUITES, default="compositions", help="the suite (default: compositions)")
    summary.add_argument("--per-family", type=int, default=8,
                         help="tasks per family of the families suite's splits (default 8)")
    summary.add_argument("--json", action="store_true", help="print the summary as JSON")
    summary.add_argument("--output", default=None, metavar="FILE",
                         help="also write the summary as a receipt (with provenance) to FILE")
    summary.set_defaults(func=_run_summary)
    cheats = commands.add_parser(
        "cheats", help="measure how many tasks the cheat suite's wrong programs pass, per case set (about a minute)",
        description="For every task of the compositions suite's task splits and every family of the original "
                    "suite: which kinds of wrong program (a lookup of the reward inputs, the reference on small "
                    "inputs only, a constant, the argument, near misses) pass its reward cases, its strong set and "
                    "its strict set. Sealed splits are reported as counts only.")
    cheats.add_argument("--output", default=None, metavar="FILE",
                        help=f"write the receipt (with provenance) to FILE (the committed one: {CHEATS_RECEIPT})")
    cheats.add_argument("--json", action="store_true", help="print the receipt as JSON")
    cheats.set_defaults(func=_run_cheats)
    budget = commands.add_parser(
        "budget", help="a pretraining run's before-RL dev pass rate, checkpoint by checkpoint",
        description="Summarise a pretraining run and one greedy `glm53 eval` receipt per checkpoint on a dev split "
                    "into one table (the pretraining budget at which a suite's sealed sets are measurable).")
    budget.add_argument("--training-receipt", required=True, help="the run's training-receipt.json")
    budget.add_argument("--eval", nargs="+", required=True, metavar="RECEIPT", help="greedy eval receipts")
    budget.add_argument("--output", required=True, help="summary JSON to write")
    budget.set_defaults(func=_run_budget)
    show = commands.add_parser("show", help="one task's prompt, reference and reward cases (not of a sealed split)",
                               description="Print a task of dev or an rl split: its prompt, reference "
                                           "completion, unit, structure and the cases its reward is judged on.")
    show.add_argument("task_id", help="e.g. compositions.dev-b0123-000 or dev-double-000")
    show.add_argument("--json", action="store_true", help="print the task as JSON")
    show.set_defaults(func=_run_show)


def _run_summary(args) -> int:
    from glm53_flash.tasks import compositions, families

    summary = compositions.summary() if args.suite == "compositions" else families.summary(args.per_family)
    if args.output:
        from glm53_flash.core.receipts import provenance, write_json

        write_json(args.output, {**summary, "provenance": provenance()})
    cheats = committed_cheats()
    if args.json:
        print(json.dumps({**summary, "cheat_suite": _cheat_rates(cheats, args.suite)}, indent=2))
        return 0
    if args.suite == "compositions":
        print(f"compositions suite v{summary['version']}: {summary['behaviours']:,} distinct behaviours, "
              f"{summary['structures']:,} structures in {summary['structure_groups']:,} structure groups")
    else:
        print(f"families suite: {len(summary['families'])} families, {summary['per_family']} tasks per family")
    print(f"units: {summary['unit']}")
    print(f"{'split':32} {'sealed':>6} {'tasks':>6} {'units':>6} {'structures':>10}  sha256")
    for name, row in summary["splits"].items():
        units = row["structure_groups"] if args.suite == "compositions" else row["units"]
        print(f"{name:32} {'yes' if row['sealed'] else 'no':>6} {row['tasks']:>6} {units:>6} "
              f"{row['structures']:>10}  {row['sha256'][:16]}")
    print()
    if cheats is None:
        print(f"cheat suite: no receipt at {CHEATS_RECEIPT} (glm53 tasks cheats --output {CHEATS_RECEIPT})")
        return 0
    print(f"cheat suite ({CHEATS_RECEIPT}): tasks on which a wrong program of each kind passes every case of a set "
          f"(at most {100 * cheats['bound']:.0f}% on the strict set)")
    _print_table(cheats["table"], None if args.suite == "compositions" else "families suite")
    return 0


def committed_cheats() -> dict | None:
    """The cheat suite's committed receipt of the checkout this package is in (None when there is none)."""
    path = Path(__file__).resolve().parents[2] / CHEATS_RECEIPT
    return json.loads(path.read_text()) if path.is_file() else None


def _cheat_rates(receipt: dict | None, suite: str) -> dict | None:
    """What `tasks summary --json` shows of the cheat suite: per split (and over all) the rates per case
    set and kind; for the families suite its own."""
    if receipt is None:
        return None
    if suite == "families":
        return {"tasks": receipt["families"]["tasks"], "rates": receipt["families"]["rates"]}
    return {"strict_version": receipt["strict_version"], "bound": receipt["bound"],
            "splits": {name: {"tasks": row["tasks"], "rates": row["rates"]} for name, row in receipt["splits"].items()},
            "all": receipt["all"]}


def _print_table(table: dict, only: str | None = None) -> None:
    """The cheat table as fixed-width text; `only` keeps the rows of one block (named by its first cell)."""
    rows, keep = [], only is None
    for row in table["rows"]:
        if row[0]:
            keep = only is None or row[0].startswith(only)
        if keep:
            rows.append(row)
    widths = [max(len(str(r[i])) for r in [table["columns"], *rows]) for i in range(len(table["columns"]))]
    for row in [table["columns"], *rows]:
        print("  ".join(str(cell).ljust(width) if i < 2 else str(cell).rjust(width)
                        for i, (cell, width) in enumerate(zip(row, widths))))


def _run_cheats(args) -> int:
    from glm53_flash.tasks import cheats

    receipt = cheats.measurement()
    if args.output:
        from glm53_flash.core.receipts import provenance, write_json

        write_json(args.output, {**receipt, "provenance": provenance()})
    if args.json:
        print(json.dumps(receipt, indent=2))
        return 0
    _print_table(receipt["table"])
    if args.output:
        print(f"wrote {args.output}")
    return 0


def _run_budget(args) -> int:
    from glm53_flash.core.receipts import write_json
    from glm53_flash.report.budget import budget_summary
    from glm53_flash.report.tables import markdown_table

    summary = budget_summary(args.training_receipt, args.eval)
    write_json(args.output, summary)
    print("\n".join(markdown_table(summary["headline_table"]["columns"], summary["headline_table"]["rows"])))
    print(f"wrote {args.output}")
    return 0


def _run_show(args) -> int:
    from glm53_flash.tasks import suite_of, task_by_id

    split = args.task_id.partition("-")[0]
    suite_of(split)  # a one-line error for an unknown split
    if split in SEALED_SPLITS:
        raise ValueError(f"{args.task_id} is a task of the sealed split {split}; its text is not shown (the "
                         f"summary gives its size and sha256)")
    task = task_by_id(args.task_id)
    record = {"task_id": task.task_id, "unit": task.unit, "structure": task.structure, "kind": task.kind,
              "family": task.family, "entry_point": task.entry_point, "prompt": task.prompt,
              "reference_completion": task.reference_completion,
              "reward_cases": [{"arguments": list(c.fresh_arguments()), "expected": c.expected} for c in task.cases]}
    if args.json:
        print(json.dumps(record, indent=2, ensure_ascii=False))
        return 0
    print(f"{task.task_id}  unit {task.unit}  ({task.kind})")
    print(task.prompt + task.reference_completion, end="")
    for case in record["reward_cases"]:
        print(f"  reward case: {task.entry_point}({', '.join(map(repr, case['arguments']))}) == {case['expected']!r}")
    return 0
