"""The strict strong set of the compositions suite: a behaviour's strong cases plus inputs chosen for it
from a seeded pool of long ones; the set evaluation counts false passes on beside the strong set.

The strong set (compositions.strong_cases) is pinned with the splits and is what RL takes as its reward
with `--reward-cases strong|sample-K`, so it stays as it is. Most of its inputs are short, and among
its long ones a predicate is almost always False: a program right on short inputs only, or one off by
one in a slice, can pass it. The pool holds strings and lists of 9 to 200 items and ints of 4 to 31
digits of either sign, built so that palindromes (bare or framed by an affix), characters at a
slice's edges, exact counts, one repeated unit, multiples and remainders, sorted and one-sided lists
all occur; for a string behaviour also inputs its leading string steps turn into such strings (a
palindrome after `text[2:]`); and short inputs. From it, per behaviour:

1. per size band, two inputs with different outputs (of one size, the largest, where the pool has
   such a pair): a predicate is True and False on long inputs, so no program that answers one value
   above some size passes;
2. for every value a reward case expects, an input that is not a reward case and expects it too, so a
   table of the reward inputs with one answer elsewhere fails;
3. on lists, for each filter, an input of which it keeps some values and drops others;
4. greedily, the input that sets apart the most near misses (`near_misses`) every case so far leaves
   standing, while any can be set apart (at most MAX_NEAR_MISS_PICKS).

Inputs the strong set has already are not added. The strict set has its own version and pins
(`VERSION`, `PINNED_SHA256`: one sha256 per task split, checked by tests/test_cheats.py); the suite's
pins, reward cases and strong set are untouched.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import random
from collections.abc import Sequence

from glm53_flash.tasks import compositions
from glm53_flash.tasks.compositions import INT, LIST, STR, STRONG_INPUTS, Behaviour, Structure
from glm53_flash.tasks.families import Case
from glm53_flash.tasks.grammar import OPS, OPS_TAKING

VERSION = 1
POOL_SEED = 20_270_101
# Every character a constant of the grammar uses, and two it does not (so "not contains" is easy).
TEXT_ALPHABET = "abexoy !?-z"
AFFIXES = ("!", "?", "ab", "xy", "-", " ")  # the grammar's (grammar._AFFIXES)
# Size bands of the long inputs ([low, high) items, or digits of an int), largest last.
TEXT_BANDS = ((9, 16), (16, 32), (32, 64), (64, 128), (128, 201))
LIST_BANDS = ((9, 16), (16, 32), (32, 64), (64, 101))
INT_BANDS = ((4, 7), (7, 10), (10, 16), (16, 20), (20, 32))  # digits of |x|
MAX_NEAR_MISS_PICKS = 12
# sha256 of each task split's strict sets (`split_sha256`), version 1.
PINNED_SHA256: dict[str, str] = {
    compositions.RL_SPLIT: "0713708067bebf6afab107f353858b2c280c5d2be6698cd6023a4e6d8791b6e1",
    compositions.DEV_SPLIT: "49c8fefe8b2cda121cf489ecb3861d1c446b83ac916c3f72cd838c544d72f812",
    compositions.UNSEEN_SPLIT: "d15da0b9b5935186150e4875a29579188a3eec92ccd2ddb07360fda3f1bf70f2",
    compositions.NEW_CONSTANTS_SPLIT: "fc12bde4685d8da17c4d5badb1be361704f2fef7e084cfe0575e0cfdd4b36b19",
}


# --------------------------------------------------------------------------- long inputs


def random_text(rng: random.Random, n: int, alphabet: str) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _palindrome(rng: random.Random, n: int, alphabet: str) -> str:
    half = random_text(rng, n // 2, alphabet)
    return half + (rng.choice(alphabet) if n % 2 else "") + half[::-1]


def _text(rng: random.Random, n: int) -> str:
    """One long string of `n` characters from a randomly chosen construction."""
    sub = "".join(rng.sample(TEXT_ALPHABET, rng.choice((1, 2, 2, 3, 4))))
    shape = rng.randrange(8)
    if shape == 0:
        return random_text(rng, n, TEXT_ALPHABET)
    if shape == 1:
        return random_text(rng, n, sub)
    if shape == 2:  # a palindrome, perhaps wrapped in up to six characters on either side
        front, back = (random_text(rng, rng.choice((0, 0, 1, 2, 3, 4, 5, 6)), TEXT_ALPHABET) for _ in range(2))
        if rng.random() < 0.5:  # a palindrome that starts or ends with an affix of the grammar
            affix = rng.choice(AFFIXES + tuple(a[::-1] for a in AFFIXES))
            front, back = affix[::-1], affix
        core = _palindrome(rng, max(1, n - len(front) - len(back)), sub)
        return (front + core + back)[:n]
    if shape == 3:  # every 2nd or 3rd character (after an offset) reads the same reversed
        step, offset = rng.choice((2, 3)), rng.randrange(6)
        chars = list(random_text(rng, n, TEXT_ALPHABET))
        places = range(offset, n, step)
        for place, ch in zip(places, _palindrome(rng, len(places), sub)):
            chars[place] = ch
        return "".join(chars)
    if shape == 4:  # a character at the edges of a slice (first or last seven places), absent elsewhere
        ch = rng.choice(TEXT_ALPHABET)
        background = random_text(rng, n, "".join(c for c in TEXT_ALPHABET if c != ch))
        chars = list(background)
        for _ in range(rng.choice((1, 1, 2))):
            place = rng.randrange(7)
            chars[place if rng.random() < 0.5 else n - 1 - place] = ch
        return "".join(chars)
    if shape == 5:  # a character an exact number of times
        ch = rng.choice(TEXT_ALPHABET)
        chars = list(random_text(rng, n, "".join(c for c in TEXT_ALPHABET if c != ch)))
        for place in rng.sample(range(n), min(n, rng.randrange(13))):
            chars[place] = ch
        return "".join(chars)
    if shape == 6:  # a short unit repeated
        unit = random_text(rng, rng.choice((1, 2, 3)), sub)
        return (unit * n)[:n]
    # affixes of the grammar at either end
    text = rng.choice(AFFIXES) + random_text(rng, n, TEXT_ALPHABET) + rng.choice(AFFIXES)
    return text[:n] if rng.random() < 0.5 else text[-n:]


def _values(rng: random.Random, n: int) -> list[int]:
    """One long list of `n` ints from a randomly chosen construction."""
    shape = rng.randrange(8)
    if shape == 0:
        bound = rng.choice((3, 6, 12, 50, 1000, 10**6))
        return [rng.randint(-bound, bound) for _ in range(n)]
    if shape == 7:  # large values, perhaps all of one sign (large sums, squares, extremes)
        bound = 10 ** rng.randrange(3, 13)
        low = rng.choice((-bound, 0, -bound // 10))
        return [rng.randint(low, bound) for _ in range(n)]
    if shape == 1:  # all multiples of m, or none
        m = rng.randrange(2, 7)
        if rng.random() < 0.5:
            return [m * rng.randint(-20, 20) for _ in range(n)]
        return [m * rng.randint(-20, 20) + rng.randrange(1, m) for _ in range(n)]
    if shape == 2:  # one value, or values all on one side of a small constant
        c = rng.randint(-4, 6)
        if rng.random() < 0.3:
            return [c] * n
        side = 1 if rng.random() < 0.5 else -1
        return [c + side * rng.randint(1, 30) for _ in range(n)]
    if shape == 3:  # a small value at the edges of a slice (first or last six places), absent elsewhere
        c = rng.randint(-1, 6)
        values = [rng.choice([v for v in range(-8, 9) if v != c]) for _ in range(n)]
        for _ in range(rng.choice((1, 1, 2))):
            place = rng.randrange(6)
            values[place if rng.random() < 0.5 else n - 1 - place] = c
        return values
    if shape == 4:  # sorted, either way
        values = sorted(rng.randint(-30, 30) for _ in range(n))
        return values if rng.random() < 0.5 else values[::-1]
    if shape == 5:  # a palindrome of values
        half = [rng.randint(-9, 9) for _ in range(n // 2)]
        return half + ([rng.randint(-9, 9)] if n % 2 else []) + half[::-1]
    return [rng.randint(-10, 10) for _ in range(n)]


def _integer(rng: random.Random, digits: int) -> int:
    """One int of `digits` digits (either sign): a random one, a multiple of a small modulus plus a
    remainder, or one next to a power of two or ten."""
    low, high = 10 ** (digits - 1), 10**digits - 1
    sign = 1 if rng.random() < 0.5 else -1
    shape = rng.randrange(3)
    if shape == 0:
        return sign * rng.randint(low, high)
    if shape == 1:
        m = rng.randrange(2, 13)
        value = rng.randint(low, high)
        return sign * (value - value % m + rng.choice((0, 0, rng.randrange(m))))
    base = rng.choice((10 ** (digits - 1), 2 ** int((digits - 1) * 3.33) or 1))
    return sign * (base + rng.randint(-2, 2))


def long_inputs(kind: str, seed: int, per_size: int) -> tuple:
    """A seeded pool of long inputs of `kind`, band by band: `per_size` of each of four sizes (the band's
    low end, its odd neighbour, its middle and its top), then twice `per_size` of sizes drawn inside it
    (for behaviours of the size alone); in a fixed order, no two alike."""
    rng = random.Random(seed * 7 + {INT: 1, STR: 2, LIST: 3}[kind])
    bands = {INT: INT_BANDS, STR: TEXT_BANDS, LIST: LIST_BANDS}[kind]
    found, seen = [], set()
    for low, high in bands:
        sizes = [n for n in sorted({low, low + 1, (low + high) // 2, high - 1}) for _ in range(per_size)]
        sizes += [rng.randrange(low, high) for _ in range(2 * per_size)]
        for n in sizes:
            value = _integer(rng, n) if kind == INT else _text(rng, n) if kind == STR else _values(rng, n)
            key = repr(value)
            if key not in seen:
                seen.add(key)
                found.append(tuple(value) if kind == LIST else value)
    return tuple(found)


def size(value) -> int:
    """The size a band counts: items of a string or list, digits of an int."""
    return len(value) if isinstance(value, (str, list, tuple)) else len(str(abs(value)))


def _band(kind: str, value) -> tuple | None:
    bands = {INT: INT_BANDS, STR: TEXT_BANDS, LIST: LIST_BANDS}[kind]
    n = size(value)
    for low, high in bands:
        if low <= n < high:
            return (low, value < 0) if kind == INT else (low,)
    return None


POOL_SIZES = {INT: 12, STR: 10, LIST: 8}  # long inputs of each size in the pool


@functools.lru_cache(maxsize=None)
def shared_inputs(kind: str, seed: int = POOL_SEED, per_size: int | None = None) -> tuple:
    """The inputs of a type every behaviour's candidates start from: `per_size` long ones of each size
    (POOL_SIZES by default), then short ones (near misses that differ only there)."""
    return long_inputs(kind, seed, POOL_SIZES[kind] if per_size is None else per_size) + short_inputs(kind, seed)


def _lift_text(steps: Sequence[tuple[str, tuple]], wanted: str, rng: random.Random) -> str | None:
    """A string that the string steps (operation name, constants) turn into `wanted`, the characters they
    drop drawn from `rng`; None when none does (an appended affix `wanted` does not end with)."""
    text = wanted
    for name, c in reversed(steps):
        n = c[0] if c else 0
        if name == "reverse":
            text = text[::-1]
        elif name in ("head", "tail"):
            if len(text) > n:
                return None
            if len(text) == n:
                filler = random_text(rng, rng.randrange(4, 40), TEXT_ALPHABET)
                text = text + filler if name == "head" else filler + text
        elif name in ("behead", "curtail"):
            filler = random_text(rng, n, TEXT_ALPHABET)
            text = filler + text if name == "behead" else text + filler
        elif name == "stride":
            filler = random_text(rng, n * len(text), TEXT_ALPHABET)
            chars = list(filler[:max(0, n * (len(text) - 1) + 1 + rng.randrange(n))])  # len(text) at every n-th
            for i, ch in enumerate(text):
                chars[n * i] = ch
            text = "".join(chars)
        elif name in ("append", "prepend"):
            affix = c[0]
            if not (text.endswith(affix) if name == "append" else text.startswith(affix)):
                return None
            text = text[:len(text) - len(affix)] if name == "append" else text[len(affix):]
        elif name == "repeat":
            unit = text[:len(text) // n]
            if unit * n != text:
                return None
            text = unit
        else:
            raise ValueError(f"{name} is not a string-to-string operation")
    return text


def _apply_text(steps: Sequence[tuple[str, tuple]], text: str) -> str:
    for name, c in steps:
        text = OPS[name].apply(text, c)
    return text


def candidates(behaviour: Behaviour, seed: int = POOL_SEED, per_size: int | None = None) -> tuple:
    """The inputs a strict set is chosen from: the type's shared inputs, and for a string behaviour each
    of them seen after the behaviour's leading string-to-string steps (an input those steps turn into
    it: a palindrome after `text[2:]`, a character at the edge of `text[:5]`)."""
    shared = shared_inputs(behaviour.structure.takes, seed, per_size)
    s = behaviour.structure
    if s.conditional is not None or s.takes != STR:
        return shared
    steps = []
    for name, c in zip(s.ops, behaviour.constants):
        if OPS[name].gives != STR:
            break
        steps.append((name, c))
    if not steps:
        return shared
    rng = random.Random(int(compositions._hash_unit("lift", seed, behaviour.key) * 2**52))
    # the text the steps put around what they keep of an input (affixes, perhaps reversed), and the
    # frame that makes a palindrome of a palindrome while starting and ending as they do
    probe = _apply_text(steps, "#" * 64)
    front, back = (probe[:probe.find("#")], probe[probe.rfind("#") + 1:]) if "#" in probe else ("", "")
    mirror = back[::-1] if back[::-1].startswith(front) else front if front.startswith(back[::-1]) else None
    wanted_texts = list(shared) + [front + y + back for y in shared]
    if mirror:
        wanted_texts += [mirror + y + mirror[::-1] for y in shared]
    found = {value: None for value in shared}
    for wanted in wanted_texts:
        lifted = _lift_text(steps, wanted, rng)
        if lifted is not None and len(lifted) < TEXT_BANDS[-1][1]:
            found.setdefault(lifted, None)
    return tuple(found)


def short_inputs(kind: str, seed: int) -> tuple:
    """Every int from -300 to 300; strings of one character repeated to the longest size and 200 random
    ones of up to 8; lists of one value repeated to the longest size and 300 random ones of up to 8
    (values within 6 of 0, or all negative down to -20)."""
    rng = random.Random(seed * 7 + 11)
    if kind == INT:
        return tuple(range(-300, 301))
    if kind == STR:
        return (tuple(ch * (TEXT_BANDS[-1][1] - 1) for ch in TEXT_ALPHABET)
                + tuple(random_text(rng, rng.randrange(9), rng.choice((TEXT_ALPHABET, "ab", "aeo", "x ")))
                        for _ in range(200)))
    return (tuple((v,) * (LIST_BANDS[-1][1] - 1) for v in range(-4, 7))
            + tuple(tuple(rng.randint(-6, 6) for _ in range(rng.randrange(9))) for _ in range(200))
            + tuple(tuple(rng.randint(-20, -1) for _ in range(rng.randrange(1, 9))) for _ in range(100)))


# --------------------------------------------------------------------------- near misses


def near_misses(behaviour: Behaviour) -> tuple[Behaviour, ...]:
    """What a program that almost computes the behaviour might compute instead: the reward cases' near
    misses (a neighbouring constant in any slot, a sibling last operation or a conditional's sibling
    predicate or branch, a dropped step, an extra slice), and for a chain a sibling operation (same
    types in and out, each of its constants) in any other slot; no two the same, none the behaviour."""
    found = {variant.key: variant for variant, _ in compositions._near_misses(behaviour)}
    s, constants = behaviour.structure, behaviour.constants
    if s.conditional is None:
        for slot, name in enumerate(s.ops[:-1]):
            op = OPS[name]
            for other in OPS_TAKING[op.takes]:
                if other.gives != op.gives or other.name == name:
                    continue
                for c in other.constants or ((),):
                    ops = s.ops[:slot] + (other.name,) + s.ops[slot + 1:]
                    variant = Behaviour(Structure(s.takes, ops), constants[:slot] + (c,) + constants[slot + 1:])
                    found.setdefault(variant.key, variant)
    found.pop(behaviour.key, None)
    return tuple(found.values())


def _argument(kind: str, value):
    return list(value) if kind == LIST else value


def _same(a, b) -> bool:
    return type(a) is type(b) and a == b


RAISED = object()  # what `outcome` gives for an input the behaviour raises on


def outcome(behaviour: Behaviour, kind: str, value):
    """The behaviour's value on one input, or a marker that it raised."""
    try:
        return behaviour.apply(_argument(kind, value))
    except (ArithmeticError, ValueError, TypeError, IndexError):
        return RAISED


