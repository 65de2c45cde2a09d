import dataclasses
import json

import pytest
import torch

from glm53_flash import GLM53Flash, ModelConfig
from glm53_flash.evaluate import generate_for_tasks
from glm53_flash.tasks import frozen_tasks
from glm53_flash.tokenizer import ByteTokenizer
from glm53_flash.train.checkpoint import save_checkpoint
from glm53_flash.train.rl import (
    RLConfig, RLTrainer, has_signal, leave_one_out_advantages, policy_objective, reward_for,
    sequence_logprobs, task_schedule, train_rl,
)
from glm53_flash.verifier import Evaluation

TOK = ByteTokenizer()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    cfg = ModelConfig.preset("tiny").replace(max_sequence_length=128)
    path = tmp_path_factory.mktemp("ckpt") / "checkpoint-0000"
    save_checkpoint(path, GLM53Flash(cfg), {"stage": "test"})
    return path


def rl_cfg(checkpoint, output, **kw):
    base = dict(initial_checkpoint=str(checkpoint), output=str(output), groups=4, checkpoints=(2,), group_size=4,
                max_new_tokens=12, temperature=1.0, learning_rate=1e-3, device="cpu", quiet=True,
                verifier_workers=1, families="increment,double")
    base.update(kw)
    return RLConfig(**base)


def test_leave_one_out_advantages_hand_computed():
    # rewards 1, 0, 0, -0.1: the others' means are -0.1/3, 0.9/3, 0.9/3, 1/3
    advantages = leave_one_out_advantages([1.0, 0.0, 0.0, -0.1])
    assert advantages == pytest.approx([1 + 0.1 / 3, -0.3, -0.3, -0.1 - 1 / 3])
    assert sum(advantages) == pytest.approx(0.0)
    assert not has_signal([0.5] * 4) and has_signal([0.5, 0.5, 0.5, 0.6])


def test_rewards_match_the_original_modes():
    passed = Evaluation("passed", True, 3, 3, 1.0)
    failed = Evaluation("failed", False, 1, 3, 1 / 3)
    invalid = Evaluation("invalid", False, 0, 3, 0.0)
    assert [reward_for(e, "binary", -0.1, 0.0) for e in (passed, failed, invalid)] == [1.0, 0.0, -0.1]
    assert reward_for(passed, "case-fraction", -0.25, 0.5) == 1.5
    assert reward_for(failed, "case-fraction", -0.25, 0.5) == pytest.approx(1 / 3)
    assert reward_for(invalid, "case-fraction", -0.25, 0.5) == -0.25


def test_schedule_is_the_originals():
    tasks = frozen_tasks("rl", 2, families=("increment", "double"))
    schedule = task_schedule(tasks, 10, 31415)
    assert len(schedule) == 10 and sorted(t.task_id for t in schedule[:4]) == sorted(t.task_id for t in tasks)
    import random
    order = list(tasks)
    random.Random(31415 + 1009).shuffle(order)
    assert schedule[4:8] == order


def test_loss_logprobs_equal_the_samplers(checkpoint):
    trainer = RLTrainer(rl_cfg(checkpoint, "unused", temperature=0.7))
    from glm53_flash.train.checkpoint import load_checkpoint
    model, _ = load_checkpoint(checkpoint)
    task = frozen_tasks("rl", 1)[0]
    completions = generate_for_tasks(model, [task], samples=3, max_new_tokens=10, temperature=0.7, seed=5,
                                     stop="eos")[0]
    trainer.cfg.eos_handling = "omit"
    sequences = trainer.training_sequences(task, completions)
    logprobs, _ = sequence_logprobs(model, sequences, 0.7, "sampler", "cpu")
    for lp, completion in zip(logprobs, completions):
        torch.testing.assert_close(lp.detach(), torch.tensor(completion.logprobs), atol=1e-4, rtol=0)
    original, _ = sequence_logprobs(model, sequences, 0.7, "untempered", "cpu")
    assert not torch.allclose(original[0].detach(), logprobs[0].detach(), atol=1e-3)


def test_loss_normalizations():
    logprobs = [torch.tensor([-1.0, -2.0]), torch.tensor([-3.0])]
    advantages = [1.0, -1.0]
    assert float(policy_objective(logprobs, advantages, "sequence-mean", 4)) == pytest.approx(-(-1.5 + 3.0) / 2)
    assert float(policy_objective(logprobs, advantages, "token-sum", 4)) == pytest.approx(-(-3.0 + 3.0) / 2)
    assert float(policy_objective(logprobs, [1.0, 0.0], "constant", 4)) == pytest.approx(3.0 / 4 / 2)


