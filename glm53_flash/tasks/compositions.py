"""The compositions suite: thousands of distinct behaviours from a typed grammar, split by structure.

A behaviour is a chain of one to three operations with constants over `x: int`, `text: str` or
`values: list[int]` (grammar.py). Two behaviours are the same when they give the same outputs on the
strong inputs of their type; the suite keeps the first of each (simplest structures first), drops
those that return a constant or their input unchanged, and those whose prompt or reference would not
fit the model's context with the completion cap (`MAX_PROMPT_BYTES`, `MAX_COMPLETION_BYTES`).

Splits by structure. Structures that compute a common function for some of their constants are one
*group* (found among up to `GROUP_SAMPLE` instantiations of each), so "add 3 then double" and
"double then add 6" are never on two sides of a split. A group that holds a one-operation structure
is *seen*; every other group is seen, dev or unseen by a hash of its name. Behaviours of seen groups
go to pretraining (always the first drawn of each structure, so pretraining shows every seen
structure), rl, dev (new constants) or the sealed `new_constants` split by a hash of the behaviour;
behaviours of dev groups go to dev (unseen structures), those of unseen groups to the sealed
`unseen_structures` split. The original eight families are behaviours of the suite, in pretraining.

Every behaviour has two descriptions, a reference body, three reward cases chosen so that its near
misses fail (the same structure with a neighbouring constant, a sibling last operation, one operation
dropped, a constant answer, an extra slice), and its strong cases: every strong input of its type
with the reference's output (at least 50). Each split is pinned by a sha256 (`PINNED_SHA256`): a
change to what the generator produces is refused until the suite's version and pins are updated.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import random
import string
from collections.abc import Sequence
from dataclasses import dataclass

from glm53_flash.tasks.grammar import (
    BOOL, BRANCH_CONSTANTS, BRANCHES, INPUT_TYPES, INT, LIST, OPS, OPS_TAKING, PREDICATES, STR, Behaviour,
    Structure,
)
from glm53_flash.tasks import seal
from glm53_flash.tasks.families import Case, CodingTask

SUITE = "compositions"
VERSION = 1
# Split names: the suite's name, a dot, the split (no "-": task ids are '<split>-<unit>-<NNN>').
PRETRAIN_SPLIT = f"{SUITE}.pretrain"
RL_SPLIT = f"{SUITE}.rl"
DEV_SPLIT = f"{SUITE}.dev"
UNSEEN_SPLIT = f"{SUITE}.unseen_structures"
NEW_CONSTANTS_SPLIT = f"{SUITE}.new_constants"
SPLITS = (PRETRAIN_SPLIT, RL_SPLIT, DEV_SPLIT, UNSEEN_SPLIT, NEW_CONSTANTS_SPLIT)
TASK_SPLITS = (RL_SPLIT, DEV_SPLIT, UNSEEN_SPLIT, NEW_CONSTANTS_SPLIT)  # splits made of tasks
SEALED = (UNSEEN_SPLIT, NEW_CONSTANTS_SPLIT)
EVALUATION = (DEV_SPLIT, UNSEEN_SPLIT, NEW_CONSTANTS_SPLIT)
# What a task's behaviour is to the model before RL: the kinds a split reports separately.
SEEN, NEW_CONSTANTS, UNSEEN_STRUCTURE = "seen", "new-constants", "unseen-structure"
FAMILIES = INPUT_TYPES  # a compositions task's `family` is its argument's type

# The model's context is 192 tokens: BOS + a prompt of at most 124 bytes + 64 new tokens fits, and so
# does a pretraining example (BOS + prompt + reference + EOS) in a 192-token sequence.
MAX_PROMPT_BYTES = 124
MAX_COMPLETION_BYTES = 64
MAX_NEW_TOKENS = 64
SEQUENCE_LENGTH = 192
ENTRY_SUFFIX_LETTERS = 4
# Instantiations per structure: drawn for grouping, and kept as behaviours (the first few of them).
GROUP_SAMPLE = 24
BEHAVIOURS_PER_STRUCTURE = {1: None, 2: 4, 3: 3}  # None: every instantiation
THREE_OP_FRACTION = 0.22  # of all typed three-operation chains, a hashed share is in the suite
GROUP_ROLES = ((0.65, "seen"), (0.75, "dev"), (1.0, "unseen"))
BEHAVIOUR_ROLES = ((0.55, PRETRAIN_SPLIT), (0.70, RL_SPLIT), (0.80, DEV_SPLIT), (1.0, NEW_CONSTANTS_SPLIT))
# The original eight families, as behaviours of the grammar (same outputs, not the same text).
ORIGINAL_BEHAVIOURS = {
    "increment": "int:add(1)", "double": "int:mul(2)", "square": "int:square", "absolute": "int:abs",
    "nonnegative": "int:atleast(0)", "even": "int:divisible(2)", "reverse": "str:reverse", "list_sum": "list:total",
}
STRONG_MIN = 50
MAX_OUTPUT_REPR = 3000  # far inside what the verifier carries (expected values up to 8,192 characters)

# sha256 of each split's content (see `split_sha256`), version 1.
PINNED_SHA256: dict[str, str] = {
    PRETRAIN_SPLIT: "0226f3888fc96426eddff734543b13eb92f3a51d372fab40e80573f8a00b48e8",
    RL_SPLIT: "d0f4db11e4f27ce49cb03a16ec6c1d84a6bcb5abbaff952b71e2b8d7b98d9cc6",
    DEV_SPLIT: "d5d9fbf381287dff478382e82a0f6c0edbf3a2e11471853f8824335fa355f075",
    UNSEEN_SPLIT: "cae27ba7916adb4e25c87f394dcf1ab0c0a8ad9bf54c28c47feea0084e1b8ef0",
    NEW_CONSTANTS_SPLIT: "a9aca8e894266d9e7f37aad848ced630786ee3d083b30aaf338c8c8424fb746b",
}


class SuiteChanged(RuntimeError):
    """The generator no longer produces the pinned suite (a code or platform change)."""


# --------------------------------------------------------------------------- strong inputs


def _strong_inputs() -> dict[str, tuple]:
    rng = random.Random(20_261_202)
    ints = [0, 1, -1, 2, -2, 3, -3, 4, -4, 5, -5, 6, -6, 7, 8, 9, 10, -10, 11, 12, 13, 15, 16, 18, 20, 24, 25,
            30, 36, 48, 60, 99, -99, 100, -100, 255, 1000, -1001, 2**31 - 1, -2**31, 2**53 + 1, 10**18,
            -10**18 + 7]
    ints += [rng.randint(-500, 500) for _ in range(20)]
    alphabet = "abexoyz !?"
    texts = ["", "a", "b", "e", "x", "o", " ", "ab", "ba", "aa", "abc", "aba", "abba", "axe", "hello",
             "Hello, World!", "  x ", "a b c", "racecar", "banana", "eye", "oboe", "xyz", "!?", "12345",
             "ab ab", "noon", "bob", "ee", "exam", "a" * 12, "abcdefghij", "the quick brown fox",
             "\u00e9t\u00e9", "na\u00efve"]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 14))) for _ in range(20)]
    texts += ["".join(rng.choice(alphabet) for _ in range(n)) for n in (40, 80, 160)]
    lists = [[], [0], [1], [-1], [5], [-5], [2, 4], [1, 2, 3], [3, 2, 1], [1, -1], [0, 0, 0], [2, 4, 6, 8],
             [1, 3, 5, 7], [-2, -4, -6], [10, -10, 5], [4] * 6, [9, 0, 9], list(range(12)), list(range(-6, 7)),
             [100, -100, 50], [10**12, -10**12, 3], [6, 12, 18, 24, 30], [7, 14, 21]]
    lists += [[rng.randint(-20, 20) for _ in range(rng.randint(1, 12))] for _ in range(30)]
    lists += [[rng.randint(-50, 50) for _ in range(n)] for n in (30, 60)]
    found = {}
    for kind, values in ((INT, ints), (STR, texts), (LIST, lists)):
        unique, seen = [], set()
        for value in values:
            key = repr(value)
            if key not in seen:
                seen.add(key)
                unique.append(value)
        found[kind] = tuple(tuple(v) if kind == LIST else v for v in unique)
    return found


STRONG_INPUTS = _strong_inputs()


def _argument(kind: str, value):
    return list(value) if kind == LIST else value


# The strong inputs as arguments (lists as lists), shared by every computation: no operation changes
# its input (tests/test_compositions.py checks that).
_ARGUMENTS = {kind: tuple(_argument(kind, v) for v in values) for kind, values in STRONG_INPUTS.items()}


def _size(value) -> int:
    return len(value) if isinstance(value, (str, tuple, list)) else len(str(abs(value)))


# --------------------------------------------------------------------------- structures


def _hash_unit(*parts) -> float:
    """A number in [0, 1) from text (sha256; the same on every platform and Python)."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def _chains(takes: str, size: int) -> list[tuple[str, ...]]:
    chains = [()]
    for _ in range(size):
        grown = []
        for chain in chains:
            kind = OPS[chain[-1]].gives if chain else takes
            grown += [chain + (op.name,) for op in OPS_TAKING[kind]]
        chains = grown
    return chains


