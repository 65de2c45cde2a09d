"""`glm53 bench rl`: the headline's RL stage (`glm53 reproduce`'s plan: 96 groups x 16 samples, one group
per update) timed from one pretrained checkpoint in each precision, the runs interleaved in one process
(fp32, bf16, fp32, bf16, ...), each a whole `train_rl` into a directory of its own. Per run: the wall
time, and from its metrics the seconds of rollouts (sampling and the verifier) and of updates, the
updates split into the log-probs' forwards and the backward with the AdamW step, the positions those
forwards computed and the share of them that was padding (train.completion_logits.forward_positions),
with what it learned (updated groups, passing rollouts), so a faster precision that learns something
else shows as such.

With `busy`, the same stage in fp32 instead: quiet, then beside one CPU-bound process this bench starts
(`bench contention`'s competitor, killed when the run ends) with the thread count fixed and with
`--adapt-threads`' governor, in turn."""

from __future__ import annotations

import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

from glm53_flash.core.receipts import provenance, read_jsonl, write_json
from glm53_flash.benchmarks.common import bench_precisions, print_table

# name -> (precision, beside a busy process, adaptive threads)
CONDITIONS = {"fp32": ("fp32", False, False), "bf16": ("bf16", False, False)}
BUSY_CONDITIONS = {"quiet": ("fp32", False, False), "busy_fixed": ("fp32", True, False),
                   "busy_adaptive": ("fp32", True, True)}


def headline_rl(checkpoint: str, output: str, precision: str, groups: int | None = None,
                adapt_threads: bool = False):
    """The headline plan's RL stage (ours arm, its first seed) from `checkpoint`, as an RLConfig."""
    from glm53_flash.experiments.reproduce import PLANS, arm_plan

    plan = arm_plan(PLANS["headline"], "ours")
    cfg = dataclasses.replace(plan.rl, initial_checkpoint=str(checkpoint), output=str(output), seed=plan.rl_seeds[0],
                              device="cpu", quiet=True, precision=precision, adapt_threads=adapt_threads)
    if groups is not None:
        cfg = dataclasses.replace(cfg, groups=groups, checkpoints=tuple(c for c in cfg.checkpoints if c <= groups))
    return cfg


def _one(cfg) -> dict:
    from glm53_flash.train.rl_run import train_rl
    from glm53_flash.train.rl_run import METRICS_FILE

    start = time.perf_counter()
    receipt = train_rl(cfg)
    seconds = time.perf_counter() - start
    rows = read_jsonl(Path(cfg.output) / METRICS_FILE)
    rollout = sum(r["rollout_seconds"] for r in rows)
    positions = sum(r["update_positions"] for r in rows)
    return {"precision": receipt["precision"], "wall_seconds": seconds, "elapsed_seconds": receipt["elapsed_seconds"],
            "rollout_seconds": rollout, "update_seconds": sum(r["seconds"] for r in rows) - rollout,
            "update_forward_seconds": sum(r["update_forward_seconds"] for r in rows),
            "update_step_seconds": sum(r["update_step_seconds"] for r in rows),
            "update_positions": positions,
            "update_padding_fraction": sum(r["update_padding_positions"] for r in rows) / max(1, positions),
            "updated_groups": receipt["updated_groups"],
            "exact_training_rollouts": receipt["exact_training_rollouts"],
            "final_weights_sha256": receipt["checkpoints"][-1]["weights_sha256"]}


def _ratio(numerator: float, denominator: float) -> float | None:
    """numerator / denominator, None where there is nothing to divide by (a run whose groups all lacked
    signal spends no time in the updates' forwards)."""
    return numerator / denominator if denominator > 0 else None


def _times(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:.2f}x"


