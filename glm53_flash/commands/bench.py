"""`glm53 bench ...`: every benchmark's CLI in one place (the measurements live in benchmarks/ and
verifier/bench.py). Each reports ratios measured on this machine in one process, with a receipt."""

from __future__ import annotations

import argparse
from pathlib import Path

from glm53_flash.model.config import PRESETS
from glm53_flash.core.argtypes import parse_int_list
from glm53_flash.core.runtime import BENCH_PRECISIONS_HELP, DEFAULT_DEVICE, DEVICE_CHOICES, PRECISION_HELP, PRECISIONS
from glm53_flash.evaluation.config import SAMPLING_TEMPERATURE
from glm53_flash.commands.verify import add_limit_flags

DEFAULT_BENCH_OUTPUT = Path("runs/bench/verify.json")


def register(bench_sub) -> None:
    _add_model_and_architecture(bench_sub)
    _add_bench_decode(bench_sub)
    _add_bench_decode_weights(bench_sub)
    _add_bench_linear_attention(bench_sub)
    _add_bench_scaling(bench_sub)
    _add_bench_contention(bench_sub)
    _add_bench_precision(bench_sub)
    _add_bench_profile(bench_sub)
    _add_bench_rl(bench_sub)
    _add_bench_quickstart(bench_sub)
    add_bench_verify_parser(bench_sub)


def _add_bench_quickstart(bench_sub) -> None:
    parser = bench_sub.add_parser(
        "quickstart", help="the README's first run, each command timed in its own process, and the dev pass rate "
                           "before and after RL",
        description="Run the first run (benchmarks/quickstart.py FIRST_RUN, what the README shows) in a scratch "
                    "directory, each command in a fresh process as a user runs it; write a receipt with the seconds "
                    "of each command, the dev tasks solved before and after RL and this machine's CPU.")
    parser.add_argument("--output", default="runs/bench/quickstart.json", help="JSON receipt path")
    parser.set_defaults(func=_run_bench_quickstart)


def _run_bench_quickstart(args) -> int:
    from glm53_flash.benchmarks.quickstart import run

    receipt = run(args.output)
    dev = receipt["dev"]
    print(f"dev: {dev['before']} of {dev['tasks']} tasks before RL, {dev['after']} after; receipt {args.output}")
    return 0


def _add_bench_rl(bench_sub) -> None:
    parser = bench_sub.add_parser(
        "rl", help="the headline's RL stage from one checkpoint in fp32 and bf16: wall, rollout and update seconds",
        description="Run the headline plan's RL stage (its first seed, 96 groups x 16 samples) from one pretrained "
                    "checkpoint in fp32 and in bf16, alternating, --rounds times each, in one process; reports the "
                    "median wall, rollout and update seconds, the bf16 speed-up and what each run learned. Writes a "
                    "JSON receipt. With --busy, fp32 quiet and beside a busy process, threads fixed and adaptive. On "
                    "the CPU only.")
    parser.add_argument("--checkpoint", required=True, help="a pretrained checkpoint directory of the flash preset")
    parser.add_argument("--rounds", type=int, default=2, help="runs per precision (the median is reported)")
    parser.add_argument("--groups", type=int, default=None, help="fewer groups than the plan's 96 (a quick look)")
    parser.add_argument("--busy", action="store_true",
                        help="in fp32: quiet, then beside one CPU-bound process this bench starts, with the thread "
                             "count fixed and with --adapt-threads (instead of fp32 against bf16)")
    parser.add_argument("--precisions", default="auto", help=BENCH_PRECISIONS_HELP + " (not with --busy: fp32)")
    parser.add_argument("--output", default="runs/bench/rl.json", help="JSON receipt path")
    parser.set_defaults(func=_run_bench_rl)


def _run_bench_rl(args) -> int:
    from glm53_flash.benchmarks.rl import run

    run(args.checkpoint, rounds=args.rounds, groups=args.groups, output=args.output, busy=args.busy,
        precisions=args.precisions)
    return 0


