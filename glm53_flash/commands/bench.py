"""`glm53 bench ...`: every benchmark's CLI in one place. A bench's flags are the fields of its config
(benchmarks/config.py) and its command calls one library function with them, keyword for keyword (the
measurements live in benchmarks/ and verifier/bench.py). Each reports ratios measured on this machine in
one process, with a receipt."""

from __future__ import annotations

import dataclasses
import functools
import importlib
from dataclasses import dataclass

from glm53_flash.benchmarks.config import (
    ArchitectureBench, ContentionBench, DecodeBench, DecodeWeightsBench, LinearAttentionBench, ModelBench,
    PrecisionBench, ProfileBench, QuickstartBench, RLBench, ScalingBench, VerifyBench,
)
from glm53_flash.core.options import add_arguments, from_arguments


@dataclass(frozen=True)
class Bench:
    name: str  # glm53 bench NAME
    config: type  # its flags
    function: str  # "module:function" called with the config's fields, imported when it runs (torch loads then)
    help: str
    description: str


BENCHES = (
    Bench("model", ModelBench, "glm53_flash.benchmarks.model:run",
          help="training FLOP/s vs matmul peak, cached decode vs re-forward, peak memory",
          description="Time a preset's training step against the machine's measured matmul peak, its cached decode "
                      "step against re-running the whole prefix, and its peak memory; writes a JSON receipt."),
    Bench("architecture", ArchitectureBench, "glm53_flash.benchmarks.architecture:run",
          help="loss after a short pretraining run for each variant of the original's flaws",
          description="Pretrain each variant (the original's switches one at a time, and our defaults) for a few "
                      "steps from the same seeds and compare the final losses, paired by seed; writes a JSON "
                      "receipt."),
    Bench("decode", DecodeBench, "glm53_flash.benchmarks.decode:run",
          help="batched cached sampling vs the original's per-task re-forward; 64x8 eval timing",
          description="Rollouts/s of glm53_flash.evaluation.sampling against the original's generation (one task at "
                      "a time, a full forward over the whole sequence per token, no cache) on the flash model with "
                      "seeded random weights; then the wall time of a sampled evaluation (dev, 8 per family x 8 "
                      "samples; the original timed confirm, which is sealed here). Random weights rarely stop "
                      "early, so both run (nearly) to the token cap."),
    Bench("decode-weights", DecodeWeightsBench, "glm53_flash.benchmarks.decode_weights:run",
          help="a cached decode step on float32 weights vs bf16 copies, each vs one read of them",
          description="On the CPU's C decode kernels: time a cached greedy decode step reading float32 weights and "
                      "the same step reading bf16 copies of the weight products' weights (what --precision bf16 "
                      "does to decoding), alternating --rounds times in one process, each against one read of the "
                      "bytes it reads; reports the medians, the speed-up per round and how often the two pick the "
                      "same token. Writes a JSON receipt."),
    Bench("linear-attention", LinearAttentionBench, "glm53_flash.benchmarks.linear_attention:run",
          help="a linear layer's forward + backward past its chunk: the C scan vs the torch chunks",
          description="Time a linear-attention layer's forward and backward over a sequence longer than its chunk "
                      "(the compositions suite's 192 positions by default) by the C scan training takes on the CPU "
                      "and by the chunked torch form, alternating --rounds times in one process at each preset's "
                      "shapes; reports the medians, the speed-up per round and the largest gap between the two. "
                      "Writes a JSON receipt."),
    Bench("scaling", ScalingBench, "glm53_flash.benchmarks.scaling:run",
          help="training and cached-decode step time vs length: hybrid vs every layer dense softmax",
          description="Step time against work for the hybrid preset and for the same model (same weights) with "
                      "every layer dense causal softmax attention (sparse_every=1, window = the whole context): "
                      "one forward + backward per sequence length, and one cached single-token decode step per "
                      "position. Writes a JSON receipt and a two-panel log-log chart with the crossover, if any."),
    Bench("contention", ContentionBench, "glm53_flash.benchmarks.contention:measure",
          help="training and decode steps quiet and beside a busy process, fixed and adaptive threads",
          description="Time the training step and a run of cached decode steps on the CPU: quiet, then beside one "
                      "CPU-bound process this benchmark starts (its own session, bounded in time, killed after), "
                      "each with the thread count fixed and with --adapt-threads' governor; the ratios come from "
                      "one process. Writes a JSON receipt."),
    Bench("precision", PrecisionBench, "glm53_flash.benchmarks.precision:run",
          help="the same pretraining in fp32 and bf16: loss curves, their difference, step times",
          description="Pretrain one preset from the same weights on the same batches in fp32 and in bf16, a step of "
                      "each in turn in one process; reports both loss curves, the largest difference of their "
                      "10-step means against the stated tolerance, and the median step times. A third run, in fp32 "
                      "from another seed, is the yardstick: the bf16 gap is set beside the gap between two seeds. "
                      "Writes a JSON receipt."),
    Bench("profile", ProfileBench, "glm53_flash.benchmarks.profile:run",
          help="where a training step's time goes in fp32 and bf16: torch's profiler, grouped",
          description="Warm up, then run the bench model training step in fp32 and bf16, alternating: unprofiled, "
                      "then under torch's CPU profiler. Each operator's self time goes to a group (matrix products, "
                      "our C kernels, casts and copies, optimizer, autograd bookkeeping, other operators; what no "
                      "operator covers is 'outside operators'); prints each group's seconds and share per step and "
                      "the top operators, and writes a JSON receipt with the rules. On the CPU only."),
    Bench("rl", RLBench, "glm53_flash.benchmarks.rl:run",
          help="the headline's RL stage from one checkpoint in fp32 and bf16: wall, rollout and update seconds",
          description="Run the headline plan's RL stage (its first seed, 96 groups x 16 samples) from one "
                      "pretrained checkpoint in fp32 and in bf16, alternating, --rounds times each, in one process; "
                      "reports the median wall, rollout and update seconds, the bf16 speed-up and what each run "
                      "learned. Writes a JSON receipt. With --busy, fp32 quiet and beside a busy process, threads "
                      "fixed and adaptive. On the CPU only."),
    Bench("quickstart", QuickstartBench, "glm53_flash.benchmarks.quickstart:run",
          help="the README's first run, each command timed in its own process, and the dev pass rate before and "
               "after RL",
          description="Run the first run (benchmarks/quickstart.py FIRST_RUN, what the README shows) in a scratch "
                      "directory, each command in a fresh process as a user runs it; write a receipt with the "
                      "seconds of each command, the dev tasks solved before and after RL and this machine's CPU."),
    Bench("verify", VerifyBench, "glm53_flash.verifier.bench:run",
          help="isolated verifier throughput on a realistic mix, against the unsafe in-process evaluator",
          description="Candidates per second of the sandboxed Verifier on a seeded mix of passing, failing, "
                      "invalid and memory-limit programs, against the unsafe in-process evaluator. Prints a table "
                      "and writes a JSON receipt."),
)


def register(bench_sub) -> None:
    for bench in BENCHES:
        parser = bench_sub.add_parser(bench.name, help=bench.help, description=bench.description)
        add_arguments(parser, bench.config)
        parser.set_defaults(func=functools.partial(run_bench, bench))


def library_function(bench: Bench):
    module, name = bench.function.split(":")
    return getattr(importlib.import_module(module), name)


def run_bench(bench: Bench, args) -> int:
    library_function(bench)(**dataclasses.asdict(from_arguments(bench.config, args)))
    return 0