def fake_group(trainer, task, rewards):
    completions = generate_for_tasks(trainer.model, [task], samples=len(rewards), max_new_tokens=8,
                                     temperature=1.0, seed=1, stop="eos")[0]
    return {"group": 1, "task": task, "completions": completions, "evaluations": [], "rewards": rewards}


@pytest.mark.parametrize("scope", ["last-block", "last-block-head", "all"])
def test_only_the_chosen_scope_changes(checkpoint, tmp_path, scope):
    trainer = RLTrainer(rl_cfg(checkpoint, tmp_path / scope, train_scope=scope))
    trainer.prepare()
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    task = trainer.tasks[0]
    stats = trainer.update([fake_group(trainer, task, [1.0, 0.0, 0.0, 0.0])], lr=1e-3)
    assert stats["loss"] is not None
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])}
    last = f"blocks.{trainer.model.config.layers - 1}."
    if scope == "all":
        assert any(n.startswith("blocks.0.") for n in changed)
    else:
        allowed = {n for n in before if n.startswith(last) or n.startswith("norm.")}
        if scope == "last-block-head":
            allowed.add("embedding.weight")
            assert "embedding.weight" in changed
        assert changed and changed <= allowed


def test_a_completion_parse_stopped_at_the_context_end_trains_without_overflow(checkpoint, tmp_path):
    # The parse rule can stop a completion exactly at the context's last position (prompt + max_new_tokens
    # = context); appending EOS there would make a sequence one token longer than the model accepts.
    from glm53_flash.sampling import Completion

    trainer = RLTrainer(rl_cfg(checkpoint, tmp_path / "cap"))
    trainer.prepare()
    task = trainer.tasks[0]
    context = trainer.model.config.max_sequence_length
    prompt = TOK.encode(task.prompt, bos=True)
    room = context - len(prompt)

    def parse_stopped(length: int) -> Completion:
        text = "\n    return x + 1 #" + "a" * (length - 20) + "\n"
        ids = tuple(TOK.encode(text))
        assert len(ids) == length
        return Completion(text, ids, length == room, (0.0,) * length, "parse")

    at_cap, below_cap = parse_stopped(room), parse_stopped(room - 1)
    (_, at_ids), (_, below_ids) = trainer.training_sequences(task, [at_cap, below_cap])
    assert len(prompt) + len(at_ids) == context and at_ids == list(at_cap.token_ids)  # no room: no EOS
    assert len(prompt) + len(below_ids) == context and below_ids[-1] == TOK.eos_id  # room for exactly one
    group = {"group": 1, "task": task, "completions": [at_cap, below_cap, at_cap, below_cap],
             "evaluations": [], "rewards": [1.0, 0.0, 0.0, 0.0]}
    assert trainer.update([group], lr=1e-3)["loss"] is not None


def test_zero_variance_group_takes_no_step(checkpoint, tmp_path):
    trainer = RLTrainer(rl_cfg(checkpoint, tmp_path / "z"))
    trainer.prepare()
    before = [p.detach().clone() for p in trainer.model.parameters()]
    state_before = len(trainer.optimizer.state)
    stats = trainer.update([fake_group(trainer, trainer.tasks[0], [0.0, 0.0, 0.0, 0.0])], lr=1e-3)
    assert stats["loss"] is None and len(trainer.optimizer.state) == state_before
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))


def test_run_and_resume_are_equivalent(checkpoint, tmp_path):
    full = train_rl(rl_cfg(checkpoint, tmp_path / "full", reward_mode="case-fraction"))
    assert full["status"] == "complete" and [c["group"] for c in full["checkpoints"]] == [0, 2, 4]
    # every RLConfig field is in the receipt (configs declared once: tests/test_options.py)
    assert set(full["run_config"]) == {f.name for f in dataclasses.fields(RLConfig)}
    rows = [json.loads(line) for line in (tmp_path / "full" / "rollouts.jsonl").read_text().splitlines()]
    assert [r["group"] for r in rows] == [1, 2, 3, 4] and len(rows[0]["samples"]) == 4
    for key in ("rewards", "advantages", "reward_spread", "updated", "policy_loss", "gradient_norm",
                "exact_rollouts", "valid_rollouts", "token_cap_hits", "seconds"):
        assert key in rows[0]
    # interrupted after checkpoint 2 (simulate: drop the last checkpoint and truncate nothing else)
    import shutil
    part = tmp_path / "part"
    shutil.copytree(tmp_path / "full", part)
    shutil.rmtree(part / "checkpoint-0004")
    resumed = train_rl(rl_cfg(checkpoint, part, resume=True))
    again = [json.loads(line) for line in (part / "rollouts.jsonl").read_text().splitlines()]
    def strip(rs):
        return [{k: v for k, v in r.items() if k != "seconds"} for r in rs]

    assert strip(again) == strip(rows)
    assert resumed["checkpoints"][-1]["weights_sha256"] == full["checkpoints"][-1]["weights_sha256"]