def add_training_step_arguments(parser) -> None:
    """The training step a bench times: the model preset and one batch's shape."""
    parser.add_argument("--preset", choices=sorted(PRESETS), default="flash")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sequence-length", type=int, default=128)


def _add_bench_profile(bench_sub) -> None:
    parser = bench_sub.add_parser(
        "profile", help="where a training step's time goes in fp32 and bf16: torch's profiler, grouped",
        description="Warm up, then run the bench model training step in fp32 and bf16, alternating: unprofiled, then "
                    "under torch's CPU profiler. Each operator's self time goes to a group (matrix products, our C "
                    "kernels, casts and copies, optimizer, autograd bookkeeping, other operators; what no operator "
                    "covers is 'outside operators'); prints each group's seconds and share per step and the top "
                    "operators, and writes a JSON receipt with the rules. On the CPU only.")
    add_training_step_arguments(parser)
    parser.add_argument("--steps", type=int, default=3, help="profiled steps per precision (as many unprofiled)")
    parser.add_argument("--warmup", type=int, default=12,
                        help="untimed steps per precision first (bf16 builds kernels per new shape)")
    parser.add_argument("--precisions", default="auto", help=BENCH_PRECISIONS_HELP)
    parser.add_argument("--output", default="runs/bench/profile.json", help="JSON receipt path")
    parser.set_defaults(func=_run_bench_profile)


def _run_bench_profile(args) -> int:
    from glm53_flash.benchmarks.profile import run

    run(preset=args.preset, batch_size=args.batch_size, seq_len=args.sequence_length, steps=args.steps,
        warmup=args.warmup, output=args.output, precisions=args.precisions)
    return 0


def _add_bench_precision(bench_sub) -> None:
    parser = bench_sub.add_parser(
        "precision", help="the same pretraining in fp32 and bf16: loss curves, their difference, step times",
        description="Pretrain one preset from the same weights on the same batches in fp32 and in bf16, a step of "
                    "each in turn in one process; reports both loss curves, the largest difference of their "
                    "10-step means against the stated tolerance, and the median step times. A third run, in fp32 from "
                    "another seed, is the yardstick: the bf16 gap is set beside the gap between two seeds. Writes a "
                    "JSON receipt.")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="flash")
    parser.add_argument("--device", choices=DEVICE_CHOICES, default=DEFAULT_DEVICE)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--seed", type=int, default=42, help="initialisation seed (the fp32 and the bf16 run)")
    parser.add_argument("--baseline-seed", type=int, default=None,
                        help="initialisation seed of the third run, in fp32: the seed spread the bf16 gap is "
                             "judged against (default --seed + 1)")
    parser.add_argument("--output", default="runs/bench/precision.json", help="JSON receipt path")
    parser.set_defaults(func=_run_bench_precision)


def _run_bench_precision(args) -> int:
    from glm53_flash.benchmarks.precision import run

    run(preset=args.preset, device_name=args.device, steps=args.steps, batch_size=args.batch_size,
        seq_len=args.sequence_length, seed=args.seed, baseline_seed=args.baseline_seed, output=args.output)
    return 0


