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


# --------------------------------------------------------------------------- hostile run directories


def _rl_run(directory, **fields):
    """A small RL run directory (no training): its receipt with `fields`, and two metrics rows."""
    directory.mkdir()
    receipt = {"status": "complete", "algorithm": "RLOO", "group_size": 4, "groups": 2, "updated_groups": 1,
               "exact_training_rollouts": 3, "reward_mode": "binary", "elapsed_seconds": 1.0, **fields}
    (directory / "training-receipt.json").write_text(json.dumps(receipt))
    (directory / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in (
        {"last_group": 1, "mean_reward": 0.0}, {"last_group": 2, "mean_reward": 0.5})))
    return directory


@pytest.mark.parametrize("name", ["report.md", "report-curves.png"])
def test_a_report_never_writes_through_a_symbolic_link(tmp_path, capsys, name):
    """report.md or report-curves.png planted as a link to another file: the command refuses in one line
    and the other file keeps its bytes (before, it was overwritten with the report)."""
    run = _rl_run(tmp_path / "run")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (run / name).symlink_to(victim)
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert "symbolic link" in err and name in err and len(err.splitlines()) == 1
    assert victim.read_text() == "keep me" and (run / name).is_symlink()


def test_receipt_values_are_escaped_in_a_report(tmp_path):
    """Values a receipt chose cannot add lines, tags, handlers or links to report.md."""
    hostile = "x\n# injected <script>alert(1)</script> <img src=x onerror=alert(1)> [click](javascript:alert(1)) a|b"
    run = _rl_run(tmp_path / "run", device=hostile, status=hostile, reward_mode=hostile)
    assert main(["report", str(run)]) == 0
    text = (run / "report.md").read_text()
    assert not any(line.startswith("# injected") for line in text.splitlines())
    for raw in ("<script", "<img", "](javascript:", "a|b"):
        assert raw not in text, raw
    evaluation = tmp_path / "eval.json"
    evaluation.write_text(json.dumps({"split": hostile, "checkpoint": hostile, "inference": {"greedy": True},
                                      "summary": {"tasks_total": hostile}, "by_family": {hostile: {hostile: hostile}},
                                      "episodes": []}))
    assert main(["report", str(evaluation)]) == 0
    text = (tmp_path / "eval.report.md").read_text()
    assert not any(line.startswith("# injected") for line in text.splitlines())
    assert "<script" not in text and "<img" not in text and "](javascript:" not in text


def test_markdown_cells_stay_in_their_cell_and_make_no_markup():
    from glm53_flash.report.tables import html_from_markdown, markdown_table

    values = ["a|b", "a\\|b", "x\ny\r\nz", "<script>alert(1)</script>", "[c](javascript:alert(1))", "![i](x)",
              "<= 15 min", "`((x)\\n)`", "**bold**"]
    lines = markdown_table(["value"], [[v] for v in values])
    assert len(lines) == 2 + len(values)
    for line, value in zip(lines[2:], values):
        assert line.count("|") - line.count("\\|") == 2, line  # one cell: only the row's own two pipes
        assert "<script" not in line and "](" not in line
    assert lines[-3:] == ["| <= 15 min |", "| `((x)\\n)` |", "| **bold** |"]  # ordinary cells are unchanged
    html = html_from_markdown(lines)
    assert "<script" not in html and "&lt;script&gt;" in html and "<td>a|b</td>" in html


def test_a_metrics_file_past_its_cap_is_refused_before_it_is_read(tmp_path, capsys, monkeypatch):
    """The size cap alone: a sparse metrics.jsonl larger than READ_LIMITS["jsonl"] (lowered here to 1 MiB,
    the file 64 MiB of holes) is one line naming its size and the cap, from its size alone."""
    from glm53_flash.core import receipts

    monkeypatch.setitem(receipts.READ_LIMITS, "jsonl", 2**20)
    run = _rl_run(tmp_path / "run")
    with open(run / "metrics.jsonl", "r+b") as handle:
        handle.truncate(64 * 2**20)
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert "metrics.jsonl is 64.0 MiB" in err and "1.0 MiB" in err and len(err.splitlines()) == 1
    assert not (run / "report.md").exists()


def _eval_receipt(path, checkpoint, solved, total=32):
    path.write_text(json.dumps({"split": "dev", "checkpoint": str(checkpoint), "inference": {"greedy": True},
                                "summary": {"tasks_total": total, "tasks_solved": solved}, "episodes": []}))


def test_an_rl_report_card_explains_its_curves_and_names_the_dev_pass_rates(tmp_path, monkeypatch):
    """A header row on every table, the dev pass rate before RL (beside the initial checkpoint) and after
    (in the run), a sentence per curve, and the groups without signal drawn as bars."""
    from glm53_flash.report import run_card

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "tiny" / "checkpoint-0300").mkdir(parents=True)
    _eval_receipt(tmp_path / "runs" / "tiny" / "dev.json", "runs/tiny/checkpoint-0300", 12)
    rl_dir = tmp_path / "runs" / "tiny-rl"
    rl_dir.mkdir()
    _eval_receipt(rl_dir / "dev.json", "runs/tiny-rl/checkpoint-0016", 20)
    receipt = {"status": "complete", "algorithm": "RLOO", "group_size": 8, "groups": 16, "updated_groups": 10,
               "initial_checkpoint": "runs/tiny/checkpoint-0300", "exact_training_rollouts": 40, "checkpoints": []}
    (rl_dir / "training-receipt.json").write_text(json.dumps(receipt))
    rewards = [0.1, 0.2, 0.1, 0.3, 0.9, 0.1, 0.4, 0.5, 0.5, 0.6, 0.7, 0.6, 0.7, 0.8, 0.7, 0.8]
    (rl_dir / "metrics.jsonl").write_text("\n".join(json.dumps(
        {"last_group": g + 1, "mean_reward": r, "loss": -0.1 * r, "zero_variance_fraction": float(g % 3 == 0)})
        for g, r in enumerate(rewards)))
    assert main(["report", "runs/tiny-rl"]) == 0
    text = (rl_dir / "report.md").read_text()
    assert "| fact | value |" in text and "|  |  |" not in text
    assert "| before RL, dev pass rate | 12/32 tasks (checkpoint-0300; dev.json) |" in text
    assert "| dev pass rate | 20/32 tasks (checkpoint-0016; dev.json) |" in text
    assert ("- mean reward rose: 0.175 on average over the first quarter of the run, 0.75 over the last. Its largest "
            "fall between two updates is 0.8, at group 6.") in text
    assert "so a spike marks an update with large advantages, not a failure" in text
    assert "- groups without signal: 50% of the groups in the first quarter of the run, 50% in the last" in text
    drawn = {}
    monkeypatch.setattr(run_card, "save_png", lambda fig, path, within=None: drawn.setdefault("fig", fig))
    run_card.build_run_report(rl_dir)
    axes = drawn["fig"].axes
    assert [a.get_title(loc="left") for a in axes][-1] == "groups without signal"
    assert len(axes[-1].patches) == len(run_card.binned(list(range(16)), [0.0] * 16)[0]) and not axes[-1].lines
    assert len(axes[0].lines) == 2 and axes[0].get_legend() is not None  # each update, and its running mean
