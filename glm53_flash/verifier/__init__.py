"""Sandboxed executable verifier: the original's static policy, then isolated execution with limits.

`Verifier` judges (task, program) pairs in worker processes under CPU, wall-clock, memory and output
limits; `evaluate_in_process` is the UNSAFE original-style evaluator kept as test oracle and baseline.
Nothing here imports torch. See docs/VERIFIER.md for what is and is not guaranteed.
"""

from glm53_flash.verifier.evaluation import STATUSES, Evaluation, result_matches
from glm53_flash.verifier.policy import (
    MAX_SOURCE_BYTES,
    SAFE_CALL_NAMES,
    check_policy,
    completion_is_parseable,
    validate_source,
)
from glm53_flash.verifier.reference import evaluate_in_process
from glm53_flash.verifier.sandbox import SandboxLimits, Verifier

__all__ = [
    "MAX_SOURCE_BYTES",
    "SAFE_CALL_NAMES",
    "STATUSES",
    "Evaluation",
    "SandboxLimits",
    "Verifier",
    "check_policy",
    "completion_is_parseable",
    "evaluate_in_process",
    "result_matches",
    "validate_source",
]
