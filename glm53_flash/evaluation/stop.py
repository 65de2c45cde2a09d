"""The coding tasks' stop rule for the sampler: a completion is finished once it parses and passes the
verifier's static policy (the original's rule), for the tasks of either suite."""

from __future__ import annotations

# The byte that can end a finished coding completion (its token id: byte + the tokenizer's offset 4).
_NEWLINE_TOKEN = ord("\n") + 4


class ParseStop:
    """The coding tasks' stop rule for the sampler (the original's): a completion is finished once it
    ends with a newline and task.prompt + completion passes the verifier's static policy (parse and
    policy only, no execution). Pass it as `stop=` to `sampling.generate`; rows it ends report
    finish_reason 'parse'."""

    name = "parse"
    trigger_ids = frozenset({_NEWLINE_TOKEN})  # a completion can only end with "\n" after that byte

    def __init__(self, tasks) -> None:
        self.tasks = list(tasks)

    def validate(self, prompts) -> None:
        if len(self.tasks) != len(prompts):
            raise ValueError("the parse stop rule needs one CodingTask per prompt")
        for i, (task, prompt) in enumerate(zip(self.tasks, prompts)):
            if task.prompt != prompt:
                raise ValueError(f"prompts[{i}] is not the prompt of task {task.task_id}; the parse rule "
                                 f"checks task.prompt + completion")

    def __call__(self, prompt_index: int, completion: str) -> bool:
        from glm53_flash.verifier.policy import completion_is_parseable

        return completion_is_parseable(self.tasks[prompt_index], completion)


def coding_stop(tasks, stop: str):
    """The sampler's `stop` for a list of coding tasks: 'parse' is ParseStop; 'eos' and 'none' pass."""
    return ParseStop(tasks) if stop == "parse" else stop
