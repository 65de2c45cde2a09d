import dataclasses
import json

import pytest
import torch

from glm53_flash import GLM53Flash

from glm53_flash import ModelConfig
from glm53_flash.evaluation.evaluate import generate_for_tasks
from glm53_flash.tasks import frozen_tasks
from glm53_flash.data.tokenizer import ByteTokenizer
from glm53_flash.train.checkpoint import save_checkpoint
from glm53_flash.train.completion_logits import forward_positions
from glm53_flash.train.rl import (
    RLConfig, has_signal, leave_one_out_advantages, policy_objective, reward_for, sequence_logprobs, task_schedule,
    training_sequences,
)
from glm53_flash.train.rl_run import RLTrainer, train_rl
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
    from glm53_flash.train.checkpoint import load_checkpoint
    model, _ = load_checkpoint(checkpoint)
    task = frozen_tasks("rl", 1)[0]
    completions = generate_for_tasks(model, [task], samples=3, max_new_tokens=10, temperature=0.7, seed=5,
                                     stop="eos")[0]
    sequences = training_sequences(task.prompt, completions, "omit", model.config.max_sequence_length)
    logprobs, _ = sequence_logprobs(model, sequences, 0.7, "sampler", "cpu")
    for lp, completion in zip(logprobs, completions):
        torch.testing.assert_close(lp.detach(), torch.tensor(completion.logprobs), atol=1e-4, rtol=0)
    original, _ = sequence_logprobs(model, sequences, 0.7, "untempered", "cpu")
    assert not torch.allclose(original[0].detach(), logprobs[0].detach(), atol=1e-3)


