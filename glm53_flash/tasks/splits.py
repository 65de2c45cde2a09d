"""Every split of both suites by name: its suite, whether it is sealed, evaluated or trained on, and
its tasks. The families suite (the original's eight families) names its splits as the original did (dev, rl,
final, confirm, holdout); the compositions suite's are `compositions.<split>`."""

from __future__ import annotations

from glm53_flash.tasks import compositions, seal
from glm53_flash.tasks import families as eight_families
from glm53_flash.tasks.seal import SealedSplitError  # noqa: F401 - one error for every refusal of a sealed split

SUITES = ("families", compositions.SUITE)
FAMILIES_SPLITS = tuple(eight_families.SPLIT_SEEDS)
SPLITS = FAMILIES_SPLITS + compositions.TASK_SPLITS  # splits made of tasks
SEALED_SPLITS = eight_families.SEALED_SPLITS + compositions.SEALED
EVAL_SPLITS = ("dev", "final", "confirm", "holdout") + compositions.EVALUATION
TRAINING_SPLITS = ("rl", compositions.RL_SPLIT)
DEV_SPLITS = {"families": "dev", compositions.SUITE: compositions.DEV_SPLIT}
RL_SPLITS = {"families": "rl", compositions.SUITE: compositions.RL_SPLIT}
# The completion cap each suite's tasks are written for (the original's 48; the compositions suite's
# longest reference is 64 bytes).
MAX_NEW_TOKENS = {"families": 48, compositions.SUITE: compositions.MAX_NEW_TOKENS}


def suite_of(split: str) -> str:
    """'families' or 'compositions'; a one-line error for an unknown split."""
    if split in FAMILIES_SPLITS:
        return "families"
    if split in compositions.SPLITS:
        return compositions.SUITE
    raise ValueError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}")


def check_suite(name: str) -> str:
    if name not in SUITES:
        raise ValueError(f"unknown task suite {name!r}; allowed: {', '.join(SUITES)}")
    return name


def families_of(suite: str) -> tuple[str, ...]:
    return eight_families.FAMILY_NAMES if check_suite(suite) == "families" else compositions.FAMILIES


def parse_families(text: str | None, suite: str = "families") -> tuple[str, ...]:
    """A comma list of a suite's families ('' or None = all), in the suite's order. The compositions
    suite's families are its argument types (int, str, list)."""
    if check_suite(suite) == "families":
        return eight_families.parse_families(text)
    if not text:
        return compositions.FAMILIES
    wanted = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in wanted if name not in compositions.FAMILIES]
    if unknown:
        raise ValueError(f"unknown family {unknown[0]!r} of the compositions suite; allowed: "
                         f"{', '.join(compositions.FAMILIES)}")
    return tuple(name for name in compositions.FAMILIES if name in wanted)


def family_order(names) -> list[str]:
    """Family names in a stable order: the original's, then the compositions suite's, then the rest."""
    names = set(names)
    known = [n for n in eight_families.FAMILY_NAMES + compositions.FAMILIES if n in names]
    return known + sorted(names - set(known))


def check_opening(split: str, opening=None) -> None:
    """A sealed split's tasks (their prompts and tests) are built only for an opening of that split that
    the ledger granted in this process and wrote first (tasks/seal.py checks both); other splits need none."""
    seal.check(split, opening, SEALED_SPLITS)


def split_tasks(split: str, per_family: int | None = None, families: tuple[str, ...] | None = None,
                opening=None) -> list:
    """The tasks of a split. The families suite: `per_family` tasks of each family (default 4), as
    `frozen_tasks`. The compositions suite: one task per behaviour; `per_family` does not apply. A sealed
    split needs `opening` (see check_opening)."""
    check_opening(split, opening)
    return _split_tasks(split, per_family, families)


def split_task_ids(split: str, per_family: int | None = None, families: tuple[str, ...] | None = None) -> list[str]:
    """The ids of split_tasks(...)'s tasks, for any split without an opening: what a sealed evaluation's
    plan identity covers before the split is opened (ids name a task, they do not show it)."""
    return [task.task_id for task in _split_tasks(split, per_family, families)]


def split_units(split: str, per_family: int | None = None, families: tuple[str, ...] | None = None) -> int:
    """The number of independent units (behaviours) of split_tasks(...), for any split without an
    opening: what a plan's power statement needs before it runs."""
    return len({task.unit for task in _split_tasks(split, per_family, families)})


def frozen_tasks(split: str, per_family: int = 4, families: tuple[str, ...] | None = None, opening=None) -> list:
    """The families suite's `per_family` tasks per family of `split` (the original's name and order); a
    sealed split needs `opening` (see check_opening)."""
    check_opening(split, opening)
    return eight_families._frozen_tasks(split, per_family, families)


def _split_tasks(split: str, per_family: int | None, families: tuple[str, ...] | None) -> list:
    if suite_of(split) == "families":
        return eight_families._frozen_tasks(split, 4 if per_family is None else per_family, families)
    if per_family is not None:
        raise ValueError(f"split {split} has one task per behaviour; the number of tasks per family applies "
                         f"only to the families suite's splits")
    if split == compositions.PRETRAIN_SPLIT:
        raise ValueError(f"{split} is the pretraining stream's behaviours, not a split of tasks")
    chosen = compositions.FAMILIES if families is None else parse_families(",".join(families), compositions.SUITE)
    return [task for task in compositions._split_tasks(split) if task.family in chosen]


def task_by_id(task_id: str, opening=None):
    """Rebuild a task from its id ('confirm-double-000', 'compositions.dev-b0123-000'); a sealed split's
    task needs `opening` (see check_opening)."""
    split = task_id.partition("-")[0]
    if split in SEALED_SPLITS:
        check_opening(split, opening)
    return _task_by_id(task_id)


def _task_by_id(task_id: str):
    """task_by_id without the seal: for the tasks layer and the suites' own tests."""
    split = task_id.partition("-")[0]
    if split in compositions.TASK_SPLITS:
        for task in compositions._split_tasks(split):
            if task.task_id == task_id:
                return task
        raise ValueError(f"no task {task_id!r} in split {split}")
    return eight_families._task_by_id(task_id)
