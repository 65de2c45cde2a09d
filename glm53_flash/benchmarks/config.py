"""The settings of every `glm53 bench NAME`, declared once (options.py): each field is a flag of the bench
and a keyword of the library function it runs (commands/bench.py BENCHES), under the same name. No torch
here, so `glm53 --help` stays fast."""

from __future__ import annotations

from dataclasses import dataclass

from glm53_flash.core.argtypes import comma_names
from glm53_flash.core.options import option
from glm53_flash.core.runtime import BENCH_PRECISIONS_HELP, DEFAULT_DEVICE, DEVICE_CHOICES, PRECISION_HELP, PRECISIONS
from glm53_flash.evaluation.config import SAMPLING_TEMPERATURE
from glm53_flash.model.config import PRESETS
from glm53_flash.verifier.sandbox import CandidateLimits

PRESET_CHOICES = tuple(sorted(PRESETS))
THREADS_HELP = "torch CPU threads"


def receipt_path(default: str):
    return option(default, help="JSON receipt path")


def device_option():
    return option(DEFAULT_DEVICE, help="where to run", choices=DEVICE_CHOICES)


@dataclass
class TrainingStep:
    """The training step a bench times: the model preset and one batch's shape."""

    preset: str = option("flash", help="model preset", choices=PRESET_CHOICES)
    batch_size: int = option(32, help="sequences per training step")
    sequence_length: int = option(128, help="tokens per training sequence")


@dataclass
class ModelBench(TrainingStep):
    """`glm53 bench model`."""

    device: str = device_option()
    steps: int = option(5, help="timed training steps (the minimum is reported)")
    decode_batch: int = option(16, help="rows decoded together")
    prompt_length: int = option(64, help="prompt tokens before the decode steps")
    decode_length: int | None = option(None, help="total length to decode to",
                                       default_text="the preset's max_sequence_length")
    reforward_every: int = option(1, help="time the re-forward baseline at every N-th length and interpolate "
                                          "(1 = all)")
    precision_rounds: int = option(5, help="rounds of the fp32 and bf16 GEMM peaks and one fp32 and one bf16 "
                                           "training step, interleaved (0 = skip the precision comparison)")
    precisions: str = option("auto", help=BENCH_PRECISIONS_HELP + "; without bf16 the precision comparison is "
                                                                 "skipped")
    output: str = receipt_path("runs/bench/model.json")


@dataclass
class ArchitectureBench:
    """`glm53 bench architecture`."""

    preset: str = option("flash", help="model preset", choices=PRESET_CHOICES)
    steps: int = option(60, help="pretraining steps of each run")
    batch_size: int = option(16, help="sequences per training step")
    seeds: tuple[int, ...] = option((1,), help="comma-separated initialisation seeds (paired across variants)")
    variants: tuple[str, ...] = option((), help="comma-separated subset of the variants", parse=comma_names,
                                       default_text="all")
    device: str = device_option()
    output: str = receipt_path("runs/bench/architecture.json")


@dataclass
class DecodeBench:
    """`glm53 bench decode`."""

    device: str = device_option()
    preset: str = option("flash", help="model preset")
    per_family: int = option(3, help="dev tasks per family; 3 is 24 tasks")
    samples: int = option(16, help="samples per task")
    max_new_tokens: int = option(48, help="cap on generated tokens")
    temperature: float = option(SAMPLING_TEMPERATURE, help="sampling temperature")
    baseline_tasks: int | None = option(None, help="time the slow baseline on this many tasks and scale",
                                        default_text="2 on the CPU, all on a GPU")
    eval_per_family: int = option(8, help="tasks per family for the eval timing; 0 skips it")
    eval_samples: int = option(8, help="samples per task for the eval timing")
    threads: int | None = option(None, help=THREADS_HELP, default_text="torch's choice")
    output: str = receipt_path("runs/bench/decode.json")


@dataclass
class DecodeWeightsBench:
    """`glm53 bench decode-weights`."""

    preset: str = option("flash", help="model preset", choices=PRESET_CHOICES)
    batch: int = option(16, help="rows decoded together; 16 is an RL group")
    prompt_length: int = option(64, help="prompt tokens before the timed steps")
    steps: int = option(48, help="decode steps timed per run")
    rounds: int = option(5, help="runs per weight type, interleaved (median reported)")
    output: str = receipt_path("runs/bench/decode-weights.json")


@dataclass
class LinearAttentionBench:
    """`glm53 bench linear-attention`."""

    presets: tuple[str, ...] = option(("study", "flash"), parse=comma_names,
                                      help="comma-separated presets whose layer shapes are timed")
    batch: int = option(32, help="sequences; 32 is a pretraining batch")
    steps: int = option(192, help="positions; 192 is the compositions suite's length")
    rounds: int = option(7, help="runs per form, interleaved (median reported)")
    threads: int | None = option(None, help=THREADS_HELP, default_text="torch's choice")
    rope: bool = option(False, help="rotate q and k first (the faithful arm's order)")
    step: bool = option(False, help="also time each preset's whole pretraining step with the scan and with the "
                                    "chunks")
    output: str = receipt_path("runs/bench/linear-attention.json")


