"""The verifier's result record, `Evaluation`, and how a candidate's case results become one.

Same fields as the original's record; status gains `limit` (killed for time, memory or output). The
type-exact comparison lives here, so the sandbox and the in-process oracle judge with one rule.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

STATUSES = ("passed", "failed", "invalid", "limit")
_REPR_CHARS = 60
# A verdict's message is at most this long: the longest honest one is a case number and a limit's or an
# exception's text (the child clips that to worker.MESSAGE_CHARS, 200); anything longer (a child with
# the policy bypassed writes its own result frame) is cut here.
MESSAGE_CHARS = 256


@dataclass(frozen=True)
class Evaluation:
    """One verdict. For invalid and limit, tests_passed is 0 and pass_fraction 0.0; the message holds
    at most MESSAGE_CHARS characters."""

    status: str
    passed: bool
    tests_passed: int
    tests_total: int
    pass_fraction: float
    message: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {self.status!r}")
        if type(self.message) is not str or len(self.message) > MESSAGE_CHARS:
            object.__setattr__(self, "message", str(self.message)[:MESSAGE_CHARS])

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def invalid(cls, message: str, tests_total: int) -> "Evaluation":
        return cls("invalid", False, 0, tests_total, 0.0, message)

    @classmethod
    def limit(cls, message: str, tests_total: int) -> "Evaluation":
        return cls("limit", False, 0, tests_total, 0.0, message)

    @classmethod
    def from_cases(cls, tests_passed: int, tests_total: int, message: str = "") -> "Evaluation":
        passed = tests_passed == tests_total
        return cls("passed" if passed else "failed", passed, tests_passed, tests_total,
                   tests_passed / tests_total if tests_total else 0.0, "" if passed else message)


def result_matches(actual, expected) -> bool:
    """The original's rule: same exact type and equal (so 1 vs True, 1 vs 1.0 and None all fail)."""
    return type(actual) is type(expected) and actual == expected


def short_repr(value) -> str:
    try:
        text = repr(value)
    except Exception:  # e.g. an int past the int-to-str digit limit
        return f"<{type(value).__name__}>"
    return text if len(text) <= _REPR_CHARS else text[: _REPR_CHARS - 3] + "..."


def mismatch_message(number: int, total: int, actual, expected) -> str:
    return (f"case {number}/{total}: got {short_repr(actual)} ({type(actual).__name__}), "
            f"expected {short_repr(expected)} ({type(expected).__name__})")
