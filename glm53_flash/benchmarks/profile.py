"""`glm53 bench profile`: where a training step's time goes, in each precision, from torch's profiler.

The same training step as `bench model` (`language_model_update` with `PRETRAINING`, one batch of the
task stream) is warmed up, then run `steps` times in fp32 and in bf16, alternating, under
`torch.profiler` (CPU activities). Every operator's self time (time in it and not in an operator it
called) is summed and put in one of a few groups by its name (`GROUPS`, first match wins: the rules are
in the receipt); our C kernels show as `glm53::<op>` because `library.labelled_calls()` names each call
while the profile runs. What no operator covers (Python between the operators, the profiler's own
bookkeeping) is the step's wall time minus the operators' self times: `outside operators`. The profiler
adds overhead, so the shares are what this bench can say; the unprofiled step times beside them say
how much the profile stretched the step.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from glm53_flash.benchmarks.common import bench_precisions, print_table, synchronize, timed_runs
from glm53_flash.core.receipts import provenance, write_json
from glm53_flash.core.runtime import resolve_device
from glm53_flash.model import GLM53Flash
from glm53_flash.model.config import ModelConfig
from glm53_flash.model.ops import library
from glm53_flash.model.precision import resolve_precision
from glm53_flash.train.engine import PRETRAINING, make_optimizer
from glm53_flash.train.objective import language_model_update

# (group, rule): an operator's name goes to the first group whose rule matches (exact names, or prefixes
# ending in '*'); every other operator is `other operators` (elementwise, reductions, indexing, views).
GROUPS = (
    ("matrix products", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addmv", "aten::mv",
                         "aten::dot", "aten::_grouped_mm", "aten::mkldnn_*", "mkldnn::*")),
    ("our C kernels", ("glm53::*",)),
    ("casts and copies", ("aten::to", "aten::_to_copy", "aten::copy_", "aten::clone", "aten::contiguous")),
    ("optimizer", ("Optimizer.*", "aten::_foreach_*", "aten::_fused_adamw*")),
    ("autograd bookkeeping", ("autograd::*", "*Backward*")),
)
OTHER = "other operators"
OUTSIDE = "outside operators"
TOP = 15


def group_of(name: str) -> str:
    for group, rules in GROUPS:
        for rule in rules:
            if rule.startswith("*") and rule.endswith("*"):
                if rule[1:-1] in name:
                    return group
            elif rule.endswith("*"):
                if name.startswith(rule[:-1]):
                    return group
            elif name == rule:
                return group
    return OTHER


def breakdown(events, wall_seconds: float, steps: int) -> dict:
    """Per-step seconds by group and the top operators by self time, from profiler key averages."""
    by_group = {group: 0.0 for group, _ in GROUPS} | {OTHER: 0.0}
    operators = []
    for event in events:
        seconds, group = event.self_cpu_time_total / 1e6 / steps, group_of(event.key)
        by_group[group] += seconds
        operators.append({"name": event.key, "group": group, "seconds_per_step": seconds,
                          "calls_per_step": event.count / steps})
    step = wall_seconds / steps
    covered = sum(by_group.values())
    by_group[OUTSIDE] = max(step - covered, 0.0)
    operators.sort(key=lambda row: -row["seconds_per_step"])
    return {"step_seconds_profiled": step,
            "groups": {group: {"seconds_per_step": s, "share": s / step if step else 0.0} for group, s in by_group.items()},
            "top_operators": [row | {"share": row["seconds_per_step"] / step if step else 0.0} for row in operators[:TOP]]}


def run(preset: str = "flash", device: str = "cpu", batch_size: int = 32, sequence_length: int = 128,
        steps: int = 3, warmup: int = 12, output: str | None = None, precisions: str = "auto") -> dict:
    """Profile `steps` training steps per precision after `warmup` untimed steps of each (bf16 builds kernels
    per new shape), the precisions (`bench_precisions`) alternating step by step; plus as many unprofiled
    steps of each."""
    from torch.profiler import ProfilerActivity, profile

    from glm53_flash.benchmarks.model import _training_batch

    for name, value in (("--steps", steps), ("--batch-size", batch_size)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    if warmup < 0:
        raise ValueError(f"--warmup must be at least 0, got {warmup}")
    device = resolve_device(device)
    chosen = bench_precisions(precisions, device)  # a bad list is refused before anything is built
    if device.type != "cpu":
        raise ValueError(f"glm53 bench profile measures the CPU step (torch's CPU profiler); got {device}")
    cfg = ModelConfig.preset(preset)
    if sequence_length > cfg.max_sequence_length:
        raise ValueError(f"--sequence-length {sequence_length} exceeds the {preset} preset's {cfg.max_sequence_length}")
    torch.manual_seed(0)
    model = GLM53Flash(cfg).to(device).train()
    optimizer = make_optimizer(model, PRETRAINING)
    (inputs, labels), data = _training_batch(batch_size, sequence_length)
    precisions = {name: resolve_precision(name, device) for name in chosen["names"]}

    def step(name: str) -> None:
        language_model_update(model, optimizer, inputs, labels, PRETRAINING, precision=precisions[name])
        synchronize(device)

    print(f"[bench profile {time.strftime('%H:%M:%S')}] {warmup} warm-up steps per precision, then {steps} "
          f"unprofiled and {steps} profiled steps of each, alternating", file=sys.stderr, flush=True)
    for _ in range(warmup):
        for name in precisions:
            step(name)
    plain = {name: [] for name in precisions}
    for _ in range(steps):
        for name in precisions:
            plain[name] += timed_runs(lambda: step(name), device, 0, 1)
    averages, walls = {name: [] for name in precisions}, {name: 0.0 for name in precisions}
    with library.labelled_calls():
        for _ in range(steps):
            for name in precisions:  # one profiler session per step: the other precision's step runs outside it
                with profile(activities=[ProfilerActivity.CPU]) as session:
                    started = time.perf_counter()
                    step(name)
                    walls[name] += time.perf_counter() - started
                averages[name].append(session.key_averages())
    record = {}
    for name in precisions:
        record[name] = breakdown(_merged(averages[name]), walls[name], steps) | {
            "step_seconds_unprofiled": plain[name], "step_seconds_unprofiled_median": statistics.median(plain[name]),
            "precision": precisions[name].record()}
    result = {"benchmark": "profile", "preset": preset, "device": str(device), "threads": torch.get_num_threads(),
              "batch_size": batch_size, "sequence_length": sequence_length, "data": data, "warmup_steps": warmup,
              "steps": steps, "precisions": chosen,
              "order": f"per round: one step of each of {', '.join(precisions)} (unprofiled rounds first)",
              "groups_rules": {group: list(rules) for group, rules in GROUPS} | {OTHER: ["every other operator"],
                                                                               OUTSIDE: ["wall time minus the "
                                                                                         "operators' self times"]},
              "kernels": library.status(), **record, "provenance": provenance(device=str(device))}
    rows = [("device", f"{device} ({torch.get_num_threads()} threads)"),
            ("step, unprofiled median", "  ".join(f"{n} {record[n]['step_seconds_unprofiled_median']:.3f} s"
                                                  for n in precisions)),
            ("step, profiled", "  ".join(f"{n} {record[n]['step_seconds_profiled']:.3f} s" for n in precisions))]
    for group in [g for g, _ in GROUPS] + [OTHER, OUTSIDE]:
        rows.append((group, "  ".join(f"{n} {record[n]['groups'][group]['seconds_per_step']:.3f} s "
                                      f"({100 * record[n]['groups'][group]['share']:.0f}%)" for n in precisions)))
    for n in precisions:
        rows.append((f"top operators, {n}", ", ".join(f"{r['name']} {100 * r['share']:.0f}%"
                                                     for r in record[n]["top_operators"][:6])))
    print_table(rows, title=f"glm53 bench profile  preset={preset}  batch={batch_size}x{sequence_length}  "
                            f"steps={steps}")
    if output:
        write_json(output, result)
        print(f"wrote {output}")
    return result


def _merged(sessions) -> list:
    """One row per operator name (self time, calls) over the key averages of several profiler sessions."""
    merged: dict[str, list] = {}
    for averages in sessions:
        for event in averages:
            row = merged.setdefault(event.key, [0.0, 0])
            row[0] += event.self_cpu_time_total
            row[1] += event.count
    return [_Event(key, total, count) for key, (total, count) in merged.items()]


class _Event:
    __slots__ = ("key", "self_cpu_time_total", "count")

    def __init__(self, key: str, self_cpu_time_total: float, count: int):
        self.key, self.self_cpu_time_total, self.count = key, self_cpu_time_total, count