@functools.lru_cache(maxsize=None)
def structures() -> tuple[Structure, ...]:
    """Every structure of the suite in enumeration order: by size, then input type, then table order.
    Three-operation chains are a hashed share of all typed ones; conditionals pair each predicate with
    two different branches."""
    found = []
    for size in (1, 2, 3):
        for takes in INPUT_TYPES:
            for chain in _chains(takes, size):
                structure = Structure(takes, chain)
                if size == 3 and _hash_unit("three", VERSION, structure.key) >= THREE_OP_FRACTION:
                    continue
                found.append(structure)
        if size == 3:
            found += [Structure(INT, conditional=(p, yes, no)) for p in PREDICATES for yes in BRANCHES
                      for no in BRANCHES if yes != no]
    return tuple(found)


def _instantiations(structure: Structure) -> list[tuple[tuple, ...]]:
    """Up to GROUP_SAMPLE constant choices in a fixed order: all of them when they are few, else a
    seeded draw without repeats."""
    choices = structure.constant_choices()
    total = 1
    for slot in choices:
        total *= len(slot)
    if total <= GROUP_SAMPLE:
        return [tuple(combo) for combo in itertools.product(*choices)]
    rng = random.Random(int(_hash_unit("constants", VERSION, structure.key) * 2**52))
    drawn, seen = [], set()
    while len(drawn) < GROUP_SAMPLE:
        combo = tuple(slot[rng.randrange(len(slot))] for slot in choices)
        if combo not in seen:
            seen.add(combo)
            drawn.append(combo)
    return drawn


