"""The run configs of `glm53 pretrain` and `glm53 rl`, declared once (options.py): each field is a
CLI flag, a config value and a receipt entry. No torch here, so `glm53 --help` stays fast."""

from __future__ import annotations

from dataclasses import dataclass

from glm53_flash.model.config import PRESETS, ModelConfig
from glm53_flash.core.options import option
from glm53_flash.core.runtime import DEFAULT_DEVICE, DEVICE_CHOICES, PRECISION_HELP, PRECISIONS, available_memory_bytes
from glm53_flash.evaluation.config import (  # noqa: F401 - shared with evaluation
    EVAL_STOP_CHOICES, GREEDY_SEED, SAMPLED_SEED, SAMPLING_TEMPERATURE,
)
from glm53_flash.tasks import MAX_NEW_TOKENS, SUITES, parse_families

SCHEDULES = ("constant", "cosine")
TRAIN_SCOPES = ("all", "last-block", "last-block-head")
REWARD_MODES = ("case-fraction", "binary")
LOSS_NORMALIZATIONS = ("constant", "token-sum", "sequence-mean")
LOGPROB_SOURCES = ("sampler", "untempered")
EOS_HANDLING = ("append", "omit")
# The pretraining-data study's learning rate (the original miniature study's): engine.STUDY, the study's
# --learning-rate default and its RunConfig.
STUDY_LEARNING_RATE = 8e-4
RL_STOPS = ("parse", "eos")
REWARD_CASES = ("three", "strong", "sample-K")


def reward_case_count(text: str) -> int | None:
    """K of 'sample-K'; None for 'three' and 'strong'; ValueError for anything else."""
    if text in ("three", "strong"):
        return None
    head, _, count = str(text).partition("-")
    if head == "sample" and count.isdigit() and str(int(count)) == count and int(count) >= 1:
        return int(count)
    raise ValueError(f"--reward-cases {text!r}; allowed: three, strong, sample-K with K >= 1 (e.g. sample-8)")


