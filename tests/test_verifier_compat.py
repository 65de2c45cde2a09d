"""Compatibility with the original evaluator: same status and tests_passed on every program it judges.

The oracle is `evaluate_in_process` (the original's semantics, run unsafely in this process), so the
corpus holds only programs that are harmless to run here: reference solutions of every split, empty
and wrong bodies, the benchmark's bodies, seeded random edits of real programs, and random
expressions over the allowed builtins. Where the oracle raises (the original crashed), the sandbox
must answer `invalid` instead.
"""

from __future__ import annotations

import ast
import random
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from glm53_flash.tasks import FAMILIES
from glm53_flash.tasks.families import _frozen_tasks as frozen_tasks, _task_by_id as task_by_id  # the generator itself: sealed splits without an opening, for tests of the verifier and suites
from glm53_flash.verifier import MAX_SOURCE_BYTES, SAFE_CALL_NAMES, Verifier, check_policy, evaluate_in_process
from glm53_flash.verifier.policy import DENIED_NODES
from glm53_flash.verifier.bench import FAILING_BODIES, INVALID_BODIES, PASSING_BODIES

# The oracle parses and compiles model-like junk ("09else"); its SyntaxWarnings are noise here.
pytestmark = pytest.mark.filterwarnings("ignore::SyntaxWarning")

SPLITS = ("dev", "final", "rl", "confirm")
# Edits never produce a runaway program from these one-line bodies: at most three characters
# change, too few to build an exponent tower or a huge repetition.
EDIT_ALPHABET = "x*+-/%()[]:,.0123456789 \n=<>!'abcdefghijklmnopqrstuvwxyz_"


def mutate(source: str, rng: random.Random, edits: int, start: int) -> str:
    chars = list(source)
    for _ in range(edits):
        position = rng.randrange(start, len(chars) + 1)
        action = rng.choice(("delete", "insert", "replace"))
        if action == "insert" or position == len(chars):
            chars.insert(position, rng.choice(EDIT_ALPHABET))
        elif action == "delete":
            del chars[position]
        else:
            chars[position] = rng.choice(EDIT_ALPHABET)
    return "".join(chars)


def corpus(mutants: int = 900, seed: int = 1234) -> list[tuple]:
    tasks = [task for split in SPLITS for task in frozen_tasks(split, per_family=4)]
    programs = []
    for task in tasks:
        programs += [(task, task.reference_source), (task, task.prompt + "\n    pass\n"),
                     (task, task.prompt + "\n    return None\n")]
    reference_bodies = [family.body for family in FAMILIES]
    all_bodies = reference_bodies + [b for bodies in PASSING_BODIES.values() for b in bodies]
    all_bodies += FAILING_BODIES + INVALID_BODIES
    for task in frozen_tasks("rl", per_family=4):
        programs += [(task, f"{task.prompt}\n    {body}\n") for body in all_bodies]
    rng = random.Random(seed)
    for _ in range(mutants):
        task = rng.choice(tasks)
        # mostly edit the completion; one in five edits may also hit the prompt's def line
        start = 0 if rng.random() < 0.2 else len(task.prompt)
        programs.append((task, mutate(task.reference_source, rng, rng.randint(1, 3), start)))
    return programs


def compare(task, source, ours) -> str:
    """'' when the sandbox agrees with the original, else a description of the disagreement."""
    try:
        oracle = evaluate_in_process(task, source)
    except Exception as exc:  # the original crashed: RecursionError, NameError at definition, ...
        return "" if ours.status == "invalid" else f"original raised {exc!r}, sandbox said {ours}"
    if (ours.status, ours.tests_passed) != (oracle.status, oracle.tests_passed):
        return f"original {oracle}, sandbox {ours}"
    return ""


@pytest.fixture(scope="module")
def verifier():
    with Verifier(workers=2) as pool:
        yield pool


@pytest.mark.slow
def test_sandbox_agrees_with_the_original_on_the_corpus(verifier):
    programs = corpus()
    results = verifier.evaluate_many(programs)
    disagreements = [(task.task_id, source, problem) for (task, source), ours in zip(programs, results)
                     if (problem := compare(task, source, ours))]
    assert not disagreements, disagreements[:5]
    statuses = Counter(result.status for result in results)
    # the corpus really exercises every verdict the original can give
    assert statuses["passed"] >= 150 and statuses["failed"] >= 300 and statuses["invalid"] >= 300, statuses
    assert statuses["limit"] == 0
    partial = Counter(result.tests_passed for result in results if result.status == "failed")
    assert partial[1] > 0 and partial[2] > 0, partial


ATOMS = ["x", "0", "1", "2", "-1", "True", "False", "None", "'a'", "''", "[x]", "(x,)", "[]", "{}", "x // 2",
         "str(x)", "[x, 1]"]
UNARY = ["abs", "len", "str", "int", "bool", "max", "min", "sum"]
BINARY = ["+", "-", "*", "//", "%", "==", "<", "and", "or", "if x else"]


def expression(depth: int):
    if depth == 0:
        return st.sampled_from(ATOMS)
    smaller = expression(depth - 1)
    return st.one_of(
        smaller,
        st.tuples(st.sampled_from(UNARY), smaller).map(lambda t: f"{t[0]}({t[1]})"),
        st.tuples(smaller, st.sampled_from(BINARY), smaller).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(smaller, smaller).map(lambda t: f"[{t[0]}, {t[1]}][-1]"),
        smaller.map(lambda e: f"[v for v in [{e}, x] if v]"),
    )


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(family=st.sampled_from([f.name for f in FAMILIES]), expr=expression(3))
def test_sandbox_agrees_with_the_original_on_random_expressions(verifier, family, expr):
    task = task_by_id(f"final-{family}-001")
    argument = next(f.argument for f in FAMILIES if f.name == family)
    source = f"{task.prompt}\n    x = {argument}\n    return {expr}\n"
    ours = verifier.evaluate(task, source)
    assert not compare(task, source, ours)


def original_policy_accepts(source: str, entry_point: str) -> bool:
    """The original's validate_source, written plainly (ast.walk + isinstance), as the reference
    for the faster walker in policy.py."""
    try:
        if len(source.encode("utf-8")) > MAX_SOURCE_BYTES:
            return False
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    functions = []
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue
        if not isinstance(node, ast.FunctionDef):
            return False
        functions.append(node)
    if len(functions) != 1 or functions[0].name != entry_point:
        return False
    for node in ast.walk(tree):
        if isinstance(node, DENIED_NODES) or isinstance(node, ast.Attribute):
            return False
        if isinstance(node, ast.Name) and node.id.startswith("__"):
            return False
        if isinstance(node, ast.Call) and (not isinstance(node.func, ast.Name) or node.func.id not in SAFE_CALL_NAMES):
            return False
    return True


def test_policy_gives_the_original_verdict_on_the_corpus():
    programs = corpus()
    verdicts = Counter()
    for task, source in programs:
        expected = original_policy_accepts(source, task.entry_point)
        assert (check_policy(source, task.entry_point) is None) is expected, source
        verdicts[expected] += 1
    assert verdicts[True] > 300 and verdicts[False] > 300, verdicts