class _Outputs:
    """Outputs of behaviours on the strong inputs, computed once per prefix of a chain."""

    def __init__(self) -> None:
        self._prefix: dict[tuple, tuple] = {}

    def chain(self, takes: str, ops: Sequence[str], constants: Sequence[tuple]) -> tuple:
        values = _ARGUMENTS[takes]
        key: tuple = (takes,)
        for name, c in zip(ops, constants):
            key = key + ((name, c),)
            cached = self._prefix.get(key)
            if cached is None:
                apply = OPS[name].apply
                cached = tuple(apply(v, c) for v in values)
                self._prefix[key] = cached
            values = cached
        return values

    def behaviour(self, behaviour: Behaviour) -> tuple:
        s = behaviour.structure
        if s.conditional is None:
            return self.chain(s.takes, s.ops, behaviour.constants)
        return tuple(behaviour.apply(v) for v in _ARGUMENTS[INT])


def _fingerprint(outputs: tuple) -> bytes:
    return hashlib.blake2b(repr(outputs).encode(), digest_size=16).digest()


def _degenerate(takes: str, outputs: tuple) -> bool:
    """A constant answer, or the input unchanged."""
    first = outputs[0]
    if all(type(o) is type(first) and o == first for o in outputs):
        return True
    return all(type(o) is type(i) and o == i for o, i in zip(outputs, _ARGUMENTS[takes]))


# --------------------------------------------------------------------------- the suite


@dataclass(frozen=True)
class Entry:
    """One behaviour of the suite: its place (index), structure group, role and split."""

    index: int
    behaviour: Behaviour
    group: str
    split: str
    kind: str
    outputs: tuple = dataclasses.field(repr=False, compare=False)

    @property
    def unit(self) -> str:
        return self.behaviour.key

    @property
    def structure(self) -> str:
        return self.behaviour.structure.key

    @property
    def family(self) -> str:
        return self.behaviour.structure.takes


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, key: str) -> str:
        self.parent.setdefault(key, key)
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:  # the smaller key names the group, so a group's name does not depend on order
            low, high = sorted((ra, rb))
            self.parent[high] = low


@dataclass(frozen=True)
class Suite:
    entries: tuple[Entry, ...]
    groups: dict  # group name -> (role, structure keys)
    dropped: dict  # reason -> count

    def split(self, name: str) -> tuple[Entry, ...]:
        return tuple(e for e in self.entries if e.split == name)


