"""The first run (benchmarks/quickstart.py FIRST_RUN), which the README shows as a generated block: every
command ends well and writes what the next one reads, and RL visibly helps on dev; `serve`, which runs
until stopped, is only checked to parse."""

import json
from pathlib import Path

import pytest

from glm53_flash.benchmarks.quickstart import AFTER, BEFORE, FIRST_RUN, command_lines, dev_counts
from glm53_flash.cli import build_parser, main

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_shows_the_first_run_on_its_first_screen():
    text = README.read_text()
    head = text.splitlines()[:60]
    assert "## A first run, one stage at a time" in head
    block = text.split("<!-- generated: first-run -->\n", 1)[1].split("<!-- /generated -->", 1)[0]
    assert block.strip().splitlines() == ["```bash", *command_lines(), "```"]
    assert [argv[0] for argv in FIRST_RUN] == ["pretrain", "eval", "rl", "eval", "compare", "generate", "report",
                                               "serve"]


@pytest.mark.slow
def test_the_first_run_works_as_written_and_rl_helps_on_dev(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for argv in FIRST_RUN:
        if argv[0] == "serve":
            build_parser().parse_args(list(argv))  # it would serve until stopped
            continue
        assert main(list(argv)) == 0, argv
    capsys.readouterr()
    counts = dev_counts(tmp_path)
    assert counts["tasks"] == json.loads((tmp_path / BEFORE).read_text())["summary"]["tasks_total"] > 0
    assert counts["before"] < counts["after"], counts  # the pretrained model leaves room, and RL closes part of it
    report = (tmp_path / "runs/tiny-rl/report.md").read_text()
    assert "| before RL, dev pass rate |" in report and "| dev pass rate |" in report
    assert (tmp_path / AFTER).is_file()
