"""The original suite: 8 function families, frozen splits and the pretraining stream.

Compatible with the original miniature: same families in the same order, same descriptions,
reference bodies and hidden cases, and the same seed formulas and RNG draw order, so every
entry-point name, task_id and pretraining example matches. One deliberate difference: hidden
cases are immutable (tuples) and every call gets fresh argument objects, so no candidate can
alter the inputs another evaluation sees.

Added: a fifth frozen split, `holdout` (same families and generator, its own seed); the sealed
splits (`SEALED_SPLITS`: final, confirm, holdout), which evaluation opens only through the ledger
(ledger.py); and each family's strong test set (`strong_cases`): its three cases plus at least 50
extra cases whose expected values come from the reference body (edge values, large numbers, empty
and long inputs). Strong cases judge evaluations only; RL rewards and the three-case verdict never
see them.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import string
from dataclasses import dataclass, field
from typing import Any

from glm53_flash.tasks import seal

# holdout's seed keeps its per-family seeds (seed + 53 f) far from every other split's, so no task
# of it shares a generator state with another split's (tests check the prompts themselves).
SPLIT_SEEDS = {"dev": 1701, "final": 2909, "rl": 3907, "confirm": 8123, "holdout": 6007}
# Splits that evaluation may open only with a stated purpose, recorded in the ledger (ledger.py).
SEALED_SPLITS = ("final", "confirm", "holdout")
PRETRAINING_SEED = 42
PROMPT_HEADER = "# Complete this Python function.\n"


@dataclass(frozen=True)
class Case:
    """One hidden test: positional arguments (stored immutably) and the expected result."""

    arguments: tuple
    expected: Any
    list_arguments: tuple[bool, ...] = ()

    def fresh_arguments(self) -> tuple:
        """A new argument tuple for one call: sequences the function takes as lists are new lists."""
        return tuple(
            list(arg) if (i < len(self.list_arguments) and self.list_arguments[i]) else arg
            for i, arg in enumerate(self.arguments)
        )


@dataclass(frozen=True)
class Family:
    name: str
    argument: str
    descriptions: tuple[str, str]
    body: str
    cases: tuple[Case, ...]

    @property
    def reference_completion(self) -> str:
        return "\n    " + self.body + "\n"


def _cases(pairs, takes_list: bool = False) -> tuple[Case, ...]:
    flags = (takes_list,)
    return tuple(
        Case(arguments=(tuple(arg) if takes_list else arg,), expected=expected, list_arguments=flags)
        for arg, expected in pairs
    )


FAMILIES: tuple[Family, ...] = (
    Family("increment", "x", ("Return x plus one.", "Increase x by one."), "return x + 1",
           _cases([(-3, -2), (0, 1), (7, 8)])),
    Family("double", "x", ("Return two times x.", "Double the input."), "return x * 2",
           _cases([(-4, -8), (0, 0), (6, 12)])),
    Family("square", "x", ("Return x squared.", "Multiply x by itself."), "return x * x",
           _cases([(-4, 16), (0, 0), (5, 25)])),
    Family("absolute", "x", ("Return the absolute value of x.", "Make a negative x positive."),
           "return -x if x < 0 else x", _cases([(-7, 7), (0, 0), (9, 9)])),
    Family("nonnegative", "x", ("Clamp x to at least zero.", "Return zero when x is negative."),
           "return x if x > 0 else 0", _cases([(-5, 0), (0, 0), (8, 8)])),
    Family("even", "x", ("Return whether x is even.", "Check divisibility by two."),
           "return x % 2 == 0", _cases([(-3, False), (0, True), (8, True)])),
    Family("reverse", "text", ("Return text in reverse order.", "Reverse the string."),
           "return text[::-1]", _cases([("", ""), ("abc", "cba"), ("level", "level")])),
    Family("list_sum", "values", ("Return the sum of values.", "Add every number in the list."),
           "return sum(values)", _cases([([], 0), ([1, 2, 3], 6), ([-2, 5], 3)], takes_list=True)),
)
FAMILY_NAMES: tuple[str, ...] = tuple(f.name for f in FAMILIES)
_BY_NAME = {f.name: f for f in FAMILIES}


@dataclass(frozen=True)
class CodingTask:
    """One task of either suite. `cases` are the hidden cases that give the verdict RL rewards;
    `unit` names the behaviour (the function it asks for: on the original suite its family, whose two
    descriptions compute the same function, `function_of`; on the compositions suite the behaviour, whose
    structure group is the unit a comparison tests over); `structure` its shape,
    `kind` what it is to a pretrained model (seen, new-constants, unseen-structure), `split` where it
    comes from; `strong_cases` its strong test set (empty here: an original task's is its family's,
    `strong_cases(family)`)."""

    task_id: str
    family: str
    entry_point: str
    prompt: str
    reference_completion: str
    cases: tuple[Case, ...]
    unit: str = ""
    structure: str = ""
    kind: str = ""
    split: str = ""
    strong_cases: tuple[Case, ...] = field(default=(), repr=False, compare=False)

    @property
    def reference_source(self) -> str:
        return self.prompt + self.reference_completion


def family_by_name(name: str) -> Family:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown family {name!r}; allowed: {', '.join(FAMILY_NAMES)}") from None


def parse_families(text: str | None) -> tuple[str, ...]:
    """Parse a comma list of family names ('' or None = all), keeping the canonical order."""
    if not text:
        return FAMILY_NAMES
    wanted = [part.strip() for part in text.split(",") if part.strip()]
    for name in wanted:
        family_by_name(name)
    return tuple(name for name in FAMILY_NAMES if name in wanted)


def make_task(family: Family | str, split: str, index: int, seed: int) -> CodingTask:
    """Build task `index` of `family`; the name suffix and description come from one seeded RNG."""
    fam = family_by_name(family) if isinstance(family, str) else family
    rng = random.Random((seed + 1) * 1_000_003 + index * 9176 + sum(ord(c) for c in fam.name))
    suffix = "".join(rng.choice(string.ascii_lowercase) for _ in range(7))
    described = rng.randrange(2)
    entry_point = f"{fam.name}_{suffix}"
    prompt = f"{PROMPT_HEADER}# {fam.descriptions[described]}\ndef {entry_point}({fam.argument}):"
    return CodingTask(
        task_id=f"{split}-{fam.name}-{index:03d}",
        family=fam.name,
        entry_point=entry_point,
        prompt=prompt,
        reference_completion=fam.reference_completion,
        cases=fam.cases,
        unit=fam.name,
        structure=fam.name,
        kind="seen",
        split=split,
    )


def frozen_tasks(split: str, per_family: int = 4, families: tuple[str, ...] | None = None,
                 opening=None) -> list[CodingTask]:
    """The locked evaluation/RL tasks: family-major, then index (the original's order). A sealed split's
    tasks need `opening`, granted by the ledger (tasks/seal.py)."""
    seal.check(split, opening, SEALED_SPLITS)
    return _frozen_tasks(split, per_family, families)


def _frozen_tasks(split: str, per_family: int = 4, families: tuple[str, ...] | None = None) -> list[CodingTask]:
    """frozen_tasks without the seal: for the tasks layer's ids, counts and hashes only."""
    if split not in SPLIT_SEEDS:
        raise ValueError(f"unknown split {split!r}; allowed: {', '.join(SPLIT_SEEDS)}")
    if per_family < 1:
        raise ValueError(f"per_family must be >= 1, got {per_family}")
    chosen = set(FAMILY_NAMES if families is None else [family_by_name(f).name for f in families])
    base = SPLIT_SEEDS[split]
    return [
        make_task(fam, split, index, base + 53 * f)
        for f, fam in enumerate(FAMILIES)
        if fam.name in chosen
        for index in range(per_family)
    ]


def task_by_id(task_id: str, opening=None) -> CodingTask:
    """Rebuild a frozen task from its id, e.g. 'confirm-double-000'; a sealed split's task needs `opening`
    (tasks/seal.py)."""
    seal.check(task_id.partition("-")[0], opening, SEALED_SPLITS)
    return _task_by_id(task_id)


def _task_by_id(task_id: str) -> CodingTask:
    split, _, rest = task_id.partition("-")
    family, _, index = rest.rpartition("-")
    if split not in SPLIT_SEEDS or not index.isdigit():
        raise ValueError(f"bad task id {task_id!r}; expected '<split>-<family>-<NNN>' with split in "
                         f"{', '.join(SPLIT_SEEDS)}")
    fam_index = FAMILY_NAMES.index(family_by_name(family).name)
    return make_task(family, split, int(index), SPLIT_SEEDS[split] + 53 * fam_index)


def summary(per_family: int) -> dict:
    """The suite's splits at `per_family` tasks per family: counts and a sha256 of each (sealed splits
    included: only their counts and hashes leave this module). `units` counts the distinct functions the
    split's tasks compute (`function_of`), the unit of a paired comparison on this suite."""
    import hashlib
    import json

    if per_family < 1:
        raise ValueError(f"--per-family must be >= 1, got {per_family}")
    splits = {}
    for split in SPLIT_SEEDS:
        tasks = _frozen_tasks(split, per_family)
        records = [[t.task_id, t.prompt, t.reference_completion, [[repr(c.arguments), repr(c.expected)]
                                                                    for c in t.cases]] for t in tasks]
        splits[split] = {"sealed": split in SEALED_SPLITS, "tasks": len(tasks),
                         "units": len({function_of(t) for t in tasks}), "structures": len({t.family for t in tasks}),
                         "sha256": hashlib.sha256(json.dumps(records).encode()).hexdigest()}
    return {"suite": "families", "per_family": per_family, "families": list(FAMILY_NAMES),
            "unit": "a distinct function: a family (its two descriptions compute the same function)",
            "strong_cases_per_family": {name: len(strong_cases(name)) for name in FAMILY_NAMES},
            "reward_cases_per_task": 3, "splits": splits}


def function_of(task: CodingTask) -> str:
    """The function a task of this suite asks for: the sha256 of what its reference source (its prompt and
    reference body, our own constant code, run with only the builtins a reference may call) returns on its
    family's strong inputs. Two tasks compute the same function when these agree; the tasks of a family
    do, whichever of its two descriptions their prompt carries, so a family is one unit of analysis."""
    return _function_digest(task.entry_point, task.reference_source, task.family)


@functools.lru_cache(maxsize=None)
def _function_digest(entry_point: str, source: str, family: str) -> str:
    import builtins
    import hashlib

    from glm53_flash.tasks.grammar import REFERENCE_BUILTINS

    namespace = {"__builtins__": {name: getattr(builtins, name) for name in REFERENCE_BUILTINS}}
    exec(compile(source, f"<{entry_point}>", "exec"), namespace)
    function = namespace[entry_point]
    outputs = [repr(function(*case.fresh_arguments())) for case in strong_cases(family)]
    return hashlib.sha256("\n".join(outputs).encode()).hexdigest()


# --------------------------------------------------------------------------- strong tests

STRONG_EXTRA_MIN = 50  # every family gets at least this many extra cases
_STRONG_SEED = 20_260_901
_INT_EDGES = (
    0, 1, -1, 2, -2, 3, -3, 10, -10, 99, -99, 100, -100, 255, 256, -255, -256, 1023, 1024, -1024,
    2**31 - 1, -2**31, 2**31, 2**32, -2**32, 2**53 - 1, 2**53, 2**53 + 1, -2**53 - 1, 2**63 - 1, -2**63,
    2**64, 10**18, -10**18, 10**30, -10**30, 12_345_678_901_234_567_890,
)
_TEXT_EDGES = (
    "a", "ab", "aa", "aba", "abba", "abcd", "racecar", " ", "  x", "x  ", "a b c", "Hello, World!", "12345",
    "\n", "\t\n ", "ab\ncd", "!@#$%^&*()", "'\"\\", "\x00a", "\u00e9", "na\u00efve", "\u65e5\u672c\u8a9e",
    "\U0001f642x", "mixed CASE", "x" * 100, "ab" * 50,
)
_LIST_EDGES = (
    [0], [5], [-5], [1, -1], [0, 0, 0], [10**18, 10**18], [-2**63, -1], [2**53, 1], [10**30, -10**30, 1],
    [1] * 100, list(range(200)), list(range(-100, 101)), [-1] * 37, [7] * 250, [-7], [0] * 10,
    [2**31 - 1, 1], [-10**18, 10**18, -1],
)


def _reference_function(family: Family):
    """The family's reference body as a function (our own constant code, run with only the builtins a
    reference may call), the source of every strong case's expected value."""
    import builtins

    from glm53_flash.tasks.grammar import REFERENCE_BUILTINS

    namespace = {"__builtins__": {name: getattr(builtins, name) for name in REFERENCE_BUILTINS}}
    exec(compile(f"def reference({family.argument}):\n    {family.body}\n", f"<{family.name}>", "exec"),
         namespace)
    return namespace["reference"]


def _strong_inputs(family: Family) -> list:
    """The extra inputs of one family: fixed edge values, then seeded random ones; inputs equal to one of
    the family's three cases are left out (those run anyway)."""
    rng = random.Random(_STRONG_SEED + FAMILY_NAMES.index(family.name))
    if family.argument == "text":
        letters = string.ascii_letters + string.digits + " .,_-"
        inputs = list(_TEXT_EDGES)
        inputs += ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 12))) for _ in range(24)]
        inputs += ["".join(rng.choice(letters) for _ in range(n)) for n in (500, 1000, 2000)]
    elif family.argument == "values":
        inputs = [list(v) for v in _LIST_EDGES]
        inputs += [[rng.randint(-10**6, 10**6) for _ in range(rng.randint(1, 60))] for _ in range(36)]
        inputs += [[rng.randint(-1000, 1000) for _ in range(300)]]
    else:
        inputs = list(_INT_EDGES)
        inputs += [rng.randint(-1000, 1000) for _ in range(10)] + [rng.randint(-10**12, 10**12) for _ in range(10)]
    known = [case.arguments[0] for case in family.cases]
    chosen, seen = [], set()
    for value in inputs:
        key = (type(value).__name__, repr(value))
        frozen = tuple(value) if isinstance(value, list) else value
        if key in seen or frozen in known:
            continue
        seen.add(key)
        chosen.append(value)
    return chosen