def _fits(behaviour: Behaviour) -> bool:
    body = behaviour.body()
    if len(f"\n    {body}\n".encode()) > MAX_COMPLETION_BYTES:
        return False
    name = f"{behaviour.stem()}_" + "x" * ENTRY_SUFFIX_LETTERS
    return all(len(_prompt(d, name, behaviour.argument).encode()) <= MAX_PROMPT_BYTES
               for d in behaviour.descriptions())


def _prompt(description: str, entry_point: str, argument: str) -> str:
    return f"# {description}\ndef {entry_point}({argument}):"


@functools.lru_cache(maxsize=1)
def suite() -> Suite:
    """Build the suite (deterministic; about a second, once per process)."""
    outputs = _Outputs()
    all_structures = structures()
    samples = {s.key: _instantiations(s) for s in all_structures}
    # 1. groups: structures that share a (non-degenerate) function for some constants
    union = _UnionFind()
    owner: dict[bytes, str] = {}
    computed: dict[tuple[str, tuple], tuple] = {}
    for structure in all_structures:
        union.find(structure.key)
        for constants in samples[structure.key]:
            behaviour = Behaviour(structure, constants)
            try:
                values = outputs.behaviour(behaviour)
            except (ArithmeticError, ValueError, TypeError, IndexError):
                continue
            computed[(structure.key, constants)] = values
            if _degenerate(structure.takes, values):
                continue
            fingerprint = _fingerprint(values)
            if fingerprint in owner:
                union.union(owner[fingerprint], structure.key)
            else:
                owner[fingerprint] = structure.key
    members: dict[str, list[Structure]] = {}
    for structure in all_structures:
        members.setdefault(union.find(structure.key), []).append(structure)
    group_role = {}
    for name, group in members.items():
        if any(s.size == 1 for s in group):
            group_role[name] = "seen"
        else:
            u = _hash_unit("group", VERSION, name)
            group_role[name] = next(role for bound, role in GROUP_ROLES if u < bound)
    # 2. behaviours: the first few instantiations of each structure, distinct by outputs
    entries: list[Entry] = []
    taken: set[bytes] = set()
    dropped = {"same outputs as an earlier behaviour": 0, "constant or unchanged input": 0,
               "does not fit the context": 0, "output too large or raises": 0}
    for structure in all_structures:
        group = union.find(structure.key)
        keep = BEHAVIOURS_PER_STRUCTURE[structure.size]
        chosen = samples[structure.key] if keep is None else samples[structure.key][:keep]
        first_of_structure = True
        for constants in chosen:
            behaviour = Behaviour(structure, constants)
            values = computed.get((structure.key, constants))
            if values is None or any(len(repr(v)) > MAX_OUTPUT_REPR for v in values):
                dropped["output too large or raises"] += 1
                continue
            if _degenerate(structure.takes, values):
                dropped["constant or unchanged input"] += 1
                continue
            fingerprint = _fingerprint(values)
            if fingerprint in taken:
                dropped["same outputs as an earlier behaviour"] += 1
                continue
            if not _fits(behaviour):
                dropped["does not fit the context"] += 1
                continue
            taken.add(fingerprint)
            split, kind = _place(behaviour, group_role[group], first_of_structure)
            first_of_structure = False
            entries.append(Entry(len(entries), behaviour, group, split, kind, values))
    groups = {name: (group_role[name], tuple(s.key for s in group)) for name, group in members.items()}
    return Suite(tuple(entries), groups, dropped)


def _place(behaviour: Behaviour, group_role: str, first_of_structure: bool) -> tuple[str, str]:
    if group_role == "dev":
        return DEV_SPLIT, UNSEEN_STRUCTURE
    if group_role == "unseen":
        return UNSEEN_SPLIT, UNSEEN_STRUCTURE
    if first_of_structure or behaviour.key in ORIGINAL_BEHAVIOURS.values():
        return PRETRAIN_SPLIT, SEEN
    u = _hash_unit("behaviour", VERSION, behaviour.key)
    split = next(name for bound, name in BEHAVIOUR_ROLES if u < bound)
    # rl's behaviours are new constants to the pretrained model too (the sealed split's: to RL as well)
    return split, SEEN if split == PRETRAIN_SPLIT else NEW_CONSTANTS


# --------------------------------------------------------------------------- reward cases