@pytest.mark.parametrize("stream_mode,linear_rope,scope", [
    ("double-residual", "none", "last-block-head"),
    ("delta", "rope-before-feature-map", "all"),
    ("sinkhorn", "none", "last-block-head"),
])
def test_prompts_run_once_give_the_whole_sequences_logprobs_and_gradients(stream_mode, linear_rope, scope):
    """Each distinct prompt run once into a cache copied to its sequences' rows gives the same
    log-probs, entropies and parameter gradients as every sequence run whole: two prompts of
    different lengths, completions of 0, 1 and several tokens, sparse layers whose window the
    completions pass (kept keys replaced)."""
    from glm53_flash.train.rl import set_train_scope

    cfg = ModelConfig.preset("tiny").replace(layers=4, sparse_window=4, sparse_stride=3, max_sequence_length=64,
                                              stream_mode=stream_mode, linear_rope=linear_rope)
    torch.manual_seed(3)
    model = GLM53Flash(cfg).train()
    set_train_scope(model, scope)
    generator = torch.Generator().manual_seed(4)

    def ids(n):
        return torch.randint(4, 260, (n,), generator=generator).tolist()

    first, second = [1] + ids(11), [1] + ids(6)
    sequences = [(first, ids(9)), (second, ids(3)), (first, ids(1)), (first, ids(14)), (second, []),
                 (first, ids(5))]
    results = []
    for share in (True, False):
        model.zero_grad(set_to_none=True)
        logprobs, entropies = sequence_logprobs(model, sequences, 0.7, "sampler", "cpu", share_prompts=share)
        loss = sum((i + 1) * lp.sum() for i, lp in enumerate(logprobs))
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((logprobs, entropies, grads))
    (shared_lp, shared_ent, shared_grads), (whole_lp, whole_ent, whole_grads) = results
    for a, b, (_, completion) in zip(shared_lp, whole_lp, sequences):
        assert a.shape == (len(completion),)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    for a, b in zip(shared_ent, whole_ent):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert shared_grads.keys() == whole_grads.keys() and "embedding.weight" in shared_grads
    for name, grad in whole_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_forward_positions_count_what_the_forwards_run(monkeypatch):
    """forward_positions by hand, and against the model's own calls: the positions every forward of
    sequence_logprobs is given, and how many of them hold the batch's end padding (id 0: the test's
    tokens are never 0), for both the shared-prompt path and the whole sequences."""
    first, second = [1, 9, 8, 7], [1, 5]
    sequences = [(first, [4, 4, 4]), (second, [6]), (first, [5]), (first, []), (second, [7, 7, 7, 7])]
    # shared: first runs 4 positions, then 3 rows x 2 fed tokens (fed 2, 0, 0); second 2, then 2 rows x 3 (fed 0, 3)
    assert forward_positions(sequences) == {"positions": 4 + 3 * 2 + 2 + 2 * 3, "padding": 4 + 3}
    # whole: 5 rows x the longest (7 tokens), less the 7 + 3 + 5 + 4 + 6 tokens
    assert forward_positions(sequences, share_prompts=False) == {"positions": 35, "padding": 35 - 25}
    assert forward_positions([(first, [3])]) == {"positions": 4, "padding": 0}  # nothing to feed back
    assert forward_positions([]) == {"positions": 0, "padding": 0}

    cfg = ModelConfig.preset("tiny").replace(layers=2, max_sequence_length=64)
    torch.manual_seed(5)
    model = GLM53Flash(cfg)
    generator = torch.Generator().manual_seed(6)

    def ids(n):
        return torch.randint(4, 260, (n,), generator=generator).tolist()

    prompts = ([1] + ids(7), [1] + ids(3))
    batch = [(prompts[i % 2], ids(n)) for i, n in enumerate((5, 0, 9, 1, 2, 12, 4))]
    seen = []
    forward = GLM53Flash.forward

    def counting(self, ids, *args, **kwargs):
        seen.append((ids.numel(), int((ids == 0).sum())))
        return forward(self, ids, *args, **kwargs)

    monkeypatch.setattr(GLM53Flash, "forward", counting)
    for share in (True, False):
        seen.clear()
        sequence_logprobs(model, batch, 0.7, "sampler", "cpu", share_prompts=share)
        assert forward_positions(batch, share_prompts=share) == {"positions": sum(n for n, _ in seen),
                                                                  "padding": sum(z for _, z in seen)}, share


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
    from glm53_flash.evaluation.sampling import Completion

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
    (_, at_ids), (_, below_ids) = training_sequences(task.prompt, [at_cap, below_cap], trainer.cfg.eos_handling,
                                                     context)
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
    # every update row splits its update's time and counts the positions its forwards computed
    for row in (json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()):
        assert 0 <= row["update_forward_seconds"] and 0 <= row["update_step_seconds"]
        assert row["update_forward_seconds"] + row["update_step_seconds"] <= row["seconds"] - row["rollout_seconds"]
        assert 0 <= row["update_padding_positions"] <= row["update_positions"]
        assert (row["update_positions"] > 0) == (row["loss"] is not None)
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


