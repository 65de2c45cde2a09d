"""The run configs of `glm53 experiment pretraining-data` and `glm53 experiment rl-choices`, declared
once (options.py): each field is a CLI flag and is recorded in plan.json as `run_config`. No torch
here, so building the CLI stays fast."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from glm53_flash.core.argtypes import comma_ints
from glm53_flash.core.options import option
from glm53_flash.core.runtime import DEFAULT_DEVICE, DEVICE_CHOICES
from glm53_flash.train.config import STUDY_LEARNING_RATE, LiveLoggingConfig
from glm53_flash.experiments.pretraining_data import CONDITIONS, DEFAULT_SEEDS
from glm53_flash.experiments.rl_choices import ARMS, DEFAULT_CONFIRM_SEEDS, DEFAULT_SCREEN_SEEDS, DEFAULT_TASKS_PER_FAMILY


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
class PretrainingDataStudyConfig(StudyConfig):
    """Every knob of `glm53 experiment pretraining-data`; the design in plan.json comes from these."""

    conditions: tuple[str, ...] = option(CONDITIONS, parse=parse_name_list,
                                         help=f"comma-separated conditions; {', '.join(CONDITIONS)}",
                                         default_text=f"all {len(CONDITIONS)}")
    seeds: tuple[int, ...] = option(DEFAULT_SEEDS, parse=parse_seed_range,
                                    help="paired seeds: comma-separated or START:COUNT:STEP",
                                    default_text="11:20:11 = 20 paired seeds")
    steps: int = option(200, help="optimizer updates per run")
    batch_size: int = option(24, help="sequences per update")
    learning_rate: float = option(STUDY_LEARNING_RATE, help="AdamW learning rate (constant)")
    sequence_length: int = option(128, help="tokens per training sequence")
    eval_at: tuple[int, ...] | None = option(None, parse=comma_ints, help="comma-separated updates to evaluate at",
                                             default_text="0 and every quarter of --steps")

    def __post_init__(self) -> None:
        if self.eval_at is None:
            self.eval_at = tuple(sorted({0, *(self.steps * q // 4 for q in (1, 2, 3, 4))}))
        self.conditions, self.seeds, self.eval_at = tuple(self.conditions), tuple(self.seeds), tuple(self.eval_at)


@dataclass(kw_only=True)
class RLChoicesStudyConfig(StudyConfig):
    """Every knob of `glm53 experiment rl-choices`; the design in plan.json comes from these."""

    checkpoint: str = option(help="pretraining checkpoint directory every arm starts from")
    arms: tuple[str, ...] = option(tuple(ARMS), parse=parse_name_list, help=f"comma-separated arms; {', '.join(ARMS)}",
                                   default_text=f"all {len(ARMS)}")
    seeds: tuple[int, ...] = option(DEFAULT_SCREEN_SEEDS, parse=parse_seed_range,
                                    help="screening training seeds: comma-separated or START:COUNT:STEP")
    confirm_seeds: tuple[int, ...] = option(DEFAULT_CONFIRM_SEEDS, parse=parse_seed_range,
                                            help="fresh training seeds for the confirmation",
                                            default_text="1001:10:1")
    tasks: int = option(DEFAULT_TASKS_PER_FAMILY, help="evaluation tasks per family (5 families; the default "
                                                       "gives 100 tasks per split)")
    confirm_arm: str | None = option(None, help="confirm this arm instead of the screen's winner",
                                     default_text="the screen's winner")
    open_sealed: str | None = option(None, metavar="PURPOSE",
                                     help="the confirmation evaluates the sealed split final: say why it is "
                                          "opened (recorded in the ledger; `glm53 ledger`)",
                                     default_text="none: the confirmation is refused")
    reopen: str | None = option(None, metavar="REASON",
                                help="open final again for a plan that already opened it (recorded in the ledger)",
                                default_text="none: a second opening is refused")

    def __post_init__(self) -> None:
        self.arms, self.seeds, self.confirm_seeds = tuple(self.arms), tuple(self.seeds), tuple(self.confirm_seeds)


__all__ = [
    "PretrainingDataStudyConfig",
    "RLChoicesStudyConfig",
    "StudyConfig",
    "parse_name_list",
    "parse_seed_range",
    "parse_shard",
]
