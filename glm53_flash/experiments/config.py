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
from glm53_flash.experiments.rl_choices import ARMS, COMPOSITIONS_ARMS, DEFAULT_CONFIRM_SEEDS, DEFAULT_SCREEN_SEEDS, DEFAULT_TASKS_PER_FAMILY
from glm53_flash.experiments import generalisation, pretrain_switches, rl_switches
from glm53_flash.core.runtime import PRECISION_HELP, PRECISIONS
from glm53_flash.model.config import PRESETS


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
class RLChoicesStudyConfig(RerunnableStudyConfig):
    """Every knob of `glm53 experiment rl-choices`; the design in plan.json comes from these."""

    checkpoint: str = option(help="pretraining checkpoint directory every arm starts from")
    arms: tuple[str, ...] | None = option(None, parse=parse_name_list,
                                          help=f"comma-separated arms; {', '.join(ARMS)} (compositions also "
                                               f"{', '.join(COMPOSITIONS_ARMS)})",
                                          default_text="all of the suite's")
    seeds: tuple[int, ...] = option(DEFAULT_SCREEN_SEEDS, parse=parse_seed_range,
                                    help="screening training seeds: comma-separated or START:COUNT:STEP")
    confirm_seeds: tuple[int, ...] = option(DEFAULT_CONFIRM_SEEDS, parse=parse_seed_range,
                                            help="fresh training seeds for the confirmation",
                                            default_text="1001:10:1")
    suite: str = option("families", choices=("families", "compositions"),
                        help="task suite: families (the original's screen: dev, then the sealed final) or "
                             "compositions (compositions.dev, then the sealed compositions.unseen_structures; every "
                             "arm's budget x8 and a strong-reward arm)")
    tasks: int | None = option(None, help="evaluation tasks per family (families: 5 families) or of each split "
                                          "(compositions: a fixed subset by hash)",
                               default_text=f"{DEFAULT_TASKS_PER_FAMILY} per family, 100 per split (families); all "
                                            "(compositions)")
    confirm_arm: str | None = option(None, help="confirm this arm instead of the screen's winner",
                                     default_text="the screen's winner")
    precision: str = option("auto", choices=PRECISIONS,
                            help=PRECISION_HELP + "; part of the design; the compositions suite only (the families "
                                                  "screen keeps the original's default)")
    open_sealed: str | None = option(None, metavar="PURPOSE",
                                     help="the confirmation evaluates the sealed split final: say why it is "
                                          "opened (recorded in the ledger; `glm53 ledger`)",
                                     default_text="none: the confirmation is refused")
    reopen: str | None = option(None, metavar="REASON",
                                help="open final again for a plan that already opened it (recorded in the ledger)",
                                default_text="none: a second opening is refused")
    allow_dirty: bool = option(False, neutral=True,
                               help="open the sealed split(s) even though the code has uncommitted changes (the "
                                    "opening is recorded as unvouched)")
    ledger: str | None = option(None, neutral=True, metavar="PATH",
                                help="the ledger the sealed openings are recorded in",
                                default_text="results/ledger.jsonl of the checkout")

    def __post_init__(self) -> None:
        from glm53_flash.experiments.rl_choices import arms_of

        if self.arms is None:
            self.arms = tuple(arms_of(self.suite)) if self.suite in ("families", "compositions") else tuple(ARMS)
        self.arms, self.seeds, self.confirm_seeds = tuple(self.arms), tuple(self.seeds), tuple(self.confirm_seeds)

    def validate(self) -> None:
        super().validate()
        if self.precision != "auto" and self.suite != "compositions":
            raise ValueError(f"--precision {self.precision}: only the compositions suite's screen takes a precision; "
                             "the families screen runs the original's default")


def _optional_count(text: str) -> int | None:
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


_PRETRAIN = generalisation.PRETRAIN_DEFAULTS
_RL = generalisation.RL_RECIPE