def test_resuming_a_finished_rl_run_leaves_its_receipt_unchanged(checkpoint, tmp_path):
    out = tmp_path / "done"
    first = train_rl(rl_cfg(checkpoint, out, groups=2, checkpoints=()))
    path = out / "training-receipt.json"
    written, stamp = path.read_bytes(), path.stat().st_mtime_ns
    rollouts = (out / "rollouts.jsonl").read_bytes()
    assert train_rl(rl_cfg(checkpoint, out, groups=2, checkpoints=(), resume=True)) == first
    assert path.read_bytes() == written and path.stat().st_mtime_ns == stamp  # not even rewritten
    assert (out / "rollouts.jsonl").read_bytes() == rollouts
    # a complete receipt whose last checkpoint is not the run's newest is stale: written anew
    path.write_text(json.dumps({**json.loads(written), "checkpoints": [{"group": 2, "weights_sha256": "0" * 64}]}))
    again = train_rl(rl_cfg(checkpoint, out, groups=2, checkpoints=(), resume=True))
    assert again["checkpoints"][-1]["weights_sha256"] == first["checkpoints"][-1]["weights_sha256"]


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
    # the checkpoint's context is 128 tokens: a cap that cannot fit after the prompt is refused, unwritten
    with pytest.raises(ValueError, match="exceeds the checkpoint's context \\(128 tokens\\)"):
        train_rl(rl_cfg(checkpoint, tmp_path / "g", max_new_tokens=120))
    assert not (tmp_path / "g").exists()
    trainer = RLTrainer(rl_cfg(checkpoint, tmp_path / "h", group_size=64, prompts_per_update=4, groups=4, checkpoints=(4,)))
    with pytest.raises(ValueError, match="an update of 256 sequences needs about .* GiB, more than"):
        trainer.check_sizes(available=2**20)
    assert not (tmp_path / "h").exists()


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
    result = select_checkpoint(run, samples=2, per_family=1, max_new_tokens=8, quiet=True)
    assert result["split"] == "dev" and result["inference"]["families"] == "double,increment"
    assert [e["step"] for e in result["checkpoints"]] == [0, 1, 2]
    from glm53_flash.train.config import SelectConfig

    assert set(result["run_config"]) == {f.name for f in dataclasses.fields(SelectConfig)}
    assert (run / "selection-dev.json").is_file() and (run / "selection" / "dev-checkpoint-0001.json").is_file()
    with pytest.raises(FileExistsError):
        select_checkpoint(run, samples=2, per_family=1, max_new_tokens=8, quiet=True)
    with pytest.raises(ValueError, match="cannot be used for selection"):
        select_checkpoint(run, split="rl", force=True)


def test_a_tie_of_zeros_is_said_and_scores_are_words(checkpoint, tmp_path, capsys):
    """An untrained tiny run scores 0 everywhere: the tie rule picks step 0, the initialisation, and
    `glm53 select` says that no evaluation supports it; scores print as words, not one-element lists."""
    from glm53_flash.cli import main
    from glm53_flash.train.select import format_score, tie_of_zeros_note

    run = tmp_path / "run"
    train_rl(rl_cfg(checkpoint, run, groups=2, checkpoints=(1,)))
    assert main(["select", "--run", str(run), "--samples", "2", "--per-family", "1", "--max-new-tokens", "4"]) == 0
    out = capsys.readouterr().out
    receipt = json.loads((run / "selection-dev.json").read_text())
    assert all(not any(e["score"]) for e in receipt["checkpoints"])  # 4 new tokens of a random model solve nothing
    assert "note: every checkpoint scored 0, so the tie rule picks the earliest (the untrained initialisation)" in out
    assert receipt["tie_of_zeros"] and receipt["selected"]["step"] == 0
    assert "exact rollouts" in out and "[" not in out.split("selected")[0]
    assert format_score([3, 7], sampled=False) == "3 tasks solved, 7 tests passed"
    assert tie_of_zeros_note([{"step": 0, "score": [0]}, {"step": 5, "score": [1]}]) is None
    assert "step 5" in tie_of_zeros_note([{"step": 5, "score": [0, 0]}, {"step": 9, "score": [0, 0]}])


def test_rl_refuses_too_few_groups_per_rank_a_second_writer_and_marks_an_interrupted_run(
        checkpoint, tmp_path, capsys, monkeypatch):
    import shlex

    from glm53_flash.cli import main
    from glm53_flash.train import rl_run as rl_module
    from glm53_flash.train.rundir import RunLock

    with monkeypatch.context() as env:
        env.setenv("WORLD_SIZE", "2")
        env.setenv("RANK", "1")
        with pytest.raises(ValueError, match=r"--prompts-per-update \(1\) must be at least the number of ranks \(2\)"):
            train_rl(rl_cfg(checkpoint, tmp_path / "ddp", prompts_per_update=1))  # given: kept, and refused
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


# ----------------------------------------------------------------------------------- torchrun

