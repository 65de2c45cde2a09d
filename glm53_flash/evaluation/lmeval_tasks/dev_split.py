"""The documents of the lm-eval tasks beside this file: one per task of the families suite's dev split,
built by the task generator when lm-eval loads the task (its YAML names `dev_split.dev_dataset`)."""

from __future__ import annotations

from glm53_flash.tasks import frozen_tasks

SPLIT = "dev"


def dev_documents() -> list[dict]:
    """task_id, family, prompt (the context) and reference_completion (the target) of every dev task."""
    return [{"task_id": task.task_id, "family": task.family, "prompt": task.prompt,
             "reference_completion": task.reference_completion} for task in frozen_tasks(SPLIT)]


def dev_dataset(**unused) -> dict:
    """lm-eval's `custom_dataset`: {"test": a datasets.Dataset of `dev_documents()`} (lm-eval passes the
    task's metadata as keyword arguments; none is needed)."""
    import datasets

    return {"test": datasets.Dataset.from_list(dev_documents())}