@dataclass(kw_only=True)
class GeneralisationStudyConfig(RerunnableStudyConfig):
    """Every knob of `glm53 experiment rl-generalisation`; the design in plan.json comes from these."""

    arms: tuple[str, ...] = option(("faithful", "ours"), parse=parse_name_list,
                                   help="comma-separated arms (reproduce's: faithful, ours)", default_text="faithful,ours")
    seeds: tuple[int, ...] = option(generalisation.DEFAULT_SEEDS, parse=parse_seed_range,
                                    help="pretraining seeds: comma-separated or START:COUNT:STEP",
                                    default_text="1,2,3,4,5")
    rl_seeds: tuple[int, ...] = option(generalisation.DEFAULT_RL_SEEDS, parse=parse_seed_range,
                                       help="RL seeds of every pretraining seed", default_text="31415,27182")
    rewards: tuple[str, ...] = option(generalisation.REWARDS, parse=parse_name_list,
                                      help="RL reward cases, each its own runs: three (the original's), strong",
                                      default_text="three,strong")
    preset: str = option(_PRETRAIN["preset"], choices=tuple(sorted(PRESETS)), help="model preset")
    steps: int = option(_PRETRAIN["steps"], help="pretraining steps per run")
    checkpoints: tuple[int, ...] = option(_PRETRAIN["checkpoints"], parse=comma_ints,
                                          help="pretraining checkpoints selected among on dev (the last step always)")
    learning_rate: float = option(_PRETRAIN["learning_rate"], help="pretraining peak learning rate (constant after warmup)")
    warmup: int = option(_PRETRAIN["warmup"], help="pretraining warmup steps")
    batch_size: int = option(_PRETRAIN["batch_size"], help="pretraining sequences per step (192 tokens each)")
    groups: int = option(_RL.groups, help="RL prompts per run (one group each)")
    group_size: int = option(_RL.group_size, help="RL samples per prompt")
    rl_checkpoints: tuple[int, ...] = option(_RL.checkpoints, parse=comma_ints,
                                             help="RL checkpoints selected among on dev (the last group always)")
    rl_learning_rate: float = option(_RL.learning_rate, help="RL learning rate")
    dev_tasks: int | None = option(None, parse=_optional_count, metavar="N|all",
                                   help="dev tasks every selection evaluates (a fixed subset by hash)",
                                   default_text="all 621")
    sealed_tasks: int | None = option(None, parse=_optional_count, metavar="N|all",
                                      help="tasks of each sealed split evaluated (a fixed subset by hash)",
                                      default_text="all: 1,030 unseen compositions, 478 new constants")
    precision: str = option("auto", choices=PRECISIONS, help=PRECISION_HELP + "; part of the design")
    open_sealed: str | None = option(None, metavar="PURPOSE",
                                     help="the sealed splits' evaluations run: say why they are opened (recorded "
                                          "in the ledger, once per arm and seed)",
                                     default_text="none: the study stops before its sealed evaluations")
    reopen: str | None = option(None, metavar="REASON",
                                help="open a sealed split again for an (arm, seed) that already opened it",
                                default_text="none: a second opening is refused")
    allow_dirty: bool = option(False, neutral=True,
                               help="open the sealed split(s) even though the code has uncommitted changes (the "
                                    "opening is recorded as unvouched)")
    ledger: str | None = option(None, neutral=True, metavar="PATH",
                                help="the ledger the sealed openings are recorded in",
                                default_text="results/ledger.jsonl of the checkout")

    def __post_init__(self) -> None:
        self.arms, self.seeds, self.rl_seeds = tuple(self.arms), tuple(self.seeds), tuple(self.rl_seeds)
        self.rewards, self.checkpoints, self.rl_checkpoints = (tuple(self.rewards), tuple(self.checkpoints),
                                                              tuple(self.rl_checkpoints))

    def pretrain_recipe(self) -> dict:
        return {"preset": self.preset, "steps": self.steps, "checkpoints": self.checkpoints,
                "learning_rate": self.learning_rate, "warmup": self.warmup, "batch_size": self.batch_size}

    def rl_recipe(self):
        from dataclasses import replace

        return replace(_RL, groups=self.groups, group_size=self.group_size,
                       checkpoints=tuple(c for c in self.rl_checkpoints if c <= self.groups),
                       learning_rate=self.rl_learning_rate)


