"""Every command's default invocation works on the `tiny` preset: only the required flags, plus a
smaller amount of work (steps, groups) where the default would take minutes."""

import json

import pytest

from glm53_flash.cli import main


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny") / "pretrain"
    assert main(["pretrain", "--preset", "tiny", "--output", str(directory), "--steps", "2", "--no-progress"]) == 0
    return directory


def test_pretrain_keeps_the_presets_context(run):
    config = json.loads((run / "checkpoint-0002" / "config.json").read_text())
    assert config["max_sequence_length"] == 192  # the default --sequence-length fits: nothing raised silently


def test_info_shows_a_sample(capsys):
    assert main(["info", "--preset", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "no sample generation" not in out and "greedy completion from random weights" in out


@pytest.mark.slow
def test_eval_generate_and_select_with_defaults(run, tmp_path, capsys):
    checkpoint = str(run / "checkpoint-0002")
    assert main(["eval", "--checkpoint", checkpoint, "--split", "dev", "--output", str(tmp_path / "r.json")]) == 0
    assert main(["generate", "--checkpoint", checkpoint, "--task-id", "dev-double-000"]) == 0
    assert main(["select", "--run", str(run), "--output", str(tmp_path / "selection.json")]) == 0


def test_rl_with_defaults(run, tmp_path):
    assert main(["rl", "--initial-checkpoint", str(run / "checkpoint-0002"), "--output", str(tmp_path / "rl"),
                 "--groups", "2", "--no-progress"]) == 0


@pytest.mark.parametrize("bench", [["model"], ["decode"], ["architecture", "--steps", "2"],
                                   ["scaling", "--sequence-lengths", "16,32", "--positions", "8,40"]])
@pytest.mark.slow
def test_benches_with_defaults(bench, tmp_path):
    assert main(["bench", *bench, "--preset", "tiny", "--output", str(tmp_path / "bench.json")]) == 0
