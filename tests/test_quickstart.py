"""README's first run, command by command as written there (in a scratch directory): pretraining,
evaluation, RL, evaluation, comparison, a completion and a report card each end well and write what the
next one reads; `serve`, which runs until stopped, is only checked to parse."""

import json
import re
import shlex
from pathlib import Path

import pytest

from glm53_flash.cli import build_parser, main

README = Path(__file__).resolve().parents[1] / "README.md"


def quickstart_commands() -> list[list[str]]:
    text = README.read_text()
    section = text.split("## A first run, one stage at a time", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [shlex.split(line)[1:] for line in block.splitlines() if line.startswith("glm53 ")]


def test_the_first_run_is_on_the_first_screen():
    head = README.read_text().splitlines()[:40]
    assert "## A first run, one stage at a time" in head
    assert [c[0] for c in quickstart_commands()] == ["pretrain", "eval", "rl", "eval", "compare", "generate",
                                                     "report", "serve"]


@pytest.mark.slow
def test_the_readme_first_run_works_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    commands = quickstart_commands()
    for argv in commands:
        if argv[0] == "serve":
            build_parser().parse_args(argv)  # it would serve until stopped
            continue
        assert main(argv) == 0, argv
    capsys.readouterr()
    before = json.loads((tmp_path / "runs/tiny/dev.json").read_text())
    after = json.loads((tmp_path / "runs/tiny-rl/dev.json").read_text())
    assert before["summary"]["tasks_total"] == after["summary"]["tasks_total"] > 0
    assert before["summary"]["tasks_solved"] > 0  # the pretrained tiny model already solves some of dev
    assert (tmp_path / "runs/tiny-rl/report.md").is_file()