def run(checkpoint: str, rounds: int = 2, groups: int | None = None, output: str | None = None,
        busy: bool = False, precisions: str = "auto") -> dict:
    from contextlib import nullcontext

    import torch

    from glm53_flash.benchmarks.contention import COMPETITOR_SECONDS, competitor

    if rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {rounds}")
    if not Path(checkpoint).is_dir():
        raise FileNotFoundError(f"--checkpoint {checkpoint} is not a checkpoint directory")
    if busy and precisions != "auto":
        raise ValueError("--busy times fp32 alone (quiet and beside a busy process); leave --precisions out")
    chosen = None if busy else bench_precisions(precisions, "cpu")
    conditions = BUSY_CONDITIONS if busy else {name: CONDITIONS[name] for name in chosen["names"]}
    runs: dict[str, list[dict]] = {name: [] for name in conditions}
    config = None
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory(prefix="glm53-bench-rl-") as scratch:
        for round_index in range(rounds):
            for name, (precision, beside, adapt) in conditions.items():
                cfg = headline_rl(checkpoint, Path(scratch) / f"{name}-{round_index}", precision, groups, adapt)
                config = config or {k: v for k, v in dataclasses.asdict(cfg).items()
                                    if k not in ("output", "precision", "initial_checkpoint", "adapt_threads")}
                torch.set_num_threads(threads)
                with competitor(COMPETITOR_SECONDS) if beside else nullcontext():
                    runs[name].append(_one(cfg))
                last = runs[name][-1]
                print(f"[bench rl {time.strftime('%H:%M:%S')}] round {round_index + 1}/{rounds} {name}: "
                      f"{last['wall_seconds']:.1f} s (rollouts {last['rollout_seconds']:.1f} s, updates "
                      f"{last['update_seconds']:.1f} s: forwards {last['update_forward_seconds']:.1f} s, backward "
                      f"and step {last['update_step_seconds']:.1f} s), {last['exact_training_rollouts']} passing "
                      f"rollouts", file=sys.stderr, flush=True)
    times = ("wall_seconds", "rollout_seconds", "update_seconds", "update_forward_seconds", "update_step_seconds")
    keys = times + ("update_padding_fraction",)
    median = {name: {key: statistics.median(r[key] for r in rows) for key in keys} for name, rows in runs.items()}
    result = {
        "benchmark": "rl", "checkpoint": str(checkpoint), "rounds": rounds, "config": config, "busy": busy,
        "precisions": chosen,
        "threads": threads, "conditions": {name: {"precision": c[0], "beside_a_busy_process": c[1],
                                                   "adapt_threads": c[2]} for name, c in conditions.items()},
        "runs": runs, "median": median,
    }
    rows = [(f"{name}: wall, rollouts, updates (median of {rounds})",
             f"{m['wall_seconds']:.1f} s, {m['rollout_seconds']:.1f} s, {m['update_seconds']:.1f} s")
            for name, m in median.items()]
    rows += [(f"{name}: updates' forwards, backward and step; padding",
              f"{m['update_forward_seconds']:.1f} s, {m['update_step_seconds']:.1f} s; "
              f"{100 * m['update_padding_fraction']:.1f}% of the positions")
             for name, m in median.items()]
    if busy:
        result["slowdown"] = {name: {key: _ratio(median[name][key], median["quiet"][key]) for key in times}
                              for name in ("busy_fixed", "busy_adaptive")}
        for name, ratio in result["slowdown"].items():
            rows.append((f"{name} / quiet: wall, rollouts, updates",
                         ", ".join(_times(ratio[key]) for key in ("wall_seconds", "rollout_seconds", "update_seconds"))))
    else:
        for name, repeats in runs.items():
            result[f"{name}_repeats_bit_identical"] = len({r["final_weights_sha256"] for r in repeats}) == 1
        if set(runs) == {"fp32", "bf16"}:
            result["bf16_speedup"] = {key: _ratio(median["fp32"][key], median["bf16"][key]) for key in times}
            speed = result["bf16_speedup"]
            rows.append(("bf16 speed-up: wall, rollouts, updates",
                         ", ".join(_times(speed[key]) for key in ("wall_seconds", "rollout_seconds", "update_seconds"))))
        elif "bf16" not in runs:
            rows.append(("bf16", chosen["reason"]))
    rows.append(("passing rollouts per run", ", ".join(f"{name} {[r['exact_training_rollouts'] for r in rs]}"
                                                        for name, rs in runs.items())))
    result["provenance"] = provenance(device="cpu")
    print_table(rows, title=f"glm53 bench rl  groups={config['groups']} x {config['group_size']}  rounds={rounds}"
                            f"{'  busy' if busy else ''}")
    if output:
        write_json(output, result)
        print(f"wrote {output}")
    return result