# Installed in the ranks other than 0 (through PYTHONPATH): every file a rank opens for writing and
# every directory change it makes is reported on stderr (only the rank's own process, not the
# sandbox workers it forks).
RANK_WRITE_AUDIT = '''
import os, sys
if os.environ.get("RANK", "0") != "0":
    _PID = os.getpid()
    _WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    _CHANGES = ("os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.truncate", "shutil.rmtree",
                "shutil.move", "shutil.copyfile", "os.symlink", "os.link", "os.chmod")

    def _audit(event, args):
        if os.getpid() != _PID:
            return
        if event == "open":
            path, mode, flags = args
            writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool((flags or 0) & _WRITE)
            if writes:
                sys.stderr.write(f"rank-write open {path}\\n")
        elif event in _CHANGES:
            sys.stderr.write(f"rank-write {event} {args[0]}\\n")

    sys.addaudithook(_audit)
'''


def taught_checkpoint(path, steps=40):
    """A tiny model taught by teacher forcing to answer its increment task with one of two bodies (one
    right, one wrong), so its RL groups have reward spread and take gradient steps."""
    torch.manual_seed(0)
    model = GLM53Flash(ModelConfig.preset("tiny").replace(max_sequence_length=128))
    tasks = frozen_tasks("rl", 1, families=("increment",))
    prompts, rows = [], []
    for task in tasks:
        for body in ("\n    return x + 1\n", "\n    return x * 2\n"):
            prompts.append(len(TOK.encode(task.prompt, bos=True)))
            rows.append(TOK.encode(task.prompt + body, bos=True) + [TOK.eos_id])
    width = max(map(len, rows))
    ids = torch.tensor([r + [TOK.pad_id] * (width - len(r)) for r in rows])
    labels = ids.clone()
    labels[ids == TOK.pad_id] = -100
    for i, length in enumerate(prompts):
        labels[i, :length] = -100
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        logits = model(ids[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    save_checkpoint(path, model, {"stage": "test"})
    return path


def rows_of(run, name):
    return [json.loads(line) for line in (run / name).read_text().splitlines()]


@pytest.mark.slow
def test_torchrun_two_ranks_match_one_process_and_only_rank_0_writes(tmp_path):
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from glm53_flash.train.checkpoint import load_checkpoint

    start = taught_checkpoint(tmp_path / "taught")
    settings = dict(groups=4, checkpoints=(2,), prompts_per_update=2, group_size=4, max_new_tokens=20,
                    temperature=0.7, kl_coef=0.1, tasks_per_family=1, families="increment")
    one = tmp_path / "one"
    train_rl(rl_cfg(start, one, **settings))

    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(RANK_WRITE_AUDIT)
    two = tmp_path / "two"
    args = ["--initial-checkpoint", str(start), "--output", str(two), "--groups", "4", "--checkpoints", "2",
            "--prompts-per-update", "2", "--group-size", "4", "--max-new-tokens", "20", "--temperature", "0.7",
            "--kl-coef", "0.1", "--tasks-per-family", "1", "--learning-rate", "1e-3", "--device", "cpu",
            "--verifier-workers", "1", "--families", "increment", "--quiet"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(hooks))
    torchrun = Path(sys.executable).parent / "torchrun"
    done = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node=2", "-m", "glm53_flash.cli", "rl",
                           *args], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("complete: 4 groups") == 1  # rank 0 reports, rank 1 is silent

    # Only rank 0 wrote: rank 1 opened nothing for writing and changed nothing under the test's files.
    writes = [line for line in done.stderr.splitlines() if line.startswith("rank-write")]
    assert not [w for w in writes if str(tmp_path) in w or not w.split(" ", 2)[-1].startswith("/")], writes
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in one.iterdir())

    # The same global work: the same samples and rewards, the same per-group losses and update metrics.
    rows_one, rows_two = rows_of(one, "rollouts.jsonl"), rows_of(two, "rollouts.jsonl")
    assert [r["group"] for r in rows_two] == [1, 2, 3, 4]
    assert any(r["updated"] for r in rows_one), "the test needs groups with reward spread"
    for a, b in zip(rows_one, rows_two, strict=True):
        assert (a["task_id"], a["rewards"], a["advantages"], a["updated"]) == \
               (b["task_id"], b["rewards"], b["advantages"], b["updated"])
        assert [s["token_ids"] for s in a["samples"]] == [s["token_ids"] for s in b["samples"]]
        if a["updated"]:
            assert b["policy_loss"] == pytest.approx(a["policy_loss"], rel=1e-5, abs=1e-8)
            assert b["gradient_norm"] == pytest.approx(a["gradient_norm"], rel=1e-5)
    metrics_one, metrics_two = rows_of(one, "metrics.jsonl"), rows_of(two, "metrics.jsonl")
    assert len(metrics_one) == len(metrics_two) == 2
    for a, b in zip(metrics_one, metrics_two):
        assert b["mean_reward"] == a["mean_reward"]
        for key in ("loss", "grad_norm", "entropy", "kl"):
            assert (a[key] is None) == (b[key] is None)
            if a[key] is not None:
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-8), key
    receipt = json.loads((two / "training-receipt.json").read_text())
    assert receipt["status"] == "complete" and receipt["world_size"] == 2
    final_one, _ = load_checkpoint(one / "checkpoint-0004")
    final_two, _ = load_checkpoint(two / "checkpoint-0004")
    initial, _ = load_checkpoint(start)
    assert any(not torch.equal(p, q) for p, q in zip(initial.parameters(), final_two.parameters()))
    # Every trained weight moved by about 2e-3 (two AdamW steps at lr 1e-3); the two runs agree to
    # 5e-5, a fortieth of that: a rank's gradient lost or counted twice moves weights by ~1e-3. (Not
    # tighter: where the true gradient is near zero, AdamW normalises summation noise into steps of
    # up to 2e-5, measured on block 0's connection logits, whose gradients are ~1e-6 at most.) The
    # gradient's scale is checked to 1e-5 by grad_norm above.
    for (name, p), q in zip(final_one.named_parameters(), final_two.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=5e-5, msg=name)

    # A torchrun run resumes in one process: drop its last checkpoint and finish it again.
    part = tmp_path / "part"
    shutil.copytree(two, part)
    shutil.rmtree(part / "checkpoint-0004")
    train_rl(rl_cfg(start, part, resume=True, **settings))
    assert [r["group"] for r in rows_of(part, "rollouts.jsonl")] == [1, 2, 3, 4]
    resumed, _ = load_checkpoint(part / "checkpoint-0004")
    for (name, p), q in zip(final_one.named_parameters(), resumed.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=5e-5, msg=name)


