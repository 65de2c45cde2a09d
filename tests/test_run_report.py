"""`glm53 report PATH`: a report card for any pretraining or RL run and any evaluation receipt, built only
from the run's own files."""

import json

import pytest

from glm53_flash.cli import main
from glm53_flash.train.pretrain import PretrainConfig, pretrain


def test_a_pretraining_run_gets_its_facts_checkpoints_and_curves(tmp_path, capsys):
    run = tmp_path / "run"
    pretrain(PretrainConfig(output=str(run), preset="tiny", steps=4, checkpoints=(2, 4), batch_size=4,
                            sequence_length=128, device="cpu", quiet=True, eval_every=2, eval_batches=1))
    assert main(["report", str(run)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {run / 'report.md'}"
    text = (run / "report.md").read_text()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert "# Pretraining run: run" in text and "| steps | 4 |" in text
    assert "| validation loss |" in text and "| training loss |" in text and "| learning rate |" in text
    last = f"{rows[-1]['loss']:.4g}"
    assert any(line.startswith("| training loss |") and f"| {last} |" in line for line in text.splitlines())
    assert (run / "report-curves.png").stat().st_size > 1000
    for step in (2, 4):
        assert f"| {step} |" in text


def test_an_rl_run_and_an_evaluation_receipt(tmp_path):
    rl_dir = tmp_path / "rl"
    rl_dir.mkdir()
    receipt = {"status": "complete", "algorithm": "RLOO", "group_size": 4, "groups": 2, "updated_groups": 1,
               "exact_training_rollouts": 3, "reward_mode": "binary", "reward_hacking": {"rate": 0.25},
               "checkpoints": [{"group": 0, "weights_sha256": "ab" * 32}], "elapsed_seconds": 1.0}
    (rl_dir / "training-receipt.json").write_text(json.dumps(receipt))
    (rl_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in (
        {"first_group": 1, "last_group": 1, "mean_reward": 0.0, "loss": None, "grad_norm": None},
        {"first_group": 2, "last_group": 2, "mean_reward": 0.5, "loss": -0.1, "grad_norm": 0.3})))
    assert main(["report", str(rl_dir)]) == 0
    text = (rl_dir / "report.md").read_text()
    assert "# RL run: rl" in text and "| reward-hacking rate | 0.250" in text and "| mean reward | 0 | 0.5 |" in text
    evaluation = tmp_path / "eval.json"
    evaluation.write_text(json.dumps({"split": "dev", "checkpoint": "c", "inference": {"greedy": True},
                                      "summary": {"tasks_total": 8, "tasks_solved": 3, "pass_at_1": 0.375},
                                      "by_family": {"double": {"tasks": 4, "solved": 2}}, "episodes": []}))
    assert main(["report", str(evaluation)]) == 0
    text = (tmp_path / "eval.report.md").read_text()
    assert "greedy pass@1" in text and "| pass_at_1 | 0.375 |" in text and "| double |" in text


def test_what_is_not_a_run_is_one_line(tmp_path, capsys):
    (tmp_path / "plan.json").write_text("{}")
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "holds no training-receipt.json" in err and "glm53 analyze" in err and len(err.splitlines()) == 1