def _add_bench_contention(bench_sub) -> None:
    parser = bench_sub.add_parser(
        "contention", help="training and decode steps quiet and beside a busy process, fixed and adaptive threads",
        description="Time the training step and a run of cached decode steps on the CPU: quiet, then beside one "
                    "CPU-bound process this benchmark starts (its own session, bounded in time, killed after), "
                    "each with the thread count fixed and with --adapt-threads' governor; the ratios come from "
                    "one process. Writes a JSON receipt.")
    add_training_step_arguments(parser)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per condition (the median is reported)")
    parser.add_argument("--decode-batch", type=int, default=16)
    parser.add_argument("--decode-tokens", type=int, default=16, help="decode steps timed together")
    parser.add_argument("--precision", choices=PRECISIONS, default=None,
                        help=PRECISION_HELP + " (default: fp32 on the CPU)")
    parser.add_argument("--spin-counts", default=None,
                        help="comma-separated OpenMP spin counts (e.g. 300000,1000: libgomp's default, then "
                             "glm53's): the whole measurement once per count in a child process with "
                             "GOMP_SPINCOUNT set, --rounds times in alternating order, ratios paired against the "
                             "first count")
    parser.add_argument("--rounds", type=int, default=2, help="with --spin-counts: rounds of children")
    parser.add_argument("--mid-run", type=int, default=None, metavar="STEPS",
                        help="instead: a pretraining run of STEPS steps in a child process, quiet, then with the busy "
                             "process started after --busy-after steps, going on with libgomp's long spins and "
                             "restarting with short ones; whole-run times and whether all end on the same weights")
    parser.add_argument("--busy-after", type=int, default=3, help="with --mid-run: steps before the busy process")
    parser.add_argument("--checkpoint-every", type=int, default=4, help="with --mid-run: steps between checkpoints")
    parser.add_argument("--output", default="runs/bench/contention.json", help="JSON receipt path")
    parser.set_defaults(func=_run_bench_contention)


def _run_bench_contention(args) -> int:
    from glm53_flash.benchmarks.contention import compare_spin_counts, mid_run, run

    if args.mid_run is not None:
        if args.spin_counts is not None:
            raise ValueError("--mid-run and --spin-counts are two measurements: take one")
        mid_run(preset=args.preset, batch_size=args.batch_size, sequence_length=args.sequence_length,
                steps=args.mid_run, busy_after=args.busy_after, checkpoint_every=args.checkpoint_every,
                precision=args.precision, output=args.output)
        return 0
    if args.spin_counts is not None:
        try:
            counts = [int(part) for part in args.spin_counts.split(",")]
        except ValueError:
            raise ValueError(f"--spin-counts takes comma-separated whole numbers, got {args.spin_counts!r}") from None
        compare_spin_counts(counts, rounds=args.rounds, output=args.output, preset=args.preset,
                            batch_size=args.batch_size, sequence_length=args.sequence_length, steps=args.steps,
                            decode_batch=args.decode_batch, decode_tokens=args.decode_tokens,
                            precision=args.precision)
        return 0
    run(preset=args.preset, batch_size=args.batch_size, sequence_length=args.sequence_length, steps=args.steps,
        decode_batch=args.decode_batch, decode_tokens=args.decode_tokens, output=args.output,
        precision=args.precision)
    return 0


def _add_model_and_architecture(bench_sub) -> None:
    parser = bench_sub.add_parser(
        "model", help="training FLOP/s vs matmul peak, cached decode vs re-forward, peak memory",
        description="Time a preset's training step against the machine's measured matmul peak, its cached decode "
                    "step against re-running the whole prefix, and its peak memory; writes a JSON receipt.")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="flash")
    parser.add_argument("--device", choices=DEVICE_CHOICES, default=DEFAULT_DEVICE)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sequence-length", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5, help="timed training steps (the minimum is reported)")
    parser.add_argument("--decode-batch", type=int, default=16)
    parser.add_argument("--prompt-length", type=int, default=64)
    parser.add_argument("--decode-length", type=int, default=None,
                        help="total length to decode to (default: the preset's max_sequence_length)")
    parser.add_argument("--reforward-every", type=int, default=1,
                        help="time the re-forward baseline at every N-th length and interpolate (1 = all)")
    parser.add_argument("--precision-rounds", type=int, default=5,
                        help="rounds of the fp32 and bf16 GEMM peaks and one fp32 and one bf16 training step, "
                             "interleaved (0 = skip the precision comparison)")
    parser.add_argument("--precisions", default="auto",
                        help=BENCH_PRECISIONS_HELP + "; without bf16 the precision comparison is skipped")
    parser.add_argument("--output", default="runs/bench/model.json", help="JSON receipt path")
    parser.set_defaults(func=lambda a: _run_model(a))

    arch = bench_sub.add_parser(
        "architecture", help="loss after a short pretraining run for each variant of the original's flaws",
        description="Pretrain each variant (the original's switches one at a time, and our defaults) for a few "
                    "steps from the same seeds and compare the final losses, paired by seed; writes a JSON receipt.")
    arch.add_argument("--preset", choices=sorted(PRESETS), default="flash")
    arch.add_argument("--steps", type=int, default=60)
    arch.add_argument("--batch-size", type=int, default=16)
    arch.add_argument("--seeds", default="1", help="comma-separated initialisation seeds (paired across variants)")
    arch.add_argument("--variants", default="", help="comma-separated subset (default: all)")
    arch.add_argument("--device", choices=DEVICE_CHOICES, default=DEFAULT_DEVICE)
    arch.add_argument("--output", default="runs/bench/architecture.json", help="JSON receipt path")
    arch.set_defaults(func=_run_architecture)