@dataclass
class ScalingBench:
    """`glm53 bench scaling`."""

    preset: str = option("flash", help="model preset", choices=PRESET_CHOICES)
    device: str = device_option()
    batch_size: int = option(4, help="training batch")
    sequence_lengths: tuple[int, ...] = option((128, 256, 512, 1024), help="comma-separated training lengths")
    decode_batch: int = option(4, help="decode batch")
    positions: tuple[int, ...] = option((64, 256, 1024, 2048, 4096),
                                        help="comma-separated cache positions to time a decode step at")
    repeats: int = option(3, help="timing rounds for training; each times every length and variant once")
    warmup: int = option(1, help="untimed steps before each measurement")
    decode_repeats: int = option(10, help="timing rounds for decode; each times every position and variant once")
    prefill_chunk: int = option(512, help="tokens per prefill call when filling the cache")
    threads: int | None = option(None, help=THREADS_HELP, default_text="torch's choice")
    output: str = receipt_path("runs/bench/scaling.json")
    chart: str | None = option(None, help="PNG chart path", default_text="the receipt's path with .png")


@dataclass
class ContentionBench(TrainingStep):
    """`glm53 bench contention`: the quiet and busy steps, or one of two other measurements (--spin-counts,
    --mid-run)."""

    steps: int = option(3, help="timed steps per condition (the median is reported)")
    decode_batch: int = option(16, help="rows decoded together")
    decode_tokens: int = option(16, help="decode steps timed together")
    precision: str | None = option(None, help=PRECISION_HELP, choices=PRECISIONS, default_text="fp32 on the CPU")
    spin_counts: str | None = option(None, help="comma-separated OpenMP spin counts (e.g. 300000,1000: libgomp's "
                                                "default, then glm53's): the whole measurement once per count in a "
                                                "child process with GOMP_SPINCOUNT set, --rounds times in "
                                                "alternating order, ratios paired against the first count")
    rounds: int = option(2, help="with --spin-counts: rounds of children")
    mid_run: int | None = option(None, metavar="STEPS",
                                 help="instead: a pretraining run of STEPS steps in a child process, quiet, then with "
                                      "the busy process started after --busy-after steps, going on with libgomp's "
                                      "long spins and restarting with short ones; whole-run times and whether all "
                                      "end on the same weights")
    busy_after: int = option(3, help="with --mid-run: steps before the busy process")
    checkpoint_every: int = option(4, help="with --mid-run: steps between checkpoints")
    output: str = receipt_path("runs/bench/contention.json")


@dataclass
class PrecisionBench(TrainingStep):
    """`glm53 bench precision`."""

    device: str = device_option()
    steps: int = option(100, help="pretraining steps of each run")
    seed: int = option(42, help="initialisation seed (the fp32 and the bf16 run)")
    baseline_seed: int | None = option(None, help="initialisation seed of the third run, in fp32: the seed spread "
                                                  "the bf16 gap is judged against", default_text="--seed + 1")
    output: str = receipt_path("runs/bench/precision.json")


@dataclass
class ProfileBench(TrainingStep):
    """`glm53 bench profile`."""

    steps: int = option(3, help="profiled steps per precision (as many unprofiled)")
    warmup: int = option(12, help="untimed steps per precision first (bf16 builds kernels per new shape)")
    precisions: str = option("auto", help=BENCH_PRECISIONS_HELP)
    output: str = receipt_path("runs/bench/profile.json")


@dataclass
class RLBench:
    """`glm53 bench rl`."""

    checkpoint: str = option(help="a pretrained checkpoint directory of the flash preset")
    rounds: int = option(2, help="runs per precision (the median is reported)")
    groups: int | None = option(None, help="groups of the plan's RL stage to run (fewer: a quick look)",
                                default_text="the plan's 96")
    busy: bool = option(False, help="in fp32: quiet, then beside one CPU-bound process this bench starts, with the "
                                    "thread count fixed and with --adapt-threads (instead of fp32 against bf16)")
    precisions: str = option("auto", help=BENCH_PRECISIONS_HELP + " (not with --busy: fp32)")
    output: str = receipt_path("runs/bench/rl.json")


@dataclass
class QuickstartBench:
    """`glm53 bench quickstart`."""

    output: str = receipt_path("runs/bench/quickstart.json")


@dataclass
class VerifyBench(CandidateLimits):
    """`glm53 bench verify`: the mix, the timing and each candidate's limits."""

    count: int = option(3000, help="candidates in the mix")
    workers: int = option(2, help="sandbox worker processes")
    seed: int = option(0, help="seed of the mix")
    time_limit_cases: int = option(4, help="extra CPU-bound candidates timed apart (each costs its CPU limit)")
    repeats: int = option(3, help="timed runs of each evaluator; the best is reported")
    output: str = option("runs/bench/verify.json", help="receipt path")


__all__ = ["ArchitectureBench", "ContentionBench", "DecodeBench", "DecodeWeightsBench", "LinearAttentionBench",
           "ModelBench", "PrecisionBench", "ProfileBench", "QuickstartBench", "RLBench", "ScalingBench",
           "TrainingStep", "VerifyBench"]
