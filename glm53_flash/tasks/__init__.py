"""The coding tasks: two suites, their splits, strong tests and pretraining streams.

- `families.py`: the original eight families, bit-exact and compatible (dev, rl, final, confirm,
  holdout; the sealed splits final, confirm, holdout).
- `grammar.py`, `compositions.py`: the compositions suite, thousands of distinct behaviours from a
  typed grammar, split by structure (compositions.pretrain, .rl, .dev, and the sealed
  .unseen_structures and .new_constants).
- `strict.py`: the compositions suite's strict sets (the strong set plus long inputs chosen per
  behaviour), on which evaluation also counts false passes; `cheats.py`: the cheat suite, wrong programs
  per task and how many tasks each case set lets them pass on (results/tasks/cheats.json).
- `splits.py`: every split by name (its suite, sealed or not, its tasks). The tasks know nothing of the
  verifier: the sampler's parse stop rule is evaluation/stop.py.

The names below are the original module's, so `from glm53_flash.tasks import frozen_tasks` works as it
always did; `SEALED_SPLITS` names the sealed splits of both suites. Built here, a sealed split's tasks
need an opening of it (`check_opening`: an evaluation.ledger.Opening); its task ids and sizes do not.
The suites' own modules (families.py, compositions.py) build every split: they are what the guard
stands in front of, and the suites' tests read them there.
"""

from __future__ import annotations

from glm53_flash.tasks import compositions
from glm53_flash.tasks.families import (
    FAMILIES, FAMILY_NAMES, PRETRAINING_SEED, PROMPT_HEADER, SPLIT_SEEDS, STRONG_EXTRA_MIN, Case, CodingTask,
    Family, family_by_name, make_task, pretraining_task, pretraining_text, strong_cases,
    strong_cases_record, strong_task, task_strong_cases,
)
from glm53_flash.tasks.families import SEALED_SPLITS as ORIGINAL_SEALED_SPLITS
from glm53_flash.tasks.splits import (
    DEV_SPLITS, EVAL_SPLITS, MAX_NEW_TOKENS, RL_SPLITS, SEALED_SPLITS, SPLITS, SUITES, TRAINING_SPLITS,
    SealedSplitError, check_opening, check_suite, families_of, family_order, frozen_tasks, parse_families,
    split_task_ids, split_tasks, split_units, suite_of, task_by_id,
)

__all__ = [
    "Case", "CodingTask", "DEV_SPLITS", "EVAL_SPLITS", "FAMILIES", "FAMILY_NAMES", "Family", "MAX_NEW_TOKENS",
    "ORIGINAL_SEALED_SPLITS", "PRETRAINING_SEED", "PROMPT_HEADER", "RL_SPLITS", "SEALED_SPLITS", "SealedSplitError",
    "SPLITS", "SPLIT_SEEDS", "STRONG_EXTRA_MIN", "SUITES", "TRAINING_SPLITS", "check_opening", "check_suite",
    "compositions", "families_of", "family_by_name", "family_order", "frozen_tasks", "make_task",
    "parse_families", "pretraining_task", "pretraining_text", "split_task_ids", "split_tasks", "split_units",
    "strong_cases",
    "strong_cases_record", "strong_task", "suite_of", "task_by_id", "task_strong_cases",
]
