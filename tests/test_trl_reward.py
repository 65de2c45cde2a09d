"""The verifier as a TRL reward function, called the way TRL's GRPOTrainer calls `reward_funcs`:
keyword arguments prompts, completions, completion_ids and every dataset column."""

import pytest

from glm53_flash.train.trl_reward import VerifierReward, training_dataset


@pytest.fixture(scope="module")
def reward():
    function = VerifierReward(mode="binary", workers=1)
    yield function
    function.close()


def test_a_grpo_style_call_rewards_what_passes_the_reward_cases(reward):
    rows = [row for row in training_dataset() if row["task_id"].startswith("rl-double-")][:2]
    prompts = [row["prompt"] for row in rows] * 2
    task_ids = [row["task_id"] for row in rows] * 2
    completions = ["    return x * 2\n", "    return x * 2\n", "    return x + 1\n", "    return (\n"]
    rewards = reward(prompts=prompts, completions=completions, completion_ids=[[1]] * 4, task_id=task_ids,
                     trainer_state=None)
    assert rewards == [1.0, 1.0, 0.0, 0.0]
    assert reward.__name__ == "glm53_verifier_binary"


def test_conversational_completions_and_the_case_fraction(reward):
    row = next(row for row in training_dataset() if row["task_id"].startswith("rl-double-"))
    share = VerifierReward(mode="case-fraction", workers=1)
    try:
        messages = [[{"role": "assistant", "content": "    return x * 2\n"}]]
        assert share(prompts=[row["prompt"]], completions=messages, task_id=[row["task_id"]]) == [1.0]
    finally:
        share.close()


def test_what_the_reward_cannot_judge_is_a_clear_error(reward):
    row = training_dataset()[0]
    with pytest.raises(ValueError, match="task_id"):
        reward(prompts=[row["prompt"]], completions=["x"])
    with pytest.raises(ValueError, match="not that task's prompt"):
        reward(prompts=["def f(x):\n"], completions=["    return x\n"], task_id=[row["task_id"]])
    with pytest.raises(ValueError, match="reward mode"):
        VerifierReward(mode="shaped")