# How much setting each kind of near miss apart counts when the reward cases are chosen: a constant
# answer must fail; a scaled or shifted constant (x % 4 for x % 2) or a dropped or extra step next;
# a sibling operation or another constant of the domain after them.
CONSTANT_ANSWER, SCALED_CONSTANT, DROPPED_OR_EXTRA, SIBLING = 100, 10, 5, 2


def _near_misses(behaviour: Behaviour) -> list[tuple[Behaviour, int]]:
    """What a program that almost computes the behaviour might compute instead, each with its weight:
    the same structure with a neighbouring constant in one slot, a sibling last operation (or
    predicate/branch), one operation dropped, an extra slice at the end (constant answers are added
    by the caller)."""
    s, constants = behaviour.structure, behaviour.constants
    variants: list[tuple[Behaviour, int]] = []
    for slot, choices in enumerate(s.constant_choices()):
        current = constants[slot]
        for near, weight in _neighbour_constants(current, choices):
            variants.append((Behaviour(s, constants[:slot] + (near,) + constants[slot + 1:]), weight))
    if s.conditional is None:
        last = OPS[s.ops[-1]]
        for op in OPS_TAKING[last.takes]:
            if op.gives == last.gives and op.name != last.name:
                for c in (op.constants or ((),)):
                    variants.append((Behaviour(Structure(s.takes, s.ops[:-1] + (op.name,)), constants[:-1] + (c,)),
                                     SIBLING))
        for drop in range(len(s.ops)):
            ops = s.ops[:drop] + s.ops[drop + 1:]
            if ops and _typed(s.takes, ops) == last.gives:
                variants.append((Behaviour(Structure(s.takes, ops), constants[:drop] + constants[drop + 1:]),
                                 DROPPED_OR_EXTRA))
        if last.gives in (STR, LIST):
            slice_op = "head" if last.gives == STR else "first"
            for c in OPS[slice_op].constants:
                variants.append((Behaviour(Structure(s.takes, s.ops + (slice_op,)), constants + (c,)),
                                 DROPPED_OR_EXTRA))
    else:
        predicate, yes, no = s.conditional
        for other in PREDICATES:
            if other != predicate:
                for c in OPS[other].constants:
                    variants.append((Behaviour(Structure(INT, conditional=(other, yes, no)), (c,) + constants[1:]),
                                     SIBLING))
        for slot, branch in ((1, yes), (2, no)):
            for other in BRANCHES:
                if other not in (branch, s.conditional[3 - slot]):
                    c = (BRANCH_CONSTANTS.get(other) or OPS[other].constants or ((),))[0]
                    parts = list(s.conditional)
                    parts[slot] = other
                    new_constants = list(constants)
                    new_constants[slot] = c
                    variants.append((Behaviour(Structure(INT, conditional=tuple(parts)), tuple(new_constants)),
                                     SIBLING))
        variants.append((Behaviour(Structure(INT, conditional=(predicate, no, yes)),
                                   (constants[0], constants[2], constants[1])), DROPPED_OR_EXTRA))
    return variants


def _neighbour_constants(current: tuple, choices: tuple[tuple, ...]) -> list[tuple[tuple, int]]:
    """Constants a near miss might use instead, with their weights: for a number n, n - 1, n + 1, 2n
    and 3n inside the domain or not (x % 2 against x % 4; x % 6 against x % 12); for a remainder (m, r),
    (2m, r) and (m, r +- 1); then the domain's neighbours and ends."""
    found: list[tuple[tuple, int]] = []
    if len(current) == 1 and isinstance(current[0], int) and not isinstance(current[0], bool):
        n = current[0]
        found += [((v,), SCALED_CONSTANT) for v in (n - 1, n + 1, 2 * n, 3 * n)]
    elif len(current) == 2 and all(isinstance(v, int) for v in current):
        m, r = current
        found += [((2 * m, r), SCALED_CONSTANT), ((m, (r + 1) % m), SCALED_CONSTANT),
                  ((m, (r - 1) % m), SCALED_CONSTANT)]
    if current in choices and len(choices) > 1:
        at = choices.index(current)
        found += [(choices[i], SIBLING) for i in sorted({at - 1, at + 1, 0, len(choices) - 1} - {at})
                  if 0 <= i < len(choices)]
    unique: list[tuple[tuple, int]] = []
    for near, weight in found:
        if near != current and all(near != other for other, _ in unique):
            unique.append((near, weight))
    return unique