def strong_cases(family: Family | str) -> tuple[Case, ...]:
    """The family's strong test set: its three cases, then at least STRONG_EXTRA_MIN extra cases whose
    expected values the reference body computes. Deterministic; the same tuple object on every call
    (the verifier encodes a case tuple once)."""
    return _strong_cases(family_by_name(family if isinstance(family, str) else family.name).name)


@functools.lru_cache(maxsize=None)
def _strong_cases(name: str) -> tuple[Case, ...]:
    fam = family_by_name(name)
    reference = _reference_function(fam)
    takes_list = fam.argument == "values"
    extra = tuple(
        Case(arguments=(tuple(value) if takes_list else value,), expected=reference(value),
             list_arguments=(takes_list,))
        for value in _strong_inputs(fam)
    )
    if len(extra) < STRONG_EXTRA_MIN:  # a guard on the tables above, not an input check
        raise AssertionError(f"family {fam.name} has only {len(extra)} extra strong cases")
    return fam.cases + extra


def task_strong_cases(task: CodingTask) -> tuple[Case, ...]:
    """A task's strong test set: its own (compositions) or its family's (the original suite)."""
    return task.strong_cases or strong_cases(task.family)


def strong_task(task: CodingTask) -> CodingTask:
    """The same task judged on its strong test set (for evaluation only, never for rewards)."""
    return dataclasses.replace(task, cases=task_strong_cases(task))


