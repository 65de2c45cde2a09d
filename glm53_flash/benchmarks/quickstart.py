"""`glm53 bench quickstart`: the README's first run, command by command in a scratch directory, each
timed as a user runs it (a fresh process), with what it leaves: the dev pass rate before and after RL.

`FIRST_RUN` is the first run: the README shows it (a generated block) and tests/test_quickstart.py runs
it. Its settings leave the pretrained tiny model room on dev and let RL close part of it.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from glm53_flash.core.receipts import provenance, read_json, write_json

STEPS, GROUPS = 250, 96
# fp32 throughout: the same arithmetic on every CPU kind (bf16 is emulated on some, native on others); the
# dev split at 16 tasks per family (128 tasks) so that one task more or less is not the whole story.
FIRST_RUN: tuple[tuple[str, ...], ...] = (
    ("pretrain", "--preset", "tiny", "--steps", str(STEPS), "--batch-size", "16", "--learning-rate", "3e-3",
     "--checkpoints", str(STEPS), "--precision", "fp32", "--output", "runs/tiny"),
    ("eval", "--checkpoint", f"runs/tiny/checkpoint-{STEPS:04d}", "--split", "dev", "--per-family", "16",
     "--precision", "fp32", "--output", "runs/tiny/dev.json"),
    ("rl", "--initial-checkpoint", f"runs/tiny/checkpoint-{STEPS:04d}", "--groups", str(GROUPS), "--group-size",
     "16", "--learning-rate", "5e-5", "--precision", "fp32", "--output", "runs/tiny-rl"),
    ("eval", "--checkpoint", f"runs/tiny-rl/checkpoint-{GROUPS:04d}", "--split", "dev", "--per-family", "16",
     "--precision", "fp32", "--output", "runs/tiny-rl/dev.json"),
    ("compare", "runs/tiny/dev.json", "runs/tiny-rl/dev.json"),
    ("generate", "--checkpoint", f"runs/tiny-rl/checkpoint-{GROUPS:04d}", "--task-id", "dev-double-000"),
    ("report", "runs/tiny-rl"),
    ("serve", "--checkpoint", f"runs/tiny-rl/checkpoint-{GROUPS:04d}"),
)
BEFORE, AFTER = "runs/tiny/dev.json", "runs/tiny-rl/dev.json"
# `serve` runs until stopped: the first run's last command is only shown
NOT_TIMED = ("serve",)


def command_lines() -> list[str]:
    """The first run as the README's bash block shows it."""
    return ["source .venv/bin/activate", *("glm53 " + " ".join(argv) for argv in FIRST_RUN)]


def dev_counts(directory: Path) -> dict:
    """Dev tasks solved before and after RL, from the two evaluation receipts the first run writes."""
    before, after = (read_json(directory / name)["summary"] for name in (BEFORE, AFTER))
    return {"tasks": after["tasks_total"], "before": before["tasks_solved"], "after": after["tasks_solved"]}


def run(output: str | Path, workdir: str | Path | None = None, log=print) -> dict:
    """Run the first run in `workdir` (a new temporary directory by default), each command in its own
    process, and write the receipt to `output`: seconds per command and the dev counts (also logged)."""
    with tempfile.TemporaryDirectory(prefix="glm53-quickstart-") as scratch:
        where = Path(workdir or scratch)
        where.mkdir(parents=True, exist_ok=True)
        commands = []
        for argv in FIRST_RUN:
            if argv[0] in NOT_TIMED:
                continue
            log(f"glm53 {' '.join(argv)}")
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "glm53_flash.cli", *argv, *(("--quiet",) if argv[0] in (
                "pretrain", "eval", "rl") else ())], cwd=where, capture_output=True, text=True)
            seconds = time.perf_counter() - started
            if done.returncode != 0:
                raise RuntimeError(f"glm53 {' '.join(argv)} failed: {done.stderr.strip().splitlines()[-1:]}")
            commands.append({"argv": list(argv), "seconds": round(seconds, 1)})
        receipt = {"commands": commands, "dev": dev_counts(where), "provenance": provenance()}
    write_json(output, receipt)
    dev = receipt["dev"]
    log(f"dev: {dev['before']} of {dev['tasks']} tasks before RL, {dev['after']} after; receipt {output}")
    return receipt


def render_first_run(root: Path) -> str:
    """The docs' block of the first run's commands, as a bash block."""
    return "\n".join(["```bash", *command_lines(), "```"])


def render_first_run_times(root: Path) -> str:
    """The docs' block of what the first run printed and how long each command took, per committed
    receipt (results/bench/quickstart-*.json, `glm53 bench quickstart`)."""
    import json

    from glm53_flash.report.docs import cpu_name

    receipts = [json.loads(p.read_text()) for p in sorted((root / "results" / "bench").glob("quickstart-*.json"))]
    if not receipts:
        return "No first run has been timed yet (`glm53 bench quickstart`)."
    lines = ["| command | " + " | ".join(cpu_name(r["provenance"]) for r in receipts) + " |",
             "|---|" + "---|" * len(receipts)]
    for i, entry in enumerate(receipts[0]["commands"]):
        lines.append(f"| `glm53 {entry['argv'][0]}` | " + " | ".join(f"{r['commands'][i]['seconds']:.0f} s"
                                                                    for r in receipts) + " |")
    lines.append("")
    lines += [f"On {cpu_name(r['provenance'])}: the pretrained tiny model solves {r['dev']['before']} of "
              f"{r['dev']['tasks']} dev tasks, and {r['dev']['after']} after RL." for r in receipts]
    return "\n".join(lines)


__all__ = ["FIRST_RUN", "command_lines", "dev_counts", "render_first_run", "render_first_run_times", "run"]