def _typed(takes: str, ops: Sequence[str]) -> str | None:
    kind = takes
    for name in ops:
        if OPS[name].takes != kind:
            return None
        kind = OPS[name].gives
    return kind


def _same(a, b) -> bool:
    return type(a) is type(b) and a == b


def _variant_outputs(variant: Behaviour, outputs: _Outputs) -> tuple | None:
    try:
        if variant.structure.conditional is None:
            return outputs.chain(variant.structure.takes, variant.structure.ops, variant.constants)
        return outputs.behaviour(variant)
    except (ArithmeticError, ValueError, TypeError, IndexError):
        return None


_REWARD_INPUTS: dict[int, tuple[int, ...]] = {}


def reward_inputs(entry_index: int, outputs: _Outputs | None = None) -> tuple[int, ...]:
    """Indices (into STRONG_INPUTS of the behaviour's type) of its three reward cases: greedily the
    input that sets apart the most near misses not yet set apart (by weight: a constant answer first,
    then scaled constants, dropped or extra steps, siblings), smaller inputs first on ties; a string or
    list behaviour always gets one input of at least 8 items (a slice of 5 must fail)."""
    cached = _REWARD_INPUTS.get(entry_index)
    if cached is not None:
        return cached
    outputs = _Outputs() if outputs is None else outputs
    entry = suite().entries[entry_index]
    takes = entry.behaviour.structure.takes
    inputs = STRONG_INPUTS[takes]
    target = entry.outputs
    rows: list[tuple[tuple, int]] = []
    for variant, weight in _near_misses(entry.behaviour):
        values = _variant_outputs(variant, outputs)
        if values is not None and any(not _same(a, b) for a, b in zip(values, target)):
            rows.append((values, weight))
    for value in {repr(o): o for o in target}.values():
        rows.append(((value,) * len(inputs), CONSTANT_ANSWER))
    order = sorted(range(len(inputs)), key=lambda i: (_size(inputs[i]), i))
    alive = rows
    chosen: list[int] = []
    for pick in range(3):
        need_long = pick == 2 and takes in (STR, LIST) and not any(_size(inputs[i]) >= 8 for i in chosen)
        best, best_kills = None, -1
        for i in order:
            if i in chosen or (need_long and _size(inputs[i]) < 8):
                continue
            expected = target[i]
            kills = sum(weight for row, weight in alive if not _same(row[i], expected))
            if kills > best_kills:
                best, best_kills = i, kills
        chosen.append(best)
        alive = [(row, weight) for row, weight in alive if _same(row[best], target[best])]
    picks = tuple(sorted(chosen, key=lambda i: (_size(inputs[i]), i)))
    _REWARD_INPUTS[entry_index] = picks
    return picks


def near_miss_survivors(entry_index: int) -> int:
    """How many of the behaviour's near misses pass all three reward cases (for the suite's summary)."""
    entry = suite().entries[entry_index]
    takes = entry.behaviour.structure.takes
    picks = reward_inputs(entry_index)
    survivors = 0
    for variant, _ in _near_misses(entry.behaviour):
        try:
            values = [variant.apply(_argument(takes, STRONG_INPUTS[takes][i])) for i in picks]
            strong = [variant.apply(_argument(takes, v)) for v in STRONG_INPUTS[takes]]
        except (ArithmeticError, ValueError, TypeError, IndexError):
            continue
        differs = any(not _same(a, b) for a, b in zip(strong, entry.outputs))
        survivors += differs and all(_same(v, entry.outputs[i]) for v, i in zip(values, picks))
    return survivors


def _case(takes: str, value, expected) -> Case:
    return Case(arguments=(value,), expected=expected, list_arguments=(takes == LIST,))


@functools.lru_cache(maxsize=None)
def reward_cases(entry_index: int) -> tuple[Case, ...]:
    entry = suite().entries[entry_index]
    takes = entry.behaviour.structure.takes
    return tuple(_case(takes, STRONG_INPUTS[takes][i], entry.outputs[i]) for i in reward_inputs(entry_index))


@functools.lru_cache(maxsize=None)
def strong_cases(entry_index: int) -> tuple[Case, ...]:
    """The reward cases, then every other strong input of the behaviour's type with its output."""
    entry = suite().entries[entry_index]
    takes = entry.behaviour.structure.takes
    picks = set(reward_inputs(entry_index))
    extra = tuple(_case(takes, value, entry.outputs[i]) for i, value in enumerate(STRONG_INPUTS[takes])
                  if i not in picks)
    return reward_cases(entry_index) + extra


