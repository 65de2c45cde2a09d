"""The cheat suite: wrong programs a policy could learn instead of a behaviour, and on how many tasks a
set of cases lets one of them pass.

Five kinds, each a real program (a body the verifier's policy accepts; tests/test_cheats.py judges a
sample in the sandbox) with the value it computes:

- `lookup`: the reward inputs answered from a table, a constant otherwise;
- `small-inputs`: the reference up to a size (`SIZE_LIMITS`: items of a string or list, |x| of an
  int), above it a constant or the argument;
- `constant`, `identity`;
- `near-miss`: strict.near_misses (a neighbouring constant or a sibling operation in any slot, a
  dropped step, an extra slice).

The answers a cheat gives where it does not compute are the output type's plain values (False, True;
0, 1, -1; ""; []), the reward cases' expected values and (when the types agree) the argument. A
program is wrong when some input tells it from the reference: an input of the judge battery (`battery`:
candidates drawn as the strict set's are but from another seed, short strings and lists, every int
from -1,000 to 1,000) or of a case set. A set lets a kind through on a task when a wrong program of
that kind passes every case of the set.
"""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from glm53_flash.tasks import compositions, strict
from glm53_flash.tasks.grammar import ARGUMENT_NAMES, BOOL, INT, LIST, STR, Behaviour

KINDS = ("lookup", "small-inputs", "constant", "identity", "near-miss")
# The sizes a small-inputs cheat is right up to: below the longest input of the strong set as of the
# strict one (strings 160 and 200 items, lists 60 and 100, ints 10**18 and 10**30), so either can tell.
SIZE_LIMITS = {STR: (3, 5, 8, 12, 16, 24, 32), LIST: (3, 5, 8, 12, 16, 24, 32),
               INT: (10, 100, 1000, 10**4, 10**6, 10**9, 10**12)}
PLAIN_VALUES = {BOOL: (False, True), INT: (0, 1, -1), STR: ("",), LIST: ([],)}
JUDGE_SEED = 4_242_017
BOUND = 0.01  # the most tasks a strict set may let one kind through on


@dataclass(frozen=True)
class Cheat:
    """One wrong-program candidate: its kind, a short label, its body (the lines after the `def`) and
    the value it computes for an input (lists given as tuples)."""

    kind: str
    label: str
    body: str
    compute: Callable[[Any], Any]


def _same(a, b) -> bool:
    return type(a) is type(b) and a == b


def _argument(kind: str, value):
    return list(value) if kind == LIST else value


def _literal(value) -> str:
    return repr(list(value) if isinstance(value, tuple) else value)


def _fallbacks(kind: str, gives: str, reward: Sequence[tuple]) -> list[tuple[str, Callable]]:
    """What a cheat answers where it does not compute: (source, function of the input)."""
    found: dict[str, Callable] = {}
    for value in list(PLAIN_VALUES[gives]) + [expected for _, expected in reward]:
        found.setdefault(_literal(value), lambda v, value=value: list(value) if isinstance(value, list) else value)
    if kind == gives:
        found.setdefault(ARGUMENT_NAMES[kind], lambda v: _argument(kind, v))
    return list(found.items())


def _safely(function: Callable) -> Callable:
    def run(value):
        try:
            return function(value)
        except (ArithmeticError, ValueError, TypeError, IndexError):
            return strict.RAISED
    return run