def test_groups_per_update_default_to_one_per_rank_and_a_resume_keeps_the_runs(checkpoint, tmp_path, monkeypatch):
    """--prompts-per-update left out is one group per rank (1 in one process, the number of ranks under
    torchrun), recorded resolved; a given value is kept; resuming with the flag left out takes the
    run's own value, so a run started under torchrun resumes in one process with the same updates."""
    from glm53_flash.train.rl_run import RLTrainer

    for world, expected in ((1, 1), (2, 2), (8, 8)):
        cfg = rl_cfg(checkpoint, tmp_path / "x")
        cfg.resolve_prompts_per_update(world)
        assert cfg.prompts_per_update == expected
    given = rl_cfg(checkpoint, tmp_path / "x", prompts_per_update=3)
    given.resolve_prompts_per_update(2)
    assert given.prompts_per_update == 3

    out = tmp_path / "run"
    first = train_rl(rl_cfg(checkpoint, out, groups=4, checkpoints=(2, 4), prompts_per_update=2))
    assert first["prompts_per_update"] == 2
    # resumed (finished) with the flag left out: the run's own 2 groups per update, not a mismatch
    trainer = RLTrainer(rl_cfg(checkpoint, out, groups=4, checkpoints=(2, 4), resume=True))
    assert trainer.cfg.prompts_per_update == 1 and trainer.adapted
    again = trainer.run()
    assert trainer.cfg.prompts_per_update == 2 and again == first
    with pytest.raises(ValueError, match="different prompts_per_update"):
        train_rl(rl_cfg(checkpoint, out, groups=4, checkpoints=(2, 4), prompts_per_update=1, resume=True))
