"""RL's reward cases (--reward-cases three|strong|sample-K) and the reward-hacking record: training
rollouts that pass the cases their reward is judged on but fail their task's strong set."""

import json

import pytest
import torch

from glm53_flash import GLM53Flash

from glm53_flash import ModelConfig
from glm53_flash.evaluation.sampling import Completion
from glm53_flash.tasks import frozen_tasks, split_tasks, strong_cases
from glm53_flash.data.tokenizer import ByteTokenizer
from glm53_flash.train import rl as rl_module
from glm53_flash.train.checkpoint import save_checkpoint
from glm53_flash.train.config import RLConfig, reward_case_count
from glm53_flash.train.rl import reward_task
from glm53_flash.train.rl_run import train_rl
from glm53_flash.train.rl_run import RLTrainer, reward_hacking
from glm53_flash.verifier import Verifier

TOK = ByteTokenizer()
EVEN = frozen_tasks("rl", 1, ("even",))[0]
# Each passes or fails the even family's three cases (-3 -> False, 0 -> True, 8 -> True) as noted.
SOURCES = {
    "reference": "\n    return x % 2 == 0\n",  # passes the three and the strong set
    "sign": "\n    return x >= 0\n",  # passes the three, fails the strong set (2, -4, ...)
    "four": "\n    return x % 4 == 0\n",  # passes the three, fails the strong set at 2, 6, 10, ...
    "wrong": "\n    return x < 0\n",  # fails the three
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("ckpt") / "checkpoint-0000"
    save_checkpoint(path, GLM53Flash(ModelConfig.preset("tiny").replace(max_sequence_length=192)), {"stage": "test"})
    return path


def config(checkpoint, output, **values):
    base = dict(initial_checkpoint=str(checkpoint), output=str(output), groups=2, checkpoints=(2,), group_size=4,
                max_new_tokens=16, temperature=1.0, learning_rate=1e-3, device="cpu", quiet=True,
                verifier_workers=1, families="even", tasks_per_family=1)
    base.update(values)
    return RLConfig(**base)


def test_reward_cases_three_strong_and_a_sample_per_group():
    assert reward_task(EVEN, "three", 1, 5) is EVEN
    strong = reward_task(EVEN, "strong", 1, 5)
    assert strong.cases == strong_cases("even") and len(strong.cases) > 50
    first, again = reward_task(EVEN, "sample-8", 1, 5), reward_task(EVEN, "sample-8", 1, 5)
    assert len(first.cases) == 8 and first.cases == again.cases  # a resumed run draws the same
    assert set(first.cases) <= set(strong_cases("even"))
    others = {reward_task(EVEN, "sample-8", 1, group).cases for group in range(6, 12)}
    assert len(others | {first.cases}) > 1  # each group draws its own
    assert len(reward_task(EVEN, "sample-1000", 1, 5).cases) == len(strong_cases("even"))
    for bad in ("sample-0", "sample-", "sample-x", "four", "sample-08", ""):
        with pytest.raises(ValueError, match="--reward-cases"):
            reward_case_count(bad)


@pytest.mark.parametrize("reward_cases, expected", [
    ("three", [True, False, False, None]),  # two programs earn a pass they did not compute
    ("strong", [True, None, None, None]),  # judged on the strong set, they earn nothing
])
def test_strong_verdicts_name_the_passes_that_fail_the_strong_set(checkpoint, tmp_path, reward_cases, expected):
    trainer = RLTrainer(config(checkpoint, tmp_path / "run", reward_cases=reward_cases))
    judged = reward_task(EVEN, reward_cases, 1, 1)
    pairs = [(judged, EVEN.prompt + source) for source in SOURCES.values()]
    with Verifier(workers=1) as verifier:
        evaluations = verifier.evaluate_many(pairs)
        verdicts = trainer.strong_verdicts([EVEN], pairs, evaluations, verifier, False)
    assert verdicts == expected
    assert trainer.strong_verdicts([EVEN], pairs, evaluations, None, True) == [None] * 4  # no verdict, no check


def scripted_generate(sources):
    """A stand-in for the sampler: every group's samples are the given programs, in order."""
    def generate(model, prompts, settings, **_):
        samples = settings.samples
        rows = []
        for _ in prompts:
            row = []
            for source in (sources * samples)[:samples]:
                ids = tuple(TOK.encode(source))
                row.append(Completion(source, ids, False, tuple(-1.0 for _ in ids), "parse"))
            rows.append(row)
        return rows
    return generate


def test_an_rl_receipt_counts_each_groups_reward_hacks(checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr(rl_module, "generate", scripted_generate(list(SOURCES.values())))
    receipt = train_rl(config(checkpoint, tmp_path / "run"))
    hacking = receipt["reward_hacking"]
    # per group of 4: the reference, two hacks and one failure
    assert [(g["group"], g["passed_reward_cases"], g["failed_strong"]) for g in hacking["by_group"]] == \
        [(1, 3, 2), (2, 3, 2)]
    assert (hacking["rollouts_passing_reward_cases"], hacking["failing_strong_set"], hacking["unchecked"]) == (6, 4, 0)
    assert hacking["rate"] == pytest.approx(4 / 6)
    assert receipt["reward_cases"] == "three" and receipt["tasks"] == "families"
    rows = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    assert [row["reward_hacks"] for row in rows] == [2, 2] and rows[0]["reward_cases"] == 3
    assert [s["strong_passed"] for s in rows[0]["samples"]] == [True, False, False, None]
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["reward_hacks"] for m in metrics] == [2, 2]
    # the rewards are the three cases' verdicts, untouched by the strong check
    assert rows[0]["rewards"][:3] == [1.0, 1.0, 1.0] and rows[0]["rewards"][3] < 1.0


def test_the_strong_reward_pays_no_hack(checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr(rl_module, "generate", scripted_generate(list(SOURCES.values())))
    receipt = train_rl(config(checkpoint, tmp_path / "run", reward_cases="strong"))
    assert receipt["reward_hacking"]["failing_strong_set"] == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    assert rows[0]["rewards"][0] == 1.0 and all(r < 1.0 for r in rows[0]["rewards"][1:])
    assert rows[0]["reward_cases"] == len(strong_cases("even"))


def test_reward_hacking_of_rows_written_before_it_was_recorded():
    rows = [{"group": 1, "task_id": "rl-even-000", "samples": [{"evaluation": {"passed": True}},
                                                                {"evaluation": {"passed": False}}]}]
    assert reward_hacking(rows)["unchecked"] == 1 and reward_hacking(rows)["failing_strong_set"] == 0


def test_rl_on_the_compositions_suite(checkpoint, tmp_path, monkeypatch):
    task = split_tasks("compositions.rl")[0]
    monkeypatch.setattr(rl_module, "generate", scripted_generate([task.reference_completion]))
    receipt = train_rl(config(checkpoint, tmp_path / "run", tasks="compositions", families="", tasks_per_family=None,
                              groups=1, checkpoints=(1,)))
    assert receipt["tasks"] == "compositions" and receipt["max_new_tokens"] == 16
    rows = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    assert rows[0]["task_id"].startswith("compositions.rl-")
    with pytest.raises(ValueError, match="applies only to --tasks families"):
        config(checkpoint, tmp_path / "bad", tasks="compositions", families="", tasks_per_family=4).validate()
    assert RLConfig(initial_checkpoint="c", output="o", tasks="compositions").max_new_tokens == 64