# --------------------------------------------------------------------------- tasks


def _rng(*parts) -> random.Random:
    return random.Random(int(_hash_unit(*parts) * 2**52))


def _entry_point(entry: Entry, rng: random.Random) -> str:
    return f"{entry.behaviour.stem()}_" + "".join(rng.choice(string.ascii_lowercase)
                                                  for _ in range(ENTRY_SUFFIX_LETTERS))


def make_task(entry: Entry, split: str, rng: random.Random, task_id: str) -> CodingTask:
    """A task of one behaviour: a description and a name suffix drawn from `rng`."""
    behaviour = entry.behaviour
    description = behaviour.descriptions()[rng.randrange(2)]
    entry_point = _entry_point(entry, rng)
    evaluated = split != PRETRAIN_SPLIT
    return CodingTask(
        task_id=task_id, family=entry.family, entry_point=entry_point,
        prompt=_prompt(description, entry_point, behaviour.argument),
        reference_completion=f"\n    {behaviour.body()}\n",
        cases=reward_cases(entry.index) if evaluated else (),
        unit=entry.unit, structure=entry.structure, kind=entry.kind, split=split,
        strong_cases=strong_cases(entry.index) if evaluated else (),
    )


def split_tasks(split: str, opening=None) -> tuple[CodingTask, ...]:
    """Every task of a split: one per behaviour, in suite order (task ids '<split>-b<NNNN>-000'). A sealed
    split's tasks need `opening`, granted by the ledger (tasks/seal.py)."""
    seal.check(split, opening, SEALED)
    return _split_tasks(split)


@functools.lru_cache(maxsize=None)
def _split_tasks(split: str) -> tuple[CodingTask, ...]:
    """split_tasks without the seal: for the tasks layer's ids, counts and hashes only."""
    if split not in TASK_SPLITS:
        raise ValueError(f"unknown compositions split {split!r}; allowed: {', '.join(TASK_SPLITS)}")
    entries = suite().split(split)
    outputs = _Outputs()  # near misses share prefixes within a split; the cache ends with the call
    for entry in entries:
        reward_inputs(entry.index, outputs)
    tasks = tuple(make_task(entry, split, _rng("task", VERSION, split, entry.unit), f"{split}-b{entry.index:04d}-000")
                  for entry in entries)
    _check_pin(split, tasks)
    return tasks


def structure_group(task_id: str) -> str:
    """The structure group of a task's behaviour: the unit a paired comparison on this suite tests over
    (behaviours of one group are correlated). Read from the suite's entries by the behaviour's index in the
    task id ('<split>-b<NNNN>-<NNN>'), which names a task without showing it, so no sealed split is opened; a
    one-line error for an id that is no task of the suite."""
    split, _, rest = task_id.partition("-")
    index = rest.partition("-")[0]
    entries = suite().entries
    if split not in SPLITS or not (index[:1] == "b" and index[1:].isdigit()) \
            or int(index[1:]) >= len(entries) or entries[int(index[1:])].split != split:
        raise ValueError(f"{task_id!r} is no task of the {SUITE} suite (ids are '<split>-b<NNNN>-<NNN>' with split "
                         f"in {', '.join(SPLITS)})")
    return entries[int(index[1:])].group


def structure_groups(task_ids) -> dict[str, str]:
    """task id -> structure_group(task id), for every id given."""
    return {task_id: structure_group(task_id) for task_id in task_ids}


def pretraining_task(index: int, seed: int = 42) -> CodingTask:
    """Example `index` of the pretraining stream: a pretraining behaviour, description and name drawn
    from one seeded RNG (the original stream's seed formula)."""
    entries = _pretraining_entries()
    rng = random.Random(seed * 10_000_019 + index)
    entry = entries[rng.randrange(len(entries))]
    return make_task(entry, PRETRAIN_SPLIT, rng, f"{PRETRAIN_SPLIT}-b{entry.index:04d}-{index:03d}")


def pretraining_text(index: int, seed: int = 42) -> str:
    return pretraining_task(index, seed).reference_source


@functools.lru_cache(maxsize=1)
def _pretraining_entries() -> tuple[Entry, ...]:
    entries = suite().split(PRETRAIN_SPLIT)
    _check_pin(PRETRAIN_SPLIT, entries)
    return entries


# --------------------------------------------------------------------------- pins and summary


