"""What every study's run config shares (the flags of `glm53 experiment NAME`), declared once (options.py):
each field is a CLI flag and is recorded in plan.json as `run_config`. Each study's own config subclasses
these in its module (experiments/<study>.py). No torch here, so building the CLI stays fast."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from glm53_flash.core.argtypes import comma_ints
from glm53_flash.core.options import option
from glm53_flash.core.runtime import DEFAULT_DEVICE, DEVICE_CHOICES
from glm53_flash.train.config import LiveLoggingConfig


def parse_name_list(text: str) -> tuple[str, ...]:
    """'a,b' -> ('a', 'b'); at least one name."""
    values = tuple(part.strip() for part in text.split(",") if part.strip())
    if not values:
        raise argparse.ArgumentTypeError("expected at least one name")
    return values


def parse_seed_range(text: str) -> tuple[int, ...]:
    """'11,22,33' or 'START:COUNT:STEP' (e.g. 11:20:11 = 11, 22, ..., 220)."""
    if ":" in text:
        try:
            start, count, step = (int(part) for part in text.split(":"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected START:COUNT:STEP, got {text!r}") from None
        if count < 1:
            raise argparse.ArgumentTypeError(f"COUNT must be >= 1, got {count}")
        return tuple(start + i * step for i in range(count))
    return comma_ints(text)


def parse_shard(text: str) -> tuple[int, int]:
    """'I/N' -> (I, N) with 0 <= I < N."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected I/N such as 0/2, got {text!r}") from None
    if count < 1 or not 0 <= index < count:
        raise argparse.ArgumentTypeError(f"need 0 <= I < N, got {text!r}")
    return index, count


@dataclass(kw_only=True)
class StudyConfig(LiveLoggingConfig):
    """The flags every study shares (plus --quiet, --tensorboard and --wandb from LiveLoggingConfig)."""

    output: str = option(help="study directory (resumed when it holds the same plan)")
    workers: int = option(2, help="runs in parallel, one torch thread each")
    force: bool = option(False, help="replace a study planned with a different design")
    plan_only: bool = option(False, help="write plan.json (design + time estimate) and stop")
    shard: tuple[int, int] = option((0, 1), parse=parse_shard, metavar="I/N", default_text="0/1, the whole plan",
                                    help="run only every N-th unit of the plan starting at I (split a study "
                                         "across machines)")
    device: str = option(DEFAULT_DEVICE, choices=DEVICE_CHOICES,
                         help="where each run trains (with cuda, --workers processes share the GPU)")

    def validate(self) -> None:
        if self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")


@dataclass(kw_only=True)
class RerunnableStudyConfig(StudyConfig):
    """A study that `glm53 analyze --rerun-of` can compare with another: --rerun-of checks that before it runs."""

    rerun_of: str | None = option(None, metavar="FIRST",
                                  help="this study is the rerun of the study in FIRST: before anything runs, check "
                                       "that the two designs differ only where a rerun may (what `glm53 analyze "
                                       "--rerun-of` requires), so a mismatch fails at once",
                                  default_text="none")


# The flags of a study that opens sealed splits, each study saying what it opens and what happens without it.
def open_sealed_option(help: str, without: str):
    return option(None, metavar="PURPOSE", help=help, default_text=without)


def reopen_option(help: str):
    return option(None, metavar="REASON", help=help, default_text="none: a second opening is refused")


def allow_dirty_option():
    return option(False, neutral=True, help="open the sealed split(s) even though the code has uncommitted changes "
                                            "(the opening is recorded as unvouched)")


def ledger_option():
    return option(None, neutral=True, metavar="PATH", help="the ledger the sealed openings are recorded in",
                  default_text="results/ledger.jsonl of the checkout")


def parse_count_or_all(text: str) -> int | None:
    """'all' -> None, else a positive integer."""
    if text.strip().lower() == "all":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'all', got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'all', got {text!r}")
    return value


__all__ = [
    "RerunnableStudyConfig",
    "StudyConfig",
    "allow_dirty_option",
    "ledger_option",
    "open_sealed_option",
    "parse_count_or_all",
    "parse_name_list",
    "parse_seed_range",
    "parse_shard",
    "reopen_option",
]