def _run_model(a) -> int:
    from glm53_flash.benchmarks.model import run

    run(
        preset=a.preset, device_name=a.device, batch_size=a.batch_size, seq_len=a.sequence_length,
        steps=a.steps, decode_batch=a.decode_batch, prompt_len=a.prompt_length, decode_total=a.decode_length,
        reforward_every=a.reforward_every, output=a.output, precision_rounds=a.precision_rounds,
        precisions=a.precisions)
    return 0




def _run_architecture(a) -> int:
    from glm53_flash.benchmarks.architecture import VARIANTS, run

    variants = tuple(v for v in a.variants.split(",") if v) or tuple(VARIANTS)
    run(preset=a.preset, steps=a.steps, batch_size=a.batch_size,
        seeds=parse_int_list(a.seeds, "--seeds"), variants=variants, device=a.device, output=a.output)
    return 0


def _add_bench_decode_weights(bench_sub) -> None:
    parser = bench_sub.add_parser(
        "decode-weights", help="a cached decode step on float32 weights vs bf16 copies, each vs one read of them",
        description="On the CPU's C decode kernels: time a cached greedy decode step reading float32 weights and "
                    "the same step reading bf16 copies of the weight products' weights (what --precision bf16 does "
                    "to decoding), alternating --rounds times in one process, each against one read of the bytes it "
                    "reads; reports the medians, the speed-up per round and how often the two pick the same token. "
                    "Writes a JSON receipt.")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="flash")
    parser.add_argument("--batch", type=int, default=16, help="rows decoded together (default 16: an RL group)")
    parser.add_argument("--prompt-length", type=int, default=64)
    parser.add_argument("--steps", type=int, default=48, help="decode steps timed per run (default 48)")
    parser.add_argument("--rounds", type=int, default=5, help="runs per weight type, interleaved (median reported)")
    parser.add_argument("--output", default="runs/bench/decode-weights.json", help="JSON receipt path")
    parser.set_defaults(func=_run_bench_decode_weights)


def _run_bench_decode_weights(args) -> int:
    from glm53_flash.benchmarks.decode_weights import run

    run(preset=args.preset, batch=args.batch, prompt_len=args.prompt_length, steps=args.steps, rounds=args.rounds,
        output=args.output)
    return 0


