"""Our executable reward as a TRL reward function: `verifier_reward(...)` has the signature TRL's
GRPOTrainer calls its `reward_funcs` with (keyword arguments `prompts`, `completions`,
`completion_ids` and every other dataset column, among them `task_id`), runs each completion through
the sandboxed verifier on its task's reward cases and returns RL's reward (`train/rl.reward_for`:
binary by default, or the share of cases passed). No TRL import: any trainer that calls reward
functions this way can use it.

    from glm53_flash.train.trl_reward import VerifierReward
    reward = VerifierReward(mode="binary")          # one sandbox pool, reused across calls
    trainer = GRPOTrainer(model=..., reward_funcs=[reward], train_dataset=dataset_with_a_task_id_column)

A dataset for it: `training_dataset("rl")` gives rows {"prompt": task.prompt, "task_id": ...}.
"""

from __future__ import annotations

from glm53_flash.tasks import RL_SPLITS, split_tasks, task_by_id


def completion_text(completion) -> str:
    """A completion as TRL passes it: text, or a conversational list of messages (the assistant's content)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    raise TypeError(f"a completion must be text or a list of messages, got {type(completion).__name__}")


class VerifierReward:
    """A callable reward function over our verifier (see the module's docstring)."""

    def __init__(self, mode: str = "binary", invalid_penalty: float = 0.0, exact_bonus: float = 0.0,
                 workers: int | None = None) -> None:
        from glm53_flash.train.config import REWARD_MODES

        if mode not in REWARD_MODES:
            raise ValueError(f"reward mode {mode!r}; allowed: {', '.join(REWARD_MODES)}")
        self.mode, self.invalid_penalty, self.exact_bonus, self.workers = mode, invalid_penalty, exact_bonus, workers
        self.__name__ = f"glm53_verifier_{mode}"  # TRL logs each reward function under its name
        self._verifier = None

    def __call__(self, prompts=None, completions=None, task_id=None, **columns) -> list[float]:
        from glm53_flash.train.rl import reward_for
        from glm53_flash.verifier import Verifier

        if completions is None or task_id is None:
            raise ValueError("the reward needs `completions` and a `task_id` column in the dataset")
        if len(task_id) != len(completions):
            raise ValueError(f"{len(completions)} completions but {len(task_id)} task ids")
        tasks = [task_by_id(str(identifier)) for identifier in task_id]
        if prompts is not None:
            for prompt, task in zip(prompts, tasks):
                if completion_text(prompt) != task.prompt:
                    raise ValueError(f"the prompt given for {task.task_id} is not that task's prompt")
        if self._verifier is None:
            self._verifier = Verifier(workers=self.workers)
        evaluations = self._verifier.evaluate_many(
            [(task, task.prompt + completion_text(c)) for task, c in zip(tasks, completions)])
        return [reward_for(e, self.mode, self.invalid_penalty, self.exact_bonus) for e in evaluations]

    def close(self) -> None:
        if self._verifier is not None:
            self._verifier.close()
            self._verifier = None


def training_dataset(suite: str = "families", tasks_per_family: int | None = 32) -> list[dict]:
    """RL's training prompts as dataset rows {"prompt", "task_id"} (the rl split of `suite`)."""
    per_family = tasks_per_family if suite == "families" else None
    return [{"prompt": t.prompt, "task_id": t.task_id} for t in split_tasks(RL_SPLITS[suite], per_family)]


__all__ = ["VerifierReward", "completion_text", "training_dataset"]