# --------------------------------------------------------------------------- the strict set


def _filters_kept_and_dropped(behaviour: Behaviour, value) -> frozenset[int]:
    """The slots of the behaviour's list filters that keep some and drop some of what reaches them."""
    found = set()
    current = list(value)
    for slot, (name, c) in enumerate(zip(behaviour.structure.ops, behaviour.constants)):
        if not isinstance(current, list):
            break
        after = OPS[name].apply(current, c)
        if name.startswith(("keep_", "drop_")) and 0 < len(after) < len(current):
            found.add(slot)
        current = after
    return frozenset(found)


def _conditional_test(behaviour: Behaviour):
    """A conditional's test as a function of the input (None for a chain)."""
    s = behaviour.structure
    if s.conditional is None:
        return None
    op, constants = OPS[s.conditional[0]], behaviour.constants[0]
    return lambda x: op.apply(x, constants)


def _filter_slots(behaviour: Behaviour) -> frozenset[int]:
    s = behaviour.structure
    if s.conditional is not None or s.takes != LIST:
        return frozenset()
    return frozenset(slot for slot, name in enumerate(s.ops) if name.startswith(("keep_", "drop_")))


@functools.lru_cache(maxsize=None)
def extra_inputs(entry_index: int) -> tuple:
    """The long inputs the strict set adds to behaviour `entry_index`'s strong set (see the module's
    docstring for the rule), smallest first."""
    entry = compositions.suite().entries[entry_index]
    behaviour, kind = entry.behaviour, entry.family
    pooled = []
    for value in candidates(behaviour):
        result = outcome(behaviour, kind, value)
        if result is not RAISED and len(repr(result)) <= compositions.MAX_OUTPUT_REPR:
            pooled.append((value, result))
    chosen: dict[str, tuple] = {}  # repr -> (value, result), in the order picked

    def pick(value, result) -> None:
        chosen.setdefault(repr(value), (value, result))

    # 1. per band, two inputs with different outputs: of one size where the pool has such a pair (the
    # largest), else the largest input and the largest whose output differs from it
    by_band: dict[tuple, list] = {}
    for value, result in pooled:
        band = _band(kind, value)
        if band is not None:
            by_band.setdefault(band, []).append((value, result))
    for band in sorted(by_band):
        rows = sorted(by_band[band], key=lambda row: -size(row[0]))  # the largest size first (stable)
        pair = next(((a, b) for i, a in enumerate(rows) for b in rows[i + 1:]
                     if size(a[0]) == size(b[0]) and not _same(a[1], b[1])), None)
        if pair is None:
            pair = (rows[0],) + tuple(row for row in rows if not _same(row[1], rows[0][1]))[:1]
        for value, result in pair:
            pick(value, result)
    # 2. every output a reward case expects, on some input that is not a reward case (so a table of the
    # reward inputs with one answer elsewhere fails)
    reward = set(compositions.reward_inputs(entry_index))
    others = [o for i, o in enumerate(entry.outputs) if i not in reward]
    for i in sorted(reward):
        expected = entry.outputs[i]
        if not any(_same(o, expected) for o in others) and not any(_same(r, expected) for _, r in chosen.values()):
            found = next(((v, r) for v, r in sorted(pooled, key=lambda row: size(row[0])) if _same(r, expected)
                          and repr(_argument(kind, v)) != repr(_argument(kind, STRONG_INPUTS[kind][i]))), None)
            if found is not None:
                pick(*found)
    # 3. a conditional's test holds and fails in every band; on lists, each filter keeps some values
    # and drops others of one long input
    predicate = _conditional_test(behaviour)
    if predicate is not None:
        for band in sorted(by_band):
            for value_of_test in (True, False):
                if not any(_band(kind, v) == band and predicate(v) == value_of_test for v, _ in chosen.values()):
                    found = next(((v, r) for v, r in by_band[band] if predicate(v) == value_of_test), None)
                    if found is not None:
                        pick(*found)
    for slot in sorted(_filter_slots(behaviour)):
        if not any(slot in _filters_kept_and_dropped(behaviour, v) for v, _ in chosen.values()):
            found = next(((v, r) for v, r in pooled if slot in _filters_kept_and_dropped(behaviour, v)), None)
            if found is not None:
                pick(*found)
    # 4. near misses that every case so far leaves standing, set apart greedily
    known = [(_argument(kind, v), o) for v, o in zip(STRONG_INPUTS[kind], entry.outputs)]
    standing = []
    for variant in near_misses(behaviour):
        if all(_same(outcome(variant, kind, v), o) for v, o in known) and \
                all(_same(outcome(variant, kind, v), r) for v, r in chosen.values()):
            standing.append(variant)
    if standing:
        table = [[not _same(outcome(variant, kind, v), r) for v, r in pooled] for variant in standing]
        alive = list(range(len(standing)))
        for _ in range(MAX_NEAR_MISS_PICKS):
            counts = [sum(table[a][i] for a in alive) for i in range(len(pooled))]
            best = max(range(len(pooled)), key=lambda i: (counts[i], -size(pooled[i][0]), -i), default=None)
            if best is None or counts[best] == 0:
                break
            pick(*pooled[best])
            alive = [a for a in alive if not table[a][best]]
    strong = {repr(_argument(kind, v)) for v in STRONG_INPUTS[kind]}
    extra = [value for key, (value, _) in chosen.items() if repr(_argument(kind, value)) not in strong]
    return tuple(sorted(extra, key=lambda v: (size(v), repr(v))))