def strong_cases_record(tasks) -> dict:
    """What an evaluation receipt records about the strong sets it used. The original suite: the cases
    per family and one sha256 over their arguments and expected values (the repr of each), in canonical
    family order. Other tasks: the fewest and most cases per task and one sha256 over every task's
    strong set, in task order."""
    import hashlib
    import json

    tasks = list(tasks)
    rule = "the three cases plus the extra ones; solved only when both runs pass"
    if any(task.strong_cases for task in tasks):
        rows = [[task.task_id, [[repr(c.arguments), repr(c.expected)] for c in task_strong_cases(task)]]
                for task in tasks]
        counts = [len(row[1]) for row in rows]
        return {"cases_per_task": {"min": min(counts), "max": max(counts)},
                "sha256": hashlib.sha256(json.dumps(rows).encode()).hexdigest(), "rule": rule}
    present = [name for name in FAMILY_NAMES if name in {task.family for task in tasks}]
    rows = {name: [[repr(c.arguments), repr(c.expected)] for c in strong_cases(name)] for name in present}
    return {"cases_per_task": {name: len(rows[name]) for name in present},
            "sha256": hashlib.sha256(json.dumps(rows).encode()).hexdigest(), "rule": rule}


def pretraining_task(index: int, seed: int = PRETRAINING_SEED) -> CodingTask:
    family = FAMILIES[random.Random(seed * 10_000_019 + index).randrange(len(FAMILIES))]
    return make_task(family, "pretrain", index, seed)


def pretraining_text(index: int, seed: int = PRETRAINING_SEED) -> str:
    """Example `index` of the unbounded pretraining stream: a prompt plus its reference body."""
    return pretraining_task(index, seed).reference_source