def test_bad_inputs(checkpoint, tmp_path):
    with pytest.raises(ValueError, match="group-size must be >= 2"):
        train_rl(rl_cfg(checkpoint, tmp_path / "a", group_size=1))
    with pytest.raises(ValueError, match="unknown family"):
        train_rl(rl_cfg(checkpoint, tmp_path / "b", families="increment,cube"))
    with pytest.raises(ValueError, match="outside 1..4"):
        train_rl(rl_cfg(checkpoint, tmp_path / "c", checkpoints=(8,)))
    with pytest.raises(ValueError, match="does not exist"):
        train_rl(rl_cfg(tmp_path / "missing", tmp_path / "d"))
    with pytest.raises(ValueError, match="is not a 'flash' model"):
        train_rl(rl_cfg(checkpoint, tmp_path / "e", preset="flash"))
    train_rl(rl_cfg(checkpoint, tmp_path / "f", preset="tiny", groups=1, checkpoints=()))


def test_selection_rule_prefers_score_then_earlier():
    from glm53_flash.train.select import best_entry, selection_score

    entries = [{"step": 0, "score": [3]}, {"step": 24, "score": [7]}, {"step": 48, "score": [7]},
               {"step": 72, "score": [5]}]
    assert best_entry(entries)["step"] == 24
    greedy = {"summary": {"tasks_solved": 2, "tests_passed": 9}}
    assert selection_score(greedy, sampled=False) == (2, 9)


def test_select_command_writes_a_receipt(checkpoint, tmp_path):
    from glm53_flash.train.select import select_checkpoint

    run = tmp_path / "run"
    train_rl(rl_cfg(checkpoint, run, groups=2, checkpoints=(1,)))
    result = select_checkpoint(run, samples=2, per_family=1, max_new_tokens=8, progress=False)
    assert result["split"] == "dev" and result["inference"]["families"] == "double,increment"
    assert [e["step"] for e in result["checkpoints"]] == [0, 1, 2]
    from glm53_flash.train.config import SelectConfig

    assert set(result["run_config"]) == {f.name for f in dataclasses.fields(SelectConfig)}
    assert (run / "selection-dev.json").is_file() and (run / "selection" / "dev-checkpoint-0001.json").is_file()
    with pytest.raises(FileExistsError):
        select_checkpoint(run, samples=2, per_family=1, max_new_tokens=8, progress=False)
    with pytest.raises(ValueError, match="cannot be used for selection"):
        select_checkpoint(run, split="rl", force=True)


def test_rl_refuses_too_few_groups_per_rank_a_second_writer_and_marks_an_interrupted_run(
        checkpoint, tmp_path, capsys, monkeypatch):
    import shlex

    from glm53_flash.cli import main
    from glm53_flash.train import rl as rl_module
    from glm53_flash.train.rundir import RunLock

    with monkeypatch.context() as env:
        env.setenv("WORLD_SIZE", "2")
        env.setenv("RANK", "1")
        with pytest.raises(ValueError, match=r"--prompts-per-update \(1\) must be at least the number of ranks \(2\)"):
            train_rl(rl_cfg(checkpoint, tmp_path / "ddp"))
    assert not (tmp_path / "ddp").exists()

    out = tmp_path / "run"
    with RunLock(out):
        with pytest.raises(ValueError, match=r"in use by another run \(pid \d+\)"):
            train_rl(rl_cfg(checkpoint, out))

    real_update = rl_module.RLTrainer.update
    calls = []

    def interrupted_on_the_third_update(self, groups, lr):
        calls.append(groups[0]["group"])
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_update(self, groups, lr)

    monkeypatch.setattr(rl_module.RLTrainer, "update", interrupted_on_the_third_update)
    with pytest.raises(KeyboardInterrupt):
        train_rl(rl_cfg(checkpoint, out))
    receipt = json.loads((out / "training-receipt.json").read_text())
    assert receipt["status"] == "interrupted" and receipt["resumes_from_group"] == 2
    command = capsys.readouterr().err.split("interrupted; resume with: ", 1)[1].strip()
    assert command == receipt["resume_command"]
    words = shlex.split(command)
    assert words[:2] == ["glm53", "rl"] and words[-1] == "--resume"
    monkeypatch.setattr(rl_module.RLTrainer, "update", real_update)
    assert main(words[1:]) == 0
    assert json.loads((out / "training-receipt.json").read_text())["status"] == "complete"
    assert not (out / ".lock").exists()