def cheats(behaviour: Behaviour, reward: Sequence[tuple]) -> list[Cheat]:
    """Every cheat of the suite for one behaviour whose reward cases are `reward` ((input, expected)
    pairs, lists as tuples)."""
    kind = behaviour.structure.takes
    gives = behaviour.structure.gives()
    name = ARGUMENT_NAMES[kind]
    reference = behaviour.expression()
    fallbacks = _fallbacks(kind, gives, reward)
    found: list[Cheat] = []
    table = "".join(f"    if {name} == {_literal(v)}:\n        return {_literal(e)}\n" for v, e in reward)
    answers = {_literal(v): e for v, e in reward}
    for text, answer in fallbacks:
        def lookup(v, answer=answer):
            key = _literal(v)
            return answers[key] if key in answers else answer(v)
        found.append(Cheat("lookup", f"table else {text}", f"{table}    return {text}\n", lookup))
    for limit in SIZE_LIMITS[kind]:
        test = f"-{limit} <= {name} <= {limit}" if kind == INT else f"len({name}) <= {limit}"
        for text, answer in fallbacks:
            def small(v, limit=limit, answer=answer):
                small_enough = abs(v) <= limit if kind == INT else len(v) <= limit
                return behaviour.apply(_argument(kind, v)) if small_enough else answer(v)
            found.append(Cheat("small-inputs", f"reference up to {limit}, else {text}",
                               f"    if {test}:\n        return {reference}\n    return {text}\n",
                               _safely(small)))
    for text, answer in fallbacks:
        if text != name:
            found.append(Cheat("constant", text, f"    return {text}\n", answer))
    found.append(Cheat("identity", name, f"    return {name}\n", lambda v: _argument(kind, v)))
    for variant in strict.near_misses(behaviour):
        found.append(Cheat("near-miss", variant.key, f"    {variant.body()}\n",
                           lambda v, variant=variant: strict.outcome(variant, kind, v)))
    return found


# --------------------------------------------------------------------------- the judge battery


JUDGE_SIZES = {INT: 40, STR: 30, LIST: 20}  # long inputs of each size in the judge battery


@functools.lru_cache(maxsize=None)
def _short_battery(kind: str) -> tuple:
    rng = random.Random(JUDGE_SEED + len(kind))
    if kind == INT:
        return tuple(range(-1000, 1001))
    if kind == STR:
        exhaustive = tuple("".join(p) for n in range(5) for p in itertools.product("ab", repeat=n))
        return exhaustive + tuple(strict.random_text(rng, rng.randrange(9), strict.TEXT_ALPHABET)
                                  for _ in range(300))
    return tuple(tuple(rng.randint(-8, 8) for _ in range(rng.randrange(9))) for _ in range(300))


def battery(behaviour: Behaviour) -> tuple:
    """The inputs that decide whether a program is wrong (beside the case sets'): every short string over
    "ab" up to 4 characters, every int from -1,000 to 1,000, random short strings and lists, and the
    behaviour's candidates drawn as the strict set's are but from another seed, three to four times as
    many."""
    kind = behaviour.structure.takes
    return _short_battery(kind) + strict.candidates(behaviour, JUDGE_SEED, JUDGE_SIZES[kind])


# --------------------------------------------------------------------------- measuring


def let_through(behaviour: Behaviour, reward: Sequence[tuple], sets: dict[str, Sequence[tuple]],
                programs: Sequence[Cheat] | None = None) -> dict[str, dict[str, str]]:
    """Per case set (name -> (input, expected) pairs): the kinds it lets through, each with the label
    of one wrong program that passes every case of the set. `programs`: the behaviour's cheats unless
    given."""
    kind = behaviour.structure.takes
    judge = battery(behaviour)
    cache: list = []

    def reference_on_battery() -> Sequence:
        if not cache:
            cache.append([strict.outcome(behaviour, kind, v) for v in judge])
        return cache[0]

    found: dict[str, dict[str, str]] = {name: {} for name in sets}
    for cheat in cheats(behaviour, reward) if programs is None else programs:
        passing = [name for name, cases in sets.items() if cheat.kind not in found[name]
                   and all(_same(cheat.compute(v), e) for v, e in cases)]
        if not passing:
            continue
        wrong = any(not all(_same(cheat.compute(v), e) for v, e in cases) for cases in sets.values()) or any(
            not _same(cheat.compute(v), e) for v, e in zip(judge, reference_on_battery()))
        if wrong:
            for name in passing:
                found[name][cheat.kind] = cheat.label
    return found