def parse_reward_cases(text: str) -> str:
    """The flag's check (argparse shows the message)."""
    import argparse

    try:
        reward_case_count(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text

PRETRAIN_DEFAULT_CHECKPOINTS = (100, 200, 400)
# The original's sequence length; the compositions suite's examples need the model's whole context.
PRETRAIN_SEQUENCE_LENGTHS = {"families": 128, "compositions": 192}
# The flags every training command shares (train/engine.py: the progress bar, MetricsSink).
QUIET_HELP = "no progress bar (also off when stderr is not a terminal); --no-progress is the same"
TENSORBOARD_HELP = ("also log each step's metrics as TensorBoard events in this directory "
                    "(needs the tensorboard extra: pip install 'glm53_flash[tensorboard]')")
WANDB_HELP = "also log each step's metrics to this Weights & Biases project (needs wandb installed)"


@dataclass
class PretrainConfig:
    """Every knob of `glm53 pretrain`, declared once: each field is a flag (options.py) and is
    recorded in run.json and the receipt."""

    output: str = option(help="run directory (must not exist unless --resume)")
    steps: int = option(400, help="optimizer steps")
    checkpoints: tuple[int, ...] | None = option(
        None, help="comma-separated steps to checkpoint at; the last step always is",
        default_text="100,200,400, those within --steps")
    batch_size: int = option(32, help="global batch (split across ranks)")
    sequence_length: int | None = option(None, help="tokens per training sequence",
                                         default_text="128; 192 with --tasks compositions")
    learning_rate: float = option(3e-4, help="peak AdamW learning rate")
    seed: int = option(42, help="model initialisation seed")
    data_seed: int = option(42, help="seed of the pretraining stream (42 = the original's)")
    tasks: str = option("families", choices=SUITES, neutral=True,
                        help="task suite of the pretraining stream: families (the original's eight families and "
                             "stream) or compositions (the compositions suite's pretraining behaviours)")
    device: str = option(DEFAULT_DEVICE, help="where to train", choices=DEVICE_CHOICES)
    preset: str = option("flash", help="model preset", choices=tuple(sorted(PRESETS)))
    warmup: int = option(0, help="linear warmup steps")
    schedule: str = option("constant", help="learning-rate schedule after warmup", choices=SCHEDULES)
    min_lr_ratio: float = option(0.1, help="cosine schedule's floor, as a fraction of --learning-rate")
    weight_decay: float = option(0.1, help="AdamW weight decay, applied to weight matrices only")
    decay_all_parameters: bool = option(False, help="apply --weight-decay to every parameter, norm gains and "
                                                    "embeddings included (the original's optimiser)")
    grad_clip: float = option(1.0, help="clip the gradient's global norm to this")
    resume: bool = option(False, help="continue the run in --output from its last checkpoint; with a "
                                        "different --steps, extend (or shorten) it when its LR schedule allows")
    compile: bool = option(False, help="torch.compile the model (CUDA only; refused on the CPU)")
    eval_every: int = option(0, neutral=True, help="every N steps, the loss on held-out batches of the stream "
                                                   "(val_loss in metrics.jsonl, val/loss live); 0 = never")
    eval_batches: int = option(2, neutral=True, help="held-out batches (of --batch-size sequences) per validation")
    precision: str | None = option(None, neutral=True, choices=PRECISIONS, help=PRECISION_HELP,
                                   default_text="fp32 on the CPU, bf16 autocast on CUDA (what earlier runs did)")
    adapt_threads: bool = option(False, neutral=True,
                                 help="on the CPU, follow the free cores with the math threads after each step "
                                      "(fast beside another busy process; not bit-identical to a run without it)")
    quiet: bool = option(False, help=QUIET_HELP)
    tensorboard: str | None = option(None, help=TENSORBOARD_HELP, metavar="DIR")
    wandb: str | None = option(None, help=WANDB_HELP, metavar="PROJECT")
    # Flags of their own (--stream-mode, --linear-rope, --balance-loss, --balance-loss-weight): the
    # ModelConfig fields a run may override (commands/train.py MODEL_OVERRIDE_FIELDS).
    model_overrides: dict = option(help="ModelConfig fields that override the preset", flag=False, factory=dict)

    def __post_init__(self) -> None:
        if self.checkpoints is None:
            self.checkpoints = tuple(c for c in PRETRAIN_DEFAULT_CHECKPOINTS if c <= self.steps)
        self.checkpoints = tuple(self.checkpoints)
        if self.sequence_length is None:
            self.sequence_length = PRETRAIN_SEQUENCE_LENGTHS.get(self.tasks, 128)

    def validate(self, world_size: int = 1) -> None:
        if self.steps < 1:
            raise ValueError(f"--steps must be >= 1, got {self.steps}")
        bad = [c for c in self.checkpoints if c < 1 or c > self.steps]
        if bad:
            raise ValueError(f"--checkpoints {','.join(map(str, bad))} outside 1..{self.steps} (--steps)")
        if self.batch_size < 1 or self.sequence_length < 2:
            raise ValueError("--batch-size must be >= 1 and --sequence-length >= 2")
        if self.tasks not in SUITES:
            raise ValueError(f"--tasks {self.tasks!r}; allowed: {', '.join(SUITES)}")
        if self.batch_size % world_size:
            raise ValueError(f"--batch-size {self.batch_size} does not divide across {world_size} ranks")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"--schedule {self.schedule!r}; allowed: {', '.join(SCHEDULES)}")
        if self.warmup < 0 or not self.learning_rate > 0:
            raise ValueError("--warmup must be >= 0 and --learning-rate > 0")
        if self.eval_every < 0 or self.eval_batches < 1:
            raise ValueError("--eval-every must be >= 0 and --eval-batches >= 1")
        self.check_sizes(world_size)

    def check_sizes(self, world_size: int = 1, available: int | None = None) -> None:
        """The sizes a user gives against the model's context and the machine's memory, before anything
        is written: a sequence longer than the preset's context needs the context raised on purpose
        (model_overrides max_sequence_length), and a step whose estimated memory (ModelConfig.
        training_bytes, per rank) exceeds what the machine has free is refused."""
        preset = ModelConfig.preset(self.preset, **self.model_overrides)
        if self.sequence_length > preset.max_sequence_length:
            raise ValueError(f"--sequence-length {self.sequence_length} exceeds the {self.preset} model's context "
                             f"({preset.max_sequence_length} tokens); raise the context on purpose with the "
                             f"model override max_sequence_length={self.sequence_length}")
        needed = self.model_config().training_bytes(self.batch_size // world_size, self.sequence_length)
        available = available_memory_bytes() if available is None else available
        if available is not None and needed > available:
            raise ValueError(f"a training step of batch {self.batch_size} x {self.sequence_length} needs about "
                             f"{needed / 2**30:.1f} GiB, more than the {available / 2**30:.1f} GiB this machine has "
                             f"free; lower --batch-size or --sequence-length")

    def model_config(self) -> ModelConfig:
        base = ModelConfig.preset(self.preset, **self.model_overrides)
        # As in the original: the context is at least the training sequence length.
        return base.replace(max_sequence_length=max(base.max_sequence_length, self.sequence_length))

    def checkpoint_steps(self) -> list[int]:
        return sorted(set(self.checkpoints) | {self.steps})


RL_DEFAULT_CHECKPOINTS = (8, 16, 32)


@dataclass
class RLConfig:
    """Every knob of `glm53 rl`, declared once: each field is a flag (options.py) and is recorded in
    run.json and the receipt (`summary=True`: at the receipt's top level too). The defaults are our
    fixes; the switches that restore the original are named in each help text."""

    initial_checkpoint: str = option(help="pretraining checkpoint to start from", summary=True)
    output: str = option(help="run directory (must not exist unless --resume)")
    groups: int = option(32, help="prompts (one group of samples each)")
    checkpoints: tuple[int, ...] | None = option(
        None, help="groups to checkpoint after; the last always is", default_text="8,16,32 within --groups")
    group_size: int = option(4, help="samples per prompt (RLOO needs at least 2)", summary=True)
    max_new_tokens: int | None = option(None, help="completion length cap",
                                        default_text="48; 64 with --tasks compositions", summary=True)
    temperature: float = option(0.8, help="sampling temperature of the rollouts", summary=True)
    learning_rate: float = option(2e-5, help="AdamW learning rate", summary=True)
    train_scope: str = option("all", help="which parameters are trained", choices=TRAIN_SCOPES, summary=True)
    reward_mode: str = option("case-fraction", help="reward of a valid program", choices=REWARD_MODES, summary=True)
    invalid_penalty: float = option(-0.1, help="reward of an invalid or limit program", summary=True)
    exact_bonus: float = option(0.0, help="extra reward for passing every case", summary=True)
    tasks: str = option("families", choices=SUITES, neutral=True, summary=True,
                        help="task suite: families (the eight families' rl split) or compositions (compositions.rl: "
                             "one task per behaviour, seen structures with constants pretraining never showed)")
    families: str = option("", help="comma list of task families (compositions: int, str, list)", default_text="all")
    tasks_per_family: int | None = option(None, help="rl-split tasks per family (the families suite only)",
                                          default_text="4", summary=True)
    reward_cases: str = option("three", neutral=True, parse=parse_reward_cases, metavar="three|strong|sample-K",
                               summary=True,
                               help="the cases a rollout's reward is judged on: the task's three hidden cases (the "
                                    "original's), its whole strong set, or K cases drawn from the strong set for each "
                                    "group; every rollout that passes is also judged on the strong set (the receipt's "
                                    "reward hacking)")
    seed: int = option(31415, help="seed of the rollouts' random streams and the task order")
    device: str = option(DEFAULT_DEVICE, help="where to train", choices=DEVICE_CHOICES)
    preset: str | None = option(None, help="refuse a checkpoint whose model is not this preset",
                                choices=tuple(sorted(PRESETS)))
    logprob_source: str = option("sampler", choices=LOGPROB_SOURCES, summary=True,
                                 help="distribution of the gradient's log-probs; 'untempered' = untempered, "
                                      "unmasked (the original's mismatch)")
    loss_normalization: str = option("constant", choices=LOSS_NORMALIZATIONS, summary=True,
                                     help="how token losses are summed; 'sequence-mean' is the original's")
    eos_handling: str = option("append", choices=EOS_HANDLING, summary=True,
                               help="'append': train parse-stopped completions with EOS; 'omit': without "
                                    "(the original)")
    stop: str = option("parse", help="rollout stop rule ('parse' = the original's)", choices=RL_STOPS, summary=True)
    prompts_per_update: int | None = option(None, help="groups per optimizer step", summary=True,
                                            default_text="one per rank: 1, or the number of ranks under torchrun")
    kl_coef: float = option(0.0, help="KL penalty to the frozen initial policy", summary=True)
    warmup: int = option(0, help="linear LR warmup, in updates", summary=True)
    grad_clip: float = option(1.0, help="clip the gradient's global norm to this")
    verifier_workers: int | None = option(None, help="sandbox worker processes", default_text="one per CPU")
    precision: str | None = option(None, neutral=True, choices=PRECISIONS, help=PRECISION_HELP + " (rollouts and update)",
                                   default_text="fp32 on the CPU, bf16 autocast on CUDA (what earlier runs did)")
    adapt_threads: bool = option(False, neutral=True,
                                 help="on the CPU, follow the free cores with the math threads after each decode step "
                                      "and update (fast beside another busy process; not bit-identical to a run "
                                      "without it)")
    resume: bool = option(False, help="continue the run in --output from its last checkpoint")
    quiet: bool = option(False, help=QUIET_HELP)
    tensorboard: str | None = option(None, help=TENSORBOARD_HELP, metavar="DIR")
    wandb: str | None = option(None, help=WANDB_HELP, metavar="PROJECT")

    def __post_init__(self) -> None:
        if self.checkpoints is None:
            self.checkpoints = tuple(c for c in RL_DEFAULT_CHECKPOINTS if c <= self.groups)
        self.checkpoints = tuple(self.checkpoints)
        if self.tasks_per_family is None and self.tasks == "families":
            self.tasks_per_family = 4
        if self.max_new_tokens is None:
            self.max_new_tokens = MAX_NEW_TOKENS.get(self.tasks, 48)

    def resolve_prompts_per_update(self, world_size: int) -> None:
        """The default (None) is one group per rank: 1 in one process, the number of ranks under torchrun,
        so `torchrun ... rl` runs without the flag; a value given is kept (and checked against the ranks)."""
        if self.prompts_per_update is None:
            self.prompts_per_update = max(1, world_size)

    def validate(self) -> None:
        checks = [
            (self.groups >= 1, f"--groups must be >= 1, got {self.groups}"),
            (self.group_size >= 2, f"--group-size must be >= 2 (RLOO needs others to compare with), got {self.group_size}"),
            (self.max_new_tokens >= 1, "--max-new-tokens must be >= 1"),
            (self.temperature > 0, f"--temperature must be > 0, got {self.temperature}"),
            (self.learning_rate > 0, "--learning-rate must be > 0"),
            (self.tasks in SUITES, f"--tasks must be one of {', '.join(SUITES)}"),
            (self.tasks != "families" or (self.tasks_per_family or 0) >= 1, "--tasks-per-family must be >= 1"),
            (self.tasks == "families" or self.tasks_per_family is None,
             "--tasks-per-family applies only to --tasks families (a compositions split has one task per behaviour)"),
            (self.prompts_per_update is None or self.prompts_per_update >= 1, "--prompts-per-update must be >= 1"),
            (self.kl_coef >= 0 and self.warmup >= 0, "--kl-coef and --warmup must be >= 0"),
            (self.train_scope in TRAIN_SCOPES, f"--train-scope must be one of {', '.join(TRAIN_SCOPES)}"),
            (self.reward_mode in REWARD_MODES, f"--reward-mode must be one of {', '.join(REWARD_MODES)}"),
            (self.loss_normalization in LOSS_NORMALIZATIONS,
             f"--loss-normalization must be one of {', '.join(LOSS_NORMALIZATIONS)}"),
            (self.logprob_source in LOGPROB_SOURCES, f"--logprob-source must be one of {', '.join(LOGPROB_SOURCES)}"),
            (self.eos_handling in EOS_HANDLING, f"--eos-handling must be one of {', '.join(EOS_HANDLING)}"),
            (self.stop in RL_STOPS, f"--stop must be one of {', '.join(RL_STOPS)}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        bad = [c for c in self.checkpoints if c < 1 or c > self.groups]
        if bad:
            raise ValueError(f"--checkpoints {','.join(map(str, bad))} outside 1..{self.groups} (--groups)")
        off = [c for c in self.checkpoints if c % (self.prompts_per_update or 1) and c != self.groups]
        if off:
            raise ValueError(f"--checkpoints {','.join(map(str, off))} are not multiples of "
                             f"--prompts-per-update {self.prompts_per_update}")
        parse_families(self.families, self.tasks)
        reward_case_count(self.reward_cases)


@dataclass
class SelectConfig:
    """Every knob of `glm53 select`, declared once (options.py)."""

    run: str = option(help="run directory with checkpoint-NNNN folders")
    split: str = option("dev", help="held-out split to select on: dev, or compositions.dev for a run on that suite "
                                    "(sealed splits are never used to choose)",
                        choices=("dev", "compositions.dev"))
    samples: int = option(8, help="samples per task (1 = greedy)")
    per_family: int | None = option(None, help="tasks per family (a compositions split has one task per behaviour)",
                                    default_text="4 on dev")
    families: str | None = option(None, help="comma list of families", default_text="the run's families")
    temperature: float = option(SAMPLING_TEMPERATURE, help="sampling temperature (with --samples > 1)")
    max_new_tokens: int | None = option(None, help="completion length cap", default_text="48; 64 on compositions.dev")
    seed: int = option(SAMPLED_SEED, help="seed of the samples' random streams")
    stop: str = option("parse", help="stop rule ('parse' = the original's)", choices=EVAL_STOP_CHOICES)
    device: str = option(DEFAULT_DEVICE, help="where to evaluate", choices=DEVICE_CHOICES)
    precision: str | None = option(None, neutral=True, choices=PRECISIONS, help=PRECISION_HELP,
                                   default_text="fp32 on the CPU, bf16 autocast on CUDA (what earlier selections did)")
    output: str | None = option(None, help="selection receipt", default_text="RUN/selection-SPLIT.json")
    force: bool = option(False, help="replace an existing selection receipt")
    quiet: bool = option(False, help="no line per checkpoint; --no-progress is the same")


@dataclass
class ProgressConfig:
    """The progress flag every training command shares (the vision commands use only this one)."""

    quiet: bool = option(False, help=QUIET_HELP)


@dataclass
class LiveLoggingConfig(ProgressConfig):
    """The output flags of the studies (`glm53 experiment ...`); PretrainConfig and RLConfig carry the
    same three fields. Each study run logs under its own name (TensorBoard: DIR/<run key>)."""

    tensorboard: str | None = option(None, help=TENSORBOARD_HELP, metavar="DIR")
    wandb: str | None = option(None, help=WANDB_HELP, metavar="PROJECT")