def _add_bench_linear_attention(bench_sub) -> None:
    parser = bench_sub.add_parser(
        "linear-attention", help="a linear layer's forward + backward past its chunk: the C scan vs the torch chunks",
        description="Time a linear-attention layer's forward and backward over a sequence longer than its chunk (the "
                    "compositions suite's 192 positions by default) by the C scan training takes on the CPU and by "
                    "the chunked torch form, alternating --rounds times in one process at each preset's shapes; "
                    "reports the medians, the speed-up per round and the largest gap between the two. Writes a JSON "
                    "receipt.")
    parser.add_argument("--presets", default=",".join(("study", "flash")),
                        help="comma-separated presets whose layer shapes are timed (default: study,flash)")
    parser.add_argument("--batch", type=int, default=32, help="sequences (default 32: a pretraining batch)")
    parser.add_argument("--steps", type=int, default=192, help="positions (default 192: the compositions suite)")
    parser.add_argument("--rounds", type=int, default=7, help="runs per form, interleaved (median reported)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--rope", action="store_true", help="rotate q and k first (the faithful arm's order)")
    parser.add_argument("--step", action="store_true",
                        help="also time each preset's whole pretraining step with the scan and with the chunks")
    parser.add_argument("--output", default="runs/bench/linear-attention.json", help="JSON receipt path")
    parser.set_defaults(func=_run_bench_linear_attention)


def _run_bench_linear_attention(args) -> int:
    from glm53_flash.benchmarks.linear_attention import run

    presets = tuple(p for p in args.presets.split(",") if p)
    unknown = [p for p in presets if p not in PRESETS]
    if not presets or unknown:
        raise ValueError(f"--presets must name presets among {', '.join(sorted(PRESETS))}; got {args.presets!r}")
    run(presets=presets, batch=args.batch, steps=args.steps, rounds=args.rounds, threads=args.threads,
        rope=args.rope, step=args.step, output=args.output)
    return 0


def _add_bench_decode(bench_sub) -> None:
    parser = bench_sub.add_parser(
        "decode", help="batched cached sampling vs the original's per-task re-forward; 64x8 eval timing",
        description="Rollouts/s of glm53_flash.evaluation.sampling against the original's generation (one task at a time, "
                    "a full forward over the whole sequence per token, no cache) on the flash model with seeded "
                    "random weights; then the wall time of a sampled evaluation (dev, 8 per family x 8 "
                    "samples; the original timed confirm, which is sealed here). Random weights rarely stop early, so both run (nearly) to the token cap.")
    parser.add_argument("--device", choices=DEVICE_CHOICES, default=DEFAULT_DEVICE)
    parser.add_argument("--preset", default="flash", help="model preset (default flash)")
    parser.add_argument("--per-family", type=int, default=3, help="confirm tasks per family (default 3: 24 tasks)")
    parser.add_argument("--samples", type=int, default=16, help="samples per task (default 16)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=SAMPLING_TEMPERATURE)
    parser.add_argument("--baseline-tasks", type=int, default=None,
                        help="time the slow baseline on this many tasks and scale (default: 2 on CPU, all on GPU)")
    parser.add_argument("--eval-per-family", type=int, default=8,
                        help="tasks per family for the eval timing; 0 skips it (default 8)")
    parser.add_argument("--eval-samples", type=int, default=8, help="samples per task for the eval timing")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--output", default="runs/bench/decode.json", help="JSON receipt path")
    parser.set_defaults(func=_run_bench_decode)


def _run_bench_decode(args) -> int:
    from glm53_flash.benchmarks.decode import run

    run(device_name=args.device, preset=args.preset, per_family=args.per_family, samples=args.samples,
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, baseline_tasks=args.baseline_tasks,
        eval_per_family=args.eval_per_family, eval_samples=args.eval_samples, threads=args.threads,
        output=args.output)
    return 0


def _add_bench_scaling(bench_sub) -> None:
    parser = bench_sub.add_parser(
        "scaling", help="training and cached-decode step time vs length: hybrid vs every layer dense softmax",
        description="Step time against work for the hybrid preset and for the same model (same weights) with "
                    "every layer dense causal softmax attention (sparse_every=1, window = the whole context): "
                    "one forward + backward per sequence length, and one cached single-token decode step per "
                    "position. Writes a JSON receipt and a two-panel log-log chart with the crossover, if any.")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="flash")
    parser.add_argument("--device", choices=DEVICE_CHOICES, default=DEFAULT_DEVICE)
    parser.add_argument("--batch-size", type=int, default=4, help="training batch (default 4)")
    parser.add_argument("--sequence-lengths", default="128,256,512,1024",
                        help="comma-separated training lengths (default 128,256,512,1024)")
    parser.add_argument("--decode-batch", type=int, default=4, help="decode batch (default 4)")
    parser.add_argument("--positions", default="64,256,1024,2048,4096",
                        help="comma-separated cache positions to time a decode step at (default 64,256,1024,2048,4096)")
    parser.add_argument("--repeats", type=int, default=3, help="timing rounds for training; each times every length and variant once (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps before each measurement (default 1)")
    parser.add_argument("--decode-repeats", type=int, default=10,
                        help="timing rounds for decode; each times every position and variant once (default 10)")
    parser.add_argument("--prefill-chunk", type=int, default=512,
                        help="tokens per prefill call when filling the cache (default 512)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--output", default="runs/bench/scaling.json",
                        help="JSON receipt path (default runs/bench/scaling.json)")
    parser.add_argument("--chart", default=None, help="PNG chart path (default: the receipt's path with .png)")
    parser.set_defaults(func=_run_bench_scaling)