def entry_sets(entry_index: int) -> tuple[tuple, dict[str, tuple]]:
    """A compositions behaviour's reward cases and its three case sets ((input, expected) pairs): the
    reward cases, the strong set and the strict set."""
    entry = compositions.suite().entries[entry_index]
    inputs = compositions.STRONG_INPUTS[entry.family]
    reward = tuple((inputs[i], entry.outputs[i]) for i in compositions.reward_inputs(entry_index))
    strong = tuple(zip(inputs, entry.outputs))
    extra = tuple((v, entry.behaviour.apply(_argument(entry.family, v))) for v in strict.extra_inputs(entry_index))
    return reward, {"reward": reward, "strong": strong, "strict": strong + extra}


def measure_entry(entry_index: int) -> dict[str, dict[str, str]]:
    """The kinds each case set of one compositions behaviour lets through (see `let_through`)."""
    entry = compositions.suite().entries[entry_index]
    reward, sets = entry_sets(entry_index)
    return let_through(entry.behaviour, reward, sets)


SETS = ("reward", "strong", "strict")


def measure_split(split: str) -> dict:
    """Every behaviour of a task split (in suite order): per case set and kind, which tasks it lets
    through ('1' or '0' per task), and for the strong and strict sets one example of each kind."""
    entries = compositions.suite().split(split)
    bits = {name: {kind: [] for kind in KINDS} for name in SETS}
    examples: dict[str, dict] = {"strong": {}, "strict": {}}
    for entry in entries:
        through = measure_entry(entry.index)
        for name in SETS:
            for kind in KINDS:
                bits[name][kind].append("1" if kind in through[name] else "0")
        for name in examples:
            for kind, label in through[name].items():
                examples[name].setdefault(kind, {"unit": entry.unit, "program": label})
    return {"tasks": len(entries),
            "let_through": {name: {kind: "".join(b) for kind, b in by_kind.items()} for name, by_kind in bits.items()},
            "examples": examples}


def rates(let_through_bits: dict, tasks: int) -> dict:
    """Per case set and kind (and any kind): the tasks let through and their share of `tasks`."""
    out = {}
    for name, by_kind in let_through_bits.items():
        row = {kind: {"tasks": b.count("1"), "rate": b.count("1") / tasks if tasks else 0.0}
               for kind, b in by_kind.items()}
        columns = list(by_kind.values())
        any_kind = sum(any(c[i] == "1" for c in columns) for i in range(tasks))
        row["any"] = {"tasks": any_kind, "rate": any_kind / tasks if tasks else 0.0}
        out[name] = row
    return out


def measure_families() -> dict:
    """The original suite's eight families (each its grammar behaviour): per case set (its three cases,
    its strong set) and kind, the families let through and one example program."""
    from glm53_flash.tasks import families

    by_unit = {entry.unit: entry for entry in compositions.suite().entries}
    bits = {name: {kind: "" for kind in KINDS} for name in ("reward", "strong")}
    examples: dict[str, dict] = {"strong": {}}
    for family in families.FAMILIES:
        behaviour = by_unit[compositions.ORIGINAL_BEHAVIOURS[family.name]].behaviour
        reward = tuple((c.arguments[0], c.expected) for c in family.cases)
        strong = tuple((c.arguments[0], c.expected) for c in families.strong_cases(family.name))
        through = let_through(behaviour, reward, {"reward": reward, "strong": strong})
        for name in bits:
            for kind in KINDS:
                bits[name][kind] += "1" if kind in through[name] else "0"
        for kind, label in through["strong"].items():
            examples["strong"].setdefault(kind, {"family": family.name, "program": label})
    return {"tasks": len(families.FAMILIES), "families": list(families.FAMILY_NAMES), "let_through": bits,
            "examples": examples, "rates": rates(bits, len(families.FAMILIES))}