@dataclass(kw_only=True)
class RLSwitchesStudyConfig(RerunnableStudyConfig):
    """Every knob of `glm53 experiment rl-switches`; the design in plan.json comes from these."""

    source: str = option(help="a finished rl-generalisation (or pretrain-switches) study directory whose selected "
                              "(or the arms' last) pretraining "
                              "checkpoints every run starts from")
    rl_seeds: tuple[int, ...] = option(rl_switches.DEFAULT_RL_SEEDS, parse=parse_seed_range,
                                       help="RL seeds of every (arm, pretraining seed, variant)", default_text="101,202")
    seeds: tuple[int, ...] | None = option(None, parse=parse_seed_range,
                                           help="the source study's pretraining seeds to use (each needs its "
                                                "selected checkpoints still on disk)", default_text="all of them")
    switches: tuple[str, ...] = option(rl_switches.SWITCHES, parse=parse_name_list,
                                       help=f"RL switches to flip, each alone; {', '.join(rl_switches.SWITCHES)}",
                                       default_text="all three")
    dev_tasks: int | None = option(None, parse=_optional_count, metavar="N|all",
                                   help="dev tasks every run's last checkpoint is evaluated on (a fixed subset by hash)",
                                   default_text="all 621")

    def __post_init__(self) -> None:
        self.rl_seeds, self.switches = tuple(self.rl_seeds), tuple(self.switches)
        self.seeds = None if self.seeds is None else tuple(self.seeds)


@dataclass(kw_only=True)
class PretrainSwitchesStudyConfig(RerunnableStudyConfig):
    """Every knob of `glm53 experiment pretrain-switches`; the design in plan.json comes from these."""

    seeds: tuple[int, ...] = option(pretrain_switches.DEFAULT_SEEDS, parse=parse_seed_range,
                                    help="pretraining seeds (blocks: every design point runs under each)",
                                    default_text=",".join(map(str, pretrain_switches.DEFAULT_SEEDS)))
    fraction: str = option("full", choices=pretrain_switches.FRACTIONS,
                           help="the design: full (every combination of the switches: 2^3 = 8 runs per seed) or "
                                "half (four or more switches: the last at the parity of the others)")
    preset: str = option(_PRETRAIN["preset"], choices=tuple(sorted(PRESETS)), help="model preset")
    steps: int = option(_PRETRAIN["steps"], help="pretraining steps per run (its last checkpoint is evaluated)")
    learning_rate: float = option(_PRETRAIN["learning_rate"], help="pretraining peak learning rate (constant after warmup)")
    warmup: int = option(_PRETRAIN["warmup"], help="pretraining warmup steps")
    batch_size: int = option(_PRETRAIN["batch_size"], help="pretraining sequences per step (192 tokens each)")
    dev_tasks: int | None = option(None, parse=_optional_count, metavar="N|all",
                                   help="dev tasks every run is evaluated on (a fixed subset by hash)",
                                   default_text="all 621")
    sealed_tasks: int | None = option(None, parse=_optional_count, metavar="N|all",
                                      help="tasks of the sealed compositions.unseen_structures evaluated (a fixed "
                                           "subset by hash)", default_text="all 1,030")
    precision: str = option("auto", choices=PRECISIONS, help=PRECISION_HELP + "; part of the design")
    open_sealed: str | None = option(None, metavar="PURPOSE",
                                     help="after every dev run and the decision, evaluate every run on the sealed "
                                          "split: say why it is opened (recorded in the ledger, once for the plan)",
                                     default_text="none: the study stops after its dev runs and decision")
    reopen: str | None = option(None, metavar="REASON",
                                help="open the sealed split again for a plan that already opened it",
                                default_text="none: a second opening is refused")
    allow_dirty: bool = option(False, neutral=True,
                               help="open the sealed split(s) even though the code has uncommitted changes (the "
                                    "opening is recorded as unvouched)")
    ledger: str | None = option(None, neutral=True, metavar="PATH",
                                help="the ledger the sealed openings are recorded in",
                                default_text="results/ledger.jsonl of the checkout")

    def __post_init__(self) -> None:
        self.seeds = tuple(self.seeds)

    def pretrain_recipe(self) -> dict:
        return {"preset": self.preset, "steps": self.steps, "learning_rate": self.learning_rate, "warmup": self.warmup,
                "batch_size": self.batch_size}


__all__ = [
    "GeneralisationStudyConfig",
    "PretrainSwitchesStudyConfig",
    "RLSwitchesStudyConfig",
    "PretrainingDataStudyConfig",
    "RLChoicesStudyConfig",
    "RerunnableStudyConfig",
    "StudyConfig",
    "parse_name_list",
    "parse_seed_range",
    "parse_shard",
]