def _run_bench_scaling(args) -> int:
    from glm53_flash.benchmarks.scaling import run

    run(preset=args.preset, device_name=args.device, batch_size=args.batch_size,
        sequence_lengths=args.sequence_lengths, decode_batch=args.decode_batch, positions=args.positions,
        repeats=args.repeats, warmup=args.warmup, decode_repeats=args.decode_repeats,
        prefill_chunk=args.prefill_chunk, threads=args.threads, output=args.output, chart=args.chart)
    return 0


def add_bench_verify_parser(bench_subparsers) -> argparse.ArgumentParser:
    parser = bench_subparsers.add_parser(
        "verify",
        help="isolated verifier throughput on a realistic mix, against the unsafe in-process evaluator",
        description="Candidates per second of the sandboxed Verifier on a seeded mix of passing, failing, "
                    "invalid and memory-limit programs, against the unsafe in-process evaluator. Prints a "
                    "table and writes a JSON receipt.",
    )
    parser.add_argument("--count", type=int, default=3000, help="candidates in the mix (default 3000)")
    parser.add_argument("--workers", type=int, default=2, help="sandbox worker processes (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the mix (default 0)")
    parser.add_argument("--time-limit-cases", type=int, default=4,
                        help="extra CPU-bound candidates timed apart (default 4; each costs its CPU limit)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed runs of each evaluator; the best is reported (default 3)")
    parser.add_argument("--output", type=Path, default=DEFAULT_BENCH_OUTPUT,
                        help=f"receipt path (default {DEFAULT_BENCH_OUTPUT})")
    add_limit_flags(parser)
    parser.set_defaults(func=run_bench_verify_command)
    return parser


def run_bench_verify_command(args: argparse.Namespace) -> int:
    from glm53_flash.core.receipts import write_json
    from glm53_flash.verifier.bench import format_table, run_verify_benchmark

    for flag, value, least in (("--count", args.count, 1), ("--workers", args.workers, 1),
                               ("--repeats", args.repeats, 1), ("--time-limit-cases", args.time_limit_cases, 0)):
        if value < least:
            raise ValueError(f"{flag} must be >= {least}, got {value}")
    receipt = run_verify_benchmark(count=args.count, workers=args.workers, seed=args.seed,
                                   time_limit_cases=args.time_limit_cases, cpu_seconds=args.cpu_seconds,
                                   wall_seconds=args.wall_seconds, memory_mb=args.memory_mb, repeats=args.repeats)
    print(format_table(receipt))
    write_json(args.output, receipt)
    print(f"receipt: {args.output}")
    return 0