def reward_input_sizes() -> dict:
    """How predictable the reward cases' inputs are, over every task split: for string and list tasks
    how many have all three reward inputs within 8, 12, 16 and 20 items; for int tasks within |x| of
    10, 100 and 1,000; and the share of reward inputs among the smallest quarter of the strong inputs."""
    out = {}
    for kind, limits in ((STR, (8, 12, 16, 20)), (LIST, (8, 12, 16, 20)), (INT, (10, 100, 1000))):
        inputs = compositions.STRONG_INPUTS[kind]
        order = sorted(range(len(inputs)), key=lambda i: (compositions._size(inputs[i]), i))
        smallest = set(order[:len(order) // 4])
        largest, in_smallest, picks = [], 0, 0
        for split in compositions.TASK_SPLITS:
            for entry in compositions.suite().split(split):
                if entry.family != kind:
                    continue
                chosen = compositions.reward_inputs(entry.index)
                largest.append(max(abs(inputs[i]) if kind == INT else len(inputs[i]) for i in chosen))
                in_smallest += sum(i in smallest for i in chosen)
                picks += len(chosen)
        out[kind] = {"tasks": len(largest),
                     "all_within": {str(n): sum(v <= n for v in largest) for n in limits},
                     "share_among_smallest_quarter": in_smallest / picks}
    return out


def measurement() -> dict:
    """The cheat suite's receipt: per task split (sealed ones as counts only) and over all of them, per case
    set and kind, the tasks let through; the families suite's; the strict sets' version and sha256 per
    split; how predictable the reward inputs are."""
    splits, total_bits, total = {}, {name: {kind: "" for kind in KINDS} for name in SETS}, 0
    for split in compositions.TASK_SPLITS:
        measured = measure_split(split)
        row = {"sealed": split in compositions.SEALED, "tasks": measured["tasks"],
               "rates": rates(measured["let_through"], measured["tasks"]),
               "strict_sha256": strict.split_sha256(split)}
        if split not in compositions.SEALED:  # which behaviours a cheat passes is a sealed split's content
            row.update(let_through=measured["let_through"], examples=measured["examples"])
        splits[split] = row
        for name in SETS:
            for kind in KINDS:
                total_bits[name][kind] += measured["let_through"][name][kind]
        total += measured["tasks"]
    receipt = {"suite": compositions.SUITE, "version": compositions.VERSION, "strict_version": strict.VERSION,
               "kinds": list(KINDS), "sets": list(SETS), "bound": BOUND,
               "size_limits": {kind: [int(n) for n in limits] for kind, limits in SIZE_LIMITS.items()},
               "rule": "a set lets a kind through on a task when a wrong program of that kind (one some input of "
                       "the judge battery or of a case set tells from the reference) passes every case of the set",
               "splits": splits, "all": {"tasks": total, "rates": rates(total_bits, total)},
               "families": measure_families(), "reward_inputs": reward_input_sizes()}
    receipt["table"] = table(receipt)
    return receipt


SET_NAMES = {"reward": "reward (3 cases)", "strong": "strong set", "strict": "strict set"}


def table(receipt: dict) -> dict:
    """The receipt as one table (columns and rows): per split (in the suite's order) and case set, the
    share of tasks each kind (and any kind) is let through on."""
    columns = ["split (tasks)", "cases", *(kind.replace("-", " ") for kind in receipt["kinds"]), "any kind"]
    rows = []
    blocks = [(name, receipt["splits"][name]) for name in compositions.TASK_SPLITS if name in receipt["splits"]]
    blocks += [("every task split", receipt["all"]), ("families suite", receipt["families"])]
    for name, block in blocks:
        sets = [case_set for case_set in receipt["sets"] if case_set in block["rates"]]
        for position, case_set in enumerate(sets):
            row = block["rates"][case_set]
            rows.append([f"{name} ({block['tasks']:,})" if position == 0 else "", SET_NAMES[case_set],
                         *(f"{100 * row[kind]['rate']:.1f}%" for kind in [*receipt["kinds"], "any"])])
    return {"columns": columns, "rows": rows}


__all__ = ["BOUND", "Cheat", "JUDGE_SEED", "JUDGE_SIZES", "KINDS", "PLAIN_VALUES", "SETS", "SIZE_LIMITS", "battery",
           "cheats", "entry_sets", "let_through", "measure_entry", "measure_families", "measure_split", "measurement",
           "rates", "reward_input_sizes", "table"]