@functools.lru_cache(maxsize=None)
def strict_cases(entry_index: int) -> tuple[Case, ...]:
    """Behaviour `entry_index`'s strict set: its strong cases (reward cases first), then its extra long
    inputs with the reference's outputs."""
    entry = compositions.suite().entries[entry_index]
    extra = tuple(compositions._case(entry.family, value, entry.behaviour.apply(_argument(entry.family, value)))
                  for value in extra_inputs(entry_index))
    return compositions.strong_cases(entry_index) + extra


def applies(task) -> bool:
    """Whether a task has a strict set (a task of one of the compositions suite's task splits)."""
    return task.split in compositions.TASK_SPLITS and bool(task.strong_cases)


def entry_index(task) -> int:
    """The suite index of a compositions task (its id is '<split>-b<NNNN>-000')."""
    return int(task.task_id.rpartition("-b")[2].partition("-")[0])


def strict_task(task):
    """The same task judged on its strict set (for counting false passes, never for rewards)."""
    return dataclasses.replace(task, cases=strict_cases(entry_index(task)))


def strict_cases_record(tasks) -> dict:
    """What an evaluation receipt records about the strict sets it used: the version, the fewest and most
    cases per task and one sha256 over every task's strict set, in task order."""
    rows = [[task.task_id, [[repr(c.arguments), repr(c.expected)] for c in strict_cases(entry_index(task))]]
            for task in tasks]
    counts = [len(row[1]) for row in rows]
    return {"version": VERSION, "cases_per_task": {"min": min(counts), "max": max(counts)},
            "sha256": hashlib.sha256(json.dumps(rows).encode()).hexdigest(),
            "rule": "the strong set plus long inputs chosen per behaviour; solved only when the three cases, "
                    "the strong set and the strict set all pass"}


def split_sha256(split: str) -> str:
    """sha256 of a task split's strict sets: the version, then per behaviour in suite order its unit and
    every case (arguments and expected value, as repr)."""
    rows = [[e.unit, [[repr(c.arguments), repr(c.expected)] for c in strict_cases(e.index)]]
            for e in compositions.suite().split(split)]
    return hashlib.sha256(json.dumps([VERSION, rows]).encode()).hexdigest()


__all__ = ["PINNED_SHA256", "VERSION", "applies", "candidates", "entry_index", "extra_inputs", "long_inputs",
           "near_misses", "outcome", "shared_inputs", "size", "split_sha256", "strict_cases", "strict_cases_record",
           "strict_task"]
