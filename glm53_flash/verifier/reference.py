"""UNSAFE in-process evaluator with the original's semantics: the test oracle and benchmark baseline.

It runs candidate code inside the calling process with no time, memory or output limits, exactly as
the original `evaluate_source` did (only fix: every call gets fresh arguments). Never point it at
untrusted programs; use `Verifier` for that. Exceptions the original let escape (NameError at
definition time, RecursionError or MemoryError while compiling) escape here too, by design.
"""

from __future__ import annotations

from glm53_flash.verifier.evaluation import Evaluation, mismatch_message, result_matches
from glm53_flash.verifier.policy import validate_source
from glm53_flash.verifier.worker import SAFE_BUILTINS, describe_exception


def evaluate_in_process(task, source: str) -> Evaluation:
    """Judge `source` (prompt + completion) for `task` the way the original evaluator did. UNSAFE."""
    total = len(task.cases)
    try:
        validate_source(source, task.entry_point)
        code = compile(source, "<candidate>", "exec")
        namespace = {"__builtins__": dict(SAFE_BUILTINS)}
        exec(code, namespace)  # noqa: S102 - this is the unsafe baseline, documented above
        function = namespace[task.entry_point]
    except (SyntaxError, ValueError, TypeError, KeyError) as exc:
        return Evaluation.invalid(str(exc), total)
    tests_passed, first_failure = 0, ""
    for number, case in enumerate(task.cases, start=1):
        try:
            actual = function(*case.fresh_arguments())
        except Exception as exc:
            first_failure = first_failure or f"case {number}/{total}: {describe_exception(exc)}"
            continue
        if result_matches(actual, case.expected):
            tests_passed += 1
        else:
            first_failure = first_failure or mismatch_message(number, total, actual, case.expected)
    return Evaluation.from_cases(tests_passed, total, first_failure)