def _records(split: str, items) -> list:
    if split == PRETRAIN_SPLIT:
        return [[e.unit, e.structure, e.group, list(e.behaviour.descriptions()), e.behaviour.body()] for e in items]
    return [[t.task_id, t.unit, t.structure, t.kind, t.prompt, t.reference_completion,
             [[repr(c.arguments), repr(c.expected)] for c in t.strong_cases], len(t.cases)] for t in items]


def split_sha256(split: str, items=None) -> str:
    """sha256 of a split's content: for pretraining its behaviours (unit, structure, group,
    descriptions, body); for the others every task (id, unit, structure, kind, prompt, reference, the
    strong cases with the reward cases first, and how many reward cases)."""
    if items is None:
        items = _pretraining_entries() if split == PRETRAIN_SPLIT else _split_tasks(split)
    return hashlib.sha256(json.dumps(_records(split, items)).encode()).hexdigest()


def _check_pin(split: str, items) -> None:
    pinned = PINNED_SHA256.get(split)
    if pinned is None:
        return
    actual = split_sha256(split, items)
    if actual != pinned:
        raise SuiteChanged(f"the {split} split no longer matches its pinned sha256 ({actual[:16]} != "
                           f"{pinned[:16]}): the generator changed; raise compositions.VERSION and pin the new "
                           f"splits (glm53 tasks summary --suite compositions)")


def summary() -> dict:
    """Per split: tasks (or behaviours), distinct behaviours, structures, structure groups (the unit of a
    paired comparison), kinds, families, sha256, and for an evaluation split the power over its groups; and
    the suite's totals."""
    built = suite()
    splits = {}
    for split in SPLITS:
        entries = built.split(split)
        row = {
            "sealed": split in SEALED,
            "behaviours": len(entries),
            "structures": len({e.structure for e in entries}),
            "structure_groups": len({e.group for e in entries}),
            "by_kind": _counts(e.kind for e in entries),
            "by_family": _counts(e.family for e in entries),
            "by_size": _counts(str(e.behaviour.structure.size) for e in entries),
            "sha256": split_sha256(split),
        }
        row["tasks"] = 0 if split == PRETRAIN_SPLIT else len(_split_tasks(split))
        if split in EVALUATION:
            row["power"] = _unit_power(row["structure_groups"])
        splits[split] = row
    return {
        "suite": SUITE, "version": VERSION,
        "unit": "a structure group: structures that compute a common function for some constants (behaviours of "
                "one group are correlated, so a paired comparison tests over groups)",
        "behaviours": len(built.entries),
        "structures": len({e.structure for e in built.entries}),
        "structure_groups": len({e.group for e in built.entries}),
        "strong_cases_per_behaviour": {kind: len(STRONG_INPUTS[kind]) for kind in INPUT_TYPES},
        "reward_cases_per_behaviour": 3,
        "dropped_candidates": dict(built.dropped),
        "original_families": dict(ORIGINAL_BEHAVIOURS),
        "splits": splits,
    }


def _unit_power(units: int) -> dict:
    """What a paired comparison over a split's units (its structure groups) detects (exact sign-flip over
    units, alpha 0.05, 80% power), for two standard deviations of a unit's difference in pass rate: 0.3 (the
    families suite's arms differed by up to that) and 0.5 (about the largest for pass/fail outcomes)."""
    from glm53_flash.core.stats import minimum_detectable_difference

    return {"units": units, "alpha": 0.05, "power": 0.8,
            "mdd_at_sd_0.3": minimum_detectable_difference(units, 0.3),
            "mdd_at_sd_0.5": minimum_detectable_difference(units, 0.5)}


def _counts(values) -> dict:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return dict(sorted(counts.items()))


__all__ = [
    "DEV_SPLIT", "EVALUATION", "MAX_NEW_TOKENS", "NEW_CONSTANTS", "NEW_CONSTANTS_SPLIT", "PINNED_SHA256",
    "PRETRAIN_SPLIT", "RL_SPLIT", "SEALED", "SEEN", "SEQUENCE_LENGTH", "SPLITS", "STRONG_INPUTS", "SUITE",
    "SuiteChanged", "TASK_SPLITS", "UNSEEN_SPLIT", "UNSEEN_STRUCTURE", "VERSION", "make_task",
    "near_miss_survivors", "pretraining_task", "pretraining_text", "reward_cases", "split_sha256", "split_tasks",
    "strong_cases", "structure_group", "structure_groups", "structures", "suite", "summary",
]
